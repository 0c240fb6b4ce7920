"""mxnet_mpi.ops on real ranks, exact against numpy.

  mpirun -np N python ops_exact.py STORE      (STORE: free | chained | funneled | concurrent)
  mpirun -np N python ops_exact.py STORE mismatch

Prints "CHECK <name> ok|FAIL <detail>".
"""

import sys

import mxnet as mx
import numpy as np

import mxnet_mpi
from mxnet_mpi import ops

which = sys.argv[1]
store = None if which == "free" else mx.kv.create("mpi_" + which)
R, N = mxnet_mpi.rank(), mxnet_mpi.size()
if store is not None:   # the point-to-point threshold the store runs with
    print("P2P_BYTES %d" % store.stream.p2p_bytes, flush=True)


def check(name, ok, detail=""):
    print("CHECK %s %s %s" % (name, "ok" if ok else "FAIL", detail), flush=True)


def data(r, shape, dtype="float32", salt=0):
    n = int(np.prod(shape))
    return ((np.arange(n) % 13) + 7 * r + salt).reshape(shape).astype(dtype)


if len(sys.argv) > 2 and sys.argv[2] == "mismatch":
    cases = {
        "allreduce_shape": lambda: ops.allreduce(mx.nd.ones((3 + (R == N - 1),)), store=store),
        "allgather_trailing": lambda: ops.allgather(mx.nd.ones((2, 3 + (R == N - 1))),
                                                    store=store),
        "alltoall_trailing": lambda: ops.alltoall(mx.nd.ones((N, 2 + (R == N - 1))),
                                                  store=store),
        "alltoall_bad_splits_one_rank": lambda: ops.alltoall(
            mx.nd.ones((N, 2)), splits=[N + 1] * N if R == N - 1 else [1] * N, store=store),
        "allgather_0d_one_rank": lambda: ops.allgather(
            mx.nd.ones((2,)) if R != N - 1 else mx.nd.array(1.0).reshape(()), store=store),
        "broadcast_root_differs": lambda: ops.broadcast(
            mx.nd.ones((3,)), root_rank=N - 1 if R == N - 1 else 0, store=store),
    }
    for name, fn in cases.items():
        try:
            out = fn()
            (out[0] if isinstance(out, tuple) else out).asnumpy()
            mx.nd.waitall()
            check(name, False, "no error")
        except mxnet_mpi.MPIKVStoreError as exc:
            check(name, True, str(exc).splitlines()[0][:600])
        mx.nd.waitall()
    # the stream is still exact afterwards
    a = ops.allreduce(mx.nd.array(data(R, (4,))), store=store)
    check("exact_after_mismatch", np.array_equal(a.asnumpy(), sum(data(r, (4,)) for r in range(N))))
    sys.exit(0)

for dtype in ("float32", "float64", "int32"):
    x = mx.nd.array(data(R, (3, 4), dtype), dtype=dtype)
    want = sum(data(r, (3, 4), dtype) for r in range(N))
    check("allreduce_" + dtype, np.array_equal(ops.allreduce(x, store=store).asnumpy(), want))
    check("input_unchanged_" + dtype, np.array_equal(x.asnumpy(), data(R, (3, 4), dtype)))
    ops.allreduce_(x, store=store)
    check("allreduce_inplace_" + dtype, np.array_equal(x.asnumpy(), want))
y = mx.nd.array(data(R, (5,)))
check("allreduce_average", np.allclose(ops.allreduce(y, average=True, store=store).asnumpy(),
                                       sum(data(r, (5,)) for r in range(N)) / N, rtol=1e-6))


def small(r, dtype, n=7):
    """Values whose products over 3 ranks are exact in every dtype."""
    v = (np.arange(n) * (r + 2) + r) % 5
    return (v if dtype == "uint8" else v - 2).astype(dtype)


