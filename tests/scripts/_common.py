"""Helpers shared by the scripts that tests/ runs under mpirun.

Every rank builds its data deterministically from (case, rank, device), so
every rank can compute the exact reference result with numpy. Values are
small integers, so sums are exact in any reduction order for every dtype.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

import numpy as np

DTYPES = ("float32", "float64", "float16", "uint8", "int32", "int8", "int64")

# Offsets that a narrower type than the declared one cannot hold exactly:
# a float32 path for float64, or a 32-bit path for int64, changes the sum.
_OFFSET = {"float64": 2 ** 30 + 1, "int64": 2 ** 40 + 3}


def modulus(dtype: str) -> int:
    return 8 if dtype in ("float16", "uint8", "int8") else 1000


def data(case: int, rank: int, dev: int, shape, dtype: str) -> np.ndarray:
    """Integer-valued data of `dtype` for one (case, rank, device)."""
    n = int(np.prod(shape, dtype=np.int64))
    m = modulus(dtype)
    v = (np.arange(n, dtype=np.int64) * (2 * rank + 3) + case * 7 + dev * 5 + rank) % m
    if dtype != "uint8":
        v -= m // 2
    v += _OFFSET.get(dtype, 0)
    return v.reshape(shape).astype(dtype)


def total(case: int, size: int, ndev: int, shape, dtype: str) -> np.ndarray:
    """The exact sum of data() over `size` ranks and `ndev` devices."""
    acc = np.zeros(shape, dtype=np.int64)
    for r in range(size):
        for d in range(ndev):
            acc = acc + data(case, r, d, shape, dtype).astype(np.int64)
    return acc.astype(dtype)


def summary(e: BaseException) -> str:
    """The informative line of an exception's message (MXNet's span many lines)."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    named = [ln for ln in lines if "Error:" in ln]
    return (named or lines or [""])[-1][:400]


def small_net_and_data(rank: int):
    """A two-layer Gluon net initialised differently on each rank (the store
    broadcasts rank 0's), and 8 rows of this rank's data and labels."""
    import mxnet as mx
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(4, activation="relu", in_units=3), mx.gluon.nn.Dense(2, in_units=4))
    net.initialize(mx.init.Constant(0.1 * (rank + 1)))
    rng = np.random.RandomState(rank)
    return net, mx.nd.array(rng.randn(8, 3)), mx.nd.array(rng.randn(8, 2))


def gluon_step(net, trainer, x, y, update_path: bool = False) -> None:
    """One squared-error step of 8 rows: trainer.step, or allreduce_grads then
    update."""
    import mxnet as mx
    with mx.autograd.record():
        loss = ((net(x) - y) ** 2).sum()
    loss.backward()
    if update_path:
        trainer.allreduce_grads()
        trainer.update(8)
    else:
        trainer.step(8)


class Results:
    """Per-section outcome of one rank, written as JSON for the test to read."""

    def __init__(self, out_dir: str, rank: int) -> None:
        self.path = os.path.join(out_dir, "rank%d.json" % rank)
        self.rank = rank
        self.sections: dict = {}
        self.failures: list = []

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            self.failures.append(what)

    def equal(self, got, want, what: str) -> None:
        """Exact comparison of an NDArray (or numpy array) with a numpy reference."""
        got = got.asnumpy() if hasattr(got, "asnumpy") else np.asarray(got)
        if got.shape != want.shape or got.dtype != want.dtype:
            self.failures.append("%s: got shape %s dtype %s, want shape %s dtype %s"
                                 % (what, got.shape, got.dtype, want.shape, want.dtype))
        elif not np.array_equal(got, want):
            bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
            self.failures.append("%s: %d of %d elements differ, first at %d: got %r want %r"
                                 % (what, bad.size, got.size, bad[0], got.reshape(-1)[bad[0]],
                                    want.reshape(-1)[bad[0]]))

    def run(self, name: str, fn, *args) -> None:
        """Run one section; record OK, or FAIL with mismatches or the exception."""
        import mxnet as mx
        self.failures = []
        error = None
        start = time.process_time(), time.monotonic()
        try:
            fn(self, *args)
            mx.nd.waitall()
        except Exception as e:  # noqa: BLE001 - reported to the test, not swallowed
            error = summary(e)
            if not error.startswith(type(e).__name__):
                error = "%s: %s" % (type(e).__name__, error)
            traceback.print_exc(file=sys.stderr)
            try:
                mx.nd.waitall()
            except Exception as e2:  # noqa: BLE001
                error += " (then waitall: %s)" % str(e2)[:200]
        status = "OK" if error is None and not self.failures else "FAIL"
        self.sections[name] = {"status": status, "error": error,
                               "failures": self.failures[:20],
                               "n_failures": len(self.failures),
                               # where a slow suite spends its time
                               "cpu_s": round(time.process_time() - start[0], 3),
                               "wall_s": round(time.monotonic() - start[1], 3)}
        print("rank %d section %s %s %s" % (self.rank, name, status,
                                             error or self.failures[:3] or ""), flush=True)

    def write(self, **extra) -> None:
        with open(self.path, "w") as f:
            json.dump({"rank": self.rank, "sections": self.sections, **extra}, f, indent=1)
