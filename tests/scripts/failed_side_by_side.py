"""Many collectives failing at once on the store's own threads, then exact
again: rank N-1 gives a wrong-shaped `out` for every key of one pushpull of
KEYS keys, so the other ranks' lanes (concurrent, MXNET_MPI_LARGE_LANES) or
negotiator (funneled) fail them side by side while MXNet's workers pass the
errors on to the readers. Each round drains the errors, then checks a sum.

  mpirun -np 2 python failed_side_by_side.py MODE ROUNDS KEYS

Prints "DONE <rank> <rounds> <errors drained>".
"""

import sys

import mxnet as mx

import mxnet_mpi

mode, rounds, nkeys = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
kv = mx.kv.create("mpi_" + mode)
R, N = kv.rank, kv.num_workers
keys, n = ["k%d" % i for i in range(nkeys)], 50000
drained = 0
for _ in range(rounds):
    values = [mx.nd.ones((n,)) for _ in keys]
    outs = [mx.nd.zeros((n - 1 if R == N - 1 else n,)) for _ in keys]
    try:
        kv.pushpull(keys, values, out=outs)
        readers = [o * 2 for o in outs]   # ops the engine fails with the error
    except mxnet_mpi.MPIKVStoreError:
        pass
    for _ in range(1000):
        try:
            mx.nd.waitall()
            break
        except mxnet_mpi.MPIKVStoreError:
            drained += 1
    good = [mx.nd.ones((n,)) for _ in keys]
    kv.pushpull(keys, good)
    assert all(g.asnumpy().min() == g.asnumpy().max() == N for g in good)
print("DONE %d %d %d" % (R, rounds, drained), flush=True)
