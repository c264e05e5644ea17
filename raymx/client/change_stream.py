"""``ChangeStream``: a replica set's change events, resumable by token."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Iterator

from raymx import errors
from raymx.storage.gtid import GTID
from raymx.storage.limits import DEFAULT as DEFAULT_LIMITS

if TYPE_CHECKING:
    from raymx.client.client import Client
    from raymx.client.connection import Connection


class ChangeStream:
    """Change events in GTID order (format: ``raymx.storage.changes``).

    Iterate it (blocks), or call ``try_next()`` (one long-poll of at most
    ``wait_ms``: an event or None). ``resume_token`` is the token after the
    last event returned, or, on a quiet or filtered stream, the high-water
    mark (the majority-committed point the member has reached), so a consumer
    that stores it with its own effects and restarts from it (``watch(after=
    token)``) sees every event exactly once. A lost member is not an error:
    the stream resumes from its token on the primary, or on any other member
    while there is none (every member serves the same events). A token older
    than the oplog raises ``OplogTrimmed`` naming the oldest GTID available.
    """

    def __init__(self, client: Client, after, namespaces, ops, level, rp, batch, wait_ms):
        from raymx.storage.changes import Filter, parse_token
        Filter(namespaces, ops)  # validate here, before any request
        self.client = client
        self.resume_token = None if after is None else list(parse_token(after))
        self._req = {"op": "watch", "namespaces": None if namespaces is None else list(namespaces),
                     "ops": None if ops is None else list(ops), "readConcern": level,
                     "batch": batch, "wait_ms": wait_ms}
        self._rp = rp
        self._wait_s = (wait_ms or DEFAULT_LIMITS.watch_wait_ms) / 1000
        self._conn: Connection | None = None
        self._events: list = []  # the last batch's events not yet returned, last first
        self._batch_resume = None
        self.member: int | None = None  # the member serving this stream now
        self.closed = False
        if self.resume_token is None:  # start now: the member's majority point
            self.resume_token = self._fetch()["resume"]

    def _connect(self) -> Connection:
        c = self.client
        try:
            if self._rp.mode == "primary":
                conn = c._primary_conn()
            else:
                conn = c._read_conn(self._rp)
        except (errors.PrimaryUnavailable, errors.StaleRead, OSError):
            # no primary now (an election): any member serves the same events
            topo = c._topology()
            ms = [m for m in topo["members"] if not m.get("hidden") and (
                m.get("role") == "primary" or m.get("state", "running") == "running")]
            if not ms:
                raise errors.PrimaryUnavailable("no member of the replica set is reachable")
            m = ms[next(c._rr) % len(ms)]
            with c._lock:
                conn = c._conn_to(m, topo["secret"])
        self.member = conn.hello.get("member") if isinstance(conn.hello, dict) else None
        return conn

    def _fetch(self) -> dict:
        deadline = time.monotonic() + self.client.timeout_s
        while True:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = self._connect()
                return self._conn.request(dict(self._req, after=self.resume_token),
                                          self._wait_s + self.client.timeout_s)
            except (errors.ConnectionLost, errors.PrimaryUnavailable, errors.ShutDown,
                    errors.NotPrimaryOrSecondary, OSError, TimeoutError) as e:
                err = e
            except Exception as e:  # e.g. Ray reporting a member restarting
                if isinstance(e, errors.RaymxError):
                    raise
                err = e
            self._conn = None
            with self.client._lock:
                self.client._primary = None
            if time.monotonic() >= deadline:
                raise errors.PrimaryUnavailable(f"change stream: no member answered within "
                                                f"{self.client.timeout_s}s ({err})")
            time.sleep(self.client.retry_interval_s)

    def try_next(self) -> dict | None:
        """The next event, or None after one long-poll found nothing (the
        resume token may still have moved: the high-water mark)."""
        if self.closed:
            raise errors.InvalidOperation("the change stream is closed")
        if not self._events:
            r = self._fetch()
            self._events = list(reversed(r["events"]))
            self._batch_resume = r["resume"]
            if not self._events:
                self.resume_token = self._batch_resume
                return None
        ev = self._events.pop()
        ev["gtid"] = GTID(*ev["gtid"])
        # after the last event of a batch, the batch's own token (it may be higher)
        self.resume_token = ev["token"] if self._events else self._batch_resume
        return ev

    def __iter__(self) -> Iterator[dict]:
        while not self.closed:
            ev = self.try_next()
            if ev is not None:
                yield ev

    def close(self) -> None:
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()
