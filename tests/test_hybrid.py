"""Hybrid stores dist_sync_mpi / dist_async_mpi: MPI allreduce inside groups, MXNet's
real ps-lite parameter server between groups, all started by mxnet_mpi.launch."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from launching import run as launch
from mpirun import SCRIPTS, run_mpi
from pool import run_pooled
from pslite import parameter_server, run_workers

SCRIPT = str(SCRIPTS / "hybrid_train.py")
STEPS = 5
N, GROUPS = 4, 2


def load(outdir, n=N):
    """[(weights, info)] per rank."""
    return [(dict(np.load(outdir / ("rank%d.npz" % r))),
             json.loads((outdir / ("rank%d.json" % r)).read_text())) for r in range(n)]


def assert_ranks_identical(ranks):
    w0 = ranks[0][0]
    assert len(w0) > 0
    for r, (w, _) in enumerate(ranks[1:], start=1):
        assert set(w) == set(w0)
        for key in sorted(w0):
            np.testing.assert_array_equal(w[key], w0[key], err_msg="rank %d at %s" % (r, key))


def assert_close(a, b, what, rtol=1e-4, atol=1e-5):
    assert set(a) == set(b) and len(a) > 0
    for key in sorted(a):
        np.testing.assert_allclose(a[key], b[key], rtol=rtol, atol=atol,
                                   err_msg="%s differ at %s" % (what, key))


def hybrid_run(tmp_path, name, kvstore, *args, route="leader", env=None):
    outdir = tmp_path / name
    launch(N, GROUPS, 1, [sys.executable, SCRIPT, "--kvstore", kvstore, "--outdir", str(outdir),
                          *args], "--route", route, env=env)
    return load(outdir)


def test_dist_sync_mpi_matches_mpi_and_dist_sync(tmp_path):
    """2 groups of 2 ranks (Trainer(kvstore='dist_sync_mpi') as a string) reach the
    weights of `mpi` on 4 ranks and of MXNet's own dist_sync with 4 workers.
    Ranks seed differently: they agree only through the store."""
    args = ["--steps", str(STEPS)]
    hyb = hybrid_run(tmp_path, "hyb", "dist_sync_mpi", *args)
    # update_on_kvstore=False: the servers only sum, every rank updates locally
    local = hybrid_run(tmp_path, "local", "dist_sync_mpi", *args,
                       env={"MXNET_UPDATE_ON_KVSTORE": "0"})
    run_mpi(SCRIPT, N, "--kvstore", "mpi", "--outdir", str(tmp_path / "mpi"), *args)
    mpi = load(tmp_path / "mpi")
    with parameter_server(num_workers=N) as env:
        # dist_sync broadcasts only at the first step: seed identically.
        run_workers(SCRIPT, N, ["--kvstore", "dist_sync", "--same-seed",
                                "--outdir", str(tmp_path / "dist"), *args], env)
    dist = load(tmp_path / "dist")

    for ranks in (hyb, local, mpi, dist):
        assert_ranks_identical(ranks)
    assert_close(hyb[0][0], mpi[0][0], "dist_sync_mpi and mpi", rtol=1e-5, atol=1e-6)
    assert_close(local[0][0], mpi[0][0], "dist_sync_mpi (local update) and mpi", rtol=1e-5,
                 atol=1e-6)
    assert_close(hyb[0][0], dist[0][0], "dist_sync_mpi and dist_sync")
    # it trained: the last weights are not the first (the comparisons above
    # would hold for stores that never update)
    moved = np.abs(hyb[0][0]["s%d_p0" % (STEPS - 1)] - hyb[0][0]["init_p0"]).max()
    assert moved > 1e-3, moved

    nkeys = len(hyb[0][1]["trainer_keys"])
    for rank, (_, info) in enumerate(hyb):
        assert info["type"] == "dist_sync_mpi" and info["num_groups"] == GROUPS
        assert info["group"] == rank // 2 and info["group_rank"] == rank % 2
        assert set(info["routes"].values()) == {"dense"}
        stats = info["stats"]
        assert stats["group_allreduce"] == stats["group_broadcast"] == STEPS * nkeys
        if info["group_rank"] == 0:   # the leader alone talks to the servers
            assert info["is_ps_worker"]
            assert stats["server_push_dense"] == stats["server_pull"] == STEPS * nkeys
        else:
            assert not info["is_ps_worker"]
            assert not any(k.startswith("server") for k in stats)



def test_gluon_multipliers_reach_the_servers(tmp_path):
    """Gluon's lr_mult/wd_mult live in the Trainer's param_dict, which MXNet's
    optimizer does not pickle: the servers (update_on_kvstore, the default)
    ignored them, as MXNet's dist stores do, so dist_sync_mpi silently left
    the trajectory of mpi. They now reach the servers."""
    args = ["--steps", "3", "--mults"]
    hyb = hybrid_run(tmp_path, "hyb", "dist_sync_mpi", *args)
    run_mpi(SCRIPT, N, "--kvstore", "mpi", "--outdir", str(tmp_path / "mpi"), *args)
    mpi = load(tmp_path / "mpi")
    assert_ranks_identical(hyb)
    assert_close(hyb[0][0], mpi[0][0], "dist_sync_mpi and mpi with multipliers", rtol=1e-5,
                 atol=1e-6)
    weights = hyb[0][0]
    assert (weights["s2_p1"] == weights["init_p1"]).all()   # lr_mult 0: never moves
    assert np.abs(weights["s2_p0"] - weights["init_p0"]).max() > 1e-4

@pytest.mark.parametrize("route", ["leader", "sharded"])
def test_dist_async_mpi_trains(tmp_path, route):
    steps = 30
    ranks = hybrid_run(tmp_path, "async", "dist_async_mpi", "--separable", "--lr", "0.02",
                       "--steps", str(steps),
                       route=route)
    nkeys = len(ranks[0][1]["trainer_keys"])
    pushes = {0: 0, 1: 0}
    for _, info in ranks:
        assert info["type"] == "dist_async_mpi" and info["route"] == route
        assert info["final_loss"] < 0.4, info
        assert info["final_loss"] < 0.5 * info["initial_loss"], info
        pushes[info["group"]] += info["stats"].get("server_push_dense", 0)
        if route == "sharded":   # every rank pushes its own half of the keys
            assert info["is_ps_worker"]
            assert info["stats"]["server_push_dense"] == steps * nkeys // 2
        else:
            assert info["is_ps_worker"] == (info["group_rank"] == 0)
        assert info["group_sum"] == [2.0, 2.0], info   # collectives over kv.comm
    # Each group pushed its sum of every key once per step.
    assert pushes == {0: steps * nkeys, 1: steps * nkeys}


@pytest.mark.parametrize("model", ["sparse", "sparse_weight"])
def test_sparse_embedding_through_server_dense_through_mpi(tmp_path, model):
    """An embedding plus dense layers in one Trainer ('sparse': Embedding with
    sparse_grad=True, dense weight; 'sparse_weight': SparseEmbedding, row_sparse
    weight pulled with row_sparse_pull). The embedding's row_sparse gradient goes
    to the server as row_sparse (lazy update there); dense gradients are summed
    by MPI in the group first. Weights are equal on all ranks and match one
    process training on the whole batch."""
    hyb = hybrid_run(tmp_path, model, "dist_sync_mpi", "--model", model, "--steps", str(STEPS))
    ref_dir = tmp_path / "ref"
    run_pooled(SCRIPT, 1, "--model", model, "--reference", str(N), "--outdir", str(ref_dir),
               "--steps", str(STEPS))
    ref = load(ref_dir, 1)[0][0]
    assert_ranks_identical(hyb)
    weights, info = hyb[0]
    assert_close(weights, ref, "dist_sync_mpi and one process")

    emb_name = next(n for n in info["param_names"] if "embedding" in n)
    emb = info["param_names"].index(emb_name)
    emb_key = str(info["trainer_keys"].index(emb_name))
    init, final = weights["init_p%d" % emb], weights["s%d_p%d" % (STEPS - 1, emb)]
    unused = 6   # the last rows never appear in the data
    np.testing.assert_array_equal(final[-unused:], init[-unused:])   # lazy: untouched rows
    assert np.all(np.abs(final[:-unused] - init[:-unused]).max(axis=1) > 0)

    nkeys = len(info["trainer_keys"])
    for _, rinfo in hyb:
        assert rinfo["routes"][emb_key] == "row_sparse"
        assert sum(v == "dense" for v in rinfo["routes"].values()) == nkeys - 1
        stats = rinfo["stats"]
        if rinfo["group_rank"] == 0:
            assert stats["server_push_row_sparse"] == STEPS
            assert stats["server_push_dense"] == STEPS * (nkeys - 1)
            # dense weight: pulled whole after each step; row_sparse weight:
            # the rows of each batch pulled at each forward
            assert stats["server_row_sparse_pull"] >= STEPS
        else:
            assert not any(k.startswith("server") for k in stats)


def test_module_fit_dist_sync_mpi(tmp_path):
    """Module.fit(kvstore='dist_sync_mpi'): optimizer on the servers, string keys."""
    script = str(SCRIPTS / "module_train.py")
    proc = launch(N, GROUPS, 1, [sys.executable, script, "--kvstore", "dist_sync_mpi",
                                 "--outdir", str(tmp_path / "hyb")])
    # as MXNet's dist_sync: gradients divided by batch size x workers
    assert proc.stdout.count("kvstore type dist_sync_mpi rescale_grad %r" % (1 / (8 * N))) == N
    run_pooled(script, 1, "--reference", str(N), "--outdir", str(tmp_path / "ref"))
    ref = dict(np.load(tmp_path / "ref" / "rank0.npz"))
    ranks = [(dict(np.load(tmp_path / "hyb" / ("rank%d.npz" % r))), None) for r in range(N)]
    assert_ranks_identical(ranks)
    assert_close(ranks[0][0], ref, "Module with dist_sync_mpi and one process")


def test_misconfiguration_errors():
    proc = run_pooled(str(SCRIPTS / "hybrid_errors.py"), 2, timeout=120)
    for case, text in [("no_ps_env", "DMLC_PS_ROOT_URI"), ("no_ps_env", "mxnet_mpi.launch"),
                       ("no_role", "runs on MPI ranks with DMLC_ROLE=worker, not unset"),
                       ("num_worker", "DMLC_NUM_WORKER=5"),
                       ("DMLC_PS_ROOT_PORT", "DMLC_PS_ROOT_PORT must be an integer from 1 to "
                                             "65535, got 'abc'"),
                       ("DMLC_NUM_SERVER", "DMLC_NUM_SERVER must be an integer from 1, got '0'"),
                       ("group_size", "group size 3 (from MXNET_MPI_GROUP_SIZE) does not "
                                      "divide the world size 2"),
                       ("sharded_sync", "dist_async_mpi only"),
                       ("bad_route", "unknown MXNET_MPI_HYBRID_ROUTE 'nearest'")]:
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ERR %s:" % case)]
        assert len(lines) == 2, proc.stdout          # both ranks
        assert all(text in ln for ln in lines), lines


def test_integer_arrays_are_refused_before_the_servers_abort():
    proc = launch(2, 2, 1, [sys.executable, str(SCRIPTS / "hybrid_int_keys.py")],
                  timeout=120)
    assert proc.stdout.count("REFUSED int32 True") == 2, proc.stdout[-3000:]
    assert proc.stdout.count("REFUSED uint8 True") == 2, proc.stdout[-3000:]
    assert proc.stdout.count("SUM [2.0, 2.0, 2.0]") == 2, proc.stdout[-3000:]


def test_server_keys_mix_int_and_str():
    """ps-lite takes one key type per process: the type used first keeps
    MXNet's numbers, the other is moved past OTHER_BASE, with a Module's
    idx2name (wd_mult of biases) moved along."""
    import mxnet as mx

    from mxnet_mpi.errors import MPIKVStoreError
    from mxnet_mpi.server_keys import OTHER_BASE, ServerKeys

    keys = ServerKeys("dist_sync_mpi")
    for k in ("fc1_weight", "fc1_bias", 0, 3, "fc2_weight"):
        keys.register(k)
    assert [keys.of(k) for k in ("fc1_weight", "fc1_bias", "fc2_weight")] == [0, 1, 2]
    assert keys.of(0) == OTHER_BASE and keys.of(3) == OTHER_BASE + 3
    opt = mx.optimizer.create("sgd", param_idx2name={0: "fc1_weight", 1: "fc1_bias"})
    assert keys.optimizer(opt) is opt          # str keys came first: MXNet's numbers
    ints = ServerKeys("dist_sync_mpi")
    for k in (0, 1, "fc1_weight", "fc1_bias"):
        ints.register(k)
    assert ints.of(1) == 1 and ints.of("fc1_bias") == OTHER_BASE + 1
    moved = ints.optimizer(opt)
    assert moved.idx2name == {OTHER_BASE: "fc1_weight", OTHER_BASE + 1: "fc1_bias"}
    assert moved._get_wd(OTHER_BASE + 1) == 0.0 and opt.idx2name == {0: "fc1_weight",
                                                                       1: "fc1_bias"}
    with pytest.raises(MPIKVStoreError, match="out of range"):
        ints.register(OTHER_BASE)


def test_no_scheduler_at_the_address_ends_named(tmp_path):
    """DMLC_* set by hand, with nothing listening at the scheduler's port (a
    wrong port or host, or fewer servers or workers than the scheduler
    expects): the ps-lite worker waited in the store's creation for good, with
    no word when every group is one rank. Now the stall warning names ps-lite's
    start-up and where it looks, and the job ends after the abort time."""
    import socket
    with socket.socket() as s:   # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port),
           "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "2", "DMLC_ROLE": "worker",
           "DMLC_NODE_HOST": "127.0.0.1", "MXNET_MPI_GROUP_SIZE": "1",
           "MXNET_MPI_STALL_WARN_S": "1", "MXNET_MPI_STALL_ABORT_S": "4"}
    script = tmp_path / "create.py"
    script.write_text("import mxnet as mx, mxnet_mpi\nmx.kv.create('dist_sync_mpi')\n"
                      "print('CREATED')\n")
    proc = run_mpi(str(script), 2, env=env, timeout=90, check=False)
    assert proc.returncode != 0 and "CREATED" not in proc.stdout
    where = "ps-lite's start-up (the scheduler at 127.0.0.1:%d, 1 server(s), 2 worker(s))" % port
    assert "stall warning: " + where in proc.stderr, proc.stderr[-3000:]
    assert where + " has waited more than MXNET_MPI_STALL_ABORT_S=4 s" in proc.stderr
