"""The LMDB environment of a folder in this process (``_Env``): shared by
its store objects, its transactions counted so that the map can be grown
(remapped) while none is open, and opened (recovered from the write-ahead
log by the first process) by ``_open_env``. The store itself, its
transactions and the "no room" refusals are ``raymx.storage.lmdb_store``;
these two modules are the only ones importing lmdb.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time

import lmdb

from raymx.storage import errors, wal as wal_mod
from raymx.storage.store import DBS

log = logging.getLogger("raymx.storage")

# LMDB refuses to open one path twice in a process, so environments are shared
# per path (with a reference count) by every store object in the process.
_ENVS: dict[str, "_Env"] = {}
_ENVS_LOCK = threading.Lock()

MiB = 1 << 20
# The map opens at twice the data file's size when the file already uses more
# than this fraction of the requested map, and a running process grows it once
# a commit leaves the file past it (before a write meets the map's end).
GROW_AT_FRACTION = 0.75
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
