"""`out` aliasing `value`, and averaging, on every rank of a store of MODE.

  mpirun -np N python alias_average.py MODE

Prints one line per check: "CHECK <name> ok" or "CHECK <name> FAIL <detail>".
"""

from __future__ import annotations

import os
import sys

import mxnet as mx
import numpy as np

import mxnet_mpi

mode = sys.argv[1]
kv = mx.kv.create("mpi_" + mode)
R, N = kv.rank, kv.num_workers


def check(name: str, ok: bool, detail: str = "") -> None:
    print("CHECK %s %s %s" % (name, "ok" if ok else "FAIL", detail), flush=True)


def rank_values(n: int, dtype="float32") -> mx.nd.NDArray:
    return mx.nd.array(np.arange(n) + 100 * (R + 1), dtype=dtype)


def summed(n: int) -> np.ndarray:
    return sum(np.arange(n) + 100 * (r + 1) for r in range(N)).astype(np.float32)


# out is value itself: in place
a = rank_values(6)
kv.pushpull("same", a, out=a)
check("out_is_value", np.array_equal(a.asnumpy(), summed(6)))

# out is another NDArray over exactly the same memory: in place
base = rank_values(6)
same_view = base.reshape((6,))
kv.pushpull("same_view", base, out=same_view)
check("out_same_memory_view", np.array_equal(base.asnumpy(), summed(6)))

# out overlaps value in part: a clear error on this rank (every rank does it),
# no hang, and the store stays exact afterwards
flat = rank_values(8)
try:
    kv.pushpull("overlap", flat[0:6], out=flat[2:8])
    flat.asnumpy()
    check("overlap_is_error", False, "no error")
except mxnet_mpi.MPIKVStoreError as exc:
    check("overlap_is_error", "overlap" in str(exc), str(exc).splitlines()[0][:200])
b = rank_values(4)
kv.pushpull("after_overlap", b)
check("exact_after_overlap", np.array_equal(b.asnumpy(), summed(4)))

# averaging: the store's switch, against the sum path on the same data
for dtype in ("float32", "float64"):
    s = rank_values(5, dtype)
    kv.pushpull("sum-" + dtype, s)
    kv.average = True
    m = rank_values(5, dtype)
    kv.pushpull("avg-" + dtype, m)
    kv.average = False
    check("average_" + dtype, np.array_equal(m.asnumpy(), s.asnumpy() / N),
          "%s vs %s" % (m.asnumpy()[:2], s.asnumpy()[:2] / N))

# integers cannot be averaged: an error naming the key (they were summed, silently),
# on every rank, and the store goes on; with the switch off they are summed
kv.average = True
i = rank_values(4, "int32")
try:
    kv.pushpull("int-avg", i)
    i.asnumpy()
    refused = ""
except mxnet_mpi.MPIKVStoreError as exc:
    refused = str(exc)
kv.average = False
kv.pushpull("int-avg", i)
check("average_int_refused", "key 'int-avg'" in refused and "int32" in refused
      and np.array_equal(i.asnumpy(), summed(4).astype(np.int32)), refused)

# MXNET_MPI_AVERAGE=1 at creation; a Trainer on it takes averaged gradients
os.environ["MXNET_MPI_AVERAGE"] = "1"
kv_avg = mx.kv.create("mpi_" + mode)
del os.environ["MXNET_MPI_AVERAGE"]
c = rank_values(3)
kv_avg.pushpull("c", c)
check("average_env", kv_avg.average and np.allclose(c.asnumpy(), summed(3) / N, rtol=0, atol=0))


def trained(store) -> np.ndarray:
    net = mx.gluon.nn.Dense(2, in_units=3, use_bias=False)
    net.initialize(mx.init.Constant(0.5))
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                               kvstore=store)
    x = mx.nd.array(np.full((4, 3), R + 1.0))
    with mx.autograd.record():
        loss = net(x).sum()
    loss.backward()
    trainer.step(4)
    return net.weight.data().asnumpy()


w_sum = trained(kv)          # summed gradients / batch 4
w_avg = trained(kv_avg)      # averaged gradients / batch 4: a step N times smaller
check("trainer_average_vs_sum", np.allclose(0.5 - w_avg, (0.5 - w_sum) / N, rtol=1e-6),
      "%s %s" % (w_avg.ravel()[:2], w_sum.ravel()[:2]))
print("rank %d done" % R, flush=True)
