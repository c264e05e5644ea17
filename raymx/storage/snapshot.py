"""Consistent snapshots of a member and bulk-loading them into a new member (DESIGN 8).

Source side: ``Snapshot(engine)`` opens one read transaction, which is the
snapshot. Its GTID is the member's applied point *inside that transaction*
(the entry before the first unapplied one), so it is exactly the point the
new member resumes replication from. The snapshot is planned as key-range
partitions of the ``docs`` and ``index`` sub-databases, read as stored
msgpack bytes (never re-encoded), each with a checksum.

Target side (a fresh, empty member folder):

1. ``begin_load`` writes the catalog, the id and spill counters and the term,
   and marks the member as synchronizing (``meta initial_sync``), so its
   producer does not pull and its status says so;
2. ``load_rows`` bulk-loads sorted runs (LMDB append mode);
3. ``finish_load`` checks every partition's checksum over the target's own
   copy, then writes the snapshot GTID's oplog entry (its stored bytes, and
   spilled chunks) as already applied, so the hash chain continues there and
   a feeder's ``after``/``after_h`` check accepts the new member's first pull;
   then the range record, and clears the mark. Everything before it in one
   sync: a crash earlier leaves the ``initial_sync`` mark, and the folder must
   be copied again.

The target's oplog therefore starts mid-chain: its first entry is the
snapshot's, with a seq above 1. ``Engine.verify_oplog`` checks the chain from
the first entry present.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from raymx.storage import codec, errors, oplog
from raymx.storage.catalog import RANGE_KEY, RangeRecord, _applied_in, entry_chunks
from raymx.storage.engine import Engine, upgrade_keys
from raymx.storage.gtid import GTID, ZERO

SNAPSHOT_DBS = ("docs", "index")
# meta keys the new member takes over: collection/index ids and spill ids must
# not be reused if it becomes primary; the format marks an initialised store
COPIED_META = (b"format", b"next_id", b"next_spill")


@dataclass(frozen=True)
class Part:
    """Rows of one sub-database with ``start <= key < stop`` (None: open end)."""
    index: int
    db: str
    start: bytes | None
    stop: bytes | None

    def as_list(self) -> list:
        return [self.index, self.db, self.start, self.stop]

    @classmethod
    def of(cls, x) -> "Part":
        return x if isinstance(x, Part) else cls(int(x[0]), x[1], x[2], x[3])


def checksum_run(run: bytes, rows: int) -> list:
    """A run's checksum: its row count and a digest of its packed bytes. Both
    sides pack the same key range in key order (``codec.pack_rows`` is
    deterministic), so equal checksums mean the target holds exactly the
    source's rows for that range."""
    return [rows, hashlib.sha256(run).hexdigest()[:32]]  # SHA-NI: see storage/oplog.py


def read_run(t, part: "Part") -> tuple[bytes, list]:
    """``part``'s key range as stored in transaction ``t``: packed, and its checksum."""
    rows = list(t.scan(part.db, part.start, part.stop))
    run = codec.pack_rows(rows)
    return run, checksum_run(run, len(rows))


def range_checksum(t, part: "Part") -> list:
    return read_run(t, part)[1]


