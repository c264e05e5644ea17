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
"""
from __future__ import annotations

import itertools
import operator
import os
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from raymx.storage import codec, errors, oplog, query, update as upd
from raymx.storage.gtid import GTID, ZERO
from raymx.storage.keys import encode_key, encode_keys, prefix_end
from raymx.storage.limits import DEFAULT, Limits

_U32 = struct.Struct(">I")
_BAD_DB_CHARS = set('/\\. "$*<>:|?\x00')
RANGE_KEY = b"range"
_ENTRY_TS = codec.map_header(3) + codec.pack("ts")
_ENTRY_H = codec.pack("h")
_ENTRY_OPS = codec.pack("ops")


def entry_inline(v: bytes) -> bool:
    """Whether a stored oplog entry holds its ops (``_append`` writes those as a
    3-field map starting with ``ts``) rather than a reference to spilled chunks."""
    return v.startswith(_ENTRY_TS)


def entry_chunks(t, v: bytes) -> list[bytes]:
    """The spilled chunks of a stored oplog entry, read in order; none when
    inline (told by its first bytes, without decoding it)."""
    if entry_inline(v):
        return []
    e = codec.unpack(v, "oplog entry")
    return [t.get("oplog.refs", oplog.spill_key(e["ref"], i)) for i in range(e["chunks"])]


# --- names and ids -------------------------------------------------------
_VALID_NS: dict[str, tuple[str, str]] = {}


def split_ns(ns, limits: Limits = DEFAULT) -> tuple[str, str]:
    """Validate ``"db.coll"`` and return its parts; raise InvalidName otherwise."""
    hit = _VALID_NS.get(ns) if type(ns) is str else None
    if hit is not None:
        return hit
    if type(ns) is not str or "." not in ns:
        raise errors.InvalidName(f"namespace {ns!r} must be a string 'db.collection'")
    db, coll = ns.split(".", 1)
    if not db or len(db) > 64 or _BAD_DB_CHARS & set(db):
        raise errors.InvalidName(f"invalid database name {db!r}: 1-64 characters, none of "
                                 "/\\. \"$*<>:|? or NUL")
    if (not coll or len(coll) > limits.name_chars_max or "$" in coll or "\x00" in coll
            or coll.startswith((".", "system.")) or coll.endswith(".")):
        raise errors.InvalidName(f"invalid collection name {coll!r}: 1-{limits.name_chars_max} "
                                 "characters, no '$' or NUL, not starting with 'system.' or '.'")
    if len(_VALID_NS) < 100_000:
        _VALID_NS[ns] = (db, coll)
    return db, coll


_OID_PROC = os.urandom(5).hex()
_oid_lock = threading.Lock()
_oid_counter = [int.from_bytes(os.urandom(3), "big")]


def new_id() -> str:
    """A time-ordered 24-hex-digit id (seconds, process nonce, counter), like ObjectId."""
    with _oid_lock:
        _oid_counter[0] = (_oid_counter[0] + 1) & 0xFFFFFF
        c = _oid_counter[0]
    return f"{int(time.time()) & 0xFFFFFFFF:08x}{_OID_PROC}{c:06x}"


def normalize_index_key(key) -> list[list]:
    """Accept ``"a"``, ``[("a", 1), ("b", -1)]`` or ``{"a": 1}``; return ``[[path, dir]]``."""
    if isinstance(key, str):
        key = [(key, 1)]
    elif isinstance(key, dict):
        key = list(key.items())
    if not isinstance(key, (list, tuple)) or not key:
        raise errors.InvalidOperation(f"index key {key!r} must be a field name, a list of "
                                      "(field, direction) pairs or a dict")
    out = []
    for item in key:
        if isinstance(item, str):
            item = (item, 1)
        if (not isinstance(item, (list, tuple)) or len(item) != 2 or not isinstance(item[0], str)
                or not item[0] or item[0].startswith("$") or item[1] not in (1, -1)):
            raise errors.InvalidOperation(f"bad index key element {item!r}: "
                                          "expected (field, 1 or -1)")
        out.append([item[0], int(item[1])])
    if len({p for p, _ in out}) != len(out):
        raise errors.InvalidOperation(f"index key {key!r} repeats a field")
    return out


def index_name(key: list[list]) -> str:
    return "_".join(f"{p}_{d}" for p, d in key)


@dataclass
class IndexInfo:
    name: str
    id: int
    key: list  # [[path, dir], ...]
    unique: bool
    prefix: bytes = field(init=False, repr=False, compare=False)
    single: str | None = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        self.prefix = _U32.pack(self.id)
        # the field of a one-field index over a top-level path (no dots)
        p = self.key[0][0] if len(self.key) == 1 else "."
        self.single = None if "." in p else p

    def spec(self) -> dict:
        return {"key": self.key, "unique": self.unique}


@dataclass
class CollInfo:
    ns: str
    id: int
    indexes: dict[str, IndexInfo] = field(default_factory=dict)
    prefix: bytes = field(init=False, repr=False, compare=False)
    # (field, prefix) of the one-field, non-unique indexes over a top-level
    # field (``_index`` writes their key directly), and every other index
    plain: list = field(init=False, repr=False, compare=False)
    general: list = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        self.prefix = _U32.pack(self.id)
        ixs = self.indexes.values()
        self.plain = [(ix.single, ix.prefix) for ix in ixs
                      if not ix.unique and ix.single is not None]
        self.general = [ix for ix in ixs if ix.unique or ix.single is None]

    def record(self) -> bytes:
        return codec.pack({"id": self.id, "indexes": {
            n: {"id": i.id, "key": i.key, "unique": i.unique} for n, i in self.indexes.items()}})

    @classmethod
    def from_record(cls, ns: str, b: bytes) -> "CollInfo":
        r = codec.unpack(b, "catalog record")
        return cls(ns, r["id"], {n: IndexInfo(n, i["id"], i["key"], i["unique"])
                                 for n, i in r["indexes"].items()})


def _index_entries(ix: IndexInfo, doc: dict, pk: bytes) -> list[tuple[bytes, bytes]]:
    """(prefix a unique index must not repeat, full key) for every key of ``doc``.

    Multikey: an array value is indexed as a whole and once per element (the
    query side matches elements, as MongoDB does), so a compound index over
    arrays gets the cross product of its fields' keys.
    """
    if len(ix.key) == 1:
        p = ix.key[0][0]
        if "." not in p:
            v = doc.get(p, None)
        else:  # several values reached through arrays: a list, indexed below
            vals = query.reach(doc, p)
            v = _none(vals[0]) if len(vals) == 1 else vals
        if type(v) not in _ARRAYS:  # the common case: one key
            pre = ix.prefix + encode_key(v)
            return [(pre, pre + pk)]
    pres = [ix.prefix]
    for p, _ in ix.key:
        pres = [a + k for a in pres for k in query.index_keys(doc, p)]
    return [(pre, pre + pk) for pre in pres]


class _NotId:
    """Paths that may hold arrays: every one but _id (an array _id is refused)."""

    def __contains__(self, p) -> bool:
        return p != "_id"


_MULTIKEY = _NotId()


def _none(v):
    return None if v is query.MISSING else v


# --- results -------------------------------------------------------------
@dataclass
class WriteResult:
    """What a statement did. ``gtid`` is set once its transaction commits."""

    inserted_ids: list = field(default_factory=list)
    matched: int = 0
    modified: int = 0
    deleted: int = 0
    upserted_id: object = None
    gtid: GTID | None = None


@dataclass
class RangeRecord:
    """The durable range of a member's oplog (after JE's VLSNIndex)."""

    first: GTID | None = None
    last: GTID | None = None
    last_applied: GTID | None = None
    majority: GTID | None = None
    terms: list = field(default_factory=list)  # [[term, first seq], ...]

    def pack(self) -> bytes:
        g = lambda x: None if x is None else list(x)  # noqa: E731
        return codec.pack({"first": g(self.first), "last": g(self.last),
                           "last_applied": g(self.last_applied), "majority": g(self.majority),
                           "terms": self.terms})

    @classmethod
    def unpack(cls, b: bytes) -> "RangeRecord":
        r = codec.unpack(b, "range record")
        g = lambda x: None if x is None else GTID(*x)  # noqa: E731
        return cls(g(r["first"]), g(r["last"]), g(r["last_applied"]), g(r["majority"]),
                   r["terms"])

    def extend(self, gtid: GTID) -> None:
        if self.first is None:
            self.first = gtid
        if not self.terms or self.terms[-1][0] != gtid.term:
            self.terms.append([gtid.term, gtid.seq])
        self.last = gtid


@dataclass
class TrimResult:
    """What one trim transaction did (``Engine.trim_oplog``)."""

    trimmed: int = 0          # entries dropped (with their spilled chunks)
    first: GTID | None = None  # the oplog's first entry afterwards
    bytes: int = 0            # oplog + oplog.refs size afterwards
    more: bool = False        # stopped at max_entries with more over the cap
    held: bool = False        # over the cap, but keep_from stopped it


# --- reading -------------------------------------------------------------
class Stats:
    """Counters a query fills in; tests use ``examined`` to see index use."""

    def __init__(self):
        self.examined = 0
        self.plan = None


def _range_bounds(prefix: bytes, b: query.Bounds):
    """Key range [start, stop) for a one-field range condition on an index."""
    lo, hi = b.low, b.high
    tag = encode_key((lo or hi)[0])[:1]
    start = prefix + tag
    stop = prefix + bytes((tag[0] + 1,))
    if lo is not None:
        k = prefix + encode_key(lo[0])
        start = k if lo[1] else (prefix_end(k) or stop)
    if hi is not None:
        k = prefix + encode_key(hi[0])
        stop = (prefix_end(k) or stop) if hi[1] else k
    return start, stop


class Reader:
    """Queries over one transaction (a read snapshot, or a write txn seeing its own writes).

    ``at(point)`` makes its queries answer as of an older GTID (read concern
    "majority": the majority-committed point): every document an op touched
    after ``point`` is read as the pre-image of the first such op, from the
    oplog; the rest as stored. One implementation with Spark's ``at=`` reads
    (``overrides``)."""

    def __init__(self, engine: "Engine", txn):
        self.e = engine
        self.t = txn
        self.point: GTID | None = None  # answer as of this GTID (None: as stored)
        self._ov: dict[str, dict | None] = {}

    def at(self, point: GTID | None) -> "Reader":
        """Answer as of ``point`` (None, or at/after this snapshot: as stored)."""
        g = _applied_in(self.t) or ZERO
        self.point = None if point is None or point >= g else point
        self._until, self._ov = g, {}
        return self

    def overrides(self, ns: str, at: GTID, until: GTID) -> list[tuple[bytes, bytes | None]] | None:
        """(pk, packed document as of ``at`` or None) for every document of ``ns``
        an op changed in (at, until]: the pre-image of its first such op. None
        if the collection did not exist at ``at`` (created in the range);
        InvalidOperation if it was dropped in the range (a drop logs no documents)."""
        first: dict[bytes, bytes | None] = {}
        start = prefix_end(at.to_bytes()) if at != ZERO else None
        for k, v in self.t.scan("oplog", start, prefix_end(until.to_bytes())):
            for op in self.e.entry_ops(self.t, codec.unpack(v, "oplog entry")):
                if op.get("ns") != ns:
                    continue
                kind = op["op"]
                if kind == "c":
                    if op["cmd"] == "create" and not first:
                        return None  # created after `at`: it did not exist then
                    if op["cmd"] == "drop":
                        raise errors.InvalidOperation(
                            f"{ns} was dropped at {GTID.from_bytes(k)}, after {at}, and a drop "
                            f"does not log the documents: it cannot be read as of {at}; read "
                            "it at a later GTID", ns=ns)
                    continue
                img = op["post"] if kind == "i" else op["pre"]
                pk = encode_key(img["_id"])
                if pk not in first:
                    first[pk] = None if kind == "i" else codec.pack(op["pre"])
        return sorted(first.items())

    def _point_view(self, ns: str) -> dict | None:
        """{pk: packed doc or None} as of ``self.point``; {"": None} when the
        collection did not exist then. Computed once per collection."""
        if ns not in self._ov:
            ov = self.overrides(ns, self.point, self._until)
            if self.point != ZERO and self.t.get("oplog", self.point.to_bytes()) is None:
                first = self.t.first("oplog")
                if first is not None and GTID.from_bytes(first[0]) > self.point:
                    raise errors.TooStale(f"{self.point} is before the oplog's first entry")
            self._ov[ns] = {b"": None} if ov is None else dict(ov)
        return self._ov[ns]

    def coll(self, ns: str) -> CollInfo | None:
        """The catalog entry, parsed once per record version and shared: never
        mutate it, save a new CollInfo instead."""
        b = self.t.get("catalog", ns.encode())
        if b is None:
            return None
        hit = self.e._catalog_cache.get(ns)
        if hit is None or hit[0] != b:
            hit = self.e._catalog_cache[ns] = (b, CollInfo.from_record(ns, b))
        return hit[1]

    def _get_pk(self, c: CollInfo, pk: bytes):
        b = self.t.get("docs", c.prefix + pk)
        return None if b is None else codec.unpack_document(b)

    def _candidates(self, c: CollInfo, flt, stats: Stats) -> Iterator[tuple[bytes, dict]]:
        bounds = query.extract_bounds(flt, multikey=_MULTIKEY)
        b = bounds.get("_id")
        if b is not None and b.points is not None:
            stats.plan = "IDHACK"
            for pk in sorted({encode_key(v) for v in b.points}):
                d = self._get_pk(c, pk)
                if d is not None:
                    yield pk, d
            return
        if b is not None:
            stats.plan = "IXSCAN _id_"
            start, stop = _range_bounds(c.prefix, b)
            for k, v in self.t.scan("docs", start, stop):
                yield k[4:], codec.unpack_document(v)
            return
        best = None
        for ix in c.indexes.values():
            ib = bounds.get(ix.key[0][0])
            if ib is None:
                continue
            score = (ib.points is not None, ix.unique and len(ix.key) == 1)
            if best is None or score > best[0]:
                best = (score, ix, ib)
        if best is not None:
            _, ix, ib = best
            stats.plan = f"IXSCAN {ix.name}"
            if ib.points is not None:
                ranges = []
                for v in sorted({encode_key(v) for v in ib.points}):
                    ranges.append((ix.prefix + v, prefix_end(ix.prefix + v)))
            else:
                ranges = [_range_bounds(ix.prefix, ib)]
            seen = set()
            for start, stop in ranges:
                for _, pk in self.t.scan("index", start, stop):
                    if pk in seen:
                        continue
                    seen.add(pk)
                    d = self._get_pk(c, pk)
                    if d is not None:
                        yield pk, d
            return
        stats.plan = "COLLSCAN"
        for k, v in self.t.scan("docs", c.prefix, prefix_end(c.prefix)):
            yield k[4:], codec.unpack_document(v)

    def matching(self, ns: str, flt, stats: Stats | None = None) -> Iterator[tuple[bytes, dict]]:
        """(pk, doc) of every document matching ``flt``, in plan order."""
        stats = stats if stats is not None else Stats()
        split_ns(ns, self.e.limits)
        match = query.compile_filter(flt)
        ov = self._point_view(ns) if self.point is not None else None
        c = self.coll(ns)
        if c is None or (ov is not None and b"" in ov):
            stats.plan = "EOF"
            return
        for pk, d in self._candidates(c, flt, stats):
            if ov and pk in ov:
                continue  # changed after the point: its image then is matched below
            stats.examined += 1
            if match(d):
                yield pk, d
        for pk, b in sorted((ov or {}).items()):
            if b is not None:
                stats.examined += 1
                d = codec.unpack_document(b)
                if match(d):
                    yield pk, d

    def find(self, ns: str, flt=None, projection=None, sort=None, skip: int = 0,
             limit: int = 0, stats: Stats | None = None) -> Iterator[dict]:
        if not isinstance(skip, int) or skip < 0 or not isinstance(limit, int) or limit < 0:
            raise errors.InvalidFilter("skip and limit must be non-negative integers")
        if projection is not None:
            query.project({}, projection)  # validate before doing any work
        keyf = query.sort_key(sort) if sort else None
        docs: Iterator[dict] = (d for _, d in self.matching(ns, flt, stats))
        if keyf is not None:
            docs = iter(sorted(docs, key=keyf))
        n = 0
        for i, d in enumerate(docs):
            if i < skip:
                continue
            yield d if projection is None else query.project(d, projection)
            n += 1
            if limit and n >= limit:
                return

    def count(self, ns: str, flt=None) -> int:
        return sum(1 for _ in self.matching(ns, flt))

    def list_collections(self) -> list[str]:
        return [k.decode() for k, _ in self.t.scan("catalog")]

    # point-in-time recovery (DESIGN section 9)
    def revert_entries(self, target) -> Iterator[tuple[GTID, list[dict]]]:
        """Every entry after ``target``, newest first, with its ops; raises
        (before yielding anything) if one cannot be undone or the oplog no
        longer reaches back to ``target``."""
        target = GTID.parse(target)
        first, last = self.t.first("oplog"), self.t.last("oplog")
        if last is None:
            return
        fg, lg = GTID.from_bytes(first[0]), GTID.from_bytes(last[0])
        if target > lg:
            raise errors.InvalidOperation(f"revert target {target} is after the oplog's last "
                                          f"entry {lg}", target=list(target))
        if target < fg and not (target == ZERO and fg.seq == 1):
            raise errors.OplogTrimmed(
                f"revert target {target} is below the oplog's first entry {fg}: the entries "
                f"after it were trimmed; the oldest point to revert to is {fg}",
                target=list(target), oldest=list(fg))
        if target >= fg and self.t.get("oplog", target.to_bytes()) is None:
            raise errors.InvalidOperation(f"revert target {target} is not an entry of this oplog",
                                          target=list(target))
        start = prefix_end(target.to_bytes()) if target != ZERO else None
        for k, v in self.t.scan("oplog", start, None, reverse=True):
            ops = self.e.entry_ops(self.t, codec.unpack(v, "oplog entry"))
            for op in ops:
                if oplog.is_irreversible(op):
                    g = GTID.from_bytes(k)
                    raise errors.IrreversibleOp(
                        f"cannot revert to {target}: entry {g} holds '{op.get('cmd')}' of "
                        f"{op.get('ns')}, which cannot be undone (dropping a collection does not "
                        "log its documents); the newest point to revert to is "
                        f"{g} or later", gtid=list(g), op=op.get("cmd"), ns=op.get("ns"))
        for k, v in self.t.scan("oplog", start, None, reverse=True):
            yield GTID.from_bytes(k), self.e.entry_ops(self.t, codec.unpack(v, "oplog entry"))

    def revert_plan(self, target, gtids_max: int = 1000) -> dict:
        """What ``revert_to(target)`` would undo: entries, ops per namespace."""
        names = {"i": "insert", "u": "update", "d": "delete", "c": "command"}
        out = {"target": list(GTID.parse(target)), "entries": 0, "ops": 0, "newest": None,
               "oldest": None, "gtids": [], "namespaces": {}}
        for g, ops in self.revert_entries(target):
            out["entries"] += 1
            out["newest"] = out["newest"] or list(g)
            out["oldest"] = list(g)
            if len(out["gtids"]) < gtids_max:
                out["gtids"].append(list(g))
            for op in ops:
                if op["op"] == "n":
                    continue
                out["ops"] += 1
                per = out["namespaces"].setdefault(op["ns"], {})
                per[names[op["op"]]] = per.get(names[op["op"]], 0) + 1
        return out


# --- writing -------------------------------------------------------------
class Transaction(Reader):
    """One LMDB write transaction and the oplog entry it will commit.

    ``log=False`` applies ops without logging them (a secondary applying
    entries its producer already wrote, or a rollback undoing entries it is
    about to truncate).
    """

    def __init__(self, engine: "Engine", txn, log: bool = True, autocommit: bool = False,
                 group: "WriteGroup | None" = None):
        super().__init__(engine, txn)
        self._log_on = log
        self._autocommit = autocommit  # one statement: no savepoint needed
        self._group = group  # its LMDB txn is a child of the group's (see WriteGroup)
        self._buf: list[bytes] = []
        self._buf_bytes = 0
        self._bytes = 0
        self._nops = 0
        self._digest = oplog.OpsDigest()
        self._spill: int | None = None
        self._chunks = 0
        self._done = False

    # statements run here, atomically
    def statement(self, fn: Callable, *a, **kw):
        if self._done:
            raise errors.TransactionAborted("the transaction has already finished")
        if self._autocommit:
            return fn(*a, **kw)
        sp = (list(self._buf), self._buf_bytes, self._bytes, self._nops,
              self._digest.copy(), self._spill, self._chunks)
        parent = self.t
        self.t = parent.nested()
        try:
            out = fn(*a, **kw)
            self.t.commit()
            return out
        except BaseException:
            self.t.abort()
            (self._buf, self._buf_bytes, self._bytes, self._nops, self._digest,
             self._spill, self._chunks) = sp
            raise
        finally:
            self.t = parent

    def _log(self, packed: bytes) -> None:
        self._log_many((packed,))

    def _log_many(self, ops) -> None:
        if not self._log_on:
            return
        spill = self.e.limits.spill_bytes
        n = sum(map(len, ops))
        if self._buf_bytes + n < spill:  # all stay in memory: one digest update
            self._digest.add(b"".join(ops))  # the digest of a concatenation is the same
            self._buf += ops
            self._buf_bytes += n
            self._bytes += n
            self._nops += len(ops)
            ops = ()
        for packed in ops:
            self._bytes += len(packed)
            self._digest.add(packed)
            self._buf.append(packed)
            self._buf_bytes += len(packed)
            self._nops += 1
            if self._buf_bytes >= spill:
                self._flush_spill()
        if self._bytes > self.e.limits.transaction_bytes_max:
            raise errors.TransactionTooLarge(
                f"transaction ops exceed {self.e.limits.transaction_bytes_max} bytes",
                limit=self.e.limits.transaction_bytes_max)

    def _flush_spill(self) -> None:
        if not self._buf:
            return
        if self._spill is None:
            self._spill = self.e._next_counter(self.t, b"next_spill")
        self.t.put("oplog.refs", oplog.spill_key(self._spill, self._chunks),
                   codec.array_header(len(self._buf)) + b"".join(self._buf))
        self._chunks += 1
        self._buf, self._buf_bytes = [], 0

    # catalog
    def _coll_for_write(self, ns: str, create: bool = True) -> CollInfo | None:
        split_ns(ns, self.e.limits)
        c = self.coll(ns)
        if c is None and create:
            c = CollInfo(ns, self.e._next_counter(self.t, b"next_id"))
            self._save_coll(c)
            self._log(codec.pack({"op": "c", "ns": ns, "cmd": "create"}))
        return c

    def _save_coll(self, c: CollInfo) -> None:
        self.t.put("catalog", c.ns.encode(), c.record())

    # document writes with index maintenance; the primary and the applier share them
    def _unindex(self, c: CollInfo, pk: bytes, doc: dict) -> None:
        for ix in c.indexes.values():
            for _, key in _index_entries(ix, doc, pk):
                self.t.delete("index", key)

    def _index(self, c: CollInfo, pk: bytes, doc: dict, check_unique: bool,
               put_ix=None) -> None:
        put_ix = put_ix or self.t.putter("index")
        general = c.general
        for field_, ixp in c.plain:  # the common case: one key, no unique check
            v = doc.get(field_)
            if type(v) in _ARRAYS:  # multikey: the general path writes every index
                general = c.indexes.values()
                break
            put_ix(ixp + encode_key(v) + pk, pk)
        self._index_general(c, general, pk, doc, check_unique, put_ix)

    def _index_general(self, c: CollInfo, ixs, pk: bytes, doc: dict, check_unique: bool,
                       put_ix) -> None:
        for ix in ixs:
            for pre, key in _index_entries(ix, doc, pk):
                if ix.unique and check_unique:
                    for k, other in self.t.scan("index", pre, prefix_end(pre)):
                        if other != pk:
                            vals = {p: _none(query.get_path(doc, p)) for p, _ in ix.key}
                            raise errors.DuplicateKey(
                                f"duplicate key in unique index {ix.name} of {c.ns}: "
                                f"{vals!r:.200}", ns=c.ns, index=ix.name)
                put_ix(key, pk)

    def _write_doc(self, c: CollInfo, pk: bytes, old: dict | None, new: dict, new_b: bytes,
                   check_unique: bool) -> None:
        if old is not None:
            self._unindex(c, pk, old)
        self.t.put("docs", c.prefix + pk, new_b)
        self._index(c, pk, new, check_unique)

    def _delete_doc(self, c: CollInfo, pk: bytes, old: dict) -> None:
        self._unindex(c, pk, old)
        self.t.delete("docs", c.prefix + pk)

    # public statements
    def insert(self, ns: str, docs: list[dict] | codec.PackedDocuments) -> WriteResult:
        """Insert ``docs``: dicts, or documents received packed (their bytes are stored)."""
        return self.statement(self._insert, ns, docs)

    def _insert(self, ns, docs):
        """Every step runs over the whole batch (C-speed maps, no Python call
        per document where a builtin can do it): pack, keys, one put of all
        documents, one put of each plain index's entries, one log append."""
        packed = None
        if type(docs) is codec.PackedDocuments:  # decoded and checked on arrival
            docs, packed = docs.docs, docs.rows
        elif not isinstance(docs, (list, tuple)):
            raise errors.InvalidDocument("insert needs a list of documents")
        elif not _DICT.issuperset(map(type, docs)):
            bad = next(d for d in docs if type(d) is not dict)
            raise errors.InvalidDocument(f"a document must be a dict, got {type(bad).__name__}")
        try:
            ids = list(map(_GET_ID, docs))
        except KeyError:  # documents without an _id get a generated one
            docs = [d if "_id" in d else {"_id": new_id(), **d} for d in docs]
            ids = list(map(_GET_ID, docs))
            packed = None  # packed again, with their _id
        c = self._coll_for_write(ns)
        lim, op_prefix = self.e.limits.document_bytes_max, codec.insert_op_prefix(ns)
        if len(ids) == 1:  # a single document: the batch passes cost more than they save
            packed = packed or [codec.pack_document(docs[0], lim)]
            pks = [_pk(ids[0])]
            rows = [(c.prefix + pks[0], packed[0])]
            ops = [op_prefix + packed[0]]
        else:
            packed = packed or codec.pack_documents(docs, lim)
            pks = encode_keys(ids) if _SIMPLE_ID.issuperset(map(type, ids)) else list(map(_pk, ids))
            rows = list(zip(map(c.prefix.__add__, pks), packed))
            ops = list(map(op_prefix.__add__, packed))
        # all documents in one call, refused whole if an _id exists or repeats:
        # the put is the duplicate check, with no lookup before it
        if not self.t.put_new("docs", rows):
            seen = set()
            for (key, _), _id in zip(rows, ids):
                if key in seen or self.t.get("docs", key) is not None:
                    raise errors.DuplicateKey(f"duplicate _id {_id!r:.100} in {ns}",
                                              ns=ns, index="_id_")
                seen.add(key)
        if c.indexes:
            self._index_batch(c, docs, pks)
        self._log_many(ops)
        res = WriteResult()
        res.inserted_ids = ids
        return res

    def _index_batch(self, c: CollInfo, docs: list, pks: list) -> None:
        """``_index`` for a batch of new documents: each plain index's entries in
        one put; a multikey value sends the batch down the general path."""
        ix_rows = []
        for field_, ixp in c.plain:
            vals = [d.get(field_) for d in docs]
            if not _ARRAYS.isdisjoint(map(type, vals)):  # multikey
                put_ix = self.t.putter("index")
                for d, pk in zip(docs, pks):
                    self._index(c, pk, d, True, put_ix)
                return
            ix_rows += zip(map(b"".join, zip(itertools.repeat(ixp), encode_keys(vals), pks)),
                           pks)
        self.t.put_many("index", ix_rows)
        if c.general:
            put_ix = self.t.putter("index")
            for d, pk in zip(docs, pks):
                self._index_general(c, c.general, pk, d, True, put_ix)

    def _hits(self, ns: str, flt, multi: bool) -> tuple[list, CollInfo | None]:
        """The documents a statement changes: collected before the first write
        (no cursor runs over what it changes), and only the first unless multi.
        The filter must be a map: ``{}`` is how to say every document."""
        if type(flt) is not dict:
            raise errors.InvalidFilter(f"an update or delete needs a filter map ({{}} matches "
                                       f"every document), got {type(flt).__name__} {flt!r:.40}")
        it = self.matching(ns, flt)
        return list(it if multi else itertools.islice(it, 1)), self.coll(ns)

    def update(self, ns: str, flt, update, multi: bool = False, upsert: bool = False,
               replace: bool = False) -> WriteResult:
        return self.statement(self._update, ns, flt, update, multi, upsert, replace)

    def _update(self, ns, flt, update, multi, upsert, replace):
        if type(update) is not dict:
            raise errors.InvalidUpdate("an update must be a dict")
        if replace and upd.is_operator_update(update):
            raise errors.InvalidUpdate("a replacement document cannot contain $ operators")
        if not replace and not upd.is_operator_update(update):
            raise errors.InvalidUpdate("update_one/update_many need $ operators "
                                       "(use replace_one to replace a document)")
        lim = self.e.limits.document_bytes_max
        res = WriteResult()
        hits, c = self._hits(ns, flt, multi)
        for pk, old in hits:
            res.matched += 1
            new = upd.apply_update(old, update)
            old_b = codec.pack(old)
            new_b = codec.pack_document(new, lim)
            if new_b == old_b:
                continue
            self._write_doc(c, pk, old, new, new_b, True)
            self._log(codec.pack_image_op("u", ns, old_b, new_b))
            res.modified += 1
        if not hits and upsert:
            seed = upd.upsert_seed(flt if flt is not None else {})
            doc = upd.apply_update(seed, update)
            if "_id" not in doc:
                doc = {"_id": seed.get("_id", new_id()), **doc}
            res.upserted_id = doc["_id"]
            self._insert(ns, [doc])
        return res

    def delete(self, ns: str, flt, multi: bool = False) -> WriteResult:
        return self.statement(self._delete, ns, flt, multi)

    def _delete(self, ns, flt, multi):
        res = WriteResult()
        hits, c = self._hits(ns, flt, multi)
        for pk, old in hits:
            self._delete_doc(c, pk, old)
            self._log(codec.pack_image_op("d", ns, codec.pack(old), None))
            res.deleted += 1
        return res

    def create_collection(self, ns: str) -> bool:
        def run():
            if self.coll(ns) is not None:
                return False
            self._coll_for_write(ns)
            return True
        return self.statement(run)

    def drop_collection(self, ns: str) -> bool:
        def run():
            split_ns(ns, self.e.limits)
            c = self.coll(ns)
            if c is None:
                return False
            self._drop(c)
            self._log(codec.pack({"op": "c", "ns": ns, "cmd": "drop", "irreversible": True}))
            return True
        return self.statement(run)

    def _drop(self, c: CollInfo) -> None:
        _delete_range(self.t, "docs", c.prefix)
        for ix in c.indexes.values():
            _delete_range(self.t, "index", ix.prefix)
        self.t.delete("catalog", c.ns.encode())

    def create_index(self, ns: str, key, unique: bool = False, name: str | None = None) -> str:
        return self.statement(self._create_index, ns, key, unique, name, True)

    def _create_index(self, ns, key, unique, name, check_unique):
        key = normalize_index_key(key)
        name = name or index_name(key)
        if not isinstance(name, str) or not name or name == "_id_" or "\x00" in name:
            raise errors.InvalidName(f"invalid index name {name!r}")
        if key == [["_id", 1]]:
            return "_id_"
        c = self._coll_for_write(ns)
        old = c.indexes.get(name)
        if old is not None:
            if old.key == key and old.unique == bool(unique):
                return name
            raise errors.InvalidOperation(f"index {name} already exists on {ns} with "
                                          f"a different spec {old.spec()}")
        ix = IndexInfo(name, self.e._next_counter(self.t, b"next_id"), key, bool(unique))
        for k, v in self.t.scan("docs", c.prefix, prefix_end(c.prefix)):
            # build one index at a time: _index checks uniqueness within it
            only = CollInfo(ns, c.id, {name: ix})
            self._index(only, k[4:], codec.unpack_document(v), check_unique)
        self._save_coll(CollInfo(ns, c.id, {**c.indexes, name: ix}))
        self._log(codec.pack({"op": "c", "ns": ns, "cmd": "createIndex", "name": name,
                              "spec": ix.spec()}))
        return name

    def drop_index(self, ns: str, name: str) -> None:
        def run():
            split_ns(ns, self.e.limits)
            c = self.coll(ns)
            if name == "_id_":
                raise errors.InvalidOperation("the _id_ index cannot be dropped")
            if c is None or name not in c.indexes:
                raise errors.IndexNotFound(f"index {name!r} not found on {ns}", ns=ns)
            ix = self._drop_index(c, name)
            self._log(codec.pack({"op": "c", "ns": ns, "cmd": "dropIndex", "name": name,
                                  "spec": ix.spec()}))
        return self.statement(run)

    def _drop_index(self, c: CollInfo, name: str) -> IndexInfo:
        ix = c.indexes[name]
        _delete_range(self.t, "index", ix.prefix)
        self._save_coll(CollInfo(c.ns, c.id, {n: i for n, i in c.indexes.items() if n != name}))
        return ix

    # applying logged ops (secondaries, rollback, revert): no uniqueness checks,
    # the primary has already decided; images make it idempotent per document
    def apply_op(self, op: dict) -> None:
        kind = op["op"]
        if kind == "n":
            return
        ns = op["ns"]
        if kind == "c":
            cmd = op["cmd"]
            c = self.coll(ns)
            if cmd == "create":
                self._coll_for_write(ns)
            elif cmd == "drop":
                if c is not None:
                    self._drop(c)
            elif cmd == "createIndex":
                self._create_index(ns, op["spec"]["key"], op["spec"]["unique"], op["name"], False)
            elif cmd == "dropIndex":
                if c is not None and op["name"] in c.indexes:
                    self._drop_index(c, op["name"])
            if self._log_on and cmd in ("drop", "dropIndex"):
                self._log(codec.pack(op))
            return
        c = self._coll_for_write(ns)
        if kind == "d":
            pk = _pk(op["pre"]["_id"])
            cur = self._get_pk(c, pk)
            if cur is not None:
                self._delete_doc(c, pk, cur)
            self._log(codec.pack(op))
            return
        post = op["post"]
        pk = _pk(post["_id"])
        self._write_doc(c, pk, self._get_pk(c, pk), post, codec.pack(post), False)
        self._log(codec.pack(op))

    def revert_to(self, target) -> dict:
        """Append compensating ops that return every collection and index to
        their state right after ``target``: the inverse of every later op,
        newest first, from the logged images, in THIS transaction (one GTID, so
        the revert is atomic and replicates like any write). Later writes that
        touched the same documents are undone too. Returns the plan."""
        plan = self.revert_plan(target)
        if not plan["entries"]:
            return plan
        self._log(codec.pack({"op": "n", "revert": {"to": plan["target"], "newest": plan["newest"],
                                                    "oldest": plan["oldest"],
                                                    "entries": plan["entries"]}}))
        for _, ops in self.revert_entries(target):
            self.undo_ops(ops)
        return plan

    def undo_ops(self, ops: list[dict]) -> None:
        """Undo ``ops`` (one entry's, in their logged order) newest first."""
        inv = [oplog.invert(op) for op in reversed(ops)]  # raises before writing anything
        for op in inv:
            self.apply_op(op)

    # finishing
    @property
    def nops(self) -> int:
        return self._nops

    def commit(self, gtid: GTID | None = None, ts_ms: int | None = None) -> GTID | None:
        """Write the oplog entry and commit. Returns its GTID (None if nothing changed).

        Without ``gtid`` the engine takes the next one under its durable term
        (the writer lock serialises commits, so that is dense and ordered).
        """
        if self._done:
            raise errors.TransactionAborted("the transaction has already finished")
        self._done = True
        if not self._log_on or self._nops == 0:
            self.t.commit()
            return None
        grp = self._group
        try:
            gtid, h = self.e._append(self.t, gtid, ts_ms, self, None if grp is None else grp.tail)
            self.t.commit()
        except BaseException:
            self.t.abort()
            raise
        if grp is None:
            self.e._committed(gtid, h)
        else:  # durable only when the group commits
            grp.tail = (gtid, h)
        return gtid

    def abort(self) -> None:
        if not self._done:
            self._done = True
            self.t.abort()

    def __enter__(self):
        return self

    def __exit__(self, et, e, tb):
        if et is None:
            self.commit()
        else:
            self.abort()


