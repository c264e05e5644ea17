"""What every actor of a member shares: opening its folder (with the lock
that keeps one process per role on it), stopping on a fatal disk error, actor
names and handles, notifications that never block, and the scheduling
priority of a member's processes."""
from __future__ import annotations

import logging
import os
import re
import threading
import time

import ray

from raymx import errors
from raymx.members import NAMESPACE
from raymx.storage.engine import Engine
from raymx.storage.limits import Limits
from raymx.storage.lmdb_store import LMDBStore

log = logging.getLogger("raymx.member")


def open_member(path: str, limits: Limits) -> Engine:
    return Engine(LMDBStore(path, map_bytes=limits.map_bytes), limits)


_HOLDER = re.compile(r"replica set '([^']+)' member \d+ \w+ \(pid \d+\)")


def lock_member(path: str, rs: str, member: int, role: str, wait_s: float = 5.0):
    """Hold ``<path>/.<role>.lock`` (an exclusive flock) for this process's
    life: two sets over one data folder, or a zombie process and its restart,
    never write one member's files at once. The kernel drops the lock when the
    process dies, however it dies; a holder of this set that is going away
    (this member's old process, a kill just asked for) is waited for up to
    ``wait_s``. A holder of another set is refused at once: no restart of
    ours will free it. Returns the open file (keep it)."""
    import fcntl
    os.makedirs(path, mode=0o700, exist_ok=True)
    f = open(os.path.join(path, f".{role or 'shard'}.lock"), "a+")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError:
            f.seek(0)
            holder = f.read().strip()
            m = _HOLDER.fullmatch(holder)  # (a holder still writing it: no match)
            other_set = m is not None and m.group(1) != rs
            if time.monotonic() < deadline and not other_set:
                time.sleep(0.05)
                continue
            holder = holder or "another process"
            f.close()
            raise errors.ConfigError(
                f"{path} is in use by {holder}: a member's folder serves one replica "
                "set member at a time (is a set already running over this data_dir?)"
            ) from None
    f.seek(0)
    f.truncate()
    f.write(f"replica set {rs!r} member {member} {role or 'shard'} (pid {os.getpid()})")
    f.flush()
    return f


def stop_process(e: Exception) -> None:
    """A sync failed (``errors.DiskFailed``): stop this process at once, as
    PostgreSQL PANICs. Carrying on could acknowledge writes whose pages the
    kernel dropped; Ray restarts the actor, which recovers from what reached
    the disk (or fails again, visibly, while the disk is broken)."""
    log.critical("stopping this member's process: %s", e)
    logging.shutdown()
    os._exit(70)


def actor_name(rs: str, member: int, role: str = "") -> str:
    return f"{rs}/m{member}" + (f"/{role}" if role else "")


def now_ms() -> int:
    return int(time.time() * 1000)


class Notifier:
    """Sends the newest value to a method of a named actor with at most one call
    in flight, so a fast writer never floods a slow reader with notifications.

    The actor's handle is looked up once (a GCS round trip and a handle built
    each time otherwise) and again only after a call through it failed: the
    actor was replaced, or is restarting.
    """

    def __init__(self, rs: str, member: int, role: str, method: str):
        self._where = (rs, member, role)
        self._method = method
        self._handle = None
        self._lock = threading.Lock()
        self._pending = None
        self._busy = False

    def _send(self, v):
        h = self._handle
        if h is None:
            h = self._handle = _get(*self._where)
        return getattr(h, self._method).remote(v)

    def __call__(self, value) -> None:
        with self._lock:
            self._pending = value
            if self._busy:
                return
            self._busy = True
        self._fire()

    def _fire(self):
        with self._lock:
            v, self._pending = self._pending, None
        try:
            ref = self._send(v)
            ref.future().add_done_callback(self._done)
        except Exception:  # the peer is restarting: the next value will retry
            self._handle = None
            with self._lock:
                self._busy = False

    def _done(self, f):
        if f.exception() is not None:
            self._handle = None  # look the actor up again for the next value
        with self._lock:
            if self._pending is None:
                self._busy = False
                return
        self._fire()


_reniced_at = [0.0]


def serve_at_normal_priority(every_s: float = 0.0) -> None:
    """Ray starts workers at nice 15; a member's processes serve clients (and,
    for w > 1, replicate for them) at nice 0 when allowed. Measured: ~17-20%
    more durable commits at 8-16 clients for the shard; for the producer and
    applier, replication lag that does not wait behind every other program.

    On Linux the nice value belongs to each thread and new threads inherit it
    from their creator, so every thread of the process is set, and callers
    repeat it now and then (``every_s``) for threads Ray starts later (the
    threads of a concurrency group start with its first call)."""
    now = time.monotonic()
    if every_s and now - _reniced_at[0] < every_s:
        return
    _reniced_at[0] = now
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) > 0:
                os.setpriority(os.PRIO_PROCESS, tid, 0)
        except OSError:
            pass


def _get(rs: str, member: int, role: str):
    return ray.get_actor(actor_name(rs, member, role), namespace=NAMESPACE)
