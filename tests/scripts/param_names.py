"""Messages about a Trainer's or a Module's collectives name the parameter (as
each rank names it), keep the key, and say which call and step pushed the
collective, also when the error surfaces steps later.

  mpirun -np 2 python param_names.py MODE OUTDIR SECTION[,SECTION...]
  mpirun -np 2 python param_names.py MODE OUTDIR stall

Sections check the messages themselves (tests/scripts/_common.py Results) and
keep them in rank<r>.json under "messages" for the test's output. 'stall'
ends in the stall abort (run it alone, with short MXNET_MPI_STALL_* settings):
rank 1 never issues the allreduce of one parameter.
"""

from __future__ import annotations

import re
import sys
import time

import mxnet as mx
import numpy as np
from _common import Results

import mxnet_mpi

MODE, OUTDIR, SECTIONS = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
RANK = mxnet_mpi.rank()
messages: dict = {}


def mlp(tag: str, in_units: int | None, names_per_rank: bool = False):
    """Dense(5) -> Dense(3), parameters '<tag>_a_weight', ... ('<tag>_r<rank>_a_weight'
    with `names_per_rank`: as Gluon's global name counters can make them)."""
    tag = "%s_r%d" % (tag, RANK) if names_per_rank else tag
    net = mx.gluon.nn.Sequential()
    net.add(mx.gluon.nn.Dense(5, in_units=in_units or 0, prefix=tag + "_a_"),
            mx.gluon.nn.Dense(3, in_units=5, prefix=tag + "_b_"))
    net.initialize()
    return net


def settle() -> None:
    """Let the rest of a failed step finish. MXNet raises an engine error once
    and then forgets it, so ops pushed before that may still fail (named too)."""
    for _ in range(20):
        try:
            mx.nd.waitall()
            return
        except mx.base.MXNetError:
            pass


def trainer_of(net):
    return mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                            kvstore="mpi_" + MODE)


def one_step(net, trainer, width: int) -> None:
    x = mx.nd.ones((4, width))
    with mx.autograd.record():
        loss = net(x).sum()
    loss.backward()
    trainer.step(4)


def raised(fn, *args) -> str | None:
    try:
        fn(*args)
        mx.nd.waitall()
    except mx.base.MXNetError as e:
        settle()
        return str(e)
    return None


def expect(res: Results, section: str, msg: str | None, wants: list) -> None:
    messages[section] = msg
    if msg is None:
        res.check(False, "%s: nothing was raised" % section)
        return
    for want in wants:
        res.check(want in msg, "%s: %r is not in the message" % (section, want))


def keyed(trainer, param) -> str:
    return "key=%d" % trainer._param2idx[param.name]


def section_init_shape(res: Results) -> None:
    """A rank-dependent shape (in_units) under a Trainer: the initial broadcast
    disagrees; ranks name their layers differently (names are printed, not
    agreed on)."""
    width = 8 if RANK == 0 else 6
    net = mlp("init", width, names_per_rank=True)
    trainer = trainer_of(net)
    msg = raised(one_step, net, trainer, width)
    w = net[0].weight
    # #4: after the Trainer's tables of names and (names differ) order, and
    # of parameters waiting for deferred initialisation
    expect(res, "init_shape", msg, [
        "ranks disagree", "[Trainer init: broadcast of initial weights]",
        "rank 0 runs #4 'broadcast %s shape=(5, 8) float32' (40 elements) for parameter "
        "'init_r0_a_weight'" % keyed(trainer, w),
        "rank 1 runs #4 'broadcast %s shape=(5, 6) float32' (30 elements) for parameter "
        "'init_r1_a_weight'" % keyed(trainer, w)])


def section_deferred_shape(res: Results) -> None:
    """The same with deferred initialisation: the broadcast at the first forward."""
    width = 8 if RANK == 0 else 6
    net = mlp("deferred", None)
    trainer = trainer_of(net)
    msg = raised(one_step, net, trainer, width)
    w = net[0].weight
    expect(res, "deferred_shape", msg, [
        "ranks disagree", "for parameter %r" % w.name, keyed(trainer, w),
        "[first forward before Trainer.step 1: broadcast of deferred-init weights]"])


