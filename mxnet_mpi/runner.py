"""Run an unchanged training script with mxnet_mpi loaded.

    mpirun -np N python -m mxnet_mpi train.py ARGS...
    mpirun -np N python -m mxnet_mpi -m package.module ARGS...

imports mxnet_mpi (which registers ``mpi``, ``mpi_<mode>``, ``dist_sync_mpi``
and ``dist_async_mpi`` with MXNet and patches Trainer/Module), then runs the
script as ``__main__`` as ``python train.py ARGS...`` would: same
``sys.argv`` (``argv[0]`` made absolute), the script's directory first on
``sys.path``, an absolute ``__file__``, the script's exit status. A script
that says ``kvstore='mpi'`` therefore needs no ``import mxnet_mpi``. An
installed package does the same without the runner (its start-up hook imports
mxnet_mpi with mxnet); the runner is for where the hook is off
(``MXNET_MPI_AUTOLOAD=0``, ``python -S``, a checkout on ``PYTHONPATH``), where
MXNet would otherwise quietly treat the unknown name as a local store and
every rank would train alone.
"""

from __future__ import annotations

import os
import runpy
import sys
import types

USAGE = ("usage: python -m mxnet_mpi SCRIPT [ARGS...]\n"
         "       python -m mxnet_mpi -m MODULE [ARGS...]\n"
         "Runs SCRIPT (or MODULE) as __main__ with mxnet_mpi's KVStores registered;\n"
         "launch it with mpirun -np N, or with python -m mxnet_mpi.launch.\n")


def _script_frames_only(tb: types.TracebackType | None) -> types.TracebackType | None:
    """Drop the runner's and runpy's frames from the top of a traceback, so it
    starts where the user's code does."""
    ours = {os.path.abspath(__file__), os.path.abspath(runpy.__file__)}

    def internal(name: str) -> bool:
        return name.startswith("<frozen runpy") or os.path.abspath(name) in ours
    while tb is not None and internal(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return tb


def run(argv: list[str]) -> int:
    """Run ``argv`` (``[SCRIPT, ARGS...]`` or ``['-m', MODULE, ARGS...]``) as
    ``__main__``; return its exit status (an uncaught exception goes to
    ``sys.excepthook``, which ends the MPI job, and gives 1, or 130 for
    KeyboardInterrupt, as Python's does)."""
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        sys.stderr.write(USAGE)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    # Before the script runs, so that its exit handler runs after the script's
    # and mxnet_mpi's (MXNet's own runs last).
    from mxnet_mpi import report
    report.started()
    import mxnet_mpi  # noqa: F401  (registers the stores, patches MXNet)
    from mxnet_mpi.world import uncaught_status

    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()     # as `python -m MODULE` does
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            path = argv[0]
            if not os.path.exists(path):
                sys.stderr.write("python -m mxnet_mpi: can't open file %r: no such file\n"
                                 % path)
                return 2
            sys.argv = list(argv)
            # as `python SCRIPT` does: the script's real directory first on sys.path,
            # an absolute __file__ (and so absolute paths in tracebacks). run_path
            # also sets sys.argv[0] to the path it is given: the absolute one.
            sys.path[0] = os.path.dirname(os.path.realpath(path))
            runpy.run_path(os.path.abspath(path), run_name="__main__")
    except SystemExit as exc:
        # `raise SystemExit(n)` and the builtin exit(n) bypass sys.exit, which
        # world.py wraps to see the status (a non-zero one aborts the job naming
        # this rank, instead of peers reading a clean finish): pass it through.
        report.set_status(exc.code)
        sys.exit(exc.code)
    except BaseException as exc:  # noqa: BLE001  (reported as Python would, with its status)
        tb = _script_frames_only(exc.__traceback__)
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        status = uncaught_status(type(exc))
        report.set_status(status)
        return status
    report.set_status(0)
    return 0
