"""An interactive transaction's writes, kept in memory over a read snapshot
of the store until its commit (optimistic concurrency, snapshot isolation).

``Overlay`` is a ``WriteTxn`` (raymx/storage/store.py) whose reads come
from one read transaction of the store, the transaction's snapshot, with its
own writes laid over them; nothing is written to the store and the store's
writer is not held, so other writes and other transactions go on meanwhile.
At commit (``Transaction.take_writer``) the writer is taken, ``conflict``
checks that nothing this transaction wrote, no collection it used and no
unique key it added changed since the snapshot (first committer wins, as
MongoDB's snapshot isolation decides), and ``replay`` writes its changes
into the write transaction that then commits with its oplog entry.

Pure: no threads, any store (LMDB, or the simulation's in-memory one).
"""
from __future__ import annotations

import bisect

from raymx.storage.keys import prefix_end
from raymx.storage.store import _WritesOver


class Overlay(_WritesOver):
    """Writes over a snapshot ``snap`` (a read transaction, the root's) or over
    a parent overlay (``nested``: a statement's savepoint)."""

    _write = True

    def __init__(self, snap, parent: "Overlay | None" = None):
        self._snap = snap
        self._parent = parent
        self._root = self if parent is None else parent._root
        self._over: dict[str, dict[bytes, bytes | None]] = {}
        self._keys: dict[str, SortedKeys] = {}  # each db's keys of _over, in order
        self._open = True
        self._child: Overlay | None = None
        if parent is None:
            self.catalog_read: set[bytes] = set()  # collections used: unchanged at commit
            self.unique: list[bytes] = []  # unique index prefixes it added a key under
            self.fresh: list[bytes] = []  # documents' keys first written since taken

    # --- reads: own writes (innermost first), then the snapshot ----------
    def _lookup(self, db, key):
        t = self
        while t is not None:
            o = t._over.get(db)
            if o is not None and key in o:
                return o[key]
            t = t._parent
        if db == "catalog":
            self._root.catalog_read.add(key)
        return self._snap.get(db, key)

    def _written(self, db, start, stop, reverse) -> list[tuple[bytes, bytes | None]]:
        """This overlay's writes (and its parents') in [start, stop), sorted."""
        chain = []
        t = self
        while t is not None:
            chain.append(t)
            t = t._parent
        merged: dict[bytes, bytes | None] = {}
        for t in reversed(chain):  # the innermost last: its writes win
            keys = t._keys.get(db)
            if keys is not None:
                o = t._over[db]
                for k in keys.range(start, stop):
                    merged[k] = o[k]
        if len(chain) > 1:
            return sorted(merged.items(), reverse=reverse)
        items = list(merged.items())  # one level: already in order
        return items[::-1] if reverse else items

    def get(self, db, key):
        self._check(db)
        return self._lookup(db, bytes(key))

    def scan(self, db, start=None, stop=None, reverse=False):
        """The snapshot's rows merged with this transaction's writes, in order."""
        self._check(db)
        mine = self._written(db, start, stop, reverse)
        if not mine:
            yield from self._snap.scan(db, start, stop, reverse)
            return
        before = (lambda a, b: a > b) if reverse else (lambda a, b: a < b)
        i = 0
        for k, v in self._snap.scan(db, start, stop, reverse):
            while i < len(mine) and before(mine[i][0], k):
                if mine[i][1] is not None:
                    yield mine[i]
                i += 1
            if i < len(mine) and mine[i][0] == k:
                if mine[i][1] is not None:
                    yield mine[i]
                i += 1
                continue
            yield k, v
        for k, v in mine[i:]:
            if v is not None:
                yield k, v

    # --- writes: kept here ------------------------------------------------
    def _set(self, db, key: bytes, value: bytes | None) -> None:
        o = self._over.get(db)
        if o is None:
            o = self._over[db] = {}
            self._keys[db] = SortedKeys()
        if key not in o:
            self._keys[db].add(key)
            if self._parent is None and db == "docs":
                self.fresh.append(key)
        o[key] = value

    def nested(self):
        self._check("meta")
        self._child = Overlay(self._snap, self)
        return self._child

    def note_unique(self, prefix: bytes) -> None:
        """A key was added under unique index prefix ``prefix``: at commit no
        other document may hold it (another transaction may have added one)."""
        self._root.unique.append(prefix)

    def db_stat(self, db):
        return self._snap.db_stat(db)  # the snapshot's: LMDB counts pages, not rows

    # --- the end ----------------------------------------------------------
    @property
    def writes(self) -> int:
        return sum(map(len, self._over.values()))

    def commit(self):
        """A statement's savepoint: its writes join the parent's. The root
        commits nothing itself: a transaction that wrote takes the writer
        first (``Transaction.take_writer``); one that only read ends here."""
        if not self._open:
            raise RuntimeError("transaction is finished")
        p = self._parent
        if p is None:
            if self.writes:
                raise RuntimeError("an overlay's writes commit through take_writer")
            return self.abort()
        self._open = False
        p._child = None
        for db, o in self._over.items():
            if db not in p._over:  # the parent's first writes there: these, as they are
                p._over[db], p._keys[db] = o, self._keys[db]
                if p._parent is None and db == "docs":
                    p.fresh += o
                continue
            for k, v in o.items():
                p._set(db, k, v)

    def abort(self):
        if not self._open:
            return
        self._open = False
        if self._parent is not None:
            self._parent._child = None
        else:
            self._snap.abort()

    def conflict(self, w) -> str | None:
        """What changed since the snapshot, as write transaction ``w`` sees it
        (the store's writer held): a key this transaction wrote, a collection
        it used; None if nothing did."""
        if self.unchanged_since(w):
            return None
        snap = self._snap
        for db, o in self._over.items():
            for k in o:
                if w.get(db, k) != snap.get(db, k):
                    return f"a {'document' if db == 'docs' else db + ' entry'} it wrote"
        for k in self.catalog_read:
            if w.get("catalog", k) != snap.get("catalog", k):
                return f"collection {k.decode(errors='replace')}"
        return None

    def unchanged_since(self, w) -> bool:
        """Nothing committed between the snapshot and write transaction ``w``."""
        return w.snapshot_id() == self._snap.snapshot_id()

    def replay(self, w) -> None:
        """Write this transaction's changes into ``w``."""
        for db, o in self._over.items():
            for k, v in o.items():
                if v is None:
                    w.delete(db, k)
                else:
                    w.put(db, k, v)

    def move_into(self, w) -> str | None:
        """The commit's check and writes: what changed since the snapshot
        (``conflict``, or a unique key this transaction added that another
        document holds once its changes are in ``w``), else None with them
        written into ``w``."""
        what = self.conflict(w)
        if what is not None:
            return what
        self.replay(w)
        if not self.unchanged_since(w):
            for pre in self.unique:
                if len({pk for _, pk in w.scan("index", pre, prefix_end(pre))}) > 1:
                    return "a unique key it added"
        return None


