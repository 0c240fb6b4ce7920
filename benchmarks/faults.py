"""Time from a fault to a named error: the figures of docs/faults.md.

    .venv/bin/python benchmarks/faults.py [--mode concurrent] [--outdir DIR]

Runs each fault case of tests/scripts (exits.py, faults.py, uneven.py) on real
`mpirun` jobs and measures, from the moment the fault happens (the line the
faulty rank prints, or the signal this script sends), how long until the first
line naming the problem appears on stderr and until the whole job has ended.
Prints a table and writes faults.csv into --outdir (default
benchmarks/results/). Stall settings are shortened (warning 2 s, abort 8 s,
heartbeat 0.2 s) so the stall cases finish; the other cases do not depend on
them. On this 2-core machine the figures include process scheduling noise.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from meta import write_meta  # benchmarks/, the script's folder

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCRIPTS = ROOT / "tests" / "scripts"
FAST = {"MXNET_MPI_STALL_WARN_S": "2", "MXNET_MPI_STALL_ABORT_S": "8",
        "MXNET_MPI_HEALTH_INTERVAL_S": "0.2"}

# name, script and arguments, ranks, regex of the stdout line marking the fault
# (None: SIGSTOP sent to rank 1 once every rank is ready; "@0.5": the fault comes
# 0.5 s after that line), regex of the first line naming the problem
CASES = [
    ("shape mismatch on one rank", ["faults.py", "shape"], 2, r"rank 1 ready",
     r"ranks disagree on a collective"),
    ("dtype change on one rank", ["faults.py", "dtype"], 2, r"rank 1 ready",
     r"ranks disagree on a collective"),
    ("key pushed by one rank only (stall)", ["faults.py", "missing"], 3, r"rank 2 ready",
     r"stall warning"),
    ("exception on one rank", ["faults.py", "raise"], 2, r"rank 1 ready",
     r"rank 1 raised RuntimeError"),
    ("SIGKILL of one rank", ["faults.py", "sigkill"], 2, r"rank 1 ready",
     r"noticed that process rank 1"),
    ("sys.exit(1) on one rank", ["exits.py", "sys_exit"], 2, r"rank 1 pid \d+ ready@0.5",
     r"rank 1 (is exiting with status|finished its program)"),
    ("argparse error on one rank", ["exits.py", "argparse"], 2, r"rank 1 pid \d+ ready",
     r"rank 1 (is exiting with status|finished its program)"),
    ("SIGSTOP of one rank", ["exits.py", "stopped"], 2, None, r"not answering"),
    ("uneven data, no join()", ["uneven.py", "@MODE", "no_join"], 3, r"ends its program",
     r"finished its program after issuing"),
]


def run_case(args, name: str, argv: list, np_: int, fault_re: str | None,
             error_re: str) -> dict:
    script, *rest = argv
    rest = [args.mode if a == "@MODE" else a for a in rest]
    if script != "uneven.py":
        rest.append(args.mode)
    mpirun = str(Path(sys.executable).parent / "mpirun")
    cmd = [mpirun, "-np", str(np_), "--oversubscribe", sys.executable, str(SCRIPTS / script),
           *rest]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **FAST)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=str(ROOT), start_new_session=True)
    # "regex@seconds": the fault happens that long after the marked line
    pattern, _, delay = (fault_re or "").partition("@")
    delay = float(delay or 0)
    marks: dict = {"fault": None, "error": None, "error_line": ""}
    pids: dict = {}

    def note_error(line: str) -> None:
        if marks["error"] is None and re.search(error_re, line):
            marks["error"] = time.time()
            marks["error_line"] = line.strip()

    def read_out() -> None:
        for line in proc.stdout:   # mpirun's own reports come on stdout
            note_error(line)
            m = re.search(r"rank (\d) pid (\d+) ready", line)
            if m:
                pids[int(m.group(1))] = int(m.group(2))
            if fault_re is None and len(pids) == np_ and marks["fault"] is None:
                os.kill(pids[1], signal.SIGSTOP)
                marks["fault"] = time.time()
            elif fault_re is not None and marks["fault"] is None and re.search(pattern, line):
                marks["fault"] = time.time() + delay

    def read_err() -> None:
        for line in proc.stderr:
            note_error(line)

    readers = [threading.Thread(target=read_out), threading.Thread(target=read_err)]
    for t in readers:
        t.start()
    try:
        proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    end = time.time()
    for t in readers:
        t.join()
    fault = marks["fault"]

    def since(t):
        return round(t - fault, 2) if (t is not None and fault is not None) else None
    return {"case": name, "ranks": np_, "mode": args.mode, "exit_status": proc.returncode,
            "error_after_s": since(marks["error"]), "job_ended_after_s": since(end),
            "message": marks["error_line"][:400]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", default="concurrent", choices=["chained", "funneled", "concurrent"])
    ap.add_argument("--outdir", default=str(HERE / "results"))
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--only", help="run only cases whose name contains this text")
    args = ap.parse_args()
    rows = []
    print("%-38s %6s %10s %10s  %s" % ("fault", "status", "error (s)", "ended (s)", "message"))
    for case in CASES:
        if args.only and args.only not in case[0]:
            continue
        r = run_case(args, *case)
        rows.append(r)
        print("%-38s %6s %10s %10s  %s" % (r["case"], r["exit_status"], r["error_after_s"],
                                          r["job_ended_after_s"], r["message"][:90]), flush=True)
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "faults.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    write_meta(out / "faults.csv")
    print("\nwrote %s (stall settings: warn %s s, abort %s s)"
          % (out / "faults.csv", FAST["MXNET_MPI_STALL_WARN_S"], FAST["MXNET_MPI_STALL_ABORT_S"]))


if __name__ == "__main__":
    main()
