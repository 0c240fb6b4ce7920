"""The MPI world of this process: lazy initialisation, ranks, communicators,
and how the process leaves the job.

MPI is initialised on first use (not at import), by the native library's owner
thread. At the end of the program every rank tells the others it is finishing
(so a peer that still needs it fails at once, naming it, instead of waiting),
waits for its own collectives, and MPI is finalised when the process exits: a
non-zero exit status (``sys.exit(1)``, an uncaught exception) ends the whole job
within seconds. A world of size 1 (no mpirun) behaves like any other.

After ``os.fork()`` the child is not part of the job: it may compute and exit
normally, but any use of MPI or of a store raises MPIKVStoreError.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Callable

import mxnet as mx

from . import rank_children, report, settings, shm_segments, timeline, transport
from ._native import LIB, SETTINGS_DIFFER, check, last_error
from .errors import MPIKVStoreError
from .peer_wait import waiting_for_peers

THREAD_SERIALIZED = 2
THREAD_MULTIPLE = 3

log = logging.getLogger("mxnet_mpi")



@dataclass(frozen=True)
class Communicator:
    """A native MPI communicator: ``id`` is the library's handle (0 = world)."""

    id: int
    rank: int
    size: int

    def split(self, color: int, key: int | None = None) -> Communicator | None:
        """Collective over this communicator, as MPI_Comm_split; None if color < 0."""
        return _split(self.id, color, self.rank if key is None else key)

    def spans_hosts(self) -> bool:
        """Collective over this communicator: whether its members are on more
        than one host (the same answer on every member)."""
        init()
        if _state.thread_level < THREAD_MULTIPLE:
            mx.nd.waitall()   # no collective may be running meanwhile
        out = ctypes.c_int()
        with waiting_for_peers("finding the hosts of a communicator's ranks (as a store or "
                               "process set is made)", "every member of it makes the same "
                               "stores and process sets, in the same order", _state.world.rank):
            check(LIB.mxmpi_comm_spans_hosts(self.id, ctypes.byref(out)))
        return bool(out.value)

    def dup(self) -> Communicator:
        """Collective over this communicator: a new one with the same members."""
        comm = _split(self.id, 0, self.rank)
        assert comm is not None
        return comm

    def free(self) -> None:
        """Release the communicator and what the free functions made over it
        (stores made from it keep their own copy); using it afterwards is an
        error. A communicator lasts until freed: free the ones made per epoch
        or per phase."""
        if self.id > 0 and _state.world is not None and not _state.forked:
            for hook in _comm_free_hooks:
                hook(self.id)
            LIB.mxmpi_comm_free(self.id)


@dataclass
class _State:
    world: Communicator | None = None
    local_rank: int = 0
    local_size: int = 1
    thread_level: int = 0
    forked: bool = False
    exit_code: object = None
    finalized: bool = False
    segment_dir: str | None = None   # a singleton's shared-memory directory
    init_error: str | None = None    # why starting MPI failed (raised again on each try)


_state = _State()
_lock = threading.Lock()
_exit_hooks: list = []
_comm_free_hooks: list = []   # called with a communicator's id as it is freed


def on_comm_free(hook: Callable[[int], None]) -> None:
    """Call `hook(id)` when a communicator is freed (before MPI frees it), so
    what the layers above made over it goes with it."""
    _comm_free_hooks.append(hook)


def finalized() -> bool:
    """Whether MPI was finalised in this process (it cannot start again)."""
    return _state.finalized


def require_usable() -> None:
    """Raise MPIKVStoreError if this process cannot use MPI (a forked child)."""
    if _state.forked:
        raise MPIKVStoreError(
            "mxnet_mpi: this process was forked from an MPI rank; a forked child must not "
            "use MPI or mxnet_mpi's stores (it may compute and exit normally)")
    if _state.finalized:
        raise MPIKVStoreError("mxnet_mpi: MPI was finalised in this process")


