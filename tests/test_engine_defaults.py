"""MXNet's engine segments and optimizer groups in MPI jobs
(_mxnet_mpi_autoload.engine_defaults): the rule alone, then what real
processes get, with and without mpirun."""

import json

from mpirun import run_mpi, run_single

from _mxnet_mpi_autoload import (
    AGGREGATION_VAR,
    FORWARD_SEGMENT_VAR,
    SEGMENT_VAR,
    engine_defaults,
    optimizer_defaults,
)

ONE_EACH = {SEGMENT_VAR: "1", FORWARD_SEGMENT_VAR: "1", AGGREGATION_VAR: "1"}


def test_one_op_segments_and_updates_only_in_jobs_of_several_ranks_and_the_user_wins():
    for job in ({"OMPI_COMM_WORLD_SIZE": "2"}, {"PMI_SIZE": "8"},
                {"MV2_COMM_WORLD_SIZE": "3"}):
        env = dict(job)
        assert engine_defaults(env) == ONE_EACH and env == dict(job, **ONE_EACH)
        env = dict(job)
        assert optimizer_defaults(env) == {AGGREGATION_VAR: "1"} and len(env) == 2
    for alone in ({}, {"OMPI_COMM_WORLD_SIZE": "1"}, {"PMI_SIZE": "many"}):
        env = dict(alone)
        assert engine_defaults(env) == {} and optimizer_defaults(env) == {} and env == alone
    job = {"OMPI_COMM_WORLD_SIZE": "2"}
    # each of the user's settings leaves alone what it covers, and only that
    for user, left in (({SEGMENT_VAR: "15"}, [SEGMENT_VAR]),
                       ({FORWARD_SEGMENT_VAR: "4"}, [FORWARD_SEGMENT_VAR]),
                       ({"MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN": "4"},
                        [SEGMENT_VAR, FORWARD_SEGMENT_VAR]),
                       ({AGGREGATION_VAR: "4"}, [AGGREGATION_VAR])):
        env = dict(job, **user)
        mine = {k: v for k, v in ONE_EACH.items() if k not in left}
        assert engine_defaults(env) == mine and env == dict(job, **user, **mine), user


def _ranks(proc) -> list:
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def test_gradients_ready_weights_used_and_updates_done_as_each_arrives_in_an_mpi_job():
    # tests/scripts/engine_defaults.py: per configuration, ms between two
    # moments; 'default' with the process's own defaults, the other key the
    # control with MXNet's (15 ops per segment, SGD's group of 4 parameters)
    hooked = _ranks(run_mpi("engine_defaults.py", 2))
    first = _ranks(run_mpi("engine_defaults.py", 2, "package-first",
                           env={"MXNET_MPI_AUTOLOAD": "0"}))
    assert len(hooked) == len(first) == 1, (hooked, first)   # rank 0 prints
    for r in hooked + first:
        assert r["env"] == ONE_EACH, r
        # backward: each gradient ready when its op ends, not its segment
        b = r["backward"]
        assert b["mxnet15"] < 1.0 and b["default"] > max(2.0, 10 * b["mxnet15"]), r
        # forward: seven layers ran while the eighth's weight was on its
        # way; with one segment the whole forward waited for it
        f = r["forward"]
        assert f["default"] < 0.5 * f["mxnet15"], f
        # updates: the first parameter's did not wait for the fourth's gradient
        u = r["update"]
        assert u["grouped"] > 0.6 * u["hold"] and u["default"] < 0.3 * u["hold"], r
    # mxnet imported first with the hook off: too late for the segments, in
    # time for the optimizer, which reads its group size when it is created
    late = _ranks(run_mpi("engine_defaults.py", 2, "mxnet-first",
                          env={"MXNET_MPI_AUTOLOAD": "0"}))
    assert len(late) == 1, late
    assert late[0]["env"] == dict.fromkeys(ONE_EACH, None) | {AGGREGATION_VAR: "1"}, late
    u = late[0]["update"]
    assert u["grouped"] > 0.6 * u["hold"] and u["default"] < 0.3 * u["hold"], late
    # one process, no MPI job: MXNet's defaults stay
    alone = _ranks(run_single("engine_defaults.py"))
    assert len(alone) == 1 and alone[0]["env"] == dict.fromkeys(ONE_EACH), alone
    assert alone[0]["backward"]["default"] < 1.0, alone
