"""Exact results of every collective of the MPI kvstore, for every dtype.

Run as `mpirun -np N python collectives_exact.py OUT_DIR`. Every rank runs
the same sections in the same order (each pushes the same collectives on
every rank), writes OUT_DIR/rank<r>.json with each section's outcome, and
exits 0; tests/test_collectives.py reads the files.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import sys
import threading
import time

import mxnet as mx
import numpy as np
from _common import DTYPES, Results, data, total

import mxnet_mpi

SHAPES = [(), (0,), (3, 0), (7,), (4, 5), (2, 3, 4)]
PLAIN_SHAPES = [(1,), (7,), (4, 5), (2, 3, 4)]  # neither 0-d nor empty
EMPTY_SHAPES = [(), (0,), (3, 0)]
DEVS = [mx.cpu(0), mx.cpu(1)]

RANK = mxnet_mpi.rank()
SIZE = mxnet_mpi.size()
STORE = os.environ.get("MXMPI_TEST_STORE", "mpi")  # e.g. mpi_<mode>
KV = mx.kv.create(STORE)

_case = [0]


def next_case() -> int:
    _case[0] += 1
    return _case[0]


def key_for(case: int):
    """Alternate int and str keys."""
    return case if case % 2 else "key-%d" % case


def nd(arr: np.ndarray, ctx=None):
    return mx.nd.array(arr, ctx=ctx or mx.cpu(0), dtype=arr.dtype)


def zeros_like_np(shape, dtype, ctx=None):
    return nd(np.zeros(shape, dtype=dtype), ctx)


# ---------------------------------------------------------------- sections
def sec_world(res: Results) -> None:
    env = os.environ
    w = mxnet_mpi.world()
    res.check(w.id == 0, "world().id is %r, want 0" % (w.id,))
    res.check((w.rank, w.size) == (RANK, SIZE), "world() %r vs rank()/size() %r"
              % ((w.rank, w.size), (RANK, SIZE)))
    if "OMPI_COMM_WORLD_RANK" in env:
        res.check(RANK == int(env["OMPI_COMM_WORLD_RANK"]), "rank() %d vs OMPI %s"
                  % (RANK, env["OMPI_COMM_WORLD_RANK"]))
        res.check(SIZE == int(env["OMPI_COMM_WORLD_SIZE"]), "size() %d vs OMPI %s"
                  % (SIZE, env["OMPI_COMM_WORLD_SIZE"]))
        res.check(mxnet_mpi.local_size() == int(env["OMPI_COMM_WORLD_LOCAL_SIZE"]),
                  "local_size() %d" % mxnet_mpi.local_size())
    # every rank runs on this one host (Open MPI's own OMPI_COMM_WORLD_LOCAL_RANK
    # may number oversubscribed ranks in another order; any order is valid)
    res.check((mxnet_mpi.local_rank(), mxnet_mpi.local_size()) == (RANK, SIZE),
              "local_rank()/local_size() %r on one host"
              % ((mxnet_mpi.local_rank(), mxnet_mpi.local_size()),))
    res.check(KV.rank == RANK, "kv.rank %r" % KV.rank)
    res.check(KV.num_workers == SIZE, "kv.num_workers %r" % KV.num_workers)
    res.check(KV.mode in mxnet_mpi.MODES, "kv.mode %r" % KV.mode)
    res.check(KV.type == "mpi_" + KV.mode, "kv.type %r" % KV.type)
    if STORE.startswith("mpi_"):
        res.check(KV.mode == STORE[len("mpi_"):], "%s has mode %r" % (STORE, KV.mode))
    if STORE == "mpi" and "MXNET_MPI_MODE" not in env:
        res.check(KV.mode == mxnet_mpi.DEFAULT_MODE, "default mode %r" % KV.mode)
    res.check(KV.is_capable("optimizer") is False, "is_capable(optimizer) should be False")
    kv2 = mx.kv.create("mpi_chained")
    res.check(kv2.type == "mpi_chained" and kv2.num_workers == SIZE, "mpi_chained store")
    res.check(set(mxnet_mpi.SUPPORTED_DTYPES) == set(DTYPES),
              "SUPPORTED_DTYPES %r" % (mxnet_mpi.SUPPORTED_DTYPES,))


def sec_pushpull_inplace(res: Results) -> None:
    checks = []
    for dtype in DTYPES:
        for shape in SHAPES:
            c = next_case()
            a = nd(data(c, RANK, 0, shape, dtype))
            KV.pushpull(key_for(c), a)  # no waiting: all pushed back to back
            checks.append((a, total(c, SIZE, 1, shape, dtype), "%s %s" % (dtype, shape)))
    for a, want, what in checks:
        res.equal(a, want, "pushpull in place " + what)


def sec_pushpull_out(res: Results) -> None:
    checks = []
    for dtype in DTYPES:
        for shape in SHAPES:
            c = next_case()
            mine = data(c, RANK, 0, shape, dtype)
            a, o = nd(mine), zeros_like_np(shape, dtype)
            KV.pushpull(key_for(c), a, out=o)
            checks.append((o, total(c, SIZE, 1, shape, dtype), "out %s %s" % (dtype, shape)))
            checks.append((a, mine, "value left unchanged %s %s" % (dtype, shape)))
            # out given explicitly as the value itself: in place.
            c2 = next_case()
            b = nd(data(c2, RANK, 0, shape, dtype))
            KV.pushpull(key_for(c2), b, out=b)
            checks.append((b, total(c2, SIZE, 1, shape, dtype), "out=value %s %s"
                           % (dtype, shape)))
    for a, want, what in checks:
        res.equal(a, want, "pushpull " + what)


def sec_pushpull_out_list(res: Results, shapes) -> None:
    checks = []
    for dtype in DTYPES:
        for shape in shapes:
            c = next_case()
            a = nd(data(c, RANK, 0, shape, dtype))
            outs = [zeros_like_np(shape, dtype, ctx) for ctx in DEVS]
            KV.pushpull(key_for(c), a, out=outs)
            want = total(c, SIZE, 1, shape, dtype)
            for i, o in enumerate(outs):
                checks.append((o, want, "out[%d] %s %s" % (i, dtype, shape)))
    for a, want, what in checks:
        res.equal(a, want, "pushpull out list " + what)


def sec_pushpull_devices(res: Results, shapes, make=None) -> None:
    """A list of per-device values: the sum is over devices and ranks."""
    make = make or nd
    checks = []
    for dtype in DTYPES:
        for shape in shapes:
            c = next_case()
            vals = [make(data(c, RANK, d, shape, dtype), ctx) for d, ctx in enumerate(DEVS)]
            KV.pushpull(key_for(c), vals)
            want = total(c, SIZE, len(DEVS), shape, dtype)
            for i, v in enumerate(vals):
                checks.append((v, want, "in place value[%d] %s %s" % (i, dtype, shape)))
                res.check(v.context == DEVS[i], "value[%d] moved to %s" % (i, v.context))
            c = next_case()
            mine = [data(c, RANK, d, shape, dtype) for d in range(len(DEVS))]
            vals = [make(m, ctx) for m, ctx in zip(mine, DEVS)]
            outs = [make(np.zeros(shape, dtype=dtype), ctx) for ctx in DEVS]
            KV.pushpull(key_for(c), vals, out=outs)
            want = total(c, SIZE, len(DEVS), shape, dtype)
            for i, (v, o) in enumerate(zip(vals, outs)):
                checks.append((o, want, "out[%d] %s %s" % (i, dtype, shape)))
                checks.append((v, mine[i], "value[%d] unchanged %s %s" % (i, dtype, shape)))
    for a, want, what in checks:
        res.equal(a, want, "pushpull devices " + what)


def sec_key_lists(res: Results) -> None:
    shapes = [(3,), (2, 2), (5, 1, 2)]
    for dtype in DTYPES:
        # list of keys, one value each, in place
        cs = [next_case() for _ in shapes]
        vals = [nd(data(c, RANK, 0, s, dtype)) for c, s in zip(cs, shapes)]
        KV.pushpull([key_for(c) for c in cs], vals)
        for c, s, v in zip(cs, shapes, vals):
            res.equal(v, total(c, SIZE, 1, s, dtype), "key list in place %s %s" % (dtype, s))
        # list of keys, one value and one out each
        cs = [next_case() for _ in shapes]
        vals = [nd(data(c, RANK, 0, s, dtype)) for c, s in zip(cs, shapes)]
        outs = [zeros_like_np(s, dtype) for s in shapes]
        KV.pushpull([key_for(c) for c in cs], vals, out=outs)
        for c, s, o in zip(cs, shapes, outs):
            res.equal(o, total(c, SIZE, 1, s, dtype), "key list out %s %s" % (dtype, s))
        # list of keys, each with a list of per-device values and outs
        cs = [next_case() for _ in shapes]
        vals = [[nd(data(c, RANK, d, s, dtype), ctx) for d, ctx in enumerate(DEVS)]
                for c, s in zip(cs, shapes)]
        outs = [[zeros_like_np(s, dtype, ctx) for ctx in DEVS] for s in shapes]
        KV.pushpull([key_for(c) for c in cs], vals, out=outs)
        for c, s, os_ in zip(cs, shapes, outs):
            for i, o in enumerate(os_):
                res.equal(o, total(c, SIZE, len(DEVS), s, dtype),
                          "key list devices out[%d] %s %s" % (i, dtype, s))
        # a tuple of keys works like a list
        cs = [next_case() for _ in shapes]
        vals = tuple(nd(data(c, RANK, 0, s, dtype)) for c, s in zip(cs, shapes))
        KV.pushpull(tuple(key_for(c) for c in cs), vals)
        for c, s, v in zip(cs, shapes, vals):
            res.equal(v, total(c, SIZE, 1, s, dtype), "key tuple %s %s" % (dtype, s))


def sec_repeat_key(res: Results) -> None:
    """The same key again and again without waiting: each result is its own sum."""
    for dtype in ("float32", "int32", "float16"):
        key = "repeat-" + dtype
        checks = []
        for _ in range(6):
            c = next_case()
            a = nd(data(c, RANK, 0, (4, 3), dtype))
            KV.pushpull(key, a)
            checks.append((a, total(c, SIZE, 1, (4, 3), dtype)))
            c = next_case()
            vals = [nd(data(c, RANK, d, (4, 3), dtype), ctx) for d, ctx in enumerate(DEVS)]
            KV.pushpull(key, vals)  # reuses the key's device-sum buffer
            checks.extend((v, total(c, SIZE, len(DEVS), (4, 3), dtype)) for v in vals)
        for i, (a, want) in enumerate(checks):
            res.equal(a, want, "repeat %s #%d" % (dtype, i))
        # the same array reduced twice in a row: the second sums the first's result
        a = nd(np.full((5,), RANK + 1, dtype=dtype))
        KV.pushpull(key + "-twice", a)
        KV.pushpull(key + "-twice", a)
        s1 = sum(r + 1 for r in range(SIZE))
        res.equal(a, np.full((5,), s1 * SIZE, dtype=dtype), "pushpull twice " + dtype)


def sec_broadcast(res: Results, shapes) -> None:
    checks = []
    for dtype in DTYPES:
        for shape in shapes:
            c = next_case()
            mine = data(c, RANK, 0, shape, dtype)
            root = data(c, 0, 0, shape, dtype)
            a, o = nd(mine), zeros_like_np(shape, dtype)
            KV.broadcast(key_for(c), a, out=o)
            checks.append((o, root, "out %s %s" % (dtype, shape)))
            checks.append((a, mine, "value unchanged %s %s" % (dtype, shape)))
            c = next_case()
            mine = data(c, RANK, 0, shape, dtype)
            a = nd(mine)
            outs = [zeros_like_np(shape, dtype, ctx) for ctx in DEVS]
            KV.broadcast(key_for(c), a, out=outs)
            for i, o in enumerate(outs):
                checks.append((o, data(c, 0, 0, shape, dtype), "out[%d] %s %s"
                               % (i, dtype, shape)))
            # in place: out is the value
            c = next_case()
            b = nd(data(c, RANK, 0, shape, dtype))
            KV.broadcast(key_for(c), b, out=b)
            checks.append((b, data(c, 0, 0, shape, dtype), "in place %s %s" % (dtype, shape)))
    # list of keys
    cs = [next_case() for _ in range(3)]
    vals = [nd(data(c, RANK, 0, (c % 4 + 1,), "float32")) for c in cs]
    outs = [zeros_like_np((c % 4 + 1,), "float32") for c in cs]
    KV.broadcast([key_for(c) for c in cs], vals, out=outs)
    for c, o in zip(cs, outs):
        checks.append((o, data(c, 0, 0, (c % 4 + 1,), "float32"), "key list %d" % c))
    for a, want, what in checks:
        res.equal(a, want, "broadcast " + what)


def sec_init_pull(res: Results, shapes) -> None:
    for dtype in DTYPES:
        for shape in shapes:
            c = next_case()
            k = key_for(c)
            a = nd(data(c, RANK, 0, shape, dtype))
            KV.init(k, a)
            root = data(c, 0, 0, shape, dtype)
            res.equal(a, root, "init writes rank 0's value back %s %s" % (dtype, shape))
            o = zeros_like_np(shape, dtype)
            KV.pull(k, out=o)
            res.equal(o, root, "pull after init %s %s" % (dtype, shape))
            outs = [zeros_like_np(shape, dtype, ctx) for ctx in DEVS]
            KV.pull(k, out=outs)
            for i, o in enumerate(outs):
                res.equal(o, root, "pull after init out[%d] %s %s" % (i, dtype, shape))
    # init and pull with lists of keys; init with per-device values
    cs = [next_case() for _ in range(3)]
    vals = [[nd(data(c, RANK, d, (2, c % 3 + 1), "int32"), ctx) for d, ctx in enumerate(DEVS)]
            for c in cs]
    KV.init([key_for(c) for c in cs], vals)
    outs = [zeros_like_np((2, c % 3 + 1), "int32") for c in cs]
    KV.pull([key_for(c) for c in cs], out=outs)
    for c, vs, o in zip(cs, vals, outs):
        root = data(c, 0, 0, (2, c % 3 + 1), "int32")
        res.equal(o, root, "pull key list %d" % c)
        for i, v in enumerate(vs):
            res.equal(v, root, "init key list writes back value[%d] %d" % (i, c))


def sec_push_pull(res: Results, shapes) -> None:
    for dtype in DTYPES:
        for shape in shapes:
            # push without init: stores the sum over ranks
            c = next_case()
            k = key_for(c)
            KV.push(k, nd(data(c, RANK, 0, shape, dtype)))
            o = zeros_like_np(shape, dtype)
            KV.pull(k, out=o)
            res.equal(o, total(c, SIZE, 1, shape, dtype), "push, pull %s %s" % (dtype, shape))
            # push per-device values on the same key: replaces the stored value
            c2 = next_case()
            KV.push(k, [nd(data(c2, RANK, d, shape, dtype), ctx)
                        for d, ctx in enumerate(DEVS)])
            outs = [zeros_like_np(shape, dtype, ctx) for ctx in DEVS]
            KV.pull(k, out=outs)
            for i, o in enumerate(outs):
                res.equal(o, total(c2, SIZE, len(DEVS), shape, dtype),
                          "push devices, pull out[%d] %s %s" % (i, dtype, shape))
            # init then push: the push replaces rank 0's initial value
            c3 = next_case()
            k3 = key_for(c3)
            KV.init(k3, nd(data(c3, RANK, 0, shape, dtype)))
            c4 = next_case()
            KV.push(k3, nd(data(c4, RANK, 0, shape, dtype)))
            o = zeros_like_np(shape, dtype)
            KV.pull(k3, out=o)
            res.equal(o, total(c4, SIZE, 1, shape, dtype), "init, push, pull %s %s"
                      % (dtype, shape))


def sec_large(res: Results) -> None:
    n = 5_000_000 + 3  # > 16 MB of float32, not a round size
    c = next_case()
    mine = data(c, RANK, 0, (n,), "float32")
    a = nd(mine)
    o = zeros_like_np((n,), "float32")
    KV.pushpull("large-out", a, out=o)
    KV.pushpull("large-inplace", a)
    want = total(c, SIZE, 1, (n,), "float32")
    res.equal(o, want, "large pushpull out")
    res.equal(a, want, "large pushpull in place")
    c = next_case()
    b = nd(data(c, RANK, 0, (n,), "float32"))
    ob = zeros_like_np((n,), "float32")
    KV.broadcast("large-bcast", b, out=ob)
    res.equal(ob, data(c, 0, 0, (n,), "float32"), "large broadcast")
    c = next_case()
    d = nd(data(c, RANK, 0, (1000, 1250), "float64"))  # 10 MB of float64
    KV.pushpull("large-f64", d)
    res.equal(d, total(c, SIZE, 1, (1000, 1250), "float64"), "large float64")


def sec_views_contexts_keys(res: Results) -> None:
    """Arrays that are views into others, pinned host memory, and keys 0 vs "0"."""
    for dtype in ("float32", "int64", "float16", "int8"):
        c = next_case()
        mine = data(c, RANK, 0, (6, 5), dtype)
        big = nd(mine)
        KV.pushpull("slice-" + dtype, big[2:4])  # rows 2..3 only, in place
        want = mine.copy()
        want[2:4] = total(c, SIZE, 1, (6, 5), dtype)[2:4]
        res.equal(big, want, "pushpull into a row slice " + dtype)
        c = next_case()
        o = nd(np.full((6, 5), 9, dtype=dtype))
        KV.pushpull("slice-out-" + dtype, nd(data(c, RANK, 0, (2, 5), dtype)), out=o[3:5])
        want = np.full((6, 5), 9, dtype=dtype)
        want[3:5] = total(c, SIZE, 1, (2, 5), dtype)
        res.equal(o, want, "pushpull out= a row slice " + dtype)
        c = next_case()
        flat = nd(data(c, RANK, 0, (4, 6), dtype))
        view = flat.reshape((24,))
        KV.pushpull("reshape-" + dtype, view)
        res.equal(flat, total(c, SIZE, 1, (4, 6), dtype), "pushpull a reshaped view " + dtype)
        c = next_case()
        src = nd(data(c, RANK, 0, (6, 5), dtype))
        o = nd(np.zeros((6, 5), dtype=dtype))
        KV.broadcast("slice-bcast-" + dtype, src[1:3], out=o[4:6])
        want = np.zeros((6, 5), dtype=dtype)
        want[4:6] = data(c, 0, 0, (6, 5), dtype)[1:3]
        res.equal(o, want, "broadcast between row slices " + dtype)
    # pinned host memory, alone and mixed with plain cpu arrays
    c = next_case()
    pinned = mx.cpu_pinned(0)
    a = nd(data(c, RANK, 0, (3, 4), "float32"), pinned)
    KV.pushpull("pinned", a)
    res.equal(a, total(c, SIZE, 1, (3, 4), "float32"), "pushpull on cpu_pinned")
    c = next_case()
    vals = [nd(data(c, RANK, d, (3, 4), "int32"), ctx)
            for d, ctx in enumerate([pinned, mx.cpu(0)])]
    outs = [nd(np.zeros((3, 4), "int32"), ctx) for ctx in (mx.cpu(1), pinned)]
    KV.pushpull("pinned-mixed", vals, out=outs)
    for i, o in enumerate(outs):
        res.equal(o, total(c, SIZE, 2, (3, 4), "int32"), "pinned/cpu mixed out[%d]" % i)
    # int 0 and str "0" are different keys (different shapes are fine)
    c0, c1 = next_case(), next_case()
    a0, a1 = nd(data(c0, RANK, 0, (3,), "float32")), nd(data(c1, RANK, 0, (2, 2), "float32"))
    KV.pushpull(0, a0)
    KV.pushpull("0", a1)
    res.equal(a0, total(c0, SIZE, 1, (3,), "float32"), "key 0")
    res.equal(a1, total(c1, SIZE, 1, (2, 2), "float32"), "key '0'")
    # a big priority and a negative one are just priorities
    c = next_case()
    a, b = nd(data(c, RANK, 0, (5,), "int32")), nd(data(c, RANK, 1, (5,), "int32"))
    KV.pushpull("prio-hi", a, priority=10 ** 6)
    KV.pushpull("prio-lo", b, priority=-10 ** 6)
    res.equal(a, total(c, SIZE, 1, (5,), "int32"), "priority 1e6")
    res.equal(b, sum(data(c, r, 1, (5,), "int32") for r in range(SIZE)).astype("int32"),
              "priority -1e6")


def sec_lowlevel(res: Results) -> None:
    w = mxnet_mpi.world()
    for dtype in DTYPES:
        c = next_case()
        src = nd(data(c, RANK, 0, (6,), dtype))
        dst = mxnet_mpi.ops.allreduce(src, priority=3, name="ll-%d" % c, comm=w)
        res.equal(dst, total(c, SIZE, 1, (6,), dtype), "allreduce " + dtype)
        res.equal(src, data(c, RANK, 0, (6,), dtype), "allreduce src unchanged " + dtype)
        mxnet_mpi.allreduce_(src, comm=w)
        res.equal(src, total(c, SIZE, 1, (6,), dtype), "allreduce_ in place " + dtype)
        root = SIZE - 1  # a root other than 0 where there is one
        c = next_case()
        src = nd(data(c, RANK, 0, (6,), dtype))
        dst = mxnet_mpi.ops.broadcast(src, root, comm=w)
        res.equal(dst, data(c, root, 0, (6,), dtype), "broadcast root %d %s" % (root, dtype))
        mxnet_mpi.broadcast_(src, root, comm=w)
        res.equal(src, data(c, root, 0, (6,), dtype), "broadcast_ in place " + dtype)
    # many low-level ops pushed without waiting (a chained stream per communicator)
    checks = []
    for i in range(20):
        c = next_case()
        a = nd(data(c, RANK, 0, (i + 1,), "float32"))
        if i % 3 == 2:
            mxnet_mpi.broadcast_(a, i % SIZE, comm=w)
            checks.append((a, data(c, i % SIZE, 0, (i + 1,), "float32")))
        else:
            mxnet_mpi.allreduce_(a, priority=i, comm=w)
            checks.append((a, total(c, SIZE, 1, (i + 1,), "float32")))
    for i, (a, want) in enumerate(checks):
        res.equal(a, want, "chained low-level op %d" % i)
    # a duplicated and a split communicator
    dup = w.dup()
    res.check((dup.rank, dup.size) == (RANK, SIZE), "dup() %r" % (dup,))
    c = next_case()
    a = nd(data(c, RANK, 0, (4,), "int64"))
    mxnet_mpi.allreduce_(a, comm=dup)
    res.equal(a, total(c, SIZE, 1, (4,), "int64"), "allreduce_ over dup()")
    half = w.split(RANK % 2)
    members = [r for r in range(SIZE) if r % 2 == RANK % 2]
    res.check(half is not None and half.size == len(members)
              and half.rank == members.index(RANK), "split() %r" % (half,))
    c = next_case()
    a = nd(data(c, RANK, 0, (4,), "int32"))
    mxnet_mpi.allreduce_(a, comm=half)
    want = sum(data(c, r, 0, (4,), "int32").astype(np.int64) for r in members).astype("int32")
    res.equal(a, want, "allreduce_ over split()")
    # one collective API: the old (src, dst, comm) spelling is a clear error
    for old in (lambda a: mxnet_mpi.allreduce_(a, a, w), lambda a: mxnet_mpi.broadcast_(a, a, w)):
        try:
            old(nd(np.ones(2, np.float32)))
            res.check(False, "the old (src, dst, comm) spelling was accepted")
        except mxnet_mpi.MPIKVStoreError as exc:
            res.check("(tensor, comm=comm)" in str(exc), "old spelling: %s" % exc)
    c = next_case()
    a = nd(data(c, RANK, 0, (3,), "float32"))
    mxnet_mpi.allreduce_(a, comm=w)
    res.equal(a, total(c, SIZE, 1, (3,), "float32"), "exact after the old spelling")
    none = w.split(-1)
    res.check(none is None, "split(-1) should give None, got %r" % (none,))
    mx.nd.waitall()
    half.free()
    dup.free()
    # freed, a communicator's free-function stream goes with it: used after,
    # it is a named error (not its stream answering), and communicators made
    # and freed in a loop keep nothing
    try:
        mxnet_mpi.allreduce_(nd(np.ones(2, np.float32)), comm=half)
        res.check(False, "a freed communicator was still usable")
    except mxnet_mpi.MPIKVStoreError as exc:
        res.check("was freed" in str(exc), "use after free: %s" % exc)
    from mxnet_mpi import collectives
    held = len(collectives._streams)
    for i in range(20):
        cycle = w.split(0)
        a = nd(np.full(3, i, np.int32))
        mxnet_mpi.allreduce_(a, comm=cycle)
        res.equal(a, np.full(3, i * SIZE, np.int32), "allreduce_ over split() %d" % i)
        cycle.free()
    res.check(len(collectives._streams) == held,
              "streams held %d after 20 split/free, %d before" % (len(collectives._streams), held))


def sec_two_stores(res: Results) -> None:
    kv2 = mx.kv.create(STORE)
    checks = []
    for i in range(30):
        store = KV if i % 2 else kv2
        c = next_case()
        a = nd(data(c, RANK, 0, (i % 5 + 1, 3), "float32"))
        store.pushpull("shared-name-%d" % (i // 2), a)  # same key names in both stores
        checks.append((a, total(c, SIZE, 1, (i % 5 + 1, 3), "float32")))
    for i, (a, want) in enumerate(checks):
        res.equal(a, want, "two stores op %d" % i)


def sec_random_bitwise(res: Results) -> None:
    """Non-integer data: every rank must get bit-identical sums."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    arrays, per_device = [], []    # (result, this rank's contribution in float64)
    for i, n in enumerate([1, 17, 1000, 65537, 1_000_003]):
        rng = np.random.default_rng(1000 * RANK + i)
        x = rng.standard_normal(n).astype(np.float32)
        a = nd(x)
        KV.pushpull("rand-%d" % i, a)
        arrays.append((a, x.astype(np.float64)))
        xs = [rng.standard_normal(n).astype(np.float32) for _ in DEVS]
        devs = [nd(x, ctx) for x, ctx in zip(xs, DEVS)]
        KV.pushpull("rand-dev-%d" % i, devs)
        arrays.extend((d, xs[0].astype(np.float64) + xs[1]) for d in devs)
        per_device.append(devs)
    rng = np.random.default_rng(77 + RANK)
    x16 = rng.standard_normal(4096).astype(np.float16)
    h = nd(x16)
    KV.pushpull("rand-f16", h)
    arrays.append((h, x16.astype(np.float64)))
    mx.nd.waitall()
    digests = [hashlib.sha256(a.asnumpy().tobytes()).hexdigest() for a, _ in arrays]
    everyone = comm.allgather(digests)
    for r, theirs in enumerate(everyone):
        for i, (mine, other) in enumerate(zip(digests, theirs)):
            res.check(mine == other, "array %d differs between rank %d and rank %d"
                      % (i, RANK, r))
    # and the sums are right (to rounding): compare with a float64 reference
    # (float16: its own rounding, about 1e-3 of each value)
    for i, (a, x) in enumerate(arrays):
        want = np.sum(np.stack(comm.allgather(x)), axis=0)
        got = a.asnumpy().astype(np.float64)
        tol = 4e-3 if a.dtype == np.float16 else 1e-5
        res.check(np.allclose(got, want, rtol=tol, atol=tol * 2 * SIZE),
                  "random sum %d off by %g" % (i, np.max(np.abs(got - want))))
    for devs in per_device:  # the two device copies of one rank are identical too
        res.check(np.array_equal(devs[1].asnumpy(), devs[0].asnumpy()), "device copies differ")


