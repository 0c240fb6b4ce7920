"""Bad input to the MPI kvstore: each must raise MPIKVStoreError naming the problem,
identically on every rank, and leave the store usable.

Importable (tests/test_bad_input.py runs CASES in-process, world of size 1)
and runnable as `mpirun -np N python bad_input.py OUT_DIR`, which writes
OUT_DIR/rank<r>.json with each case's exception and message, and whether a
correct pushpull right after it still gave the exact sum.
"""

from __future__ import annotations

import json
import os
import sys

import mxnet as mx
import numpy as np

import mxnet_mpi

SUPPORTED = ("float32", "float64", "float16", "uint8", "int32", "int8", "int64")


def f32(shape, value=1.0, ctx=None):
    return mx.nd.full(shape, value, ctx=ctx or mx.cpu(0), dtype="float32")


def create_with_mode_env(kv):
    old = os.environ.get("MXNET_MPI_MODE")
    os.environ["MXNET_MPI_MODE"] = "bogus"
    try:
        mx.kv.create("mpi")
    finally:
        if old is None:
            del os.environ["MXNET_MPI_MODE"]
        else:
            os.environ["MXNET_MPI_MODE"] = old


def reuse_shape(kv):
    kv.pushpull("reused", f32((2, 2)))  # fine: first use fixes the layout
    kv.pushpull("reused", f32((4,)))


def reuse_dtype(kv):
    kv.pushpull("reused-dtype", f32((3,)))
    kv.pushpull("reused-dtype", mx.nd.ones((3,), dtype="int32"))


def push_with_optimizer_no_init(kv):
    store = mx.kv.create("mpi")
    store.set_optimizer(mx.optimizer.SGD(learning_rate=0.1))
    store.push("no-init-opt", f32((2,)))


def save_states_without_optimizer(kv):
    kv.save_optimizer_states(os.devnull)


# (name, words the message must contain, call that must raise)
def _dense():
    net = mx.gluon.nn.Dense(2, in_units=3)
    net.initialize(mx.init.One())
    return net


def update_without_allreduce(kv):
    """Trainer.update with no allreduce_grads before it: each rank would
    apply its own gradients (the ranks drifted apart with no error)."""
    net = _dense()
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=kv)
    with mx.autograd.record():
        loss = net(f32((4, 3))).sum()
    loss.backward()
    trainer.update(4)


