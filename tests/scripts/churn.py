"""Store churn: create and drop stores and gluon Trainers again and again;
threads and memory must stay flat (stores free their threads and
communicators when closed or collected).

  mpirun -np 2 python churn.py MODE CYCLES     (MODE 'all': the modes in turn)
prints "CHURN threads A -> B rss_mb C -> D" after a warm-up of 20 cycles.
"""

import gc
import os
import sys
import time

import mxnet as mx

import mxnet_mpi  # noqa: F401

mode, cycles = sys.argv[1], int(sys.argv[2])
MODES = ["chained", "funneled", "concurrent"] if mode == "all" else [mode]
a = mx.nd.ones((100,))
x = mx.nd.ones((4, 3))


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def cycle(i: int) -> None:
    store = "mpi_" + MODES[(i // 3) % len(MODES)]   # each mode gets each kind of cycle
    if i % 3 == 0:  # a store, dropped
        kv = mx.kv.create(store)
        kv.pushpull(0, a)
        a.wait_to_read()
    elif i % 3 == 1:  # a store closed by a with block
        with mx.kv.create(store) as kv:
            kv.pushpull(0, a)
            a.wait_to_read()
    else:  # a Trainer that owns its store, dropped with it
        net = mx.gluon.nn.Dense(2, in_units=3)
        net.initialize()
        trainer = mx.gluon.Trainer(net.collect_params(), "sgd", kvstore=store)
        with mx.autograd.record():
            loss = net(x).sum()
        loss.backward()
        trainer.step(4)
        net.weight.data().wait_to_read()


def settle() -> None:
    gc.collect()
    time.sleep(0.5)  # stores still finishing a collective close a moment later


for i in range(20):
    cycle(i)
settle()
t0, m0 = threads(), rss_mb()
for i in range(cycles):
    cycle(i)
settle()
print("CHURN threads %d -> %d rss_mb %.1f -> %.1f" % (t0, threads(), m0, rss_mb()), flush=True)
