"""Names, ids, catalog records and the small records the engine keeps.

What the reader, the transaction and the engine all use, so it sits below
them (raymx/storage/engine.py describes the key layout): namespace checks
(``split_ns``), generated ``_id``s (``new_id``), index keys and names, a
collection's parsed catalog record (``CollInfo``, ``IndexInfo``), the range
record (``RangeRecord`` under ``RANGE_KEY``), a stored oplog entry's form
(``entry_inline``, ``entry_chunks``), the applied point (``_applied_in``)
and what statements, trims and queries report (``WriteResult``,
``TrimResult``, ``Stats``).
"""
from __future__ import annotations

import os
import re
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from bson.regex import Regex

from raymx.storage import codec, errors, numbers, oplog, query
from raymx.storage.gtid import GTID
from raymx.storage.keys import encode_key
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


def _applied_in(t) -> GTID | None:
    """The entry before the first unapplied one (the unapplied table's first key
    is the exact minimum unapplied GTID), or the oplog's last if none is."""
    mu = t.first("unapplied")
    if mu is None:
        last = t.last("oplog")
        return None if last is None else GTID.from_bytes(last[0])
    prev = next(iter(t.scan("oplog", None, mu[0], reverse=True)), None)
    return None if prev is None else GTID.from_bytes(prev[0])


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
    if ns == "local.oplog.rs":
        raise errors.InvalidName("local.oplog.rs is the oplog, not a collection: nothing writes "
                                 "it; the MongoDB wire port serves it read-only, and "
                                 "ReplicaSet.oplog() reads it")
    if len(_VALID_NS) < 100_000:
        _VALID_NS[ns] = (db, coll)
    return db, coll


_OID_PROC = os.urandom(5).hex()
_oid_lock = threading.Lock()
_oid_counter = [int.from_bytes(os.urandom(3), "big")]


def _pk(_id) -> bytes:
    """The key a document's ``_id`` is stored under, refusing what MongoDB
    refuses as an ``_id`` (an array, a regular expression, a $ field)."""
    t = type(_id)
    if t is int or t is str:
        return encode_key(_id)
    if t in (list, tuple):
        raise errors.InvalidDocument(f"_id cannot be an array: {_id!r:.60}")
    if t is re.Pattern or t is Regex:  # as MongoDB: an _id regex could never be matched
        raise errors.InvalidDocument(f"_id cannot be a regular expression: {_id!r:.60}")
    if t is dict and _contains_op(_id):
        raise errors.InvalidDocument(f"_id {_id!r:.60} may not contain $ fields")
    return encode_key(_id)


def _contains_op(v) -> bool:
    if isinstance(v, dict):
        return any(k.startswith("$") or _contains_op(x) for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return any(_contains_op(x) for x in v)
    return False


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
        if isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[1], str):
            raise errors.InvalidOperation(
                f"{item[1]!r} indexes (on {item[0]!r}) are not supported by raymx: its "
                "indexes are ascending (1) or descending (-1) B-tree indexes")
        if (not isinstance(item, (list, tuple)) or len(item) != 2 or not isinstance(item[0], str)
                or not item[0] or item[0].startswith("$") or item[1] not in (1, -1)):
            raise errors.InvalidOperation(f"bad index key element {item!r}: "
                                          "expected (field, 1 or -1)")
        out.append([item[0], int(item[1])])
    if len({p for p, _ in out}) != len(out):
        raise errors.InvalidOperation(f"index key {key!r} repeats a field")
    return out


def check_expire(expire_after_s, key: list[list]):
    """A TTL index's ``expireAfterSeconds`` (None: not one): whole seconds,
    0 to 2**31 - 1, on one field other than ``_id``, as MongoDB's."""
    if expire_after_s is None:
        return None
    if not numbers.whole(expire_after_s) or not 0 <= expire_after_s < 2**31:
        raise errors.InvalidOperation(f"expireAfterSeconds must be a whole number of seconds "
                                      f"from 0 to 2147483647, not {expire_after_s!r:.40}")
    if len(key) != 1 or key[0][0] == "_id":
        raise errors.InvalidOperation("a TTL index (expireAfterSeconds) must be on one field "
                                      f"other than _id, not {key!r:.80}")
    return int(expire_after_s)


