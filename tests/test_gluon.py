"""Gluon Trainer with kvstore='mpi' (a plain string) really communicates, and
follows the same trajectory as one process on the whole batch and as MXNet's
own dist_sync parameter server."""

from __future__ import annotations

import ast

import numpy as np
import pytest
from mpirun import SCRIPTS, run_mpi
from pool import run_pooled
from pslite import parameter_server, run_workers

SCRIPT = str(SCRIPTS / "gluon_train.py")
MODES = ["chained", "funneled", "concurrent"]
STEPS = 6


def load_ranks(outdir, n):
    return [dict(np.load(outdir / ("rank%d.npz" % r))) for r in range(n)]


def reference(tmp_path, n, *args):
    outdir = tmp_path / "ref"
    run_pooled(SCRIPT, 1, "--reference", str(n), "--outdir", str(outdir), "--steps", str(STEPS),
               *args)
    return dict(np.load(outdir / "rank0.npz"))


def assert_same_trajectory(ranks, ref, rtol=1e-4, atol=1e-5):
    assert set(ranks[0]) == set(ref) and len(ref) > 0
    for key in sorted(ref):
        for r, weights in enumerate(ranks[1:], start=1):
            # Ranks must hold bit-identical weights after every step.
            np.testing.assert_array_equal(weights[key], ranks[0][key],
                                          err_msg="rank %d differs at %s" % (r, key))
        np.testing.assert_allclose(ranks[0][key], ref[key], rtol=rtol, atol=atol,
                                   err_msg="differs from one process on the full batch: " + key)


# every mode once, on 2 or 3 ranks in turn
@pytest.mark.parametrize("mode,nranks", [("chained", 2), ("funneled", 3), ("concurrent", 3)])
def test_mpi_string_matches_single_process(tmp_path, nranks, mode):
    # Ranks seed differently: they only agree if rank 0's weights are broadcast
    # (deferred-init ones included) and gradients are summed across ranks.
    # kvstore='mpi' as a plain string; the mode comes from the environment.
    run_pooled(SCRIPT, nranks, "--kvstore", "mpi", "--outdir", str(tmp_path / "mpi"),
            "--steps", str(STEPS), env={"MXNET_MPI_MODE": mode})
    assert_same_trajectory(load_ranks(tmp_path / "mpi", nranks), reference(tmp_path, nranks))


@pytest.mark.parametrize("mode", ["funneled"])   # every mode: the test above
def test_mpi_mode_by_name_hybridized(tmp_path, mode):
    run_pooled(SCRIPT, 2, "--kvstore", "mpi_" + mode, "--hybridize",
            "--outdir", str(tmp_path / "mpi"), "--steps", str(STEPS))
    assert_same_trajectory(load_ranks(tmp_path / "mpi", 2), reference(tmp_path, 2))


def test_float16_lamb_multi_precision_matches_single_process(tmp_path):
    """float16 weights, LAMB with float32 master copies: each rank updates one
    weight at a time (mxnet_mpi's default in a job), the one process all at
    once (MXNet's default); float16 rounding apart."""
    run_pooled(SCRIPT, 2, "--kvstore", "mpi", "--lamb-fp16", "--outdir", str(tmp_path / "mpi"),
               "--steps", str(STEPS))
    assert_same_trajectory(load_ranks(tmp_path / "mpi", 2),
                           reference(tmp_path, 2, "--lamb-fp16"), rtol=3e-3, atol=5e-4)


def test_ranks_diverge_without_kvstore(tmp_path):
    """Control: the check above can fail. With no kvstore ranks drift apart."""
    run_pooled(SCRIPT, 2, "--kvstore", "device", "--outdir", str(tmp_path / "dev"),
            "--steps", "2")
    ranks = load_ranks(tmp_path / "dev", 2)
    assert any(not np.array_equal(ranks[0][k], ranks[1][k]) for k in ranks[0])


def test_dist_sync_reaches_same_weights(tmp_path):
    """MXNet's real ps-lite dist_sync, 2 workers, 1 server, same script."""
    outdir = tmp_path / "dist"
    with parameter_server(num_workers=2) as env:
        # dist_sync only broadcasts after the first forward: seed identically.
        run_workers(SCRIPT, 2, ["--kvstore", "dist_sync", "--same-seed", "--outdir", str(outdir),
                                "--steps", str(STEPS)], env)
    assert_same_trajectory(load_ranks(outdir, 2), reference(tmp_path, 2))


@pytest.mark.parametrize("mode", MODES)
def test_trainer_issues_collectives_in_readiness_order(mode, tmp_path):
    """Backprop makes the last layer's gradient ready first; collectives must
    start there, not wait for the whole backward pass (the script's gate holds
    back layer 0's gradient; see trainer_order.py). Every mode must overlap."""
    proc = run_pooled(str(SCRIPTS / "trainer_order.py"), 2, str(tmp_path / "t.json"),
                      env={"MXNET_MPI_MODE": mode})
    orders = [ast.literal_eval(ln.split(" ", 1)[1]) for ln in proc.stdout.splitlines()
              if ln.startswith("ORDER")]
    assert len(orders) == 2, proc.stdout    # one line per rank
    for order in orders:
        assert order == sorted(order, reverse=True) and len(order) == 8, orders
    assert proc.stdout.count("LAST_REDUCED_WHILE_GATE_CLOSED True") == 2, proc.stdout


def test_frozen_sparse_embedding_trains_and_unfreezing_it_is_refused():
    """Embedding(sparse_grad=True) with grad_req 'null' has no gradient to
    reduce: the Trainer on kvstore='mpi' trains as with a dense-gradient one
    (MXNet's local store accepts it; ours refused it). Made trainable later,
    its row_sparse gradient is refused at the step, naming it."""
    proc = run_pooled("frozen_sparse.py", 2, timeout=120)
    got = sorted(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
    assert got == ["RESULT %d same=True unfrozen=refused:True" % r for r in range(2)], \
        proc.stdout + proc.stderr[-3000:]


def test_trainers_sharing_one_store_are_paired_by_trainer():
    """Two Trainers of same-shape nets on one store object: stepped in the same
    order on every rank, each net gets its own sums; in different orders on
    different ranks, one net's gradients were summed into the other's on
    every rank, silently (the collectives' keys and shapes matched). Now every
    rank raises, naming the store's second Trainer."""
    proc = run_mpi("shared_store.py", 2, "same,order,shapes", timeout=120)
    got = sorted(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
    want = sorted("RESULT %d %s" % (r, c) for r in (0, 1)
                  for c in ("same matches", "order refused", "shapes refused, own stores match"))
    assert got == want, proc.stdout + proc.stderr[-3000:]
