"""Chrome-trace timeline of collectives (open in Perfetto or about:tracing).

Set ``MXNET_MPI_TIMELINE=trace.json``: each rank records, per collective, when
it was pushed, when its inputs became ready, and when MPI ran it, and writes
``trace.rank<R>.json`` when MPI is finalised (or call ``dump``). Timestamps use
the clock of MXNet's profiler (microseconds since the epoch), so ``merge``
can put both traces on one time axis. ``start``/``stop`` record at run time
(``mxnet_mpi.horovod.start_timeline`` uses them).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from . import settings
from ._native import LIB, check

ENV_VAR = "MXNET_MPI_TIMELINE"


def names_directory(path: str) -> bool:
    """Whether `path` means a directory: an existing one, or one ending in '/'."""
    return path.endswith(("/", os.sep)) or os.path.isdir(path)


def rank_path(path: str, rank: int) -> str:
    """``trace.json`` -> ``trace.rank3.json`` (or fills a ``{rank}`` field); a
    directory (names_directory) -> ``<dir>/trace.rank3.json``."""
    if "{rank}" in path:
        return path.format(rank=rank)
    if names_directory(path):
        return os.path.join(path, "trace.rank%d.json" % rank)
    p = Path(path)
    return str(p.with_name("%s.rank%d%s" % (p.stem, rank, p.suffix or ".json")))


def start() -> None:
    """Start recording (done at MPI initialisation when $MXNET_MPI_TIMELINE is set)."""
    LIB.mxmpi_timeline_start()


def stop() -> None:
    """Stop recording and forget the events recorded so far."""
    LIB.mxmpi_timeline_stop()


def write(out: str, rank: int) -> str:
    """Write this rank's events so far to the file `out`; returns it."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    check(LIB.mxmpi_timeline_dump(out.encode(), rank))
    return out


def unwritable(out: str) -> str | None:
    """Why the file `out` cannot be written (checked without creating it:
    a failed run leaves no empty trace behind), or None."""
    target = Path(out)
    if target.is_dir():
        return "%s is a directory" % out
    if target.exists():
        return None if os.access(target, os.W_OK) else "%s is not writable" % out
    for above in target.parents:
        if above.exists():
            if not above.is_dir():
                return "%s is not a directory" % above
            return None if os.access(above, os.W_OK | os.X_OK) else (
                "the directory %s is not writable" % above)
    return None


def dump(path: str, rank: int) -> str:
    """Write this rank's events so far to rank_path(path, rank); returns the file."""
    return write(rank_path(path, rank), rank)


def requested() -> str | None:
    return settings.get(ENV_VAR)


def merge(paths: list, out: str) -> None:
    """Concatenate Chrome traces (e.g. ours and MXNet's profiler output) into one."""
    events = []
    for p in paths:
        with open(p) as f:
            data = json.load(f)
        events.extend(data["traceEvents"] if isinstance(data, dict) else data)
    with open(out, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
