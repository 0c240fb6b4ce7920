"""mxnet_mpi.horovod, the whole horovod.mxnet 0.28.1 API with Horovod's
semantics, on 2 or 3 ranks: one section per area, many checks each.

  mpirun -np N python hvd_api.py OUT_DIR

Writes OUT_DIR/rank<r>.json (see _common.Results). Process sets: with 3 ranks
A = [0, 1] and B = [1, 2] (overlapping, used at once, and a third set that
closes a cycle); with 2 ranks A = [0] and B = [1].
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings

import mxnet as mx
import numpy as np
from _common import Results
from mxnet import autograd, gluon

import mxnet_mpi
import mxnet_mpi.horovod as hvd
from mxnet_mpi import MPIKVStoreError
from mxnet_mpi.timeline import rank_path

OUT = sys.argv[1]
R, N = mxnet_mpi.rank(), mxnet_mpi.size()   # the world, before hvd.init
NOT_INIT = "Horovod has not been initialized; use hvd.init()."
A_RANKS, B_RANKS = ([0, 1], [1, 2]) if N == 3 else ([0], [1])


def raises(fn, exc_type, text: str = "") -> str:
    """'' if fn() raises exc_type with `text` in its message, else what happened."""
    try:
        fn()
        mx.nd.waitall()
    except exc_type as exc:
        return "" if text in str(exc) else "wrong message: %s" % str(exc)[:300]
    except Exception as exc:  # noqa: BLE001
        return "raised %s instead: %s" % (type(exc).__name__, str(exc)[:300])
    return "no error"


def expect_error(res: Results, fn, exc_type, text: str, what: str) -> None:
    problem = raises(fn, exc_type, text)
    res.check(not problem, "%s: %s" % (what, problem))


def sec_before_init(res: Results) -> None:
    res.check(not hvd.is_initialized(), "is_initialized before init")
    res.check(not hvd.mpi_enabled(), "mpi_enabled before init")
    for name in ("size", "rank", "local_size", "local_rank", "cross_size", "cross_rank",
                 "is_homogeneous", "mpi_threads_supported"):
        expect_error(res, getattr(hvd, name), ValueError, NOT_INIT, name + "() before init")
    expect_error(res, lambda: hvd.allreduce(mx.nd.ones((2,))), ValueError, NOT_INIT,
                 "allreduce before init")
    expect_error(res, hvd.global_process_set.size, ValueError, NOT_INIT,
                 "global_process_set.size() before init")
    expect_error(res, lambda: hvd.start_timeline("x.json"), ValueError, NOT_INIT,
                 "start_timeline before init")
    res.check(hvd.global_process_set.process_set_id == 0 and hvd.global_process_set.ranks == [],
              "global_process_set before init: %s" % hvd.global_process_set)
    built = {n: getattr(hvd, n)() for n in ("mpi_built", "gloo_built", "gloo_enabled",
                                            "nccl_built", "ddl_built", "ccl_built",
                                            "cuda_built", "rocm_built")}
    res.check(built == {"mpi_built": True, "gloo_built": False, "gloo_enabled": False,
                        "nccl_built": 0, "ddl_built": False, "ccl_built": False,
                        "cuda_built": False, "rocm_built": False}, "built queries: %s" % built)
    res.check([hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product]
              == [0, 1, 2, 3, 4, 5], "reduction op values")
    expect_error(res, lambda: hvd.ProcessSet([0, "1"]), ValueError, "list of process ranks",
                 "ProcessSet of non-integers")
    expect_error(res, lambda: hvd.ProcessSet(3), ValueError, "list of process ranks",
                 "ProcessSet of a number")
    res.check(hvd.ProcessSet([2, 0]).ranks == [0, 2], "ProcessSet sorts its ranks")


A = hvd.ProcessSet(A_RANKS)
B = hvd.ProcessSet(B_RANKS)


def sec_init(res: Results) -> None:
    from mpi4py import MPI
    expect_error(res, lambda: hvd.init(comm=[0]), NotImplementedError, "whole MPI world",
                 "init(comm=subset)")
    expect_error(res, lambda: hvd.init(comm=MPI.COMM_SELF), NotImplementedError,
                 "whole MPI world", "init(comm=COMM_SELF)")
    expect_error(res, lambda: hvd.ProcessSet(MPI.COMM_WORLD), NotImplementedError,
                 "world ranks", "ProcessSet(mpi4py communicator)")
    hvd.init(comm=MPI.COMM_WORLD, process_sets=[A, B])
    res.check(hvd.is_initialized() and hvd.mpi_enabled(), "initialized")
    res.check((A.process_set_id, B.process_set_id) == (1, 2),
              "static ids %s %s" % (A.process_set_id, B.process_set_id))
    hvd.init()   # again: nothing happens
    res.check(hvd.global_process_set.ranks == list(range(N)), "global ranks")
    res.check((hvd.size(), hvd.rank()) == (N, R), "size/rank")
    res.check((hvd.local_size(), hvd.local_rank()) == (N, R), "local (one host)")
    res.check((hvd.cross_size(), hvd.cross_rank()) == (1, 0),
              "cross %s %s" % (hvd.cross_size(), hvd.cross_rank()))
    res.check(hvd.is_homogeneous() is True, "is_homogeneous")
    res.check(hvd.mpi_threads_supported() is True, "mpi_threads_supported")
    res.check((hvd.global_process_set.size(), hvd.global_process_set.rank()) == (N, R),
              "global set size/rank")
    for ps, ranks in ((A, A_RANKS), (B, B_RANKS)):
        res.check(ps.size() == len(ranks) and ps.included() == (R in ranks),
                  "%s size/included" % ps)
        if R in ranks:
            res.check(ps.rank() == ranks.index(R), "%s rank %s" % (ps, ps.rank()))
        else:
            expect_error(res, ps.rank, ValueError, "not part of", "%s rank() outside" % ps)


def data(r: int, shape, dtype="float32", salt: int = 0) -> np.ndarray:
    n = int(np.prod(shape))
    return ((np.arange(n) % 7) + 3 * r + salt).reshape(shape).astype(dtype)


def sec_reductions(res: Results) -> None:
    x = mx.nd.array(data(R, (5,)))
    every = [data(r, (5,)) for r in range(N)]
    total = sum(every)
    res.equal(hvd.allreduce(x), (total / N).astype(np.float32), "allreduce averages")
    res.equal(hvd.allreduce(x, op=hvd.Sum), total, "op=Sum")
    res.equal(hvd.allreduce(x, op=hvd.Min), np.minimum.reduce(every), "op=Min")
    res.equal(hvd.allreduce(x, op=hvd.Max), np.maximum.reduce(every), "op=Max")
    res.equal(hvd.allreduce(x, op=hvd.Product), np.multiply.reduce(every), "op=Product")
    res.equal(x, data(R, (5,)), "allreduce leaves its input")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summed = hvd.allreduce(x, average=False)
    res.equal(summed, total, "average=False sums")
    res.check(any(issubclass(w.category, DeprecationWarning) for w in caught),
              "average= is deprecated: %s" % [str(w.message) for w in caught])
    res.equal(hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5), total,
              "pre/postscale")
    y = x.copy()
    out = hvd.allreduce_(y, op=hvd.Max)
    res.check(out is y, "allreduce_ returns its tensor")
    res.equal(y, np.maximum.reduce(every), "allreduce_ in place")
    ints = [mx.nd.array(data(R, (3,), "int32"), dtype="int32"),
            mx.nd.array(data(R, (2, 2)), dtype="float32")]
    outs = hvd.grouped_allreduce(ints, op=hvd.Sum)
    res.equal(outs[0], sum(data(r, (3,), "int32") for r in range(N)), "grouped int32")
    res.equal(outs[1], sum(data(r, (2, 2)) for r in range(N)), "grouped float32")
    hvd.grouped_allreduce_(ints, op=hvd.Min)
    res.equal(ints[0], np.minimum.reduce([data(r, (3,), "int32") for r in range(N)]),
              "grouped_allreduce_ Min")
    res.check(hvd.grouped_allreduce([]) == [], "grouped of nothing")
    expect_error(res, lambda: hvd.allreduce(x, average=True, op=hvd.Sum), ValueError,
                 "supersedes", "op and average")
    expect_error(res, lambda: hvd.allreduce(x, op=hvd.Adasum), NotImplementedError, "Adasum",
                 "Adasum refused")
    expect_error(res, lambda: hvd.allreduce(x, op=17), ValueError, "unknown reduction op",
                 "unknown op")
    # every rank refused the same way: the world's stream is still exact
    res.equal(hvd.allreduce(x, op=hvd.Sum), total, "exact after refusals")
    # integers scale as Horovod 0.28.1 scales them (checked there): in double
    # precision, truncated toward zero; their average is the sum times 1/size
    base = np.array([10, 21, -7, 3], dtype=np.int64)
    k = mx.nd.array(base * (R + 1), dtype="int32")
    ksum = base * sum(r + 1 for r in range(N))

    def scaled(a, f):
        return (a.astype(np.float64) * f).astype(np.int32)
    res.equal(hvd.allreduce(k, op=hvd.Sum, postscale_factor=1.5), scaled(ksum, 1.5),
              "int32 postscale 1.5")
    res.equal(hvd.allreduce(k, op=hvd.Sum, prescale_factor=0.5),
              sum(scaled(base * (r + 1), 0.5) for r in range(N)), "int32 prescale 0.5")
    res.equal(hvd.allreduce(k), scaled(ksum, 1.0 / N), "int32 average")
    # factors in double precision, as Horovod's: MXNet's scalar operators round
    # them to float32 (0.3 / 3 became 0.1: on 3 ranks 60 * 0.1 gave 6, not 5)
    res.equal(hvd.allreduce(k, postscale_factor=0.3), scaled(ksum, 0.3 / N),
              "int32 average postscale 0.3")
    d = mx.nd.array(data(R, (5,), "float64"), dtype="float64")
    dsum = sum(data(r, (5,), "float64") for r in range(N))
    res.equal(hvd.allreduce(d, op=hvd.Sum, postscale_factor=1.0 / 3), dsum * (1.0 / 3),
              "float64 postscale 1/3, exactly")
    # float16 in float32, rounded once (as Horovod): the factor cast to half
    # first (1e-3 -> 0.0010004) gave 10.008 for 10000
    h0 = np.array([3334, 10000, 1], dtype=np.float16)
    h = mx.nd.array(h0 if R == 0 else h0 * 0, dtype="float16")
    res.equal(hvd.allreduce(h, op=hvd.Sum, postscale_factor=1e-3),
              (h0.astype(np.float32) * np.float32(1e-3)).astype(np.float16),
              "float16 postscale 1e-3")
    u = mx.nd.array(base * 0 + 7, dtype="uint8")
    res.equal(hvd.allreduce(u, op=hvd.Sum, postscale_factor=0.3),
              np.full((4,), int(7 * N * 0.3), np.uint8), "uint8 postscale 0.3")


def sec_gather_scatter(res: Results) -> None:
    g = hvd.allgather(mx.nd.array(data(R, (R + 1, 2))))
    res.equal(g, np.concatenate([data(r, (r + 1, 2)) for r in range(N)]), "allgather uneven")
    gg = hvd.grouped_allgather([mx.nd.array(data(R, (1,))), mx.nd.array(data(R, (R + 2, 3)))])
    res.equal(gg[1], np.concatenate([data(r, (r + 2, 3)) for r in range(N)]),
              "grouped_allgather")
    # alltoall, equal parts: Horovod returns only the tensor
    eq = hvd.alltoall(mx.nd.array(data(R, (2 * N, 2))))
    res.check(isinstance(eq, mx.nd.NDArray), "alltoall without splits: %s" % type(eq))
    res.equal(eq, np.concatenate([data(s, (2 * N, 2))[2 * R:2 * R + 2] for s in range(N)]),
              "alltoall equal parts")
    # uneven splits, one of them 0: rank r sends (d + r) % 3 rows to rank d
    splits = [(d + R) % 3 for d in range(N)]
    rows = np.array([[R, d, k] for d in range(N) for k in range(splits[d])],
                    dtype=np.float32).reshape(-1, 3)
    got = hvd.alltoall(mx.nd.array(rows), splits=splits)
    res.check(isinstance(got, tuple) and len(got) == 2, "alltoall with splits: %s" % type(got))
    t, received = got
    want = np.array([[s, R, k] for s in range(N) for k in range((R + s) % 3)],
                    dtype=np.float32).reshape(-1, 3)
    res.equal(t, want, "alltoall uneven rows")
    res.check(received.dtype == np.int32 and received.context == mx.cpu(),
              "received splits int32 on cpu: %s %s" % (received.dtype, received.context))
    res.equal(received, np.array([(R + s) % 3 for s in range(N)], dtype=np.int32),
              "received splits")
    t2, _ = hvd.alltoall(mx.nd.array(rows), splits=mx.nd.array(splits, dtype="int32"))
    res.equal(t2, want, "alltoall splits as NDArray")
    # reducescatter of 2N+1 rows: the first ranks get one row more
    src = mx.nd.array(data(R, (2 * N + 1, 2)))
    tot = sum(data(r, (2 * N + 1, 2)) for r in range(N))
    start = 2 * R + min(R, 1)
    mine = tot[start:start + (3 if R == 0 else 2)]
    res.equal(hvd.reducescatter(src, op=hvd.Sum), mine, "reducescatter Sum")
    res.equal(hvd.reducescatter(src), (mine / N).astype(np.float32), "reducescatter Average")
    res.equal(hvd.reducescatter(src, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25),
              (mine / 2).astype(np.float32), "reducescatter pre/postscale")
    res.equal(src, data(R, (2 * N + 1, 2)), "reducescatter leaves its input")
    # integers as in allreduce (Horovod 0.28.1): scaled in double precision and
    # truncated; the average is the sum times 1/size (it used to be refused, and
    # prescale 0.5 was cast to 0 by MXNet's multiply)
    base = np.array([[10, 21], [-7, 3], [5, 9]] * N, dtype=np.int64)[:2 * N + 1]
    isrc = mx.nd.array(base * (R + 1), dtype="int32")
    iparts = [(base * (r + 1) * 0.5).astype(np.int32) for r in range(N)]
    itot = sum(iparts)[start:start + (3 if R == 0 else 2)]
    res.equal(hvd.reducescatter(isrc, op=hvd.Sum, prescale_factor=0.5), itot,
              "reducescatter int32 prescale 0.5")
    isum = (base * sum(r + 1 for r in range(N)))[start:start + (3 if R == 0 else 2)]
    res.equal(hvd.reducescatter(isrc), (isum.astype(np.float64) * (1.0 / N)).astype(np.int32),
              "reducescatter int32 average")
    res.equal(isrc, (base * (R + 1)).astype(np.int32), "reducescatter int32 leaves its input")
    # one row, N > 1 ranks: the others' parts are empty, and their average
    # (an integer sum scaled by 1/size) failed in MXNet's shape inference
    one = mx.nd.array(np.arange(5).reshape(1, 5) + 10 * R, dtype="int32")
    total = sum(np.arange(5) + 10 * r for r in range(N)).reshape(1, 5)
    for dtype, want, label in (
            ("int32", (total * (1.0 / N)).astype(np.int32), "int32 average"),
            ("float32", (total / N * 0.5).astype(np.float32), "average with postscale")):
        got = hvd.reducescatter(one.astype(dtype), postscale_factor=0.5 if dtype == "float32"
                                else 1.0)
        res.equal(got, want if R == 0 else np.zeros((0, 5), dtype=dtype),
                  "reducescatter %s, empty parts" % label)
    two = hvd.grouped_reducescatter([src, mx.nd.array(data(R, (N, 1)))], op=hvd.Sum)
    res.equal(two[1], sum(data(r, (N, 1)) for r in range(N))[R:R + 1],
              "grouped_reducescatter")
    expect_error(res, lambda: hvd.reducescatter(src, op=hvd.Max), ValueError,
                 "Average and hvd.Sum", "reducescatter Max refused")
    root = N - 1
    b = mx.nd.array(data(R, (3,)))
    res.equal(hvd.broadcast(b, root_rank=root), data(root, (3,)), "broadcast")
    res.equal(b, data(R, (3,)), "broadcast leaves its input")
    res.check(hvd.broadcast_(b, root) is b, "broadcast_ returns its tensor")
    res.equal(b, data(root, (3,)), "broadcast_ in place")


class Unpicklable:
    def __reduce__(self):
        raise TypeError("this object refuses to be pickled")


def sec_objects(res: Results) -> None:
    root = N - 1
    obj = {"rank": R, "arr": np.arange(4) * R, "text": "hello"} if R == root else None
    got = hvd.broadcast_object(obj, root_rank=root)
    res.check(got["rank"] == root and np.array_equal(got["arr"], np.arange(4) * root),
              "broadcast_object: %r" % (got,))
    mixed = [7, "seven", {"r": 2}][R % 3]     # different types on different ranks
    res.check(hvd.allgather_object(mixed) == [[7, "seven", {"r": 2}][r % 3] for r in range(N)],
              "allgather_object of mixed types")
    res.check(hvd.allgather_object(list(range(R * 50))) == [list(range(r * 50))
                                                            for r in range(N)],
              "allgather_object of uneven sizes")
    # an object one rank cannot pickle: that rank names it, its peers name that rank
    bad = Unpicklable() if R == root else 5
    problem = raises(lambda: hvd.allgather_object(bad), MPIKVStoreError,
                     "cannot pickle" if R == root else "rank %d could not take part" % root)
    res.check(not problem, "unpicklable allgather_object: %s" % problem)
    bad_root = Unpicklable() if R == root else None
    problem = raises(lambda: hvd.broadcast_object(bad_root, root_rank=root), MPIKVStoreError,
                     "cannot pickle" if R == root else "rank %d could not take part" % root)
    res.check(not problem, "unpicklable broadcast_object: %s" % problem)
    res.check(hvd.broadcast_object("after", root_rank=0) == "after", "usable after refusals")


def sec_process_sets(res: Results) -> None:
    members_a, members_b = R in A_RANKS, R in B_RANKS
    a_val, b_val = mx.nd.array(data(R, (4,))), mx.nd.array(data(R, (4,), salt=100))
    # both sets used at once: a member of both pushes B's collective before A's
    outs = {}
    if members_b:
        outs["b"] = hvd.allreduce(b_val, op=hvd.Sum, process_set=B, name="b")
    if members_a:
        outs["a"] = hvd.allreduce(a_val, op=hvd.Sum, process_set=A, name="a")
    if members_a:
        res.equal(outs["a"], sum(data(r, (4,)) for r in A_RANKS), "allreduce on A")
    if members_b:
        res.equal(outs["b"], sum(data(r, (4,), salt=100) for r in B_RANKS), "allreduce on B")
    for ps, ranks in ((A, A_RANKS), (B, B_RANKS)):
        if R not in ranks:
            # a rank outside the set calling its collective: an error on that rank only
            expect_error(res, lambda ps=ps: hvd.allreduce(a_val, process_set=ps),
                         MPIKVStoreError, "not a member", "outside %s" % ps)
            continue
        me = ranks.index(R)
        res.equal(hvd.allreduce(a_val, process_set=ps),
                  (sum(data(r, (4,)) for r in ranks) / len(ranks)).astype(np.float32),
                  "average over %s" % ps)
        g = hvd.allgather(mx.nd.array(data(R, (R + 1,))), process_set=ps)
        res.equal(g, np.concatenate([data(r, (r + 1,)) for r in ranks]), "allgather %s" % ps)
        root = ranks[-1]   # a world rank
        res.equal(hvd.broadcast(a_val, root_rank=root, process_set=ps), data(root, (4,)),
                  "broadcast %s from world rank %d" % (ps, root))
        splits = [(me + d + 1) % 3 for d in range(len(ranks))]
        rows = np.array([[R, d] for d in range(len(ranks)) for _ in range(splits[d])],
                        dtype=np.float32).reshape(-1, 2)
        t, received = hvd.alltoall(mx.nd.array(rows), splits=splits, process_set=ps)
        want = np.array([[s, me] for i, s in enumerate(ranks) for _ in range((i + me + 1) % 3)],
                        dtype=np.float32).reshape(-1, 2)
        res.equal(t, want, "alltoall %s" % ps)
        res.equal(received, np.array([(i + me + 1) % 3 for i in range(len(ranks))],
                                     dtype=np.int32), "alltoall received %s" % ps)
        rs = hvd.reducescatter(mx.nd.array(data(R, (len(ranks) * 2, 2))), op=hvd.Sum,
                               process_set=ps)
        res.equal(rs, sum(data(r, (len(ranks) * 2, 2)) for r in ranks)[2 * me:2 * me + 2],
                  "reducescatter %s" % ps)
        res.check(hvd.allgather_object(R, process_set=ps) == ranks, "allgather_object %s" % ps)
        res.check(hvd.broadcast_object(R, root_rank=root, process_set=ps) == root,
                  "broadcast_object %s" % ps)
        outside = 0 if 0 not in ranks else N + 5
        expect_error(res, lambda ps=ps, root=outside: hvd.broadcast(a_val, root_rank=root,
                                                                    process_set=ps),
                     MPIKVStoreError, "not a member of the process set", "root outside %s" % ps)
        # ... every member refused it: the set's stream still pairs
        res.check(hvd.allgather_object("ok", process_set=ps) == ["ok"] * len(ranks),
                  "%s usable after a refusal" % ps)
    expect_error(res, lambda: hvd.allreduce(a_val, process_set="A"), MPIKVStoreError,
                 "must be an hvd.ProcessSet", "process_set of a wrong type")
    expect_error(res, lambda: hvd.allreduce(a_val, process_set=hvd.ProcessSet(A_RANKS)),
                 MPIKVStoreError, "not a registered process set", "unregistered set")
    expect_error(res, lambda: hvd.add_process_set(A_RANKS), ValueError, "duplicate",
                 "duplicate add")
    expect_error(res, lambda: hvd.add_process_set(list(range(N))), ValueError, "duplicate",
                 "the world as a set")
    expect_error(res, lambda: hvd.add_process_set([0, N]), ValueError, "invalid rank",
                 "rank outside the world")
    if N == 3:
        # ranks disagree on the set to add: every rank fails, none hangs
        expect_error(res, lambda: hvd.add_process_set([0] if R == 0 else [2]),
                     MPIKVStoreError, "disagree", "ranks disagree on add_process_set")
        c_ranks, c_id = [0, 2], 3
    else:   # 2 ranks: every set is taken; free B = [1] (id 2) and add it again
        res.check(hvd.remove_process_set(B) is True, "removed B")
        c_ranks, c_id = [1], 2
    # dynamic sets: add, use, remove; ids are reused as in Horovod
    c = hvd.add_process_set(c_ranks)
    res.check(c.process_set_id == c_id and c.size() == len(c_ranks), "added %s" % c)
    if R in c_ranks:
        res.equal(hvd.allreduce(a_val, op=hvd.Sum, process_set=c),
                  sum(data(r, (4,)) for r in c_ranks), "allreduce on an added set")
    if N == 3:
        # A = [0, 1], B = [1, 2], C = [0, 2], pushed in a cycle: 0: A C, 1: B A, 2: C B.
        # A process-wide order (one chain) would deadlock; each set has its own stream.
        order = {0: [A, c], 1: [B, A], 2: [c, B]}[R]
        pending = [(ps, hvd.allreduce(mx.nd.ones((3,)) * (R + 1), op=hvd.Sum, process_set=ps))
                   for ps in order]
        for ps, out in pending:
            res.equal(out, np.full((3,), sum(r + 1 for r in ps.ranks), np.float32),
                      "cycle over %s" % ps)
    res.check(hvd.remove_process_set(c) is True and c.process_set_id is None, "removed")
    expect_error(res, lambda: hvd.allreduce(a_val, process_set=c), MPIKVStoreError,
                 "not a registered process set", "removed set")
    res.check(hvd.remove_process_set(c) is False, "removing twice")
    res.check(hvd.remove_process_set(hvd.global_process_set) is False, "global never removed")
    again = hvd.add_process_set(hvd.ProcessSet(c_ranks))
    res.check(again.process_set_id == c_id, "id reused: %s" % again)
    hvd.remove_process_set(again)


def sec_trainers(res: Results) -> None:
    """DistributedTrainer / DistributedOptimizer / broadcast_parameters on set A:
    members average their gradients over A; others step alone, their scale
    divided by |A| too (as in Horovod)."""
    x = np.array([1.0 + R, 2.0 - R], dtype=np.float32)
    grads_a = sum(np.array([1.0 + r, 2.0 - r], dtype=np.float32) for r in A_RANKS)
    want = -(grads_a if R in A_RANKS else x) / len(A_RANKS)
    p = gluon.Parameter("w_ps", shape=(2,))
    p.initialize(mx.init.Constant(R + 1.0), ctx=mx.cpu())
    hvd.broadcast_parameters({"w": p}, root_rank=A_RANKS[-1], process_set=A)
    start = float(A_RANKS[-1] + 1) if R in A_RANKS else R + 1.0
    res.equal(p.data(), np.full((2,), start, np.float32), "broadcast_parameters on A")
    trainer = hvd.DistributedTrainer([p], "sgd", {"learning_rate": 1.0}, process_set=A)
    with autograd.record():
        loss = (p.data() * mx.nd.array(x)).sum()
    loss.backward()
    trainer.step(1)
    res.equal(p.data(), start + want, "DistributedTrainer on A")
    opt = hvd.DistributedOptimizer(mx.optimizer.SGD(learning_rate=1.0), process_set=A)
    updater = mx.optimizer.get_updater(opt)
    w = mx.nd.zeros((2,))
    updater(0, mx.nd.array(x), w)
    res.equal(w, want, "DistributedOptimizer on A")
    expect_error(res, lambda: hvd.DistributedTrainer([p], "sgd",
                                                     process_set=hvd.ProcessSet([0])),
                 ValueError, "not registered", "trainer on an unregistered set")
    # mxnet_mpi.join() cannot cover a DistributedTrainer (no store is open
    # here): it says so, where it returned without a word
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mxnet_mpi.join()
    res.check(any("nothing to join" in str(w.message) and "DistributedTrainer" in str(w.message)
                  for w in caught), "join() with a DistributedTrainer: %s" % caught)


def skewed_net():
    """Two Dense(3, in_units=3) layers named as Gluon's counters name them when
    rank 0 made 9 layers first: 'skew9_', 'skew10_' there, 'skew0_', 'skew1_'
    elsewhere, so sorted names put the second layer first on rank 0 only.
    Rank r's layer j starts at 10 * j + r."""
    first = 9 if R == 0 else 0
    net = gluon.nn.Sequential()
    for j in range(2):
        net.add(gluon.nn.Dense(3, in_units=3, prefix="skew%d_" % (first + j)))
    for j, layer in enumerate(net):
        layer.initialize(mx.init.Constant(10.0 * j + R))
    return net


