"""Property-based fuzzing of the store against a numpy model.

  fuzz_store.py MODE N_EXAMPLES

Hypothesis draws sequences of init / broadcast / pushpull / push / pull calls
(valid and invalid) with int and str keys, shapes (empty ones included),
dtypes, single arrays or per-device lists, and priorities. Every rank draws
the same sequence (derandomized, no shrinking, so ranks never diverge); rank
r's data is base * (r + 1). Valid calls must give the model's result; invalid
ones must raise MPIKVStoreError and leave the store usable.
"""

import sys

import mxnet as mx
import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from mxnet_mpi import MPIKVStoreError

MODE, N = sys.argv[1], int(sys.argv[2])
KV = mx.kv.create("mpi_" + MODE)
RANK, SIZE = KV.rank, KV.num_workers
SCALE = sum(r + 1 for r in range(SIZE))  # sum over ranks of (r + 1)
DTYPES = ["float32", "float64", "float16", "uint8", "int32", "int8", "int64"]
DEVS = [mx.cpu(0), mx.cpu(1)]

# legacy mx.nd has no 0-d arrays (tests/test_collectives.py covers mx.np 0-d)
shapes = st.lists(st.integers(0, 3), min_size=1, max_size=3).map(tuple)
ops = st.tuples(
    st.sampled_from(["init", "broadcast", "pushpull", "pushpull_out", "pushpull_devices",
                     "push", "pull", "bad_numpy", "bad_key", "bad_out_shape", "bad_dtype",
                     "bad_sparse"]),
    st.integers(0, 3),                    # key index
    st.booleans(),                        # str key?
    shapes,
    st.sampled_from(DTYPES),
    st.integers(-3, 3),                   # priority
    st.integers(0, 2**31 - 1),            # data seed
    st.integers(0, 3),                    # > 0: a key seen before keeps its layout
)
example_no = [0]


def base(seed, shape, dtype):
    # small integers: sums are exact in every dtype and reduction order
    return np.random.RandomState(seed).randint(0, 3, size=shape).astype(dtype)


def nd(a, ctx=DEVS[0]):
    return mx.nd.array(a, ctx=ctx, dtype=a.dtype)


def call(kind, key, b, mine, prio):
    """One valid call of `kind`; the (array, expected value) pairs to check."""
    shape, dtype = b.shape, b.dtype
    if kind == "init":
        v = nd(mine)
        KV.init(key, v)
        return [(v, b)]
    if kind == "broadcast":
        out = nd(np.zeros(shape, dtype=dtype))
        KV.broadcast(key, nd(mine), out=out, priority=prio)
        return [(out, b)]
    if kind == "push":
        KV.push(key, nd(mine), priority=prio)
        return []
    if kind == "pushpull":
        v = nd(mine)
        KV.pushpull(key, v, priority=prio)
        return [(v, (b * SCALE).astype(dtype))]
    if kind == "pushpull_out":
        outs = [nd(np.zeros(shape, dtype=dtype)) for _ in range(2)]
        KV.pushpull(key, nd(mine), out=outs, priority=prio)
        return [(o, (b * SCALE).astype(dtype)) for o in outs]
    vals = [nd(mine, ctx) for ctx in DEVS]   # two devices per rank
    KV.pushpull(key, vals, priority=prio)
    return [(v, (b * SCALE * 2).astype(dtype)) for v in vals]


@settings(max_examples=N, derandomize=True, deadline=None, database=None,
          phases=[Phase.explicit, Phase.generate],
          suppress_health_check=list(HealthCheck))
@given(st.lists(ops, min_size=1, max_size=8))
def run(seq):
    example_no[0] += 1
    meta, stored, checks = {}, {}, []
    for kind, k, as_str, shape, dtype, prio, seed, same in seq:
        key = ("e%dk%d" % (example_no[0], k)) if as_str else example_no[0] * 10 + k
        if same and key in meta:   # mostly: pulls then find what init or push stored
            shape, dtype = meta[key]
        b = base(seed, shape, dtype)
        mine = (b * (RANK + 1)).astype(dtype)
        layout = (shape, dtype)
        # the store's rule: a key keeps the shape and dtype of its first use
        conflict = key in meta and meta[key] != layout
        # the model: a pull needs a value stored (init or push) with this layout
        pull_fails = key not in stored or stored[key].shape != shape or \
            stored[key].dtype != np.dtype(dtype)
        try:
            if kind == "bad_numpy":
                KV.pushpull(key, mine)
            elif kind == "bad_key":
                KV.pushpull(float(k) + 0.5, nd(mine))
            elif kind == "bad_out_shape":
                KV.pushpull(key, nd(mine), out=nd(np.zeros(shape + (2,), dtype=dtype)))
            elif kind == "bad_dtype":
                KV.pushpull(key, mx.nd.zeros((2,), dtype="bool"))
            elif kind == "bad_sparse":
                KV.pushpull(key, mx.nd.zeros((2, 2)).tostype("row_sparse"))
            elif kind == "pull":
                out = nd(np.zeros(shape, dtype=dtype))
                KV.pull(key, out=out, priority=prio)
                if pull_fails:
                    raise AssertionError("pull of %r should have failed" % (key,))
                checks.append((out, stored[key]))
                continue
            else:
                # the drawn call itself, also where it reuses a key with another layout
                made = call(kind, key, b, mine, prio)
                if conflict:
                    raise AssertionError("%s of %r with another layout did not fail"
                                         % (kind, key))
                checks += made
                if kind == "init":
                    stored[key] = b
                elif kind == "push":
                    stored[key] = (b * SCALE).astype(dtype)
                meta.setdefault(key, layout)
                continue
            raise AssertionError("%s did not fail" % kind)
        except MPIKVStoreError:
            if kind.startswith("bad_") or conflict or (kind == "pull" and pull_fails):
                continue
            raise
    for arr, want in checks:
        got = arr.asnumpy()
        assert got.dtype == want.dtype and got.shape == want.shape, (got, want)
        np.testing.assert_array_equal(got, want)


run()
# still usable after all the errors
probe = mx.nd.ones((3,))
KV.pushpull("after_fuzz", probe)
assert probe.asnumpy().tolist() == [float(SIZE)] * 3
print("FUZZ_OK rank %d of %d: %d examples in mode %s" % (RANK, SIZE, example_no[0], MODE),
      flush=True)
