"""The note written beside each result CSV: where, when and how it was measured.

``write_meta(csv_path, **facts)`` writes ``<stem>.meta.json`` next to the CSV
with the date (UTC), the machine (CPU model, cores, memory, GPUs), the load
average when the run ended, the command line and the commit of the code, plus
any benchmark-specific facts, and the text of ``$BENCH_NOTE`` (e.g. "machine
shared with other jobs") with the conditions. ``benchmarks/report.py`` states
these once per table in docs/benchmarks.md. Standard library only.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def meta_path(csv_path: Path) -> Path:
    """The note's path for a CSV: ``allreduce.csv`` -> ``allreduce.meta.json``."""
    csv_path = Path(csv_path)
    return csv_path.with_name(csv_path.stem + ".meta.json")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def _mem_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def _gpus() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return "no GPU"
    names = [line.split(":", 1)[1].split("(")[0].strip()
             for line in out.stdout.splitlines() if line.startswith("GPU ")]
    return ", ".join(names) if names else "no GPU"


def machine() -> str:
    """One line: CPU model, cores, memory, GPUs."""
    mem = _mem_gib()
    return "%s, %d cores%s, %s" % (_cpu_model(), os.cpu_count() or 0,
                                   "" if mem is None else ", %.0f GiB RAM" % mem, _gpus())


def code_version() -> str:
    """The commit of the checkout, with '+ local changes' when the tree differs from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=str(ROOT),
                              capture_output=True, text=True, timeout=20).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=str(ROOT), capture_output=True, text=True,
                               timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if not head:
        return "unknown"
    return "commit %s%s" % (head, " + local changes" if dirty else "")


def command_line() -> str:
    """How this benchmark was started, as a shell line."""
    return " ".join(shlex.quote(a) for a in [Path(sys.executable).name] + sys.argv)


def engine_settings(fwd_ops, bwd_ops, update_group) -> str:
    """MXNet's engine settings a run had, as its note states them."""
    return "segments of %s op(s) forward, %s backward; %s parameter(s) per SGD update" % (
        fwd_ops, bwd_ops, update_group)


def default_mode() -> str | None:
    """The package's default mode, read from its source (no import of MXNet)."""
    for p in sorted((ROOT / "mxnet_mpi").glob("*.py")):
        m = re.search(r'^DEFAULT_MODE\s*(?::\s*\w+\s*)?=\s*["\'](\w+)["\']', p.read_text(), re.M)
        if m:
            return m.group(1)
    return None


def describe(csv_path: Path) -> str:
    """A result a computation read: its path in the checkout and the date of its note."""
    csv_path = Path(csv_path).resolve()
    try:
        name = str(csv_path.relative_to(ROOT))
    except ValueError:
        name = str(csv_path)
    try:
        date = json.loads(meta_path(csv_path).read_text())["date"]
    except (OSError, ValueError, KeyError):
        return name
    return "%s of %s" % (name, date)


def write_meta(csv_path: Path, **facts) -> Path:
    """Write the note for ``csv_path``; ``facts`` (JSON-serialisable) are added as given."""
    load = os.getloadavg()
    note = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "conditions": "load average at the end of the run %.1f (1 min), %.1f (5 min), "
                      "%.1f (15 min) on %d cores" % (*load, os.cpu_count() or 0),
        "command": command_line(),
        "code": code_version(),
        "default_mode": default_mode(),
    }
    if os.environ.get("BENCH_NOTE", "").strip():
        note["conditions"] = os.environ["BENCH_NOTE"].strip() + "; " + note["conditions"]
    note.update(facts)
    path = meta_path(csv_path)
    path.write_text(json.dumps(note, indent=2, sort_keys=False) + "\n")
    return path
