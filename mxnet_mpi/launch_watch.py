"""The launcher's view of its ranks: which started where, which ended cleanly.

Each rank run through the runner connects to this listener and reports its
start (rank, host, pid) and, at the very end, its exit status (mxnet_mpi.report).
A rank has finished cleanly when it reported status 0 *and* its connection
closed (the process is gone). Open MPI's ``mpirun`` exits 0 when a whole host
is lost, so the launcher cannot trust its status alone: it asks ``verdict()``.
Pure Python, no MXNet.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from dataclasses import dataclass


@dataclass
class RankState:
    """What one rank reported."""

    host: str
    pid: int
    started: float
    done: float | None = None     # when its 'done' line came (its script finished)
    status: int | None = None     # from its 'end' line
    ended: float | None = None    # when that line came
    closed: float | None = None   # when its connection closed

    @property
    def clean(self) -> bool:
        return self.status == 0 and self.closed is not None

    @property
    def failed_at(self) -> float | None:
        """When it was known to have ended badly (None: not, or not yet)."""
        if self.status not in (None, 0):
            return self.ended
        if self.closed is not None and self.status is None:
            return self.closed
        return None


class RankWatch:
    """A TCP listener collecting the ranks' reports (one thread, selectors)."""

    def __init__(self, n: int, advertise: str) -> None:
        self.n = n
        self.t0 = time.monotonic()
        self.ranks: dict = {}
        self._lock = threading.Lock()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:   # only where the ranks are told to connect
            self._listener.bind((advertise, 0))
        except OSError:
            self._listener.bind(("", 0))
        self._listener.listen(max(16, n))
        self._listener.setblocking(False)
        self.address = "%s:%d" % (advertise, self._listener.getsockname()[1])
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ)
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="rank-watch", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ listening
    def _loop(self) -> None:
        buffers: dict = {}
        owners: dict = {}
        while not self._stop:
            for key, _ in self._sel.select(timeout=0.2):
                if key.fileobj is self._listener:
                    try:
                        conn, _ = self._listener.accept()
                    except OSError:
                        continue
                    conn.setblocking(False)
                    buffers[conn] = b""
                    self._sel.register(conn, selectors.EVENT_READ)
                    continue
                conn = key.fileobj
                try:
                    data = conn.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    self._sel.unregister(conn)
                    conn.close()
                    rank = owners.pop(conn, None)
                    buffers.pop(conn, None)
                    if rank is not None:
                        with self._lock:
                            self.ranks[rank].closed = time.monotonic()
                    continue
                buffers[conn] += data
                *lines, buffers[conn] = buffers[conn].split(b"\n")
                for line in lines:
                    self._line(conn, line.decode(errors="replace").split(), owners)

    def _line(self, conn, words: list, owners: dict) -> None:
        with self._lock:
            if len(words) == 4 and words[0] == "start" and words[1].isdigit():
                rank = int(words[1])
                owners[conn] = rank
                pid = int(words[3]) if words[3].isdigit() else 0
                self.ranks[rank] = RankState(words[2], pid, time.monotonic())
            elif len(words) == 2 and words[0] == "done" and conn in owners:
                self.ranks[owners[conn]].done = time.monotonic()
            elif len(words) == 2 and words[0] == "end" and conn in owners:
                state = self.ranks[owners[conn]]
                state.ended = time.monotonic()
                state.status = int(words[1]) if words[1].lstrip("-").isdigit() else 1

    def close(self) -> None:
        """Stop listening (the reports already received stay readable)."""
        self._stop = True
        self._thread.join(timeout=2)
        for key in list(self._sel.get_map().values()):
            try:
                key.fileobj.close()
            except OSError:
                pass
        self._sel.close()

    # ------------------------------------------------------------ reading
    @property
    def reporting(self) -> bool:
        """Whether the ranks report at all (run through the runner)."""
        with self._lock:
            return bool(self.ranks)

    def first_failure(self) -> tuple | None:
        """(seconds since start, rank, host) of the first rank known to have
        ended badly, or None."""
        with self._lock:
            bad = [(s.failed_at, r, s.host) for r, s in self.ranks.items()
                   if s.failed_at is not None]
        if not bad:
            return None
        at, rank, host = min(bad)
        return at - self.t0, rank, host

    def all_closed(self) -> bool:
        with self._lock:
            return len(self.ranks) >= self.n and all(s.closed for s in self.ranks.values())

    def exit_pending(self) -> tuple | None:
        """Once every rank's script has finished but some process has not
        ended: (seconds since the last script finished, ["rank R on host H
        (where it is stuck)", ...]); else None."""
        with self._lock:
            states = dict(self.ranks)
        # a process already gone (os._exit skips the 'done' line) has finished too
        finished = [s.done if s.done is not None else s.closed for s in states.values()]
        if len(states) < self.n or None in finished:
            return None
        stuck = ["rank %d on host %s (%s)" % (r, s.host, _exit_phase(s))
                 for r, s in sorted(states.items()) if s.closed is None]
        if not stuck:
            return None
        return time.monotonic() - max(finished), stuck

    def verdict(self) -> list:
        """Lines naming every rank (grouped by host) that did not finish
        cleanly, the first to fail first; [] when every rank finished cleanly
        (or no rank reports)."""
        with self._lock:
            if not self.ranks:
                return []
            states = dict(self.ranks)
        groups: dict = {}
        for rank, s in sorted(states.items()):
            if s.clean:
                continue
            if s.status not in (None, 0):
                what = "exited with status %d" % s.status
            elif s.closed is not None:
                what = "ended without a clean exit (killed, aborted, or its host was lost)"
            elif s.done is not None:
                what = "finished its script but did not exit (%s)" % _exit_phase(s)
            else:
                what = ("never reported its end: its host is unreachable (network down?) "
                        "or the process hangs")
            key = (s.host, what)
            first = s.failed_at if s.failed_at is not None else float("inf")
            at, ranks = groups.get(key, (first, []))
            groups[key] = (min(at, first), ranks + [rank])
        lines = []
        for (host, what), (at, ranks) in sorted(groups.items(), key=lambda kv: kv[1][0]):
            when = "" if at == float("inf") else ", at %.1f s" % (at - self.t0)
            lines.append("host %s: rank%s %s %s%s" % (
                host, "s" if len(ranks) > 1 else "", ", ".join(map(str, ranks)), what, when))
        missing = sorted(set(range(self.n)) - set(states))
        if missing:
            lines.append("rank%s %s never reported its start (not started: its host lost "
                         "or unreachable?)" % ("s" if len(missing) > 1 else "",
                                               ", ".join(map(str, missing))))
        return lines


def _exit_phase(state: RankState) -> str:
    """Where a rank whose script finished is while its process lives on."""
    if state.ended is None:
        return "in its exit handlers"
    return ("after its exit handlers: objects freed at interpreter exit, or MPI "
            "finalisation")
