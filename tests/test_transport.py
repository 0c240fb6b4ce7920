"""Open MPI transport defaults (mxnet_mpi/transport.py) and the netns cluster's
per-host cores: pure functions, no MPI."""

import os

from mxnet_mpi import transport
from mxnet_mpi.testing import netns


def test_defaults_fill_gaps_and_never_override_the_user():
    env = {"OMPI_MCA_btl_tcp_links": "1"}
    added = transport.apply(env)
    assert env["OMPI_MCA_btl_tcp_links"] == "1" and "OMPI_MCA_btl_tcp_links" not in added
    assert all(env[k] == v for k, v in added.items())
    empty: dict = {}
    assert transport.apply(empty, host=False) == {k: v for k, (v, _) in
                                                  transport.DEFAULTS.items()}
    off = {"MXNET_MPI_TRANSPORT_DEFAULTS": "0"}
    assert transport.apply(off) == {} and set(off) == {"MXNET_MPI_TRANSPORT_DEFAULTS"}


def test_ofi_btl_left_out_only_without_rdma_and_without_a_btl_list(tmp_path, monkeypatch):
    """Open MPI's OFI BTL finds nothing to use without an RDMA device, and its
    probe costs every MPI start about a second: left out there, unless the
    user chose BTLs (environment or parameter file)."""
    ofi = {"OMPI_MCA_btl": "^ofi"}
    plain = tmp_path / "plain.conf"
    plain.write_text("# btl = tcp\nbtl_tcp_links = 2\n")
    chosen = tmp_path / "chosen.conf"
    chosen.write_text("btl_base_verbose = 0\n btl = self,tcp\n")
    host = transport.host_defaults
    assert {k: v for k, (v, _) in host({}, devices=[], files=[str(plain)]).items()} == ofi
    assert host({}, devices=["/sys/class/infiniband/mlx5_0"], files=[]) == {}
    assert host({}, devices=[], files=[str(plain), str(chosen)]) == {}
    assert host({"OMPI_MCA_btl": "self,sm"}, devices=[], files=[]) == {}
    assert host({"OMPI_MCA_mca_base_param_files": "/etc/x.conf"}, devices=[], files=[]) == {}
    # apply(): the user's list wins; the launcher leaves the choice to each host
    env = {"OMPI_MCA_btl": "self,tcp"}
    assert "OMPI_MCA_btl" not in transport.apply(env) and env["OMPI_MCA_btl"] == "self,tcp"
    assert "OMPI_MCA_btl" not in transport.apply({}, host=False)
    monkeypatch.setattr(transport, "rdma_devices", lambda: [])
    monkeypatch.setattr(transport, "_mca_files", lambda env: [str(plain)])
    assert transport.apply({})["OMPI_MCA_btl"] == "^ofi"


def test_segment_goes_to_the_mpirun_session_unless_a_directory_is_chosen(tmp_path, monkeypatch):
    """A process started by Open MPI's mpirun keeps its shared-memory segment in
    its own session directory (job-unique, removed by mpirun), not in /dev/shm
    where two jobs' names can meet (tests/test_shm_segments.py)."""
    session = tmp_path / "ompi.123" / "1" / "0"
    session.mkdir(parents=True)
    own = {"OMPI_FILE_LOCATION": str(session)}
    proc = transport.process_defaults
    got = proc(dict(own), files=[])
    assert list(got) == [transport.SM_DIR_VAR] and got[transport.SM_DIR_VAR][0] == str(session)
    assert proc({}, files=[]) == {}                                       # not under mpirun
    assert proc({"OMPI_FILE_LOCATION": str(tmp_path / "gone")}, files=[]) == {}
    for name in ("OMPI_MCA_btl_sm_backing_directory", "OMPI_MCA_btl_vader_backing_directory",
                 "OMPI_MCA_mca_base_param_files"):
        assert proc(dict(own, **{name: "/x"}), files=[]) == {}, name
    conf = tmp_path / "mca.conf"
    conf.write_text("btl_vader_backing_directory = /scratch\n")
    assert proc(dict(own), files=[str(conf)]) == {}
    # apply(): this process only, the user's choice wins, the switch turns it off
    monkeypatch.setattr(transport, "_mca_files", lambda env: [])
    env = dict(own)
    assert transport.apply(env)[transport.SM_DIR_VAR] == str(session) == env[transport.SM_DIR_VAR]
    assert transport.SM_DIR_VAR not in transport.apply(dict(own), host=False)
    mine = dict(own, OMPI_MCA_btl_sm_backing_directory="/dev/shm")
    transport.apply(mine)
    assert mine["OMPI_MCA_btl_sm_backing_directory"] == "/dev/shm"
    assert transport.apply(dict(own, MXNET_MPI_TRANSPORT_DEFAULTS="0")) == {}


def test_import_applied_them_here():
    import mxnet_mpi  # noqa: F401
    if not transport.enabled():
        return   # switched off in this environment
    for name in transport.DEFAULTS:
        assert name in os.environ
    if not transport.rdma_devices():   # ours or the user's BTL list
        assert "OMPI_MCA_btl" in os.environ


def test_own_cores_spreads_hosts_over_cores():
    assert netns.own_cores(2, [0, 1]) == ["0", "1"]
    assert netns.own_cores(2, [0, 1, 2, 3]) == ["0,2", "1,3"]
    assert netns.own_cores(4, [0, 1]) == ["0", "1", "0", "1"]
