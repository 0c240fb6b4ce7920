"""Load stand-ins for stale native libraries through mxnet_mpi's own loader.

  python abi_stale.py OUT_DIR

Each stand-in is a small shared library built here that reports the real
library's ABI (mxmpi_abi) with one thing changed, as a library built from
older sources or against another MXNet or MPI would. Prints one JSON object:
case -> the ImportError message (or "loaded" when the loader accepted it).
"""

import json
import subprocess
import sys
from pathlib import Path

from mxnet_mpi import _native

real = _native.LIB.mxmpi_abi().decode()
mpi = _native.LIB.mxmpi_mpi_library().decode()


def changed(**edits: str) -> str:
    """The real report with some keys set to other values ('' removes a key),
    and keys that are not in it added."""
    report = _native.parse_report(real)
    for key, value in edits.items():
        report[key.replace("__", ".")] = value
    return "".join("%s=%s\n" % (k, v) for k, v in report.items() if v != "")


CASES = {
    "abi_version": changed(abi=str(_native.ABI_VERSION + 1)),
    "calldesc": changed(CallDesc__size="120", CallDesc__aux="104"),
    "calldesc_new_field": changed(CallDesc__size="120", CallDesc__extra="112"),
    "enum": changed(OpKind__kBroadcast="5"),
    "mxnet": changed(mxnet="10800", mxnet_version="1.8.0"),
    "mpi": changed(mpi="Open MPI 4.1.6"),
    "no_report": None,
}


def build(case: str, report, out: Path) -> str:
    c = out / (case + ".c")
    text = 'const char* mxmpi_mpi_library(void) { return %s; }\n' % json.dumps(mpi)
    if report is not None:
        text += 'const char* mxmpi_abi(void) { return %s; }\n' % json.dumps(report)
    c.write_text(text)
    lib = out / ("stale_%s.so" % case)
    subprocess.check_call(["cc", "-shared", "-fPIC", "-o", str(lib), str(c)])
    return str(lib)


def main() -> None:
    out = Path(sys.argv[1])
    results = {}
    for case, report in [("real", None), *CASES.items()]:
        try:
            # "real": the package's own library, loaded again
            _native._load(None if case == "real" else build(case, report, out))
            results[case] = "loaded"
        except ImportError as exc:
            results[case] = str(exc)
    print(json.dumps(results))


main()
