"""MXNet's backward segments in MPI jobs (_mxnet_mpi_autoload.engine_defaults):
the rule alone, then what real processes get, with and without mpirun."""

import json

from mpirun import run_mpi, run_single

from _mxnet_mpi_autoload import SEGMENT_VAR, engine_defaults

ONE_OP = {SEGMENT_VAR: "1"}


def test_segments_of_one_op_only_in_jobs_of_several_ranks_and_the_user_wins():
    for job in ({"OMPI_COMM_WORLD_SIZE": "2"}, {"PMI_SIZE": "8"},
                {"MV2_COMM_WORLD_SIZE": "3"}):
        env = dict(job)
        assert engine_defaults(env) == ONE_OP and env == dict(job, **ONE_OP)
    for alone in ({}, {"OMPI_COMM_WORLD_SIZE": "1"}, {"PMI_SIZE": "many"}):
        env = dict(alone)
        assert engine_defaults(env) == {} and env == alone
    for user in ({SEGMENT_VAR: "15"}, {"MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN": "4"}):
        env = dict(user, OMPI_COMM_WORLD_SIZE="2")
        assert engine_defaults(env) == {} and env == dict(user, OMPI_COMM_WORLD_SIZE="2")


def _ranks(proc) -> list:
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def test_each_gradient_is_ready_when_its_op_ends_in_an_mpi_job():
    # 'default': ms between two layers' weight gradients becoming ready with
    # the process's own default; 'mxnet15': with MXNet's 15 ops per segment on
    # the block, where both come out of one segment together (the control)
    hooked = _ranks(run_mpi("backward_segments.py", 2))
    first = _ranks(run_mpi("backward_segments.py", 2, "package-first",
                           env={"MXNET_MPI_AUTOLOAD": "0"}))
    for r in hooked + first:
        assert r["env"] == "1", r
        assert r["mxnet15"] < 1.0 and r["default"] > max(2.0, 10 * r["mxnet15"]), r
    assert len(hooked) == len(first) == 2
    # one process, no MPI job: MXNet's default stays
    alone = _ranks(run_single("backward_segments.py"))
    assert len(alone) == 1 and alone[0]["env"] is None, alone
    assert alone[0]["default"] < 1.0, alone
