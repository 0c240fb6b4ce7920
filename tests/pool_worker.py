"""One rank of a warm pool (tests/pool.py): runs test scripts on request.

Started by mpirun with the controller's address. It imports MXNet and
mxnet_mpi once, connects to the controller and waits (a blocking socket read:
it sleeps) for requests. Each request runs one script as ``__main__``, as
``python SCRIPT ARGS`` would, on every rank at once, with its stdout and
stderr (file descriptors 1 and 2, so native output too) in files of its own.
Afterwards the rank waits for its engine, closes every store the script left
open and restores what the script may have changed (environment, argv,
sys.path, Gluon's name counters), then reports the exit status.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import runpy
import socket
import sys
import time
import traceback
import warnings

import mxnet as mx

import mxnet_mpi
from mxnet_mpi import joining

# (the package's `world` attribute is the function of that name)
world = importlib.import_module("mxnet_mpi.world")


def _recv_line(sock: socket.socket, buf: bytearray) -> bytes:
    while b"\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            return b""
        buf.extend(chunk)
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return line


def _close_stores() -> None:
    for store in joining.open_stores():
        try:
            store.close()
        except Exception as exc:  # noqa: BLE001  (reported, never fatal for the pool)
            sys.stderr.write("pool: closing a store failed: %s\n" % exc)


def run_request(req: dict, rank: int) -> int:
    """Run one script as __main__ with fds 1/2 redirected; return its status."""
    out_dir = req["out_dir"]
    saved_env = dict(os.environ)
    saved_argv, saved_path = list(sys.argv), list(sys.path)
    saved_cwd = os.getcwd()
    # Warnings and logging as a new process has them: filters, the record of
    # warnings already shown once (invalidated by _filters_mutated), root handlers.
    saved_filters, saved_show = list(warnings.filters), warnings.showwarning
    warnings._filters_mutated()
    saved_handlers, saved_level = list(logging.root.handlers), logging.root.level
    sys.stdout.flush()
    sys.stderr.flush()
    fds = (os.dup(1), os.dup(2))
    out = open(os.path.join(out_dir, "rank%d.out" % rank), "w")
    err = open(os.path.join(out_dir, "rank%d.err" % rank), "w")
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    status = 0
    try:
        os.environ.update(req["env"])
        for name in req.get("unset", []):
            os.environ.pop(name, None)
        os.chdir(req["cwd"])
        script = req["script"]
        sys.argv = [script, *req["args"]]
        sys.path[0] = os.path.dirname(os.path.realpath(script))
        # Gluon names blocks from a per-thread counter: start it afresh, as a
        # new process would, so names such as 'dense0_weight' do not depend on
        # what ran before.
        mx.name.NameManager._current.value = mx.name.NameManager()
        # MXNet's random state as a new process has it (libmxnet seeds its
        # generators with 0), so random initial weights do not depend on what
        # ran before either.
        mx.random.seed(0)
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as exc:
            code = exc.code
            if code is None:
                status = 0
            elif isinstance(code, int):
                status = code
            else:
                sys.stderr.write("%s\n" % (code,))
                status = 1
        except BaseException:  # noqa: BLE001  (reported as Python would)
            traceback.print_exc()
            status = 1
        try:
            mx.nd.waitall()
        except Exception as exc:  # noqa: BLE001  (as world._finish reports it)
            first = str(exc).splitlines()[0] if str(exc) else repr(exc)
            sys.stderr.write("mxnet_mpi: an operation failed and nobody waited for it: %s\n"
                             % first)
        _close_stores()
    finally:
        world.forget_exit_status()   # a status the script gave is not the pool's
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in fds:
            os.close(fd)
        out.close()
        err.close()
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv[:] = saved_argv
        sys.path[:] = saved_path
        os.chdir(saved_cwd)
        warnings.filters[:] = saved_filters
        warnings.showwarning = saved_show
        warnings._filters_mutated()
        logging.root.handlers[:] = saved_handlers
        logging.root.setLevel(saved_level)
    return status


def main() -> int:
    host, port = sys.argv[1], int(sys.argv[2])
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    sock = socket.create_connection((host, port))
    sock.sendall(json.dumps({"rank": rank, "pid": os.getpid()}).encode() + b"\n")
    buf = bytearray()
    while True:
        line = _recv_line(sock, buf)
        if not line:
            return 0          # the controller went away
        req = json.loads(line)
        if req.get("exit"):
            break
        start = time.monotonic()
        status = run_request(req, rank)
        sock.sendall(json.dumps({"rank": rank, "status": status,
                                 "seconds": time.monotonic() - start}).encode() + b"\n")
    sock.close()
    return 0


if __name__ == "__main__":
    assert mxnet_mpi  # imported first: registers the stores before any script runs
    sys.exit(main())
