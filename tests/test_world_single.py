"""Without mpirun, `import mxnet_mpi` gives a world of size 1 whose collectives
leave values unchanged: in a fresh plain `python` process, and in this one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from mpirun import ROOT, SCRIPTS, python_path


def check(seen: dict) -> None:
    assert (seen["rank"], seen["size"]) == (0, 1)
    assert (seen["local_rank"], seen["local_size"]) == (0, 1)
    assert seen["world"] == [0, 0, 1]
    assert seen["kv"][:2] == [0, 1] and seen["kv"][2].startswith("mpi_")
    assert seen["problems"] == []


@pytest.mark.timeout(120)
def test_plain_python_process_is_a_world_of_one():
    # no trace of a launcher in the environment
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "PMI_"))}
    env["PYTHONPATH"] = python_path(env)
    proc = subprocess.run([sys.executable, str(SCRIPTS / "world_single.py")], env=env,
                          cwd=str(ROOT), capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout
    check(json.loads(lines[0][len("RESULT "):]))


def test_in_process_world_of_one():
    sys.path.insert(0, str(SCRIPTS))
    try:
        import world_single
    finally:
        sys.path.remove(str(SCRIPTS))
    check(world_single.observe())
