"""Process sets on hosts with uneven rank counts (host 0: ranks 0-2, host 1:
rank 3). {2, 3} spans hosts and {0, 1} does not; each set's members must
agree on that, since it picks the allreduce's route (point-to-point messages
across hosts, MPI's collective on one host). Judged from this host's share
of the world, rank 2 (whose host holds three ranks) would call {2, 3}
one-host and rank 3 across hosts.

Prints one JSON line per rank: how it judged its set, and whether the sums
(of each set, then of the world) were exact.
"""

import json

import mxnet as mx
import numpy as np

import mxnet_mpi
import mxnet_mpi.horovod as hvd
from mxnet_mpi import modes

hvd.init()
rank, size = hvd.rank(), hvd.size()
members = [0, 1] if rank < 2 else [2, 3]
sets = {tuple(m): hvd.add_process_set(m) for m in ([0, 1], [2, 3])}
comm = mxnet_mpi.world().split(0 if rank < 2 else 1)


def data(r: int) -> np.ndarray:
    return (np.arange(300000) % 1000 * (r + 1)).astype("float32")   # 1.2 MB, exact sums


got = hvd.allreduce(mx.nd.array(data(rank)), op=hvd.Sum, process_set=sets[tuple(members)])
world = hvd.allreduce(mx.nd.array(data(rank)), op=hvd.Sum)
print(json.dumps({
    "rank": rank, "members": members, "local_size": mxnet_mpi.local_size(),
    "spans_hosts": modes.spans_hosts(comm), "p2p_bytes": modes.p2p_bytes(comm),
    "set_exact": bool(np.array_equal(got.asnumpy(), sum(data(r) for r in members))),
    "world_exact": bool(np.array_equal(world.asnumpy(), sum(data(r) for r in range(size)))),
}), flush=True)