REDUCE = {"min": np.minimum, "max": np.maximum, "product": np.multiply}
for dtype in ("float32", "float16", "int32", "uint8"):
    bad = []
    for op, fn in REDUCE.items():
        want = small(0, dtype)
        for r in range(1, N):
            want = fn(want, small(r, dtype))
        got = ops.allreduce(mx.nd.array(small(R, dtype), dtype=dtype), op=op, store=store)
        inplace = mx.nd.array(small(R, dtype), dtype=dtype)
        ops.allreduce_(inplace, op=op, store=store)
        if not (np.array_equal(got.asnumpy(), want) and np.array_equal(inplace.asnumpy(), want)
                and got.dtype == np.dtype(dtype)):
            bad.append("%s: %s vs %s" % (op, got.asnumpy(), want))
    check("allreduce_min_max_product_" + dtype, not bad, "; ".join(bad))
# 8-bit sums and products wrap around as in numpy (Open MPI's op/avx saturated
# the sums: 200 + 200 gave 255 for uint8, in runs of 16 elements)
for dtype in ("uint8", "int8"):
    bad = []
    mine = np.random.default_rng(7 + R).integers(-128, 128, 40).astype(dtype)
    every = [np.random.default_rng(7 + r).integers(-128, 128, 40).astype(dtype)
             for r in range(N)]
    for op, fn in (("sum", np.add), ("product", np.multiply)):
        want = every[0]
        for x in every[1:]:
            want = fn(want, x)
        got = ops.allreduce(mx.nd.array(mine, dtype=dtype), op=op, store=store).asnumpy()
        if not np.array_equal(got, want):
            bad.append("%s: %d elements differ" % (op, int((got != want).sum())))
    check("allreduce_wraps_" + dtype, not bad, "; ".join(bad))
# a NaN on any rank comes out of min and max, as from numpy's minimum/maximum
# (MPI_MIN/MPI_MAX on floats kept or dropped it by position and length)
for dtype in ("float32", "float64", "float16"):
    bad = []
    for n in (3, 40):
        x = np.full(n, R + 1, dtype=dtype)
        x[R % n] = np.nan
        for op in ("min", "max"):
            got = ops.allreduce(mx.nd.array(x, dtype=dtype), op=op, store=store).asnumpy()
            nan_at = sorted(np.flatnonzero(np.isnan(got)).tolist())
            if nan_at != list(range(min(N, n))):
                bad.append("%s x %d: NaN at %s" % (op, n, nan_at))
    check("allreduce_min_max_nan_" + dtype, not bad, "; ".join(bad))
# new results live on the input's context (allgather, reduce_scatter and
# alltoall put them on cpu(0) for an input on cpu(1))
on = mx.nd.array(data(R, (2 * N, 2)), ctx=mx.cpu(1))
where = {"allreduce": ops.allreduce(on, store=store).context,
         "allgather": ops.allgather(on, store=store).context,
         "reduce_scatter": ops.reduce_scatter(on, store=store).context,
         "alltoall": ops.alltoall(on, store=store)[0].context,
         "alltoall received": ops.alltoall(on, store=store)[1].context}
check("results_on_input_context", all(c == mx.cpu(1) for c in where.values()), str(where))
try:
    ops.allreduce(mx.nd.ones((2,)), op="mean", store=store)
    check("unknown_op_refused", False, "accepted")
except mxnet_mpi.MPIKVStoreError as exc:
    check("unknown_op_refused", "min" in str(exc), str(exc)[:120])
group = [mx.nd.array(data(R, s, salt=i)) for i, s in enumerate([(2,), (3, 3), (1,)])]
outs = ops.grouped_allreduce(group, store=store)
check("grouped_allreduce", all(np.array_equal(o.asnumpy(), sum(data(r, s, salt=i)
                                                               for r in range(N)))
                               for i, (o, s) in enumerate(zip(outs, [(2,), (3, 3), (1,)]))))
root = N - 1
b = ops.broadcast(mx.nd.array(data(R, (2, 2))), root_rank=root, store=store)
check("broadcast", np.array_equal(b.asnumpy(), data(root, (2, 2))))
# allgather: rank r contributes r + 1 rows
g = ops.allgather(mx.nd.array(data(R, (R + 1, 3))), store=store)
check("allgather_uneven", np.array_equal(g.asnumpy(), np.concatenate(
    [data(r, (r + 1, 3)) for r in range(N)])), str(g.shape))
