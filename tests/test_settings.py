"""The settings table (mxnet_mpi/settings.py): the only reader of MXNET_MPI_*,
listed once in docs/settings.md, validated with errors that name the
variable, and passed to every store, the free functions' store 0 included."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys

import pytest
from mpirun import ROOT, python_path

from mxnet_mpi import settings
from mxnet_mpi.errors import MPIKVStoreError

NAME = re.compile(r"MXNET_MPI_[A-Z0-9_]*[A-Z0-9]")


def test_docs_list_the_table():
    page = (ROOT / "docs" / "settings.md").read_text()
    assert page.count(settings.markdown()) == 1, \
        "docs/settings.md is out of date: paste `python tools/settings_table.py` into it"
    assert page.count("| variable | default | meaning |") == 1


def environment_reads(tree) -> list:
    """MXNET_MPI_* names that `tree` reads from the environment itself
    (environ.get/[...]/setdefault, getenv, `in environ`), by literal or by a
    name bound to the literal anywhere in the module."""
    consts = {t.id: n.value.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
              and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
              for t in n.targets if isinstance(t, ast.Name)}

    def name(node):
        value = consts.get(node.id) if isinstance(node, ast.Name) else \
            node.value if isinstance(node, ast.Constant) else None
        return value if isinstance(value, str) and value.startswith("MXNET_MPI_") else None

    def is_environ(node):
        return isinstance(node, ast.Attribute) and node.attr == "environ" or \
            isinstance(node, ast.Name) and node.id == "environ"

    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and n.args:
            f = n.func
            if (isinstance(f, ast.Attribute) and f.attr in ("get", "setdefault", "pop")
                    and is_environ(f.value)) or \
                    (isinstance(f, ast.Attribute) and f.attr == "getenv") or \
                    (isinstance(f, ast.Name) and f.id == "getenv"):
                found.append(name(n.args[0]))
        elif isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load) and is_environ(n.value):
            found.append(name(n.slice))
        elif isinstance(n, ast.Compare) and any(is_environ(c) for c in n.comparators):
            found.append(name(n.left))
    return [f for f in found if f]


def test_only_the_table_reads_the_environment():
    sources = sorted((ROOT / "mxnet_mpi").rglob("*.py")) + [ROOT / "_mxnet_mpi_autoload.py"]
    for path in sources:
        text = path.read_text()
        for name in NAME.findall(text):
            assert name in settings.BY_NAME, "%s mentions %s, which is not in the table" % (
                path.name, name)
        if path.name in ("settings.py", "_mxnet_mpi_autoload.py"):
            continue   # the hook runs before the package can be imported
        for name in environment_reads(ast.parse(text)):
            pytest.fail("%s reads %s itself; use settings.get" % (path.name, name))


def test_the_environment_check_sees_reads_through_a_name():
    reads = environment_reads(ast.parse(
        "import os\nENV = 'MXNET_MPI_X'\nos.environ.get(ENV)\nos.getenv('MXNET_MPI_Y')\n"
        "os.environ['MXNET_MPI_Z']\n'MXNET_MPI_W' in os.environ\nos.environ[ENV] = '1'\n"
        "os.environ.get('OTHER')\n"))
    assert sorted(reads) == ["MXNET_MPI_W", "MXNET_MPI_X", "MXNET_MPI_Y", "MXNET_MPI_Z"]


@pytest.mark.parametrize("name,raw,text", [
    ("MXNET_MPI_CHUNK_BYTES", "16M", "MXNET_MPI_CHUNK_BYTES must be an integer, got '16M'"),
    ("MXNET_MPI_FUSION_BYTES", "-1", "MXNET_MPI_FUSION_BYTES must be >= 0, got '-1'"),
    ("MXNET_MPI_LARGE_LANES", "0", "MXNET_MPI_LARGE_LANES must be >= 1, got '0'"),
    ("MXNET_MPI_COMM_NICE", "20", "MXNET_MPI_COMM_NICE must be <= 19, got '20'"),
    ("MXNET_MPI_COMM_NICE", "-21", "MXNET_MPI_COMM_NICE must be >= -20, got '-21'"),
    ("MXNET_MPI_STALL_WARN_S", "soon", "MXNET_MPI_STALL_WARN_S must be a number, got 'soon'"),
    # 0 would call every wait a stall (warn) or abort every healthy job at its start
    ("MXNET_MPI_STALL_WARN_S", "0", "MXNET_MPI_STALL_WARN_S must be >= 1, got '0'"),
    ("MXNET_MPI_STALL_ABORT_S", "0.5", "MXNET_MPI_STALL_ABORT_S must be >= 1, got '0.5'"),
    ("MXNET_MPI_STALL_ABORT_S", "nan", "MXNET_MPI_STALL_ABORT_S must be a finite number, "
                                       "got 'nan'"),
    ("MXNET_MPI_HEALTH_INTERVAL_S", "inf", "MXNET_MPI_HEALTH_INTERVAL_S must be a finite "
                                           "number, got 'inf'"),
    # what ctypes would wrap, MPI counts overflow, or threads run out on
    ("MXNET_MPI_CHUNK_BYTES", "99999999999999999999", "MXNET_MPI_CHUNK_BYTES must be <= "
                                                      "1073741824"),
    ("MXNET_MPI_LARGE_LANES", "100000", "MXNET_MPI_LARGE_LANES must be <= 64, got '100000'"),
    ("MXNET_MPI_CYCLE_US", "2147483648", "MXNET_MPI_CYCLE_US must be <= 1000000"),
    # a wait longer than the clocks can time: 1e10 ended every healthy job at its
    # MPI_Finalize with status 3 (and broke Python's waits with OverflowError)
    ("MXNET_MPI_STALL_WARN_S", "1e10", "MXNET_MPI_STALL_WARN_S must be <= 1e+08, got '1e10'"),
    ("MXNET_MPI_AVERAGE", "maybe",
     "MXNET_MPI_AVERAGE must be 0 or 1 (or true/false, yes/no, on/off), got 'maybe'"),
    ("MXNET_MPI_MODE", "Bogus", "unknown mxnet_mpi mode 'bogus' (from MXNET_MPI_MODE)"),
    ("MXNET_MPI_HYBRID_ROUTE", "nearest", "unknown MXNET_MPI_HYBRID_ROUTE 'nearest'"),
    ("MXNET_MPI_CONSISTENCY_ACTION", "fix", "MXNET_MPI_CONSISTENCY_ACTION must be one of "
                                           "warn, broadcast, raise, got 'fix'"),
])
def test_bad_values_name_the_variable(monkeypatch, name, raw, text):
    monkeypatch.setenv(name, raw)
    with pytest.raises(MPIKVStoreError) as err:
        settings.get(name)
    assert text in str(err.value)


def test_values_and_defaults(monkeypatch):
    for s in settings.TABLE:
        monkeypatch.delenv(s.name, raising=False)
        assert settings.get(s.name) == s.default
    monkeypatch.setenv("MXNET_MPI_AVERAGE", " 1 ")
    monkeypatch.setenv("MXNET_MPI_CHUNK_BYTES", "65536")
    monkeypatch.setenv("MXNET_MPI_MODE", "Chained")
    assert settings.get("MXNET_MPI_AVERAGE") is True
    assert settings.store_options()["chunk_bytes"] == 65536
    assert settings.get("MXNET_MPI_MODE") == "chained"
    monkeypatch.setenv("MXNET_MPI_STALL_WARN_S", "10")
    monkeypatch.setenv("MXNET_MPI_STALL_ABORT_S", "5")
    with pytest.raises(MPIKVStoreError, match="MXNET_MPI_STALL_ABORT_S"):
        settings.stall_limits()


STORE_ZERO = r"""
import json, os
import mxnet as mx
import numpy as np
import mxnet_mpi
from mxnet_mpi import collectives, errors
seen = {}
os.environ["MXNET_MPI_CHUNK_BYTES"] = "64k"
try:
    mxnet_mpi.init()