def check_partial(partial) -> dict | None:
    """A partial index's ``partialFilterExpression`` (None: not one): a filter
    map the query engine compiles (it is checked here, once)."""
    if partial is None:
        return None
    if not isinstance(partial, dict) or not partial:
        raise errors.InvalidOperation("partialFilterExpression must be a non-empty filter "
                                      f"document, not {partial!r:.80}")
    query.compile_filter(partial)  # InvalidFilter names what is wrong
    return partial


def index_name(key: list[list]) -> str:
    return "_".join(f"{p}_{d}" for p, d in key)


@dataclass
class IndexInfo:
    name: str
    id: int
    key: list  # [[path, dir], ...]
    unique: bool
    # a TTL index: documents whose field is a date older than this many
    # seconds are deleted by the primary (``TrimPath.expire_once``)
    expire_after_s: int | None = None
    # a sparse index holds only the documents that have one of its fields; a
    # partial one only those its filter matches. Neither holds every
    # document, so no query plan reads through them (``every_document``):
    # they enforce uniqueness among the documents they hold
    sparse: bool = False
    partial: dict | None = None
    prefix: bytes = field(init=False, repr=False, compare=False)
    single: str | None = field(init=False, repr=False, compare=False)
    holds: Callable[[dict], bool] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        self.prefix = _U32.pack(self.id)
        # the field of a one-field index over a top-level path (no dots)
        p = self.key[0][0] if len(self.key) == 1 else "."
        self.single = None if "." in p else p
        self.holds = None
        if self.sparse or self.partial is not None:
            sel = query.compile_filter(self.partial) if self.partial is not None else None
            paths = [k[0] for k in self.key] if self.sparse else []

            def holds(doc: dict) -> bool:
                if paths and all(query.reach(doc, q) == [query.MISSING] for q in paths):
                    return False
                return sel is None or sel(doc)
            self.holds = holds

    @property
    def every_document(self) -> bool:
        """Holds an entry for every document: query plans may read through it."""
        return self.holds is None

    def spec(self) -> dict:
        out = {"key": self.key, "unique": self.unique}
        if self.expire_after_s is not None:
            out["expireAfterSeconds"] = self.expire_after_s
        if self.sparse:
            out["sparse"] = True
        if self.partial is not None:
            out["partialFilterExpression"] = self.partial
        return out


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
                      if not ix.unique and ix.single is not None and ix.holds is None]
        self.general = [ix for ix in ixs
                        if ix.unique or ix.single is None or ix.holds is not None]

    def record(self) -> bytes:
        return codec.pack({"id": self.id, "indexes": {
            n: {"id": i.id, **i.spec()} for n, i in self.indexes.items()}})

    @classmethod
    def from_record(cls, ns: str, b: bytes) -> "CollInfo":
        r = codec.unpack(b, "catalog record")
        return cls(ns, r["id"], {n: IndexInfo(n, i["id"], i["key"], i["unique"],
                                              i.get("expireAfterSeconds"),
                                              bool(i.get("sparse")),
                                              i.get("partialFilterExpression"))
                                 for n, i in r["indexes"].items()})


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


# --- what a query did -----------------------------------------------------
class Stats:
    """Counters a query fills in; tests use ``examined`` to see index use.
    ``check``: called every ``CHECK_EVERY`` documents examined (a read's
    time limit raises from it)."""
    CHECK_EVERY = 256  # a power of two

    def __init__(self, check=None):
        self.examined = 0
        self.plan = None
        self.in_order = None  # "forward" / "backward": the plan's scan gave the sort's order
        # the documents come one by one as decoded (no sort holds them back), so
        # the reader's ``stored_bytes`` is the size of the last one as stored
        self.sized = False
        self.check = check
