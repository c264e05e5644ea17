"""The storage seam: one contract, two stores (LMDB and in-memory).

A store is a set of named sorted byte-key sub-databases (``DBS``) with
transactions: any number of readers, each a consistent snapshot, and one writer
at a time. Writes become visible at commit, in submission order, and durable at
``sync()``; ``MemoryStore.crash()`` drops whatever was not synced, as a machine
crash would drop LMDB's unsynced commits. A write that finds no room raises
``errors.DiskFull`` from the put or the commit; the transaction may then only
be aborted, nothing of it is stored, and the store stays usable (reads at
once, writes once there is room): ``MemoryStore.full`` simulates that. The
contract tests in tests/test_store_contract.py run against both stores.
"""
from __future__ import annotations

import bisect
import threading
from typing import Callable, Iterator, Protocol

from raymx.storage import errors

# The fixed layout (DESIGN section 3). Keys inside each are described in
# raymx.storage.engine.
DBS = ("meta", "catalog", "docs", "index", "oplog", "oplog.refs", "unapplied",
       "replInfo", "range")


class ReadTxn(Protocol):
    def get(self, db: str, key: bytes) -> bytes | None: ...
    def scan(self, db: str, start: bytes | None = None, stop: bytes | None = None,
             reverse: bool = False) -> Iterator[tuple[bytes, bytes]]: ...
    def scan_keys(self, db: str, start: bytes | None = None, stop: bytes | None = None
                  ) -> Iterator[bytes]: ...
    def first(self, db: str) -> tuple[bytes, bytes] | None: ...
    def last(self, db: str) -> tuple[bytes, bytes] | None: ...
    def db_stat(self, db: str) -> tuple[int, int]: ...  # (entries, bytes)
    # the commit this top-level transaction began after: two transactions
    # have the same one only if no commit came between their begins
    def snapshot_id(self) -> int: ...
    def abort(self) -> None: ...


class WriteTxn(ReadTxn, Protocol):
    def put(self, db: str, key: bytes, value: bytes, overwrite: bool = True) -> bool: ...
    def delete(self, db: str, key: bytes) -> bool: ...
    # put(db, ...) with db bound once: the per-document loops of a statement
    def putter(self, db: str, overwrite: bool = True) -> Callable[[bytes, bytes], bool]: ...
    # put (overwriting) each row, in any order, in one call: a batch's index entries
    def put_many(self, db: str, rows: list[tuple[bytes, bytes]]) -> None: ...
    # Bulk load: rows in strictly increasing key order; appended at the end of
    # the sub-database when they all sort after its last key (LMDB's append
    # mode: no page splits, no search), else put one by one. Returns rows put.
    def put_sorted(self, db: str, rows: list[tuple[bytes, bytes]]) -> int: ...
    # every row, or none: False (nothing written) when a key exists or repeats
    def put_new(self, db: str, rows: list[tuple[bytes, bytes]]) -> bool: ...
    def nested(self) -> "WriteTxn": ...  # a savepoint: commit merges, abort discards
    # the keys of ``db`` this transaction changed itself (its committed
    # savepoints' included; any order, maybe repeated); None when it no longer
    # knows (the LMDB store stops recording past ``wal.UNLOGGED_OPS`` changes)
    def written(self, db: str) -> list[bytes] | None: ...
    def commit(self) -> None: ...


class Store(Protocol):
    path: str
    # writes refused so far because the disk had no room (``DiskFull`` with
    # ``full="disk"``; a full map is not counted: it grows): a primary whose
    # count moves hands over to a member with room (``MemberCore.reply``)
    disk_refusals: int

    def read(self) -> ReadTxn: ...
    def write(self) -> WriteTxn: ...
    def sync(self) -> None: ...
    def close(self) -> None: ...
    # release(): end long-lived idle transactions so a remap of the map can run
    def on_remap(self, release: Callable[[], None]) -> Callable[[], None]: ...
    def free_bytes(self) -> int | None: ...  # room left on its disk; None: unknown


