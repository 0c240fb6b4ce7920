"""MXNet 1.9's LAMB with multi_precision=True, updating one float16 weight at
a time (MXNET_OPTIMIZER_AGGREGATION_SIZE=1, mxnet_mpi's default in a job of
several ranks, and the Module API's per-device updates), never wrote the
float32 master copy: each step restarted from its first value. Once
mxnet_mpi is imported, that update follows LAMB as its grouped update does.
LARS's momentum correction reached only a step's first update call; it now
reaches every weight, whatever the group size."""

from __future__ import annotations

import json
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest
from mpirun import ROOT, mpi_env

import mxnet_mpi  # noqa: F401  (mends the update)

STEPS, LR, WD, RESCALE = 4, 0.01, 0.01, 0.5


def numpy_lamb(w, grads, b1=0.9, b2=0.999, eps=1e-6):
    """LAMB as MXNet defines it, in float64 (bias correction on)."""
    w, m, v = w.astype("f8"), np.zeros(w.shape), np.zeros(w.shape)
    for t, g in enumerate(grads, 1):
        g = g.astype("f8") * RESCALE
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        step = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps) + WD * w
        w = w - LR * np.linalg.norm(w) / np.linalg.norm(step) * step
    return w


def lamb(aggregate: int, weights, grads, monkeypatch):
    monkeypatch.setenv("MXNET_OPTIMIZER_AGGREGATION_SIZE", str(aggregate))
    opt = mx.optimizer.create("lamb", learning_rate=LR, wd=WD, rescale_grad=RESCALE,
                              multi_precision=True)
    updater = mx.optimizer.get_updater(opt)
    ws = [mx.nd.array(w, dtype="float16") for w in weights]
    for step in grads:
        gs = [mx.nd.array(g, dtype="float16") for g in step]
        if aggregate > 1:
            updater(list(range(len(ws))), gs, ws)
        else:
            for i, (g, w) in enumerate(zip(gs, ws)):
                updater(i, g, w)
    return [w.asnumpy() for w in ws], [updater.states[i][0].asnumpy() for i in range(len(ws))]


@pytest.mark.parametrize("aggregate", [1, 45])
def test_lamb_multi_precision_one_at_a_time_follows_lamb(aggregate, monkeypatch):
    rng = np.random.RandomState(0)
    weights = [rng.randn(n).astype("float16") for n in (5, 300)]
    grads = [[rng.randn(n).astype("float16") for n in (5, 300)] for _ in range(STEPS)]
    got, masters = lamb(aggregate, weights, grads, monkeypatch)
    for i, w in enumerate(weights):
        want = numpy_lamb(w, [g[i] for g in grads])
        # the float32 master copy follows float64 LAMB; the float16 weight is its rounding
        np.testing.assert_allclose(masters[i], want, rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(got[i], masters[i].astype("float16"))


def test_lamb_one_at_a_time_given_several_weights_refuses_as_mxnet_does(monkeypatch):
    """Several weights at once where the optimizer updates one at a time:
    MXNet asserts; the mended update changed only the first, silently."""
    monkeypatch.setenv("MXNET_OPTIMIZER_AGGREGATION_SIZE", "1")
    opt = mx.optimizer.create("lamb", learning_rate=LR, multi_precision=True)
    ws = [mx.nd.ones((3,), dtype="float16") for _ in range(2)]
    states = [opt.create_state_multi_precision(i, w) for i, w in enumerate(ws)]
    with pytest.raises(AssertionError):
        opt.update_multi_precision([0, 1], ws, [mx.nd.ones((3,), dtype="float16")] * 2, states)


def lars_training(aggregate: int, devices: int, monkeypatch) -> list:
    """LARS with momentum and a scheduler that halves the rate every 2 steps,
    6 steps of a 3-layer net (6 parameters) on `devices` CPU contexts: each
    parameter's copies, per device."""
    monkeypatch.setenv("MXNET_OPTIMIZER_AGGREGATION_SIZE", str(aggregate))
    mx.random.seed(0)
    net = mx.gluon.nn.HybridSequential()
    for _ in range(3):
        net.add(mx.gluon.nn.Dense(4, activation="relu"))
    ctxs = [mx.cpu(i) for i in range(devices)]
    net.initialize(mx.init.Xavier(), ctx=ctxs)
    sched = mx.lr_scheduler.FactorScheduler(step=2, factor=0.5, base_lr=0.1)
    trainer = mx.gluon.Trainer(net.collect_params(), "lars",
                               {"momentum": 0.9, "lr_scheduler": sched},
                               kvstore=None if devices == 1 else "device",
                               update_on_kvstore=False)
    rng = np.random.RandomState(1)
    for _ in range(6):
        xs = mx.gluon.utils.split_and_load(rng.randn(4 * devices, 5).astype("f4"), ctxs)
        with mx.autograd.record():
            losses = [(net(x) ** 2).sum() for x in xs]
        for loss in losses:
            loss.backward()
        trainer.step(4)
    return [[p.data(c).asnumpy() for c in ctxs] for p in net.collect_params().values()]


def test_lars_momentum_correction_reaches_every_weight_whatever_the_group_size(monkeypatch):
    """LARS's momentum correction (the rate changed: momentum scaled by the
    new rate over the last) reached only the weights of a step's first update
    call: trained one weight at a time (mxnet_mpi's default in a job) or in
    groups of 4 (MXNet's), the weights were not those of one group of all
    six; on two devices, the second device's copies drifted from the first's."""
    whole = lars_training(6, 1, monkeypatch)
    for aggregate in (1, 4):
        got = lars_training(aggregate, 1, monkeypatch)
        for g, w in zip(got, whole):
            np.testing.assert_array_equal(g[0], w[0])
    for copies in lars_training(1, 2, monkeypatch):
        np.testing.assert_array_equal(copies[0], copies[1])


BRANCH_OPTIMIZERS = ["sgd", "lars", "adam", "lamb"]


def branch_weights(one_at_a_time: bool) -> dict:
    """tests/scripts/branch_training.py's weights per optimizer: one at a time
    as mxnet_mpi chooses in a job (its mends in), or MXNet alone with its own
    group sizes."""
    env = dict(mpi_env(), MXNET_MPI_AUTOLOAD="1" if one_at_a_time else "0")
    env.pop("MXNET_OPTIMIZER_AGGREGATION_SIZE", None)
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "scripts" / "branch_training.py"),
                           ",".join(BRANCH_OPTIMIZERS)]
                          + (["--one-at-a-time"] if one_at_a_time else []),
                          capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {k: np.array(v) for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}