class Snapshot:
    """One consistent snapshot of a member: a read transaction held open.

    Not thread-safe: the caller serialises ``read`` calls (an LMDB read
    transaction is used by one thread at a time). Close it promptly: LMDB
    cannot reuse pages freed after it while it is open.
    """

    def __init__(self, engine: Engine, rows_per_part: int):
        if rows_per_part < 1:
            raise errors.ConfigError("rows_per_part must be positive")
        self.e = engine
        self.t = engine.store.read()
        try:
            # everything this snapshot holds is durable on the source before
            # anyone builds on it (a primary's newest commits may be unsynced)
            engine.store.sync()
            t = self.t
            self.gtid = _applied_in(t) or ZERO
            self.entry, self.chunks = None, []
            if self.gtid != ZERO:
                self.entry = t.get("oplog", self.gtid.to_bytes())
                self.chunks = entry_chunks(t, self.entry)
            self.term = codec.unpack(t.get("meta", b"term"))
            self.meta = {k: t.get("meta", k) for k in COPIED_META if t.get("meta", k) is not None}
            self.catalog = list(t.scan("catalog"))
            b = t.get("range", RANGE_KEY)
            r = RangeRecord() if b is None else RangeRecord.unpack(b)
            self.terms = [x for x in r.terms if GTID(x[0], x[1]) <= self.gtid]
            self.majority = r.majority if r.majority is not None and r.majority <= self.gtid \
                else None
            self.parts = self._plan(rows_per_part)
        except BaseException:
            self.t.abort()
            raise

    def _plan(self, rows_per_part: int) -> list[Part]:
        parts: list[Part] = []
        self.rows = 0
        for db in SNAPSHOT_DBS:
            start, n, rows = None, 0, 0
            for k in self.t.scan_keys(db):  # keys only: no value is copied to plan
                if n == rows_per_part:
                    parts.append(Part(len(parts), db, start, k))
                    start, n = k, 0
                n += 1
                rows += 1
            self.rows += rows
            if rows:
                parts.append(Part(len(parts), db, start, None))
        return parts

    def info(self) -> dict:
        """Everything the target needs besides the partitions' rows (msgpack-able)."""
        return {"gtid": list(self.gtid), "entry": self.entry, "chunks": self.chunks,
                "term": self.term, "meta": {k.decode(): v for k, v in self.meta.items()},
                "catalog": [[k, v] for k, v in self.catalog], "terms": self.terms,
                "majority": None if self.majority is None else list(self.majority),
                "parts": [p.as_list() for p in self.parts], "rows": self.rows}

    def read(self, part) -> tuple[bytes, list]:
        """One partition's rows as stored, packed into one run, and its checksum."""
        return read_run(self.t, Part.of(part))

    def close(self) -> None:
        self.t.abort()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


# --- target side ---------------------------------------------------------
def is_empty(engine: Engine) -> bool:
    with engine.store.read() as t:
        return all(t.first(db) is None for db in ("catalog", "docs", "index", "oplog"))


def begin_load(engine: Engine, info: dict) -> None:
    """Prepare a fresh member for the snapshot ``info`` (refuses a used folder)."""
    with engine.store.write() as t:
        if any(t.first(db) is not None for db in ("catalog", "docs", "index", "oplog")):
            raise errors.InvalidOperation(
                f"{engine.store.path} already holds data: a snapshot loads only into an "
                "empty member folder (remove it to resync)")
        t.put("meta", b"initial_sync", codec.pack({"gtid": info["gtid"], "parts":
                                                    len(info["parts"])}))
        for k, v in info["meta"].items():
            t.put("meta", k.encode(), v)
        cur = codec.unpack(t.get("meta", b"term"))
        t.put("meta", b"term", codec.pack(max(cur, info["term"])))
        for k, v in info["catalog"]:
            t.put("catalog", k, v)
    engine._catalog_cache.clear()


def load_rows(engine: Engine, db: str, rows) -> int:
    """Bulk-load one sorted run (packed bytes, or (key, value) rows) into ``db``
    in one transaction."""
    if db not in SNAPSHOT_DBS:
        raise errors.InvalidOperation(f"a snapshot loads only {SNAPSHOT_DBS}, not {db!r}")
    if isinstance(rows, (bytes, bytearray)):
        rows = codec.unpack_rows(rows)
    with engine.store.write() as t:
        return t.put_sorted(db, rows)


def load_run(engine: Engine, db: str, run: bytes) -> list:
    """Bulk-load one partition's packed run as received; returns the checksum of
    exactly what was loaded (``put_sorted`` checks every row was added), to be
    compared with the source's in ``finish_load`` without reading it back."""
    n = load_rows(engine, db, run)
    return checksum_run(run, n)


def verify_parts(engine: Engine, parts: list, checksums: dict,
                 loaded: dict | None = None) -> None:
    """Compare each partition's source checksum with the target's: the checksum
    of the run it loaded for that partition (``loaded``, from ``load_run``), or
    else of its own rows read back (runs that were re-partitioned on the way,
    as in the Spark path)."""
    with engine.store.read() as t:
        for p in map(Part.of, parts):
            want = checksums.get(p.index)
            if want is None:
                raise errors.CorruptEntry(f"no source checksum for partition {p.index}")
            got = (loaded or {}).get(p.index) or range_checksum(t, p)
            if list(got) != list(want):
                raise errors.CorruptEntry(
                    f"partition {p.index} ({p.db}) differs after the copy: source "
                    f"{want[0]} rows {want[1]}, target {got[0]} rows {got[1]}")


