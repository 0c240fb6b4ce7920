"""The staging path of device arrays (per-key pinned buffers reused across
steps, large arrays in pipelined chunks), checked on CPU by staging host and
cpu_pinned arrays as GPU arrays would be (MXNET_MPI_FORCE_STAGING=1, 4 KB
chunks): exact sums, one collective per chunk, no allocation after the first
step, failures that leave the chunks paired, and a Trainer on staged grads."""

import re

import pytest
from pool import run_pooled

ENV = {"MXNET_MPI_FORCE_STAGING": "1", "MXNET_MPI_STAGE_CHUNK_BYTES": "4096"}
CHECKS = {"exact_every_step", "chunk_collectives", "buffers_reused", "failure_everywhere",
          "exact_after_failure", "trainer_staged"}


@pytest.mark.parametrize("mode", ["chained", "funneled", "concurrent"])
def test_staged_chunks_exact_and_reused(mode):
    proc = run_pooled("staging_run.py", 2, mode, env=ENV, timeout=120)
    results = re.findall(r"CHECK (\S+) (ok|FAIL)(.*)", proc.stdout)
    assert {name for name, _, _ in results} == CHECKS, proc.stdout
    assert len(results) == 2 * len(CHECKS)
    failed = [r for r in results if r[1] != "ok"]
    assert not failed, failed


def test_chunk_sizes_follow_the_setting(monkeypatch):
    from mxnet_mpi import staging
    monkeypatch.setenv(staging.CHUNK_ENV, "4096")
    assert staging.chunk_sizes((5000,), "float32") == [1024] * 4 + [904]
    assert staging.chunk_sizes((2, 3), "float64") == [6]
    assert staging.chunk_sizes((0,), "float32") == [0]
    monkeypatch.delenv(staging.CHUNK_ENV)
    assert staging.chunk_sizes((4 << 20,), "float32") == [1 << 20] * 4   # 4 MiB chunks
