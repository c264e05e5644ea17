"""The LMDB store (with ``lmdb_env``, its environment and map, the only
lmdb imports).

Opened with ``sync=False`` (MDB_NOSYNC) under a write-ahead log
(``raymx.storage.wal``): a commit appends one record of its changes to the
log and commits to LMDB without a sync; ``sync()`` is one fdatasync of the
log, which is when group commit acknowledges ``j=True`` writers.
Checkpoints sync the data file and pin its state; the first process to open
a folder recovers it from the checkpoint and the log. A machine crash loses
at most the commits since the last sync, never the file's integrity
(``bench/faults/torn.py``, ARCHITECTURE.md "The write-ahead log"); a
process crash loses nothing committed (the pages are in the OS's cache).

No room (``errors.DiskFull``): every write-side call (put, put_many,
put_sorted, put_new, delete, nested, commit and the callables ``putter``
returns) turns LMDB's "map full" (``lmdb.MapFullError``) and "disk full"
(``lmdb.DiskError``, ENOSPC; or EIO from a short write while the file system
is nearly full: LMDB reports a short write as EIO) into ``DiskFull``, and a
transaction with too many dirty pages (``lmdb.TxnFullError``) into
``TransactionTooLarge``. LMDB then allows only an abort of that transaction;
nothing of it reaches the file's committed state (a commit writes the new
pages first and the meta page last, over pages no snapshot uses), so what was
stored is intact and the store stays usable. The map grows where that is safe:
see ``LMDBStore``.
"""
from __future__ import annotations

import errno
import logging
import os
from typing import Callable

import lmdb

from raymx.storage import errors, wal as wal_mod
from raymx.storage.lmdb_env import _ENVS, _ENVS_LOCK, MiB, _open_env
from raymx.storage.store import DBS, _TxnBase

log = logging.getLogger("raymx.storage")
_DB_INDEX = {name: i for i, name in enumerate(DBS)}

# An EIO from a commit while the file system has less than this free is a
# short write of a full disk (LMDB reports those as EIO), so DiskFull.
SHORT_WRITE_FREE_BYTES = 64 * MiB


def _free_bytes(path: str) -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _refusal(store: "LMDBStore", e: Exception, where: str) -> Exception:
    """The raymx error for an LMDB write error, or ``e`` itself."""
    if isinstance(e, lmdb.MapFullError):
        ent = store._ent
        ent.wal.checkpoint_first = True  # pages the checkpoint's pin holds come free
        ent.grow_wanted = ent.map_bytes() < ent.map_bytes_max
        m = ent.map_bytes()
        grow = ("the map grows at this process's next transaction once none of its "
                "transactions is open (else a restart of the member with a larger "
                "Limits.map_bytes makes room)" if ent.grow_wanted else
                f"the map is at its ceiling (map_bytes_max {ent.map_bytes_max} bytes): "
                "restart the member with a larger Limits.map_bytes, or drop data (in a map "
                "full to its last page a delete may be refused too)")
        return errors.DiskFull(
            f"{store.path}: the LMDB map is full ({m} bytes) at {where}; nothing was "
            f"written, what was stored is intact and reads go on; {grow}",
            path=store.path, full="map", map_bytes=m)
    if isinstance(e, lmdb.TxnFullError):
        return errors.TransactionTooLarge(
            f"{store.path}: the transaction dirtied more pages than LMDB can hold in one "
            f"transaction ({where}: {e}); nothing was written: split it into smaller ones")
    free = None
    if isinstance(e, lmdb.DiskError) or (
            type(e) is lmdb.Error and os.strerror(errno.EIO) in str(e)
            and (free := _free_bytes(store.path)) is not None
            and free < SHORT_WRITE_FREE_BYTES):
        if free is None:
            free = _free_bytes(store.path)
        store._ent.disk_refusals += 1
        return errors.DiskFull(
            f"{store.path}: the disk is full ({where}: {e}; {free} bytes free); nothing "
            "was written, what was stored is intact and reads go on; free space on its "
            "file system (drop or trim data, remove other files, grow the file system) "
            "and writes go on", path=store.path, full="disk", free_bytes=free)
    return e


def make_private_dir(path: str) -> str:
    path = os.path.abspath(path)
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    return path


