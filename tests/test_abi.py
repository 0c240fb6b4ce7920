"""The native library's ABI check: a stale or foreign build fails to load with
a message that names what differs and how to rebuild (not a crash later)."""

import _ctypes
import json
import subprocess
import sys

from mpirun import ROOT, mpi_env, run_single

from mxnet_mpi._native import ABI_VERSION

REBUILD = "Rebuild it: `make build` in an mxnet-mpi checkout, or `pip install --no-cache-dir"


def test_stale_libraries_fail_to_load_with_a_clear_message(tmp_path):
    out = json.loads(run_single("abi_stale.py", str(tmp_path)).stdout.strip().splitlines()[-1])
    assert out.pop("real") == "loaded"
    expected = {
        "abi_version": "its ABI version is %d, this package's is %d" % (ABI_VERSION + 1,
                                                                       ABI_VERSION),
        "calldesc": "CallDesc.size is 120 in the library, 112 here; "
                    "CallDesc.aux is 104 in the library, 96 here",
        "calldesc_new_field": "CallDesc.extra is only in the library",
        "enum": "OpKind.kBroadcast is 5 in the library, 1 here",
        "mxnet": "it was built against MXNet 1.8.0 (MXNET_VERSION 10800) but MXNet 1.9.1 "
                 "(MXGetVersion 10901) is loaded",
        "mpi": "it was built against Open MPI 4.1.6 but the MPI library loaded is "
               "'Open MPI v5.",
        "no_report": "predates this package (it reports no ABI: a stale build)",
    }
    assert set(out) == set(expected)
    for case, phrase in expected.items():
        assert phrase in out[case] and REBUILD in out[case], (case, out[case])
        assert "mxnet_mpi: the native library " in out[case], out[case]


def test_libmpi_setting_naming_another_library_says_so(tmp_path):
    """MXNET_MPI_LIBMPI naming a library that loads but is not Open MPI 5's
    libmpi.so.40 (here Python's _ctypes extension), or one that does not load:
    the error names the setting and what it must name, not 'libmpi.so.40 was
    not found'."""
    missing = str(tmp_path / "libmpi.so.40")
    for path, phrase in ((_ctypes.__file__, "was loaded, but it is not Open MPI 5's "
                                            "libmpi.so.40"),
                         (missing, "cannot be loaded")):
        proc = subprocess.run([sys.executable, "-c", "import mxnet_mpi"], cwd=str(ROOT),
                              env=mpi_env({"MXNET_MPI_LIBMPI": path}), capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode != 0, proc.stdout
        assert ("MXNET_MPI_LIBMPI=%s" % path) in proc.stderr and phrase in proc.stderr, \
            proc.stderr[-2000:]
