"""The LMDB store (the only lmdb import).

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
import functools
import itertools
import logging
import os
import threading
import time
from typing import Callable

import lmdb

from raymx.storage import errors, wal as wal_mod
from raymx.storage.store import DBS, _TxnBase

log = logging.getLogger("raymx.storage")
_DB_INDEX = {name: i for i, name in enumerate(DBS)}

# LMDB refuses to open one path twice in a process, so environments are shared
# per path (with a reference count) by every store object in the process.
_ENVS: dict[str, "_Env"] = {}
_ENVS_LOCK = threading.Lock()

MiB = 1 << 20
# The map opens at twice the data file's size when the file already uses more
# than this fraction of the requested map, and a running process grows it once
# a commit leaves the file past it (before a write meets the map's end).
GROW_AT_FRACTION = 0.75
# An EIO from a commit while the file system has less than this free is a
# short write of a full disk (LMDB reports those as EIO), so DiskFull.
SHORT_WRITE_FREE_BYTES = 64 * MiB
MAP_BYTES_MAX = 4 << 40  # 4 TiB of address space: the default ceiling of growth
# A resize holds new transactions of this process back for at most this long
# while it waits for the open ones to end; a grow that could not wait them out
# is tried again at a begin this much later (or later).
RESIZE_WAIT_S = 0.1
GROW_RETRY_S = 1.0


class _Env:
    """One LMDB environment in this process, shared by its store objects.

    LMDB may resize the map only while this process has no transaction open
    on it, so transactions are counted: ``begun`` and ``ended`` are C-level
    counters (no lock on the hot path). A resize takes ``lock``, sets
    ``resizing``, then reads the counts; a begin counts itself first and then
    looks at ``resizing`` (waiting for the lock if set), so no transaction
    begins unseen while the map is remapped."""

    __slots__ = ("env", "dbs", "refs", "lock", "_begun", "_ended", "begun", "ended",
                 "resizing", "grow_wanted", "grow_retry_at", "adopt_retry_at",
                 "map_bytes_max", "wal", "release_hooks", "disk_refusals")

    def __init__(self, env, dbs, map_bytes_max):
        self.env, self.dbs, self.refs = env, dbs, 0
        self.lock = threading.Lock()
        self._begun, self._ended = itertools.count(), itertools.count()
        self.begun, self.ended = self._begun.__next__, self._ended.__next__
        self.resizing = False
        self.grow_wanted = False  # a map-full refusal happened: grow when idle
        self.disk_refusals = 0  # writes refused for a full disk (``Store.disk_refusals``)
        self.grow_retry_at = 0.0  # after a try that found a transaction open
        self.adopt_retry_at = 0.0  # the same for adopting another process's grow
        self.map_bytes_max = map_bytes_max
        self.wal: wal_mod.Wal | None = None
        # called when a resize found transactions of this process still open
        # after RESIZE_WAIT_S: they end the long-lived ones they own (idle cursors)
        self.release_hooks: list = []

    def live(self) -> int:
        """Transactions of this process open now (exact under the resize protocol)."""
        return _count_of(self._begun) - _count_of(self._ended)

    def map_bytes(self) -> int:
        return self.env.info()["map_size"]

    def used_bytes(self) -> int:
        return (self.env.info()["last_pgno"] + 1) * self.env.stat()["psize"]

    def begin_slow(self, **kw):
        """``begin`` after ``begun()`` when a resize is running or wanted, or
        LMDB said MDB_MAP_RESIZED: grows the map after a map-full, and adopts
        a map another process grew past ours, each once this process has no
        other transaction open (see ``_resize``); if that does not come, the
        grow is tried again at a begin ``GROW_RETRY_S`` later, and the begin
        that met MDB_MAP_RESIZED is refused (``remap_refused``, as are the
        ones after it, at once, until ``GROW_RETRY_S`` has passed)."""
        try:
            while True:
                if self.grow_wanted and time.monotonic() >= self.grow_retry_at \
                        and self.lock.acquire(blocking=False):
                    try:
                        if self.grow_wanted and not self._resize(self._grow):
                            self.grow_retry_at = time.monotonic() + GROW_RETRY_S
                    finally:
                        self.lock.release()
                if not self.resizing:
                    break
                self.ended()  # another thread resizes: wait for it uncounted
                with self.lock:
                    pass
                self.begun()
            try:
                return self.env.begin(**kw)
            except lmdb.MapResizedError:
                if time.monotonic() < self.adopt_retry_at:
                    raise self.remap_refused() from None  # a try found one open just now
                self.ended()  # uncounted while waiting for another resize
                with self.lock:
                    self.begun()
                    if not self._resize(self._adopt):
                        self.adopt_retry_at = time.monotonic() + GROW_RETRY_S
                        raise self.remap_refused() from None
                return self.env.begin(**kw)
        except BaseException:
            self.ended()
            raise

    def begin_pin(self):
        """The log's begin of a checkpoint's pin (uncounted: the log ends it;
        called with the log's lock held and none of this thread's transactions
        counted). A map another process grew past ours (MDB_MAP_RESIZED) is
        adopted first; refused (``DiskFull``) if a transaction of this
        process stays open. The pin taken right after replaces the one the
        remap ended."""
        try:
            return self.env.begin(write=False, buffers=False)
        except lmdb.MapResizedError:
            if not self.lock.acquire(timeout=RESIZE_WAIT_S):  # (never waits on itself)
                raise self.remap_refused() from None
            try:
                if not self._resize(self._adopt, mine=0, renew_pin=False):
                    raise self.remap_refused() from None
            finally:
                self.lock.release()
            return self.env.begin(write=False, buffers=False)

    def grow_ahead(self, used: int, mapped: int) -> None:
        """The log's look at LMDB's info after a commit: a data file past
        ``GROW_AT_FRACTION`` of the map has it grown at this process's next
        begin (as at open), before a write meets the map's end."""
        if used > GROW_AT_FRACTION * mapped and not self.grow_wanted \
                and mapped < self.map_bytes_max:
            self.grow_wanted = True

    def remap_refused(self) -> errors.DiskFull:
        path = self.wal.folder
        return errors.DiskFull(
            f"{path}: another process of this member grew the LMDB map, and this process "
            f"cannot take the new size while one of its transactions stays open; nothing "
            f"was done and nothing stored is lost: try again (it is tried again at a "
            f"transaction {GROW_RETRY_S:g} s later)",
            path=path, full="map", map_bytes=self.map_bytes())

    def _resize(self, fn, mine: int = 1, renew_pin: bool = True) -> bool:
        """Run ``fn`` (with ``lock`` held) once the caller's ``mine`` counted
        transactions are the only ones of this process: new begins wait
        meanwhile (``resizing``), open ones are given ``RESIZE_WAIT_S`` to
        end; those still open then are asked to end by the release hooks (the
        shard closes its idle cursors) and given ``RESIZE_WAIT_S`` more; else
        nothing is done (False). A remap ends this process's pin of the log's
        checkpoint, so it runs under the log's lock (taken in that time too)
        and the log renews the pin before any write (``Wal.remapped``)."""
        wal = self.wal
        took = not wal.held()
        if took and not wal.lock(timeout=RESIZE_WAIT_S):
            return False
        self.resizing = True
        try:
            deadline, released = time.monotonic() + RESIZE_WAIT_S, False
            while self.live() != mine:
                if time.monotonic() >= deadline:
                    if released or not self.release_hooks:
                        return False
                    released = True
                    for hook in self.release_hooks:
                        try:
                            hook()
                        except Exception:  # a hook that failed ends nothing: the wait says
                            log.exception("%s: a remap's release hook failed", wal.folder)
                    deadline = time.monotonic() + RESIZE_WAIT_S
                time.sleep(0.0005)
            fn()
            if renew_pin:
                wal.remapped()
            return True
        finally:
            self.resizing = False
            if took:
                wal.unlock()

    def _grow(self):
        self.grow_wanted = False
        cur = self.map_bytes()
        new = min(max(2 * cur, 2 * self.used_bytes()), self.map_bytes_max)
        if new > cur:
            self.env.set_mapsize(new)

    def _adopt(self):
        self.env.set_mapsize(0)  # the size the other process recorded in the file


