"""Oplog trimming, a part of ``ShardService``: to the cap in small
transactions on the writer, never past what the set still needs (the
majority-committed point, what members are loading or pulling: the pure
``trim_bound`` decides) nor past the oplog archive when the set has one
(``raymx.actors.archiving``; the primary writes its segments first, on the
same thread), every ``trim_interval_ms``. On the same thread, every
``ttl_interval_ms``, the primary deletes what its TTL indexes expired
(``expire_once``).
"""
from __future__ import annotations

import logging
import time

from raymx import errors
from raymx.actors.core.replication import applied_point, trim_bound
from raymx.actors.reads import gtid_out
from raymx.storage.types import from_millis

log = logging.getLogger("raymx.shard")


TTL_BATCH = 1000  # expired documents deleted by one statement


class TrimPath:
    """Mixed into ``ShardService``: its oplog cap, the trimmer and the TTL monitor."""

    def set_oplog_cap(self, cap: dict) -> None:
        """The cap, and the archive (``cap["archive"]``: ``{"uri", "lag_s"}`` or None)."""
        self.oplog_cap = dict(cap)
        cfg = cap.get("archive")
        cur = getattr(self, "archive", None)
        if not cfg:
            if cur is not None:
                cur.close()
            self.archive = None
        elif cur is None or cur.cfg != cfg:
            from raymx.actors.archiving import Archive
            if cur is not None:
                cur.close()
            self.archive = Archive(cfg, self.limits, self.member_id)
        self._trim_wake.set()

    def archive_status(self) -> dict | None:
        a = getattr(self, "archive", None)
        return None if a is None else a.status()

    def trim_once(self, now_ms: int | None = None) -> dict:
        """Trim to the cap in small transactions on the writer; writes queued
        meanwhile run between them. Returns the trim state (also in status)."""
        cap = self.oplog_cap
        now = self.wall_ms() if now_ms is None else now_ms
        arch = getattr(self, "archive", None)
        if arch is not None:  # the primary archives what is due first
            arch.step(self.e, self.primary and not self.handing_over, self.gm.term,
                      self.majority_known, now, getattr(self, "_archive_wanted", False))
        max_bytes, age_s = cap.get("max_bytes"), cap.get("max_age_s")
        if not max_bytes and not age_s:
            self.trim["held_by"] = None
            return self.trim
        durable = self.wc.positions()
        bound, why = trim_bound(self.majority_known, applied_point(self.e), durable,
                                dict(self.heard_ms), now, self.limits.heartbeat_timeout_ms,
                                self.member_id, bool(cap.get("force")), dict(self.trim_holds))
        keep = None
        if arch is not None:  # never past the archive, even forced: nothing is lost
            keep, kwhy = arch.keep_from()
            if keep < bound:
                bound, why = keep, kwhy
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
        # trimming waits for the archive: the next round archives at once
        self._archive_wanted = bool(r.held and keep is not None and bound == keep)
        return st

    def expire_once(self, now_ms: int | None = None) -> int:
        """MongoDB's TTL monitor, on the primary: delete the documents whose
        TTL-indexed field is a date (or an array holding one, the earliest
        counting) older than the index's ``expireAfterSeconds``. Each batch of
        up to ``TTL_BATCH`` is a plain multi-document delete through the write
        path (a GTID, the oplog, replication, change streams, as a client's
        delete), filtered again there, so a document updated meanwhile stays.
        Returns how many went."""
        if not self.primary or self.handing_over:
            return 0
        now = self.wall_ms() if now_ms is None else now_ms
        r = self.e.reader()
        try:
            ttl = [(ns, ix) for ns in r.list_collections() if (c := r.coll(ns)) is not None
                   for ix in c.indexes.values() if ix.expire_after_s is not None]
        finally:
            r.t.abort()
        gone = 0
        for ns, ix in ttl:
            flt = {ix.key[0][0]: {"$lt": from_millis(now - ix.expire_after_s * 1000)}}
            while self.primary and not self._stopping.is_set():
                r = self.e.reader()
                try:
                    ids = [d["_id"] for d in r.find(ns, flt, {"_id": 1}, None, 0, TTL_BATCH)]
                finally:
                    r.t.abort()
                if not ids:
                    break
                gone += self.request({"op": "delete", "ns": ns, "multi": True, "filter": {
                    "$and": [{"_id": {"$in": ids}}, flt]}}, {}, 60)["deleted"]
                if len(ids) < TTL_BATCH:
                    break
        self.ttl["deleted"] += gone
        self.ttl["passes"] += 1
        return gone

    def _trim_loop(self):
        try:
            self._trim_rounds()
        finally:
            arch = getattr(self, "archive", None)
            if arch is not None:
                arch.close()

    def _trim_rounds(self):
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
                if isinstance(e, errors.DiskFull):  # nothing trimmed: again next round
                    log.warning("trimming the oplog was refused: %s", e)
                else:
                    log.exception("trimming the oplog failed")
            self.sweep_waiting_writes()  # they wait for transactions that may have expired
            if time.monotonic() >= self._ttl_next:
                self._ttl_next = time.monotonic() + self.limits.ttl_interval_ms / 1000
                try:
                    self.expire_once()
                    self.ttl["last_error"] = None
                except Exception as e:  # a deposed primary, a full disk: next pass
                    self.ttl["last_error"] = f"{type(e).__name__}: {e}"
                    log.warning("deleting expired documents (TTL indexes) failed: %s", e)