def sec_rank_order(res: Results) -> None:
    """With the point-to-point route (MXNET_MPI_P2P_BYTES), sums are folded in
    rank order, ((v0 + v1) + v2): the same bits in every run. Arrays of fewer
    elements than ranks took MPI's allreduce (its own order: a last bit apart
    on 4 ranks, test_collectives' 4-rank run) until they were folded in rank
    order too. Without the route: identical on every rank, close to it."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    p2p = getattr(KV.stream, "p2p_bytes", 0) > 0
    sizes = list(range(1, SIZE + 3)) + [1025]
    outs = []
    for n in sizes:
        x = (np.random.default_rng(500 + 10 * n + RANK).standard_normal(n) * 1.37
             ).astype(np.float32)
        a = nd(x)
        KV.pushpull("order-%d" % n, a)
        outs.append((n, a, comm.allgather(x)))
    mx.nd.waitall()
    for n, a, every in outs:
        want = every[0].copy()
        for x in every[1:]:
            want = want + x
        got = a.asnumpy()
        if p2p:
            res.check(np.array_equal(got, want), "%d elements: not the rank-order sum (%d "
                      "elements differ)" % (n, int((got != want).sum())))
        else:
            res.check(np.allclose(got, want, rtol=1e-6, atol=1e-6), "%d elements: off" % n)
        digests = comm.allgather(hashlib.sha256(got.tobytes()).hexdigest())
        res.check(len(set(digests)) == 1, "%d elements: ranks differ" % n)


def sec_integer_wrap(res: Results) -> None:
    """Integer sums that overflow wrap around, as in MXNet's own stores and
    numpy: Open MPI's op/avx added 8-bit integers with saturation (200 + 200
    gave 255 for uint8) in runs of 16 elements, exit 0."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    outs = []
    for dtype in ("uint8", "int8", "int32", "int64"):
        info = np.iinfo(dtype)
        for n in (5, 100, 70_001):
            x = np.random.default_rng(40 + n + RANK).integers(
                info.min, info.max, n, dtype=dtype, endpoint=True)
            if n == 5:   # every element overflows (from 2 ranks on)
                x[:] = info.max - RANK
            a = nd(x)
            KV.pushpull("wrap-%s-%d" % (dtype, n), a)
            outs.append((dtype, n, a, comm.allgather(x)))
    mx.nd.waitall()
    for dtype, n, a, every in outs:
        with np.errstate(over="ignore"):
            want = every[0].copy()
            for x in every[1:]:
                want = want + x
        got = a.asnumpy()
        res.check(got.dtype == np.dtype(dtype) and np.array_equal(got, want),
                  "%s x %d: %d elements differ from numpy's wrapped sum (%s vs %s)"
                  % (dtype, n, int((got != want).sum()), got[:4], want[:4]))


