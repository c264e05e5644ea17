"""The read half of ``ShardService``: queries on LMDB snapshots (the reader
pool), cursors and getMore, change streams, and waits for an applied
point. Readers never wait for the writer.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from typing import Callable

from raymx import errors
from raymx.actors.core import client_limits
from raymx.actors.core.replication import applied_point
from raymx.storage import codec
from raymx.storage.engine import Reader, Stats, split_ns
from raymx.storage.gtid import GTID
from raymx.storage.limits import READ_CONCERNS
from raymx.storage.reader import id_point

log = logging.getLogger("raymx.shard")
Reply = Callable[..., None]


def gtid_out(g: GTID | None):
    return None if g is None else [g.term, g.seq]


def _gtid_in(v, what: str) -> GTID:
    try:
        return GTID.parse(v)
    except (ValueError, TypeError):
        raise errors.InvalidOperation(f"{what} must be a GTID [term, seq], got {v!r:.60}") from None


class TimeLimit:
    """A read's ``max_time_ms`` (MongoDB's ``maxTimeMS``): the time its
    batches may take in all, the time between them not counted. ``check``
    (``Stats.check``, called as documents are examined) raises
    ``ExecutionTimeout`` once a batch runs past what is left."""

    def __init__(self, ms):
        if type(ms) not in (int, float) or ms < 0:
            raise errors.InvalidOperation(f"max_time_ms must be a non-negative number of "
                                          f"milliseconds, got {ms!r:.40}")
        self.ms = ms
        self.left = ms / 1000
        self.deadline = float("inf")

    def __enter__(self):
        self.t0 = time.monotonic()
        self.deadline = self.t0 + self.left

    def __exit__(self, *exc):
        self.left -= time.monotonic() - self.t0
        self.deadline = float("inf")

    def counted_from(self, t0: float) -> "TimeLimit":
        """All of it counted at once from ``t0`` on (the wire port's own work
        for a command: from the command's start, as MongoDB's)."""
        self.deadline = t0 + self.left
        return self

    def check(self) -> None:
        if time.monotonic() > self.deadline:
            raise errors.ExecutionTimeout(
                f"operation exceeded time limit ({self.ms:g} ms, max_time_ms)",
                max_time_ms=self.ms)


def time_limit(req: dict) -> TimeLimit | None:
    """The read's time limit, if it has one (``max_time_ms`` > 0)."""
    ms = req.get("max_time_ms")
    return TimeLimit(ms) if ms else None


INTERRUPT = "$interrupt"  # set in a connection's state: its running read stops (killOp)


def read_check(limit: TimeLimit | None, conn: dict):
    """``Stats.check`` of a read (or a batch of its cursor) for the
    connection ``conn``: the time limit, and an interrupt of the command
    running on it (the wire port's ``killOp``)."""
    def check():
        if conn.get(INTERRUPT):
            raise errors.Interrupted("operation was interrupted (killOp)")
        if limit is not None:
            limit.check()
    return check


_SIZE_SLACK = 16  # bytes over a document's stored size, in a batch's sum of them


class _Cursor:
    def __init__(self, cid: int, reader: Reader, it, limit: TimeLimit | None = None,
                 stats: Stats | None = None):
        self.id = cid
        self.reader = reader
        self.it = it
        self.limit = limit   # max_time_ms: every batch counts against it
        self.stats = stats   # its query's: each batch's connection checks through it
        self.used = time.monotonic()
        self.head = None     # (document, its size or None) taken from ``it``: the next
        #                      batch starts with it
        self.killed = False  # killed while a getMore held it: closed when that ends

    def close(self):
        if self.reader is not None:  # (results computed already hold no snapshot)
            self.reader.t.abort()


