"""BucketingModule and SequentialModule with our store on 2 ranks (rank r has
2 + 2 r batches where the data is uneven).

  bucketing.py fit_uneven      BucketingModule.fit joins at each end of epoch (the
                               ranks end them in different buckets)
  bucketing.py fit_switched    the same where init_optimizer ran in bucket 3, which lacks
                               the default bucket's last layer
  bucketing.py write_other     rank 0 set_params while a non-default bucket is current
  bucketing.py sequential      SequentialModule.fit on uneven data: named at the epoch's end
"""

import sys

import mxnet as mx
import numpy as np

import mxnet_mpi

case = sys.argv[1]
rank = mxnet_mpi.rank()
BATCH = 4
rng = np.random.RandomState(3 + rank)


def sym_gen(k):
    d, label = mx.sym.Variable("data"), mx.sym.Variable("lin_label")
    h = mx.sym.sum(mx.sym.FullyConnected(d, num_hidden=5, flatten=False, name="fc"), axis=1)
    o = mx.sym.FullyConnected(mx.sym.Activation(h, act_type="tanh"), num_hidden=1, name="out")
    return mx.sym.LinearRegressionOutput(o, label, name="lin"), ("data",), ("lin_label",)


def sym_gen_extra(k):
    """sym_gen, with a last layer only the default bucket (5) has."""
    sym, data, label = sym_gen(k)
    if k != 5:
        return sym, data, label
    d, lab = mx.sym.Variable("data"), mx.sym.Variable("lin_label")
    h = mx.sym.sum(mx.sym.FullyConnected(d, num_hidden=5, flatten=False, name="fc"), axis=1)
    o = mx.sym.FullyConnected(mx.sym.Activation(h, act_type="tanh"), num_hidden=1, name="out")
    o = mx.sym.FullyConnected(o, num_hidden=1, name="extra")
    return mx.sym.LinearRegressionOutput(o, lab, name="lin"), ("data",), ("lin_label",)


def batch(k):
    x, y = rng.randn(BATCH, k, 2).astype(np.float32), rng.randn(BATCH, 1).astype(np.float32)
    return mx.io.DataBatch([mx.nd.array(x)], [mx.nd.array(y)], bucket_key=k,
                           provide_data=[mx.io.DataDesc("data", x.shape)],
                           provide_label=[mx.io.DataDesc("lin_label", y.shape)])


class Buckets(mx.io.DataIter):
    def __init__(self, n, shift=None):
        super().__init__(BATCH)
        self.default_bucket_key = 5
        self.provide_data = [mx.io.DataDesc("data", (BATCH, 5, 2))]
        self.provide_label = [mx.io.DataDesc("lin_label", (BATCH, 1))]
        # rank 0 ends its epochs in the default bucket, rank 1 in another: the
        # join ran on each rank's current bucket, which differed
        shift = rank if shift is None else shift
        self.batches = [batch(3 + 2 * ((i + shift) % 2)) for i in range(n)]
        self.i = 0

    def reset(self):
        self.i = 0

    def next(self):
        if self.i >= len(self.batches):
            raise StopIteration
        self.i += 1
        return self.batches[self.i - 1]


def checksum(mod):
    arg, _ = mod.get_params()
    return sum(float(v.asnumpy().astype(np.float64).sum()) for v in arg.values())


mx.random.seed(5 + rank)
if case == "fit_uneven":
    mod = mx.mod.BucketingModule(sym_gen, default_bucket_key=5, context=mx.cpu())
    mod.fit(Buckets(2 + 2 * rank), num_epoch=2, kvstore="mpi", optimizer="sgd",
            optimizer_params={"learning_rate": 0.1, "momentum": 0.9}, eval_metric="mse")
elif case == "fit_switched":
    # the join copied only the parameters of the bucket that ran
    # init_optimizer: 'extra' stayed apart, exit 0. MXNet's fit needs each
    # epoch to end in a bucket with every parameter: the ranks end in 5.
    mod = mx.mod.BucketingModule(sym_gen_extra, default_bucket_key=5, context=mx.cpu())
    mod.bind([("data", (BATCH, 5, 2))], [("lin_label", (BATCH, 1))])
    mod.init_params(mx.init.Xavier())
    mod.switch_bucket(3, [("data", (BATCH, 3, 2))], [("lin_label", (BATCH, 1))])
    mod.init_optimizer(kvstore="mpi", optimizer="sgd",
                       optimizer_params={"learning_rate": 0.1, "momentum": 0.9})
    mod.fit(Buckets(2 + 2 * rank, shift=0), num_epoch=2, eval_metric="mse")
elif case == "write_other":
    mod = mx.mod.BucketingModule(sym_gen, default_bucket_key=5, context=mx.cpu())
    mod.bind([("data", (BATCH, 5, 2))], [("lin_label", (BATCH, 1))])
    mod.init_params(mx.init.Xavier())
    mod.init_optimizer(kvstore="mpi", optimizer="sgd", optimizer_params={"learning_rate": 0.05})
    for i in range(60):   # compared every 64 collectives, read at the next comparison
        mod.forward_backward(batch(3 if i % 2 == 0 else 5))
        mod.update()
        if i == 2 and rank == 0:   # bucket 3 is current: another module than init_optimizer's
            arg, aux = mod.get_params()
            mod.set_params({n: v + 1 for n, v in arg.items()}, aux)
else:
    x = rng.randn((2 + 2 * rank) * BATCH, 6).astype(np.float32)
    y = rng.randn((2 + 2 * rank) * BATCH, 1).astype(np.float32)
    it = mx.io.NDArrayIter(x, y, batch_size=BATCH, label_name="lin_label")
    first = mx.mod.Module(mx.sym.FullyConnected(mx.sym.Variable("data"), num_hidden=4,
                                                name="fc1"), label_names=None)
    second = mx.mod.Module(mx.sym.LinearRegressionOutput(
        mx.sym.FullyConnected(mx.sym.Variable("data"), num_hidden=1, name="fc2"),
        mx.sym.Variable("lin_label"), name="lin"), label_names=["lin_label"])
    mod = mx.mod.SequentialModule()
    mod.add(first).add(second, take_labels=True, auto_wiring=True)
    mod.fit(it, num_epoch=2, kvstore="mpi", optimizer="sgd",
            optimizer_params={"learning_rate": 0.05}, eval_metric="mse")
print("rank %d CHECKSUM %.12g" % (rank, checksum(mod)), flush=True)
