"""Open MPI transport defaults (mxnet_mpi/transport.py) and the netns cluster's
per-host cores: pure functions, no MPI."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mxnet_mpi import rank_children, shm_segments, transport
from mxnet_mpi.testing import netns


def test_defaults_fill_gaps_and_never_override_the_user():
    env = {"OMPI_MCA_btl_tcp_links": "1"}
    added = transport.apply(env)
    assert env["OMPI_MCA_btl_tcp_links"] == "1" and "OMPI_MCA_btl_tcp_links" not in added
    assert all(env[k] == v for k, v in added.items())
    empty: dict = {}
    assert transport.apply(empty, host=False, files=[]) == {k: v for k, (v, _) in
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
    # a default the user's parameter file sets is not put into the
    # environment, which would beat the file
    env = {}
    assert "OMPI_MCA_btl_tcp_links" not in transport.apply(env, files=[str(plain)])
    assert "OMPI_MCA_btl_tcp_links" not in env


def test_segments_go_to_a_directory_of_the_job_unless_one_is_chosen(tmp_path, monkeypatch):
    """A process started by Open MPI's mpirun keeps its shared-memory segment in
    a directory of its job's own, in /dev/shm where it is writable (else in its
    session directory), not in /dev/shm itself where two jobs' names can meet
    (tests/test_shm_segments.py)."""
    shm = tmp_path / "shm"
    shm.mkdir()
    session = tmp_path / "ompi.123" / "1" / "0"
    session.mkdir(parents=True)
    env = {"PMIX_SERVER_TMPDIR": "/tmp/ompi.123", "PMIX_NAMESPACE": "prterun-vm-123@1",
           "OMPI_FILE_LOCATION": str(session)}
    mine = Path(shm_segments.root(str(shm))) / "ompi.123.prterun-vm-123@1"
    assert mine.parent.name == "mxnet_mpi-%d-%s" % (os.getuid(), shm_segments.pid_namespace()) \
        or not shm_segments.pid_namespace()
    assert shm_segments.job_dir(env, str(shm)) == str(mine)
    assert shm_segments.job_dir(dict(env, PMIX_SERVER_TMPDIR="/tmp/prted.77"), str(shm)) == \
        str(mine.parent / "prted.77.prterun-vm-123@1")   # a daemon's host: its own pid
    assert shm_segments.job_dir(env, str(tmp_path / "none")) == str(session)  # no /dev/shm
    assert shm_segments.job_dir({}, str(shm)) is None                         # not from mpirun
    proc = transport.process_defaults
    got = proc(dict(env), files=[], shm=str(shm))
    assert list(got) == [transport.SM_DIR_VAR] and got[transport.SM_DIR_VAR][0] == str(mine)
    assert proc({}, files=[], shm=str(shm)) == {}
    for name in ("OMPI_MCA_btl_sm_backing_directory", "OMPI_MCA_btl_vader_backing_directory",
                 "OMPI_MCA_mca_base_param_files"):
        assert proc(dict(env, **{name: "/x"}), files=[], shm=str(shm)) == {}, name
    conf = tmp_path / "mca.conf"
    conf.write_text("btl_vader_backing_directory = /scratch\n")
    assert proc(dict(env), files=[str(conf)], shm=str(shm)) == {}
    # apply(): prepares the directory; this process only; the user's choice wins; the switch
    monkeypatch.setattr(transport, "_mca_files", lambda env: [])
    monkeypatch.setattr(transport, "process_defaults",
                        lambda env, files=None: proc(env, files, str(shm)))
    applied = dict(env)
    assert transport.apply(applied)[transport.SM_DIR_VAR] == str(mine) == \
        applied[transport.SM_DIR_VAR] and mine.is_dir()
    assert transport.SM_DIR_VAR not in transport.apply(dict(env), host=False)
    chosen = dict(env, OMPI_MCA_btl_sm_backing_directory="/dev/shm")
    transport.apply(chosen)
    assert chosen["OMPI_MCA_btl_sm_backing_directory"] == "/dev/shm"
    assert transport.apply(dict(env, MXNET_MPI_TRANSPORT_DEFAULTS="0")) == {}


def test_stale_job_directories_are_removed_and_running_ones_kept(tmp_path, monkeypatch):
    root = tmp_path / os.path.basename(shm_segments.root(str(tmp_path)))
    dead = subprocess.Popen(["true"])
    dead.wait()
    names = {"ended": "ompi.%d.prterun-vm-%d@1" % (dead.pid, dead.pid),
             "reused": "prted.%d.prterun-h0-9@1" % os.getpid(),   # a pid that is no daemon now
             "running": "ompi.4242.prterun-vm-4242@1", "other": "notes",
             # singletons: this process (kept), a reused pid, one that ended
             "alive": "single.%d.%s" % (os.getpid(), shm_segments.start_time(os.getpid())),
             "single reused": "single.%d.1" % os.getpid(),
             "single ended": "single.%d.5" % dead.pid}
    for name in names.values():
        (root / name).mkdir(parents=True)
        (root / name / "sm_segment.vm.0.1.0").write_text("")
    real = shm_segments.server_runs
    monkeypatch.setattr(shm_segments, "server_runs", lambda pid: pid == 4242 or real(pid))
    removed = shm_segments.remove_stale(str(tmp_path))
    assert sorted(removed) == sorted(str(root / names[k]) for k in (
        "ended", "reused", "single reused", "single ended"))
    assert sorted(p.name for p in root.iterdir()) == sorted([names["running"], "notes",
                                                            names["alive"]])
    assert not real(os.getpid()) and not real(dead.pid)


def test_a_singleton_gets_a_directory_only_while_mpi_starts(tmp_path):
    """Without mpirun (no PMIx namespace), the segment directory is set only
    around MPI's start, so processes started later do not inherit it."""
    shm = tmp_path / "shm"
    shm.mkdir()
    env: dict = {}
    with transport.singleton_segments(env, files=[], shm=str(shm)) as path:
        assert path == shm_segments.single_dir(shm=str(shm)) == env[transport.SM_DIR_VAR]
        assert os.path.isdir(path) and os.path.basename(path).startswith(
            "single.%d." % os.getpid())
    assert env == {}
    shm_segments.remove(path)
    assert not os.path.exists(path)
    for other in ({"PMIX_NAMESPACE": "prterun-vm-1@1"},           # mpirun's: job_dir
                  {"OMPI_MCA_btl_sm_backing_directory": "/x"},    # the user's choice
                  {"MXNET_MPI_TRANSPORT_DEFAULTS": "0"}):
        env = dict(other)
        with transport.singleton_segments(env, files=[], shm=str(shm)) as path:
            assert path is None and env == other
    with transport.singleton_segments({}, files=[], shm=str(tmp_path / "none")) as path:
        assert path is None                                        # no writable /dev/shm


