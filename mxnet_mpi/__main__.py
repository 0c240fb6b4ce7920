"""``python -m mxnet_mpi SCRIPT ARGS...``: see mxnet_mpi.runner."""

import sys

from mxnet_mpi.runner import run

sys.exit(run(sys.argv[1:]))