class WriteGroup:
    """Several autocommit statements in one store transaction, each still its
    own oplog entry under its own GTID.

    The writer of a member runs the writes queued at one moment as a group:
    one LMDB commit (one flush of the touched pages) instead of one per
    statement. Each statement runs in a child transaction, so one that fails
    leaves no trace while the others stand; nothing is visible, or durable,
    before ``commit``. The GTIDs must follow each other, as for single commits.
    """

    def __init__(self, engine: "Engine"):
        self.e = engine
        self.t = engine.store.write()
        self.tail: tuple[GTID, int] | None = None  # the last entry sealed in this group
        self._done = False

    def statement(self) -> Transaction:
        """A transaction for one statement; its ``commit(gtid)`` seals it into the group."""
        if self._done:
            raise errors.TransactionAborted("the write group has already finished")
        return Transaction(self.e, self.t.nested(), autocommit=True, group=self)

    def noop(self, gtid: GTID) -> None:
        """An ``n`` entry for a GTID taken by a statement that then failed."""
        tx = self.statement()
        tx._log(codec.pack({"op": "n"}))
        tx.commit(gtid)

    def commit(self) -> None:
        self._done = True
        self.t.commit()
        if self.tail is not None:
            self.e._committed(*self.tail)

    def abort(self) -> None:
        if not self._done:
            self._done = True
            self.t.abort()


