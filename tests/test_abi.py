"""The native library's ABI check: a stale or foreign build fails to load with
a message that names what differs and how to rebuild (not a crash later)."""

import json

from mpirun import run_single

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
