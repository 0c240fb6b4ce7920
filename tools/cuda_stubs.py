"""Build stand-ins for the CUDA 11 libraries that MXNet's cu117 wheel loads.

    python tools/cuda_stubs.py LIBMXNET_SO OUTDIR

`mxnet-cu117==1.9.1` links cuBLAS, cuDNN 8, cuFFT, cuRAND, cuSOLVER,
cuSPARSE, NCCL, NVRTC and NVTX dynamically: about 1.8 GB of wheels, far more
than a device call can carry, and none of their kernels (nor MXNet's own,
built for sm_50-86 with no PTX) would run on a Hopper GPU anyway. For the GPU
check of the staging path, which needs only the CUDA runtime (carried for
real) and copies between host and GPU, each of those libraries is replaced
by a stub that exports the symbols libmxnet.so imports, with the same
version nodes:

* handle and descriptor setup (`*Create*`, `*Destroy*`, `*SetStream`, ...)
  succeeds, so MXNet can create its GPU streams;
* every other entry point returns an error status and says on stderr that it
  is a stub, so any computation through them fails loudly, never silently.

Needs readelf and a C compiler; the stubs are built on the preparing machine.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

# soname -> (symbol prefix for unversioned imports, error status returned)
LIBS = {
    "libcublas.so.11": ("cublas", 15),      # CUBLAS_STATUS_NOT_SUPPORTED
    "libcudnn.so.8": ("cudnn", 9),          # CUDNN_STATUS_NOT_SUPPORTED
    "libcufft.so.10": ("cufft", 16),        # CUFFT_NOT_SUPPORTED
    "libcurand.so.10": ("curand", 999),     # CURAND_STATUS_INTERNAL_ERROR
    "libcusolver.so.11": ("cusolver", 7),   # CUSOLVER_STATUS_INTERNAL_ERROR
    "libcusparse.so.11": ("cusparse", 7),
    "libnccl.so.2": ("nccl", 3),            # ncclInternalError
    "libnvrtc.so.11.2": ("nvrtc", 11),      # NVRTC_ERROR_INTERNAL_ERROR
    "libnvToolsExt.so.1": ("nvtx", 0),      # profiler ranges: harmless no-ops
}
SETUP = re.compile(r"Create|Destroy|SetStream|SetMathMode|SetPointerMode|SetWorkspace|"
                   r"GetStream|GetProperty|^nvtx")
NOTE = "mxnet-mpi GPU check: %s is a stub (CUDA 11 libraries not carried)"


def imports(libmxnet: str) -> dict[str, list[str]]:
    """soname -> the symbols libmxnet.so imports from it."""
    out = subprocess.run(["readelf", "-W", "--dyn-syms", libmxnet], capture_output=True,
                         text=True, check=True).stdout
    found: dict[str, set[str]] = defaultdict(set)
    for line in out.splitlines():
        cols = line.split()
        if len(cols) < 8 or cols[6] != "UND":
            continue
        name, _, version = cols[7].partition("@")
        if version in LIBS:
            found[version].add(name)
        elif not version:
            for soname, (prefix, _) in LIBS.items():
                if name.startswith(prefix):
                    found[soname].add(name)
    return {s: sorted(found.get(s, ())) for s in LIBS}


def c_source(soname: str, names: list[str], error: int) -> str:
    lines = ["#include <stdio.h>", "static char dummy[256];",
             "static void note(const char *f) { fprintf(stderr, \"%s\\n\", f); }" % NOTE]
    for n in names:
        if "ErrorString" in n or "StatusString" in n:
            body = 'return (long)"%s";' % (NOTE % n)
        elif n == "cudnnGetVersion":
            body = "return 8500;"
        elif n == "cudnnGetCudartVersion":
            body = "return 11070;"
        elif SETUP.search(n) and n != "nvrtcCreateProgram":
            body = ("if (%s && a) *(void **)a = dummy; return 0;" % int("Create" in n))
        else:
            body = 'note("%s"); return %d;' % (n, error)
        lines.append("long %s(void *a, ...) { (void)a; %s }" % (n, body))
    return "\n".join(lines) + "\n"


def build(libmxnet: str, outdir: str) -> list[Path]:
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    made = []
    for soname, names in imports(libmxnet).items():
        src = out / (soname + ".c")
        src.write_text(c_source(soname, names, LIBS[soname][1]))
        vmap = out / (soname + ".map")
        vmap.write_text("%s { global: %s local: *; };\n"
                        % (soname, "".join(n + "; " for n in names) or "dummy_;"))
        lib = out / soname
        subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(lib), str(src),
                        "-Wl,-soname," + soname, "-Wl,--version-script=" + str(vmap)],
                       check=True)
        src.unlink()
        vmap.unlink()
        made.append(lib)
        print("%-20s %3d symbols" % (soname, len(names)))
    return made


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    build(sys.argv[1], sys.argv[2])
