"""GTIDManager: hands out GTIDs, tracks the live ones, gates durability (pure core).

Commits finish out of GTID order (several shards, or a slow transaction), so
"everything below X is committed" is ``min_live()``, not the last GTID handed
out. Feeders on the primary ship only below the *replicatable point*, which is
``min_live()`` recorded *before* a durable flush and published *after* it: a
primary that crashes and recovers is then never behind a secondary.

The lock is injected (``threading.Lock`` in the shells, a null context in the
simulation) so the core imports no threads.
"""
from __future__ import annotations

import contextlib
import heapq

from raymx.storage.gtid import GTID


class GTIDManager:
    def __init__(self, term: int, next_seq: int, lock=None):
        if next_seq < 1:
            raise ValueError("seqs start at 1")
        self._term = term
        self._next = next_seq
        self._live: set[int] = set()
        self._heap: list[int] = []  # live seqs, lazily cleaned
        self._lock = lock if lock is not None else contextlib.nullcontext()
        self._replicatable = GTID(term, next_seq)

    @property
    def term(self) -> int:
        return self._term

    def allocate(self) -> GTID:
        with self._lock:
            s = self._next
            self._next += 1
            self._live.add(s)
            heapq.heappush(self._heap, s)
            return GTID(self._term, s)

    def done(self, gtid: GTID) -> None:
        """The transaction holding ``gtid`` committed, or aborted and wrote an ``n``."""
        with self._lock:
            if gtid.term != self._term or gtid.seq not in self._live:
                raise AssertionError(f"done({gtid}) for a GTID that is not live")
            self._live.remove(gtid.seq)
            while self._heap and self._heap[0] not in self._live:
                heapq.heappop(self._heap)

    def min_live(self) -> GTID:
        """The smallest live GTID, or the next one to hand out: all below are committed."""
        with self._lock:
            return GTID(self._term, self._heap[0] if self._heap else self._next)

    def live_count(self) -> int:
        with self._lock:
            return len(self._live)

    # durability gate: record before the flush, publish after it returns
    def before_sync(self) -> GTID:
        return self.min_live()

    def after_sync(self, recorded: GTID) -> GTID:
        with self._lock:
            # assertions stay on in production (they are not ``assert``)
            if recorded.term == self._term and recorded.seq > self._next:
                raise AssertionError(f"replicatable point {recorded} beyond the next GTID "
                                     f"{GTID(self._term, self._next)}")
            if recorded > self._replicatable:
                self._replicatable = recorded
            return self._replicatable

    def replicatable(self) -> GTID:
        """Entries strictly below this GTID are committed and durable."""
        with self._lock:
            return self._replicatable
