"""Mode selection, and stores in several modes alive at once."""

import pytest
from mpirun import run_mpi
from pool import run_pooled

MODES = ["chained", "funneled", "concurrent"]


@pytest.mark.parametrize("modes,nranks", [("concurrent,concurrent", 2),
                                          ("chained,funneled,concurrent", 3)])
def test_stores_alive_at_once_do_not_mix(modes, nranks):
    proc = run_pooled("two_stores.py", nranks, modes, timeout=180)
    assert "OK %d collectives" % (3 * 40 * len(modes.split(","))) in proc.stdout


def lines(proc, tag):
    return [ln.split()[1:] for ln in proc.stdout.splitlines() if ln.startswith(tag + " ")]


def test_mode_by_name_and_default():
    proc = run_mpi("mode_select.py", 1)   # a fresh process: the mode is logged once per process
    default = lines(proc, "DEFAULT")[0][0]
    assert lines(proc, "MPI_TYPE")[0] == ["mpi_" + default, default]
    assert sorted(lines(proc, "BY_NAME")) == sorted([m, "mpi_" + m, m] for m in MODES)
    # logged once per process, although several stores were created
    logged = [ln for ln in proc.stderr.splitlines() if ln.startswith("LOG mxnet_mpi: kvstore")]
    assert len(logged) == 1 and default in logged[0]
    # names in our namespace that nobody registered are errors, never MXNet's
    # silent fallback to a local store (which would not communicate)
    unknown = [ln for ln in proc.stdout.splitlines() if ln.startswith("UNKNOWN_NAME")]
    assert len(unknown) == 3
    for ln in unknown:
        assert "unknown kvstore" in ln and "mpi_chained, mpi_concurrent, mpi_funneled" in ln
    # the user's own store registered with MXNet under such a name is theirs
    assert lines(proc, "OWN_STORE") == [["MPIStoreOfMine", "stepped", "True"]]


@pytest.mark.parametrize("mode", ["funneled"])   # not the default; the others: test_gluon
def test_mode_from_environment(mode):
    proc = run_pooled("mode_select.py", 2, env={"MXNET_MPI_MODE": mode})
    assert lines(proc, "MPI_TYPE") == [["mpi_" + mode, mode]] * 2
    # a name that fixes the mode wins over the environment
    assert ["chained", "mpi_chained", "chained"] in lines(proc, "BY_NAME")


def test_unknown_mode_in_environment_is_a_clear_error():
    proc = run_pooled("mode_select.py", 1, env={"MXNET_MPI_MODE": "bogus"}, check=False)
    assert proc.returncode != 0
    assert "unknown mxnet_mpi mode 'bogus'" in proc.stderr
    assert "chained, funneled, concurrent" in proc.stderr


# every mode once, on 2 or 3 ranks in turn (each pair costs ~15 s on 2 cores);
# funneled once more with the smallest pre-emption budget: every allreduce above
# 4 KiB moves in pieces, and priorities differ between ranks (stress.py). On 2
# ranks: 3 ranks on 2 cores took 2.5x as long, and pieces on 3 ranks are
# test_preemption_lets_an_urgent_array_pass_a_large_one's and test_collectives'.
TINY_BUDGET = {"MXNET_MPI_PREEMPT_BYTES": "4096"}


@pytest.mark.parametrize("mode,nranks,env", [("chained", 3, None), ("funneled", 2, None),
                                             ("concurrent", 3, None),
                                             ("funneled", 2, TINY_BUDGET)],
                         ids=["chained", "funneled", "concurrent", "funneled-preempt"])
def test_stress_thousands_of_collectives(mode, nranks, env):
    """No hang (run_mpi's timeout fails the test) and exact sums, every mode."""
    proc = run_pooled("stress.py", nranks, mode, "2000", "200", timeout=240, env=env)
    assert proc.stdout.count("STRESS_OK") == nranks


def test_preemption_lets_an_urgent_array_pass_a_large_one(tmp_path):
    """Funneled, budget 4 KiB: a small array of higher priority, pushed while
    an 8 MiB allreduce moves, completes first, between two of its pieces; sums
    and averages exact with priorities that differ between ranks; a rank that
    joins stands in for pieces (preempt.py)."""
    proc = run_pooled("preempt.py", 3, str(tmp_path), timeout=180, env=TINY_BUDGET)
    assert proc.stdout.count("PREEMPT_OK") == 3, proc.stdout
    order = [ln for ln in proc.stdout.splitlines() if ln.startswith("ORDER ")]
    assert len(order) == 3
    for ln in order:
        assert "small_first=True pieces=2048 between=True" in ln, proc.stdout
