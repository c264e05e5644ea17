"""FeederService: the tailable cursors a member serves to downstream producers
(in its OplogShard process, "feeder" concurrency group); decisions in
``raymx.actors.core.replication.FeederCore``."""
from __future__ import annotations

import threading
import time

from raymx.actors.core import replication as rep
from raymx.actors.process import now_ms
from raymx.storage.engine import Engine
from raymx.storage.gtid import GTID, ZERO
from raymx.storage.limits import Limits


class FeederService:
    """Tailable cursors over a member's oplog for downstream producers, served
    from the member's OplogShard process (its "feeder" concurrency group).

    Living beside the shard makes the two notifications of every replicated
    batch in-process calls: the new replicatable point after each sync
    (``on_limit``) and the durable positions a pull reports (``on_positions``,
    which releases write-concern waiters at once). On a primary the limit is
    the replicatable point's predecessor, moved only by ``on_limit``; on a
    secondary it is the end of its written oplog, re-read by every pull (the
    producer rings a doorbell after each batch to wake long-polling pulls).
    Answers carry the majority-committed point this feeder can vouch for.
    """

    def __init__(self, engine: Engine, limits: Limits, member_id: int, on_positions,
                 votes: dict | None = None):
        self.engine = engine
        self.member_id = member_id
        self.limits = limits
        self.core = rep.FeederCore(engine, limits)
        self.core.set_votes(votes or {})
        self.core.upstream_majority = engine.range().majority
        self.primary = False
        self._on_positions = on_positions
        self._core_lock = threading.Lock()   # FeederCore is not thread-safe
        self._latch = threading.Condition()  # long-polling pulls wait here
        self._version = 0                    # bumped by every notification
        self._target = ZERO                  # newest limit notified (primary)
        self.reset()

    def reset(self) -> None:
        """A secondary ships its written, gap-free oplog (chained replication); a
        new primary everything it holds (it synced before taking writes)."""
        with self._core_lock:
            self.core.truncated()
            self._target = self.engine.last()[0]
            self.core.advance(self._target)
        self._ring()

    def set_primary(self, primary: bool) -> None:
        with self._core_lock:
            self.primary = primary
        self.reset()

    def on_limit(self, limit: GTID | None = None) -> None:
        """New entries up to ``limit`` may be shipped (a primary's sync); on a
        secondary (``None``): the producer wrote a batch. Never blocks on LMDB."""
        if limit is not None:
            with self._latch:
                if limit > self._target:
                    self._target = limit
        self._ring()

    def _ring(self) -> None:
        with self._latch:
            self._version += 1
            self._latch.notify_all()

    def set_votes(self, votes: dict) -> None:
        with self._core_lock:
            self.core.set_votes(votes)

    def on_majority(self, g: GTID) -> None:
        """The majority point this member's producer learned (chained members)."""
        with self._core_lock:
            if self.core.upstream_majority is not None and g <= self.core.upstream_majority:
                return
            self.core.upstream_majority = g
        self._ring()

    def pull(self, after, after_h, max_entries: int, max_bytes: int, wait_ms: int,
             member: int, durable, applied, downstream: dict | None, term: int,
             majority=None) -> dict:
        """Entries after ``after`` (long-poll up to ``wait_ms``). Answers carry
        the majority-committed point; a pull returns, even empty, when it is
        newer than the caller's ``majority`` (change streams wait on it), but
        only after lingering ``majority_linger_ms`` for new entries: the report
        a pull carries usually moves the majority itself, and answering that at
        once would double the pulls (each a Ray call) under a light load."""
        with self._core_lock:
            stale = self.core.admit(term, self.member_id)
        if stale is not None:
            return stale
        my_term = self.engine.term
        now = now_ms()
        caller = {"durable": durable, "applied": applied, "downstream": downstream}
        t0 = time.monotonic()
        deadline = t0 + wait_ms / 1000
        linger_until = t0 + self.limits.majority_linger_ms / 1000
        known = None if majority is None else GTID(*majority)
        while True:
            with self._latch:
                seen = self._version  # read before pulling, so no notification is missed
                target = self._target
            with self._core_lock:
                if not self.primary:
                    target = self.engine.last()[0]
                if target > self.core.limit:
                    self.core.advance(target)
                out, report, changed = self.core.answer(
                    after, after_h, max_entries, max_bytes, my_term, member, self.member_id,
                    self.primary, caller, now)
            caller = None  # the positions count once, with the first answer
            if report:  # outside the lock: it reaches the write-concern waiters
                self._on_positions({m: p["durable"] for m, p in report.items()},
                                   {m: p["at_ms"] for m, p in report.items()})
            if changed:
                self._ring()  # long-polls learn the new point
            seen_mj = None if out.get("majority") is None else GTID(*out["majority"])
            if out["status"] != "ok" or out["rows"]:
                return out
            until = deadline
            if seen_mj is not None and (known is None or seen_mj > known):
                until = min(deadline, linger_until)  # news of the majority only
            with self._latch:
                left = until - time.monotonic()
                if left <= 0:
                    return out
                if self._version == seen:
                    self._latch.wait(left)

    def find_common(self, candidates: list) -> list | None:
        g = rep.match_common(self.engine, candidates)
        return None if g is None else list(g)

    def positions(self) -> dict:
        with self._core_lock:
            pos = dict(self.core.positions)
        return {m: {"durable": None if p["durable"] is None else list(p["durable"]),
                    "applied": None if p["applied"] is None else list(p["applied"]),
                    "at_ms": p["at_ms"]} for m, p in pos.items()}
