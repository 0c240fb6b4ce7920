"""Rank-local failures never shift the pairing of later collectives.

  mpirun -np 2 python out_of_step.py MODE OUT_JSON

Every scenario runs on a store of MODE (and the free functions), on 2 ranks.
Each rank records what it saw; tests/test_out_of_step.py checks the records:
errors name the failing rank and the problem on every rank, and the
collectives after the failure are exact (the sum of step s is 20 s + 3).
"""

from __future__ import annotations

import json
import sys

import mxnet as mx
import numpy as np

import mxnet_mpi

mode, out_path = sys.argv[1], sys.argv[2]
RANK, SIZE = mxnet_mpi.rank(), mxnet_mpi.size()
assert SIZE == 2
record: dict = {}


def value(step: int, shape=(4,), dtype="float32"):
    return mx.nd.full(shape, step * 10 + RANK + 1, dtype=dtype)


def want(step: int) -> float:
    return float(sum(step * 10 + r + 1 for r in range(SIZE)))


def outcome(fn):
    """('ok', result) or (exception type, message)."""
    try:
        return "ok", fn()
    except Exception as exc:  # noqa: BLE001 - recorded for the test to check
        return type(exc).__name__, str(exc)


def steps_after(kv, key: str, first: int, last: int) -> list:
    """Sums of steps first..last on `key`, checked exact."""
    got = []
    for step in range(first, last + 1):
        a = value(step)
        kv.pushpull(key, a)
        got.append(float(a.asnumpy()[0]) == want(step) and bool(np.all(a.asnumpy() == want(step))))
    return got


def bad_out(kv) -> dict:
    """Rank 1 passes an `out` of the wrong shape at step 1 (and catches it)."""
    a = value(0)
    kv.pushpull("g", a)
    a.wait_to_read()
    res = {}
    a = value(1)
    out = mx.nd.zeros((5,) if RANK == 1 else (4,))

    def step1():
        kv.pushpull("g", a, out=out)
        out.wait_to_read()

    res["step1"] = outcome(step1)
    res["after"] = steps_after(kv, "g", 2, 3)
    return res


def dtype_change(kv) -> dict:
    """Rank 1 pushes float64 on a float32 key at step 1."""
    a = value(0)
    kv.pushpull("d", a)
    a.wait_to_read()
    b = value(1, dtype="float64" if RANK == 1 else "float32")

    def step1():
        kv.pushpull("d", b)
        b.wait_to_read()

    return {"step1": outcome(step1), "after": steps_after(kv, "d", 2, 3)}


def average_on_one_rank(kv) -> dict:
    """kv.average set on rank 1 only: key, shape and dtype agree, the
    reduction does not; then both average, exact."""
    kv.average = RANK == 1
    a = value(1)
    kv.pushpull("avg", a)
    first = outcome(lambda: a.asnumpy())
    kv.average = True
    b = value(2)
    kv.pushpull("avg", b)
    after = outcome(lambda: bool(np.all(b.asnumpy() == want(2) / SIZE)))
    return {"step1": first, "after": after}


class Boom(mx.operator.CustomOp):
    def forward(self, is_train, req, in_data, out_data, aux):
        raise RuntimeError("boom in an engine op on rank %d" % RANK)

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        pass


@mx.operator.register("mxnet_mpi_test_boom")
class BoomProp(mx.operator.CustomOpProp):
    def list_arguments(self):
        return ["data"]

    def infer_shape(self, in_shape):
        return in_shape, in_shape, []

    def create_operator(self, ctx, shapes, dtypes):
        return Boom()


def engine_failure(kv) -> dict:
    """On rank 1 the input of step 1's allreduce comes from an op that fails
    inside the engine: MXNet skips the collective there; rank 0 must learn it."""
    a = value(0)
    kv.pushpull("e", a)
    a.wait_to_read()
    a = value(1)
    if RANK == 1:
        a = mx.nd.Custom(a, op_type="mxnet_mpi_test_boom")

    def step1():
        kv.pushpull("e", a)
        a.wait_to_read()

    return {"step1": outcome(step1), "after": steps_after(kv, "e", 2, 3)}


def failed_then_valid(kv) -> dict:
    """A collective that fails on every rank (shapes differ), then a valid one
    pushed before anyone waited: the valid one must be exact (no poisoning)."""
    x = mx.nd.ones((3,) if RANK == 0 else (4,))
    kv.pushpull("mismatch-%s" % mode, x)
    y = value(5)
    kv.pushpull("valid-%s" % mode, y)
    first = outcome(lambda: x.asnumpy())
    second = outcome(lambda: bool(np.all(y.asnumpy() == want(5))))
    z = value(6)
    kv.pushpull("valid-%s" % mode, z)
    third = outcome(lambda: bool(np.all(z.asnumpy() == want(6))))
    return {"first": first, "second": second, "third": third}


def free_functions() -> dict:
    """The same with the free functions (their chained stream is process-wide)."""
    x = mx.nd.ones((3,) if RANK == 0 else (4,))
    mxnet_mpi.allreduce_(x)
    y = value(5)
    mxnet_mpi.allreduce_(y)
    first = outcome(lambda: x.asnumpy())
    second = outcome(lambda: bool(np.all(y.asnumpy() == want(5))))
    return {"first": first, "second": second}


for name, fn in [("bad_out", bad_out), ("dtype_change", dtype_change),
                 ("engine_failure", engine_failure), ("failed_then_valid", failed_then_valid),
                 ("average_on_one_rank", average_on_one_rank)]:
    kv = mx.kv.create("mpi_" + mode)
    record[name] = fn(kv)
    mx.nd.waitall()
    kv.close()
record["free_functions"] = free_functions()
mx.nd.waitall()
with open(out_path % RANK if "%" in out_path else out_path + ".%d" % RANK, "w") as f:
    json.dump(record, f)
print("rank %d done" % RANK, flush=True)
