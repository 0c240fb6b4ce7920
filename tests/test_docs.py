"""The docs: generated figures match benchmarks/results/, links resolve, the README is a
front page. No MPI, no MXNet: benchmarks/report.py is standard library only."""

from __future__ import annotations

import csv
import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "benchmarks" / "report.py"
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPORT), *args], capture_output=True,
                          text=True, timeout=60)


def test_generated_docs_match_results():
    """docs/benchmarks.md and every generated block are what the CSVs give."""
    r = report("--check")
    assert r.returncode == 0, r.stderr


def test_report_into_temp_copy_matches(tmp_path):
    """From a copy whose generated parts are blank, the report rewrites them
    as they stand (a copy that already matched would prove nothing)."""
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    blanked = 0
    for page in docs.glob("*.md"):
        text = page.read_text()
        emptied = re.sub(r"(<!-- report\.py: [\w-]+ -->\n).*?(<!-- /report\.py -->)",
                         r"\1\2", text, flags=re.S)
        blanked += emptied != text
        page.write_text(emptied)
    (docs / "benchmarks.md").write_text("")
    assert blanked >= 3   # faults.md and across-hosts.md hold generated blocks
    r = report("--out", str(docs / "benchmarks.md"), "--docs", str(docs))
    assert r.returncode == 0, r.stderr
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert (docs / page.name).read_text() == page.read_text(), (
            "%s differs from what benchmarks/report.py writes: run `make report`" % page.name)


@pytest.fixture()
def results(tmp_path) -> Path:
    dst = tmp_path / "results"
    shutil.copytree(ROOT / "benchmarks" / "results", dst,
                    ignore=shutil.ignore_patterns("*.png"))
    return dst


def _edit_line(path: Path, line: int, fn) -> None:
    lines = path.read_text().splitlines(keepends=True)
    lines[line - 1] = fn(lines[line - 1])
    path.write_text("".join(lines))


@pytest.mark.parametrize("damage, message", [
    ("number", "allreduce.csv line 3: column 'time_us' is 'fast', not a number"),
    ("ragged", "allreduce.csv line 4: 7 fields, the header has 8"),
    ("column", "allreduce.csv: missing column(s) time_us"),
    ("empty", "allreduce.csv: empty, or no header row"),
    ("note", "allreduce.csv has no note"),
    ("note-date", "allreduce.meta.json: no 'date'"),
])
def test_report_fails_clearly_on_bad_results(results, tmp_path, damage, message):
    csv = results / "allreduce.csv"
    if damage == "number":
        _edit_line(csv, 3, lambda s: re.sub(r"^(([^,]*,){4})[^,]*", r"\1fast", s))
    elif damage == "ragged":
        _edit_line(csv, 4, lambda s: s.rsplit(",", 1)[0] + "\n")
    elif damage == "column":
        _edit_line(csv, 1, lambda s: s.replace("time_us", "time"))
    elif damage == "empty":
        csv.write_text("")
    elif damage == "note":
        (results / "allreduce.meta.json").unlink()
    elif damage == "note-date":
        (results / "allreduce.meta.json").write_text('{"machine": "m"}')
    out = tmp_path / "benchmarks.md"
    r = report("--results", str(results), "--out", str(out), "--docs", str(tmp_path))
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists()


def test_report_takes_new_columns_and_csvs(results, tmp_path):
    """Columns a table does not know, and CSVs no section knows, are shown, not refused."""
    cluster = results / "cluster.csv"
    lines = cluster.read_text().splitlines()
    # cluster.py writes hosts, wire_ms, steady_ms and cpu_per_wall itself; "spare" is new
    assert "hosts" in lines[0] and "cpu_per_wall" in lines[0] and "steady_ms" in lines[0]
    lines[0] += ",spare"
    lines[1:] = [ln + ",x%d" % i for i, ln in enumerate(lines[1:])]
    cluster.write_text("\n".join(lines) + "\n")
    # cluster.py's own note of the run, which linkcheck.csv (written by the same run) shares
    (results / "cluster.json").write_text(
        '{"date": "2026-01-01T00:00:00Z", "machine": "vm, 2 cores", "binding": "cores", '
        '"transport": "btl_tcp_links=4", "load_average": ["1.0", "2.0"], "quick": true}')
    (results / "linkcheck.csv").write_text("link,measured_gbit\nveth0,1.98\n")
    (results / "faults.csv").rename(results / "other.csv")
    (results / "faults.meta.json").rename(results / "other.meta.json")
    out = tmp_path / "benchmarks.md"
    r = report("--results", str(results), "--out", str(out), "--docs", str(tmp_path))
    assert r.returncode == 0, r.stderr
    page = out.read_text()
    assert ("| hosts | link Gb/s | store | ms/step | vs max | speed-up | steady ms/step | "
            "CPU/wall | note | spare |") in page
    # the default store's first row, with its new column, whatever the figures
    rows = list(csv.DictReader(io.StringIO(cluster.read_text())))
    first = next(i for i, r in enumerate(rows) if r["store"] == "mpi")
    assert re.search(r"\| 2 \| [\d.]+ \| mpi \(default mode\) \| [\d,]+ \| [\d.]+ \| "
                     r"[\d.]+ \| [\d,.]+ \| [\d.]+ \|  \| x%d \|" % first, page), page[:3000]
    assert "wire time" in page and "%.0f" % float(rows[first]["wire_ms"]) in page
    assert "### `linkcheck.csv`" in page and "| veth0 | 1.98 |" in page
    assert "### `other.csv`" in page and "prterun noticed" in page
    assert page.count("*Measured 2026-01-01T00:00:00Z on vm, 2 cores; load average 1.0 to 2.0; "
                      "binding: cores; transport: btl_tcp_links=4; `--quick`.*") == 2


def _slugs(page: Path) -> set:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    out = set()
    for h in re.findall(r"^#{1,6} (.+)$", text, re.M):
        s = re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
        out.add(s)
    return out


def test_relative_links_resolve():
    """Every relative link of the README and docs/ names a file that exists and, with a
    #fragment into a Markdown page, a heading of that page."""
    bad = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, frag = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                bad.append("%s: %s (no such file)" % (page.relative_to(ROOT), target))
            elif frag and dest.suffix == ".md" and frag not in _slugs(dest):
                bad.append("%s: %s (no such heading)" % (page.relative_to(ROOT), target))
    assert not bad, "\n".join(bad)


def test_readme_is_a_front_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    listed = set(re.findall(r"\]\((docs/[\w-]+\.md)\)", readme))
    pages = {"docs/%s" % p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages <= listed, "pages missing from the README: %s" % sorted(pages - listed)
