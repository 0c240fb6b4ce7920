"""The commands that run ps-lite's scheduler and servers, for the launcher.

A server is MXNet's own: ``DMLC_ROLE=server python -c "import mxnet"`` (it
unpickles the workers' optimizer, so it needs MXNet's Python package). The
scheduler only relays node addresses and barriers, all inside libmxnet; this
file run as a script starts it through MXNet's C API without importing the
``mxnet`` package, whose import spends about 2 s of CPU generating operator
wrappers the scheduler never calls. Stdlib only: neither the launcher nor this
script may import MXNet or load MPI.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
from pathlib import Path


def role_command(role: str) -> list:
    """argv that runs ps-lite role `role` ("scheduler" or "server") with
    DMLC_ROLE and the other DMLC_* variables set in its environment."""
    if role == "scheduler":
        return [sys.executable, str(Path(__file__).resolve())]
    if role == "server":
        return [sys.executable, "-c", "import mxnet"]   # importing runs the role
    raise ValueError("unknown ps-lite role %r" % role)


def libmxnet_path() -> str:
    """libmxnet.so as MXNet's own loader finds it: $MXNET_LIBRARY_PATH, else
    the one inside the installed mxnet package (located, not imported)."""
    explicit = os.environ.get("MXNET_LIBRARY_PATH")
    if explicit:
        return explicit
    spec = importlib.util.find_spec("mxnet")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(folder) / "libmxnet.so"
        if candidate.is_file():
            return str(candidate)
    raise SystemExit("mxnet_mpi: cannot find libmxnet.so for the ps-lite scheduler "
                     "(is mxnet installed for %s?)" % sys.executable)


def run_scheduler() -> None:
    """Create the 'dist' store (ps-lite starts as DMLC_ROLE says) and serve
    until every node has finished, as MXNet's kvstore_server module does."""
    if os.environ.get("DMLC_ROLE") != "scheduler":
        raise SystemExit("mxnet_mpi: the ps-lite scheduler needs DMLC_ROLE=scheduler")
    lib = ctypes.CDLL(libmxnet_path(), ctypes.RTLD_GLOBAL)
    lib.MXGetLastError.restype = ctypes.c_char_p

    def check(rc: int) -> None:
        if rc != 0:
            raise SystemExit("mxnet_mpi: ps-lite scheduler: %s"
                             % lib.MXGetLastError().decode(errors="replace"))

    handle = ctypes.c_void_p()
    check(lib.MXKVStoreCreate(b"dist", ctypes.byref(handle)))
    controller = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(
        lambda cmd, body, _: None)   # commands go to servers; the scheduler gets none
    check(lib.MXKVStoreRunServer(handle, controller, None))


if __name__ == "__main__":
    run_scheduler()
