import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mpirun import remove_stale_session_dirs  # noqa: E402

# The longest files first: with `-n N --dist loadfile` (the Makefile's test
# command) each file runs on one worker, so its module-level results (a pooled
# job, a launched cluster) are made once, and starting the long files first
# keeps one worker from finishing alone at the end. Order by measured
# worker-seconds; files not listed follow in their usual order.
LONGEST_FIRST = [
    # worker-seconds measured 2026-11-25; a file that mostly waits (exits,
    # netns, stall aborts) alternates with one that computes
    "test_hybrid.py", "test_exits.py", "test_install.py", "test_hybrid_faults.py",
    "test_collectives.py", "test_multihost.py", "test_runner.py", "test_launch.py",
    "test_syncbn.py", "test_lost_hosts.py", "test_examples.py", "test_network_faults.py",
    "test_faults.py", "test_benchmarks.py", "test_horovod_api.py", "test_readiness.py",
    "test_batch_sizes.py", "test_modes.py", "test_rescale.py", "test_uneven.py",
    "test_fuzz.py", "test_gluon.py", "test_consistency.py",
]


def pytest_collection_modifyitems(items: list) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).name, len(rank)))


def pytest_sessionstart(session) -> None:
    if not hasattr(session.config, "workerinput"):   # once, in the controlling process
        remove_stale_session_dirs()


def pytest_sessionfinish(session) -> None:
    # this process's warm rank pools, each with its directory, closed here
    # as well as by pool.py's atexit handler: suite runs left pool
    # directories in /tmp (which exit path skipped the handler is not known)
    pool = sys.modules.get("pool")
    if pool is not None:
        pool._close_all()
    # what this run's killed jobs left (tests kill jobs on purpose)
    if not hasattr(session.config, "workerinput"):
        remove_stale_session_dirs()
