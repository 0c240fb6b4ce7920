"""Staged (device-style) arrays through per-key pinned buffers, in chunks.

  MXNET_MPI_FORCE_STAGING=1 MXNET_MPI_STAGE_CHUNK_BYTES=4096 \\
      mpirun -np N python staging_run.py MODE

Host arrays are staged as GPU arrays would be (forced), with 4 KB chunks.
Prints "CHECK <name> ok|FAIL <detail>" lines.
"""

import sys

import mxnet as mx
import numpy as np

import mxnet_mpi
from mxnet_mpi import staging

mode = sys.argv[1]
assert staging.forced()
kv = mx.kv.create("mpi_" + mode)
R, N = kv.rank, kv.num_workers


def check(name, ok, detail=""):
    print("CHECK %s %s %s" % (name, "ok" if ok else "FAIL", detail), flush=True)


def value(shape, dtype, step):
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) % 97 + 10 * R + step).astype(dtype)


def total(shape, dtype, step):
    return sum((np.arange(int(np.prod(shape))).reshape(shape) % 97 + 10 * r + step)
               .astype(dtype) for r in range(N))


CASES = [("small", (100,), "float32"), ("chunked", (5000,), "float32"),
         ("matrix", (30, 70), "float64"), ("ints", (3000,), "int32"),
         ("pinned", (2500,), "float32")]
exact = True
issued_per_step = None
alloc_after_first = None
for step in range(6):
    before = kv.stream.info()[0]
    arrays = {}
    for name, shape, dtype in CASES:
        ctx = mx.cpu_pinned() if name == "pinned" else mx.cpu()
        arrays[name] = mx.nd.array(value(shape, dtype, step), ctx=ctx, dtype=dtype)
        kv.pushpull(name, arrays[name])
    out = mx.nd.zeros((5000,))
    kv.pushpull("with_out", mx.nd.array(value((5000,), "float32", step)), out=out)
    b = mx.nd.array(value((4000,), "float32", step))
    kv.broadcast("bcast", b, out=b)
    for name, shape, dtype in CASES:
        exact &= np.array_equal(arrays[name].asnumpy(), total(shape, dtype, step))
    exact &= np.array_equal(out.asnumpy(), total((5000,), "float32", step))
    exact &= np.array_equal(b.asnumpy(), value((4000,), "float32", step) - 10 * R)
    issued = kv.stream.info()[0] - before
    if step == 0:
        issued_per_step = issued
        alloc_after_first = kv._staging.stats()["allocations"]
check("exact_every_step", exact)
# 4 KB chunks: small 1, chunked 5 (20,000 B), matrix 5 (16,800 B), ints 3,
# pinned 3, with_out 5, bcast 4 collectives
check("chunk_collectives", issued_per_step == 1 + 5 + 5 + 3 + 3 + 5 + 4, str(issued_per_step))
stats = kv._staging.stats()
check("buffers_reused", stats["allocations"] == alloc_after_first == stats["buffers"],
      str(stats))

# a rank-local failure on a chunked key: every rank gets the error, and the
# next collective is exact (the failing rank left one token per chunk)
good = mx.nd.array(value((5000,), "float32", 0))
bad_out = mx.nd.zeros((4999,)) if R == N - 1 else mx.nd.zeros((5000,))
errors = []
try:
    kv.pushpull("chunked", good, out=bad_out)
    bad_out.asnumpy()
except mxnet_mpi.MPIKVStoreError as exc:
    errors.append(str(exc))
for _ in range(5):   # each chunk's collective failed: drain their errors
    try:
        mx.nd.waitall()
        break
    except mxnet_mpi.MPIKVStoreError as exc:
        errors.append(str(exc))
named = ("out 0 of key 'chunked' has shape (4999,)" in errors[0] if R == N - 1 else
         "rank %d could not take part" % (N - 1) in errors[0]) if errors else False
check("failure_everywhere", named and not any("disagree" in e for e in errors),
      errors[0].splitlines()[0][:200] if errors else "no error")
after = mx.nd.array(value((5000,), "float32", 1))
kv.pushpull("chunked", after)
check("exact_after_failure", np.array_equal(after.asnumpy(), total((5000,), "float32", 1)))

# a Trainer whose gradients are staged: same weights on every rank
net = mx.gluon.nn.Dense(3000, in_units=4)
net.initialize(mx.init.Constant(0.01))
trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=kv)
x = mx.nd.array(np.full((2, 4), R + 1.0))
for _ in range(3):
    with mx.autograd.record():
        loss = net(x).sum()
    loss.backward()
    trainer.step(2)
w = net.weight.data().asnumpy()
# d loss / d w[j, k] = sum over the batch of x[:, k] = 2 (r + 1); summed over ranks
want = 0.01 - 3 * 0.1 / 2 * sum(2.0 * (r + 1) for r in range(N))
check("trainer_staged", np.allclose(w, want, rtol=0, atol=1e-5), "%g vs %g" % (w[0, 0], want))
print("rank %d done" % R, flush=True)
