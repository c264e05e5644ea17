"""Oplog trimming, a part of ``ShardService``: to the cap in small
transactions on the writer, never past what the set still needs (the
majority-committed point, what members are loading or pulling: the pure
``trim_bound`` decides), on its own thread every ``trim_interval_ms``.
"""
from __future__ import annotations

import logging
import time

from raymx.actors.core.replication import applied_point, trim_bound
from raymx.actors.reads import gtid_out

log = logging.getLogger("raymx.shard")


class TrimPath:
    """Mixed into ``ShardService``: its oplog cap and the trimmer."""

    def set_oplog_cap(self, cap: dict) -> None:
        self.oplog_cap = dict(cap)
        self._trim_wake.set()

    def trim_once(self, now_ms: int | None = None) -> dict:
        """Trim to the cap in small transactions on the writer; writes queued
        meanwhile run between them. Returns the trim state (also in status)."""
        cap = self.oplog_cap
        max_bytes, age_s = cap.get("max_bytes"), cap.get("max_age_s")
        if not max_bytes and not age_s:
            self.trim["held_by"] = None
            return self.trim
        now = self.wall_ms() if now_ms is None else now_ms
        durable = self.wc.positions()
        bound, why = trim_bound(self.majority_known, applied_point(self.e), durable,
                                dict(self.heard_ms), now, self.limits.heartbeat_timeout_ms,
                                self.member_id, bool(cap.get("force")), dict(self.trim_holds))
        batch = self.limits.trim_batch_entries

        def step():
            t0 = time.perf_counter()
            r = self.e.trim_oplog(bound, max_bytes, None if not age_s else int(age_s * 1000),
                                  batch, now)
            return r, (time.perf_counter() - t0) * 1000
        while True:
            r, ms = self.on_writer(step).result()
            st = self.trim
            st["trimmed"] += r.trimmed
            if r.trimmed:
                st["txns"] += 1
                st["max_txn_entries"] = max(st["max_txn_entries"], r.trimmed)
                st["max_txn_ms"] = max(st["max_txn_ms"], round(ms, 3))
                st["ms"] += ms
            if not r.more or self._stopping.is_set():
                break
        st["bound"] = gtid_out(bound)
        st["held_by"] = why if r.held else None
        return st

    def _trim_loop(self):
        while not self._stopping.is_set():
            self._trim_wake.wait(self.limits.trim_interval_ms / 1000)
            self._trim_wake.clear()
            if self._stopping.is_set():
                return
            try:
                self.trim_once()
                self.trim["last_error"] = None
            except Exception as e:  # report and retry next round
                self.trim["last_error"] = f"{type(e).__name__}: {e}"
                log.exception("trimming the oplog failed")