def sec_name_counters(res: Results) -> None:
    """broadcast_parameters and DistributedTrainer pair the same layers on
    every rank when Gluon's name counters differ between the ranks (by sorted
    name they paired rank 0's second layer with the others' first)."""
    net = skewed_net()
    hvd.broadcast_parameters(net.collect_params(), root_rank=0)
    for j, layer in enumerate(net):
        res.equal(layer.weight.data(), np.full((3, 3), 10.0 * j, np.float32),
                  "layer %d broadcast from rank 0" % j)
    trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
    x = mx.nd.array(data(R, (2, 3)))
    with autograd.record():
        loss = net(x).sum()
    loss.backward()
    trainer.step(2)
    # a mixed-up pairing updates the layers differently on rank 0
    mine = np.concatenate([p.data().asnumpy().ravel() for p in
                           (net[0].weight, net[0].bias, net[1].weight, net[1].bias)])
    every = hvd.allgather(mx.nd.array(mine[None, :])).asnumpy()
    res.check(all(np.array_equal(row, every[0]) for row in every),
              "ranks' layers differ after a step: %s" % np.abs(every - every[0]).max())
    res.check(not np.array_equal(mine[:9], np.full(9, 0.0, np.float32)), "no update")


def sec_timeline(res: Results) -> None:
    path = os.path.join(OUT, "hvd_trace.json")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hvd.start_timeline(os.path.join(OUT, "first.json"), mark_cycles=True)
    res.check(any("mark_cycles" in str(w.message) for w in caught), "mark_cycles warns")
    hvd.start_timeline(path)          # switches files: first.json is written now
    hvd.allreduce(mx.nd.ones((3,)), op=hvd.Sum, name="traced_sum").asnumpy()
    if R in A_RANKS:
        hvd.allreduce(mx.nd.ones((2,)), process_set=A, name="traced_on_A").asnumpy()
    hvd.stop_timeline()
    hvd.stop_timeline()               # nothing recording: nothing happens
    hvd.allreduce(mx.nd.ones((1,)), name="after_stop").asnumpy()
    mine = path if R == 0 else rank_path(path, R)
    first = os.path.join(OUT, "first.json") if R == 0 else rank_path(
        os.path.join(OUT, "first.json"), R)
    res.check(os.path.exists(first), "first timeline written: %s" % first)
    with open(mine) as f:
        names = [e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") == "collective"]
    res.check(any("traced_sum" in n for n in names), "traced_sum in %s" % names)
    res.check(any("traced_on_A" in n for n in names) == (R in A_RANKS), "set collective traced")
    res.check(not any("after_stop" in n for n in names), "nothing after stop_timeline")


def sec_bad_input(res: Results) -> None:
    """Bad input on the last rank: a clear error there; its peers fail the same
    collective naming it (they never hang), and the stream stays exact."""
    last = N - 1
    me_bad = R == last
    peer = "rank %d could not take part" % last
    cases = [
        ("numpy array", lambda: hvd.allreduce(np.ones(3) if me_bad else mx.nd.ones((3,))),
         "must be an mxnet NDArray"),
        ("name of a wrong type", lambda: hvd.allreduce(mx.nd.ones((3,)), name=5 if me_bad
                                                       else None), "name must be a string"),
        ("splits of a wrong length", lambda: hvd.alltoall(
            mx.nd.ones((N, 2)), splits=[N] if me_bad else [1] * N), "need %d" % N),
        ("splits not integers", lambda: hvd.alltoall(
            mx.nd.ones((N, 2)), splits=["a"] * N if me_bad else [1] * N), "integers"),
        ("grouped of a non-list", lambda: hvd.grouped_allreduce(
            mx.nd.ones((2,)) if me_bad else [mx.nd.ones((2,))]), "list of NDArrays"),
        ("root_rank of a wrong type", lambda: hvd.broadcast(
            mx.nd.ones((2,)), root_rank="0" if me_bad else 0), "root_rank must be an integer"),
        ("scale of a wrong type", lambda: hvd.allreduce(
            mx.nd.ones((2,)), prescale_factor="x" if me_bad else 1.0), "could not convert"),
        ("old mxnet_mpi.allreduce_(src, dst, comm)", lambda: mxnet_mpi.allreduce_(
            *((mx.nd.ones((2,)), mx.nd.ones((2,)), mxnet_mpi.world()) if me_bad
              else (mx.nd.ones((2,)),))), "allreduce_(tensor, comm=comm)"),
    ]
    for what, fn, text in cases:
        try:
            out = fn()
            for o in out if isinstance(out, (list, tuple)) else [out]:
                o.asnumpy()
            res.check(False, "%s: no error" % what)
        except Exception as exc:  # noqa: BLE001
            msg = str(exc)
            ok = isinstance(exc, ValueError) and (text in msg if me_bad else peer in msg)
            res.check(ok, "%s: %s %s" % (what, type(exc).__name__, msg[:300]))
        mx.nd.waitall()
    res.equal(hvd.allreduce(mx.nd.ones((2,)) * R, op=hvd.Sum),
              np.full((2,), sum(range(N)), np.float32), "exact after bad input")


def sec_stall(res: Results) -> None:
    """A rank that named an unknown process set has no stream to refuse on: its
    peers wait for it with the named stall warning (MXNET_MPI_STALL_WARN_S=2
    here), and the job goes on once it issues the collective."""
    if R == N - 1:
        expect_error(res, lambda: hvd.allreduce(mx.nd.ones((2,)),
                                                process_set=hvd.ProcessSet([0])),
                     MPIKVStoreError, "not a registered", "unknown set")
        time.sleep(4)
    out = hvd.allreduce(mx.nd.ones((2,)), op=hvd.Sum, name="waited_for")
    res.equal(out, np.full((2,), N, np.float32), "the waited-for collective")


def sec_np_mode(res: Results) -> None:
    """After npx.set_np(), as gluoncv/d2l code runs: scaled reductions of
    integer, float64 and float16 mx.np arrays (they raised TypeError from a
    legacy operator, allreduce_ leaving the unscaled sum in place), 0-d and
    empty ones, and every collective's result an mx.np array."""
    from mxnet import np as mnp
    from mxnet import npx
    npx.set_np()
    try:
        every = [data(r, (3,), "int32") for r in range(N)]
        total = sum(every)
        res.equal(hvd.allreduce(mnp.array(every[R], dtype="int32")),
                  (total.astype(np.float64) * (1.0 / N)).astype(np.int32), "np int average")
        t = mnp.array(every[R], dtype="int32")
        hvd.allreduce_(t, op=hvd.Sum, postscale_factor=0.5)
        res.equal(t, (total.astype(np.float64) * 0.5).astype(np.int32), "np int allreduce_")
        f64 = hvd.allreduce(mnp.array(data(R, (4,), "float64")), op=hvd.Sum,
                            prescale_factor=0.3)
        res.equal(f64, sum(data(r, (4,), "float64") * 0.3 for r in range(N)), "np float64")
        f16 = hvd.allreduce(mnp.array(data(R, (4,), "float16")), op=hvd.Sum,
                            postscale_factor=0.3)
        want16 = (sum(data(r, (4,), "float16").astype(np.float32) for r in range(N)) *
                  np.float32(0.3)).astype(np.float16)
        res.equal(f16, want16, "np float16")
        zero_d = hvd.allreduce(mnp.array(R + 3, dtype="int64"))
        res.equal(zero_d, np.array(sum(r + 3 for r in range(N)) // N, dtype=np.int64),
                  "np 0-d int average")
        empty = hvd.allreduce(mnp.zeros((2, 0), dtype="int32"), postscale_factor=2.0)
        res.equal(empty, np.zeros((2, 0), np.int32), "np empty")
        x = mnp.array(data(R, (N * 2, 2)))
        outs = {"allreduce": hvd.allreduce(x), "grouped": hvd.grouped_allreduce([x])[0],
                "allgather": hvd.allgather(x), "alltoall": hvd.alltoall(x),
                "reducescatter": hvd.reducescatter(x), "broadcast": hvd.broadcast(x, 0),
                "ops.allreduce": mxnet_mpi.ops.allreduce(x, op="max"),
                "ops.alltoall received": mxnet_mpi.ops.alltoall(x)[1]}
        for what, out in outs.items():
            out = out[0] if isinstance(out, tuple) else out
            res.check(isinstance(out, mnp.ndarray), "%s returned %s" % (what, type(out)))
        res.equal(mnp.maximum(outs["allreduce"], x), np.maximum(
            sum(data(r, (N * 2, 2)) for r in range(N)) / N, data(R, (N * 2, 2))).astype(
                np.float32), "np code on a result")
    finally:
        npx.reset_np()


res = Results(OUT, R)
res.run("before_init", sec_before_init)
res.run("init", sec_init)
for name, fn in (("reductions", sec_reductions), ("gather_scatter", sec_gather_scatter),
                 ("objects", sec_objects), ("process_sets", sec_process_sets),
                 ("trainers", sec_trainers), ("name_counters", sec_name_counters),
                 ("timeline", sec_timeline),
                 ("np_mode", sec_np_mode), ("bad_input", sec_bad_input), ("stall", sec_stall)):
    res.run(name, fn)
res.write()
print("rank %d done" % R, flush=True)
