"""The order in which the ranks pair a Trainer's parameters.

A Trainer's keys are positions in its parameter list, and MXNet's Trainer
orders a dict of parameters by name. Gluon names come from per-process
counters: a block created on some ranks only (an evaluation helper on rank 0)
shifts them, and sorted names can then pair different layers on two ranks.
Where their shapes agree, nothing fails: every sum mixes two layers' gradients
and the ranks drift apart, exit 0. A list of parameters in another order on
some rank does the same. So the ranks compare their names first.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Sequence

import numpy as np

from .collectives import RankTable
from .errors import MPIKVStoreError


def _digest(names: Sequence[str]) -> int:
    """A 64-bit digest of `names` in their order."""
    blob = "\0".join(names).encode()
    return int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "little", signed=True)


def agreed_order(items: Sequence[tuple[str, Any]],
                 table: Callable[[np.ndarray, str], RankTable],
                 by_name: bool = True) -> tuple[list, bool]:
    """The values of `items` ((name, value) in the caller's order: a dict's
    insertion order or a list's, which the same program builds alike on every
    rank) in the order every rank pairs them (collective: `table` gives every
    rank's row). The order asked for is sorted by name with `by_name` (as
    MXNet's Trainer orders a dict), else the caller's (a list). Where every
    rank has the same names in that order, it stands. The same names in other
    orders (a list built differently on some rank) follow rank 0's, by name.
    Different names (Gluon's name counters differ between the ranks): rank 0's
    order, carried to the other ranks by position in `items`. Rank 0's order
    is the one asked for either way, so its checkpoints of optimizer states
    keep their meaning. Also returns whether the names agree."""
    names = [str(name) for name, _ in items]
    order = sorted(range(len(names)), key=names.__getitem__) if by_name \
        else list(range(len(names)))
    in_order = _digest([names[i] for i in order])
    row = [in_order if by_name else _digest(sorted(names)), in_order, len(names)]
    seen = table(np.array(row, dtype=np.int64), "parameter names")
    rows = seen.rows
    counts = rows[:, 2]
    if (counts != counts[0]).any():
        raise MPIKVStoreError(
            "mxnet_mpi: the ranks give the Trainer different numbers of parameters "
            "(rank: parameters) %s; every rank must train the same parameters"
            % ", ".join("%d: %d" % (r, n) for r, n in zip(seen.ranks, counts)))
    same_names = bool((rows[:, 0] == rows[0, 0]).all())
    if same_names and (rows[:, 1] == rows[0, 1]).all():
        return [items[i][1] for i in order], True
    if same_names and len(set(names)) == len(names):
        ids = [_digest([names[i]]) for i in order]
        first = table(np.array(ids, dtype=np.int64), "parameter order (by name)").rows[0]
        mine = {h: i for i, h in zip(order, ids)}
        return [items[mine[int(h)]][1] for h in first], True
    first = table(np.array(order, dtype=np.int64), "parameter order (names differ)").rows[0]
    return [items[int(i)][1] for i in first], same_names
