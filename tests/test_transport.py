"""Open MPI transport defaults (mxnet_mpi/transport.py) and the netns cluster's
per-host cores: pure functions, no MPI."""

from mxnet_mpi import transport
from mxnet_mpi.testing import netns


def test_defaults_fill_gaps_and_never_override_the_user():
    env = {"OMPI_MCA_btl_tcp_links": "1"}
    added = transport.apply(env)
    assert env["OMPI_MCA_btl_tcp_links"] == "1" and "OMPI_MCA_btl_tcp_links" not in added
    assert all(env[k] == v for k, v in added.items())
    empty: dict = {}
    assert transport.apply(empty) == {k: v for k, (v, _) in transport.DEFAULTS.items()}
    off = {"MXNET_MPI_TRANSPORT_DEFAULTS": "0"}
    assert transport.apply(off) == {} and set(off) == {"MXNET_MPI_TRANSPORT_DEFAULTS"}


def test_import_applied_them_here():
    import os

    import mxnet_mpi  # noqa: F401
    if not transport.enabled():
        return   # switched off in this environment
    for name in transport.DEFAULTS:
        assert name in os.environ


def test_own_cores_spreads_hosts_over_cores():
    assert netns.own_cores(2, [0, 1]) == ["0", "1"]
    assert netns.own_cores(2, [0, 1, 2, 3]) == ["0,2", "1,3"]
    assert netns.own_cores(4, [0, 1]) == ["0", "1", "0", "1"]
