"""A hybrid store with local updates (update_on_kvstore=False: the servers
only sum), 2 groups of 1 rank:

- weights set on the last rank only (another group than rank 0's) are refused
  at the next step on every rank, compared over the whole world; prints
  `REFUSED <first line>` (or `NOT REFUSED`), then `WEIGHTS <digest>` after
  check_consistency's broadcast and a step;
- heads that only some ranks' batches use, with ignore_stale_grad=True:
  `HEADS <digest> used moved True unused still True`;
- a second hybrid store after close() is refused (ps-lite lets a process join
  the parameter server once): `REOPEN <first line>` (or `REOPEN no error`).
"""

import hashlib

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import mxnet_mpi

rank, size = mxnet_mpi.rank(), mxnet_mpi.size()
net = gluon.nn.Sequential()
net.add(gluon.nn.Dense(2, in_units=3))
for _ in range(3):   # heads: see below
    net.add(gluon.nn.Dense(1, in_units=3, use_bias=False))
net.initialize(mx.init.Constant(0.1 * (rank + 1)))
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "wd": 0.1},
                        kvstore="dist_sync_mpi", update_on_kvstore=False)
x = mx.nd.array(np.random.RandomState(rank).randn(4, 3))


def digest(arrays) -> str:
    return hashlib.sha256(b"".join(a.asnumpy().tobytes() for a in arrays)).hexdigest()


def step() -> None:
    with autograd.record():
        loss = sum((block(x) ** 2).sum() for block in net)
    loss.backward()
    trainer.step(4)
    mx.nd.waitall()


step()
if rank == size - 1:
    net[0].weight.set_data(mx.nd.full((2, 3), 5.0))
try:
    step()
except mxnet_mpi.MPIKVStoreError as e:
    print("REFUSED %s" % str(e).splitlines()[0], flush=True)
else:
    print("NOT REFUSED", flush=True)
mxnet_mpi.check_consistency(trainer, action="broadcast")
step()
print("WEIGHTS %s" % digest(p.data() for p in net.collect_params().values()), flush=True)

# rank r's batch uses head r only; the body and the third head no rank's
before = [h.weight.data().asnumpy().copy() for h in net[1:]]
for _ in range(2):
    with autograd.record():
        loss = net[1 + rank % 2](x).sum()
    loss.backward()
    trainer.step(4, ignore_stale_grad=True)
after = [h.weight.data().asnumpy() for h in net[1:]]
print("HEADS %s used moved %s unused still %s" % (
    digest(p.data() for p in net.collect_params().values()),
    all((a != b).all() for a, b in zip(after[:2], before[:2])),
    bool((after[2] == before[2]).all())), flush=True)

trainer._kvstore.close()
try:
    mx.kv.create("dist_sync_mpi")
except mxnet_mpi.MPIKVStoreError as e:
    print("REOPEN %s" % str(e).splitlines()[0], flush=True)
else:
    print("REOPEN no error", flush=True)
