"""When a write is durable and acknowledged: group commit (one LMDB sync
covers every commit before it) and the write-concern waiters (writes waiting
until enough members hold their entry durably). The decisions are the pure
``WriteConcernCore``'s; these classes own the threads (or, in the
simulation, its timers) and the locks.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Callable

from raymx import errors
from raymx.actors.core.gtid_manager import GTIDManager
from raymx.actors.core.primary import WriteConcernCore
from raymx.storage.engine import Engine
from raymx.storage.gtid import GTID

if TYPE_CHECKING:
    from raymx.actors.shard import ShardService

log = logging.getLogger("raymx.shard")


class GroupCommit:
    """One LMDB sync covers every commit before it (the syncer thread)."""

    def __init__(self, engine: Engine, gm: GTIDManager, interval_ms: int,
                 on_durable: Callable[[GTID], None] | None = None,
                 on_fatal: Callable[[Exception], None] | None = None,
                 timer: Callable[[int, Callable[[], None]], None] | None = None):
        self._e = engine
        self._gm = gm
        self._interval = interval_ms / 1000
        self._on_durable = on_durable
        self._on_fatal = on_fatal
        self.failed: Exception | None = None  # a sync failed: nothing more is durable
        # eager: sync as soon as anything is committed (members wait downstream),
        # else every interval_ms unless a j=True writer waits
        self.eager = False
        self._cond = threading.Condition()
        self._waiters: list[tuple] = []  # (GTID, ok(), fail(error))
        self.committed: GTID | None = None  # last commit (not yet necessarily durable)
        self.durable: GTID | None = None    # last commit covered by a finished sync
        self.syncs = 0
        self._stop = False
        # ``timer(delay_ms, fn)`` instead of the syncer thread (the simulation)
        self._timer, self._timed = timer, False
        self._t = None
        if timer is None:
            self._t = threading.Thread(target=self._run, name="raymx-syncer", daemon=True)
            self._t.start()

    def note_commit(self, g: GTID, wake: bool = True) -> None:
        """``g`` committed. With ``wake=False`` the caller flushes itself
        (``sync_now``); else the syncer does, at once if ``eager``."""
        with self._cond:
            if self.committed is None or g > self.committed:
                self.committed = g
            if self._timer is not None:
                if wake and not self._timed:
                    self._timed = True
                    self._timer(0 if self.eager else int(self._interval * 1000), self._on_timer)
            elif self.eager and wake:
                self._cond.notify()

    def _on_timer(self) -> None:
        self._timed = False
        if self.failed is None:
            self.sync_now()

    def reset(self, last: GTID | None) -> None:
        """Everything up to ``last`` is committed and durable (a store just
        opened and synced, a member becoming primary)."""
        with self._cond:
            self.committed = self.durable = last

    def when_durable(self, g: GTID, cb: Callable[[], None],
                     fail: Callable[[Exception], None] = lambda e: None) -> bool:
        """``cb`` once a flush covers ``g``: now if one did; else it waits (the
        caller flushes, ``sync_now``) and this returns True. ``fail(error)``
        instead if the disk failed first."""
        with self._cond:
            if self.failed is not None:
                fail(self.failed)
                return False
            if self.durable is None or g > self.durable:
                self._waiters.append((g, cb, fail))
                return True
        cb()
        return False

    def _behind(self) -> bool:
        """Something is committed that no finished sync covers (lock held)."""
        return self.committed is not None and (self.durable is None
                                               or self.committed > self.durable)

    def _run(self):
        while True:
            with self._cond:
                if not self._waiters and not self._stop and not (self.eager and self._behind()):
                    self._cond.wait(self._interval)
                if self.failed is not None or (
                        self._stop and not self._waiters and not self._behind()):
                    return
                if not self._behind():
                    continue
                target = self.committed
            if not self._sync(target):
                time.sleep(self._interval)

    def sync_now(self) -> None:
        """Flush on the calling thread (the writer thread, or the port's for the
        groups it runs), when durable writers wait on what it just committed:
        no hand-off to the syncer on their path. Writes arriving meanwhile wait
        in the socket buffers and share the next group and sync."""
        with self._cond:
            target = self.committed
            if target is None or (self.durable is not None and target <= self.durable):
                return
        self._sync(target)

    def _sync(self, target: GTID) -> bool:
        # durability gate: record min_live before the flush, publish after it
        gm = self._gm  # become_primary may swap it meanwhile: record and publish on one
        rec = gm.before_sync()
        try:
            if self.failed is not None:
                raise self.failed
            self._e.sync()
        except Exception as e:
            # the disk failed: what the sync covered may not be on disk and a
            # retry may "succeed" over lost pages. Never sync again, nothing
            # waiting is acknowledged; the shell stops the member
            first = self.failed is None
            with self._cond:
                self.failed = e if isinstance(e, errors.DiskFailed) else errors.DiskFailed(
                    f"sync failed: {type(e).__name__}: {e}")
                failed, self._waiters = self._waiters, []
            if first:
                log.critical("LMDB sync failed; this member stops: %s", e)
                if self._on_fatal is not None:
                    self._on_fatal(self.failed)
            for _, _, fail in failed:
                fail(self.failed)
            return False
        gm.after_sync(rec)
        with self._cond:
            if self.durable is not None and target <= self.durable:
                return True  # another thread's flush covered it and released its writers
            self.durable = target
            self.syncs += 1
            done = [cb for g, cb, _ in self._waiters if g <= target]
            self._waiters = [w for w in self._waiters if w[0] > target]
        for cb in done:
            cb()
        if self._on_durable is not None:
            self._on_durable(target)
        return True

    def stop(self):
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._t is not None:
            self._t.join(10)


class WriteConcernWaiters:
    """Writes waiting until enough members hold their entry durably: the
    decisions are ``WriteConcernCore``'s; this shell adds a lock and a thread.

    A position that moves releases the writes it acknowledges at once, on the
    thread that reported it (a pull, the syncer): no hand-off to another
    thread on the acknowledgement path. The waiters' own thread handles
    timeouts and deposed primaries.
    """

    def __init__(self, svc: "ShardService"):
        self._svc = svc
        self._cond = threading.Condition()
        self.core = WriteConcernCore(svc.votes)
        self._stopped = threading.Event()
        self._wake_ms = 0  # when the waiters' thread wakes next (0: it is awake)
        if svc.timer is None:  # else a timer per deadline (the simulation)
            threading.Thread(target=self._run, name="raymx-wc", daemon=True).start()

    def positions(self) -> dict[int, GTID | None]:
        with self._cond:
            return dict(self.core.durable)

    def waiting(self) -> int:
        return len(self.core.waiting)

    def set_votes(self, votes: dict) -> None:
        with self._cond:
            self.core.set_votes(votes)

    def update(self, member: int, g: GTID | None) -> None:
        with self._cond:
            if not self.core.update(member, g):
                return
            primary = self._svc.primary
            if not primary and not self.core.waiting:
                return
            term = self._svc.e.term  # one read of it for both
            mp = self.core.majority_point(term) if primary else None
            done = self._sweep(term) if self.core.waiting else []
        if mp is not None:  # before the acknowledgements: a majority read then sees them
            self._svc.note_majority(mp)
        self._answer(done)

    def reset(self, member: int | None = None, last: GTID | None = None) -> None:
        with self._cond:
            self.core.reset(member, last)

    def step_down(self, member: int) -> None:
        with self._cond:
            done = self.core.step_down(member)
        self._answer(done)

    def majority_point(self) -> GTID | None:
        term = self._svc.e.term
        with self._cond:
            return self.core.majority_point(term)

    def wait(self, g: GTID, w, wtimeout_ms, ok, fail) -> None:
        """Answer ``ok()`` once ``g`` holds write concern ``w`` (or ``fail``):
        a later ``update`` decides it on the thread that reports the position,
        the deadline on the waiters' thread (woken only when it would sleep
        past it), or now when it can already be decided."""
        deadline = None if not wtimeout_ms else self._svc.mono_ms() + int(wtimeout_ms)
        with self._cond:
            err = self.core.wait(g, w, deadline, (ok, fail))
            now = err is None and self.core.ready(g, w, self._svc.primary)
            if deadline is not None and deadline < self._wake_ms:
                self._cond.notify()
        if err is not None:
            return fail(err)
        if self._svc.timer is not None and deadline is not None:
            self._svc.timer(int(wtimeout_ms), self.tick)
        if now:
            self.tick()

    def _run(self):
        while not self._stopped.is_set():
            with self._cond:
                d, now = self.core.next_deadline(), self._svc.mono_ms()
                wait_s = min(1.0, max(0.0, (d - now) / 1000)) if d else 1.0
                self._wake_ms = now + wait_s * 1000
                self._cond.wait(wait_s)
                self._wake_ms = 0  # awake: it reads the deadlines again before it sleeps
            try:
                self.tick()
            except Exception:
                if self._stopped.is_set():
                    return  # the service closed meanwhile (its store with it)
                log.exception("write-concern waiters: a sweep failed")

    def stop(self) -> None:
        """Its thread ends (the service closes)."""
        self._stopped.set()
        with self._cond:
            self._cond.notify()

    def tick(self) -> None:
        """Answer every waiter that can be (acknowledged, timed out, deposed)."""
        with self._cond:
            done = self._sweep(self._svc.e.term)
        self._answer(done)

    def _sweep(self, term: int) -> list:
        """Under the lock: the waiters decided now, ``term`` the durable one."""
        return self.core.sweep(self._svc.mono_ms(), term, self._svc.primary)

    @staticmethod
    def _answer(done: list) -> None:
        """Outside the lock: the callbacks answer clients."""
        for (ok, fail), err in done:
            if err is None:
                ok()
            else:
                fail(err)


def _mono_ms() -> int:
    return int(time.monotonic() * 1000)