def init() -> Communicator:
    """Initialise MPI (idempotent) and return the world communicator."""
    require_usable()
    with _lock:
        if _state.world is not None:
            return _state.world
        if _state.init_error is not None:   # MPI started, then failed: it cannot start again
            raise MPIKVStoreError(_state.init_error)
        # reliability and store settings, read when MPI is initialised
        warn, abort, interval = settings.stall_limits()
        store0 = settings.store_options()   # the free functions' store
        # its allreduce route, by whether the world spans hosts (known once MPI is up)
        p2p = settings.p2p_thresholds()
        if not settings.get("MXNET_MPI_CHECK_SIGNATURES"):
            warnings.warn("MXNET_MPI_CHECK_SIGNATURES=0 is ignored: ranks always agree on "
                          "each collective before data moves (it is how they stay paired)",
                          stacklevel=2)
        LIB.mxmpi_configure(warn, abort, interval, settings.get("MXNET_MPI_COMM_NICE"))
        agreed = settings.agreed_values()
        LIB.mxmpi_configure_agreed((ctypes.c_int64 * len(agreed))(*agreed), len(agreed))
        _keep_mpi4py_from_finalizing()
        if timeline.requested():
            timeline.start()
        _refuse_rank_child()
        out = [ctypes.c_int() for _ in range(5)]
        with transport.singleton_segments() as _state.segment_dir, waiting_for_peers(
                "MPI's start-up", "a process of the job that never starts MPI (one that "
                "does not use mxnet_mpi, e.g. MXNET_MPI_AUTOLOAD=0 or no store on some rank) "
                "keeps the others here", mpi_started=False):
            rc = LIB.mxmpi_init(THREAD_MULTIPLE, *[store0[k] for k in settings.STORE_OPTIONS],
                                *p2p, *[ctypes.byref(o) for o in out])
        if rc != 0:
            error = last_error()
            if error == SETTINGS_DIFFER:
                error = settings.disagreement(_agreed_table(len(agreed))) + (
                    "; MPI cannot be used in this process any more")
            # where MPI is up (mpi4py started it), let go of it before mpi4py
            # finalises it at exit (no-op where it never started)
            atexit.register(LIB.mxmpi_python_exit)
            _state.init_error = error
            raise MPIKVStoreError(error)
        provided, rank, size, local_rank, local_size = (o.value for o in out)
        if provided < THREAD_SERIALIZED:
            LIB.mxmpi_finalize()
            raise RuntimeError(
                "mxnet_mpi: MPI was initialised (e.g. by mpi4py) with thread level %d; "
                "mxnet_mpi calls MPI from its own thread and needs at least "
                "MPI_THREAD_SERIALIZED" % provided)
        _state.world = Communicator(0, rank, size)
        rank_children.mark()
        if timeline.requested():
            # said now, not only at the end of a long job
            out = timeline.rank_path(timeline.requested(), rank)
            problem = timeline.unwritable(out)
            if problem is not None:
                warnings.warn("mxnet_mpi: %s=%s: rank %d cannot write its timeline to %s (%s); "
                              "it is recorded, and written at exit only if that changes"
                              % (timeline.ENV_VAR, timeline.requested(), rank, out, problem),
                              stacklevel=2)
        _state.local_rank, _state.local_size = local_rank, local_size
        _state.thread_level = provided
        atexit.register(_at_exit)
        if size > 1:
            _watch_exit_status()
            if settings.get("MXNET_MPI_ABORT_ON_EXCEPTION"):
                _install_abort_hook()
        return _state.world


def _refuse_rank_child() -> None:
    """A process that a rank started (subprocess, a spawn worker) with the
    rank's launch environment cannot start MPI: Open MPI would take it for a
    second copy of the rank and crash the job, and as a world of one it would
    quietly train alone. Where such a process started MPI before the rank
    (it was started before the rank's first store), the rank is refused."""
    parent = rank_children.started_by()
    holder = rank_children.claim() if parent is None else None
    if parent is None and holder is None:
        return
    rank = (rank_children.identity(os.environ) or "?:?").rsplit(":", 1)[1]
    if parent is None:
        how = ("a process this one started" if rank_children.parent_of(holder) == os.getpid()
               else "the process that started this one" if holder == os.getppid()
               else "another process with this rank's launch environment")
        raise MPIKVStoreError(
            "mxnet_mpi: rank %s of this job already runs MPI in process %d, %s, which "
            "started MPI first: two processes cannot be one rank (Open MPI would crash the "
            "job). Start processes that use MPI from a rank with "
            "env=mxnet_mpi.rank_children.detached() (they run as a world of one rank of their "
            "own), or let only the rank use MPI" % (rank, holder, how))
    raise MPIKVStoreError(
        "mxnet_mpi: this process (pid %d) was started by rank %s's process (pid %d), not by "
        "mpirun, and inherited its launch environment: it cannot be a rank of that job (Open "
        "MPI would take it for a second copy of rank %s and crash the job). Ranks are the "
        "processes mpirun starts. To run it as a world of one rank of its own, start it with "
        "env=mxnet_mpi.rank_children.detached(); a multiprocessing spawn worker re-imports "
        "the main module: keep training under `if __name__ == '__main__':`"
        % (os.getpid(), rank, parent, rank))


