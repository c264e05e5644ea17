"""One consistent read snapshot of a member, served in key-range partitions (pure: no Ray).

``SnapshotReader`` holds one LMDB read transaction for its whole life, so every
partition it serves comes from the same committed state, and the GTID that
state has applied through is exact: on a primary the data and the oplog entry
commit in one transaction; on a secondary the applier removes an entry's
``unapplied`` mark in the transaction that applies it. (A Ray actor on the
member's node wraps it: ``raymx.spark_bridge.datasource.MemberSnapshot``.)

Reading a collection *at* an older GTID ``at`` (point in time): the snapshot
holds state S (applied through G >= ``at``). For every document an op touched
in (``at``, G], its state at ``at`` is the pre-image of the *first* such op (no
document if that op was an insert); every other document is as in S. So the
reader scans the oplog range once, keeps the first image per ``_id``
(``Reader.overrides``, which majority reads use too), and merges it into the
key-ordered scan. A drop of the collection in the range makes that
impossible and is refused.

Holding a read transaction keeps LMDB from reusing pages freed after it
started (the file grows under heavy writes); snapshots are closed when read
and expire after an idle time.
"""
from __future__ import annotations

import time

from raymx import errors
from raymx.storage import codec
from raymx.storage.engine import Engine, Reader, _applied_in, split_ns
from raymx.storage.gtid import GTID, ZERO
from raymx.storage.keys import prefix_end

_PK_LEN = 4  # collection id prefix of a docs key