def test_skipped_steps_train_as_with_mxnets_groups():
    """A scheduler's rate for a step's first weights after a skipped step
    (ignore_stale_grad=True, a branch): one at a time, as mxnet_mpi chooses
    in a job, they train as MXNet alone does with its own group sizes. SGD's
    and LARS's groups move the step number first (SGD's weights were 0.13
    away in a 2-rank job); Adam counts weight by weight, as LAMB does inside
    its groups (an earlier mend moved the number for them too, 1e-2 away)."""
    one, grouped = branch_weights(True), branch_weights(False)
    for name in BRANCH_OPTIMIZERS:
        np.testing.assert_allclose(one[name], grouped[name], rtol=1e-5, atol=1e-6,
                                   err_msg=name)


def test_moved_to_another_device_updates_as_mxnet_alone():
    """Nadam's second-device mend keyed a parameter's copies by the first
    device it ever saw: moved to another device (reset_ctx, or states loaded
    there), its m_schedule froze (0.025 away from MXNet alone in 5 steps);
    LARS's step marker came from the same first device. Updates by hand
    after a Trainer's step were taken for another device's copy."""
    script = str(ROOT / "tests" / "scripts" / "nadam_moves.py")
    got = []
    for autoload in ("1", "0"):
        env = dict(mpi_env(), MXNET_MPI_AUTOLOAD=autoload)
        proc = subprocess.run([sys.executable, script], capture_output=True, text=True,
                              env=env, cwd=str(ROOT), timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    for name in ("nadam", "lars", "nadam_by_hand"):
        np.testing.assert_array_equal(got[0][name], got[1][name], err_msg=name)


SAVE = """
import pickle, sys
import mxnet as mx


class OneAtATime(mx.optimizer.SGD):   # a class of the user's that chooses its own size
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.aggregate_num = 1


class Inherits(mx.optimizer.LAMB):   # takes LAMB's size, as LAMB does
    pass


opts = [mx.optimizer.LAMB(multi_precision=True), mx.optimizer.SGD(momentum=0.9),
        mx.optimizer.Adam(), OneAtATime(), Inherits()]
print("SAVED", [o.aggregate_num for o in opts])
open(sys.argv[1], "wb").write(pickle.dumps(opts))
"""
LOAD = """
import pickle, sys
import mxnet as mx


class OneAtATime(mx.optimizer.SGD):
    pass


class Inherits(mx.optimizer.LAMB):
    pass
print("LOADED", [o.aggregate_num for o in pickle.loads(open(sys.argv[1], "rb").read())])
"""


def test_saved_optimizer_carries_mxnets_group_size_where_mxnet_mpi_chose_it(tmp_path):
    """Optimizers pickled (Trainer.save_states) in a rank of an MPI job, where
    mxnet_mpi chose one-at-a-time updates: resumed without mxnet_mpi they
    kept that size, and float16 LAMB with multi_precision then ran MXNet's
    unmended update (no training, silently); with mxnet_mpi they take it back."""
    blob = str(tmp_path / "opts.pkl")

    def run(script: str, **env) -> str:
        proc = subprocess.run([sys.executable, "-c", script, blob], env=mpi_env(env),
                              cwd=str(ROOT), capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout.split(None, 1)[1].strip()

    rank = {"OMPI_COMM_WORLD_SIZE": "2"}   # what the start-up hook reads of the job
    assert run(SAVE, **rank) == "[1, 1, 0, 1, 1]"
    # (a class of the user's that sets its own size keeps it: saved as it is;
    # one that inherits LAMB's size is saved as LAMB is)
    assert run(LOAD, MXNET_MPI_AUTOLOAD="0") == "[45, 4, 0, 1, 45]"
    assert run(LOAD, **rank) == "[1, 1, 0, 1, 1]"
    # where the user chose the size, it is the user's, saved as it is
    assert run(SAVE, MXNET_OPTIMIZER_AGGREGATION_SIZE="2", **rank) == "[2, 2, 0, 1, 2]"
    assert run(LOAD, MXNET_MPI_AUTOLOAD="0") == "[2, 2, 0, 1, 2]"
