"""``local.oplog.rs``, read-only: the member's oplog in MongoDB's shape, for
the tools that read it (mongosh's ``rs.printReplicationInfo()``, an operator's
``find().sort({$natural: -1}).limit(1)``).

Each raymx entry (one GTID, one transaction) is one document:

- ``ts``: ``Timestamp(commit second, seq mod 2**32)``, the commit time by the
  committing primary's clock, in seconds, and the GTID's seq (dense across
  terms), so the entries of one second keep their order; ``t``: the term;
  ``h``: the hash chain (``Int64``); ``v``: 2; ``wall``: the commit time;
- an entry of one op is that op as MongoDB logs it: ``i`` (``o``: the
  document), ``u`` (``o``: the document after it, a replacement, ``o2``:
  its ``_id``), ``d`` (``o``: its ``_id``), ``c`` (``o``: the command, ``ns``
  ``db.$cmd``), ``n`` (``o``: ``{msg: ...}``);
- an entry of several ops (a transaction, an ``insert_many``) is one ``c``
  entry of ``applyOps``, as MongoDB logs a transaction.

Served: ``find`` (filter, ``$natural`` order either way, skip, limit,
projection; at most ``FIND_MAX`` entries in one find), tailable cursors
(``Tailer``: what oplog tailers such as Meteor's read, awaiting data as
MongoDB's do), ``collStats`` and ``$collStats``, ``listCollections`` of
``local``. Writes are refused as for any ``local`` collection. It reads this
member's own oplog (on a secondary, what it replicated so far).
"""
from __future__ import annotations

import datetime
import itertools
from typing import Iterator

from bson import Binary, Int64, Timestamp

from raymx import errors
from raymx.storage import codec
from raymx.storage.changes import SESSIONS_NS, oplog_span
from raymx.storage.gtid import GTID
from raymx.storage.keys import prefix_end
from raymx.storage.projection import project
from raymx.storage.query import compile_filter
from raymx.wire.errors import CommandError, integer

NS = "local.oplog.rs"
FIND_MAX = 100_000  # entries one find may return (its cursor holds them)
TAIL_BATCH = 1_000  # entries a tailable cursor's getMore returns at most
TAIL_LOOK = 10_000  # entries one batch of a tailable cursor looks at (it may come back empty)


def _op_doc(op: dict) -> dict:
    """One raymx op as MongoDB's oplog logs it (op, ns, o, o2)."""
    kind, ns = op["op"], op.get("ns", "")
    if kind == "i":
        return {"op": "i", "ns": ns, "o": op["post"]}
    if kind == "u":
        return {"op": "u", "ns": ns, "o": op["post"], "o2": {"_id": op["post"].get("_id")}}
    if kind == "d":
        return {"op": "d", "ns": ns, "o": {"_id": op["pre"].get("_id")}}
    if kind == "n":
        return {"op": "n", "ns": "", "o": {"msg": "raymx no-op"}}
    db, _, coll = ns.partition(".")
    cmd = op.get("cmd")
    if cmd == "createIndex":
        spec = dict(op.get("spec") or {})
        if isinstance(spec.get("key"), list):
            spec["key"] = dict(spec["key"])
        o = {"createIndexes": coll, "v": 2, "name": op.get("name"), **spec}
    elif cmd == "dropIndex":
        o = {"dropIndexes": coll, "index": op.get("name")}
    elif cmd == "rename":
        o = {"renameCollection": ns, "to": op.get("to")}
    else:  # create, drop
        o = {cmd: coll}
    return {"op": "c", "ns": f"{db}.$cmd", "o": o}


