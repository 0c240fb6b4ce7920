"""Process sets on hosts with uneven rank counts (host 0: ranks 0-2, host 1:
rank 3). {2, 3} spans hosts and {0, 1} does not; each set's members must
agree on that, since it picks the allreduce's route (point-to-point messages
across hosts, MPI's collective on one host). Judged from this host's share
of the world, rank 2 (whose host holds three ranks) would call {2, 3}
one-host and rank 3 across hosts.

Prints one JSON line per rank: how it judged its set, whether the sums (of
each set, then of the world) were exact, and the free functions' route over
the world (which spans hosts) with whether their sum went in rank order.
"""

import json

import mxnet as mx
import numpy as np

import mxnet_mpi
import mxnet_mpi.horovod as hvd
from mxnet_mpi import collectives

hvd.init()
rank, size = hvd.rank(), hvd.size()
members = [0, 1] if rank < 2 else [2, 3]
sets = {tuple(m): hvd.add_process_set(m) for m in ([0, 1], [2, 3])}
comm = mxnet_mpi.world().split(0 if rank < 2 else 1)


def data(r: int) -> np.ndarray:
    return (np.arange(300000) % 1000 * (r + 1)).astype("float32")   # 1.2 MB, exact sums


def noise(r: int) -> np.ndarray:
    return np.random.default_rng(r).standard_normal(4099).astype("float32") * 1000


got = hvd.allreduce(mx.nd.array(data(rank)), op=hvd.Sum, process_set=sets[tuple(members)])
world = hvd.allreduce(mx.nd.array(data(rank)), op=hvd.Sum)
# The world spans hosts: the free functions (Horovod's global set) take the
# point-to-point route too, each element summed in rank order (inexact sums:
# MPI's own allreduce adds in another order and differs in the last bits)
fold = noise(0)
for r in range(1, size):
    fold = noise(r) + fold
in_order = hvd.allreduce(mx.nd.array(noise(rank)), op=hvd.Sum).asnumpy()
print(json.dumps({
    "rank": rank, "members": members, "local_size": mxnet_mpi.local_size(),
    "spans_hosts": collectives.spans_hosts(comm), "p2p_bytes": collectives.p2p_bytes(comm),
    "set_exact": bool(np.array_equal(got.asnumpy(), sum(data(r) for r in members))),
    "world_exact": bool(np.array_equal(world.asnumpy(), sum(data(r) for r in range(size)))),
    "world_p2p_bytes": getattr(collectives.stream_for(None), "p2p_bytes", None),
    "world_rank_order": bool(np.array_equal(in_order, fold)),
}), flush=True)
