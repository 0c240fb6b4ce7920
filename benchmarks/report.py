"""Writes docs/benchmarks.md, and the generated blocks of other docs pages, from the
results in benchmarks/results/ (CSV, PNG and each CSV's note, <stem>.meta.json).

    python benchmarks/report.py              # rewrite the pages (make report)
    python benchmarks/report.py --check      # exit 1 if a page differs from the results

So no figure in the docs can drift from its CSV: every table and every number in
the generated text is computed here from the CSVs; the notes give each table its
machine and date. A page holds a generated block between
``<!-- report.py: NAME -->`` and ``<!-- /report.py -->``. A malformed CSV or a
missing note is an error naming the file and line (exit status 2). Columns a
table does not know are ignored, or shown as they are in the cluster table; CSVs
no section knows get a table of their own. Standard library only.
"""

from __future__ import annotations

import argparse
import csv
import difflib
import json
import os
import re
import sys
from pathlib import Path

from meta import default_mode  # benchmarks/, the script's folder

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"   # links are written relative to this folder, wherever a page goes
MODES = ("chained", "funneled", "concurrent")
BLOCK = re.compile(r"(<!-- report\.py: ([\w-]+) -->\n)(.*?)(<!-- /report\.py -->)", re.S)


class ReportError(Exception):
    """A result file the report cannot use; the message names the file (and line)."""


def rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------- reading

def read_csv(path: Path, spec: dict) -> list:
    """Rows of ``path`` as dicts. ``spec`` maps the columns the caller needs to 'num',
    'num?' (empty allowed: None), 'int' or 'str'; other columns are kept as strings."""
    if not path.is_file():
        raise ReportError("%s: no such file" % rel(path))
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if not header or not any(h.strip() for h in header):
            raise ReportError("%s: empty, or no header row" % rel(path))
        missing = [c for c in spec if c not in header]
        if missing:
            raise ReportError("%s: missing column(s) %s (the header has: %s)"
                              % (rel(path), ", ".join(missing), ", ".join(header)))
        rows = []
        for fields in reader:
            line = reader.line_num
            if not fields:
                continue
            if len(fields) != len(header):
                raise ReportError("%s line %d: %d fields, the header has %d"
                                  % (rel(path), line, len(fields), len(header)))
            row = dict(zip(header, fields))
            for col, kind in spec.items():
                row[col] = _convert(path, line, col, row[col], kind)
            row["_line"] = line
            rows.append(row)
    if not rows:
        raise ReportError("%s: no data rows" % rel(path))
    return rows


def _convert(path: Path, line: int, col: str, value: str, kind: str):
    v = value.strip()
    if kind == "str":
        return v
    if kind == "num?" and v == "":
        return None
    try:
        return int(v) if kind == "int" else float(v)
    except ValueError:
        raise ReportError("%s line %d: column '%s' is %r, not %s"
                          % (rel(path), line, col, value,
                             "an integer" if kind == "int" else "a number")) from None


# CSVs that another benchmark's run writes beside its own: they share its note.
NOTE_OF = {"linkcheck.csv": "cluster.csv"}


def read_meta(csv_path: Path) -> dict:
    """The CSV's note: <stem>.meta.json beside it (benchmarks/meta.py), else <stem>.json
    (cluster.py's), else meta.json in its folder, else the note of the CSV it was written
    with (NOTE_OF)."""
    names = [csv_path.stem + ".meta.json", csv_path.stem + ".json", "meta.json"]
    if csv_path.name in NOTE_OF:
        names += [Path(NOTE_OF[csv_path.name]).stem + s for s in (".meta.json", ".json")]
    for p in (csv_path.parent / n for n in names):
        if p.is_file():
            try:
                meta = json.loads(p.read_text())
            except ValueError as e:
                raise ReportError("%s: not valid JSON: %s" % (rel(p), e)) from None
            for key in ("date", "machine"):
                if not isinstance(meta.get(key), str) or not meta[key].strip():
                    raise ReportError("%s: no '%s'" % (rel(p), key))
            return meta
    raise ReportError("%s has no note %s (its machine and date): rerun the benchmark, or "
                      "write one with the facts you can verify"
                      % (rel(csv_path), rel(csv_path.with_name(csv_path.stem + ".meta.json"))))


def measured(meta: dict, what: str = "Measured") -> str:
    """The one line that states a table's machine and date."""
    if what == "Computed":
        parts = ["Computed %s from %s" % (meta["date"], meta.get("input", "measured results"))]
    else:
        parts = ["%s %s on %s" % (what, meta["date"], meta["machine"])]
    if meta.get("conditions"):
        parts.append(meta["conditions"])
    elif meta.get("load_average"):
        load = meta["load_average"]
        parts.append("load average %s" % (" to ".join(map(str, load))
                                          if isinstance(load, list) else load))
    for key in ("binding", "transport"):
        if meta.get(key):
            parts.append("%s: %s" % (key, meta[key]))
    if meta.get("engine"):
        parts.append("MXNet: %s" % meta["engine"])
    if meta.get("seconds"):
        parts.append("took %s s" % meta["seconds"])
    if meta.get("quick"):
        parts.append("`--quick`")
    if meta.get("rounds", 1) > 1:
        parts.append("%d alternating rounds" % meta["rounds"])
    if meta.get("code"):
        parts.append("code: %s" % meta["code"])
    if meta.get("command"):
        parts.append("command: `%s`" % meta["command"])
    line = "*" + "; ".join(parts) + ".*"
    if meta.get("caveat"):
        line += " **Note: %s.**" % meta["caveat"].rstrip(".")
    return line


# ---------------------------------------------------------------- formatting

def sig(x: float, digits: int = 3) -> str:
    """``digits`` significant figures, thousands separated, no exponent."""
    if x is None:
        return ""
    if x == 0:
        return "0"
    mag = len(str(int(abs(x)))) if abs(x) >= 1 else 0
    if abs(x) >= 10 ** (digits - 1):
        return f"{x:,.0f}"
    if mag == 0:
        s = "%#.*g" % (digits, x)
        return s if "e" not in s else "%.6f" % x
    return "%.*f" % (digits - mag, x)


