"""Mismatches every rank must report, caught in-process so that many run in one job.

  python faults_caught.py MODE[,MODE...] SCENARIO[,SCENARIO...]
    shape   key 'w' has shape (3,) on rank 0 and (4,) elsewhere
    dtype   key 'w' is float32 on rank 0 and float64 elsewhere
    order   ranks push keys 'a' and 'b' (same shapes) in different orders
    ok      everything agrees (control)

Each (mode, scenario) gets a fresh store; after the error the same store must
still sum correctly. Prints one `CASE <json>` line per case and rank.
"""

import json
import sys
import time

import mxnet as mx

import mxnet_mpi


def scenario(kv, name: str, rank: int) -> None:
    if name == "shape":
        a = mx.nd.ones((3,) if rank == 0 else (4,))
        kv.pushpull("w", a)
        a.wait_to_read()
    elif name == "dtype":
        a = mx.nd.ones((3,), dtype="float32" if rank == 0 else "float64")
        kv.pushpull("w", a)
        a.wait_to_read()
    elif name == "order":
        a, b = mx.nd.ones((5,)), mx.nd.ones((5,))
        kv.pushpull("a", a)   # first use in a common order, so only the later order differs
        kv.pushpull("b", b)
        mx.nd.waitall()
        keys = ["a", "b"] if rank == 0 else ["b", "a"]
        kv.pushpull(keys[0], a)
        kv.pushpull(keys[1], b)
        mx.nd.waitall()
    elif name == "ok":
        a = mx.nd.ones((3,))
        kv.pushpull("w", a)
        assert a.asnumpy().tolist() == [mxnet_mpi.size()] * 3
    else:
        raise SystemExit("unknown scenario %r" % name)


def main() -> None:
    rank = mxnet_mpi.rank()
    for mode in sys.argv[1].split(","):
        for name in sys.argv[2].split(","):
            kv = mx.kv.create("mpi_" + mode)
            warm = mx.nd.ones((2,))
            kv.pushpull("warmup", warm)
            warm.wait_to_read()
            t0 = time.monotonic()
            error = None
            try:
                scenario(kv, name, rank)
            except mx.base.MXNetError as exc:   # MPIKVStoreError is one
                error = "%s: %s" % (type(exc).__name__, exc)
            took = time.monotonic() - t0
            after = mx.nd.ones((3,))
            kv.pushpull("after", after)
            print("CASE " + json.dumps({"rank": rank, "mode": mode, "scenario": name,
                                        "error": error, "seconds": took,
                                        "after": after.asnumpy().tolist()}), flush=True)
            kv.close()
    print("rank %d finished" % rank, flush=True)


if __name__ == "__main__":
    main()
