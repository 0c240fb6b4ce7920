"""mxnet_mpi.horovod's collectives with Horovod's semantics; prints CHECK lines."""

import mxnet as mx
import numpy as np

import mxnet_mpi.horovod as hvd

hvd.init()
R, N = hvd.rank(), hvd.size()


def check(name, ok, detail=""):
    print("CHECK %s %s %s" % (name, "ok" if ok else "FAIL", detail), flush=True)


x = mx.nd.array(np.arange(4, dtype=np.float32) + R)
total = sum(np.arange(4, dtype=np.float32) + r for r in range(N))
check("is_initialized", hvd.is_initialized() and 0 <= hvd.local_rank() < hvd.local_size())
check("allreduce_averages_by_default", np.allclose(hvd.allreduce(x).asnumpy(), total / N))
check("average_false_sums", np.array_equal(hvd.allreduce(x, average=False).asnumpy(), total))
check("op_sum", np.array_equal(hvd.allreduce(x, op=hvd.Sum).asnumpy(), total))
check("pre_post_scale", np.allclose(hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0,
                                                  postscale_factor=0.5).asnumpy(), total))
y = x.copy()
hvd.allreduce_(y, op=hvd.Sum)
check("allreduce_inplace", np.array_equal(y.asnumpy(), total))
outs = hvd.grouped_allreduce([x, mx.nd.ones((2, 2)) * (R + 1)])
check("grouped_allreduce", np.allclose(outs[0].asnumpy(), total / N) and
      np.allclose(outs[1].asnumpy(), sum(r + 1 for r in range(N)) / N))
g = hvd.allgather(mx.nd.ones((R + 1, 2)) * R)
check("allgather", g.shape == (N * (N + 1) // 2, 2) and
      np.array_equal(g.asnumpy()[:, 0], np.concatenate([[r] * (r + 1) for r in range(N)])))
a = hvd.alltoall(mx.nd.array(np.repeat(np.arange(N, dtype=np.float32)[:, None] + 10 * R, 2,
                                       axis=1)))
check("alltoall", np.array_equal(a.asnumpy()[:, 0], np.array([R + 10 * s for s in range(N)])))
b = hvd.broadcast(mx.nd.ones((3,)) * R, root_rank=N - 1)
check("broadcast", np.array_equal(b.asnumpy(), np.full(3, N - 1.0)))
try:
    hvd.allreduce(x, op=hvd.Adasum)
    check("adasum_refused", False)
except NotImplementedError:
    check("adasum_refused", True)
params = {"w": mx.nd.ones((2,)) * (R + 5)}
hvd.broadcast_parameters(params, root_rank=0)
check("broadcast_parameters_dict", np.array_equal(params["w"].asnumpy(), [5.0, 5.0]))
print("rank %d done" % R, flush=True)
