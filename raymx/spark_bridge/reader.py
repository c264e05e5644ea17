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
from itertools import islice
from operator import itemgetter

from raymx import errors
from raymx.storage import codec, query
from raymx.storage.engine import Engine, Reader, _applied_in, split_ns
from raymx.storage.gtid import GTID, ZERO
from raymx.storage.keys import T_ARR, encode_key, prefix_end, value_end
from raymx.storage.reader import _MULTIKEY, _range_bounds

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
        if first is not None and g.seq + 1 == first.seq and g < first:
            return  # trimmed, but everything after it is here (the archive's end)
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
        p = self.plan_ranges(ns, at, None, partitions, rows_per_partition, sample_docs)
        c, ov = self._planned
        if c is None or ov is None:
            # not there at `at`: not now and no drop since (refused by plan_ranges),
            # or created after `at`
            self._plans[ns] = {"prefix": None, "overrides": []}
            # one empty partition, so a reader still gets an (empty) block in the schema
            return {"gtid": p["gtid"], "count": 0, "parts": [[b"", b"", 0]],
                    "sample": p["sample"]}
        self._plans[ns] = {"prefix": c.prefix, "overrides": [(c.prefix + pk, v) for pk, v in ov]}
        n_est = p["keys"] - sum(1 for _, v in ov if v is None)
        # one key range per partition over the whole collection (COLLSCAN)
        return {"gtid": p["gtid"], "count": n_est, "sample": p["sample"],
                "parts": [[r[0][0], r[0][1], n_est // len(p["parts"])] for r in p["parts"]]}

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

    # --- planned reads: every Spark task opens its own transaction --------------
    # A read planned here at GTID ``at`` is served by other read transactions
    # (one per Spark task, in the executors' Python workers), each applied
    # through some G_i >= ``at``: each reconstructs ``at`` from its own state
    # and the oplog entries in (``at``, G_i] (``overrides``, as ``plan`` does),
    # so every partition is exactly as of ``at`` while the oplog keeps those
    # entries (the caller holds trimming at ``at``) and the history through
    # ``at`` is unchanged (``check_point``: the entry's hash-chain value).
    def entry_hash(self, g: GTID) -> int | None:
        """The hash-chain value of entry ``g`` here (0 for ZERO; None: not in the oplog)."""
        if g == ZERO:
            return 0
        v = self.t.get("oplog", g.to_bytes())
        return None if v is None else codec.unpack(v, "oplog entry")["h"]

    def check_point(self, at: GTID, h: int | None) -> None:
        """Raise unless this snapshot can be read as of ``at`` exactly as planned:
        applied through ``at`` or later, with entry ``at`` of hash ``h``."""
        got = self.entry_hash(at)
        if got is not None and got == h and at <= self.gtid:
            return
        first, _ = self.oplog_bounds()
        if got is None and first is not None and at < first:
            raise errors.TooStale(
                f"the read was planned as of {at}, and the member's oplog now starts at "
                f"{first}: it was trimmed after the read's hold on trimming expired "
                "(hold_s); read the collection again (or cache() the DataFrame)")
        raise errors.Diverged(
            f"the read was planned as of {at}, which this member no longer holds as "
            f"planned (it rolled back, applied only through {self.gtid}): read again")

    def _ranges(self, c, flt) -> tuple[str, str, list, str | None, bool]:
        """(plan name, sub-database, [[lo, hi)] key ranges, index name, whether
        a document holds an array in the index) a
        filter's top-level bounds allow: ``_id`` points or range over the docs,
        else the most selective one-field index, else the whole collection."""
        bounds = query.extract_bounds(flt, multikey=_MULTIKEY) if flt else {}
        b = bounds.get("_id")
        if b is not None and b.points is not None:
            ks = sorted({c.prefix + encode_key(v) for v in b.points})
            return "IDHACK", "docs", [[k, k + b"\x00"] for k in ks], None, False
        if b is not None:
            return "IXSCAN _id_", "docs", [list(_range_bounds(c.prefix, b))], None, False
        best = None
        for ix in c.indexes.values():
            ib = bounds.get(ix.key[0][0])
            if ib is None or len(ix.key) != 1 or not ix.every_document:
                continue  # compound, sparse, partial: the filter runs over a full scan
            score = (ib.points is not None, ix.unique)
            if best is None or score > best[0]:
                best = (score, ix, ib)
        if best is None:
            return "COLLSCAN", "docs", [[c.prefix, prefix_end(c.prefix)]], None, False
        _, ix, ib = best
        path = ix.key[0][0]
        # an index without a single array key (the whole-array entry every
        # array value has) proves no document holds an array there (through
        # a dotted path, arrays of subdocuments fan out without one)
        arr = ix.prefix + bytes((T_ARR,))
        multikey = "." in path or next(iter(self.t.scan_keys(
            "index", arr, prefix_end(arr))), None) is not None
        if ib.points is None and not multikey:
            # a range on a field that may hold arrays keeps only its low side
            # (extract_bounds): here both sides bound the scan
            ib = query.extract_bounds(flt, multikey=False)[path]
        if ib.points is not None:
            ranges = [[ix.prefix + v, value_end(ix.prefix + v, v)]
                      for v in sorted({encode_key(v) for v in ib.points})]
        else:
            ranges = [list(_range_bounds(ix.prefix, ib))]
        return f"IXSCAN {ix.name}", "index", ranges, ix.name, multikey

    def plan_ranges(self, ns: str, at: GTID | None = None, flt: dict | None = None,
                    partitions: int | None = None, rows_per_partition: int = 100_000,
                    sample_docs: int = 1000, min_partitions: int = 1) -> dict:
        """Partitions of the documents of ``ns`` matching ``flt`` as of ``at``,
        for readers with their own transactions (``read_part``): ``partitions``,
        or one per ``rows_per_partition`` but at least ``min_partitions``.

        Returns ``{"gtid", "hash", "plan", "db", "index", "ranges", "parts",
        "keys", "sample"}``: ``parts`` is one list of ``[lo, hi)`` key ranges of
        ``db`` per partition, together ``ranges``; ``keys`` the entries the
        read will examine (the stored ones in range, plus the documents changed
        after ``at``); ``sample`` a packed array of documents spread over them.
        A filter the query language does not know raises InvalidFilter naming
        the operator, before anything is read."""
        split_ns(ns, self.e.limits)
        query.compile_filter(flt)
        at = self.gtid if at is None else GTID.parse(at)
        ov: list | None = []
        if at != self.gtid:
            self._check_in_oplog(at, "at")
            ov = self._reader.overrides(ns, at, self.gtid)
        out = {"gtid": list(at), "hash": self.entry_hash(at), "plan": "EOF", "db": "docs",
               "index": None, "ranges": [], "parts": [[]], "keys": 0,
               "sample": codec.array_header(0)}
        c = self._reader.coll(ns)
        self._planned = (c, ov)  # for plan()
        if c is None or ov is None:
            return out
        name, db, ranges, ix, multikey = self._ranges(c, flt)
        ranges = [r for r in ranges if r[1] is None or r[0] < r[1]]
        # one pass over the keys: their count, and an evenly spread subsample
        # (every `every`-th key, `every` doubling to keep it small) that the
        # partition bounds and the sample are taken from
        sparse, every, n = [], 1, 0
        for ri, (lo, hi) in enumerate(ranges):
            for k in self.t.scan_keys(db, lo, hi):
                if n % every == 0:
                    sparse.append((ri, k))
                    if len(sparse) >= 8192:
                        sparse, every = sparse[::2], every * 2
                n += 1
        n_ov = sum(1 for _, v in ov if v is not None)
        parts = partitions or max(min_partitions, -(-(n + n_ov) // rows_per_partition))
        parts = max(1, min(parts, len(sparse)))
        cuts = [sparse[j * len(sparse) // parts] for j in range(1, parts)]
        cut, cur, ci = [], [], 0
        for ri, (lo, hi) in enumerate(ranges):
            start = lo
            while ci < len(cuts) and cuts[ci][0] == ri:
                k = cuts[ci][1]
                if k > start:
                    cur.append([start, k])
                cut.append(cur)
                cur, start, ci = [], k, ci + 1
            cur.append([start, hi])
        cut.append(cur)
        sample_keys = [k for _, k in sparse[::max(1, len(sparse) // max(1, sample_docs))]]
        sample_keys = sample_keys[:sample_docs]
        if db == "docs":
            sample = [self.t.get("docs", k) for k in sample_keys]
        else:
            sample = [self.t.get("docs", c.prefix + self.t.get("index", k)) for k in sample_keys]
        sample += [v for _, v in ov[:sample_docs] if v is not None]
        out.update(plan=name, db=db, index=ix, multikey=multikey, ranges=ranges, parts=cut,
                   keys=n + len(ov),
                   sample=codec.array_header(len(sample)) + b"".join(sample))
        return out

    def read_part(self, ns: str, plan: dict, part: int, flt: dict | None = None,
                  batch_docs: int = 4096):
        """The documents of partition ``part`` of ``plan`` (``plan_ranges``, from
        any transaction of this member's history), as of the plan's GTID, in
        lists of up to ``batch_docs`` dicts; ``self.examined`` counts the
        documents looked at."""
        at = GTID(*plan["gtid"])
        self.check_point(at, plan["hash"])
        self.examined = 0
        ov: dict = {}
        if at != self.gtid:
            o = self._reader.overrides(ns, at, self.gtid)
            if o is None:
                return
            ov = dict(o)
        c = self._reader.coll(ns)
        if c is None or plan["plan"] == "EOF":
            return
        ranges = plan["parts"][part]
        match = None if flt is None else query.compile_filter(flt)
        if plan["db"] == "docs":
            src = self._docs_in(c, ranges, ov)
        else:
            src = self._index_in(c, c.indexes[plan["index"]], ranges, plan["ranges"], ov,
                                 part == 0, plan["multikey"])
        if match is None:  # the stored bytes of a batch, decoded in one C call
            while True:
                chunk = list(islice(src, batch_docs))
                if not chunk:
                    return
                self.examined += len(chunk)
                yield codec.unpack(codec.array_header(len(chunk)) + b"".join(chunk))
        chunk: list = []
        for b in src:
            self.examined += 1
            d = codec.unpack_document(b)
            if match(d):
                chunk.append(d)
                if len(chunk) >= batch_docs:
                    yield chunk
                    chunk = []
        if chunk:
            yield chunk

    def _docs_in(self, c, ranges: list, ov: dict):
        """Packed documents with docs keys in ``ranges``, the images as of the
        point merged in for those changed since (``ov``: pk -> image or None)."""
        from bisect import bisect_left
        ovk = sorted((c.prefix + pk, v) for pk, v in ov.items())
        keys = [k for k, _ in ovk]
        for lo, hi in ranges:
            oi = bisect_left(keys, lo)
            end = len(keys) if hi is None else bisect_left(keys, hi)
            if oi == end:  # nothing changed here since the point: as stored
                yield from map(itemgetter(1), self.t.scan("docs", lo, hi))
                continue
            for k, v in self.t.scan("docs", lo, hi):
                while oi < end and keys[oi] < k:
                    if ovk[oi][1] is not None:  # deleted since: it existed then
                        yield ovk[oi][1]
                    oi += 1
                if oi < end and keys[oi] == k:
                    v = ovk[oi][1]  # changed since: its state then (None: not there yet)
                    oi += 1
                if v is not None:
                    yield v
            for j in range(oi, end):
                if ovk[j][1] is not None:
                    yield ovk[j][1]

    def _index_in(self, c, ix, ranges: list, every: list, ov: dict, first: bool,
                  multikey: bool = True):
        """Packed documents through the index entries in ``ranges``. A document
        with several entries in ``every`` (the plan's ranges: an array value) is
        read through its smallest one only, so no partition repeats another's;
        the documents changed since the point are left to the first partition
        (their images then, each once)."""
        from raymx.storage.transaction import _index_entries

        def inside(k):
            return any(lo <= k and (hi is None or k < hi) for lo, hi in every)
        for lo, hi in ranges:
            for k, pk in self.t.scan("index", lo, hi):
                if pk in ov:
                    continue
                v = self.t.get("docs", c.prefix + pk)
                if v is None:
                    continue
                if multikey:  # one entry per document unless it holds an array there
                    ents = [f for _, f in _index_entries(ix, codec.unpack_document(v), pk)]
                    if len(ents) > 1 and min(e for e in ents if inside(e)) != k:
                        continue
                yield v
        if first:
            for pk, v in sorted(ov.items()):
                if v is not None:
                    yield v

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

    def iter_changes(self, lo: bytes, hi: bytes, max_ops: int = 8192):
        """Entries with GTID keys in [lo, hi) as lists of ``(gtid bytes, ts,
        ops)`` (spilled ops resolved), about ``max_ops`` ops a list."""
        out, n = [], 0
        for k, v in self.t.scan("oplog", lo, hi):
            ts, ops = self._ops(v)
            out.append((k, ts, ops))
            n += len(ops)
            if n >= max_ops:
                yield out
                out, n = [], 0
        if out:
            yield out

    def close(self) -> None:
        if self.t is not None:
            self.t.abort()
            self.t = None