except errors.MPIKVStoreError as exc:
    seen["bad"] = str(exc)
os.environ["MXNET_MPI_CHUNK_BYTES"] = "65536"
mxnet_mpi.init()
seen["store0"] = collectives.stream_for(None).options()
kv = mx.kv.create("mpi")
seen["mpi"] = kv.stream.options()
x = mx.nd.arange(300000)            # 1.2 MB: about 19 chunks of 64 KiB
mxnet_mpi.allreduce_(x)
seen["exact"] = bool(np.array_equal(x.asnumpy(), np.arange(300000, dtype=np.float32)))
print("RESULT " + json.dumps(seen))
"""


@pytest.mark.timeout(120)
def test_store_zero_takes_the_settings(tmp_path):
    """Store 0 (mxnet_mpi.allreduce_/broadcast_) is created at MPI
    initialisation with the table's values, as every other store is; a bad
    value stops the initialisation with an error naming the variable."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "PMI_", "MXNET_MPI_"))}
    env.update(PYTHONPATH=python_path(env),
               MXNET_MPI_FUSION_BYTES="12345", MXNET_MPI_CYCLE_US="77")
    script = tmp_path / "store_zero.py"
    script.write_text(STORE_ZERO)
    proc = subprocess.run([sys.executable, str(script)], env=env, cwd=str(ROOT),
                          capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    seen = json.loads(line[0][len("RESULT "):])
    assert "MXNET_MPI_CHUNK_BYTES must be an integer, got '64k'" in seen["bad"]
    want = {"fusion_bytes": 12345, "small_bytes": 64 << 10, "chunk_bytes": 65536,
            "large_lanes": 1, "cycle_us": 77, "preempt_bytes": 4 << 20}
    assert seen["store0"] == want
    assert seen["mpi"] == want
    assert seen["exact"]