class SortedKeys:
    """A growing set of keys kept in order, for range lookups: sorted lists of
    at most ``2 * load`` keys each, so adding one moves at most that many
    (one sorted list grows quadratically when keys come out of order, as a
    large transaction's index keys do)."""

    __slots__ = ("_lists", "_maxes", "_load")

    def __init__(self, load: int = 512):
        self._lists: list[list[bytes]] = []
        self._maxes: list[bytes] = []  # the last key of each list
        self._load = load

    def add(self, key: bytes) -> None:
        """Add ``key`` (not in the set yet)."""
        maxes, lists = self._maxes, self._lists
        if not maxes:
            lists.append([key])
            maxes.append(key)
            return
        i = bisect.bisect_left(maxes, key)
        if i == len(maxes):  # past every key: at the end of the last list
            i -= 1
            lists[i].append(key)
            maxes[i] = key
        else:
            bisect.insort(lists[i], key)
        lst = lists[i]
        if len(lst) > 2 * self._load:  # split in two
            lists.insert(i + 1, lst[self._load:])
            del lst[self._load:]
            maxes.insert(i, lst[-1])

    def range(self, start: bytes | None, stop: bytes | None) -> list[bytes]:
        """The keys in [start, stop), in order."""
        maxes, lists = self._maxes, self._lists
        out: list[bytes] = []
        j = 0 if start is None else bisect.bisect_left(maxes, start)
        first = True
        while j < len(lists):
            lst = lists[j]
            lo = bisect.bisect_left(lst, start) if first and start is not None else 0
            hi = len(lst) if stop is None else bisect.bisect_left(lst, stop)
            out += lst[lo:hi]
            if hi < len(lst):
                break
            first = False
            j += 1
        return out
