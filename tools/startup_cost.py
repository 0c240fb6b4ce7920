"""What the start-up hook costs a Python process that never imports mxnet.

    python tools/startup_cost.py [--runs 300] [--csv benchmarks/results/startup_cost.csv]

Makes pairs of throwaway venvs of this Python, identical but for the hook
(mxnet_mpi_autoload.pth and its module, byte-compiled as pip installs them):
a bare pair (no other packages: the hook is the only .pth that runs code) and
a pair as `python -m venv` makes them (pip and setuptools, whose own .pth
runs code too). In each pair it runs `python -c pass` alternately with and
without the hook and prints the mean CPU time (user + sys) and wall time per
process, the difference with its standard error, and the median time that
`python -X importtime` gives `site` (which runs the .pth files), imports included.
With --csv, also writes those figures, one row per pair, and the CSV's note
(benchmarks/meta.py) for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import compileall
import csv
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOOK = ["mxnet_mpi_autoload.pth", "_mxnet_mpi_autoload.py"]
PROBE = "import sys; print(any(type(f).__name__ == 'MxnetMpiAutoload' for f in sys.meta_path))"


def make_venv(path: Path, bare: bool, hook: bool) -> Path:
    subprocess.check_call([sys.executable, "-m", "venv", *(["--without-pip"] if bare else []),
                           str(path)])
    py = path / "bin" / "python"
    site = Path(subprocess.check_output(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        text=True).strip())
    if hook:
        for name in HOOK:
            shutil.copy(ROOT / name, site / name)
        compileall.compile_file(str(site / HOOK[1]), quiet=1)
    assert subprocess.check_output([str(py), "-c", PROBE], text=True).strip() == str(hook)
    return py


def one_run(py: Path) -> tuple[float, float, float]:
    """(wall s, CPU s, importtime's cumulative time of site, s) of `python -c pass`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    err = subprocess.run([str(py), "-X", "importtime", "-c", "pass"], check=True,
                         capture_output=True, text=True).stderr
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    site = int(re.search(r"time:\s+\d+ \|\s+(\d+) \| site$", err, re.M).group(1)) * 1e-6
    return wall, cpu, site


def compare(label: str, pys: dict, runs: int) -> dict:
    times = {name: [] for name in pys}
    for _ in range(5):   # page cache
        for py in pys.values():
            one_run(py)
    for _ in range(runs):
        for name, py in pys.items():
            times[name].append(one_run(py))
    print("\n%s venvs, %d runs each of `python -c pass`, alternating:" % (label, runs))
    cols = {}
    for name, rows in times.items():
        wall, cpu, site = (list(c) for c in zip(*rows))
        cols[name] = (wall, cpu, site)
        print("  %-13s CPU %.2f ms, wall %.2f ms (means); site %.3f ms (median)"
              % (name, 1e3 * statistics.mean(cpu), 1e3 * statistics.mean(wall),
                 1e3 * statistics.median(site)))
    (w1, c1, s1), (w0, c0, s0) = cols["with hook"], cols["without hook"]

    def diff(a: list, b: list) -> str:
        se = (statistics.variance(a) / len(a) + statistics.variance(b) / len(b)) ** 0.5
        return "%+.3f ms +- %.3f" % (1e3 * (statistics.mean(a) - statistics.mean(b)), 1e3 * se)
    print("  the hook:     CPU %s, wall %s (mean difference +- standard error); "
          "site %+.3f ms (medians)"
          % (diff(c1, c0), diff(w1, w0), 1e3 * (statistics.median(s1) - statistics.median(s0))))

    def se(a: list, b: list) -> float:
        return 1e3 * (statistics.variance(a) / len(a) + statistics.variance(b) / len(b)) ** 0.5
    return {"venvs": label, "runs": runs,
            "cpu_without_ms": round(1e3 * statistics.mean(c0), 3),
            "cpu_with_ms": round(1e3 * statistics.mean(c1), 3),
            "cpu_diff_ms": round(1e3 * (statistics.mean(c1) - statistics.mean(c0)), 3),
            "cpu_diff_se_ms": round(se(c1, c0), 3),
            "wall_diff_ms": round(1e3 * (statistics.mean(w1) - statistics.mean(w0)), 3),
            "wall_diff_se_ms": round(se(w1, w0), 3),
            "site_diff_ms": round(1e3 * (statistics.median(s1) - statistics.median(s0)), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=300, help="processes per venv")
    ap.add_argument("--csv", type=Path, help="also write the figures here (and a note beside)")
    args = ap.parse_args()
    rows = []
    print("Python %s on %s, %d CPUs, load average %.2f, %s"
          % (sys.version.split()[0], sysconfig.get_platform(), os.cpu_count(),
             os.getloadavg()[0], time.strftime("%Y-%m-%d")))
    with tempfile.TemporaryDirectory(prefix="startup-cost-") as tmp:
        for label, bare in (("bare", True), ("default (pip, setuptools)", False)):
            pys = {"with hook": make_venv(Path(tmp, label[:4] + "-with"), bare, True),
                   "without hook": make_venv(Path(tmp, label[:4] + "-without"), bare, False)}
            rows.append(compare(label, pys, args.runs))
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from meta import write_meta
        write_meta(args.csv, python=sys.version.split()[0])
        print("wrote %s" % args.csv)


if __name__ == "__main__":
    main()
