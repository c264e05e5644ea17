"""The document engine: collections, indexes, queries, transactions and the oplog.

Key layout inside the fixed sub-databases (``raymx.storage.store.DBS``):

=============  ==============================================  =====================
sub-database   key                                             value
=============  ==============================================  =====================
meta           b"term", b"next_id", b"next_spill", ...         msgpack scalar
catalog        namespace (utf-8)                               {"id", "indexes"}
docs           collection id (4 bytes) + encode_key(_id)       msgpack document
index          index id (4 bytes) + encode_key(v1..vn) + pk    pk (encode_key(_id))
oplog          GTID (16 bytes, big-endian)                     entry (raymx.storage.oplog)
oplog.refs     spill id (8 bytes) + chunk number (4 bytes)     msgpack array of ops
unapplied      GTID                                            b""
replInfo       b"min_unapplied", b"min_uncommitted"            GTID bytes
range          b"range"                                        {"first", "last", ...}
=============  ==============================================  =====================

Every statement is atomic: it runs in a nested LMDB transaction (a savepoint)
inside the caller's transaction, and its ops are logged only if it succeeds.
The data change and the oplog entry commit in the same LMDB transaction.

The engine is four modules, each importing only the ones before it:
``catalog`` (names, ids, catalog and range records, what statements report),
``reader`` (``Reader``: queries, point-in-time reads, revert plans),
``transaction`` (``Transaction``, ``WriteGroup``: statements, index entries,
applying and undoing logged ops) and this one (``Engine``: meta and terms,
appending, trimming, reading and verifying the oplog). The names other code
imports from here stay importable from here (``__all__``).
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Iterator

from raymx.storage import codec, errors, oplog
from raymx.storage.catalog import (
    _ENTRY_H, _ENTRY_OPS, _ENTRY_TS, RANGE_KEY, CollInfo, IndexInfo, RangeRecord, Stats,
    TrimResult, WriteResult, _applied_in, _pk, entry_chunks, entry_inline, index_name,
    new_id, normalize_index_key, split_ns)
from raymx.storage.gtid import GTID, ZERO
from raymx.storage.keys import encode_key, prefix_end
from raymx.storage.limits import DEFAULT, Limits
from raymx.storage.overlay import Overlay
from raymx.storage.reader import Reader
from raymx.storage.transaction import Transaction, WriteGroup, _delete_range, _index_entries

OPLOG_PAGE_MAX = 10_000  # entries in one page of rs.oplog (Engine.oplog_page)

# Re-exported: the names moved to catalog.py, reader.py and transaction.py
# that code outside them imports from here (_applied_in and _pk too, private
# helpers that importers already use).
__all__ = ["Engine", "Reader", "Transaction", "WriteGroup", "CollInfo", "IndexInfo",
           "RangeRecord", "Stats", "TrimResult", "WriteResult", "RANGE_KEY", "entry_chunks",
           "entry_inline", "index_name", "new_id", "normalize_index_key", "split_ns",
           "_applied_in", "_pk"]


FORMAT = 3  # meta b"format": the key encoding's version (keys.py)
UPGRADE_PROGRESS_S = 5.0  # a format upgrade's progress line at most this often
log = logging.getLogger(__name__)


def upgrade_keys(t) -> None:
    """Bring a store written under an older ``format`` up to ``FORMAT``, in
    write transaction ``t`` (an engine's opening, a snapshot's end).

    Format 1 keyed a Decimal128 by its nearest double, so decimals that no
    double tells apart (Decimal128("0.1") and 0.1, or two 20-digit amounts)
    shared one key, and ordered a map's fields by name before their values'
    types (MongoDB compares the types first). Formats 1 and 2 keyed binary
    bytewise in a bracket per kind (MongoDB's BinData order is length,
    subtype, bytes). Every document whose ``_id`` key changed moves to its
    new key, and every index is built again (one more pass over each
    collection's documents, once). Nothing replicated changes: keys are each
    member's own."""
    b = t.get("meta", b"format")
    fmt = codec.unpack(b) if b is not None else FORMAT
    if fmt >= FORMAT:
        return
    total = t.db_stat("docs")[0]
    shown = [time.monotonic()]

    def progress(step: str, done: int, of: int) -> None:  # at most every UPGRADE_PROGRESS_S
        if time.monotonic() - shown[0] >= UPGRADE_PROGRESS_S:
            shown[0] = time.monotonic()
            log.warning("store format %d -> %d: %s, %d of %d document(s)", fmt, FORMAT, step,
                        done, of)
    if total:
        log.warning("store format %d -> %d: re-keying %d document(s) and rebuilding their "
                    "indexes (once)", fmt, FORMAT, total)
    moved = rebuilt = docs = 0
    for k, rec in list(t.scan("catalog")):
        c = CollInfo.from_record(k.decode(), rec)
        end = prefix_end(c.prefix)
        moves, before = [], docs
        for key, v in t.scan("docs", c.prefix, end):
            docs += 1
            if not docs & 1023:
                progress("re-keying", docs, total)
            pk = encode_key(codec.unpack_document(v)["_id"])
            if c.prefix + pk != key:
                moves.append((key, c.prefix + pk, v))
        for key, new, v in moves:  # every old key goes before a new one is written
            t.delete("docs", key)
        for key, new, v in moves:
            t.put("docs", new, v)
        moved += len(moves)
        if not c.indexes:
            continue
        for ix in c.indexes.values():
            _delete_range(t, "index", ix.prefix)
        for i, (key, v) in enumerate(t.scan("docs", c.prefix, end)):  # one decode, every index
            if not i & 1023:
                progress(f"rebuilding the indexes of {c.ns}", i, docs - before)
            d = codec.unpack_document(v)
            for ix in c.indexes.values():  # entries of the new keys, checked once already
                for _, entry in _index_entries(ix, d, key[4:]):
                    t.put("index", entry, key[4:])
        rebuilt += len(c.indexes)
    t.put("meta", b"format", codec.pack(FORMAT))
    if docs:
        log.warning("store format %d -> %d (exact Decimal128 keys, MongoDB's order of maps and "
                    "binary): %d of %d document(s) moved to their new keys, %d index(es) rebuilt",
                    fmt, FORMAT, moved, docs, rebuilt)


class Engine:
    """Collections and the oplog over one store.

    Writers take turns (the store's writer lock); readers run on snapshots.
    """

    def __init__(self, store, limits: Limits = DEFAULT,
                 now_ms: Callable[[], int] | None = None):
        self.store = store
        self.limits = limits
        self._now_ms = now_ms or (lambda: int(time.time() * 1000))
        self._tail: tuple[GTID, int] | None = None  # (last GTID, its hash), a cache
        self._catalog_cache: dict[str, tuple[bytes, CollInfo]] = {}
        # queries' index uses since this engine opened ({(ns, index name): n},
        # MongoDB's $indexStats): counted where a plan picks an index
        self.index_uses: dict[tuple[str, str], int] = {}
        with store.write() as t:
            if t.get("meta", b"format") is None:
                t.put("meta", b"format", codec.pack(FORMAT))
                t.put("meta", b"term", codec.pack(0))
            else:
                upgrade_keys(t)

    def note_index(self, ns: str, name: str) -> None:
        """A query's plan uses index ``name`` of ``ns`` (a count, not a lock)."""
        k = (ns, name)
        self.index_uses[k] = self.index_uses.get(k, 0) + 1

    # meta
    def _next_counter(self, t, key: bytes) -> int:
        b = t.get("meta", key)
        n = 1 if b is None else codec.unpack(b) + 1
        t.put("meta", key, codec.pack(n))
        return n

    @property
    def term(self) -> int:
        with self.store.read() as t:
            return self.term_in(t)

    @staticmethod
    def term_in(t) -> int:
        """The durable term as transaction ``t`` sees it (a writer, which holds
        the writers' turn, sees what a new reader would: no term can commit
        while it is open)."""
        return codec.unpack(t.get("meta", b"term"))

    def set_term(self, term: int, sync: bool = True) -> None:
        """Record a term durably; terms never go down."""
        with self.store.write() as t:
            cur = codec.unpack(t.get("meta", b"term"))
            if term < cur:
                raise errors.StaleTerm(f"term {term} is below the durable term {cur}")
            t.put("meta", b"term", codec.pack(term))
        if sync:
            self.store.sync()

    def get_meta(self, key: str, default=None):
        with self.store.read() as t:
            b = t.get("meta", key.encode())
            return default if b is None else codec.unpack(b)

    def put_meta(self, key: str, value) -> None:
        with self.store.write() as t:
            t.put("meta", key.encode(), codec.pack(value))

    # transactions
    def begin(self, log: bool = True, autocommit: bool = False) -> Transaction:
        return Transaction(self, self.store.write(), log=log, autocommit=autocommit)

    def begin_snapshot(self) -> Transaction:
        """An interactive transaction: it reads one snapshot and keeps its
        writes in memory (``Overlay``) without holding the writer; its commit
        takes the writer (``Transaction.take_writer``) and fails with
        ``WriteConflict`` if another commit changed what it wrote since."""
        return Transaction(self, Overlay(self.store.read()))

    def begin_group(self) -> "WriteGroup":
        return WriteGroup(self)

    def reader(self) -> Reader:
        return Reader(self, self.store.read())

    def sync(self) -> None:
        self.store.sync()

    # oplog append: called with the writer held
    def _tail_of(self, t) -> tuple[GTID, int]:
        last = t.last("oplog")
        if last is None:
            return ZERO, 0
        g = GTID.from_bytes(last[0])
        if self._tail is not None and self._tail[0] == g:
            return self._tail
        # another process appended (a producer), or a rollback truncated: reload
        e = codec.unpack(last[1], "oplog entry")
        return g, e["h"]

    def _append(self, t, gtid: GTID | None, ts_ms: int | None, tx: Transaction,
                tail: tuple[GTID, int] | None = None):
        last, prev_h = tail or self._tail_of(t)
        if gtid is None:
            gtid = GTID(max(self.term_in(t), last.term), last.seq + 1)
        if not (gtid > last and gtid.seq == last.seq + 1):
            raise AssertionError(f"GTID {gtid} does not follow the oplog's last {last}")
        h = oplog.chain_hash(prev_h, gtid, tx._digest.digest())
        ts = self._now_ms() if ts_ms is None else ts_ms
        if tx._spill is not None:
            tx._flush_spill()
            entry = {"ts": ts, "h": h, "ref": tx._spill, "chunks": tx._chunks}
            value = codec.pack(entry)
        else:
            value = (_ENTRY_TS + codec.pack(ts) + _ENTRY_H + codec.pack(h) + _ENTRY_OPS
                     + codec.array_header(len(tx._buf)) + b"".join(tx._buf))
        t.put("oplog", gtid.to_bytes(), value)
        if gtid.term != last.term or last.seq == 0:
            # The range record is written only when something the oplog's ends
            # cannot tell changes (a term boundary); first and last are read
            # from the oplog itself, as JE rebuilds its VLSN range at start-up.
            self._update_range(t, lambda r: r.extend(gtid))
        return gtid, h

    def _committed(self, gtid: GTID, h: int) -> None:
        self._tail = (gtid, h)

    def write_noop(self, gtid: GTID | None = None, ts_ms: int | None = None) -> GTID:
        """Write an ``n`` entry: a GTID taken by a transaction that then failed,
        a new primary's first entry, or a linearizable read's confirmation."""
        tx = self.begin(autocommit=True)
        tx._log(codec.pack({"op": "n"}))
        return tx.commit(gtid, ts_ms)

    # range record
    def _update_range(self, t, fn) -> RangeRecord:
        b = t.get("range", RANGE_KEY)
        r = RangeRecord() if b is None else RangeRecord.unpack(b)
        fn(r)
        t.put("range", RANGE_KEY, r.pack())
        return r

    def range(self) -> RangeRecord:
        """The range record, with first/last/last_applied read from the oplog's ends."""
        with self.store.read() as t:
            b = t.get("range", RANGE_KEY)
            r = RangeRecord() if b is None else RangeRecord.unpack(b)
            first, last = t.first("oplog"), t.last("oplog")
            r.first = None if first is None else GTID.from_bytes(first[0])
            r.last = None if last is None else GTID.from_bytes(last[0])
            r.last_applied = _applied_in(t)
            return r

    def applied_point(self) -> GTID:
        """The newest GTID applied here (ZERO for an empty oplog)."""
        with self.store.read() as t:
            return _applied_in(t) or ZERO

    def commit_times(self, *gs: GTID | None) -> list[int | None]:
        """Each entry's commit time (ms since 1970): None for None, ZERO or
        an entry no longer in the oplog."""
        with self.store.read() as t:
            out = []
            for g in gs:
                b = None if g is None or g == ZERO else t.get("oplog", g.to_bytes())
                out.append(None if b is None else codec.entry_ts(b))
            return out

    def oplog_info(self) -> dict:
        """Size (LMDB pages of oplog and oplog.refs), entries, first/last GTID and times."""
        with self.store.read() as t:
            n, size = t.db_stat("oplog")
            size += t.db_stat("oplog.refs")[1]
            first, last = t.first("oplog"), t.last("oplog")
            return {"entries": n, "bytes": size,
                    "first": None if first is None else GTID.from_bytes(first[0]),
                    "last": None if last is None else GTID.from_bytes(last[0]),
                    "first_ts": None if first is None else codec.entry_ts(first[1]),
                    "last_ts": None if last is None else codec.entry_ts(last[1])}

    def trim_oplog(self, keep_from: GTID | None, max_bytes: int | None,
                   max_age_ms: int | None, max_entries: int,
                   now_ms: int | None = None) -> TrimResult:
        """Drop the oldest entries in ONE small write transaction (DESIGN section 3).

        Trims while the oplog is over ``max_bytes`` (estimated from the average
        entry size) or its first entry is older than ``max_age_ms``; at most
        ``max_entries`` entries, never ``keep_from`` or anything after it, and
        never the last entry (the next GTID and the hash chain continue from it).
        Spilled chunks go with their entry, and the range's first entry moves
        in the same transaction, since it is the oplog's first key. Callers
        loop while ``more`` is set, letting writers in between.
        """
        now = self._now_ms() if now_ms is None else now_ms
        res = TrimResult()
        with self.store.write() as t:
            n, size = t.db_stat("oplog")
            size += t.db_stat("oplog.refs")[1]
            last = t.last("oplog")
            if last is None:
                return res
            stop = GTID.from_bytes(last[0])
            if keep_from is not None and keep_from < stop:
                stop = keep_from
            want = 0
            if max_bytes and size > max_bytes:
                want = -(-(size - max_bytes) * n // size)
            cutoff = None if not max_age_ms else now - max_age_ms
            doomed = []  # chosen first, deleted after the scan (no cursor runs over deletes)
            scan = t.scan("oplog")
            for k, v in scan:
                if not (len(doomed) < want or (cutoff is not None and codec.entry_ts(v) < cutoff)):
                    break  # usually the first entry: nothing more is read
                if len(doomed) >= max_entries:
                    res.more = True
                    break
                if GTID.from_bytes(k) >= stop:
                    res.held = keep_from is not None and stop == keep_from
                    break
                # spilled: its chunks go with it
                doomed.append((k, None if entry_inline(v) else codec.unpack(v, "oplog entry")))
            scan.close()
            for k, e in doomed:
                for i in range(0 if e is None else e.get("chunks", 0)):
                    t.delete("oplog.refs", oplog.spill_key(e["ref"], i))
                t.delete("oplog", k)
            res.trimmed = len(doomed)
            f = t.first("oplog")
            res.first = GTID.from_bytes(f[0])
            if res.trimmed:
                b = t.get("range", RANGE_KEY)
                if b is not None:
                    r = RangeRecord.unpack(b)
                    keep = [x for x in r.terms if x[0] >= res.first.term]
                    if keep != r.terms:
                        r.terms = keep
                        t.put("range", RANGE_KEY, r.pack())
            res.bytes = t.db_stat("oplog")[1] + t.db_stat("oplog.refs")[1]
        return res

    def set_majority(self, g: GTID) -> None:
        """Record the majority-committed point in the range record (it only moves up)."""
        def up(r):
            if r.majority is None or g > r.majority:
                r.majority = g
        with self.store.write() as t:
            self._update_range(t, up)

    def last(self) -> tuple[GTID, int]:
        with self.store.read() as t:
            return self._tail_of(t)

    # reading the oplog
    def entry_ops(self, t, entry: dict) -> list[dict]:
        if "ops" in entry:
            return entry["ops"]
        ops = []
        for i in range(entry["chunks"]):
            b = t.get("oplog.refs", oplog.spill_key(entry["ref"], i))
            if b is None:
                raise errors.CorruptEntry(f"spilled chunk {i} of ref {entry['ref']} is missing")
            ops.extend(codec.unpack(b, "spilled ops"))
        return ops

    def read_oplog(self, after: GTID | None = None, limit: int | None = None
                   ) -> Iterator[tuple[GTID, dict]]:
        """Entries after ``after`` in GTID order, with spilled ops resolved."""
        start = None if after is None else prefix_end(GTID.parse(after).to_bytes())
        n = 0
        with self.store.read() as t:
            for k, v in t.scan("oplog", start):
                e = codec.unpack(v, "oplog entry")
                e["ops"] = self.entry_ops(t, e)
                e.pop("ref", None)
                e.pop("chunks", None)
                yield GTID.from_bytes(k), e
                n += 1
                if limit is not None and n >= limit:
                    return

    def oplog_at(self, ms: int, seq: int | None = None) -> GTID | None:
        """The first live oplog entry committed at or after ``ms`` (milliseconds
        since 1970 by the committing primaries' clocks, taken as ordered): a
        binary search by seq, which is dense across terms. None if every
        entry is older. ``OplogTrimmed`` if the oldest entry kept is already
        newer and entries before it were trimmed (they may be newer too).
        With ``seq``: the entry of that seq instead, if it is kept and was
        committed in the same second as ``ms`` (a ``Timestamp(second, seq)``
        raymx handed out names its entry exactly)."""
        with self.store.read() as t:
            first, last = t.first("oplog"), t.last("oplog")
            if first is None:
                return None
            lo_g, hi_g = GTID.from_bytes(first[0]), GTID.from_bytes(last[0])
            starts = [lo_g]  # each term's first entry, in order
            while starts[-1].term < hi_g.term:
                k = next(t.scan_keys("oplog", GTID(starts[-1].term + 1, 0).to_bytes()))
                starts.append(GTID.from_bytes(k))

            def at(seq: int) -> tuple[GTID, int]:
                term = next(g.term for g in reversed(starts) if g.seq <= seq)
                k, v = next(t.scan("oplog", GTID(term, seq).to_bytes()))
                return GTID.from_bytes(k), codec.unpack(v, "oplog entry")["ts"]
            if seq is not None and lo_g.seq <= seq <= hi_g.seq:
                g, ts = at(seq)
                if ts // 1000 == ms // 1000:
                    return g
            if at(lo_g.seq)[1] >= ms:
                if lo_g.seq > 1:
                    raise errors.OplogTrimmed(
                        f"the oplog's oldest entry {lo_g} is newer than the time asked for, "
                        "and the entries before it were trimmed", oldest=list(lo_g))
                return lo_g
            lo, hi = lo_g.seq, hi_g.seq  # at(lo) is older than ms; find the first that is not
            if at(hi)[1] < ms:
                return None
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if at(mid)[1] < ms:
                    lo = mid
                else:
                    hi = mid
            return at(hi)[0]

    def oplog_page(self, after, limit: int) -> list[tuple[GTID, dict]]:
        """Up to ``limit`` (1 to ``OPLOG_PAGE_MAX``) entries after ``after``
        (None: from the oldest kept), for ``rs.oplog``. ``OplogTrimmed`` (naming
        the oldest entry) if entries right after ``after`` were trimmed: a
        reader never skips history silently."""
        if type(limit) is not int or not 1 <= limit <= OPLOG_PAGE_MAX:
            raise errors.InvalidOperation(f"limit must be an int from 1 to {OPLOG_PAGE_MAX}, "
                                          f"got {limit!r:.40}")
        try:
            g = None if after is None else GTID.parse(after)
        except (ValueError, TypeError):
            raise errors.InvalidOperation(f"after must be a GTID, got {after!r:.60}") from None
        with self.store.read() as t:
            first = t.first("oplog")
            if g is not None and first is not None:
                fg = GTID.from_bytes(first[0])
                if g.seq + 1 < fg.seq:
                    raise errors.OplogTrimmed(
                        f"the entries after {g} were trimmed from the oplog; the oldest entry "
                        f"available is {fg} (read from after={GTID(fg.term, fg.seq - 1)}, or "
                        "from the start with after=None)", after=list(g), oldest=list(fg))
        return list(self.read_oplog(g, limit))

    def verify_oplog(self) -> int:
        """Check density and the hash chain; return the count.

        The first entry present is the chain's base: after trimming (or in a
        member created from a snapshot) the oplog starts mid-chain, and its
        first entry's hash is taken as given.
        """
        prev = None
        n = 0
        with self.store.read() as t:
            for k, v in t.scan("oplog"):
                g, e = GTID.from_bytes(k), codec.unpack(v, "oplog entry")
                if prev is not None:
                    pg, ph = prev
                    if g.seq != pg.seq + 1 or g < pg:
                        raise errors.CorruptEntry(f"oplog gap between {pg} and {g}")
                    chunks = entry_chunks(t, v)
                    if None in chunks:
                        raise errors.CorruptEntry(f"a spilled chunk of {g} is missing")
                    if oplog.chain_hash(ph, g, oplog.stored_digest(v, chunks)) != e["h"]:
                        raise errors.CorruptEntry(f"hash chain broken at {g}")
                prev = (g, e["h"])
                n += 1
        return n

    # convenience wrappers: one statement, one transaction
    def run(self, fn: Callable[[Transaction], object]) -> tuple[object, GTID | None]:
        tx = self.begin(autocommit=True)
        try:
            out = fn(tx)
        except BaseException:
            tx.abort()
            raise
        return out, tx.commit()

    def insert_many(self, ns: str, docs: list[dict]) -> WriteResult:
        res, res_gtid = self.run(lambda tx: tx.insert(ns, docs))
        res.gtid = res_gtid
        return res

    def find(self, ns: str, flt=None, **kw) -> list[dict]:
        r = self.reader()
        try:
            return list(r.find(ns, flt, **kw))
        finally:
            r.t.abort()

    def count(self, ns: str, flt=None) -> int:
        r = self.reader()
        try:
            return r.count(ns, flt)
        finally:
            r.t.abort()

    def apply_entry(self, ops: list[dict]) -> None:
        """Apply one entry's ops without logging them (the entry is already stored)."""
        with self.begin(log=False, autocommit=True) as tx:
            for op in ops:
                tx.apply_op(op)

    def undo_entry(self, ops: list[dict]) -> None:
        with self.begin(log=False, autocommit=True) as tx:
            tx.undo_ops(ops)

    def snapshot_state(self) -> dict:
        """Every collection's documents and index entries: for equality tests."""
        out = {}
        with self.store.read() as t:
            r = Reader(self, t)
            for ns in r.list_collections():
                c = r.coll(ns)
                docs = [codec.unpack_document(v)
                        for _, v in t.scan("docs", c.prefix, prefix_end(c.prefix))]
                ixs = {}
                for name, ix in c.indexes.items():
                    ixs[name] = (ix.spec(), [k[4:] for k, _ in
                                             t.scan("index", ix.prefix, prefix_end(ix.prefix))])
                out[ns] = {"docs": docs, "indexes": ixs}
        return out
