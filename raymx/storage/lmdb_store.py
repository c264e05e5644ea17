"""The LMDB store (the only lmdb import).

Opened with ``sync=False``: a commit is atomic and visible at once but reaches
the disk only at ``sync()`` (one fdatasync of the data file: no write map),
which is how group commit shares one flush among many transactions. A process
crash loses nothing committed (the pages are in the OS's cache). A machine
crash loses the unsynced tail, and LMDB documents that without the sync it
keeps its integrity only on file systems that write pages in the order they
were written (MDB_NOSYNC; ARCHITECTURE.md, "Known limits").
"""
from __future__ import annotations

import functools
import os
import threading

import lmdb

from raymx.storage import errors
from raymx.storage.store import DBS, _TxnBase

# LMDB refuses to open one path twice in a process, so environments are shared
# per path (with a reference count) by every store object in the process.
_ENVS: dict[str, list] = {}
_ENVS_LOCK = threading.Lock()


def make_private_dir(path: str) -> str:
    path = os.path.abspath(path)
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    return path


class _Txn(_TxnBase):
    def __init__(self, store: "LMDBStore", txn, write: bool, parent=None):
        self._s = store
        self._t = txn
        self._write = write
        self._parent = parent

    def get(self, db, key):
        return self._t.get(bytes(key), db=self._s._dbs[db])

    def first(self, db):
        with self._t.cursor(db=self._s._dbs[db]) as c:
            return (c.key(), c.value()) if c.first() else None

    def last(self, db):  # the oplog's tail on every commit: no generator
        with self._t.cursor(db=self._s._dbs[db]) as c:
            return (c.key(), c.value()) if c.last() else None

    def scan(self, db, start=None, stop=None, reverse=False):
        with self._t.cursor(db=self._s._dbs[db]) as c:
            if not reverse:
                ok = c.set_range(start) if start is not None else c.first()
                while ok:
                    k = c.key()
                    if stop is not None and k >= stop:
                        return
                    yield k, c.value()
                    ok = c.next()
            else:
                if stop is not None:
                    ok = c.set_range(stop)
                    ok = c.prev() if ok else c.last()
                else:
                    ok = c.last()
                while ok:
                    k = c.key()
                    if start is not None and k < start:
                        return
                    yield k, c.value()
                    ok = c.prev()

    def db_stat(self, db) -> tuple[int, int]:
        """(entries, bytes in pages) of one sub-database: O(1), from LMDB's own counts."""
        st = self._t.stat(self._s._dbs[db])
        pages = st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]
        return st["entries"], pages * st["psize"]

    def scan_keys(self, db, start=None, stop=None):
        with self._t.cursor(db=self._s._dbs[db]) as c:
            if not (c.set_range(start) if start is not None else c.first()):
                return
            for k in c.iternext(keys=True, values=False):
                if stop is not None and k >= stop:
                    return
                yield k

    def put(self, db, key, value, overwrite=True):
        return self._t.put(key, value, db=self._s._dbs[db], overwrite=overwrite)

    def putter(self, db, overwrite=True):
        return functools.partial(self._t.put, db=self._s._dbs[db], overwrite=overwrite)

    def put_many(self, db, rows):
        if rows:
            with self._t.cursor(db=self._s._dbs[db]) as c:
                c.putmulti(rows)

    def put_sorted(self, db, rows):
        if not rows:
            return 0
        d = self._s._dbs[db]
        with self._t.cursor(db=d) as c:
            append = not c.last() or c.key() < rows[0][0]
            if not append and any(rows[i][0] >= rows[i + 1][0] for i in range(len(rows) - 1)):
                raise ValueError(f"put_sorted: rows for {db} are not in increasing key order")
            consumed, added = c.putmulti(rows, append=append)
        if added != len(rows):
            # append mode skips a key that does not sort after the previous one
            raise ValueError(f"put_sorted: {len(rows) - added} of {len(rows)} rows for {db} "
                             "were not in strictly increasing key order")
        return added

    def put_new(self, db, rows):
        if not rows:
            return True
        d, env = self._s._dbs[db], self._s._env
        if len(rows) == 1:
            return self._t.put(rows[0][0], rows[0][1], db=d, overwrite=False)
        # Ascending keys past the end (generated _ids) take LMDB's append path.
        # A skipped row is a key that exists, repeats, or (appending) breaks
        # the order: the child transaction is dropped and, after a disorder, the
        # rows are tried once more in place.
        for append in (True, False):
            child = env.begin(write=True, parent=self._t)
            try:
                with child.cursor(db=d) as c:
                    added = -1 if append and c.last() and c.key() >= rows[0][0] else \
                        c.putmulti(rows, overwrite=False, append=append)[1]
            except BaseException:
                child.abort()
                raise
            if added == len(rows):
                child.commit()
                return True
            child.abort()
        return False

    def delete(self, db, key):
        return self._t.delete(key, db=self._s._dbs[db])

    def nested(self):
        return _Txn(self._s, self._s._env.begin(write=True, parent=self._t), True, self)

    def commit(self):
        self._t.commit()

    def abort(self):
        self._t.abort()


class LMDBStore:
    def __init__(self, path: str, map_bytes: int = 64 << 30):
        self.path = make_private_dir(path)
        with _ENVS_LOCK:
            ent = _ENVS.get(self.path)
            if ent is None:
                env = lmdb.open(self.path, map_size=map_bytes, max_dbs=len(DBS) + 2,
                                subdir=True, sync=False, metasync=False, mode=0o600,
                                max_readers=1024, readahead=False)
                dbs = {name: env.open_db(name.encode()) for name in DBS}
                ent = _ENVS[self.path] = [env, dbs, 0]
            ent[2] += 1
        self._env, self._dbs = ent[0], ent[1]
        self._closed = False
        self.failed: str | None = None  # a sync failed: see sync()

    def read(self):
        return _Txn(self, self._env.begin(write=False, buffers=False), False)

    def write(self):
        return _Txn(self, self._env.begin(write=True), True)

    def sync(self):
        """fdatasync the data file. A failure is final for this store: every later
        sync raises too (never a retry that may succeed over pages the kernel
        dropped), and the caller must stop (``errors.DiskFailed``)."""
        if self.failed is not None:
            raise errors.DiskFailed(f"{self.path}: an earlier sync failed "
                                    f"({self.failed}); this store syncs no more")
        try:
            self._env.sync(True)
        except Exception as e:
            self.failed = f"{type(e).__name__}: {e}"
            raise errors.DiskFailed(f"{self.path}: sync failed ({self.failed}); what it "
                                    "covered may not be on disk") from e

    def copy_to(self, dest: str) -> None:
        """A consistent hot copy of the environment into the folder ``dest``
        (LMDB's copy runs in one read transaction; writers go on)."""
        self._env.copy(make_private_dir(dest), compact=True)

    def stat(self) -> dict:
        info = self._env.info()
        return {"map_bytes": info["map_size"], "last_page": info["last_pgno"],
                "page_bytes": self._env.stat()["psize"]}

    def close(self):
        if self._closed:
            return
        self._closed = True
        with _ENVS_LOCK:
            ent = _ENVS.get(self.path)
            if ent is not None:
                ent[2] -= 1
                if ent[2] == 0:
                    ent[0].close()
                    del _ENVS[self.path]
