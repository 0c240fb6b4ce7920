"""Periodic consistency check from Module.update on real ranks.

  mpirun -np 2 python consistency_module.py MODE
with MXNET_MPI_CONSISTENCY_EVERY=2 and MXNET_MPI_CONSISTENCY_ACTION=broadcast
(set by the test): update 1, then rank 1's fc_weight moves 1 ulp, update 2
runs the check. Prints "RESULT <rank> warned=... names_fc_weight=... fixed=...".
"""

import sys
import warnings

import mxnet as mx
import numpy as np

import mxnet_mpi

mode = sys.argv[1]
R = mxnet_mpi.rank()
net = mx.sym.FullyConnected(mx.sym.Variable("data"), num_hidden=3, name="fc")
net = mx.sym.SoftmaxOutput(net, name="softmax")
mod = mx.mod.Module(net, context=mx.cpu())
mod.bind(data_shapes=[("data", (4, 5))], label_shapes=[("softmax_label", (4,))])
mod.init_params(initializer=mx.init.Xavier())
opt = mx.optimizer.SGD(learning_rate=0.1, momentum=0.9)   # held by the program
mod.init_optimizer(kvstore="mpi_" + mode, optimizer=opt)
batch = mx.io.DataBatch([mx.nd.full((4, 5), R + 1.0)], [mx.nd.array([0, 1, 2, 0])])


def step() -> None:
    mod.forward_backward(batch)
    mod.update()


def weights() -> np.ndarray:
    group = mod._exec_group
    return np.concatenate([a[0].asnumpy().ravel() for a in group.param_arrays])


def same_everywhere() -> bool:
    """Bit-identical to rank 0's weights? (independent of the check: a broadcast)"""
    mine = mx.nd.array(weights().view(np.int32).astype(np.int64), dtype="int64")
    root = mine.copy()
    mod._kvstore.broadcast("root-copy", root, out=root)
    diff = mx.nd.array([int((mine.asnumpy() != root.asnumpy()).sum())], dtype="int64")
    mod._kvstore.pushpull("diff-count", diff)
    return int(diff.asscalar()) == 0


step()
if R == 1:
    w = mod._exec_group.param_arrays[mod._exec_group.param_names.index("fc_weight")][0]
    v = w.asnumpy()
    v[0, 0] = np.nextafter(v[0, 0], np.float32(np.inf))
    w[:] = v
differs_before = not same_everywhere()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    step()
    mx.nd.waitall()
texts = [str(w.message) for w in caught if "weights differ" in str(w.message)]
fixed = same_everywhere()
# and by hand: check_consistency takes the Module itself (it raised TypeError)
if R == 1:
    w[:] = w + 1
mod.get_params()   # cached (rank 1: moved); the broadcast must make it read the arrays again
with warnings.catch_warnings(record=True):
    warnings.simplefilter("always")
    by_hand = mxnet_mpi.check_consistency(mod, action="broadcast")
held = mod._exec_group.param_arrays[mod._exec_group.param_names.index("fc_weight")][0]
fresh = np.array_equal(mod.get_params()[0]["fc_weight"].asnumpy(), held.asnumpy())
fixed_by_hand = same_everywhere()
# the broadcast copied rank 0's optimizer states into the program's optimizer,
# which every rank still uses: a later change of it reaches every rank
kept = mod._optimizer is opt and mod._updater.optimizer is opt
opt.set_learning_rate(0.01)
step()
step()
print("RESULT %d differs_before=%s warned=%s names_fc_weight=%s fixed=%s by_hand=%s "
      "fixed_by_hand=%s get_params_fresh=%s kept=%s alike_after=%s"
      % (R, differs_before, bool(texts), any("'fc_weight'" in t for t in texts), fixed,
         by_hand == ["fc_weight"], fixed_by_hand, fresh, kept, same_everywhere()), flush=True)
