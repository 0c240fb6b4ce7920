"""The order in which the ranks pair a Trainer's parameters.

A Trainer's keys are positions in its parameter list, and MXNet's Trainer
orders a dict of parameters by name. Gluon names come from per-process
counters: a block created on some ranks only (an evaluation helper on rank 0)
shifts them, and sorted names can then pair different layers on two ranks.
Where their shapes agree, nothing fails: every sum mixes two layers' gradients
and the ranks drift apart, exit 0. So the ranks compare their names first.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Sequence

import numpy as np

from .collectives import RankTable
from .errors import MPIKVStoreError


def _digest(names: Sequence[str]) -> int:
    blob = "\0".join(sorted(names)).encode()
    return int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "little", signed=True)


def agreed_order(items: Sequence[tuple[str, Any]],
                 table: Callable[[np.ndarray, str], RankTable]) -> tuple[list, bool]:
    """The values of `items` ((name, value) in the caller's order: a dict's
    insertion order, which the same program builds alike on every rank) in the
    order every rank pairs them (collective: `table` gives every rank's row).
    Where every rank has the same names: sorted by name, as MXNet's Trainer
    orders a dict. Otherwise (Gluon's name counters differ between the ranks)
    rank 0's sorted order, carried to the other ranks by position in `items`;
    rank 0's order is MXNet's either way, so its checkpoints of optimizer
    states keep their meaning. Also returns whether the names agree."""
    names = [str(name) for name, _ in items]
    by_name = sorted(range(len(names)), key=names.__getitem__)
    seen = table(np.array([_digest(names), len(names)], dtype=np.int64), "parameter names")
    if (seen.rows[:, 0] == seen.rows[0, 0]).all() and (seen.rows[:, 1] == len(names)).all():
        return [items[i][1] for i in by_name], True
    counts = seen.rows[:, 1]
    if (counts != counts[0]).any():
        raise MPIKVStoreError(
            "mxnet_mpi: the ranks give the Trainer different numbers of parameters "
            "(rank: parameters) %s; every rank must train the same parameters"
            % ", ".join("%d: %d" % (r, n) for r, n in zip(seen.ranks, counts)))
    first = table(np.array(by_name, dtype=np.int64), "parameter order (names differ)").rows[0]
    return [items[int(i)][1] for i in first], False