def section_later(res: Results) -> None:
    """A collective that fails at step 3 (rank 1's gradient carries an engine
    error) is raised on rank 0 at step 4, the first read of what it wrote;
    the message still names step 3, the gradient allreduce and the parameters."""
    net = mlp("later", 4)
    trainer = trainer_of(net)
    w, b = net[0].weight, net[0].bias
    step_raised, msg = None, None
    for step in range(1, 6):
        try:
            x = mx.nd.ones((4, 4))
            with mx.autograd.record():
                loss = net(x).sum()
            loss.backward()
            if step == 3 and RANK == 1:
                g = w.grad()
                bad = mx.nd.arange(g.size)
                bad[0] = 10 ** 6   # out of range: fails inside the engine, not here
                g[:] = mx.nd.take(g.reshape((-1,)), bad, mode="raise").reshape(g.shape)
            trainer.step(4)
        except mx.base.MXNetError as e:
            step_raised, msg = step, str(e)
            break
    settle()
    res.check(step_raised == 4, "later: raised at step %r, expected 4" % (step_raised,))
    if RANK == 0:
        expect(res, "later", msg, [
            "rank 1 could not take part", "[Trainer.step 3: gradient allreduce]",
            repr(w.name), repr(b.name), keyed(trainer, w).replace("key=", "keys=(")])
    else:
        messages["later"] = msg   # rank 1's own error: MXNet's out-of-range take


def section_bad_value(res: Results) -> None:
    """This rank's own errors and its peer's token name the parameter too."""
    net = mlp("bad", 4)
    trainer = trainer_of(net)
    one_step(net, trainer, 4)
    mx.nd.waitall()
    kv, w = trainer._kvstore, net[0].weight
    key = trainer._param2idx[w.name]
    value = mx.nd.ones((7,)) if RANK == 1 else w.grad().copy()
    msg = None
    try:
        with kv.serving("test: a pushpull of a wrong shape"):
            kv.pushpull(key, value)
        value.wait_to_read()
    except mx.base.MXNetError as e:
        msg = str(e)
        settle()
    if RANK == 1:
        expect(res, "bad_value", msg, ["key %d (parameter %r) was first used with shape (5, 4)"
                                       % (key, w.name)])
    else:
        expect(res, "bad_value", msg, ["rank 1 could not take part", "for parameter %r"
                                       % w.name, "[test: a pushpull of a wrong shape]"])


def section_names_differ(res: Results) -> None:
    """Names are printed, never agreed on: ranks whose layers are named
    differently still train together."""
    net = mlp("differ", 4, names_per_rank=True)
    trainer = trainer_of(net)
    for _ in range(2):
        one_step(net, trainer, 4)
    got = net[0].weight.data().asnumpy()
    table = mxnet_mpi.consistency.hashes_per_rank(trainer._kvstore, np.array(
        [mxnet_mpi.consistency._digest(net[0].weight.data())], dtype=np.int64))
    res.check(len(table.ranks) == mxnet_mpi.size() and table.differing() == [],
              "names_differ: weights differ across ranks")
    res.check(np.abs(got).sum() > 0, "names_differ: no weights")


def layers_agree(res: Results, section: str, net, trainer) -> None:
    """Each layer has rank 0's starting weights, and after a step the same
    weights on every rank."""
    for j, layer in enumerate(net):
        res.equal(layer.weight.data(), np.full((3, 3), 10.0 * j, np.float32),
                  "%s: layer %d from rank 0" % (section, j))
    one_step(net, trainer, 3)
    mine = np.concatenate([p.data().asnumpy().ravel() for p in
                           (net[0].weight, net[0].bias, net[1].weight, net[1].bias)])
    table = mxnet_mpi.consistency.hashes_per_rank(trainer._kvstore, np.array(
        [mxnet_mpi.consistency._digest(mx.nd.array(mine))], dtype=np.int64))
    res.check(table.differing() == [], "%s: ranks' layers differ after a step" % section)
    res.check(not np.array_equal(mine[:9], np.zeros(9, np.float32)), "%s: no update" % section)


