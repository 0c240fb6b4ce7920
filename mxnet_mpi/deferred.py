"""Gluon parameters that wait for deferred initialisation on some ranks only.

A layer whose input size comes from the first forward has no shape until then.
When some ranks initialised it already (a forward pass, or a checkpoint loaded
on rank 0 only) and others did not, the ranks would broadcast different
parameters, and at different times; settle_deferred initialises it on the
others first, with the shape of a rank that has one.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .collectives import RankTable


def settle_deferred(params: Sequence, table: Callable[[np.ndarray, str], RankTable]) -> None:
    """Make each Gluon parameter of `params` initialised on every rank or
    waiting for deferred initialisation on every rank (collective: `table`
    gives every rank's row): one that some ranks initialised already (a
    forward pass or a load on rank 0 only, before the Trainer) takes, on the
    others, the shape of the lowest rank that has it and is initialised now;
    the broadcast that follows gives it the root's values everywhere. Without
    this the ranks would broadcast different parameters, now and at their
    first forward."""
    waiting = [1 if p._data is None and p._deferred_init else 0 for p in params]
    ndims = [len(p.shape or ()) for p in params]
    flags_table = table(np.array(waiting + [max(ndims, default=0)], dtype=np.int64),
                        "parameters waiting for deferred initialisation")
    rows = flags_table.rows
    flags, ranks = rows[:, :-1], len(flags_table.ranks)
    mixed = [i for i in range(len(params)) if 0 < flags[:, i].sum() < ranks]
    if not mixed:
        return
    width = 1 + int(rows[:, -1].max())     # ndim, then the dimensions
    row = np.zeros((len(mixed), width), dtype=np.int64)
    for k, i in enumerate(mixed):
        if not waiting[i]:
            shape = params[i].shape
            row[k, 0], row[k, 1:1 + len(shape)] = len(shape), shape
    shapes = table(row.ravel(), "shapes of parameters initialised on some ranks only"
                   ).rows.reshape(ranks, len(mixed), width)
    for k, i in enumerate(mixed):
        if waiting[i]:
            source = int(np.flatnonzero(flags[:, i] == 0)[0])
            n = int(shapes[source, k, 0])
            params[i].shape = tuple(int(d) for d in shapes[source, k, 1:1 + n])
            # without a hook of a broadcast at initialisation (on_deferred_init,
            # horovod's): the caller's broadcast follows, from one root for all
            vars(params[i]).pop("_init_impl", None)
            params[i]._finish_deferred_init()
