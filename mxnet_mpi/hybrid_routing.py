"""How the hybrid stores split the MPI world into groups and route keys
between the groups' MPI collectives and the parameter servers: the group size
and route from the settings, the ps-lite environment they need, which rank of
a group owns (pushes and pulls) each key, and the group and world collectives.
"""

from __future__ import annotations

import os
import zlib

import mxnet as mx
import numpy as np

from . import _native, ops, settings
from .collectives import Call
from .errors import MPIKVStoreError
from .routes import ROUTES, expected_ps_workers  # noqa: F401  (the launcher imports routes alone)
from .world import Communicator, local_size
from .world import init as init_world

GROUP_SIZE_ENV = "MXNET_MPI_GROUP_SIZE"
ROUTE_ENV = "MXNET_MPI_HYBRID_ROUTE"
LAUNCH_HINT = ("; start the job with `python -m mxnet_mpi.launch -n N --groups G --servers S "
               "-- python train.py`: it starts ps-lite and sets every DMLC_* variable (S >= 1; "
               "--servers 0 starts no ps-lite, for pure MPI stores such as 'mpi')")


def world_sum(world: Communicator, values: list) -> np.ndarray:
    """Blocking sum of small int64 `values` over the world (construction-time checks)."""
    arr = mx.nd.array(np.asarray(values, dtype=np.int64), dtype="int64")
    ops.allreduce_(arr, name="mpi_hybrid:check", comm=world)
    return arr.asnumpy()


def resolve_group_size(world: Communicator | None = None) -> int:
    """Ranks per group: $MXNET_MPI_GROUP_SIZE, else the ranks on this host.

    Collective over the world when the default is used (every rank must see
    the same local size). Raises MPIKVStoreError unless it divides the world."""
    world = world if world is not None else init_world()
    size = settings.get(GROUP_SIZE_ENV)
    if size is not None:
        source = GROUP_SIZE_ENV
    else:
        size = local_size()
        total, squares = world_sum(world, [size, size * size])
        if total * total != world.size * squares:  # equal iff all local sizes agree
            raise MPIKVStoreError(
                "hosts run different numbers of ranks, so the default group (one per host) "
                "is ambiguous: set %s" % GROUP_SIZE_ENV)
        source = "the ranks per host (%s unset)" % GROUP_SIZE_ENV
    if world.size % size:
        raise MPIKVStoreError("group size %d (from %s) does not divide the world size %d"
                              % (size, source, world.size))
    return size


def route_from_env() -> str:
    """'leader' or 'sharded' from $MXNET_MPI_HYBRID_ROUTE (default 'leader')."""
    return settings.get(ROUTE_ENV)


class GroupRouting:
    """Groups, owners and the group/world collectives of a HybridKVStore (a
    part of it)."""

    def _check_ps_env(self, world_size: int) -> None:
        missing = [v for v in ("DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER",
                               "DMLC_NUM_WORKER") if not os.environ.get(v)]
        if missing:
            raise MPIKVStoreError("kvstore '%s' needs MXNet's parameter server, but %s %s "
                                  "unset%s" % (self.type, ", ".join(missing),
                                               "is" if len(missing) == 1 else "are",
                                               LAUNCH_HINT))
        role = os.environ.get("DMLC_ROLE")
        if role != "worker":
            raise MPIKVStoreError("kvstore '%s' runs on MPI ranks with DMLC_ROLE=worker, "
                                  "not %s" % (self.type, "unset" if role is None else repr(role)))
        # ps-lite takes these as they come: a port 'abc' or 0 servers waited for
        # good or failed deep inside it, naming no variable
        for name, low, high in (("DMLC_PS_ROOT_PORT", 1, 65535), ("DMLC_NUM_SERVER", 1, None),
                                ("DMLC_NUM_WORKER", 1, None)):
            value = os.environ[name].strip()
            if not value.isdigit() or int(value) < low or (high and int(value) > high):
                raise MPIKVStoreError("kvstore '%s': %s must be an integer from %d%s, got %r%s"
                                      % (self.type, name, low, " to %d" % high if high else "",
                                         os.environ[name], LAUNCH_HINT))
        want = expected_ps_workers(self._route_name, world_size, self._num_groups)
        got = os.environ["DMLC_NUM_WORKER"].strip()
        if got != str(want):
            raise MPIKVStoreError(
                "DMLC_NUM_WORKER=%s, but route '%s' with %d group(s) of %d rank(s) has %d "
                "ps-lite worker(s)%s" % (got, self._route_name, self._num_groups,
                                         self._group_size, want, LAUNCH_HINT))

    @property
    def group(self) -> int:
        """Index of this rank's group."""
        return self._group_id

    @property
    def num_groups(self) -> int:
        """Number of groups (= ps-lite workers with route 'leader')."""
        return self._num_groups

    @property
    def group_rank(self) -> int:
        """Rank inside the group (0 = the leader)."""
        return self._comm.rank

    @property
    def group_size(self) -> int:
        """Ranks per group."""
        return self._group_size

    @property
    def route(self) -> str:
        """'leader' or 'sharded': who pushes to and pulls from the servers."""
        return self._route_name

    @property
    def is_ps_worker(self) -> bool:
        """Whether this rank talks to the parameter server."""
        return self._is_ps_worker

    def owner(self, key) -> int:
        """Group rank that pushes/pulls `key` (0 with route 'leader')."""
        own = self._owners.get(key)
        if own is None:
            if self._route_name == "leader":
                own = 0
            elif isinstance(key, int):
                own = key % self._group_size
            else:
                own = zlib.crc32(str(key).encode()) % self._group_size
            self._owners[key] = own
        return own

    def _owns(self, key) -> bool:
        return self._comm.rank == self.owner(key)

    def _group_broadcast(self, key, arr, priority: int) -> None:
        self._collective(_native.BROADCAST, "group broadcast", key, arr, arr, priority,
                         root=self.owner(key))
        self.stats["group_broadcast"] += 1

    def _group_allreduce(self, key, src, dst, priority: int) -> None:
        self._collective(_native.ALLREDUCE, "allreduce", key, src, dst, priority)
        self.stats["group_allreduce"] += 1

    def _world_broadcast(self, key, arr, priority: int = 0) -> None:
        # Over the whole world (initial weights come from world rank 0).
        desc = "world broadcast key=%r shape=%s %s" % (key, tuple(arr.shape), np.dtype(arr.dtype))
        self._world_stream.push([Call(_native.BROADCAST, [arr], [arr], dtype=arr.dtype,
                                      shapes=[arr.shape], desc=desc, label="key %r" % (key,),
                                      priority=priority, name=self._keys.name(key))],
                                self._context)