class SnapshotReader:
    def __init__(self, engine: Engine, wait_for: GTID | None = None, wait_s: float = 30.0,
                 clock=time.monotonic, sleep=time.sleep):
        """Open the snapshot; with ``wait_for``, only once this member has
        applied that GTID (ReadConcernTimeout after ``wait_s``)."""
        self.e = engine
        deadline = clock() + wait_s
        while True:
            t = engine.store.read()
            g = _applied_in(t) or ZERO
            if wait_for is None or g >= wait_for:
                break
            t.abort()
            if clock() >= deadline:
                raise errors.ReadConcernTimeout(
                    f"member has applied up to {g}, not {wait_for}, after {wait_s}s",
                    applied=list(g), wanted=list(wait_for))
            sleep(0.02)
        self.t = t
        self.gtid: GTID = g
        self._reader = Reader(engine, t)
        self._plans: dict[str, dict] = {}  # ns -> {"at", "overrides"} (point-in-time reads)

    # --- what the snapshot holds ----------------------------------------------
    def collections(self) -> list[str]:
        return self._reader.list_collections()

    def catalog(self) -> dict:
        """Every collection's secondary indexes in the snapshot:
        ``{ns: {name: {"key": [[path, dir]], "unique": bool}}}`` (for copies)."""
        out = {}
        for ns in self.collections():
            c = self._reader.coll(ns)
            out[ns] = {n: ix.spec() for n, ix in c.indexes.items()}
        return out

    def oplog_bounds(self) -> tuple[GTID | None, GTID | None]:
        f, last = self.t.first("oplog"), self.t.last("oplog")
        return (None if f is None else GTID.from_bytes(f[0]),
                None if last is None else GTID.from_bytes(last[0]))

    def _check_in_oplog(self, g: GTID, what: str) -> None:
        """``g`` must name an entry of this member's history (or the empty start)."""
        first, _ = self.oplog_bounds()
        if g == ZERO:
            if first is not None and first.seq > 1:
                raise errors.TooStale(f"{what} {g}: the oplog was trimmed, it starts at {first}")
            return
        if g.seq > self.gtid.seq:  # seqs are dense across terms: later in any history
            raise errors.InvalidInput(f"{what} {g} is after this snapshot's GTID {self.gtid}")
        if self.t.get("oplog", g.to_bytes()) is not None:
            return
        if first is not None and g < first:
            raise errors.TooStale(f"{what} {g} is before the oplog's first entry {first}")
        raise errors.Diverged(f"{what} {g} is not an entry of this member's oplog "
                              "(a GTID from another history, or a wrong term)")

    def _ops(self, v: bytes) -> tuple[int, list]:
        e = codec.unpack(v, "oplog entry")
        return e["ts"], self.e.entry_ops(self.t, e)

    # --- collections ------------------------------------------------------------
    def plan(self, ns: str, at: GTID | None = None, partitions: int | None = None,
             rows_per_partition: int = 100_000, sample_docs: int = 1000) -> dict:
        """Key-range partitions of ``ns`` as of ``at`` (default: the snapshot's GTID).

        Returns ``{"gtid", "count", "parts": [[lo, hi, rows]], "sample": packed
        array of up to ``sample_docs`` documents spread over the collection}``.
        ``lo``/``hi`` are docs keys (collection prefix included), ``hi`` exclusive.
        """
        split_ns(ns, self.e.limits)
        at = self.gtid if at is None else GTID.parse(at)
        overrides: list | None = []
        if at != self.gtid:
            self._check_in_oplog(at, "at")
            overrides = self._reader.overrides(ns, at, self.gtid)
        c = self._reader.coll(ns)
        if c is None or overrides is None:
            # not there at `at`: not now and no drop since (refused above), or
            # created after `at`
            self._plans[ns] = {"prefix": None, "overrides": []}
            # one empty partition, so a reader still gets an (empty) block in the schema
            return {"gtid": list(at), "count": 0, "parts": [[b"", b"", 0]],
                    "sample": codec.array_header(0)}
        prefix, end = c.prefix, prefix_end(c.prefix)
        overrides = [(prefix + pk, v) for pk, v in overrides]
        self._plans[ns] = {"prefix": prefix, "overrides": overrides}
        n = sum(1 for _ in self.t.scan_keys("docs", prefix, end))
        n_est = n + sum(1 for _, v in overrides if v is not None)
        parts = partitions or max(1, -(-n_est // rows_per_partition))
        parts = max(1, min(parts, max(1, n)))
        step = max(1, n // parts)
        sstep = max(1, n // max(1, sample_docs))
        bounds, sample_keys = [prefix], []
        for i, k in enumerate(self.t.scan_keys("docs", prefix, end)):
            if i and i % step == 0 and len(bounds) < parts:
                bounds.append(k)
            if i % sstep == 0 and len(sample_keys) < sample_docs:
                sample_keys.append(k)
        bounds.append(end)
        sample = [self.t.get("docs", k) for k in sample_keys]
        sample += [v for _, v in overrides[:sample_docs] if v is not None]
        out = [[bounds[i], bounds[i + 1], n_est // parts] for i in range(len(bounds) - 1)]
        return {"gtid": list(at), "count": n_est, "parts": out,
                "sample": codec.array_header(len(sample)) + b"".join(sample)}

    def read(self, ns: str, lo: bytes, hi: bytes, max_bytes: int = 8 << 20,
             keys: bool = False) -> tuple[bytes, list | None, bytes | None]:
        """Documents with docs keys in [lo, hi) as one packed msgpack array
        (the stored bytes, never re-encoded; point-in-time images merged in),
        their primary keys if ``keys``, and the key to continue from (None: done).
        At least one document per call, then up to ``max_bytes``."""
        p = self._plans.get(ns)
        if p is None:
            raise errors.InvalidOperation(f"plan({ns!r}) first")
        if p["prefix"] is None:
            return codec.array_header(0), [] if keys else None, None
        ov = [(k, v) for k, v in p["overrides"] if lo <= k < hi]
        docs, pks, size = [], [], 0
        oi = 0
        nxt = None
        for k, v in self.t.scan("docs", lo, hi):
            while oi < len(ov) and ov[oi][0] < k:
                if ov[oi][1] is not None:  # deleted after `at`: it existed then
                    docs.append(ov[oi][1])
                    pks.append(ov[oi][0][_PK_LEN:])
                    size += len(ov[oi][1])
                oi += 1
            if oi < len(ov) and ov[oi][0] == k:
                v = ov[oi][1]  # changed after `at`: its state then (None: not there yet)
                oi += 1
            if size >= max_bytes and docs:
                nxt = k  # overrides below k were emitted; the next call takes [k, hi)
                break
            if v is not None:
                docs.append(v)
                pks.append(k[_PK_LEN:])
                size += len(v)
        if nxt is None:
            for k, v in ov[oi:]:
                if v is not None:
                    docs.append(v)
                    pks.append(k[_PK_LEN:])
        return (codec.array_header(len(docs)) + b"".join(docs), pks if keys else None, nxt)

    # --- the change stream -------------------------------------------------------
    def plan_changes(self, after: GTID, until: GTID | None = None,
                     partitions: int | None = None, entries_per_partition: int = 50_000
                     ) -> dict:
        """GTID-range partitions of the oplog entries in (after, until]."""
        after = GTID.parse(after)
        until = self.gtid if until is None else GTID.parse(until)
        self._check_in_oplog(after, "after")
        self._check_in_oplog(until, "until")
        if until < after:
            raise errors.InvalidInput(f"until {until} is before after {after}")
        lo, end = prefix_end(after.to_bytes()), prefix_end(until.to_bytes())
        n = until.seq - after.seq  # seqs are dense across terms: a subtraction
        parts = partitions or max(1, -(-n // entries_per_partition))
        parts = max(1, min(parts, max(1, n)))
        step = max(1, n // parts)
        bounds = [lo]
        if parts > 1:
            for i, k in enumerate(self.t.scan_keys("oplog", lo, end)):
                if i and i % step == 0 and len(bounds) < parts:
                    bounds.append(k)
        bounds.append(end)
        return {"after": list(after), "until": list(until), "count": n,
                "parts": [[bounds[i], bounds[i + 1], n // parts]
                          for i in range(len(bounds) - 1)]}

    def read_changes(self, lo: bytes, hi: bytes, max_bytes: int = 8 << 20
                     ) -> tuple[list, bytes | None]:
        """Entries with GTID keys in [lo, hi): ``[(gtid bytes, ts, packed ops)]``
        (spilled ops resolved in this snapshot) and the key to continue from."""
        out, size = [], 0
        for k, v in self.t.scan("oplog", lo, hi):
            if size >= max_bytes and out:
                return out, k
            ts, ops = self._ops(v)
            b = codec.pack(ops)
            out.append((k, ts, b))
            size += len(b)
        return out, None

    def close(self) -> None:
        if self.t is not None:
            self.t.abort()
            self.t = None