class _Txn(_TxnBase):
    """A transaction. A top-level one is counted in its environment's ``live``
    until it commits, aborts or is dropped.

    A write transaction records its changes for the log (``wal``): ``_log``
    is a flat list ``[db index, key, value or None (a delete), ...]``; past
    ``wal.UNLOGGED_OPS`` changes it stops recording (``_log`` None) and its
    commit is made durable by a checkpoint instead. A top-level write
    transaction holds the log's lock from its begin to its end."""

    def __init__(self, store: "LMDBStore", txn, write: bool, parent=None):
        self._s = store
        self._t = txn
        self._write = write
        self._parent = parent
        self._log: list | None = [] if write else None
        self._unlogged = False
        self._end = store._ent.ended if parent is None else None

    def _ended(self):
        end = self._end
        if end is not None:
            self._end = None
            end()
            if self._write:
                self._s._ent.wal.unlock()

    def __del__(self):  # dropped unfinished: py-lmdb aborts it; stop counting it
        self._ended()

    def _too_many(self):
        self._log, self._unlogged = None, True

    def snapshot_id(self):
        """LMDB's id of the last commit this transaction sees (a write
        transaction's own id is the next)."""
        i = self._t.id()
        return i - 1 if self._write else i

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

    # Write side: LMDB's "no room" errors become DiskFull (see _refusal); each
    # change is recorded for the log once LMDB made it
    def put(self, db, key, value, overwrite=True):
        try:
            done = self._t.put(key, value, db=self._s._dbs[db], overwrite=overwrite)
        except lmdb.Error as e:
            raise _refusal(self._s, e, "put") from e
        if done:
            self._note(_DB_INDEX[db], key, value)
        return done

    def _note(self, i: int, key, value) -> None:
        """Record one change for the log (``value`` None: a delete)."""
        log = self._log
        if log is not None:
            log += (i, key, value)
            if len(log) > _LOG_MAX:
                self._too_many()

    def written(self, db):
        log = self._log
        if log is None:
            return None if self._unlogged else []
        i = _DB_INDEX[db]
        return [bytes(log[j + 1]) for j in range(0, len(log), 3) if log[j] == i]

    def putter(self, db, overwrite=True):
        put, dbh = self._t.put, self._s._dbs[db]  # (no partial: it copies its keywords a call)
        store, i, note = self._s, _DB_INDEX[db], self._note

        def put_row(key, value):
            try:
                done = put(key, value, db=dbh, overwrite=overwrite)
            except lmdb.Error as e:
                raise _refusal(store, e, "put") from e
            if done:
                note(i, key, value)
            return done
        return put_row

    def _note_rows(self, db, rows):
        log = self._log
        if log is not None:
            if len(log) + 3 * len(rows) > _LOG_MAX:
                self._too_many()
                return
            i = _DB_INDEX[db]
            for k, v in rows:
                log += (i, k, v)

    def put_many(self, db, rows):
        if rows:
            try:
                with self._t.cursor(db=self._s._dbs[db]) as c:
                    c.putmulti(rows)
            except lmdb.Error as e:
                raise _refusal(self._s, e, "put_many") from e
            self._note_rows(db, rows)

    def put_sorted(self, db, rows):
        try:
            added = self._put_sorted(db, rows)
        except lmdb.Error as e:
            raise _refusal(self._s, e, "put_sorted") from e
        if added:
            self._note_rows(db, rows)
        return added

    def _put_sorted(self, db, rows):
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
        try:
            done = self._put_new(db, rows)
        except lmdb.Error as e:
            raise _refusal(self._s, e, "put_new") from e
        if done and rows:
            self._note_rows(db, rows)
        return done

    def _put_new(self, db, rows):
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
        try:
            done = self._t.delete(key, db=self._s._dbs[db])
        except lmdb.Error as e:
            raise _refusal(self._s, e, "delete") from e
        if done:
            self._note(_DB_INDEX[db], key, None)
        return done

    def nested(self):
        try:
            return _Txn(self._s, self._s._env.begin(write=True, parent=self._t), True, self)
        except lmdb.Error as e:
            raise _refusal(self._s, e, "nested") from e

    def commit(self):
        """Commit; on an error LMDB has aborted the transaction (nothing of it is
        stored), and ``abort`` after it is harmless.

        A top-level write appends its record to the log before LMDB commits it
        (both under the log's lock); a failed commit voids the record.
        Durable at the next ``LMDBStore.sync()``."""
        parent = self._parent
        if parent is not None:  # a child: its changes join the parent's
            try:
                self._t.commit()
            except lmdb.Error as e:
                self._t.abort()
                raise _refusal(self._s, e, "commit") from e
            if self._unlogged:
                parent._too_many()
            elif parent._log is not None and self._log:
                parent._log += self._log
                if len(parent._log) > _LOG_MAX:
                    parent._too_many()
            return
        if not self._write:
            try:
                self._t.commit()
            finally:
                self._ended()
            return
        store, wal = self._s, self._s._ent.wal
        try:
            if store.failed is not None:
                self._t.abort()
                raise errors.DiskFailed(f"{store.path}: an earlier write or sync failed "
                                        f"({store.failed}); this store writes no more")
            log, nbytes = self._log, 0
            if log:
                try:
                    nbytes = wal.append(self._t.id(), log)
                except OSError as e:
                    self._t.abort()
                    raise store._log_error(e, "a commit's log append") from e
            try:
                self._t.commit()
            except lmdb.Error as e:
                self._t.abort()
                if nbytes:
                    try:
                        wal.unappend(nbytes)
                    except OSError as e2:
                        raise store._log_error(e2, "taking back a failed commit's "
                                               "log record") from e
                err = _refusal(store, e, "commit")
                if err is e:
                    # not a lack of room: a write failed. As for a failed
                    # sync(): the kernel may have dropped pages, so this store
                    # writes no more (the member stops)
                    store.failed = store.failed or f"commit: {type(e).__name__}: {e}"
                    raise errors.DiskFailed(f"{store.path}: a commit's write failed "
                                            f"({type(e).__name__}: {e}); this store "
                                            "writes no more") from e
                raise err from e
            try:
                if self._unlogged:  # too large to log: durable by a checkpoint now
                    wal.checkpoint_locked()
                else:
                    wal.after_commit()
            except Exception as e:
                raise store._log_error(e, "a checkpoint after a commit", final=True) from e
        finally:
            self._ended()

    def abort(self):
        self._t.abort()
        self._ended()


