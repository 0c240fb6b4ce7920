"""Print docs/settings.md's generated part: the table of every MXNET_MPI_*
setting (mxnet_mpi/settings.py) and the list of those compared across ranks.

  python tools/settings_table.py

(`python -m mxnet_mpi.settings` did the same with a RuntimeWarning from runpy:
the package imports the module before running it as __main__.)
"""

from mxnet_mpi import settings

if __name__ == "__main__":
    print(settings.markdown(), end="")