CASES = [
    ("dtype_bool", ["dtype bool", "supported dtypes", *SUPPORTED],
     lambda kv: kv.pushpull("bool", mx.nd.array([1, 0], dtype=np.bool_))),
    ("update_without_allreduce", ["Trainer.update without Trainer.allreduce_grads()",
                                  "drift apart"], update_without_allreduce),
    ("step_of_zero_samples", ["Trainer.step(0)", "mxnet_mpi.join(trainer)"],
     lambda kv: mx.gluon.Trainer(_dense().collect_params(), "sgd", kvstore=kv).step(0)),
    ("dtype_bool_out", ["out 0", "dtype bool"],
     lambda kv: kv.pushpull("bool-out", f32((2,)), out=mx.nd.array([1, 0], dtype=np.bool_))),
    ("dtype_bool_broadcast", ["dtype bool"],
     lambda kv: kv.broadcast("bool-b", mx.nd.array([1, 0], dtype=np.bool_),
                             out=mx.nd.array([1, 0], dtype=np.bool_))),
    ("row_sparse_value", ["row_sparse", "dist_sync", "dense"],
     lambda kv: kv.pushpull("rsp", mx.nd.zeros((4, 2), stype="row_sparse"))),
    ("csr_value", ["csr", "dist_sync"],
     lambda kv: kv.pushpull("csr", mx.nd.zeros((4, 2), stype="csr"))),
    ("row_sparse_out", ["out 0", "row_sparse", "dist_sync"],
     lambda kv: kv.pushpull("rsp-out", f32((4, 2)),
                            out=mx.nd.zeros((4, 2), stype="row_sparse"))),
    ("row_sparse_init", ["row_sparse", "dist_sync"],
     lambda kv: kv.init("rsp-init", mx.nd.zeros((4, 2), stype="row_sparse"))),
    ("row_sparse_pull", ["row_sparse_pull", "dist_sync"],
     lambda kv: kv.row_sparse_pull("rsp-pull", out=mx.nd.zeros((4, 2), stype="row_sparse"),
                                   row_ids=mx.nd.array([0]))),
    ("pull_never_initialised", ["never initialised", "'never-init'", "init"],
     lambda kv: kv.pull("never-init", out=f32((3,)))),
    ("pull_never_initialised_int", ["never initialised", "12345"],
     lambda kv: kv.pull(12345, out=f32((3,)))),
    ("pull_without_out", ["pull needs `out`"],
     lambda kv: kv.pull("whatever")),
    ("out_shape", ["shape", "(2, 3)", "(3, 2)", "out 0"],
     lambda kv: kv.pushpull("out-shape", f32((3, 2)), out=f32((2, 3)))),
    ("out_shape_second_of_list", ["out 1", "shape"],
     lambda kv: kv.pushpull("out-shape2", f32((3,)), out=[f32((3,)), f32((4,))])),
    ("out_dtype", ["dtype", "float64", "float32", "out 0"],
     lambda kv: kv.pushpull("out-dtype", f32((3,)),
                            out=mx.nd.zeros((3,), dtype="float64"))),
    ("pull_out_shape", ["shape", "(5,)"],
     lambda kv: (kv.init("pull-shape", f32((4,))), kv.pull("pull-shape", out=f32((5,))))),
    ("broadcast_out_dtype", ["dtype", "int32"],
     lambda kv: kv.broadcast("b-dtype", f32((3,)), out=mx.nd.zeros((3,), dtype="int32"))),
    ("key_reused_other_shape", ["'reused'", "first used", "(2, 2)", "(4,)"], reuse_shape),
    ("key_reused_other_dtype", ["'reused-dtype'", "first used", "int32"], reuse_dtype),
    ("device_values_differ", ["value 1", "shape"],
     lambda kv: kv.pushpull("devs", [f32((3,)), f32((4,), ctx=mx.cpu(1))])),
    ("no_values", ["no value"], lambda kv: kv.pushpull("empty-list", [])),
    ("numpy_value", ["must be an mxnet NDArray", "ndarray"],
     lambda kv: kv.pushpull("np", np.ones((3,), dtype=np.float32))),
    ("numpy_out", ["out 0", "must be an mxnet NDArray"],
     lambda kv: kv.pushpull("np-out", f32((3,)), out=np.ones((3,), dtype=np.float32))),
    ("python_scalar_value", ["must be an mxnet NDArray", "float"],
     lambda kv: kv.pushpull("scalar", 1.0)),
    ("float_key", ["keys must be int or str", "1.5"],
     lambda kv: kv.pushpull(1.5, f32((3,)))),
    ("numpy_int_key", ["keys must be int or str", "int64"],
     lambda kv: kv.pushpull(np.int64(7), f32((3,)))),
    ("bool_key", ["keys must be int or str", "True"],
     lambda kv: kv.pushpull(True, f32((3,)))),
    ("none_key", ["keys must be int or str", "None"],
     lambda kv: kv.pushpull(None, f32((3,)))),
    ("float_key_in_list", ["keys must be int or str", "2.5"],
     lambda kv: kv.pushpull(["fine-key", 2.5], [f32((3,)), f32((3,))])),
    ("keys_values_mismatch", ["2 keys", "3 values"],
     lambda kv: kv.pushpull(["a", "b"], [f32((1,)), f32((1,)), f32((1,))])),
    ("unknown_mode_env", ["unknown mxnet_mpi mode", "'bogus'", "MXNET_MPI_MODE",
                          *mxnet_mpi.MODES],
     create_with_mode_env),
    ("broadcast_without_out", ["broadcast needs `out`", "'b-noout'"],
     lambda kv: kv.broadcast("b-noout", f32((3,)), out=None)),
    ("broadcast_two_values", ["one value per key"],
     lambda kv: kv.broadcast("b-two", [f32((3,)), f32((3,), ctx=mx.cpu(1))], out=f32((3,)))),
    ("set_optimizer_string", ["set_optimizer expects", "str"],
     lambda kv: kv.set_optimizer("sgd")),
    ("save_states_no_optimizer", ["no optimizer set", "set_optimizer"],
     save_states_without_optimizer),
    ("push_optimizer_no_init", ["init", "'no-init-opt'"], push_with_optimizer_no_init),
    ("unknown_capability", ["unknown capability", "'bogus'"],
     lambda kv: kv.is_capable("bogus")),
    ("gradient_compression", ["gradient compression"],
     lambda kv: kv.set_gradient_compression({"type": "2bit"})),
]