def np_mode(section):
    """Run `section` with MXNet's numpy semantics (mx.np arrays, 0-d and empty shapes)."""
    def run(res: Results, *args) -> None:
        mx.npx.set_np()
        try:
            section(res, *args)
            mx.nd.waitall()
        finally:
            mx.npx.reset_np()
    return run


def mxnp(arr: np.ndarray, ctx=None):
    return mx.np.array(arr, ctx=ctx or mx.cpu(0), dtype=arr.dtype)


def sec_np_arrays(res: Results) -> None:
    """mx.np arrays (numpy semantics): in place, out, out list, broadcast."""
    checks = []
    for dtype in DTYPES:
        for shape in SHAPES:
            c = next_case()
            a = mxnp(data(c, RANK, 0, shape, dtype))
            KV.pushpull(key_for(c), a)
            want = total(c, SIZE, 1, shape, dtype)
            checks.append((a, want, "in place %s %s" % (dtype, shape)))
            c = next_case()
            a = mxnp(data(c, RANK, 0, shape, dtype))
            outs = [mxnp(np.zeros(shape, dtype=dtype), ctx) for ctx in DEVS]
            KV.pushpull(key_for(c), a, out=outs)
            want = total(c, SIZE, 1, shape, dtype)
            checks.extend((o, want, "out[%d] %s %s" % (i, dtype, shape))
                          for i, o in enumerate(outs))
            c = next_case()
            a = mxnp(data(c, RANK, 0, shape, dtype))
            outs = [mxnp(np.zeros(shape, dtype=dtype), ctx) for ctx in DEVS]
            KV.broadcast(key_for(c), a, out=outs)
            checks.extend((o, data(c, 0, 0, shape, dtype), "broadcast out[%d] %s %s"
                           % (i, dtype, shape)) for i, o in enumerate(outs))
    for a, want, what in checks:
        res.equal(a, want, "mx.np " + what)
        res.check(isinstance(a, mx.np.ndarray), "mx.np %s became %s" % (what, type(a)))