class _TxnBase:
    """first/last and context-manager behaviour shared by both stores."""

    def scan_keys(self, db, start=None, stop=None):
        """Keys only, in order (the LMDB store copies no values)."""
        for k, _ in self.scan(db, start, stop):
            yield k

    def first(self, db):
        return next(iter(self.scan(db)), None)

    def last(self, db):
        return next(iter(self.scan(db, reverse=True)), None)

    def db_stat(self, db):
        """(entries, bytes of keys and values); LMDB counts pages instead."""
        n = size = 0
        for k, v in self.scan(db):
            n += 1
            size += len(k) + len(v)
        return n, size

    def __enter__(self):
        return self

    def __exit__(self, et, e, tb):
        if et is None and getattr(self, "_write", False):
            self.commit()
        else:
            self.abort()


# --- in-memory store ----------------------------------------------------
class _Table:
    """An immutable sorted table: a key list and a dict (copy on write)."""

    __slots__ = ("keys", "vals")

    def __init__(self, keys=None, vals=None):
        self.keys: list[bytes] = keys if keys is not None else []
        self.vals: dict[bytes, bytes] = vals if vals is not None else {}

    def range_keys(self, start, stop):
        lo = 0 if start is None else bisect.bisect_left(self.keys, start)
        hi = len(self.keys) if stop is None else bisect.bisect_left(self.keys, stop)
        return self.keys[lo:hi]


class _MemRead(_TxnBase):
    def __init__(self, tables: dict[str, _Table], version: int):
        self._tables = tables
        self._version = version
        self._open = True

    def snapshot_id(self):
        return self._version

    def _check(self, db):
        if not self._open:
            raise RuntimeError("transaction is finished")
        if db not in self._tables:
            raise KeyError(f"unknown sub-database {db!r}")

    def get(self, db, key):
        self._check(db)
        return self._tables[db].vals.get(bytes(key))

    def scan(self, db, start=None, stop=None, reverse=False):
        self._check(db)
        t = self._tables[db]
        ks = t.range_keys(start, stop)
        for k in (reversed(ks) if reverse else ks):
            yield k, t.vals[k]

    def abort(self):
        self._open = False


class _WritesOver(_TxnBase):
    """The write calls of a transaction whose writes are kept in memory over
    what it reads (the in-memory store's, an interactive transaction's
    ``Overlay``): they need ``_check(db)``, ``_room()`` (DiskFull when no
    room), ``_lookup(db, key)`` and ``_set(db, key, value or None)``, and
    keep ``_open``, ``_child`` (the open savepoint) and ``_over`` (its own
    writes: {db: {key: value or None}})."""

    def written(self, db):
        return list(self._over.get(db, ()))

    def _check(self, db):
        if not self._open:
            raise RuntimeError("transaction is finished")
        if self._child is not None:
            raise RuntimeError("a nested transaction is open")
        if db not in DBS:
            raise KeyError(f"unknown sub-database {db!r}")

    def _room(self):
        pass

    def put(self, db, key, value, overwrite=True):
        self._check(db)
        self._room()
        key = bytes(key)
        if not overwrite and self._lookup(db, key) is not None:
            return False
        self._set(db, key, bytes(value))
        return True

    def put_many(self, db, rows):
        for k, v in rows:
            self.put(db, k, v)

    def put_sorted(self, db, rows):
        self._check(db)
        self._room()
        prev = None
        for k, v in rows:
            if prev is not None and k <= prev:
                raise ValueError(f"put_sorted: key {k!r:.40} does not follow {prev!r:.40}")
            self.put(db, k, v)
            prev = k
        return len(rows)

    def put_new(self, db, rows):
        self._check(db)
        self._room()
        keys = [bytes(k) for k, _ in rows]
        if len(set(keys)) != len(keys) or any(self._lookup(db, k) is not None for k in keys):
            return False
        for k, (_, v) in zip(keys, rows):
            self._set(db, k, bytes(v))
        return True

    def delete(self, db, key):
        self._check(db)
        self._room()
        key = bytes(key)
        existed = self._lookup(db, key) is not None
        if existed:
            self._set(db, key, None)
        return existed

    def putter(self, db, overwrite=True):
        return lambda key, value: self.put(db, key, value, overwrite)