_LOG_MAX = 3 * wal_mod.UNLOGGED_OPS


class LMDBStore:
    """A member's LMDB environment.

    The map (``map_bytes``: address space the data file may grow into, not
    disk) grows by itself in three cases, always where LMDB allows a resize
    (no transaction of this process open on the environment):

    - at open, by the first store object of the path in this process: if the
      data file already uses more than ``GROW_AT_FRACTION`` (3/4) of
      ``map_bytes``, the map is twice the file's used size;
    - ahead of its end: once a commit leaves the file past that fraction of
      the map, as after a refusal (below);
    - after a map-full refusal (``errors.DiskFull``, ``full="map"``): the next
      transaction (read or write) this process begins first doubles the map
      (at least twice the used size), once no other transaction of this
      process is open: new begins wait, open ones get ``RESIZE_WAIT_S``
      (0.1 s) to end, then the release hooks (``on_remap``: the shard closes
      its idle cursors) and 0.1 s more; if one is still open nothing grows,
      and a begin at least ``GROW_RETRY_S`` (1 s) later tries again (so new
      transactions wait at most 0.2 s in every second meanwhile).

    None grows past ``map_bytes_max`` (default: the larger of
    ``map_bytes`` and 4 TiB); ``map_bytes_max=map_bytes`` turns growth off.
    Another process of the member that has the same environment open adopts a
    grown map past its own when it next begins a transaction (LMDB's
    MDB_MAP_RESIZED), under the same rule, the log's pin of a checkpoint
    included; if one of its transactions stays open, that begin is refused
    (``DiskFull``, nothing done) and one ``GROW_RETRY_S`` later tries again.
    A grow lasts while the environment is open; a reopen with a smaller
    ``map_bytes`` starts from that (and from the rule at open).
    """

    def __init__(self, path: str, map_bytes: int = 64 << 30, map_bytes_max: int | None = None):
        self.path = make_private_dir(path)
        with _ENVS_LOCK:
            ent = _ENVS.get(self.path)
            if ent is None:
                ent = _open_env(self.path, map_bytes, map_bytes_max)
                _ENVS[self.path] = ent
            ent.refs += 1
        self._ent = ent
        self._env, self._dbs = ent.env, ent.dbs
        self._closed = False
        self.failed: str | None = None  # a sync failed: see sync()

    @property
    def disk_refusals(self) -> int:
        """Writes this process refused in this folder for a full disk."""
        return self._ent.disk_refusals

    def free_bytes(self) -> int | None:
        """Room left on the folder's file system (``statvfs``), or None."""
        return _free_bytes(self.path)

    # A transaction is counted (``_Env``) from before its begin to its end
    # (``_Txn._end``); the common case is inline: no resize, no MAP_RESIZED.
    def read(self):
        ent = self._ent
        if ent.wal.pin is not None:  # a reader that took a checkpoint long ago
            ent.wal.drop_stale_pin()
        ent.begun()
        if not (ent.resizing or ent.grow_wanted):
            try:
                return _Txn(self, self._env.begin(write=False, buffers=False), False)
            except lmdb.MapResizedError:
                pass
            except BaseException:
                ent.ended()
                raise
        return _Txn(self, ent.begin_slow(write=False, buffers=False), False)

    def write(self):
        """A write transaction: takes the log's lock (writers of every process
        of the folder take turns in it), then LMDB's."""
        ent = self._ent
        wal = ent.wal
        wal.lock()
        try:
            wal.before_write()
        except BaseException as e:
            wal.unlock()
            if isinstance(e, Exception):  # no room for it: refused (DiskFull), else final
                raise self._log_error(e, "the checkpoint before a write",
                                      final=not wal_mod.no_room(e)) from e
            raise
        ent.begun()
        try:
            if not (ent.resizing or ent.grow_wanted):
                try:
                    return _Txn(self, self._env.begin(write=True), True)
                except lmdb.MapResizedError:
                    pass
            return _Txn(self, ent.begin_slow(write=True), True)
        except BaseException:
            ent.ended()
            wal.unlock()
            raise

    def on_remap(self, release: Callable[[], None]) -> Callable[[], None]:
        """Register ``release``: called (from the resizing thread, with new
        transactions of this process held back) when a remap of the map (a
        grow, or adopting one another process grew) still finds transactions
        of this process open after ``RESIZE_WAIT_S``. It ends the long-lived
        ones its owner holds idle (the shard's idle cursors) and must not
        begin one. Returns the call that unregisters it."""
        hooks = self._ent.release_hooks
        hooks.append(release)
        return lambda: release in hooks and hooks.remove(release)

    def sync(self):
        """Make every commit so far durable, by any process of the folder: one
        fdatasync of the log (``wal``). A failure is final for this store:
        every later sync raises too (never a retry that may succeed over pages
        the kernel dropped), and the caller must stop (``errors.DiskFailed``)."""
        if self.failed is not None:
            raise errors.DiskFailed(f"{self.path}: an earlier sync failed "
                                    f"({self.failed}); this store syncs no more")
        try:
            self._ent.wal.sync()
        except Exception as e:
            self.failed = f"{type(e).__name__}: {e}"
            raise errors.DiskFailed(f"{self.path}: sync failed ({self.failed}); what it "
                                    "covered may not be on disk") from e

    def _log_error(self, e: Exception, where: str, final: bool = False) -> Exception:
        """The raymx error for a failed write to the log: no room is DiskFull
        (nothing was written; the store goes on), anything else is final
        (``DiskFailed``: the store writes no more)."""
        if isinstance(e, errors.RaymxError):
            return e
        if not final and wal_mod.no_room(e):
            free = _free_bytes(self.path)
            self._ent.disk_refusals += 1
            return errors.DiskFull(
                f"{self.path}: the disk is full ({where}: {e}; {free} bytes free); nothing "
                "was written, what was stored is intact and reads go on; free space on its "
                "file system and writes go on", path=self.path, full="disk", free_bytes=free)
        self.failed = self.failed or f"{where}: {type(e).__name__}: {e}"
        return errors.DiskFailed(f"{self.path}: {where} failed ({type(e).__name__}: {e}); "
                                 "this store writes no more")

    def copy_to(self, dest: str) -> None:
        """A consistent hot copy of the environment into the folder ``dest``
        (LMDB's copy runs in one read transaction; writers go on). A counted
        read transaction is held meanwhile: no resize remaps the map under it."""
        t = self.read()
        try:
            self._env.copy(make_private_dir(dest), compact=True)
        finally:
            t.abort()

    def stat(self) -> dict:
        with self.read():  # LMDB reads these from the map: no resize meanwhile
            info, psize = self._env.info(), self._env.stat()["psize"]
        return {"map_bytes": info["map_size"], "map_bytes_max": self._ent.map_bytes_max,
                "last_page": info["last_pgno"], "page_bytes": psize,
                "free_bytes": _free_bytes(self.path)}

    def close(self):
        if self._closed:
            return
        self._closed = True
        with _ENVS_LOCK:
            ent = _ENVS.get(self.path)
            if ent is not None:
                ent.refs -= 1
                if ent.refs == 0:
                    try:
                        ent.wal.close()
                    finally:
                        ent.env.close()
                        del _ENVS[self.path]