def sec_barrier(res: Results) -> None:
    """kv._barrier() (MXNet's, which SVRGModule calls) returns only once every
    rank has called it: the last rank arrives 0.4 s after the others."""
    KV._barrier()                       # leave together
    if RANK == SIZE - 1:
        time.sleep(0.4)
    t0 = time.monotonic()
    KV._barrier()
    waited = time.monotonic() - t0
    if RANK != SIZE - 1:
        res.check(waited > 0.2, "rank %d left the barrier after %.3f s, before the last "
                  "rank arrived" % (RANK, waited))


def sec_waits(res: Results) -> None:
    """After the sections' traffic: the store threads that waited for their
    peers (funneled's negotiator, concurrent's lanes) sleep with a timer slack
    of 1 us, so that their naps end on time."""
    if SIZE == 1 or KV.mode == "chained":   # no waits, or waits on MXNet's engine threads
        return
    # only where the kernel lets a thread set its slack (PR_SET_TIMERSLACK: 29,
    # PR_GET_TIMERSLACK: 30; tried on this thread, then put back) and shows it
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                      ctypes.c_ulong]
    own = prctl(30, 0, 0, 0, 0)
    if own <= 0 or prctl(29, own, 0, 0, 0) != 0 or not os.path.exists(
            "/proc/%d/timerslack_ns" % threading.get_native_id()):
        return
    name = "mxmpi-funneled" if KV.mode == "funneled" else "mxmpi-lane"
    slacks = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/comm" % tid) as f:
                if f.read().strip() != name:
                    continue
            with open("/proc/%s/timerslack_ns" % tid) as f:
                slacks.append(int(f.read()))
        except OSError:
            continue
    res.check(1000 in slacks, "no %s thread sleeps with a timer slack of 1 us: %r"
              % (name, slacks))