class _MemWrite(_WritesOver):
    """Writes go to an overlay over the parent (a snapshot or another txn)."""

    _write = True

    def __init__(self, store: "MemoryStore | None", parent):
        self._store = store  # None for a nested txn
        self._parent = parent
        self._over: dict[str, dict[bytes, bytes | None]] = {}
        self._open = True
        self._child = None
        self._version = store._version if store is not None else None

    def snapshot_id(self):
        return self._version

    def _lookup(self, db, key):
        o = self._over.get(db)
        if o is not None and key in o:
            return o[key]
        p = self._parent
        return p._lookup(db, key) if isinstance(p, _MemWrite) else p[db].vals.get(key)

    def _keys(self, db, start, stop) -> set:
        ks = set(k for k in self._over.get(db, ())
                 if (start is None or k >= start) and (stop is None or k < stop))
        p = self._parent
        ks.update(p._keys(db, start, stop) if isinstance(p, _MemWrite)
                  else p[db].range_keys(start, stop))
        return ks

    def get(self, db, key):
        self._check(db)
        return self._lookup(db, bytes(key))

    def scan(self, db, start=None, stop=None, reverse=False):
        self._check(db)
        for k in sorted(self._keys(db, start, stop), reverse=reverse):
            v = self._lookup(db, k)
            if v is not None:
                yield k, v

    def _room(self):
        """DiskFull while the store is full (every write-side call, as LMDB's
        page allocations can fail at any put or delete)."""
        s = self._store_of()
        if s.full:
            raise s._full_error()

    def _set(self, db, key, value):
        self._over.setdefault(db, {})[key] = value

    def _store_of(self) -> "MemoryStore":
        t = self
        while t._store is None:
            t = t._parent
        return t._store

    def nested(self):
        self._check("meta")
        self._child = _MemWrite(None, self)
        return self._child

    def commit(self):
        if not self._open:
            raise RuntimeError("transaction is finished")
        if self._store is not None and self._store.full:  # as LMDB: aborted, nothing stored
            self.abort()
            raise self._store._full_error()
        self._open = False
        if self._store is None:
            p = self._parent
            p._child = None
            for db, o in self._over.items():
                p._over.setdefault(db, {}).update(o)
        else:
            self._store._commit(self._over)

    def abort(self):
        if not self._open:
            return
        self._open = False
        if self._store is None:
            self._parent._child = None
        else:
            self._store._release()


class MemoryStore:
    """LMDB's semantics in memory: one writer at a time (others wait, in order),
    snapshot readers, commits visible at once and durable only after ``sync``."""

    def __init__(self, path: str = "<memory>"):
        self.path = path
        # The fault switch: while True, every write-side call (put, put_many,
        # put_sorted, put_new, delete, putter's callables) and every top-level
        # commit raises errors.DiskFull; the transaction is then aborted,
        # nothing of it stored. Reads go on; clear it and writes work again.
        self.full = False
        self.disk_refusals = 0
        self._tables = {db: _Table() for db in DBS}
        self._version = 0  # commits so far
        self._durable = self._tables
        self._writer = threading.Lock()
        self._closed = False

    def read(self):
        self._alive()
        return _MemRead(self._tables, self._version)

    def write(self):
        self._alive()
        self._writer.acquire()
        return _MemWrite(self, self._tables)

    def _commit(self, over):
        try:
            tables = dict(self._tables)
            for db, o in over.items():
                t = tables[db]
                vals = dict(t.vals)
                for k, v in o.items():
                    if v is None:
                        vals.pop(k, None)
                    else:
                        vals[k] = v
                tables[db] = _Table(sorted(vals), vals)
            self._tables = tables
            self._version += 1
        finally:
            self._writer.release()

    def _release(self):
        self._writer.release()

    def _full_error(self) -> errors.DiskFull:
        self.disk_refusals += 1
        return errors.DiskFull(
            f"{self.path}: the disk is full (simulated: MemoryStore.full); nothing was "
            "written, what was stored is intact and reads go on; clear the switch and "
            "writes go on", path=self.path, full="disk")

    def sync(self):
        self._alive()
        self._durable = self._tables

    def on_remap(self, release):
        """Nothing here is ever remapped (``LMDBStore.on_remap``)."""
        return lambda: None

    def free_bytes(self) -> int:
        """A simulated disk: none left while ``full``, plenty otherwise."""
        return 0 if self.full else 1 << 40

    def crash(self):
        """Simulate a machine crash: everything not synced is gone."""
        self._tables = self._durable
        self._version += 1

    def close(self):
        self._closed = True

    def _alive(self):
        if self._closed:
            raise RuntimeError(f"store {self.path} is closed")