def point_read(req: dict) -> bool:
    """A ``find`` that reads at most the one document its filter names by
    ``_id``, on the newest snapshot (readConcern local, no
    ``after`` wait): cheap and bounded enough to run on the client port's
    thread (``ReadPath.submit_read``)."""
    if req.get("op") != "find" or req.get("after") is not None \
            or req.get("readConcern", "local") != "local":
        return False
    return id_point(req.get("filter"))


class ReadPath:
    """Mixed into ``ShardService``: every read request it serves."""

    def _read(self, req: dict, reply: Reply, conn: dict) -> None:
        try:
            op = req["op"]
            if op == "getMore":
                out = self._get_more(req.get("cursor"), req.get("batch"), conn)
                if not out["cursor"]:
                    self._forget_cursors(conn, [req.get("cursor")])
                return reply(ok=out)
            if op == "killCursors":
                cids = req.get("cursors", ())
                self._forget_cursors(conn, cids)
                found = [self._close_cursor(cid) for cid in cids]
                return reply(ok={"killed": [c for c, f in zip(cids, found) if f],
                                 "notFound": [c for c, f in zip(cids, found) if not f]})
            rc = req.get("readConcern", "local")
            if rc not in READ_CONCERNS:
                raise errors.InvalidOperation(f"readConcern {rc!r}: one of "
                                              f"{', '.join(READ_CONCERNS)}")
            if rc == "linearizable" and not self.primary:
                raise errors.NotPrimary(f"member {self.member_id} is not the primary (a "
                                        "linearizable read)", member=self.member_id)
            point = None
            if rc in ("majority", "snapshot"):
                # as of the majority-committed point this member knows, or the
                # snapshot's own point (``at``: a snapshot session's later reads)
                point = self._majority_point_for(req, rc)
            r = self.e.reader()
            if point is not None:
                r.at(point)
            keep = False
            try:
                out = self._find(r, req, conn) if op == "find" else self._read_in(r, req, conn)
                if rc == "snapshot":
                    out["at"] = gtid_out(point)  # the session reads there again
                cid = out["cursor"] if op == "find" else None
                if rc == "linearizable" and op in ("find", "count", "distinct"):
                    if not cid:  # all read: no snapshot held while a majority confirms
                        r.t.abort()  # (it would hold back a remap of the map meanwhile)
                    try:  # after reading: a deposed primary never answers
                        self.confirm_primary(req.get("read_timeout_ms") or 10_000)
                    except BaseException:
                        if cid:
                            self._close_cursor(cid)
                        raise
                if cid:
                    keep = self._keep_cursor(cid, conn)
                reply(ok=out)
            finally:
                if not keep:
                    r.t.abort()
        except errors.RaymxError as e:
            reply(err=e)
        except Exception as e:
            log.exception("read failed")
            reply(err=errors.RaymxError(f"internal error: {type(e).__name__}: {e}"))

    def _majority_point_for(self, req: dict, rc: str) -> GTID:
        """The point a majority or snapshot read reads at: the majority point
        this member knows, or ``at`` (snapshot only: a snapshot session reads
        where its first read did). Either must hold ``after`` (a causally
        consistent session's ``afterClusterTime``), and ``at`` must be
        majority-committed here: it waits for both. (Waiting for ``after`` to
        be applied only, a majority read missed the session's own majority
        write: a secondary learns the majority point a pull after the entry.)"""
        at = req.get("at")
        if at is not None and rc != "snapshot":
            raise errors.InvalidOperation("at (atClusterTime) needs readConcern 'snapshot'")
        for g in (req.get("after"), at):
            if g is not None:
                self._wait_majority(*client_limits.read_after(dict(req, after=g), self.limits))
        return _gtid_in(at, "at") if at is not None else self.majority_known or GTID(0, 0)

    def _wait_majority(self, g: GTID, timeout_ms: int) -> None:
        """Until this member knows a majority point at or past ``g``."""
        deadline = time.monotonic() + timeout_ms / 1000
        with self.majority_cond:
            while self.majority_known is None or self.majority_known < g:
                left = deadline - time.monotonic()
                if left <= 0 or self._stopping.is_set():
                    raise errors.ReadConcernTimeout(
                        f"member {self.member_id} knows the majority-committed point "
                        f"{self.majority_known}, not {g}, after {timeout_ms} ms",
                        majority=gtid_out(self.majority_known), wanted=list(g))
                self.majority_cond.wait(left)

    def _topology(self, reply: Reply) -> None:
        try:
            topo = self.topology_source()
            reply(ok={k: v for k, v in topo.items() if k != "secret"})
        except errors.RaymxError as e:
            reply(err=e)
        except Exception as e:  # the coordinator is restarting: the client asks again
            reply(err=errors.PrimaryUnavailable(
                f"member {self.member_id} cannot reach the set's coordinator now: "
                f"{type(e).__name__}"))

    def open_results(self, docs: list, batch: int | None, conn: dict) -> dict:
        """A cursor over documents computed already (the wire port's aggregate
        pipelines), as a find's answer: the first batch, and the cursor's id
        if more remain. Paged, counted against the connection's limit, expired
        and killed as a find's cursor is; it holds no snapshot. ``batch`` 0:
        an empty first batch (MongoDB's ``cursor: {batchSize: 0}``)."""
        c = _Cursor(next(self._ids), None, iter(docs))
        out = self._table_if_open(c, {"cursor": c.id if docs else 0, "docs": []}
                                  if batch == 0 else self._batch(c, batch))
        if out["cursor"] and not self._keep_cursor(out["cursor"], conn):
            out["cursor"] = 0
        return out

    def _keep_cursor(self, cid: int, conn: dict) -> bool:
        """A cursor left open for ``conn``: within the limits (``_budget_cursor``),
        and remembered as the connection's. False if its client left already."""
        self._budget_cursor(cid, conn)
        with self._cursors_lock:
            if conn.get("closed"):  # its client left: nobody can ask for more
                self._cursors.pop(cid, None)
                return False
            conn.setdefault("cursors", set()).add(cid)
            return True

    def _budget_cursor(self, cid: int, conn: dict) -> None:
        """A find left cursor ``cid`` open: refuse it past the connection's
        limit (closed, LimitExceeded), else keep the member within its budget
        of LMDB snapshots (its least recently used cursor is closed)."""
        try:
            client_limits.check_cursors(self._open_cursors(conn), self.limits)
        except errors.LimitExceeded:
            self._close_cursor(cid)
            raise
        with self._cursors_lock:
            over = len(self._cursors) + len(self._cursors_busy) > self.limits.cursors_max
            lru = min(self._cursors.values(), key=lambda x: x.used) if over else None
        if lru is not None:
            log.warning("cursor %d closed: the member has %d open cursors "
                        "(Limits.cursors_max)", lru.id, self.limits.cursors_max)
            self._close_cursor(lru.id)

    def _open_cursors(self, conn: dict) -> int:
        """The connection's cursors still open (those expired or closed for the
        member's budget are forgotten here)."""
        with self._cursors_lock:
            mine = conn.get("cursors")
            if not mine:
                return 0
            mine.intersection_update([c for c in mine if c in self._cursors
                                      or c in self._cursors_busy])
            return len(mine)

    def _forget_cursors(self, conn: dict, cids) -> None:
        with self._cursors_lock:
            mine = conn.get("cursors")
            if mine:
                mine.difference_update(cids)

    def _read_in(self, r: Reader, req: dict, conn: dict):
        op = req["op"]
        limit = time_limit(req) if op in ("count", "find", "distinct") else None
        with limit or contextlib.nullcontext():
            return self._read_in_checked(r, req, Stats(read_check(limit, conn)))

    def _read_in_checked(self, r: Reader, req: dict, stats: Stats):
        op = req["op"]
        if op == "count":
            return {"value": r.count(req["ns"], req.get("filter"), stats, req.get("hint"))}
        if op == "distinct":
            return {"value": r.distinct(req["ns"], req.get("key"), req.get("filter"), stats)}
        if op == "find":  # inside a transaction: one batch, no cursor
            docs, size = [], 0
            for d in r.find(req["ns"], req.get("filter"), req.get("projection"), req.get("sort"),
                            req.get("skip") or 0, req.get("limit") or 0, stats,
                            req.get("hint")):
                size += len(codec.pack(d))
                if size > self._batch_bytes() and docs:
                    raise errors.InvalidOperation(
                        f"a find inside a transaction answers in one batch, and this one "
                        f"exceeds {self._batch_bytes()} bytes: narrow it (filter, "
                        "projection, limit) or read outside the transaction")
                docs.append(d)
            return {"cursor": 0, "docs": docs}
        if op == "listCollections":
            return {"value": r.list_collections()}
        if op == "collStats":
            return {"value": r.coll_stats(req["ns"])}
        if op == "validate":
            return {"value": r.validate(req["ns"])}
        if op == "explain":  # a find (or a distinct: ``key``) run to its end: how it
            st, t0 = Stats(), time.monotonic()  # read, what it examined
            if req.get("key") is not None:
                n = len(r.distinct(req["ns"], req["key"], req.get("filter"), st))
            else:
                n = sum(1 for _ in r.find(req["ns"], req.get("filter"), req.get("projection"),
                                          req.get("sort"), req.get("skip") or 0,
                                          req.get("limit") or 0, st, req.get("hint")))
            return {"value": {"plan": st.plan, "examined": st.examined, "returned": n,
                              "in_order": st.in_order, "ms": (time.monotonic() - t0) * 1000}}
        if op == "revertPlan":
            return {"value": r.revert_plan(_gtid_in(req.get("target"), "target"))}
        if op in ("listIndexes", "indexStats"):
            split_ns(req["ns"])
            c = r.coll(req["ns"])
            ixs = [{"name": "_id_", "key": [["_id", 1]], "unique": True}]
            if c is not None:
                ixs += [{"name": n, **i.spec()} for n, i in c.indexes.items()]
            if op == "indexStats":  # each index's uses since this member opened its store
                uses = self.e.index_uses
                ixs = [dict(ix, ops=uses.get((req["ns"], ix["name"]), 0),
                            since_ms=self.started_ms) for ix in ixs] if c is not None else []
            return {"value": ixs}
        raise errors.InvalidOperation(f"unknown read operation {op!r}")

    def _find(self, r: Reader, req: dict, conn: dict) -> dict:
        if not (req.get("projection") or req.get("sort") or req.get("skip")) \
                and type(req.get("limit", 0)) is int and req.get("limit", 0) >= 0:
            hits = r.by_id(req["ns"], req.get("filter")) if req.get("hint") is None else None
            if hits is not None:  # a point read: no query plan, no cursor
                return {"cursor": 0, "docs": [d for _, d in hits]}
        limit, stats = time_limit(req), Stats()
        it = r.find(req["ns"], req.get("filter"), req.get("projection"), req.get("sort"),
                    req.get("skip") or 0, req.get("limit") or 0, stats, req.get("hint"))
        c = _Cursor(next(self._ids), r, it, limit, stats)
        return self._table_if_open(c, self._batch(c, req.get("batch"), conn))

    def _table_if_open(self, c: _Cursor, out: dict) -> dict:
        """A new cursor's first answer ``out``; the cursor goes into the table
        if more remain."""
        if out["cursor"]:
            with self._cursors_lock:
                self._cursors[c.id] = c
            self._expire_cursors(c.used)
        return out

    def _expire_cursors(self, now: float) -> None:
        """Close the cursors idle past ``cursor_idle_ms`` (looked at most once a
        second, when a cursor opens). One in a getMore is not in the table."""
        if now < self._cursors_swept + 1.0:
            return
        self._cursors_swept = now
        idle_before = now - self.limits.cursor_idle_ms / 1000
        with self._cursors_lock:
            old = [cid for cid, c in self._cursors.items() if c.used < idle_before]
        for cid in old:
            log.info("cursor %d closed after %d ms idle", cid, self.limits.cursor_idle_ms)
            self._close_cursor(cid)

    def _batch_bytes(self) -> int:
        """The documents of one answer, encoded, at most: ``cursor_batch_bytes``,
        and room for the frame's other fields under ``frame_bytes_max``."""
        return min(self.limits.cursor_batch_bytes, self.limits.frame_bytes_max - 64 * 1024)

    def _batch(self, c: _Cursor, batch, conn: dict | None = None) -> dict:
        """The next batch: up to ``batch`` (or ``cursor_batch_docs``) documents
        and ``cursor_batch_bytes`` of them encoded, but always one (a document
        fits a frame). Sizes are exact: packing a document costs about 1/25
        of reading it; a lone document (a point read) is never sized.
        ``conn``: the connection asking (its time limit and killOp checked)."""
        if c.stats is not None and conn is not None:
            c.stats.check = read_check(c.limit, conn)
        with c.limit or contextlib.nullcontext():
            return self._batch_checked(c, batch)

    def _batch_checked(self, c: _Cursor, batch) -> dict:
        n_max = min(int(batch or self.limits.cursor_batch_docs), self.limits.cursor_batch_docs)
        cap = self._batch_bytes()
        docs, size = [], 0
        # a document's size: as stored, where the find yields each as decoded or
        # smaller (``Stats.sized``), else packed again (about a quarter of the
        # read's time for documents with dates: measured at stop 60)
        st, r = c.stats, c.reader
        pending, c.head = c.head, None
        it = c.it if pending is None else itertools.chain((pending[0],), c.it)
        first = None
        for d in it:
            if pending is not None:
                nb, pending = pending[1], None
            else:  # (read here: the find sets ``sized`` once it starts)
                nb = r.stored_bytes + _SIZE_SLACK if st is not None and st.sized \
                    and r is not None else None
            if docs:
                if len(docs) == 1:  # a lone document (a point read) is never sized
                    size = first if first is not None else len(codec.pack(docs[0]))
                size += nb if nb is not None else len(codec.pack(d))
                if size > cap:
                    c.head = (d, nb)
                    break
            else:
                first = nb
            docs.append(d)
            if len(docs) >= n_max:
                break
        else:
            return {"cursor": 0, "docs": docs}
        c.used = time.monotonic()
        return {"cursor": c.id, "docs": docs}

    def _get_more(self, cid, batch, conn: dict) -> dict:
        with self._cursors_lock:  # out of the table while in use: not expired, not shared
            c = self._cursors.pop(cid, None)
            if c is not None:
                self._cursors_busy[cid] = c
        if c is None:
            raise errors.InvalidOperation(f"cursor {cid} not found (exhausted, killed, "
                                          "expired, closed when the store's map grew, or in "
                                          "use by another getMore)")
        out = None
        try:
            out = self._batch(c, batch, conn)
        finally:
            with self._cursors_lock:
                del self._cursors_busy[cid]
                keep = out is not None and out["cursor"] and not c.killed
                if keep:
                    self._cursors[cid] = c
            if not keep:
                c.close()
                if out is not None:
                    out["cursor"] = 0  # exhausted, or killed meanwhile: the client stops
        return out

    def _close_cursor(self, cid) -> bool:
        """Close cursor ``cid``; one in a getMore is closed when that ends.
        False: no such cursor is open."""
        with self._cursors_lock:
            c = self._cursors.pop(cid, None)
            busy = c is None and cid in self._cursors_busy
            if busy:
                self._cursors_busy[cid].killed = True
        if c is not None:
            c.close()
        return c is not None or busy

    def _release_for_remap(self) -> None:
        """The store's map is being remapped (it grew, here or in another
        process of the member) and waits for this process's open snapshots:
        the idle cursors' are closed (a getMore holding one ends soon by
        itself). Runs on the resizing thread while new transactions wait, so
        it never waits long for a lock."""
        if not self._cursors_lock.acquire(timeout=0.05):
            return
        try:
            idle = [c for c in self._cursors.values() if c.reader is not None]
            for c in idle:
                del self._cursors[c.id]
        finally:
            self._cursors_lock.release()
        for c in idle:
            c.close()
        if idle:
            log.warning("%d idle cursor(s) closed: the store's map grew and its remap waits "
                        "for every open snapshot of this process; their next getMore finds "
                        "them closed", len(idle))

    def _watch(self, req: dict, reply: Reply) -> None:
        try:
            reply(ok=self.watch(req))
        except errors.RaymxError as e:
            reply(err=e)
        except Exception as e:
            log.exception("watch failed")
            reply(err=errors.RaymxError(f"internal error: {type(e).__name__}: {e}"))

    def watch_gate(self, level: str = "majority") -> GTID | None:
        """The newest entry a change stream may deliver here: at read concern
        ``"majority"`` the majority point (capped at this member's oplog end),
        at ``"local"`` what is durable here (the primary) or written (a
        secondary)."""
        last, _ = self.e.last()
        if level == "local":
            d = self.group.durable if self.primary else last
            return d if d is not None and d != GTID(0, 0) else None
        mk = self.majority_known
        return None if mk is None else min(mk, last)

    def oplog_end(self) -> GTID | None:
        """The newest entry an oplog reader (a tailable cursor) may see: all
        before it are committed here. The primary's commits may finish out
        of GTID order, so there it stops below the oldest GTID still being
        written (``min_live``); a secondary writes its oplog in order."""
        last, _ = self.e.last()
        if last is None or last == GTID(0, 0):
            return None
        if self.primary:
            live = self.gm.min_live()
            return min(last, GTID(live.term, live.seq - 1))
        return last

    def watch(self, req: dict) -> dict:
        """One change-stream batch (long-poll): events after the resume token, up
        to the gate, and the token to resume from (a high-water mark on a
        quiet stream). See ``raymx.storage.changes`` for the format. A token
        older than the live oplog is served from the set's archive while it
        holds the entries after it."""
        from raymx.storage import changes
        level = req.get("readConcern", "majority")
        if level not in ("majority", "local"):
            raise errors.InvalidOperation(f"a change stream reads at readConcern 'majority' "
                                          f"or 'local', not {level!r}")
        flt = changes.Filter(req.get("namespaces"), req.get("ops"))
        n_max = min(int(req.get("batch") or self.limits.watch_batch_max),
                    self.limits.watch_batch_max)
        wait_ms = min(int(req.get("wait_ms") or self.limits.watch_wait_ms), 60_000)
        after = req.get("after")
        if req.get("since_ms") is not None:  # from a wall-clock time: its first entry
            ms, seq = int(req["since_ms"]), req.get("since_seq")
            seq = None if seq is None else int(seq)
            try:
                g = self.e.oplog_at(ms, seq)  # None: after the last entry
            except errors.OplogTrimmed:
                arch = getattr(self, "archive", None)
                if arch is None:
                    raise
                # older than the live oplog: the set's archive (DESIGN 9); if
                # every archived entry is older, the live oplog's first
                g = arch.at(ms, seq) or self.e.oplog_info()["first"]
            start = [g.term, g.seq, -1] if g is not None else list(self.e.last()[0])
            return {"events": [], "resume": list(changes.parse_token(start))}
        if after is None:
            # from now on: on the primary after every entry committed here, so a
            # write acknowledged before the stream opened (w: 1, not yet majority)
            # is not one of its events, as MongoDB starts a stream at the newest
            # optime (its events still come once majority-committed; if that
            # entry is rolled back, the stream ends Diverged, as MongoDB's); a
            # secondary's unreplicated tail may be rolled back: its gate
            gate = self.e.last()[0] if self.primary and level == "majority" \
                else self.watch_gate(level)
            after = [0, 0] if gate is None or gate == GTID(0, 0) else list(gate)
        token = changes.parse_token(after)
        if req.get("after") is None:  # opening a stream: its start token, at once
            return {"events": [], "resume": list(token)}
        deadline = time.monotonic() + wait_ms / 1000
        self._watching += 1
        try:
            while True:
                gate = self.watch_gate(level)
                try:
                    out = changes.scan(self.e, token, gate, flt, n_max, self.member_id)
                except errors.OplogTrimmed:
                    arch = getattr(self, "archive", None)
                    if arch is None:
                        raise
                    # older than the live oplog: through the archive (DESIGN 9)
                    out = arch.scan(token, gate, flt, n_max)
                if out["events"] or out["resume"] != list(token) or self._stopping.is_set():
                    return self._fit_events(out)
                with self.majority_cond:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return out
                    if self.watch_gate(level) == gate:
                        self.majority_cond.wait(min(left, 0.05 if not self.primary
                                                    and level == "local" else left))
        finally:
            self._watching -= 1

    def _fit_events(self, out: dict) -> dict:
        """At most ``_batch_bytes`` of change events in one answer (always one):
        the rest come in the next, from the token of the last one kept. An
        answer of every event a scan found (up to ``watch_batch_max``) went
        past the frame limit with big documents, and a stream that resumed
        got the same answer again: it never moved on."""
        evs = out["events"]
        if len(evs) < 2:
            return out
        cap, size = self._batch_bytes(), 0
        for k, ev in enumerate(evs):
            size += len(codec.pack(ev))
            if size > cap and k:
                return {"events": evs[:k], "resume": list(evs[k - 1]["token"])}
        return out

    def submit_read(self, req: dict, reply: Reply, conn: dict) -> None:
        """Run a read: a point read by ``_id`` on the port's own thread when
        no write of this wake-up waits before it (no hand-off to a reader
        thread and back: two thread wake-ups and GIL hand-overs less per
        read); one after a GTID not applied yet is parked (``AppliedWaits``,
        no thread held) and runs on the reader pool once it is; anything else
        on the reader pool."""
        port = self.port_here()
        if port is not None and not port.arrived and point_read(req):
            self.port_reads += 1
            return self._read(req, reply, conn)
        if req.get("after") is not None:
            try:
                g, timeout_ms = client_limits.read_after(req, self.limits)
                if applied_point(self.e) < g:
                    return self.after_waits.park(
                        g, timeout_ms, conn,
                        lambda: self.readers.submit(self._read, req, reply, conn),
                        lambda cur: reply(err=self._not_applied(cur, g, timeout_ms)))
            except errors.RaymxError as e:
                return reply(err=e)
        self.readers.submit(self._read, req, reply, conn)

    def _not_applied(self, cur: GTID, g: GTID, timeout_ms) -> errors.ReadConcernTimeout:
        return errors.ReadConcernTimeout(
            f"member {self.member_id} has applied up to {cur}, not {g}, after "
            f"{timeout_ms} ms", applied=list(cur), wanted=list(g))

    def wait_applied(self, g: GTID, timeout_ms: int) -> None:
        """Read-after-GTID on the calling thread: block until this member has
        applied ``g`` (woken by the applied point, not polling)."""
        if applied_point(self.e) >= g:
            return
        done, out = threading.Event(), {}
        self.after_waits.park(g, timeout_ms, {}, done.set,
                              lambda cur: (out.update(err=self._not_applied(cur, g, timeout_ms)),
                                           done.set()))
        done.wait()
        if "err" in out:
            raise out["err"]