def _agreed_table(n: int) -> list:
    """Every rank's agreed settings (n each), after MPI's start found them different."""
    total = LIB.mxmpi_agreed_table(None, 0)
    buf = (ctypes.c_int64 * total)()
    LIB.mxmpi_agreed_table(buf, total)
    return [list(buf[i:i + n]) for i in range(0, total, n)]


def _keep_mpi4py_from_finalizing() -> None:
    """mpi4py, imported after MPI is up, would finalise MPI when Python exits,
    under this library's threads; it is finalised here, with the exit status."""
    try:
        import mpi4py
    except ImportError:
        return
    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.finalize = False


def on_exit(hook: Callable[[], None]) -> None:
    """Run `hook` at the end of the program, after this rank announced its end
    and its collectives completed, before MPI is finalised (latest first)."""
    _exit_hooks.append(hook)


def wait_queued_ops(timeout: float | None = None, report: bool = True) -> bool:
    """Wait for every operation queued on MXNet's engine (at most `timeout`
    seconds; returns whether they all ran). An error nobody waited for is
    reported on stderr (without `report`, dropped), not raised (this runs at
    exit)."""
    failed: list = []

    def wait() -> None:
        try:
            mx.nd.waitall()
        except Exception as exc:  # noqa: BLE001  (an error nobody waited for)
            failed.append(exc)
    if timeout is None:
        wait()
    else:
        waiter = threading.Thread(target=wait, daemon=True, name="mxnet_mpi exit drain")
        waiter.start()
        waiter.join(timeout)
        if waiter.is_alive():
            return False
    for exc in failed if report else ():
        first = str(exc).splitlines()[0] if str(exc) else repr(exc)
        sys.stderr.write("mxnet_mpi: an operation failed and nobody waited for it: %s\n" % first)
    return True


# How long a rank at its exit lets queued work run before it tells its peers
# it has finished (below).
_DRAIN_BEFORE_FINISH_S = 10.0


def _finish() -> None:
    """Announce the end of this rank's program, wait for its collectives, run the
    exit hooks. Never raises: errors still pending are reported, not re-raised.
    Queued work runs first, for a while: it may push collectives of its own
    (SyncBatchNorm's backward pushes its sums from a callback the engine runs),
    which the count this rank announces must hold, or its peers would take it
    for a rank that ran out of data. Work that waits on peers who will never
    pair it is cut short: the announcement then goes out all the same."""
    drained = wait_queued_ops(timeout=_DRAIN_BEFORE_FINISH_S)
    LIB.mxmpi_announce_finish()
    if not drained:
        wait_queued_ops()
    while _exit_hooks:
        hook = _exit_hooks.pop()
        try:
            hook()
        except Exception as exc:  # noqa: BLE001
            sys.stderr.write("mxnet_mpi: at exit: %s\n" % exc)
    if timeline.requested():
        try:
            timeline.dump(timeline.requested(), _state.world.rank)
        except Exception as exc:  # noqa: BLE001
            sys.stderr.write("mxnet_mpi: cannot write the timeline: %s\n" % exc)


def _remove_session_after_finalize() -> None:
    # MPI_Finalize leaves a singleton's session directory behind, empty; the
    # native library removes it right after (at process exit, or in finalize)
    session = shm_segments.singleton_session_dir(_state.segment_dir)
    if session:
        LIB.mxmpi_remove_after_finalize(session.encode())


def _at_exit() -> None:
    if _state.forked or _state.world is None or _state.finalized:
        return
    code = report.exit_status(_state.exit_code)
    if code and _state.world.size > 1:
        sys.stderr.write("mxnet_mpi: rank %d is exiting with status %d; aborting the MPI job\n"
                         % (_state.world.rank, code))
        sys.stderr.flush()
        LIB.mxmpi_abort(code)
    _finish()
    # MPI itself is finalised by the native library when the process exits, with
    # the exit status: a non-zero one aborts the job instead of waiting. (If
    # mpi4py started MPI, it finalises it; the library lets go of it now.)
    _remove_session_after_finalize()
    LIB.mxmpi_python_exit()
    # unlinked while still mapped: the mapping lasts until MPI lets go of it
    shm_segments.remove(_state.segment_dir)


