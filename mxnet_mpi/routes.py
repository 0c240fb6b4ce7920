"""How a hybrid job's ranks reach the parameter servers: shared by the hybrid
stores and the launcher (which must not import MXNet to start ps-lite)."""

from __future__ import annotations

ROUTES = ("leader", "sharded")


def expected_ps_workers(route: str, world_size: int, num_groups: int) -> int:
    """DMLC_NUM_WORKER that a route needs."""
    return num_groups if route == "leader" else world_size
