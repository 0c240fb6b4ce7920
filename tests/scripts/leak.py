"""10,000 collectives in a loop must not grow resident memory.
Prints the RSS growth in MB between collective 2,000 and 12,000."""

import sys

import mxnet as mx

import mxnet_mpi  # noqa: F401


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


kv = mx.kv.create("mpi_" + sys.argv[1])
arrs = [mx.nd.ones((256,)) for _ in range(10)]
out = mx.nd.zeros((256,))


def burst(n):
    for i in range(n):
        k = i % len(arrs)
        if i % 3 == 0:
            kv.broadcast(k, arrs[k], out=out)
        else:
            kv.pushpull(k, arrs[k], out=out)
        if i % 100 == 0:
            mx.nd.waitall()
    mx.nd.waitall()


burst(2000)
before = rss_mb()
burst(10000)
print("RSS_GROWTH_MB %.2f" % (rss_mb() - before), flush=True)