def finish_load(engine: Engine, info: dict, checksums: dict, loaded: dict | None = None) -> GTID:
    """Verify, write the snapshot's oplog entry (applied), clear the mark, sync."""
    verify_parts(engine, info["parts"], checksums, loaded)
    g = GTID(*info["gtid"])
    with engine.store.write() as t:
        if t.get("meta", b"initial_sync") is None:
            raise errors.InvalidOperation("finish_load without begin_load")
        if g != ZERO:
            e = codec.unpack(info["entry"], "oplog entry")
            oplog.check_entry(e, f"snapshot entry {g}")
            t.put("oplog", g.to_bytes(), info["entry"])
            if "ref" in e:
                if len(info["chunks"]) != e["chunks"]:
                    raise errors.CorruptEntry(f"snapshot entry {g}: expected {e['chunks']} "
                                              "spilled chunks")
                for i, ch in enumerate(info["chunks"]):
                    t.put("oplog.refs", oplog.spill_key(e["ref"], i), ch)
            r = RangeRecord(terms=[list(x) for x in info["terms"]])
            if not r.terms or r.terms[-1][0] != g.term:
                r.terms.append([g.term, g.seq])  # the boundary is before g; g is the first held
            r.majority = None if info["majority"] is None else GTID(*info["majority"])
            t.put("range", RANGE_KEY, r.pack())
        upgrade_keys(t)  # rows copied from a member of an older format
        t.delete("meta", b"initial_sync")
    engine._tail = None
    engine.sync()
    return g


def initial_sync_state(engine: Engine) -> dict | None:
    """The ``initial_sync`` mark of a member still loading (None when done)."""
    return engine.get_meta("initial_sync")


def copy_local(source: Engine, target: Engine, rows_per_part: int = 100_000) -> GTID:
    """Snapshot ``source`` and load it into ``target`` in one process (tests, tools)."""
    with Snapshot(source, rows_per_part) as s:
        info = s.info()
        begin_load(target, info)
        sums = {}
        for p in s.parts:
            rows, sums[p.index] = s.read(p)
            load_rows(target, p.db, rows)
    return finish_load(target, info, sums)


# --- hot copies (backups) ----------------------------------------------------
def backup(engine: Engine, dest: str) -> GTID:
    """A consistent hot copy of a member's LMDB files into ``dest`` (LMDB's own
    copy: one read transaction, writers go on). Returns the copy's applied point."""
    import os

    from raymx.storage.lmdb_store import LMDBStore
    if os.path.isdir(dest) and os.listdir(dest):
        raise errors.InvalidOperation(f"backup folder {dest} is not empty")
    engine.store.copy_to(dest)
    s = LMDBStore(dest, map_bytes=engine.limits.map_bytes)
    try:
        with s.read() as t:
            return _applied_in(t) or ZERO
    finally:
        s.close()


def adopt_copy(engine: Engine) -> GTID | None:
    """Make a hot copy of another member's files ready to join as a new member.

    Entries from its ``replInfo`` point (the conservative minimum unapplied
    GTID recorded about once a second) onward are marked unapplied again, so
    the applier replays them (idempotently, from their images) and none is
    missed whatever the copy caught; the producer then resumes after the last
    entry it holds, skipping every GTID it already has. The old member's
    identity, configuration and resync mark are dropped. Returns the point
    replay restarts from (None: everything was applied)."""
    with engine.store.write() as t:
        b = t.get("replInfo", b"min_unapplied")
        start = b if b else None
        if start is None:
            mu = t.first("unapplied")
            start = None if mu is None else mu[0]
        if start is not None:
            for k, _ in list(t.scan("oplog", start)):
                t.put("unapplied", k, b"")
        for k in (b"member_id", b"replset", b"rs_config", b"needs_resync", b"initial_sync"):
            t.delete("meta", k)
    engine._tail = None
    engine.sync()
    return None if start is None else GTID.from_bytes(start)