def _count_of(counter) -> int:
    return int(repr(counter)[6:-1])  # "count(n)": the next value, unconsumed


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
        put = functools.partial(self._t.put, db=self._s._dbs[db], overwrite=overwrite)
        store, i, note = self._s, _DB_INDEX[db], self._note

        def put_row(key, value):
            try:
                done = put(key, value)
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


def _open_env(path: str, map_bytes: int, map_bytes_max: int | None) -> _Env:
    """Open a folder's environment in this process: the first process to open
    it recovers it from its checkpoint and log (``wal``)."""
    wal = wal_mod.Wal(path)
    try:
        first = wal.enter()
        try:
            gen = wal_mod.restore_meta(path) if first else None
            env = lmdb.open(path, map_size=map_bytes, max_dbs=len(DBS) + 2,
                            subdir=True, sync=False, metasync=False, mode=0o600,
                            max_readers=1024, readahead=False)
            ent = _Env(env, None, max(map_bytes, MAP_BYTES_MAX if map_bytes_max is None
                                      else map_bytes_max))
            ent.wal = wal
            wal.attach(env, ent.begin_pin, ent.grow_ahead)
            used = ent.used_bytes()
            if used > GROW_AT_FRACTION * map_bytes:  # no transaction is open yet
                env.set_mapsize(min(max(2 * used, map_bytes), ent.map_bytes_max))
            ent.dbs = _open_dbs(env, wal, first)
            if first:
                wal.recover(tuple(ent.dbs[name] for name in DBS), gen, log=lambda n: log.warning(
                    "%s: recovered %d transactions from the write-ahead log", path, n))
        finally:
            if first:
                wal.entered()
    except BaseException:
        wal.close()
        raise
    return ent


def _open_dbs(env, wal: wal_mod.Wal, first: bool) -> dict:
    """The sub-databases; creating one writes, so a process that is not the
    first holds the log's lock and checkpoints after a creation."""
    if first:
        return {name: env.open_db(name.encode()) for name in DBS}
    dbs, missing = {}, []
    for name in DBS:
        try:
            dbs[name] = env.open_db(name.encode(), create=False)
        except lmdb.NotFoundError:
            missing.append(name)
    if missing:
        wal.lock()
        try:
            for name in missing:
                dbs[name] = env.open_db(name.encode())
            wal.checkpoint_locked()
        finally:
            wal.unlock()
    return dbs


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
