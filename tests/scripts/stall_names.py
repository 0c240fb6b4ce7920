"""Which ranks a stall warning names as missing, with several collectives in
flight: every rank pushes keys 0 and 1; on rank 2 key 0's input comes later
than key 1's (so its oldest collective in flight is key 1's, rank 0's is key
0's), and rank 1 pushes 4 s late. Each rank prints its sums."""

import time

import mxnet as mx

import mxnet_mpi

kv = mx.kv.create("mpi")
rank = mxnet_mpi.rank()
for k in range(2):
    kv.init(k, mx.nd.zeros((10,)))
mx.nd.waitall()
if rank == 1:
    time.sleep(4)
a = mx.nd.ones((10,))
if rank == 2:
    m = mx.nd.random.uniform(shape=(400, 400))
    for _ in range(20):
        m = mx.nd.dot(m, m) / 400.0
    a = a + 0 * m[0, :10]   # key 0's input waits for the slow ops
outs = [mx.nd.zeros((10,)) for _ in range(2)]
kv.pushpull(0, a, out=outs[0])
kv.pushpull(1, mx.nd.ones((10,)), out=outs[1])
mx.nd.waitall()
print("rank %d sums %s %s" % (rank, outs[0].asnumpy()[0], outs[1].asnumpy()[0]), flush=True)