SECTIONS = {
    "world": (sec_world,),
    "pushpull_inplace": (sec_pushpull_inplace,),
    "pushpull_out": (sec_pushpull_out,),
    "pushpull_out_list": (sec_pushpull_out_list, PLAIN_SHAPES),
    "pushpull_devices": (sec_pushpull_devices, PLAIN_SHAPES),
    "key_lists": (sec_key_lists,),
    "repeat_key": (sec_repeat_key,),
    "broadcast": (sec_broadcast, PLAIN_SHAPES),
    "init_pull": (sec_init_pull, PLAIN_SHAPES),
    "push_pull": (sec_push_pull, PLAIN_SHAPES),
    "large": (sec_large,),
    "views_contexts_keys": (sec_views_contexts_keys,),
    "lowlevel": (sec_lowlevel,),
    "two_stores": (sec_two_stores,),
    "random_bitwise": (sec_random_bitwise,),
    "rank_order": (sec_rank_order,),
    "integer_wrap": (sec_integer_wrap,),
    "np_arrays": (np_mode(sec_np_arrays),),
    # 0-d and empty legacy NDArrays with lists of outs or devices, init and pull
    # (MXNet's own 'local' kvstore handles all of these)
    "legacy_empty_out_list": (sec_pushpull_out_list, EMPTY_SHAPES),
    "legacy_empty_devices": (sec_pushpull_devices, EMPTY_SHAPES),
    "legacy_empty_broadcast": (sec_broadcast, EMPTY_SHAPES),
    "legacy_empty_init_pull": (sec_init_pull, EMPTY_SHAPES),
    "legacy_empty_push_pull": (sec_push_pull, EMPTY_SHAPES),
    # per-device lists of mx.np arrays (Gluon with several contexts after npx.set_np())
    "np_devices": (np_mode(sec_pushpull_devices), SHAPES, mxnp),
    "barrier": (sec_barrier,),
    "waits": (sec_waits,),   # last: after the others' traffic
}


def main() -> None:
    out_dir = sys.argv[1]
    only = sys.argv[2].split(",") if len(sys.argv) > 2 else list(SECTIONS)
    res = Results(out_dir, RANK)
    for name in only:
        fn, *args = SECTIONS[name]
        res.run(name, fn, *args)
    # what the store runs with, so the test can see a run's setting took effect
    res.write(size=SIZE, p2p_bytes=getattr(KV.stream, "p2p_bytes", None),
              preempt_bytes=KV.stream.options()["preempt_bytes"])


if __name__ == "__main__":
    main()