def two_layers(prefixes) -> mx.gluon.nn.Sequential:
    """Dense(3, in_units=3) x 2; rank r's layer j starts at 10 * j + r."""
    net = mx.gluon.nn.Sequential()
    for prefix in prefixes:
        net.add(mx.gluon.nn.Dense(3, in_units=3, prefix=prefix))
    for j, layer in enumerate(net):
        layer.initialize(mx.init.Constant(10.0 * j + RANK))
    return net


def section_list_order(res: Results) -> None:
    """A list of parameters in another order on rank 1 (same names, same
    shapes at each position): paired by name, where positions paired
    different layers (silent drift)."""
    net = two_layers(["lo_a_", "lo_b_"])
    params = list(net.collect_params().values())
    if RANK == 1:
        params = params[2:] + params[:2]
    layers_agree(res, "list_order", net, mx.gluon.Trainer(
        params, "sgd", {"learning_rate": 0.1}, kvstore="mpi_" + MODE))


def section_name_counters(res: Results) -> None:
    """Gluon's counters name the layers so that sorted names put the second
    layer first on rank 0 only ('c9_', 'c10_' there, 'c0_', 'c1_' elsewhere:
    rank 0 made 9 layers first). The Trainer's keys are positions in that
    order: it pairs the same layers on every rank (sorted names paired rank
    0's second layer with the others' first: same shapes, silent drift)."""
    first = 9 if RANK == 0 else 0
    net = two_layers(["c%d_" % (first + j) for j in range(2)])
    layers_agree(res, "name_counters", net, trainer_of(net))


def section_module_shape(res: Results) -> None:
    """Module: a rank-dependent num_hidden; nothing is read for three updates,
    then the first read raises the error of Module init's broadcast."""
    data = mx.sym.Variable("data")
    net = mx.sym.FullyConnected(data, num_hidden=4 if RANK == 0 else 5, name="fc1")
    net = mx.sym.LinearRegressionOutput(mx.sym.sum(net, axis=1, keepdims=True), name="lro")
    mod = mx.mod.Module(net, label_names=["lro_label"])
    mod.bind(data_shapes=[("data", (2, 3))], label_shapes=[("lro_label", (2, 1))])
    mod.init_params()
    mod.init_optimizer(kvstore="mpi_" + MODE)
    batch = mx.io.DataBatch([mx.nd.ones((2, 3))], [mx.nd.ones((2, 1))])
    msg = None
    try:
        for _ in range(3):
            mod.forward_backward(batch)
            mod.update()
        mod.get_outputs()[0].asnumpy()
    except mx.base.MXNetError as e:
        msg = str(e)
        settle()
    # the first read raises the weight's or the bias's error, whichever MXNet meets first
    param = re.search(r"key='(fc1_weight|fc1_bias)'", msg or "")
    name = param.group(1) if param else "fc1_weight"
    expect(res, "module_shape", msg, [
        "ranks disagree", "key=%r" % name, "for parameter %r" % name,
        "[Module init: broadcast of initial weights]"])


def stall() -> None:
    """Rank 1 never issues the allreduce of the first layer's parameters (frozen
    there: grad_req 'null'; pushed last, so nothing else is out of step), then
    waits."""
    net = mlp("stall", 4)
    if RANK == 1:
        for p in net[0].collect_params().values():
            p.grad_req = "null"
    trainer = trainer_of(net)
    one_step(net, trainer, 4)
    if RANK == 1:
        time.sleep(60)   # the stall abort ends the job first
    mx.nd.waitall()


SECTION_FNS = {
    "init_shape": section_init_shape, "deferred_shape": section_deferred_shape,
    "later": section_later, "bad_value": section_bad_value,
    "names_differ": section_names_differ, "name_counters": section_name_counters,
    "list_order": section_list_order,
    "module_shape": section_module_shape,
}

if SECTIONS == ["stall"]:
    stall()
    sys.exit(0)
res = Results(OUTDIR, RANK)
for name in SECTIONS:
    res.run(name, SECTION_FNS[name])
res.write(messages=messages)
