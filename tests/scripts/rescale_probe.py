"""Print the rescale_grad Module.init_optimizer picks for each kvstore named
on the command line (batch size 8). No `import mxnet_mpi`: our stores come
from the runner (python -m mxnet_mpi, which the launcher uses), MXNet's own
dist_sync/dist_async from ps-lite.

  python rescale_probe.py KVSTORE [KVSTORE...]
Prints "RESCALE <kvstore type> <num_workers> <rescale_grad>" per store.
"""

import sys

import mxnet as mx

data = mx.sym.Variable("data")
net = mx.sym.FullyConnected(data, num_hidden=2, name="fc")
net = mx.sym.SoftmaxOutput(net, name="softmax")
for name in sys.argv[1:]:
    mod = mx.mod.Module(net, context=mx.cpu())
    mod.bind(data_shapes=[("data", (8, 3))], label_shapes=[("softmax_label", (8,))])
    mod.init_params(initializer=mx.init.Constant(0.0))
    mod.init_optimizer(kvstore=name, optimizer="sgd")
    print("RESCALE %s %d %r" % (mod._kvstore.type, mod._kvstore.num_workers,
                                mod._optimizer.rescale_grad), flush=True)