def entry_doc(g: GTID, entry: dict, ops: list) -> dict:
    """The oplog document of raymx entry ``entry`` (its ops ``ops``) at ``g``.
    A driver session's record (``config.transactions``, written with a
    retryable write or a transaction) is not an op of it, as in MongoDB:
    the entry carries its ``lsid`` and ``txnNumber`` instead."""
    ms = int(entry.get("ts", 0))
    head = {"ts": Timestamp(ms // 1000, g.seq % (1 << 32)), "t": Int64(g.term),
            "h": Int64(entry["h"] - (1 << 64) if entry["h"] >= 1 << 63 else entry["h"]),
            "v": Int64(2)}
    mine = [op for op in ops if op.get("ns") != SESSIONS_NS]
    for op in ops:
        rec = op.get("post") if op.get("ns") == SESSIONS_NS else None
        if rec and isinstance(rec.get("_id"), bytes):
            lsid = rec["_id"]
            head["lsid"] = {"id": Binary(lsid, 4) if len(lsid) == 16 else Binary(lsid)}
            head["txnNumber"] = Int64(rec.get("n") or 0)
    ops = mine or [{"op": "n"}]
    if len(ops) == 1:
        body = _op_doc(ops[0])
    else:
        body = {"op": "c", "ns": "admin.$cmd", "o": {"applyOps": [_op_doc(op) for op in ops]}}
    return {**head, **body, "wall": datetime.datetime.fromtimestamp(
        ms / 1000, datetime.timezone.utc).replace(tzinfo=None)}


def _order(sort) -> int:
    """1 (oldest first) or -1 from a find's sort: ``$natural`` (or ``ts``) only."""
    if not sort:
        return 1
    items = list(sort.items()) if isinstance(sort, dict) else list(sort)
    if len(items) == 1 and items[0][0] in ("$natural", "ts") and items[0][1] in (1, -1):
        return int(items[0][1])
    raise CommandError(f"{NS} is read in its natural order only: sort by {{$natural: 1}} or "
                       f"{{$natural: -1}}, not {sort!r:.80}", 2, "BadValue")


def start_key(engine, flt: dict | None) -> bytes | None:
    """Where a read of the view oldest first may start (None: the oldest
    entry). As MongoDB's oplog replay, which it applies to every find of
    the oplog with a lower bound on ``ts`` (``$gte``, ``$gt``, ``$eq``):
    at the bound's entry, or the first entry of its second
    (``Engine.oplog_at``'s binary search, ``ts`` taken as ordered), not at
    the oldest entry; the filter applies as ever. So a tailer, or a
    ``find`` of the last minutes of a long oplog, starts at once."""
    cond = (flt or {}).get("ts")
    if isinstance(cond, dict):
        cond = next((cond[op] for op in ("$gte", "$gt", "$eq")
                     if isinstance(cond.get(op), Timestamp)), None)
    if not isinstance(cond, Timestamp):
        return None
    try:
        g = engine.oplog_at(cond.time * 1000, cond.inc)
    except errors.OplogTrimmed:
        return None  # older than the oldest entry kept: from there
    return g.to_bytes() if g is not None else prefix_end(engine.last()[0].to_bytes())


def _view(engine, t, start=None, stop=None, reverse=False) -> Iterator[tuple[GTID, dict]]:
    """(GTID, document) of each entry read in ``t`` from ``start`` to ``stop``."""
    for k, v in t.scan("oplog", start, stop, reverse=reverse):
        g, entry = GTID.from_bytes(k), codec.unpack(v, "oplog entry")
        yield g, entry_doc(g, entry, engine.entry_ops(t, entry))


def _shown(doc: dict, flt, projection) -> dict:
    return doc if not projection else project(doc, projection, flt)


def docs(engine, flt: dict, sort=None, projection=None) -> Iterator[dict]:
    """The view's documents matching ``flt``, in oplog order (``sort``), one
    read snapshot: what counts, pipelines and ``distinct`` stream through.
    Oldest first, a lower bound on ``ts`` starts at its entry (``start_key``)."""
    step = _order(sort)
    match = compile_filter(flt or {})
    start = start_key(engine, flt) if step > 0 else None
    with engine.store.read() as t:
        for _, doc in _view(engine, t, start, reverse=step < 0):
            if match(doc):
                yield _shown(doc, flt, projection)


def find(engine, flt: dict, sort, skip: int, limit: int, projection) -> list[dict]:
    """A ``find`` on the view (its cursor holds the answer): ``docs`` after
    ``skip``, at most ``limit`` (0: all, up to ``FIND_MAX``)."""
    out: list[dict] = []
    for doc in itertools.islice(docs(engine, flt, sort, projection), skip, None):
        if len(out) >= FIND_MAX:
            raise CommandError(
                f"a find on {NS} returns at most {FIND_MAX:,} entries here: give it a "
                "limit, or a range of ts", 2, "BadValue")
        out.append(doc)
        if limit and len(out) >= limit:
            break
    return out


class Tailer:
    """A tailable cursor on the view (a ``find`` with ``tailable``): its
    filter and projection, the last entry it looked at, and what is left of
    its limit. It reads oldest first and stays open at the end, so each
    batch holds the matching entries written since the one before (only
    entries committed here: ``gate``). A batch looks at no more than
    ``TAIL_LOOK`` entries, so one far behind catches up over several."""

    def __init__(self, engine, cmd: dict, flt: dict, projection):
        if cmd.get("singleBatch") or integer(cmd, "limit") < 0:
            raise CommandError("a tailable cursor cannot be a single batch", 2, "BadValue")
        if integer(cmd, "skip"):
            raise CommandError(f"a tailable cursor on {NS} takes no skip: filter on ts", 2,
                               "BadValue")
        if _order(cmd.get("sort")) != 1:
            raise CommandError(f"a tailable cursor reads {NS} oldest first: sort by "
                               "{$natural: 1} or not at all", 2, "BadValue")
        self.flt, self.projection = flt, projection
        self.match = compile_filter(flt or {})
        self.await_data = bool(cmd.get("awaitData"))
        self.left = integer(cmd, "limit") or None  # None: no limit
        self.pos: GTID | None = None  # the last entry looked at (None: none yet)
        # where the first batch starts: a tailer resuming at the last ts it
        # saw starts at once, however long the oplog (None: the oldest)
        self.start = start_key(engine, flt)

    def batch(self, engine, gate: GTID | None, n_max: int, member: int = 0) -> list[dict]:
        """The matching entries after ``pos``, up to ``gate`` (inclusive), at
        most ``n_max`` (and what is left of the limit). A position trimmed
        from the oplog, or rolled back, ends the cursor as MongoDB's does
        (``CappedPositionLost``)."""
        if self.left is not None:
            n_max = min(n_max, self.left)
        out: list[dict] = []
        if gate is None or (self.pos is not None and gate <= self.pos):
            return out
        with engine.store.read() as t:
            if self.pos is not None:
                try:
                    oplog_span(t, (self.pos.term, self.pos.seq), member)
                except errors.OplogTrimmed:
                    raise CommandError(
                        f"the tailable cursor's position {self.pos} was trimmed from {NS} "
                        "before it read on: query again from the oldest entry", 136,
                        "CappedPositionLost") from None
                except errors.Diverged:
                    raise CommandError(
                        f"the tailable cursor's position {self.pos} in {NS} was rolled back "
                        "(it was not majority-committed): query again", 136,
                        "CappedPositionLost") from None
            start = self.start if self.pos is None else prefix_end(self.pos.to_bytes())
            stop = prefix_end(gate.to_bytes())
            for looked, (g, doc) in enumerate(_view(engine, t, start, stop)):
                if len(out) >= n_max or looked >= TAIL_LOOK:
                    break
                self.pos = g
                if self.match(doc):
                    out.append(_shown(doc, self.flt, self.projection))
        if self.left is not None:
            self.left -= len(out)
        return out

    def done(self) -> bool:
        """Its limit is reached: the cursor closes."""
        return self.left is not None and self.left <= 0


def stats(engine, cap: dict, scale: int = 1) -> dict:
    """``collStats`` of the view: its entries and their stored bytes; ``maxSize``
    the oplog's byte cap (its present size where only an age caps it)."""
    with engine.store.read() as t:
        n, size = t.db_stat("oplog")
    most = cap.get("max_bytes") or max(size, 1)
    return {"ns": NS, "count": n, "size": size // scale, "avgObjSize": size // n if n else 0,
            "storageSize": size // scale, "freeStorageSize": 0, "capped": True,
            "max": -1, "maxSize": most // scale, "nindexes": 0, "indexSizes": {},
            "totalIndexSize": 0, "totalSize": size // scale, "scaleFactor": scale}


def listing() -> dict:
    """Its ``listCollections`` entry."""
    return {"name": "oplog.rs", "type": "collection", "options": {"capped": True},
            "info": {"readOnly": True}}