# alltoall: rank r sends (d + 1) rows to rank d; rows tagged with sender and destination
splits = [d + 1 for d in range(N)]
rows = sum(splits)
src = np.array([[R, d] for d in range(N) for _ in range(d + 1)], dtype=np.float32)
got, received = ops.alltoall(mx.nd.array(src), splits=splits, store=store)
want = np.array([[s, R] for s in range(N) for _ in range(R + 1)], dtype=np.float32)
check("alltoall_splits", np.array_equal(got.asnumpy(), want) and
      received.asnumpy().tolist() == [R + 1] * N, "%s %s" % (got.shape, received.asnumpy()))
eq, _ = ops.alltoall(mx.nd.array(data(R, (2 * N, 2))), store=store)
check("alltoall_equal", np.array_equal(eq.asnumpy(), np.concatenate(
    [data(s, (2 * N, 2))[2 * R:2 * R + 2] for s in range(N)])))
# reduce_scatter of 2N + 1 rows: rank 0 gets 3, the others 2
rs = ops.reduce_scatter(mx.nd.array(data(R, (2 * N + 1, 2))), store=store)
total = sum(data(r, (2 * N + 1, 2)) for r in range(N))
start = 2 * R + (1 if R > 0 else 0)
check("reduce_scatter", np.array_equal(rs.asnumpy(), total[start:start + (3 if R == 0 else 2)]),
      str(rs.shape))
if store is not None:
    # a rank that has joined stands in with the identity of min, max and product
    if R == N - 1:
        check("joined_identity", isinstance(store.join(), int))
    else:
        vals = [mx.nd.array(small(R, "float32")) for _ in REDUCE]
        outs = [ops.allreduce(v, op=op, store=store) for v, op in zip(vals, REDUCE)]
        store.join()
        bad = []
        for out, (op, fn) in zip(outs, REDUCE.items()):
            want = small(0, "float32")
            for r in range(1, N - 1):
                want = fn(want, small(r, "float32"))
            if not np.array_equal(out.asnumpy(), want):
                bad.append("%s: %s vs %s" % (op, out.asnumpy(), want))
        check("joined_identity", not bad, "; ".join(bad))
# fp16 compression through Trainer(compression_params=...): fp16-rounded sums
if store is not None:
    kv16 = mx.kv.create("mpi_" + which)
    kv16.set_gradient_compression({"type": "fp16"})
    v = mx.nd.array(np.full((6,), 1.0 + 1e-4 * (R + 1), dtype=np.float32))
    kv16.pushpull(0, v)
    want16 = sum(np.float32(np.float16(1.0 + 1e-4 * (r + 1))) for r in range(N))
    check("fp16_compression", np.allclose(v.asnumpy(), want16, rtol=0, atol=1e-6) and
          not np.allclose(v.asnumpy(), sum(1.0 + 1e-4 * (r + 1) for r in range(N)),
                          rtol=0, atol=1e-6), "%r vs %r" % (v.asnumpy()[0], want16))
    # a large odd-sized random array (the vectorised conversions and their
    # scalar tail): float32 -> float16 per rank, summed in float32 in rank
    # order, rounded once to float16, exactly
    rand = [np.random.RandomState(50 + r).randn(10007).astype(np.float32) * 3
            for r in range(N)]
    big = mx.nd.array(rand[R])
    kv16.pushpull(1, big)
    acc = np.zeros(10007, np.float32)
    for r in range(N):
        acc = acc + rand[r].astype(np.float16).astype(np.float32)
    want = acc.astype(np.float16).astype(np.float32)
    got = big.asnumpy()
    check("fp16_compression_exact", np.array_equal(got, want),
          "%d of 10007 differ" % int((got != want).sum()))
    # float64 goes to float16 directly, then back to float64
    big64 = mx.nd.array(rand[R], dtype="float64")
    kv16.pushpull(2, big64)
    got64 = big64.asnumpy()
    check("fp16_compression_float64", np.array_equal(got64, want.astype(np.float64)),
          "%d of 10007 differ" % int((got64 != want).sum()))
    try:
        kv16.set_gradient_compression({"type": "2bit"})
        check("2bit_refused", False, "accepted")
    except mxnet_mpi.MPIKVStoreError as exc:
        check("2bit_refused", "fp16" in str(exc), str(exc)[:120])
print("rank %d done" % R, flush=True)