def size(nbytes: int) -> str:
    for unit, div in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= div and nbytes % div == 0:
            return "%d %s" % (nbytes // div, unit)
    return "%d B" % nbytes


def us(x: float) -> str:
    return "%s µs" % sig(x) if x < 1000 else "%s ms" % sig(x / 1000)


def x2(x: float) -> str:
    return "%.2fx" % x


def span(values: list, fmt=sig, unit: str = "") -> str:
    """'a-b unit' (or 'a unit' when all equal) over the values."""
    lo, hi = fmt(min(values)), fmt(max(values))
    return (lo if lo == hi else "%s-%s" % (lo, hi)) + unit


def table(header: list, rows: list, right: set = frozenset()) -> str:
    """A Markdown table; columns whose index is in ``right`` are right-aligned."""
    def cell(v) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")
    out = ["| " + " | ".join(header) + " |",
           "| " + " | ".join("---:" if i in right else "---" for i in range(len(header))) + " |"]
    out += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(out)


def code(text: str, limit: int = 0) -> str:
    if limit and len(text) > limit:
        text = text[:limit].rstrip() + " ..."
    return "`%s`" % text.replace("`", "'")


def figure(png: Path, page_dir: Path, alt: str) -> str:
    return ("![%s](%s)" % (alt, _link(png, page_dir))) if png.is_file() else ""


def _link(path: Path, page_dir: Path) -> str:
    return os.path.relpath(path, page_dir)


def files_line(ctx: Ctx, *paths: Path) -> str:
    return "Data: " + ", ".join("[`%s`](%s)" % (rel(p), _link(p, ctx.page_dir))
                               for p in paths if p.exists()) + "."


class Ctx:
    """Where the results are and where the page goes; which CSVs a section used."""

    def __init__(self, results: Path, page_dir: Path):
        self.results, self.page_dir = results, page_dir
        self.used: set = set()
        self.default = default_mode()

    def csv(self, name: str) -> Path | None:
        p = self.results / name
        if p.is_file():
            self.used.add(p.resolve())
            return p
        return None

    def mode_label(self, mode: str) -> str:
        return mode + (" (default)" if mode == self.default else "")


# ---------------------------------------------------------------- sections

def sec_allreduce(ctx: Ctx) -> str | None:
    p = ctx.csv("allreduce.csv")
    if p is None:
        return None
    rows = read_csv(p, {"store": "str", "bytes": "int", "time_us": "num"})
    meta = read_meta(p)
    stores = ["mpi_" + m for m in MODES] + ["mpi4py", "horovod", "dist_sync"]
    stores = [s for s in stores if any(r["store"] == s for r in rows)]
    stores += [s for s in dict.fromkeys(r["store"] for r in rows) if s not in stores]
    labels = {"mpi4py": "raw MPI", "horovod": "Horovod", "dist_sync": "ps-lite dist_sync"}
    t = {(r["bytes"], r["store"]): r["time_us"] for r in rows}
    sizes = sorted({r["bytes"] for r in rows})
    body = [[size(b)] + [us(t[b, s]) if (b, s) in t else "" for s in stores] for b in sizes]
    labels["mpi4py"] = "mpi4py (raw MPI)"
    head = ["size"] + [ctx.mode_label(s[4:]) if s.startswith("mpi_") else labels.get(s, s)
                       for s in stores]
    labels["mpi4py"] = "raw MPI"
    ours = [s for s in stores if s.startswith("mpi_")]
    out = ["## Allreduce: `make bench-allreduce`", "",
           "Time per float32 allreduce on 2 ranks over shared memory, on rank 0: our stores "
           "with in-place `pushpull`, each call waited for with `mx.nd.waitall()`; raw MPI "
           "(mpi4py `Allreduce` in place on numpy); Horovod's in-place `hvd.allreduce_` "
           "(its rows need `benchmarks/setup_horovod.sh`); MXNet's parameter server "
           "(`dist_sync`, one server). Both ranks share the 2 cores, so the sums and copies "
           "of \"communication\" are CPU work on the same cores.", "",
           measured(meta), "", table(head, body, set(range(1, len(head)))), ""]
    reading = []
    small = min(sizes)
    if all((small, s) in t for s in ours):
        line = "At %s our modes cost %s per collective" % (
            size(small), span([t[small, s] for s in ours], unit=" µs"))
        extra = ["%s %s" % (labels[s], us(t[small, s])) for s in ("mpi4py", "horovod")
                 if (small, s) in t]
        reading.append(line + (" (%s)" % ", ".join(extra) if extra else "") + ".")
    if any(s == "mpi4py" for s in stores):
        for lo, hi, what in ((1 << 20, 16 << 20, "from 1 MB to 16 MB"),
                             (64 << 20, 1 << 40, "from 64 MB on")):
            r = [t[b, s] / t[b, "mpi4py"] for b in sizes if lo <= b <= hi for s in ours
                 if (b, s) in t and (b, "mpi4py") in t]
            if r:
                reading.append("Time against raw MPI %s: %s." % (what, span(r, fmt=x2)))
    if any(s == "dist_sync" for s in stores):
        r = [t[b, "dist_sync"] / t[b, s] for b in sizes for s in ours
             if (b, s) in t and (b, "dist_sync") in t]
        reading.append("MXNet's parameter server takes %s the time of our modes."
                       % span(r, fmt=x2))
    if reading:
        out += [" ".join(reading) + " Large arrays move in blocking calls of at most "
                "`MXNET_MPI_CHUNK_BYTES`, which Open MPI's shared-memory path handles better "
                "than one call of the whole buffer. "
                "`benchmarks/overhead.py` measures the per-call cost without the "
                "`waitall()` (below).", ""]
    out += [files_line(ctx, p), figure(p.with_suffix(".png"), ctx.page_dir, "allreduce"), ""]
    return "\n".join(out)


LARGE_CALL_LIMIT = 1.10   # per call, from 4 MB on, the default mode: at most this x raw MPI


def _large_call_verdict(ctx: Ctx, v: dict, sizes: list) -> list:
    """The per-call target from 4 MB on (the default mode), read from the table,
    with the other modes' worst ratios beside it."""
    big = [b for b in sizes if b >= 4 << 20 and (b, "mpi4py") in v]
    ratio = {m: {b: v[b, m] / v[b, "mpi4py"] for b in big if (b, m) in v} for m in MODES}
    if not ratio.get(ctx.default):
        return []
    mine = ratio[ctx.default]
    others = ["%s at most %.2fx" % (m, max(ratio[m].values()))
              for m in MODES if m != ctx.default and ratio[m]]
    return ["From %s on, the target for the default mode, at most %.2fx raw MPI per call, "
            "is %s (%s: %s)%s." % (
                size(big[0]), LARGE_CALL_LIMIT,
                "met" if max(mine.values()) <= LARGE_CALL_LIMIT else "missed", ctx.default,
                ", ".join("%.3fx at %s" % (mine[b], size(b)) for b in big),
                "; the other modes: " + ", ".join(others) if others else ""), ""]


def _overhead(ctx: Ctx, p: Path, rows: list, meta: dict) -> list:
    out = []
    calls = [r for r in rows if r["part"] == "calls"]
    if calls:
        cols = ["engine", "mpi4py"] + list(MODES)
        v = {(int(r["bytes"]), r["what"]): r["value"] for r in calls}
        sizes = sorted({int(r["bytes"]) for r in calls})
        body = []
        for b in sizes:
            line = [size(b)]
            for c in cols:
                x = v.get((b, c))
                cell = "" if x is None else sig(x)
                if c in MODES and x is not None and b >= 1 << 20 and (b, "mpi4py") in v:
                    cell += " (%.2fx raw)" % (x / v[b, "mpi4py"])
                line.append(cell)
            body.append(line)
        out += ["Per call, µs: a dependent chain of in-place `kv.pushpull(0, x)`, interleaved "
                "in one job with MXNet's own engine op on the same array (`x += 1`, also a "
                "dependent chain) and raw MPI (mpi4py `Allreduce(IN_PLACE)` on numpy); median "
                "of 5 rounds.", "",
                table(["bytes", "MXNet engine op", "raw MPI"] + [ctx.mode_label(m) for m in MODES],
                      body, set(range(1, 6))), ""]
        small = sizes[0]
        if all((small, c) in v for c in cols):
            target = 2 * (v[small, "engine"] + v[small, "mpi4py"])
            worst = max(v[small, m] for m in MODES)
            out += ["At %s the modes cost %s, against %s µs for one of MXNet's own engine ops "
                    "from Python; the target, at most 2x (engine op + raw MPI) = %s µs, is %s."
                    % (size(small), span([v[small, m] for m in MODES], unit=" µs"),
                       sig(v[small, "engine"]), sig(target),
                       "met in every mode" if worst <= target else "missed"), ""]
        out += _large_call_verdict(ctx, v, sizes)
    trainer = {r["what"]: r["value"] for r in rows if r["part"] == "trainer"}
    if "plan" in trainer and "per_key" in trainer:
        out += ["`Trainer.step`'s gradient reduction, Python-thread time per step (%s): "
                "%s ms with the prebuilt plan (one native call per step), %s ms with one "
                "`pushpull` per gradient (%.1fx)."
                % (meta.get("parts", {}).get("trainer", "see the note"), sig(trainer["plan"]),
                   sig(trainer["per_key"]), trainer["per_key"] / trainer["plan"]), ""]
    fusion = [r for r in rows if r["part"] == "fusion"]
    if fusion:
        f = {(r["bytes"], r["what"]): r["value"] for r in fusion}
        body = [[tr, ctx.mode_label(m), sig(f.get((tr, m + " fusion on"))),
                 sig(f.get((tr, m + " fusion off")))]
                for tr in dict.fromkeys(r["bytes"] for r in fusion) for m in MODES
                if (tr, m + " fusion on") in f]
        out += ["Fusion (allreduces of up to `MXNET_MPI_FUSION_BYTES` that are ready together "
                "travel in one buffer): one step's gradients of %s with no compute, ms."
                % meta.get("parts", {}).get("fusion", "see the note"), "",
                table(["transport", "mode", "fusion on", "fusion off"], body, {2, 3}), ""]
    idle = {r["what"]: r["value"] for r in rows if r["part"] == "idle"}
    if idle:
        body = [[m, sig(idle.get(m + " cpu_pct")), sig(idle.get(m + " compute_vs_none"))]
                for m in ("none",) + MODES if m + " cpu_pct" in idle]
        out += ["An idle store: CPU used by a process holding it (`none`: no mxnet_mpi), and "
                "a compute loop's time with it against without (idle lanes sleep on a "
                "condition variable).", "",
                table(["store", "% of a core", "compute time vs none"], body, {1, 2}), ""]
    step = [r for r in rows if r["part"] == "step"]
    if step:
        s = {(r["bytes"], r["what"]): r["value"] for r in step}
        ranges = meta.get("other_runs", {}).get("ratios", {})
        loops = {"mlp": "MLP, never reads its loss (Python-bound)",
                 "mlp+read": "MLP, reads its loss each step",
                 "resnet18_v1": "resnet18_v1, batch 8x3x32x32"}
        body = []
        for model in dict.fromkeys(r["bytes"] for r in step):
            for m in MODES:
                if (model, m + " ratio") in s:
                    body.append([loops.get(model, model), ctx.mode_label(m),
                                 sig(s.get((model, m + " rule"))),
                                 sig(s.get((model, m + " no_rule"))),
                                 "%.2fx" % s[model, m + " ratio"],
                                 ranges.get("%s %s" % (model, m), "")])
        head = ["loop", "mode", "rule ms", "no rule ms", "ratio"]
        if ranges:
            head.append(meta["other_runs"].get("label", "other runs"))
        else:
            body = [b[:5] for b in body]
        out += ["The batch-size rule ([store.md](store.md#batch-sizes-one-rule-on-every-rank)) "
                "on the step time: 2 ranks, equal batch sizes, `trainer.step(b)` (the sum of "
                "the ranks' batch sizes rides on the last layer's gradients and Python waits "
                "for it before pushing the updates) against the step without the rule (each "
                "rank dividing by its own batch size), in one job: each round times both back "
                "to back, and the ratio is the median of the rounds' ratios.", "",
                table(head, body, {2, 3, 4}), "",
                "A compute-bound step does not move beyond the noise; a loop that reads its "
                "loss every step (as metrics and logging do) waits at that read anyway; a "
                "Python-bound loop that never synchronises loses its run-ahead, since "
                "`trainer.step` waits for the last layer's gradient sum.", ""]
    return out


def sec_overhead(ctx: Ctx) -> str | None:
    found = [p for p in (ctx.csv("overhead.csv"), ctx.csv("overhead-loaded/overhead.csv"),
                         ctx.csv("overhead-step/overhead.csv")) if p]
    if not found:
        return None
    out = ["## Per-call cost: `make bench-overhead`", "",
           "What one collective costs beyond the MPI call itself, what the Trainer's "
           "gradient reduction costs the Python thread, what fusion saves, what an idle store "
           "costs, and what the batch-size rule costs a step (`--parts "
           "calls,trainer,step,fusion,idle`). 2 ranks on 2 cores, shared memory or TCP on "
           "loopback: communication is CPU work on the cores that compute.", ""]
    for p in found:
        rows = read_csv(p, {"part": "str", "bytes": "str", "what": "str", "value": "num"})
        meta = read_meta(p)
        out += [measured(meta), ""] + _overhead(ctx, p, rows, meta)
        out += [files_line(ctx, p), figure(p.with_suffix(".png"), ctx.page_dir, "overhead"), ""]
    return "\n".join(out)


def sec_overlap(ctx: Ctx) -> str | None:
    p = ctx.csv("overlap.csv")
    if p is None:
        return None
    rows = read_csv(p, {"transport": "str", "config": "str", "ms_per_step": "num",
                        "overlap_fraction": "num?", "comm_during_backprop": "num?",
                        "grad_MB": "num"})
    meta = read_meta(p)
    other = meta.get("other_runs", {})
    body = []
    for tr in dict.fromkeys(r["transport"] for r in rows):
        rs = {r["config"]: r for r in rows if r["transport"] == tr}
        modes = [m for m in MODES if m in rs]
        best = min((rs[m]["ms_per_step"] for m in modes), default=None)
        if "compute" in rs:
            body.append([tr, "compute only", sig(rs["compute"]["ms_per_step"], 4), "", "", ""])
        comm = [m for m in MODES if "comm_" + m in rs]
        if comm:
            body.append([tr, "comm only: " + " / ".join(comm),
                         " / ".join(sig(rs["comm_" + m]["ms_per_step"]) for m in comm), "", "", ""])
        for cfg in ["baseline"] + modes:
            if cfg not in rs:
                continue
            r = rs[cfg]
            ms = sig(r["ms_per_step"], 4)
            if cfg in modes and r["ms_per_step"] == best:
                ms = "**%s**" % ms
            frac = "" if r["overlap_fraction"] is None else "%.2f" % r["overlap_fraction"]
            during = ("" if r["comm_during_backprop"] is None
                      else "%.0f%%" % (100 * r["comm_during_backprop"]))
            ranges = other.get(tr, {}).get(cfg, "")
            label = ("baseline (backward, then the default mode's allreduce)"
                     if cfg == "baseline" else ctx.mode_label(cfg))
            body.append([tr, label, ms, frac, during, ranges])
    head = ["transport", "config", "ms/step", "overlap fraction", "comm during backprop"]
    if other:
        head.append(other.get("label", "other runs"))
    else:
        body = [b[:5] for b in body]
    during = [r["comm_during_backprop"] for r in rows
              if r["config"] in MODES and r["comm_during_backprop"] is not None]
    out = ["## Overlap with backprop: `make bench-overlap`", "",
           "%s; %.1f MB of gradients per step. Over Open MPI's shared memory (`shm`), then "
           "TCP on loopback (`tcp`)." % (meta.get("model", "see the note"), rows[0]["grad_MB"]),
           "", measured(meta), "", table(head, body, {2, 3, 4}), "",
           "*Overlap fraction* is `(t_baseline - t_mode) / t_comm_only`. *Comm during "
           "backprop* comes from the timeline: the share of the step's MPI time spent before "
           "the step's last gradient was ready (a probe collective marks that moment).", ""]
    if during:
        out += ["What it shows: the schedule overlaps (%s of the communication runs while "
                "backprop still produces gradients in the modes, none in the baseline), but on "
                "2 cores that buys little wall time. Both cores already run the two ranks' "
                "compute, and shared-memory or loopback-TCP communication is CPU work (copies "
                "and sums) on those cores, so it competes with backprop instead of hiding "
                "behind it: the step times are mostly contention and noise, and the overlap "
                "fraction goes negative when a mode's own threads cost more than the "
                "communication they hide. On a cluster the NIC moves the data while the cores "
                "compute, and the communication that runs during backprop leaves the critical "
                "path: the cluster benchmark below emulates that with shaped links."
                % span([100 * d for d in during], fmt=lambda x: "%.0f" % x, unit="%"), ""]
    out += [files_line(ctx, p), figure(p.with_suffix(".png"), ctx.page_dir, "overlap"), ""]
    return "\n".join(out)


def engine_label(segs: str) -> str:
    """preempt.csv's "15-op segments" as the report names it."""
    return segs + " and 4-parameter updates" + (" (MXNet's defaults)" if segs.startswith("15-")
                                                else "")


def preempt_label(config: str, default: str | None) -> str:
    """A preempt.csv config as the table names it: "4 MiB, 15-op segments" is
    "budget 4 MiB (default), 15-op segments and 4-parameter updates (MXNet's
    defaults)"."""
    base, _, segs = config.partition(", ")
    label = {"compute": "compute only", "comm": "comm only",
             "off": "pre-emption off"}.get(base, "budget " + base)
    if base == default:
        label += " (default)"
    return label + (", " + engine_label(segs) if segs else "")


def sec_preempt(ctx: Ctx) -> str | None:
    found = [p for p in (ctx.csv("preempt.csv"), ctx.csv("preempt-shm/preempt.csv")) if p]
    if not found:
        return None
    spec = {"link": "str", "config": "str", "ms_per_step": "num", "vs_off": "num?",
            "comm_after_backward": "num?", "comm_after_forward": "num?",
            "backward_to_forward_ms": "num?", "cpu_per_wall": "num", "grad_MB": "num"}

    def pct(v):
        return "" if v is None else "%.0f%%" % (100 * v)

    out = ["## Overlap across steps: `make bench-preempt`", "",
           "The funneled store with pre-emption (`MXNET_MPI_PREEMPT_BYTES`, "
           "[modes.md](modes.md#pre-emption)) on and off, side by side in one process per "
           "link, round after round; steps follow each other with no wait in between, as in "
           "training. *Comm after backward*: the share of the gradients' MPI time that runs "
           "after the last backward op; *beside next forward*: the share that runs after the "
           "next step's first layer got its updated weight (its forward may run); "
           "*backward to forward*: from the end of backward to that moment. From rank 0's "
           "timeline (two probe collectives per step mark the moments). Where a row names "
           "segments, its model runs its forward and backward passes in MXNet engine "
           "segments of up to that many ops and SGD updates 4 parameters per op; the other "
           "rows run with the process's defaults, which in an MPI job are mxnet_mpi's one "
           "op per segment and one parameter per update "
           "([across-hosts.md](across-hosts.md#engine-segments-and-update-groups)).", ""]
    for p in found:
        rows = read_csv(p, spec)
        meta = read_meta(p)
        default = meta.get("default_budget")
        body = []
        for r in rows:
            cfg = r["config"]
            label = preempt_label(cfg, default)
            body.append([r["link"], label, sig(r["ms_per_step"], 4),
                         "" if r["vs_off"] is None or cfg == "off" else x2(r["vs_off"]),
                         pct(r["comm_after_backward"]), pct(r["comm_after_forward"]),
                         "" if r["backward_to_forward_ms"] is None
                         else sig(r["backward_to_forward_ms"]), "%.2f" % r["cpu_per_wall"]])
        out += ["%s; %s, %.1f MB of gradients per step." % (
            "2 ranks on one machine (shared memory)" if rows[0]["link"] == "shm"
            else "2 hosts x 1 rank on the cluster in a box", meta.get("model", ""),
            rows[0]["grad_MB"]), "", measured(meta), "",
            table(["link", "config", "ms/step", "off / this", "comm after backward",
                   "beside next forward", "backward to forward (ms)", "CPU/wall"], body,
                  {2, 3, 4, 5, 6, 7}), ""]
        on = [(r, next(o for o in rows if o["link"] == r["link"] and o["config"] == "off"))
              for r in rows if r["config"] == default]
        on = [(r, o) for r, o in on if r["backward_to_forward_ms"] and o["backward_to_forward_ms"]]
        if on:
            out += ["With the default budget (%s) against pre-emption off: the next forward "
                    "could start %s sooner after backward (%s instead of %s); the share of "
                    "communication beside the next forward went from %s to %s; the step time "
                    "ratio (off / on) was %s." % (
                        default,
                        span([o["backward_to_forward_ms"] / r["backward_to_forward_ms"]
                              for r, o in on], fmt=x2),
                        span([r["backward_to_forward_ms"] for r, _ in on], unit=" ms"),
                        span([o["backward_to_forward_ms"] for _, o in on], unit=" ms"),
                        span([100 * o["comm_after_forward"] for _, o in on],
                             fmt=lambda x: "%.0f" % x, unit="%"),
                        span([100 * r["comm_after_forward"] for r, _ in on],
                             fmt=lambda x: "%.0f" % x, unit="%"),
                        span([r["vs_off"] for r, _ in on], fmt=x2)), ""]
        for c in dict.fromkeys(r["config"] for r in rows if ", " in r["config"]):
            base, _, segs = c.partition(", ")
            pairs = [(r, next(d for d in rows if d["link"] == r["link"]
                              and d["config"] == base))
                     for r in rows if r["config"] == c]
            ops = sorted({d.get("bwd_segment_ops", "") for _, d in pairs} - {""})
            groups = sorted({d.get("update_group", "") for _, d in pairs} - {""})
            name = preempt_label(base, default)
            out += ["%s with %s instead of %s: %s per step against %s (%s as long)." % (
                        name[:1].upper() + name[1:], engine_label(segs),
                        "%s-op segments and %s-parameter updates" % (
                            "/".join(ops), "/".join(groups))
                        if ops and groups else "the process's defaults",
                        span([r["ms_per_step"] for r, _ in pairs], unit=" ms"),
                        span([d["ms_per_step"] for _, d in pairs], unit=" ms"),
                        span([r["ms_per_step"] / d["ms_per_step"] for r, d in pairs],
                             fmt=x2)), ""]
        others = [c for c in dict.fromkeys(r["config"] for r in rows)
                  if c not in ("compute", "comm", "off", default) and ", " not in c]
        if others:
            out += ["Other budgets, step time off / this: %s." % "; ".join(
                "%s %s" % (c, span([r["vs_off"] for r in rows if r["config"] == c], fmt=x2))
                for c in others), ""]
        out += [files_line(ctx, p), figure(p.with_suffix(".png"), ctx.page_dir, "preempt"), ""]
    out += ["Each cycle costs one more agreement (two small allreduces, with a wait for the "
            "slowest rank), so small budgets slow the step; a budget above the largest "
            "gradient bounds cycles but splits nothing, and the first layers still wait "
            "behind a large array.", "",
            "Why the step time hardly moves: the first layers' weights are now updated soon "
            "after backward and the next forward starts, but Gluon's order puts the last "
            "layers' gradients last, and those layers hold most of resnet18's bytes (its last "
            "stage of 512-channel convolutions). The next forward "
            "reaches them early (at 64x64 images they cost little compute) and waits for "
            "their weights, so the time saved on the first layers' forward is spent waiting "
            "there: with communication longer than compute the step stays bound by the "
            "communication plus the compute that depends on the last-reduced weights. The "
            "timeline (`pieces_us`) shows the schedule."]
    return "\n".join(out) + "\n"


IMAGENET_TRAIN = 1_281_167   # images in ImageNet-1K's training set


CLUSTER_KNOWN = ["link_gbit", "store", "ms_per_step", "compute_ms", "comm_ms", "grad_MB",
                 "chunk_bytes", "note", "bound_overlap_ms", "bound_serial_ms", "vs_bound",
                 "vs_no_overlap", "hosts", "wire_ms", "cpu_per_wall", "steady_ms"]
# cluster.py's rows with equal compute (oneDNN off) and the columns they fill,
# measured in each row's own process
PAIR_STORES = ("mpi oneDNN off", "horovod", "horovod yield")
OWN_COLUMNS = ["own_compute_ms", "own_comm_ms", "own_comm_cpu_per_wall", "lib_cpu_in_compute"]


def _cluster(ctx: Ctx, p: Path, meta: dict, targets: bool) -> list:
    rows = read_csv(p, {"link_gbit": "num", "store": "str", "ms_per_step": "num?",
                        "compute_ms": "num", "comm_ms": "num", "grad_MB": "num"})
    cols = list(rows[0])
    opt = {}
    for c, kind in (("vs_bound", "num?"), ("vs_no_overlap", "num?"), ("hosts", "num?"),
                    ("wire_ms", "num?"), ("cpu_per_wall", "num?"), ("steady_ms", "num?"),
                    *((c, "num?") for c in OWN_COLUMNS)):
        if c in cols:
            for r in rows:
                r[c] = _convert(p, r["_line"], c, r[c], kind)
            opt[c] = True
    extra = [c for c in cols if c not in CLUSTER_KNOWN + OWN_COLUMNS and c != "_line"]
    # the equal-compute rows get a table of their own (their compute is not the others')
    paired = "own_compute_ms" in opt
    pair_rows = [r for r in rows if paired and r["store"] in PAIR_STORES]
    mode = meta.get("default_mode")
    hosts = "hosts" in opt

    def key(r):
        return (r.get("hosts"), r["link_gbit"])
    groups = list(dict.fromkeys(key(r) for r in rows))
    first = {g: next(r for r in rows if key(r) == g) for g in groups}
    sh = ["hosts"] if hosts else []
    summary = [(["%g" % g[0]] if hosts else []) + [
        "%g" % g[1], sig(first[g]["compute_ms"]), sig(first[g]["comm_ms"])]
        + ([sig(first[g].get("wire_ms"))] if "wire_ms" in opt else [])
        + [sig(max(first[g]["compute_ms"], first[g]["comm_ms"])),
           sig(first[g]["compute_ms"] + first[g]["comm_ms"])] for g in groups]
    shead = sh + ["link Gb/s", "compute", "comm only"] + (
        ["wire time"] if "wire_ms" in opt else []) + ["max", "sum"]
    body = []
    for r in rows:
        if r["store"] in ("compute only", "comm only") or r in pair_rows:
            continue
        store = "mpi (%s)" % (mode or "default mode") if r["store"] == "mpi" else r["store"]
        vs = r.get("vs_bound") if "vs_bound" in opt else None
        spd = r.get("vs_no_overlap") if "vs_no_overlap" in opt else None
        if vs is None and r["ms_per_step"] is not None:
            vs = r["ms_per_step"] / max(r["compute_ms"], r["comm_ms"])
        line = (["%g" % r["hosts"]] if hosts else []) + [
            "%g" % r["link_gbit"], store,
            "skipped" if r["ms_per_step"] is None else sig(r["ms_per_step"]),
            "" if vs is None else "%.2f" % vs, "" if spd is None else "%.2f" % spd]
        if "steady_ms" in opt:
            line.append(sig(r["steady_ms"]) if r["steady_ms"] is not None else "")
        if "cpu_per_wall" in opt:
            line.append("" if r["cpu_per_wall"] is None else "%.2f" % r["cpu_per_wall"])
        line.append(r.get("note", ""))
        line += [r[c] for c in extra]
        body.append(line)
    steady = ["steady ms/step"] if "steady_ms" in opt else []
    head = sh + ["link Gb/s", "store", "ms/step", "vs max", "speed-up"] + steady + (
        ["CPU/wall"] if "cpu_per_wall" in opt else []) + ["note"] + extra
    n = len(sh)
    nums = len(steady) + ("cpu_per_wall" in opt)
    out = ["Per link (ms per step): compute alone, the default mode's allreduce of the "
           "gradients alone%s, and the two bounds." % (
               ", the wire time of those bytes at the link rate" if "wire_ms" in opt else ""), "",
           table(shead, summary, set(range(n, len(shead)))), "",
           table(head, body, set(range(n + 2, n + 5 + nums))), ""]
    if pair_rows:
        out += _cluster_pair(pair_rows, hosts)
    if targets:
        out += _cluster_targets(rows, mode, _tcp_floor(p.with_name("linkcheck.csv")))
    return out


def _tcp_floor(path: Path) -> dict:
    """{link Gbit/s: CPU/wall of the link check's plain TCP exchange} from the
    linkcheck.csv the same run wrote (empty for runs from before that column)."""
    if not path.is_file():
        return {}
    rows = read_csv(path, {})
    if not rows or not {"link_gbit", "tcp_exchange_cpu_per_wall"} <= set(rows[0]):
        return {}

    def num(r: dict, col: str) -> float:
        return _convert(path, r["_line"], col, r[col], "num")
    return {round(num(r, "link_gbit"), 3): num(r, "tcp_exchange_cpu_per_wall") for r in rows}


def _cluster_pair(rows: list, hosts: bool) -> list:
    """The equal-compute rows (oneDNN off): each row's own compute-only and
    comm-only times, its step against those, and against our store's."""
    def ours(r):
        return next((x for x in rows if x["store"] == "mpi oneDNN off"
                     and (x.get("hosts"), x["link_gbit"]) == (r.get("hosts"), r["link_gbit"])),
                    None)

    def f2(x):
        return "" if x is None else "%.2f" % x
    body = []
    for r in rows:
        step, c, m = r["ms_per_step"], r.get("own_compute_ms"), r.get("own_comm_ms")
        o = ours(r)
        vs_ours = (step / o["ms_per_step"] if step is not None and o
                   and o["ms_per_step"] is not None else None)
        body.append((["%g" % r["hosts"]] if hosts else []) + [
            "%g" % r["link_gbit"], r["store"],
            "skipped" if step is None else sig(step), sig(c), sig(m),
            f2(None if step is None or c is None else step / max(c, m)), f2(vs_ours),
            f2(r.get("own_comm_cpu_per_wall")), f2(r.get("lib_cpu_in_compute"))])
    n = 1 if hosts else 0
    head = (["hosts"] if hosts else []) + [
        "link Gb/s", "store", "ms/step", "compute only", "comm only", "vs max", "vs ours",
        "CPU/wall comm only", "library threads in compute only"]
    return ["Equal compute, both with oneDNN off (Horovod cannot reduce oneDNN arrays), "
            "timed by one worker loop with the same Open MPI settings, binding and cpusets. "
            "Compute only and comm only (the Trainer's allreduce of the gradients alone) are "
            "measured in each row's own process after its library started; *vs max* is the "
            "step over max(those two); *vs ours* is the step over `mpi oneDNN off`'s; the "
            "last column is the CPU the library's threads (Horovod's background thread, our "
            "store's, MPI's) took during compute only, in cores. `horovod yield` adds "
            "`OMPI_MCA_mpi_yield_when_idle=1` (not a Horovod default: a sensitivity row). "
            "The three rows run in alternating rounds, each figure the median over them "
            "(cluster.csv's note gives the rounds' steps; runs from before 2026-11-26: one "
            "round).", "",
            table(head, body, set(range(n + 2, len(head)))), ""]


def _wire_bound(store: str, hosts: set) -> list:
    """What the bytes alone allow the ring against `store` (a ps-lite row):
    each link's bytes per step, each way, in gradients' sizes. Every host's
    link, the servers' included, is shaped at the same rate."""
    if len(hosts) != 1:
        return []
    n = hosts.pop()
    ring = 2 * (n - 1) / n
    if store == "dist_sync":
        return ["  by bytes alone: the server's link carries %d times the gradients each way per "
                "step (every worker's push and pull), each host's link in the store's ring "
                "%s, so the store can be at most %.2fx faster on the wire;"
                % (n, "once" if ring == 1 else "%.3g times" % ring, n / ring)]
    return ["  by bytes alone: with the keys spread evenly over the servers, each host's link "
            "carries %.3g times the gradients each way per step (its worker's pushes to the "
            "other hosts' servers and its server's replies to the other workers), as many as "
            "in the store's ring: on the wire the store can be at most 1.00x faster, and it "
            "gains only by CPU and round trips;" % ring]


def _cluster_targets(rows: list, mode: str | None, floor: dict | None = None) -> list:
    """The cross-host targets, read from the rows: comm only <= 1.15x the wire
    time, at most 10% of a core while waiting (beside `floor`, the link
    check's plain TCP exchange of the same bytes, by link), the default
    store's step <= 1.10x max(compute, comm), >= 1.15x faster than dist_sync
    (1.5x at 4 hosts and more), ahead of Horovod with equal compute."""
    def at(store, g):
        return next((r for r in rows if r["store"] == store
                     and (r.get("hosts"), r["link_gbit"]) == g), None)

    def step(store, g):
        r = at(store, g)
        return None if r is None else r["ms_per_step"]
    groups = [g for g in dict.fromkeys((r.get("hosts"), r["link_gbit"]) for r in rows)
              if step("mpi", g) is not None]
    if not groups:
        return []
    ours = {g: step("mpi", g) for g in groups}
    bounds = {g: next((r["compute_ms"], r["comm_ms"], r.get("wire_ms")) for r in rows
                      if (r.get("hosts"), r["link_gbit"]) == g) for g in groups}
    lines = ["Against the targets, for the default store `mpi`%s on each link "
             "(links in the order of the table):" % (" (%s)" % mode if mode else "")]

    def verdict(ok: list) -> str:
        return "met on every link" if all(ok) else ("missed on every link" if not any(ok)
                                                     else "met on %d of %d links"
                                                     % (sum(ok), len(ok)))
    if all(bounds[g][2] for g in groups):
        wire = [bounds[g][1] / bounds[g][2] for g in groups]
        lines.append("- comm only at most 1.15x the wire time: %s (%s);"
                     % (verdict([w <= 1.15 for w in wire]), ", ".join("%.2fx" % w for w in wire)))
    cpu = [(at("comm only", g) or {}).get("cpu_per_wall") for g in groups]
    if all(c is not None for c in cpu):
        lines.append("- at most 0.10 of a core per rank while communicating (CPU/wall of comm "
                     "only): %s (%s);" % (verdict([c <= 0.10 for c in cpu]),
                                          ", ".join("%.2f" % c for c in cpu)))
        tcp = [(floor or {}).get(round(g[1], 3)) for g in groups]
        if all(t is not None for t in tcp):
            lines.append("  a plain TCP exchange of the same bytes each way between the two "
                         "hosts (the link check, no MPI, no store) takes %s of a core: the "
                         "kernel's TCP work alone;" % ", ".join("%.2f" % t for t in tcp))
    vmax = [ours[g] / max(bounds[g][0], bounds[g][1]) for g in groups]
    lines.append("- step at most 1.10x max(compute, comm): %s (%s);"
                 % (verdict([v <= 1.10 for v in vmax]), ", ".join("%.2fx" % v for v in vmax)))
    steady = [(at("mpi", g) or {}).get("steady_ms") for g in groups]
    if all(x is not None for x in steady):
        vs = [x / max(bounds[g][:2]) for g, x in zip(groups, steady)]
        lines.append("  once the pipeline is full (*steady ms/step*: the median time between "
                     "two consecutive steps' ends of backward; the mean step above also "
                     "holds each timed run's first step, which has no earlier communication "
                     "to overlap): %s (%s ms, %s max(compute, comm));" % (
                         verdict([v <= 1.10 for v in vs]),
                         ", ".join(sig(x) for x in steady),
                         ", ".join("%.2fx" % v for v in vs)))
    alone = [(at("compute only", g) or {}).get("cpu_per_wall") for g in groups]
    if all(c is not None for c in cpu) and all(a is not None and a >= 0.9 for a in alone):
        # each host had a core of its own (compute alone used it), which
        # backprop and the communication's CPU share
        need = [bounds[g][0] + c * bounds[g][1] for g, c in zip(groups, cpu)]
        lines.append("  with one core per host, a step needs at least compute + the CPU that "
                     "comm only takes (its CPU/wall x its time): %s ms, %s max(compute, comm); "
                     "the step over the largest of the three: %s;" % (
                         ", ".join(sig(n) for n in need),
                         ", ".join("%.2fx" % (n / max(bounds[g][:2]))
                                   for g, n in zip(groups, need)),
                         ", ".join("%.2fx" % (ours[g] / max(n, *bounds[g][:2]))
                                   for g, n in zip(groups, need))))
    for other, label in (("dist_sync", "ps-lite dist_sync"),
                         ("dist_sync 1/host", "dist_sync with a server per host")):
        theirs = [step(other, g) for g in groups]
        if all(x is not None for x in theirs):
            need = [1.5 if (g[0] or 2) >= 4 else 1.15 for g in groups]
            sp = [t / ours[g] for g, t in zip(groups, theirs)]
            lines.append("- at least %s faster than %s: %s (%s; %s ms);" % (
                "/".join(sorted({"%.2fx" % n for n in need})), label,
                verdict([x >= n for x, n in zip(sp, need)]), ", ".join("%.2fx" % x for x in sp),
                ", ".join("%s vs %s" % (sig(ours[g]), sig(t)) for g, t in zip(groups, theirs))))
            lines += _wire_bound(other, {g[0] or 2 for g in groups})
    theirs = [step("horovod", g) for g in groups]
    partner = [step("mpi oneDNN off", g) for g in groups]   # equal compute with Horovod
    if all(x is not None for x in theirs + partner):
        lines.append("- ahead of Horovod with equal compute (both oneDNN off): %s (Horovod's "
                     "step %s ours; %s ms);" % (
                         verdict([m <= t for m, t in zip(partner, theirs)]),
                         ", ".join("%.2fx" % (t / m) for m, t in zip(partner, theirs)),
                         ", ".join("%s vs %s" % (sig(m), sig(t))
                                   for m, t in zip(partner, theirs))))
        h = [at("horovod", g) for g in groups]
        o = [at("mpi oneDNN off", g) for g in groups]
        if all(r.get("own_comm_ms") is not None for r in h + o):
            lines.append(
                "  why: comm only, Horovod's allreduce takes %s ours (%s ms) but waits at "
                "%s of a core (ours %s); during compute only its threads take %s of a core "
                "(ours %s), on the core that computes;" % (
                    ", ".join("%.2fx" % (a["own_comm_ms"] / b["own_comm_ms"])
                              for a, b in zip(h, o)),
                    ", ".join("%s vs %s" % (sig(a["own_comm_ms"]), sig(b["own_comm_ms"]))
                              for a, b in zip(h, o)),
                    ", ".join("%.2f" % a["own_comm_cpu_per_wall"] for a in h),
                    ", ".join("%.2f" % b["own_comm_cpu_per_wall"] for b in o),
                    ", ".join("%.2f" % a["lib_cpu_in_compute"] for a in h),
                    ", ".join("%.2f" % b["lib_cpu_in_compute"] for b in o)))
        ty = [step("horovod yield", g) for g in groups]
        if all(x is not None for x in ty):
            lines.append("  with `OMPI_MCA_mpi_yield_when_idle=1` for Horovod (not a default), "
                         "its step is %s ours;" % ", ".join(
                             "%.2fx" % (t / m) for m, t in zip(partner, ty)))
    elif all(x is not None for x in theirs):   # runs from before the equal-compute pair
        lines.append("- ahead of Horovod (its compute is oneDNN off, ours on): %s (%s ms);" % (
            verdict([ours[g] <= t for g, t in zip(groups, theirs)]),
            ", ".join("%s vs %s" % (sig(ours[g]), sig(t)) for g, t in zip(groups, theirs))))
    none = [step("no overlap", g) for g in groups]
    if all(x is not None for x in none):
        lines.append("- against no overlap: %s faster;" % ", ".join(
            "%.2fx" % (n / ours[g]) for n, g in zip(none, groups)))
    fp16 = [step("mpi fp16", g) for g in groups]
    if all(x is not None for x in fp16):
        lines.append("- with fp16 compression (`mpi fp16`), the default mode's steps are "
                     "%s faster than without it." % ", ".join(
                         "%.2fx" % (ours[g] / f) for g, f in zip(groups, fp16)))
    lines[-1] = lines[-1].rstrip(";") + ("" if lines[-1].endswith(".") else ".")
    return lines + [""]


def sec_cluster(ctx: Ctx) -> str | None:
    p = ctx.csv("cluster.csv")
    p64 = ctx.csv("cluster-chunk64m/cluster.csv")
    p4 = ctx.csv("cluster-4hosts/cluster.csv")
    if p is None and p64 is None and p4 is None:
        return None
    out = ["## Cluster in a box: `make bench-cluster`", "",
           "Hosts are network namespaces on one bridge (needs root), one rank each, plus a "
           "host for ps-lite's scheduler and server; every host's link is shaped with tbf in "
           "both directions, so a transfer takes wall time without taking CPU (unlike "
           "loopback). The benchmark calibrates compute on an unshaped link and picks rates "
           "at which communication takes about 0.5x, 1x and 2x compute "
           "(`BENCH_ARGS=--quick`: resnet18_v1, 2 timed steps per round; the note says how "
           "many were run). The rows that one process times run in alternating rounds, as do "
           "Horovod's rows and their partner, each figure the median over the rounds (where "
           "the note names rounds). Rows: no overlap (backward, "
           "wait, then the allreduce of the store its note names; runs whose note names none "
           "used the chained store); `mpi` (the default mode) and the other modes; `mpi fp16` "
           "(the default mode with `compression_params={'type': 'fp16'}`: half the bytes on "
           "the wire, its comm-only time in its note); where Horovod is installed, "
           "Horovod's DistributedTrainer and `mpi oneDNN off` (our default store), both with "
           "oneDNN off (Horovod cannot reduce oneDNN arrays), in a table of their own below; "
           "ps-lite `dist_sync` with its server on the third host. *vs max* is "
           "the step over max(compute, comm); *speed-up* is the no-overlap step over this "
           "one. How ranks sat on the machine's cores (a cpuset per host, or shared) is in "
           "the note; "
           "CPU/wall is a rank's CPU time over wall time in that row.", ""]
    if p:
        meta = read_meta(p)
        out += [measured(meta), ""]
        if meta.get("model"):
            out += ["Model: %s." % meta["model"], ""]
        if meta.get("horovod"):
            out += ["Horovod: %s." % meta["horovod"], ""]
        out += _cluster(ctx, p, meta, True)
        out += [files_line(ctx, p), figure(p.with_suffix(".png"), ctx.page_dir, "cluster"), ""]
    if p64:
        meta = read_meta(p64)
        out += ["### With 64 MiB chunks", "",
                "The same benchmark with `MXNET_MPI_CHUNK_BYTES=64 MiB`: every blocking MPI "
                "call costs protocol round trips over these links, so the chunk size sets how "
                "many a step pays.", "", measured(meta), ""]
        out += _cluster(ctx, p64, meta, False)
        out += [files_line(ctx, p64),
                figure(p64.with_suffix(".png"), ctx.page_dir, "cluster, 64 MiB chunks"), ""]
    if p4:
        meta = read_meta(p4)
        out += ["### Four hosts", "",
                "`--hosts 4`, one rank per host, against `dist_sync` with one server and with "
                "one server per host (`dist_sync 1/host`). On a 2-core machine four hosts "
                "share two cores, so read the ratios within this run only.", "",
                measured(meta), ""]
        out += _cluster(ctx, p4, meta, True)
        out += [files_line(ctx, p4),
                figure(p4.with_suffix(".png"), ctx.page_dir, "cluster, 4 hosts"), ""]
    return "\n".join(out)


def sec_projection(ctx: Ctx) -> str | None:
    p = ctx.csv("projection.csv")
    if p is None:
        return None
    rows = read_csv(p, {"gpus": "int", "step_ms": "num", "images_per_s": "num",
                        "scaling_efficiency": "num", "epoch_s": "num"})
    meta = read_meta(p)
    fit = meta.get("fit", {})
    inp = meta.get("inputs", {})
    body = [[r["gpus"], sig(r["step_ms"]), "{:,.0f}".format(r["images_per_s"]),
             "%.0f%%" % (100 * r["scaling_efficiency"]), sig(r["epoch_s"], 2) + " s"]
            for r in rows]
    out = ["## Scaling projection (a projection, not a measurement)", "",
           "`benchmarks/projection.py` fits two things to the cluster benchmark's "
           "`cluster.csv`: t_comm = a + bits / (e x rate) on the \"comm only\" rows, and "
           "t_step = max(c, m) + tau x min(c, m) on the `mpi` rows; then projects ResNet-50 "
           "data-parallel training on n GPUs with e and tau capped at 1. The box's fixed cost "
           "a (CPU scheduling on 2 time-sliced cores) is not carried over: instead each of "
           "the step's collectives pays a per-message latency for every latency term of the "
           "allreduce between nodes.", "",
           measured(meta, "Computed"), ""]
    if fit:
        out += ["Fit (%s): a = %s ms per step, e = %.2f, tau = %.2f." % (
            meta.get("input", "cluster.csv"), sig(fit["a_ms"]), fit["e"], fit["tau"]), ""]
    check = meta.get("check") or []
    for what, label in (("comm only", "comm only"), ("mpi", "the default store's step")):
        errs = [c["error_pct"] for c in check if c["row"] == what]
        if errs:
            out.append("The fitted model against the measured rows, %s: %s." % (
                label, ", ".join("%+d%%" % e for e in errs)))
    if check:
        out.append("")
    if inp:
        out += ["Inputs (all flags of projection.py): " + ", ".join(
            "%s %s" % (k, v) for k, v in inp.items()) + ". `gpu_ips` (images/s of one GPU "
            "alone) is about NVIDIA's published MXNet ResNet-50 v1.5 mixed-precision rate on "
            "one V100: check it against your source.", ""]
    out += [table(["GPUs", "step ms", "images/s", "efficiency", "ImageNet-1K epoch"], body,
                  {0, 1, 2, 3, 4}), "",
            "Published figures, for context (not ours): MXNet-MPI (Mamidala et al., 2018), "
            "about 50 s per ImageNet epoch on 256 GPUs; Horovod with MXNet, 91% scaling "
            "efficiency at 256 GPUs.", ""]
    at256 = next((r for r in rows if r["gpus"] == 256), None)
    if at256:
        eff = 100 * at256["scaling_efficiency"]
        diff = eff - 91
        out += ["At 256 GPUs this projection gives %.0f%% scaling efficiency (%s Horovod's "
                "published 91%%) and a %s s ImageNet-1K epoch, against the paper's measured "
                "50 s. The epoch time follows the assumed one-GPU rate (%s images/s): the "
                "paper's 50 s means about %.0f images/s per GPU on its hardware, so the "
                "comparison that this box's measurements inform is the efficiency, not the "
                "epoch time." % (
                    eff, "about equal to" if abs(diff) < 0.5 else "%.1f points %s" % (
                        abs(diff), "above" if diff > 0 else "below"),
                    sig(at256["epoch_s"], 2), sig(inp.get("gpu_ips", 0)),
                    IMAGENET_TRAIN / 50 / 256), ""]
    out += [files_line(ctx, p), figure(p.with_suffix(".png"), ctx.page_dir, "projection"), ""]
    return "\n".join(out)


def sec_epoch(ctx: Ctx) -> str | None:
    p = ctx.csv("epoch_time.csv")
    if p is None:
        return None
    rows = read_csv(p, {"store": "str", "ranks": "int", "images_per_sec": "num",
                        "projected_imagenet_epoch_h": "num", "scaling_efficiency": "num"})
    meta = read_meta(p)
    v = {(r["store"], r["ranks"]): r for r in rows}
    ranks = sorted({r["ranks"] for r in rows})
    over = {r["ranks"] for r in rows if str(r.get("oversubscribed", "")).lower() == "true"}
    labels = {"single": "single process", "dist_sync": "MXNet dist_sync (ps-lite)",
              "horovod": "Horovod DistributedTrainer"}
    body = []
    for s in dict.fromkeys(r["store"] for r in rows):
        line = [labels.get(s, s)]
        for n in ranks:
            r = v.get((s, n))
            line.append("" if r is None else "%s%s" % (
                sig(r["images_per_sec"]),
                "" if n == 1 else " (%.2f)" % r["scaling_efficiency"]))
        pick = v.get((s, 2)) or v.get((s, 1))
        line.append("%.1f h" % pick["projected_imagenet_epoch_h"] if pick else "")
        body.append(line)
    head = ["kvstore"] + ["%d%s rank%s img/s%s" % (n, "*" if n in over else "",
                                                 "" if n == 1 else "s",
                                                 "" if n == 1 else " (eff.)") for n in ranks]
    head.append("projected epoch, 2 ranks (1 for single)")
    out = ["## Epoch time: `make bench-epoch`", "",
           "`examples/train_imagenet.py --synthetic` per kvstore and number of ranks; "
           "efficiency = images/s / (ranks x single-process images/s). The ImageNet-1K "
           "epoch is a **projection** (1,281,167 images / measured images/s), not a measured "
           "epoch. The ranks' communication is shared-memory copies and sums on the same 2 "
           "cores that compute; ranks marked * oversubscribe them: that column measures "
           "oversubscription, not scaling. Scaling to many GPUs cannot be measured on such a "
           "machine (see the projection above).", "",
           measured(meta), ""]
    if meta.get("model"):
        out += ["Run: %s." % meta["model"], ""]
    out += [table(head, body, set(range(1, len(head)))), "",
            files_line(ctx, p), figure(p.with_suffix(".png"), ctx.page_dir, "epoch time"), ""]
    return "\n".join(out)


def faults_table(ctx: Ctx) -> tuple | None:
    p = ctx.csv("faults.csv")
    if p is None:
        return None
    rows = read_csv(p, {"case": "str", "ranks": "int", "mode": "str", "exit_status": "int",
                        "error_after_s": "num", "job_ended_after_s": "num", "message": "str"})
    meta = read_meta(p)

    def t(x):
        return "< 0.1 s" if x < 0.1 else "%s s" % sig(x, 2)
    body = [[r["case"], r["ranks"], code(r["message"], 260), t(r["error_after_s"]),
             t(r["job_ended_after_s"]), r["exit_status"]] for r in rows]
    out = [measured(meta), "",
           table(["fault", "ranks", "what the ranks print", "named after", "job ended after",
                  "exit status"], body, {1, 3, 4, 5})]
    if meta.get("settings"):
        out += ["", "Stall settings of the run: %s (only the stall rows depend on them; the "
                "defaults: [settings.md](settings.md))." % meta["settings"]]
    out += ["", files_line(ctx, p)]
    return "\n".join(out), p


def sec_faults(ctx: Ctx) -> str | None:
    got = faults_table(ctx)
    if got is None:
        return None
    return "\n".join(["## Faults: `make bench-faults`", "",
                      "Time from a fault (the line the faulty rank prints, or the signal the "
                      "benchmark sends) to the first line naming it, and to the end of the whole "
                      "job; real `mpirun` jobs on 2 cores, so the figures include process "
                      "scheduling. What users see: [faults.md](faults.md).", "", got[0], ""])


def sec_gpu(ctx: Ctx) -> str | None:
    dirs = sorted(d for d in ctx.results.glob("gpu_*") if d.is_dir() and list(d.glob("*.csv")))
    if not dirs:
        return None
    out = ["## GPU staging: `benchmarks/gpu.py`", "",
           "Time per `pushpull` of a GPU array against a host array of the same size, 2 ranks "
           "sharing GPU 0: GPU arrays staged through pinned host memory in 4 MiB chunks (the "
           "default, pipelined) and in one chunk, and the staging copies alone (device -> "
           "pinned host -> device through the engine, no MPI); median ms. How to run it: "
           "[gpu.md](gpu.md).", ""]
    spec = {"what": "str", "bytes": "str", "host": "num?", "gpu_chunked": "num?",
            "gpu_one_chunk": "num?", "copies_only": "num?", "note": "str"}
    for d in dirs:
        csvs = sorted(d.glob("*.csv"))
        for c in csvs:
            ctx.used.add(c.resolve())
        meta = read_meta(csvs[0])
        labels = meta.get("runs", {})
        groups: dict = {}
        notes: set = set()
        order = {name: i for i, name in enumerate(labels)}
        csvs.sort(key=lambda c: order.get(c.name, len(order)))
        for c in csvs:
            groups.setdefault(labels.get(c.name, c.stem), []).append(c)
        out += ["### %s" % d.name, "", measured(meta), ""]
        for label, files in groups.items():
            data = [read_csv(c, spec) for c in files]
            rows = [[r for r in rs if r["what"] == "allreduce_ms"] for rs in data]
            sizes = [r["bytes"] for r in rows[0]]
            body = []
            for i, b in enumerate(sizes):
                line = [size(int(b))]
                for col in ("host", "gpu_chunked", "gpu_one_chunk", "copies_only"):
                    vals = [rs[i][col] for rs in rows if i < len(rs) and rs[i][col] is not None]
                    line.append(span(vals) if vals else "")
                body.append(line)
            n = len(files)
            out += ["%s, %s (%s), ms:" % (label, "%d runs, their range" % n if n > 1
                                         else "one run", ", ".join(f.name for f in files)), "",
                    table(["bytes", "host array", "GPU, 4 MiB chunks", "GPU, one chunk",
                           "copies only"], body, {1, 2, 3, 4}), ""]
            big = [rs[-1] for rs in rows if rs]
            if big and all(r["host"] and r["gpu_chunked"] and r["gpu_one_chunk"] for r in big):
                stage = [r["gpu_chunked"] for rs in data for r in rs
                         if r["what"] == "staging_ms_per_step_resnet50_v1b" and r["gpu_chunked"]]
                out += ["At %s a GPU array costs %s a host array in 4 MiB chunks, %s in one "
                        "piece%s." % (
                            size(int(big[0]["bytes"])),
                            span([r["gpu_chunked"] / r["host"] for r in big], unit="x"),
                            span([r["gpu_one_chunk"] / r["host"] for r in big], unit="x"),
                            "" if not stage else "; at that rate resnet50_v1b's 102 MB of "
                            "gradients add about %s ms of staging per step"
                            % span(stage, fmt=lambda x: "%.1f" % x)), ""]
            notes.update("`%s`: %s" % (r["what"], ":".join(r["note"].split(":")[:2]))
                         for rs in data for r in rs if r["note"])
        out += ["%s." % n_ for n_ in sorted(notes)]
        probe = next((d / n for n in ("probe.txt", "02_probe.txt") if (d / n).is_file()), None)
        if probe:
            found = [(ln.split(" ")[0], ln.split("ErrStr:", 1)[1] if "ErrStr:" in ln
                      else ln.split(" ", 1)[1]) for ln in probe.read_text().splitlines()
                     if ln.startswith(("COPY", "KERNEL")) and " " in ln]
            if found:
                out += ["", "Probe (`%s`): " % probe.name + "; ".join(
                    "%s %s" % (k.lower(), code(v.strip())) for k, v in found) + "."]
        out.append("")
        tests = next((d / n for n in ("tests.txt", "03_tests.txt") if (d / n).is_file()), None)
        if tests:
            last = [ln for ln in tests.read_text().splitlines() if ln.strip()][-1]
            out += ["`tests/test_gpu.py` on that machine: %s." % code(last), ""]
        out += ["Data: [`%s/`](%s)." % (rel(d), _link(d, ctx.page_dir)), ""]
    return "\n".join(out)


def startup_table(ctx: Ctx) -> tuple | None:
    p = ctx.csv("startup_cost.csv")
    if p is None:
        return None
    rows = read_csv(p, {"venvs": "str", "runs": "int", "cpu_without_ms": "num",
                        "cpu_with_ms": "num", "cpu_diff_ms": "num", "cpu_diff_se_ms": "num",
                        "wall_diff_ms": "num", "wall_diff_se_ms": "num"})
    meta = read_meta(p)
    body = [[r["venvs"], r["runs"], "%.2f / %.2f ms" % (r["cpu_without_ms"], r["cpu_with_ms"]),
             "%+.2f +- %.2f ms" % (r["cpu_diff_ms"], r["cpu_diff_se_ms"]),
             "%+.2f +- %.2f ms" % (r["wall_diff_ms"], r["wall_diff_se_ms"])] for r in rows]
    out = [measured(meta), "",
           table(["venvs", "starts each", "CPU per start without / with",
                  "difference (mean +- s.e.)", "wall-clock difference"], body, {1}),
           "", files_line(ctx, p)]
    return "\n".join(out), p


def transport_label(name: str) -> str:
    """A sweep row's settings as the docs show them."""
    if name == "defaults":
        return "Open MPI's defaults"
    if name == "both":
        return "`mpi_yield_when_idle=1`, `btl_tcp_links=4`"
    parts = ["btl_tcp_links=4" if part == "links=4" else part for part in name.split(", ")]
    return ", ".join("`%s`" % part if "=" in part else part for part in parts)


def transport_table(ctx: Ctx) -> tuple | None:
    """benchmarks/linkcheck.py --sweep: each candidate Open MPI setting, per link rate."""
    p = ctx.csv("transport-netns/transport.csv")
    if p is None:
        return None
    rows = read_csv(p, {"settings": "str", "link_gbit": "num", "grad_MB": "num",
                        "wire_ms": "num", "allreduce_ms": "num", "vs_wire": "num",
                        "cpu_per_wall": "num", "half_rtt_us": "num", "half_rtt_busy_us": "num",
                        "store_ms": "num", "store_vs_wire": "num", "store_cpu_per_wall": "num",
                        "rounds": "int"})
    meta = read_meta(p)
    first = rows[0]
    out = ["Between two emulated hosts, each with a core of its own: a raw mpi4py allreduce "
           "of %.1f MB, the default store's allreduce of a model's gradients (the same bytes "
           "in %s; across hosts the store moves them with its own point-to-point messages) "
           "and an MPI round trip, per Open MPI setting on top of Open MPI's defaults, median "
           "of %d alternating rounds. *vs wire* is the time over the ring's wire time. %s"
           % (first["grad_MB"], "%s's %s arrays" % (meta["model"], meta["arrays"])
              if "model" in meta else "its arrays", first["rounds"], measured(meta)), ""]
    for rate in dict.fromkeys(r["link_gbit"] for r in rows):
        here = [r for r in rows if r["link_gbit"] == rate]
        body = [[transport_label(r["settings"]),
                 "%.0f ms" % r["allreduce_ms"], x2(r["vs_wire"]), "%.2f" % r["cpu_per_wall"],
                 "%.0f ms" % r["store_ms"], x2(r["store_vs_wire"]),
                 "%.2f" % r["store_cpu_per_wall"],
                 "%s / %s" % (us(r["half_rtt_us"]), us(r["half_rtt_busy_us"]))] for r in here]
        out += ["At %g Gbit/s (wire time %.0f ms):" % (rate, here[0]["wire_ms"]), "",
                table(["Open MPI settings", "raw allreduce", "vs wire", "CPU / wall",
                       "store's allreduce", "vs wire", "CPU / wall",
                       "MPI half round trip, quiet / beside a busy process"], body,
                      {1, 2, 3, 4, 5, 6}), ""]
    out.append(transport_reading(rows))
    out += ["", files_line(ctx, p)]
    return "\n".join(out), p


def transport_reading(rows: list) -> str:
    """What the candidates tried on top of btl_tcp_links=4 did to the store's
    allreduce, per rate, against btl_tcp_links=4 alone."""
    parts = []
    for rate in dict.fromkeys(r["link_gbit"] for r in rows):
        here = [r for r in rows if r["link_gbit"] == rate]
        alone = [r for r in here if r["settings"] == "btl_tcp_links=4"]
        more = [r for r in here if r["settings"].startswith("links=4, ")]
        if not alone or not more:
            continue
        parts.append("at %g Gbit/s %s the wire time at %s of a core (`btl_tcp_links=4` alone: "
                     "%s at %.2f)" % (rate, span([r["store_vs_wire"] for r in more], x2),
                                      span([r["store_cpu_per_wall"] for r in more],
                                           lambda v: "%.2f" % v),
                                      x2(alone[0]["store_vs_wire"]),
                                      alone[0]["store_cpu_per_wall"]))
    if not parts:
        return ""
    return ("With each of the other candidates added to `btl_tcp_links=4`, the store's "
            "allreduce took %s." % "; ".join(parts))


def startup_mpi_table(ctx: Ctx) -> tuple | None:
    """benchmarks/startup.py: a job's MPI start with and without the transport defaults."""
    p = ctx.csv("startup_mpi.csv")
    if p is None:
        return None
    rows = read_csv(p, {"settings": "str", "transport": "str", "ranks": "int", "rounds": "int",
                        "init_ms": "num", "init_cpu_ms": "num", "job_s": "num"})
    meta = read_meta(p)
    body = [[r["settings"], code(r["transport"]) if "=" in r["transport"] else r["transport"],
             r["ranks"], "%.0f ms" % r["init_ms"],
             "%.0f ms" % r["init_cpu_ms"], "%.2f s" % r["job_s"]] for r in rows]
    out = ["`mpirun -np N` jobs whose ranks import mxnet and create an `mpi` store (which "
           "initialises MPI; with several ranks it includes waiting for the others to "
           "arrive), alternating with and without the defaults; medians of %d jobs each, "
           "the slowest rank of each job. %s" % (rows[0]["rounds"], measured(meta)), "",
           table(["settings", "transport variables", "ranks", "store creation (MPI start)",
                  "its CPU time", "whole job"], body, {2, 3, 4, 5}),
           "", files_line(ctx, p)]
    return "\n".join(out), p


def sec_startup(ctx: Ctx) -> str | None:
    got = startup_table(ctx)
    if got is None:
        return None
    return "\n".join(["## Start-up hook: `tools/startup_cost.py`", "",
                      "What the start-up hook (`mxnet_mpi_autoload.pth`, "
                      "[install.md](install.md#the-start-up-hook)) costs a process that never "
                      "imports mxnet: `python -c pass` started alternately in throwaway venvs "
                      "with and without the hook; CPU time is user + system of the child. "
                      "Rerun with `python tools/startup_cost.py --csv "
                      "benchmarks/results/startup_cost.csv`.", "", got[0], ""])


def sec_hybrid(ctx: Ctx) -> str:
    return "\n".join([
        "## Hybrid routes: `benchmarks/hybrid.py`", "",
        "Who talks to the parameter servers in the hybrid stores: the group leader, or "
        "every rank for its share of the keys (`--route sharded`, `dist_async_mpi` only). "
        "`.venv/bin/python benchmarks/hybrid.py` times a push/pull step of dense keys per "
        "store and route, each job started by `python -m mxnet_mpi.launch`, and prints a "
        "table (JSON with `--out`); no results are kept here.", ""])


def sec_other(ctx: Ctx) -> str | None:
    """A plain table for every CSV no section claimed (all columns as written)."""
    rest = [p for p in sorted(ctx.results.rglob("*.csv")) if p.resolve() not in ctx.used]
    if not rest:
        return None
    out = ["## Other results", ""]
    for p in rest:
        with open(p, newline="") as f:
            data = list(csv.reader(f))
        if not data or not data[0]:
            raise ReportError("%s: empty, or no header row" % rel(p))
        for i, fields in enumerate(data[1:], 2):
            if fields and len(fields) != len(data[0]):
                raise ReportError("%s line %d: %d fields, the header has %d"
                                  % (rel(p), i, len(fields), len(data[0])))
        meta = read_meta(p)

        def cell(v: str) -> str:
            """As written, but long floats (full precision from Python) to 4 figures."""
            try:
                return sig(float(v), 4) if len(v) > 8 and "." in v else v
            except ValueError:
                return v
        out += ["### `%s`" % p.relative_to(ctx.results), ""]
        if meta.get("what"):
            out += [meta["what"], ""]
        out += [measured(meta), "", table(data[0], [[cell(v) for v in r] for r in data[1:] if r]),
                "", files_line(ctx, p), figure(p.with_suffix(".png"), ctx.page_dir, p.stem), ""]
    return "\n".join(out)


SECTIONS = [sec_allreduce, sec_overhead, sec_overlap, sec_cluster, sec_preempt, sec_projection,
            sec_epoch,
            sec_faults, sec_gpu, sec_startup, sec_hybrid, sec_other]
INCLUDES = {"faults": faults_table, "startup-cost": startup_table, "transport": transport_table,
            "startup-mpi": startup_mpi_table}


def benchmarks_page(results: Path, page_dir: Path) -> str:
    ctx = Ctx(results, page_dir)
    parts = [s(ctx) for s in SECTIONS]
    parts = [p for p in parts if p]
    toc = [re.match(r"## (.*)", p).group(1) for p in parts]
    head = ["# Benchmarks", "",
            "<!-- Generated by benchmarks/report.py from benchmarks/results/: edit the script "
            "or the results, then run `make report`. -->", "",
            "Each benchmark prints a table and writes a CSV (and most a PNG) into "
            "`benchmarks/results/`, with a note beside it (`<name>.meta.json`; `cluster.json` for "
            "the cluster run) of the machine, date, "
            "load, command and commit (and `$BENCH_NOTE`, if set, e.g. `BENCH_NOTE='machine "
            "shared with other jobs'`); `make report` turns them into this page. Run the "
            "benchmarks without `mpirun` (they start their own jobs); `BENCH_ARGS=--quick` "
            "makes most of them shorter. Machines are shared and noisy: compare rows of one "
            "table, not across tables.", ""]
    head += ["- [%s](#%s)" % (t, slug(t)) for t in toc] + [""]
    return "\n".join(head + parts).rstrip() + "\n"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def fill_blocks(text: str, results: Path, page_dir: Path, page: Path) -> str:
    def sub(m):
        name = m.group(2)
        if name not in INCLUDES:
            raise ReportError("%s: unknown generated block '%s' (known: %s)"
                              % (rel(page), name, ", ".join(INCLUDES)))
        got = INCLUDES[name](Ctx(results, page_dir))
        if got is None:
            raise ReportError("%s: block '%s' has no results in %s" % (rel(page), name,
                                                                     rel(results)))
        return m.group(1) + got[0] + "\n" + m.group(4)
    return BLOCK.sub(sub, text)


def render(results: Path, out: Path, docs: Path) -> dict:
    """{path: wanted text} for the benchmarks page and every docs page with a block."""
    pages = {out: benchmarks_page(results, DOCS)}
    for page in sorted(docs.glob("*.md")):
        if page.resolve() == out.resolve():
            continue
        text = page.read_text()
        if BLOCK.search(text):
            pages[page] = fill_blocks(text, results, DOCS, page)
    return pages


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    ap.add_argument("--docs", type=Path, default=ROOT / "docs",
                    help="folder of pages with generated blocks")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if a page differs from what the results give")
    args = ap.parse_args(argv)
    try:
        pages = render(args.results, args.out, args.docs)
    except ReportError as e:
        print("report.py: error: %s" % e, file=sys.stderr)
        return 2
    stale = []
    for path, text in pages.items():
        old = path.read_text() if path.is_file() else ""
        if old == text:
            continue
        stale.append(path)
        if args.check:
            diff = list(difflib.unified_diff(old.splitlines(), text.splitlines(), rel(path),
                                             "generated", lineterm="", n=1))
            print("\n".join(diff[:40] + (["..."] if len(diff) > 40 else [])), file=sys.stderr)
        else:
            path.write_text(text)
            print("wrote %s" % rel(path))
    if args.check and stale:
        print("report.py: out of date with %s: %s; run `make report`"
              % (rel(args.results), ", ".join(rel(p) for p in stale)), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