SEGMENTS_IN_NEW_NAMESPACE = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("shm_segments", sys.argv[1])
seg = importlib.util.module_from_spec(spec)
spec.loader.exec_module(seg)
shm, dead = sys.argv[2], sys.argv[3]
print("REMOVED", seg.remove_stale(shm))
theirs = os.path.join(seg.root(shm), "ompi.%s.prterun-c2-%s@1" % (dead, dead))
os.makedirs(theirs)
print("ROOT", seg.root(shm))
"""


def test_each_pid_namespace_removes_only_its_own_stale_directories(tmp_path):
    """A pid names a process only in its pid namespace: processes in another
    one (a container sharing /dev/shm, `docker run --ipc=host`) get a
    directory root of their own, and neither side removes the other's."""
    if shutil.which("unshare") is None or not shm_segments.pid_namespace():
        pytest.skip("no unshare(1), or no /proc/self/ns/pid to tell namespaces apart")
    dead = subprocess.Popen(["true"])
    dead.wait()
    ours = tmp_path / os.path.basename(shm_segments.root(str(tmp_path))) / (
        "ompi.%d.prterun-c1-%d@1" % (dead.pid, dead.pid))
    ours.mkdir(parents=True)
    proc = subprocess.run(["unshare", "--pid", "--fork", sys.executable, "-c",
                           SEGMENTS_IN_NEW_NAMESPACE, shm_segments.__file__, str(tmp_path),
                           str(dead.pid)], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0 and "unshare" in proc.stderr:
        pytest.skip("no new pid namespace here: " + proc.stderr.strip())
    assert proc.returncode == 0, proc.stderr
    got = dict(ln.split(" ", 1) for ln in proc.stdout.splitlines())
    assert got["REMOVED"] == "[]" and ours.is_dir()          # ours left alone there
    theirs_root = Path(got["ROOT"])
    assert theirs_root.parent == tmp_path and theirs_root != ours.parent
    theirs = next(theirs_root.iterdir())
    assert shm_segments.remove_stale(str(tmp_path)) == [str(ours)]   # theirs left alone here
    assert theirs.is_dir() and not ours.exists()


IMPORT_PROBE = """
import json, os
import mxnet_mpi
from mxnet_mpi import transport
print(json.dumps({"on": transport.enabled(), "rdma": bool(transport.rdma_devices()),
                  "set": {k: os.environ.get(k) for k in [*transport.DEFAULTS, "OMPI_MCA_btl"]}}))
"""


def test_import_applies_them():
    """In a process whose environment has no Open MPI variables (the Makefile
    exports the defaults itself, so this test process proves nothing)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_MCA_")}
    proc = subprocess.run([sys.executable, "-c", IMPORT_PROBE], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if not got["on"]:
        pytest.skip("transport defaults switched off in this environment")
    for name, (value, _) in transport.DEFAULTS.items():
        assert got["set"][name] == value, (name, got)
    if not got["rdma"]:
        assert got["set"]["OMPI_MCA_btl"] == "^ofi", got


def test_own_cores_spreads_hosts_over_cores():
    assert netns.own_cores(2, [0, 1]) == ["0", "1"]
    assert netns.own_cores(2, [0, 1, 2, 3]) == ["0,2", "1,3"]
    assert netns.own_cores(4, [0, 1]) == ["0", "1", "0", "1"]


def test_a_process_started_by_a_rank_is_told_apart_from_ranks_mpirun_started():
    """Only a process that inherited the launch environment of another process
    of its own job and rank counts as started by that rank: not the rank
    itself (after an exec, same pid), not the ranks of a job that a rank
    launched with mpirun (another job), not a process outside mpirun."""
    if not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable /dev/shm here: no job directory to inherit")
    rank_env = {"PMIX_NAMESPACE": "prterun-h-10@1", "PMIX_RANK": "1",
                "PMIX_SERVER_URI41": "x", "OMPI_COMM_WORLD_RANK": "1", "OMPI_MCA_btl": "^ofi",
                "PMIX_SERVER_TMPDIR": "/tmp/ompi.10"}
    rank_env[transport.SM_DIR_VAR] = shm_segments.job_dir(rank_env)
    rank_children.mark(rank_env, pid=100)
    assert rank_children.started_by(dict(rank_env), pid=100) is None      # the rank, exec'd
    assert rank_children.started_by(dict(rank_env), pid=200) == 100      # its child
    nested = dict(rank_env, PMIX_NAMESPACE="prterun-h-300@1")             # a job it launched
    assert rank_children.started_by(nested, pid=400) is None
    assert rank_children.started_by({rank_children.MARK: "a:1:100"}, pid=5) is None
    child = dict(rank_env)
    removed = rank_children.detach(child)
    # a world of one: no launch variables, no segment directory of the rank's job;
    # the user's own Open MPI settings stay
    assert child == {"OMPI_MCA_btl": "^ofi"}, child
    assert transport.SM_DIR_VAR in removed and rank_children.MARK in removed


def test_the_first_process_to_start_mpi_as_a_rank_claims_it(tmp_path):
    """A process that a rank starts before the rank's own first store carries
    no mark; if it starts MPI first, the rank's own start crashed the job. Each
    process claims its rank in the rank's session directory as it starts MPI:
    the second live claimant is told the first's pid; an ended one's claim
    (a zombie's too) is taken over; outside mpirun nothing is claimed."""
    env = {"PMIX_NAMESPACE": "prterun-h-10@1", "PMIX_RANK": "0",
           rank_children.SESSION_VAR: str(tmp_path)}
    claim = tmp_path / rank_children.CLAIM
    assert rank_children.claim(env) is None and claim.read_text() == str(os.getpid())
    assert rank_children.claim(env) is None                       # its own: again
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        claim.write_text(str(holder.pid))
        assert rank_children.claim(env) == holder.pid               # running: refused
        assert rank_children.parent_of(holder.pid) == os.getpid()
        holder.kill()
        time.sleep(0.5)                                             # a zombie: not waited for
        assert rank_children.claim(env) is None and claim.read_text() == str(os.getpid())
    finally:
        holder.kill()
        holder.wait()
    assert rank_children.claim({rank_children.SESSION_VAR: str(tmp_path)}) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == [rank_children.CLAIM]


def test_a_process_started_by_a_rank_does_not_report_to_the_launcher_as_the_rank():
    """Under the launcher a rank's runner reports its start and end; a process
    that rank starts through the runner inherits the launcher's address and the
    rank's identity, and reporting as the rank would make the launcher end a
    healthy job when it exits. Only the rank reports."""
    import socket
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(20)
    port = server.getsockname()[1]
    base = {k: v for k, v in os.environ.items() if k != rank_children.MARK}
    base.update({"PMIX_NAMESPACE": "prterun-h-10@1", "PMIX_RANK": "0",
                 "OMPI_COMM_WORLD_RANK": "0", "MXNET_MPI_REPORT": "127.0.0.1:%d" % port})
    code = "from mxnet_mpi import report; report.started()"
    try:
        for mark, reports in ((None, True), ("prterun-h-10@1:0:1", False)):
            env = dict(base, **({rank_children.MARK: mark} if mark else {}))
            subprocess.run([sys.executable, "-c", code], env=env, timeout=60, check=True)
            server.settimeout(20 if reports else 1)
            try:
                conn, _ = server.accept()
                line = conn.makefile().readline()
                conn.close()
            except socket.timeout:
                line = ""
            assert line.startswith("start 0 ") == reports, (mark, line)
    finally:
        server.close()
