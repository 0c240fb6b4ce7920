"""Weight consistency check on real ranks.

  mpirun -np N python consistency.py MODE SCENARIO
    api        check_consistency() with each action after rank 1's weight moved 1 ulp
    periodic   MXNET_MPI_CONSISTENCY_EVERY=2 (set by the test), action broadcast
    off        no setting: no extra collective is issued
    states     rank 1's momentum (float32) or float32 master copy (float16, multi_precision)
               moves; check_consistency(action='broadcast') makes the ranks alike for good
    joined     MXNET_MPI_CONSISTENCY_EVERY=1 and action raise (set by the test): the
               last rank runs out of data and joins; the checks of the others' later
               steps leave the joined rank out (it adds zeros to every sum) and, with
               3 ranks, name rank 1, whose weight moved after the join
    hybrid     (MODE is dist_sync_mpi or dist_async_mpi, under mxnet_mpi.launch) the
               ranks of one group are compared; broadcast repairs the nudge
Prints "RESULT <rank> <key>=<value> ..." lines.
"""

import re
import sys
import warnings

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import mxnet_mpi
from mxnet_mpi.consistency import check_consistency

mode, scenario = sys.argv[1], sys.argv[2]
R = mxnet_mpi.rank()

net = gluon.nn.HybridSequential()
net.add(gluon.nn.Dense(4, in_units=3), gluon.nn.Dense(2, in_units=4))
net.initialize(mx.init.Xavier())
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                        kvstore=mode if mode.startswith("dist_") else "mpi_" + mode)
x = mx.nd.array(np.full((2, 3), R + 1.0))


def step() -> None:
    with autograd.record():
        loss = net(x).sum()
    loss.backward()
    trainer.step(2)


def nudge(relative: float = 0.0) -> None:
    """Move one element of the second layer's weight on rank 1: by one ulp, or
    by `relative` of its value (a difference that an update cannot round away:
    one ulp of a weight before an SGD step can vanish in the step's rounding,
    as it did for 5 of 12 random initialisations)."""
    if R == 1:
        w = net[1].weight.data()
        v = w.asnumpy()
        if relative:
            v[0, 0] = v[0, 0] * np.float32(1 + relative) + np.float32(relative)
        else:
            v[0, 0] = np.nextafter(v[0, 0], np.float32(np.inf))
        w[:] = v


def same_everywhere() -> bool:
    """Do all ranks hold bit-identical weights? (sum of byte differences to rank 0)"""
    w = np.concatenate([p.data().asnumpy().ravel() for p in net.collect_params().values()])
    mine = mx.nd.array(w.view(np.int32).astype(np.int64), dtype="int64")
    root = mine.copy()
    kv = trainer._kvstore
    kv.broadcast("root-copy", root, out=root)
    diff = mx.nd.array([int((mine.asnumpy() != root.asnumpy()).sum())], dtype="int64")
    kv.pushpull("diff-count", diff)
    return int(diff.asscalar()) == 0


step()
if scenario == "api":
    issued = trainer._kvstore.stream.info()[0]
    clean = check_consistency(trainer)
    one_collective = trainer._kvstore.stream.info()[0] - issued == 1
    nudge()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = check_consistency(trainer, action="warn")
    warned = [str(w.message) for w in caught if "weights differ" in str(w.message)]
    # under Python's default filter a second check still finding them apart
    # warns again (an identical text was shown once per place)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(2):
            check_consistency(trainer, action="warn")
    repeated = sum("weights differ" in str(w.message) for w in caught) == 2
    try:
        check_consistency(trainer, action="raise")
        raised = "no"
    except mxnet_mpi.MPIKVStoreError as exc:
        raised = "yes" if "ranks" in str(exc) else str(exc)
    still_differ = not same_everywhere()
    check_consistency(trainer, action="broadcast")
    fixed = same_everywhere()
    print("RESULT %d clean=%s one_collective=%s found=%s warned=%s repeated=%s raised=%s "
          "still_differ=%s fixed=%s" % (R, clean == [], one_collective, found, bool(warned),
                                        repeated, raised, still_differ, fixed), flush=True)
    if warned:
        print("WARNING %d %s" % (R, warned[0]), flush=True)