def finalize() -> None:
    """End this rank's part in the job now: announce it, wait for its
    collectives, close every store and finalise MPI. Idempotent."""
    with _lock:
        if _state.world is None or _state.finalized or _state.forked:
            return
        _finish()
        _remove_session_after_finalize()
        LIB.mxmpi_finalize()
        _state.finalized = True
        shm_segments.remove(_state.segment_dir)


def _split(parent: int, color: int, key: int) -> Communicator | None:
    init()
    if _state.thread_level < THREAD_MULTIPLE:
        # Without MPI_THREAD_MULTIPLE no collective may be running meanwhile.
        mx.nd.waitall()
    out = ctypes.c_int()
    with waiting_for_peers("splitting a communicator", "every member of it splits it, in "
                           "the same order as its other collectives", _state.world.rank):
        check(LIB.mxmpi_comm_split(parent, color, key, ctypes.byref(out)))
    if out.value < 0:
        return None
    r, s = ctypes.c_int(), ctypes.c_int()
    check(LIB.mxmpi_comm_info(out.value, ctypes.byref(r), ctypes.byref(s)))
    return Communicator(out.value, r.value, s.value)


def uncaught_status(etype: type) -> int:
    """The exit status of a process ended by an uncaught `etype`, as a shell
    reports Python's: 130 (128 + SIGINT) for KeyboardInterrupt, else 1."""
    return 128 + 2 if issubclass(etype, KeyboardInterrupt) else 1


def _install_abort_hook() -> None:
    """An uncaught exception on one rank aborts the job instead of hanging its peers."""
    previous = sys.excepthook

    def hook(etype, value, tb):
        previous(etype, value, tb)
        sys.stderr.write("mxnet_mpi: rank %d raised %s; aborting the MPI job\n"
                         % (_state.world.rank if _state.world else -1, etype.__name__))
        sys.stderr.flush()
        LIB.mxmpi_abort(uncaught_status(etype))

    sys.excepthook = hook


class _Exit(SystemExit):
    """What the wrapped sys.exit raises: a SystemExit whose status is noted
    when the interpreter reads it to exit with it, from no Python frame,
    after the exception went uncaught in the main thread. A status caught on
    the way (a harness trying argparse options) is never noted."""

    @property
    def code(self):
        code = SystemExit.code.__get__(self)
        if threading.current_thread() is threading.main_thread():
            try:
                sys._getframe(1)
            except ValueError:   # read by the interpreter itself: the process exits
                _state.exit_code = code
        return code

    def __reduce__(self):   # pickled (e.g. by a process pool) as a plain SystemExit
        return SystemExit, self.args


_Exit.__name__ = _Exit.__qualname__ = "SystemExit"
_Exit.__module__ = "builtins"
_NO_STATUS = object()


def _watch_exit_status() -> None:
    """See the status given to sys.exit (argparse errors included) that ends
    the process: Python runs exit handlers before it says how it exits."""
    original = sys.exit

    def exit(status=_NO_STATUS):  # noqa: A001  (same name as what it replaces)
        if threading.current_thread() is not threading.main_thread():
            # it ends only the thread, which Python's threading module passes
            # over silently for SystemExit itself, not for a subclass
            original() if status is _NO_STATUS else original(status)
        raise _Exit() if status is _NO_STATUS else _Exit(status)

    exit.__doc__ = original.__doc__
    sys.exit = exit


def forget_exit_status() -> None:
    """Forget a status given to sys.exit so far (a process that runs several
    programs, e.g. a pool of warm ranks, after each)."""
    _state.exit_code = None


def _forked_child() -> None:
    # A child of a rank is not a rank, whether or not the parent had started MPI.
    _state.forked = True
    LIB.mxmpi_forked()


os.register_at_fork(after_in_child=_forked_child)


def world() -> Communicator:
    """The world communicator (initialises MPI on first call)."""
    return init()


def rank() -> int:
    """This process's rank in MPI_COMM_WORLD."""
    return init().rank


def size() -> int:
    """Number of processes in MPI_COMM_WORLD."""
    return init().size


def local_rank() -> int:
    """Rank among the processes on this host (use it to pick a GPU)."""
    init()
    return _state.local_rank


def local_size() -> int:
    """Number of processes on this host."""
    init()
    return _state.local_size


def thread_level() -> int:
    """The MPI thread level provided (2 = serialized, 3 = multiple)."""
    init()
    return _state.thread_level
