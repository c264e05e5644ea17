"""Reads after a GTID (``find`` with ``after``), parked until this member has
applied it, without holding a reader thread.

A read whose GTID is not applied yet is parked here, and one daemon thread
(started at the first park) releases it to the reader pool once the applied
point reaches it, or answers ``ReadConcernTimeout`` at its deadline. The
thread wakes on ``kick()``: the primary kicks after each commit (its writes
are applied as they commit), a secondary's applier rings the member's
"applied" doorbell after each batch (``raymx.actors.doorbell``), and the shard
process kicks on that ring. Between kicks it sleeps until the next deadline,
re-reading the applied point at most every ``SAFETY_POLL_S`` as a safety net
(a lost ring): no polling per read, no thread per read.
"""
from __future__ import annotations

import heapq
import itertools
import threading
import time
from typing import Callable

from raymx.storage.errors import LimitExceeded
from raymx.storage.gtid import GTID

SAFETY_POLL_S = 0.5


class _Wait:
    __slots__ = ("g", "deadline", "go", "late", "conn", "done")

    def __init__(self, g, deadline, go, late, conn):
        self.g, self.deadline, self.go, self.late, self.conn = g, deadline, go, late, conn
        self.done = False


class AppliedWaits:
    """``park(g, timeout_ms, conn, go, late)``: call ``go()`` once ``applied()``
    reaches ``g``, or ``late(applied)`` after ``timeout_ms``; each exactly once,
    from the waits' thread."""

    def __init__(self, applied: Callable[[], GTID], per_connection_max: int):
        self._applied = applied
        self._per_conn = per_connection_max
        self._cv = threading.Condition()
        self._by_gtid: list = []      # (g, n, wait): the next to release first
        self._by_deadline: list = []  # (deadline, n, wait): the next to expire first
        self._n = itertools.count()
        self._kicked = False
        self._stopped = False
        self._t: threading.Thread | None = None
        self.waiting = 0   # parked now (read without the lock by kick)
        self.released = 0  # released to the reader pool
        self.expired = 0   # answered ReadConcernTimeout
        self.wakeups = 0   # times the thread looked at the applied point
        self.kicks = 0     # kicks while reads were parked (commits, the applier's rings)

    def park(self, g: GTID, timeout_ms: float, conn: dict, go, late) -> None:
        w = _Wait(g, time.monotonic() + timeout_ms / 1000, go, late, conn)
        with self._cv:
            mine = conn.get("after_waits", 0)
            if mine >= self._per_conn:
                raise LimitExceeded(
                    f"this connection has {mine} reads waiting for a GTID to be applied, the "
                    f"most allowed (Limits.after_waits_per_connection_max = {self._per_conn})",
                    limit="after_waits_per_connection_max", max=self._per_conn)
            conn["after_waits"] = mine + 1
            n = next(self._n)
            heapq.heappush(self._by_gtid, (g, n, w))
            heapq.heappush(self._by_deadline, (w.deadline, n, w))
            self.waiting += 1
            if self._t is None:
                self._t = threading.Thread(target=self._run, name="raymx-after-waits",
                                           daemon=True)
                self._t.start()
            self._kicked = True  # look once now: it may have been applied meanwhile
            self._cv.notify()

    def kick(self, g: GTID | None = None) -> None:
        """The applied point moved (to ``g``, if known): any thread; nearly free
        with nothing parked, or when ``g`` is below every parked read's GTID."""
        if self.waiting:
            try:
                if g is not None and g < self._by_gtid[0][0]:
                    return
            except IndexError:
                pass
            with self._cv:
                self.kicks += 1
                self._kicked = True
                self._cv.notify()

    def _take(self, w: _Wait) -> bool:
        """Under the lock: mark ``w`` finished; False if it already was."""
        if w.done:
            return False
        w.done = True
        self.waiting -= 1
        w.conn["after_waits"] = w.conn.get("after_waits", 1) - 1
        return True

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._kicked and not self._stopped:
                    if not self._by_deadline:
                        self._cv.wait()
                        continue
                    left = self._by_deadline[0][0] - time.monotonic()
                    if left <= 0:
                        break
                    if not self._cv.wait(min(left, SAFETY_POLL_S)):
                        break  # a deadline or the safety poll: look now
                self._kicked = False
                if self._stopped:
                    return
            cur = self._applied()
            now = time.monotonic()
            ready, late = [], []
            with self._cv:
                self.wakeups += 1
                while self._by_gtid and self._by_gtid[0][0] <= cur:
                    w = heapq.heappop(self._by_gtid)[2]
                    if self._take(w):
                        ready.append(w)
                while self._by_deadline and self._by_deadline[0][0] <= now:
                    w = heapq.heappop(self._by_deadline)[2]
                    if self._take(w):
                        late.append(w)
                # drop what the other heap already finished (kept small)
                if len(self._by_deadline) > 2 * self.waiting + 64:
                    self._by_deadline = [x for x in self._by_deadline if not x[2].done]
                    heapq.heapify(self._by_deadline)
                if len(self._by_gtid) > 2 * self.waiting + 64:
                    self._by_gtid = [x for x in self._by_gtid if not x[2].done]
                    heapq.heapify(self._by_gtid)
                self.released += len(ready)
                self.expired += len(late)
            for w in ready:
                _call(w.go)
            for w in late:
                _call(w.late, cur)

    def counters(self) -> dict:
        return {"waiting": self.waiting, "released": self.released, "expired": self.expired,
                "wakeups": self.wakeups, "kicks": self.kicks}

    def stop(self) -> None:
        """Stop the thread; reads still parked are answered as timed out."""
        with self._cv:
            self._stopped = True
            self._cv.notify()
            left = [x[2] for x in self._by_deadline if self._take(x[2])]
            self._by_deadline, self._by_gtid = [], []
        cur = None
        for w in left:
            if cur is None:
                try:
                    cur = self._applied()
                except Exception:
                    cur = GTID(0, 0)
            _call(w.late, cur)


def _call(fn, *args) -> None:
    try:
        fn(*args)
    except Exception:
        import logging
        logging.getLogger("raymx.shard").exception("a parked read's callback failed")