elif scenario == "periodic":
    nudge(relative=1e-3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step()            # step 2: the check runs, finds rank 1's nudge, re-broadcasts
    warned = any("weights differ" in str(w.message) for w in caught)
    print("RESULT %d warned=%s fixed=%s" % (R, warned, same_everywhere()), flush=True)
elif scenario == "hybrid":
    nudge()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = check_consistency(trainer, action="broadcast")
    warned = any("rank(s) 1 differ" in str(w.message) for w in caught)
    after = check_consistency(trainer, action="raise")   # raises if still different
    print("RESULT %d type=%s group=%d found=%s warned=%s after=%s"
          % (R, trainer._kvstore.type, trainer._kvstore.comm.size, found, warned, after),
          flush=True)
elif scenario == "joined":
    # the last rank runs out of data after 2 steps; with 3 ranks, rank 1 then
    # moves a weight, which the checks of the steps after the join must name
    last = mxnet_mpi.size() - 1
    error = None
    try:
        for i in range(2 if R == last else 4):
            if i == 2 and last >= 2:
                nudge(relative=1e-3)
            step()
        mxnet_mpi.join(trainer)
        mx.nd.waitall()
    except mxnet_mpi.MPIKVStoreError as e:
        error = str(e).splitlines()[0]
        mxnet_mpi.join(trainer)   # the others still wait for this rank
        mx.nd.waitall()
    named = re.search(r"rank\(s\) ([0-9, ]+) differ", error or "")
    print("RESULT %d error=%s differ=%s same=%s"
          % (R, error is not None, named.group(1).replace(" ", "") if named else None,
             same_everywhere()), flush=True)
elif scenario == "states":
    # Rank 1's optimizer state moves (its momentum; its float32 master copy of
    # float16 weights), the next step takes its weights apart, and the check's
    # broadcast must make the ranks alike for good: with rank 0's weights
    # alone, the next update took them apart again.
    class Linear(gluon.HybridBlock):
        """A weight of `dtype` used in float32 (MXNet's CPU FullyConnected has
        no float16)."""

        def __init__(self, units: int, in_units: int, dtype: str) -> None:
            super().__init__()
            with self.name_scope():
                self.weight = self.params.get("weight", shape=(units, in_units), dtype=dtype,
                                              init=mx.init.Xavier())

        def hybrid_forward(self, F, x, weight):
            return F.dot(x, F.cast(weight, "float32"), transpose_b=True)

    out = []
    for dtype in ("float32", "float16"):
        net2 = gluon.nn.HybridSequential()
        net2.add(Linear(4, 3, dtype), Linear(2, 4, dtype))
        net2.initialize()
        sched = mx.lr_scheduler.FactorScheduler(step=1000, base_lr=0.1)
        tr = gluon.Trainer(net2.collect_params(), "sgd",
                           {"momentum": 0.9, "wd": 0.01, "lr_scheduler": sched,
                            "multi_precision": True}, kvstore="mpi_" + mode)
        held = tr._optimizer
        x2 = mx.nd.array(np.full((2, 3), R + 1.0))

        def step2(net2=net2, x2=x2, tr=tr) -> None:
            with autograd.record():
                loss = net2(x2).sum()
            loss.backward()
            tr.step(2)
            mx.nd.waitall()

        def alike(tr=tr) -> bool:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return check_consistency(tr, action="warn") == []

        step2()
        if R == 1:
            state = tr._updaters[0].states[tr._param2idx[net2[1].weight.name]]
            moved = state[1] if dtype == "float16" else state   # SGD: (momentum, master)
            moved[:] += 0.05
        step2()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            found = check_consistency(tr, action="broadcast")
        said = any("weights and optimizer states to every rank" in str(w.message)
                   for w in caught)
        # the program's optimizer and scheduler are still the ones every rank
        # uses (a copy of rank 0's took their place on the others: a later
        # change by the program reached rank 0 only)
        kept = (tr._optimizer is held and tr._updaters[0].optimizer is held
                and held.lr_scheduler is sched)
        sched.base_lr = 0.05
        step2()
        step2()
        out.append("%s_found=%s %s_said=%s %s_kept=%s %s_alike=%s"
                   % (dtype, found == [net2[1].weight.name], dtype, said, dtype, kept, dtype,
                      alike()))
    print("RESULT %d %s" % (R, " ".join(out)), flush=True)
elif scenario == "off":
    kv = trainer._kvstore
    issued = kv.stream.info()[0]
    for _ in range(4):
        step()
    mx.nd.waitall()
    per_step = (kv.stream.info()[0] - issued) / 4
    print("RESULT %d per_step=%g" % (R, per_step), flush=True)