# keys above whose shape is known to the store, with the layout to use after
_AFTER_SAME_KEY = {"key_reused_other_shape": ("reused", (2, 2)),
                   "key_reused_other_dtype": ("reused-dtype", (3,)),
                   "out_shape": ("out-shape", (3, 2)),
                   "out_dtype": ("out-dtype", (3,)),
                   "dtype_bool": ("bool", (2,)),
                   "float_key_in_list": ("fine-key", (3,)),
                   "device_values_differ": ("devs", (3,))}


def store_still_works(kv, rank: int, size: int, name: str, count: int) -> str:
    """A correct pushpull after an error: '' if exact, else what went wrong."""
    problems = []
    key, shape = _AFTER_SAME_KEY.get(name, ("after-%s" % name, (5,)))
    a = f32(shape, rank + count)
    outs = [f32(shape, -1), f32(shape, -1, ctx=mx.cpu(1))]
    kv.pushpull(key, a, out=outs)
    want = sum(r + count for r in range(size))
    for i, out in enumerate(outs):
        got = out.asnumpy()
        if got.shape != shape or not np.all(got == want):
            problems.append("pushpull(%r) after the error gave %s in out[%d], want %s"
                            % (key, got, i, want))
    b = f32((2,), rank + 1)
    kv.broadcast("bcast-after-%s" % name, b, out=b)
    if not np.all(b.asnumpy() == 1):
        problems.append("broadcast after the error gave %s" % b.asnumpy())
    return "; ".join(problems)


def run_case(kv, fn):
    """The exception `fn(kv)` raised, or None."""
    try:
        fn(kv)
    except Exception as e:  # noqa: BLE001 - returned to the caller to check
        return e
    finally:
        mx.nd.waitall()
    return None


def main() -> None:
    from mpi4py import MPI
    out_dir = sys.argv[1]
    kv = mx.kv.create("mpi")
    rank, size = kv.rank, kv.num_workers
    results = []
    for count, (name, words, fn) in enumerate(CASES):
        e = run_case(kv, fn)
        results.append({
            "name": name, "words": words,
            "type": type(e).__name__ if e is not None else None,
            "is_mpikv": isinstance(e, mxnet_mpi.MPIKVStoreError),
            "is_mxnet": isinstance(e, mx.base.MXNetError),
            "is_value": isinstance(e, ValueError),
            "message": str(e) if e is not None else None,
            "after": store_still_works(kv, rank, size, name, count),
        })
    messages = MPI.COMM_WORLD.allgather([r["message"] for r in results])
    for r in results:
        r["same_on_all_ranks"] = all(m[results.index(r)] == r["message"] for m in messages)
    with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as f:
        json.dump({"rank": rank, "size": size, "cases": results}, f, indent=1)
    print("rank %d: %d cases done" % (rank, len(results)), flush=True)


if __name__ == "__main__":
    main()