_DICT = frozenset((dict,))
_ARRAYS = frozenset((list, tuple))  # stored as msgpack arrays: indexed whole and per element
_GET_ID = operator.itemgetter("_id")
_SIMPLE_ID = frozenset((int, str))  # _ids whose key is plain encode_key (see _pk)


def _pk(_id) -> bytes:
    t = type(_id)
    if t is int or t is str:
        return encode_key(_id)
    if t in (list, tuple):
        raise errors.InvalidDocument(f"_id cannot be an array: {_id!r:.60}")
    if t is dict and _contains_op(_id):
        raise errors.InvalidDocument(f"_id {_id!r:.60} may not contain $ fields")
    return encode_key(_id)


def _contains_op(v) -> bool:
    if isinstance(v, dict):
        return any(k.startswith("$") or _contains_op(x) for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return any(_contains_op(x) for x in v)
    return False


def _applied_in(t) -> GTID | None:
    """The entry before the first unapplied one (the unapplied table's first key
    is the exact minimum unapplied GTID), or the oplog's last if none is."""
    mu = t.first("unapplied")
    if mu is None:
        last = t.last("oplog")
        return None if last is None else GTID.from_bytes(last[0])
    prev = next(iter(t.scan("oplog", None, mu[0], reverse=True)), None)
    return None if prev is None else GTID.from_bytes(prev[0])


def _delete_range(t, db: str, prefix: bytes) -> None:
    for k in [k for k, _ in t.scan(db, prefix, prefix_end(prefix))]:
        t.delete(db, k)


# --- the engine ----------------------------------------------------------
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
        with store.write() as t:
            if t.get("meta", b"format") is None:
                t.put("meta", b"format", codec.pack(1))
                t.put("meta", b"term", codec.pack(0))

    # meta
    def _next_counter(self, t, key: bytes) -> int:
        b = t.get("meta", key)
        n = 1 if b is None else codec.unpack(b) + 1
        t.put("meta", key, codec.pack(n))
        return n

    @property
    def term(self) -> int:
        with self.store.read() as t:
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
            term = codec.unpack(t.get("meta", b"term"))
            gtid = GTID(max(term, last.term), last.seq + 1)
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
        """Write an ``n`` entry: a GTID taken by a transaction that then failed."""
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

