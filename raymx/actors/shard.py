"""ShardService: one oplog shard of a member, serving client requests (no Ray).

Threads (the Ray shell only starts and stops this object):

* the **writer** runs every write, one LMDB write transaction at a time, in
  arrival order; an interactive transaction holds it until commit, abort or
  ``transaction_lifetime_ms``;
* the **syncer** is group commit: it flushes LMDB once for every commit that
  happened since the last flush and then releases all ``j=True`` writers those
  commits belong to. Default writes are acknowledged after commit and are
  synced within ``sync_interval_ms``;
* a small **reader pool** runs queries on LMDB snapshots; readers never wait
  for the writer.

Every request is a dict (a decoded client frame); every answer goes to the
``reply(ok=..., err=...)`` callback, from whichever thread finished it.
"""
from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, TimeoutError as FutureTimeout
from typing import Callable

from raymx import errors
from raymx.actors.after_waits import AppliedWaits
from raymx.actors.commit import GroupCommit, WriteConcernWaiters, _mono_ms
from raymx.actors.core import client_limits
from raymx.actors.core.gtid_manager import GTIDManager
from raymx.actors.core.primary import deposed, sees_majority
from raymx.actors.ports import PortPath
from raymx.actors.reads import ReadPath, Reply, _Cursor, gtid_out  # noqa: F401
from raymx.actors.sessions import SessionPath
from raymx.actors.statements import (PACKED_OPS, READ_OPS, TXN_OPS, WRITE_OPS,  # noqa: F401
                                     result_out, run_statement)
from raymx.actors.trimming import TrimPath
from raymx.storage.engine import Engine, Transaction, WriteResult
from raymx.storage.gtid import GTID
from raymx.storage.limits import Limits, write_concern_problem

log = logging.getLogger("raymx.shard")

# how long a step-down waits for the write running on the writer (ShardService.step_down)
STEP_DOWN_WAIT_S = 30.0


class ShardService(ReadPath, TrimPath, SessionPath, PortPath):
    """Writes through one writer thread with group commit; reads on snapshots
    (``ReadPath``, raymx/actors/reads.py); interactive transactions and
    multi-part inserts (``SessionPath``, raymx/actors/sessions.py); oplog trimming (``TrimPath``,
    raymx/actors/trimming.py)."""

    def __init__(self, engine: Engine, limits: Limits, primary: bool = True,
                 on_commit: Callable[[GTID], None] | None = None,
                 on_durable: Callable[[GTID], None] | None = None,
                 member_id: int = 0, votes: dict[int, int] | None = None,
                 on_fatal: Callable[[Exception], None] | None = None,
                 timer: Callable[[int, Callable[[], None]], None] | None = None,
                 clock_ms: Callable[[], int] | None = None):
        """``timer(delay_ms, fn)`` and ``clock_ms()`` are the simulation's: with a
        timer no thread is started (the syncer, the write-concern waiters', the
        writer and the trimmer); the caller runs queued writes (``run_queued``)
        and the timers."""
        self.e = engine
        self.timer = timer
        self.wall_ms = clock_ms or (lambda: int(time.time() * 1000))
        self.mono_ms = clock_ms or _mono_ms
        self.started_ms = self.wall_ms()  # the "since" of $indexStats' counts
        self.limits = limits
        self.primary = primary
        self.member_id = member_id
        self.votes = votes or {member_id: 1}
        self.heard_ms: dict[int, int] = {}
        self.handing_over = False  # a planned step-down drains accepted writes
        # the set's topology for clients outside Ray (its shell asks the coordinator)
        self.topology_source: Callable[[], dict] = lambda: {"members": [], "primary": None}
        # the set's status (every member, lag) from its coordinator; None without one
        self.status_source: Callable[[], dict | None] = lambda: None
        # the set's planned hand-over (rs.stepDown()); None outside a set
        self.step_down_source: Callable[[float], dict] | None = None
        # why this member may not serve reads now (its shell decides), or None
        self.read_refusal: Callable[[], str | None] = lambda: None
        # commit latency histogram (metrics.CommitLatency; its shell sets it)
        self.latency = None
        # members loading a snapshot: {member: (its GTID, until ms)}, see trim_bound
        self.trim_holds: dict[int, tuple[GTID, int]] = {}
        # the majority-committed point as this member knows it (only moves up):
        # change streams deliver up to it, trimming never passes it
        self.majority_known: GTID | None = engine.range().majority
        self.majority_cond = threading.Condition()
        self._watching = 0
        self.wc = WriteConcernWaiters(self)
        self._on_commit = on_commit
        last, _ = engine.last()
        self.gm = GTIDManager(engine.term, last.seq + 1, lock=threading.Lock())
        self.group = GroupCommit(engine, self.gm, limits.sync_interval_ms,
                                 self._durable_hook(on_durable), on_fatal, timer)
        self.group.reset(last if last.seq else None)
        self.group.eager = len(self.votes) > 1
        self._q: queue.Queue = queue.Queue()
        # the writer: its thread, or the port's thread for small writes (_drain)
        # (_q.unfinished_tasks: items queued for the writer thread, not yet run)
        self._wlock = threading.Lock()
        # the ports serving this service (the client port, the MongoDB wire
        # port); each port's .arrived: the writes of its loop's current wake-up
        self._ports: tuple = ()
        self._ids = itertools.count(1)
        self._cursors: dict[int, _Cursor] = {}
        self._cursors_busy: dict[int, _Cursor] = {}  # in a getMore (out of the table)
        self._cursors_lock = threading.Lock()
        # a remap of the store's map (it grew) waits for every open snapshot
        # of this process: idle cursors are closed for it (reads.py)
        self._unhook_remap = engine.store.on_remap(self._release_for_remap)
        # open interactive transactions (sessions.py): by id, and the documents
        # each wrote ({key in docs: its Session}); both only on the writer
        self._txns: dict = {}
        self._txn_locks: dict = {}
        self.writes_waiting = 0  # plain writes waiting for a transaction to end (_park)
        self.transactions_expired = 0  # ended past their lifetime or idle limit (_expired)
        self._txns_swept = self.mono_ms() / 1000
        self._unhook_remap_txns = engine.store.on_remap(self._release_txns)
        self._unwritten: list[GTID] = []  # taken GTIDs whose n entry waits (_write_noop)
        self._cursors_swept = time.monotonic()
        self.readers = ThreadPoolExecutor(4, thread_name_prefix="raymx-reader")
        # reads after a GTID not applied yet wait here, holding no reader
        self.after_waits = AppliedWaits(engine.applied_point, limits.after_waits_per_connection_max)
        self.commits = 0
        self.write_groups = 0  # LMDB transactions that carried several queued writes
        self.port_writes = 0   # writes run on the client port's thread (see _drain)
        self.port_reads = 0    # point reads run there (see submit_read)
        self.watchers = ThreadPoolExecutor(32, thread_name_prefix="raymx-watch")
        self.oplog_cap = {"max_bytes": limits.oplog_bytes_max, "max_age_s": None, "force": False}
        self.trim = {"trimmed": 0, "txns": 0, "max_txn_entries": 0, "max_txn_ms": 0.0, "ms": 0.0,
                     "held_by": None, "bound": None, "last_error": None}
        self._stopping = threading.Event()
        self._trim_wake = threading.Event()
        self.ttl = {"deleted": 0, "passes": 0, "last_error": None}  # the TTL monitor
        self._ttl_next = time.monotonic() + limits.ttl_interval_ms / 1000
        self._threads = [] if timer is not None else [
            threading.Thread(target=fn, name=name, daemon=True)
            for fn, name in ((self._trim_loop, "raymx-trimmer"), (self._write_loop, "raymx-writer"))]
        for t in self._threads:
            t.start()

    def _durable_hook(self, on_durable):
        def hook(g):
            self.wc.update(self.member_id, g)
            if self._watching:
                with self.majority_cond:  # non-majority change streams wait on this
                    self.majority_cond.notify_all()
            if on_durable is not None:
                on_durable(g)
        return hook

    def set_positions(self, durable: dict[int, GTID | None],
                      heard_ms: dict[int, int] | None = None) -> None:
        """Other members' durable positions, as the feeder learned them from pulls."""
        for m, g in durable.items():
            if m != self.member_id:
                self.wc.update(m, g)
        for m, at in (heard_ms or {}).items():
            if at > self.heard_ms.get(m, 0):
                self.heard_ms[m] = at

    def note_majority(self, g: GTID | None) -> None:
        """A newer majority-committed point (from write-concern positions on the
        primary, from the sync source on a secondary): wake change streams."""
        if g is None:
            return
        with self.majority_cond:
            if self.majority_known is None or g > self.majority_known:
                self.majority_known = g
                self.majority_cond.notify_all()

    def on_writer(self, fn) -> Future:
        """Run ``fn()`` on the writer thread, between writes; its result in a Future."""
        f: Future = Future()
        self._q.put(("call", fn, None, f))
        return f

    def set_votes(self, votes: dict[int, int]) -> None:
        """Reconfiguration: majorities follow the new membership at once."""
        self.votes = dict(votes)
        self.wc.set_votes(self.votes)
        self.group.eager = len(self.votes) > 1
        for m in votes:
            self.heard_ms.setdefault(m, self.wall_ms())

    def sees_majority(self, now_ms: int) -> bool:
        """Can this primary still reach a majority of voting members (itself included)?"""
        return sees_majority(self.votes, self.heard_ms, self.member_id, now_ms,
                             self.limits.heartbeat_timeout_ms)

    def become_primary(self, term: int) -> None:
        """Accept writes under ``term`` (already durable), continuing the seq."""
        last, _ = self.e.last()
        self.gm = GTIDManager(term, last.seq + 1, lock=threading.Lock())
        self.group._gm = self.gm
        self.e.sync()  # what this member wrote as a secondary: durable before any write
        self.group.reset(last if last.seq else None)
        self._unwritten.clear()  # n entries a past term owed: the oplog moved on without them
        # its own position is known now (synced above), not at its next write
        self.wc.reset(self.member_id, last)
        self.heard_ms = {m: self.wall_ms() for m in self.votes}  # grace period
        self.handing_over = False
        self.primary = True

    def hand_over(self, timeout_s: float) -> bool:
        """A planned step-down: refuse new writes with NotPrimary (never run, so
        drivers retry them on the next primary) and wait, up to ``timeout_s``,
        until the writes already accepted have run and their write concerns are
        answered. True if they all were (``step_down`` then fails none)."""
        self.handing_over = True
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.wc.waiting() and not self._arriving() and not self._q.unfinished_tasks \
                    and not self._wlock.locked():
                return True
            time.sleep(0.002)
        return False

    def step_down(self) -> None:
        """No more writes; writes still waiting for acknowledgements fail now.

        Their outcome is unknown (a new primary may or may not hold them), and
        positions reported to a deposed primary must never acknowledge them
        later: the entry may be rolled back here while others hold another
        branch past the same seq.

        It takes the writer's turn to say so: a write that passed its
        ``_deposed`` check commits before this returns, never after. A
        secondary's oplog grows only by what its sync source confirmed, so
        its reads are of that branch; an entry of its own after the producer
        confirmed its position would be read until a pull found it diverged.
        """
        took = self._wlock.acquire(timeout=STEP_DOWN_WAIT_S)
        if not took:
            log.warning("member %d steps down while a write still runs after %g s; it "
                        "is rolled back if the new primary lacks it", self.member_id,
                        STEP_DOWN_WAIT_S)
        try:
            self.primary = False
        finally:
            if took:
                self._wlock.release()
        self.handing_over = False
        self.wc.step_down(self.member_id)
        self.on_writer(self._abort_txns)  # open transactions end, as MongoDB aborts them

    # --- dispatch --------------------------------------------------------
    def request(self, req: dict, conn: dict, timeout_s: float) -> dict:
        """One request through ``handle``, waited for on this thread: its
        answer, or its error raised (``RequestTimeout`` past ``timeout_s``).
        The wire port's translated requests and the member's own writes (the
        TTL monitor's deletes) go this way."""
        f: Future = Future()

        def reply(ok=None, err=None):
            if not f.done():
                f.set_result((ok, err))
        self.handle(req, reply, conn)
        try:
            ok, err = f.result(timeout_s)
        except FutureTimeout:
            raise errors.RequestTimeout(f"{req.get('op')} got no answer in {timeout_s:g} s") \
                from None
        if err is not None:
            raise err
        return ok

    def handle(self, req: dict, reply: Reply, conn: dict) -> None:
        """Route one request. ``conn`` is per-connection state (cursors, sessions)."""
        op = req.get("op")
        client_limits.check_shape(req)  # InvalidOperation naming the field
        client_limits.check_nesting(req, self.limits)  # InvalidFilter / InvalidUpdate
        if op in PACKED_OPS and "packed" in req:
            req = self._receive_insert(req, reply, conn)
            if req is None:
                return
        if op in WRITE_OPS or op in TXN_OPS or "txn" in req:
            if op == "txnBegin" and req.get("cancel"):  # its caller gave up waiting
                return self._cancel_begin(req.get("id"), conn)
            problem = write_concern_problem(req.get("w"), req.get("j"), req.get("wtimeout_ms"))
            if problem is not None:
                return reply(err=errors.InvalidOperation(f"{op}: {problem}; nothing was written"))
            if self.group.failed is not None:  # the member stops (see GroupCommit._sync)
                return reply(err=self.group.failed)
            if not self.primary or self.handing_over:
                return reply(err=errors.NotPrimary(
                    f"member {self.member_id} is not the primary" + (
                        " (it is handing the role over)" if self.primary else ""),
                    member=self.member_id))
            if not self.sees_majority(self.wall_ms()):
                # A primary cut off from the majority stops taking writes within
                # the heartbeat timeout; the majority side elects a new one.
                return reply(err=errors.NotPrimary(
                    f"member {self.member_id} cannot reach a majority", member=self.member_id))
            if self.latency is not None:  # times it from here to its acknowledgement
                reply = self.latency.timed(op, req, reply)
            if op == "txnBegin" or "txn" in req:
                self._to_session(op, req, reply, conn)
            else:
                self._to_writer(("write", None, req, reply))
        elif op in READ_OPS or op == "watch":
            if req.get("rp") == "primary" and not self.primary:
                return reply(err=errors.NotPrimary(
                    f"member {self.member_id} is not the primary (a read with read "
                    "preference primary)", member=self.member_id))
            why = self.read_refusal() if op != "killCursors" else None
            if why is not None:
                # a member whose data may still be rolled back or replaced (its
                # position unconfirmed, a resync due, a snapshot loading) serves
                # nothing: the driver tries another member
                return reply(err=errors.NotPrimaryOrSecondary(
                    f"member {self.member_id} is {why}: it serves no reads until a sync "
                    "source confirms its data; read from another member",
                    member=self.member_id, state=why))
            if op == "watch":
                self.watchers.submit(self._watch, req, reply)
            else:
                self.submit_read(req, reply, conn)
        elif op == "topology":  # clients outside Ray learn the set's members here
            self.readers.submit(self._topology, reply)
        else:
            reply(err=errors.InvalidOperation(f"unknown operation {op!r}"))

    def connection_closed(self, conn: dict) -> None:
        self._abort_sessions(conn)
        with self._cursors_lock:  # a find still running keeps no cursor now (_read)
            conn["closed"] = True
            cids = list(conn.get("cursors", ()))
        for cid in cids:
            self._close_cursor(cid)

    # --- writes ----------------------------------------------------------
    def _write_loop(self):
        q, held = self._q, []
        while self._write_step(q.get, held):
            pass

    def run_queued(self) -> None:
        """Run every queued write now, on the calling thread (no writer thread:
        the simulation)."""
        held: list = []
        while held or not self._q.empty():
            self._write_step(self._q.get_nowait, held)

    def _write_step(self, get, held: list) -> bool:
        """One turn of the writer: the next item, with the writes queued behind
        it as one group. False at the stop mark."""
        q = self._q
        item = held.pop() if held else get()
        if item is None:
            return False
        items = [item]
        if item[0] == "write":  # the writes queued at this moment share one LMDB commit
            while len(items) < self.limits.write_group_max:
                try:
                    nxt = q.get_nowait()
                except queue.Empty:
                    break
                if nxt is None or nxt[0] != "write":
                    held.append(nxt)
                    break
                items.append(nxt)
        with self._wlock:
            self._run_safely(items)
        for _ in items:
            q.task_done()
        return True

    def _run_safely(self, items: list) -> None:
        """``_run_items``; an error that escapes it is a bug: logged, and the
        thread running writes (the writer's or the port's) lives on."""
        try:
            self._run_items(items)
        except Exception:
            log.exception("running %d write(s) failed", len(items))

    def _run_items(self, items: list) -> None:
        """Run writer items (with ``_wlock`` held): writes, one session, or a call."""
        if self._unwritten and not self._settle_unwritten(items):
            return
        if len(items) > 1:
            return self._write_group(items)
        kind, sess, req, reply = items[0]
        if kind == "call":  # internal work between writes (trimming): a Future
            try:
                reply.set_result(sess())
            except BaseException as e:
                reply.set_exception(e)
            return
        try:
            if kind == "txn":
                self._txn_step(sess, req, reply)
            else:
                tx = self.e.begin(autocommit=True)
                try:
                    res = run_statement(tx, req)
                    holder = self._waits_for(tx)
                except BaseException:
                    tx.abort()
                    raise
                if holder is not None:
                    tx.abort()
                    return self._park(holder, items[0])
                self._commit(tx, res, req, reply)
        except Exception as e:
            reply(err=self._write_error(e, req))

    def _write_noop(self, g: GTID) -> None:
        """``g`` was taken by a commit that failed: an ``n`` entry keeps seqs
        dense. If that cannot be written either (the disk failed), ``g`` stays
        live (nothing past it becomes replicatable) and is written before the
        next write takes a GTID (``_settle_unwritten``)."""
        if not self._unwritten:
            try:
                self.e.write_noop(g)
                self._noop_done(g)
                return
            except errors.DiskFull as e:  # expected while the disk or map is full
                log.warning("the n entry of %s could not be written; it is written before "
                            "the next write: %s", g, e)
            except Exception:
                log.exception("the n entry of %s could not be written; it is written "
                              "before the next write", g)
        self._unwritten.append(g)

    def _settle_unwritten(self, items: list) -> bool:
        """Write the held ``n`` entries (in order, before anything else takes a
        GTID). False if the oplog still cannot be written: then ``items`` are
        answered with that error, nothing of them written. A member no longer
        the primary of their term drops them: nothing was written at their
        GTIDs, and its oplog moves on by its sync source's entries only."""
        if not self._unwritten:
            return True
        if not self._owes_unwritten():
            log.info("member %d drops the n entries of %s: it is no longer their term's "
                     "primary", self.member_id, ", ".join(map(str, self._unwritten)))
            self._unwritten.clear()
            return True
        try:
            while self._unwritten:
                self.e.write_noop(self._unwritten[0])
                self._noop_done(self._unwritten.pop(0))
            return True
        except Exception as e:
            err = e if isinstance(e, errors.DiskFull) else errors.RaymxError(
                f"the oplog cannot be written ({type(e).__name__}: {e}); nothing was written")
        for kind, sess, req, reply in items:
            if kind == "call":
                reply.set_exception(err)
            else:
                reply(err=err)
                if kind == "txn":
                    self._end_txn(sess, abort=True)
        return False

    def _owes_unwritten(self) -> bool:
        """Still the primary of the held ``n`` entries' term (not deposed)."""
        return self._deposed() is None and self._unwritten[0].term == self.gm.term

    def _noop_done(self, g: GTID) -> None:
        """The ``n`` entry of a failed write committed at ``g``: the syncer makes
        it durable, so it ships. Without that, while every later write is
        refused (a full disk), the primary held an entry no other member
        could get, and no member with room was as advanced as it."""
        self.gm.done(g)
        self.group.note_commit(g)

    @staticmethod
    def _write_error(e: Exception, req: dict) -> errors.RaymxError:
        if isinstance(e, errors.RaymxError):
            return e
        log.exception("write %s failed", req.get("op"))  # a bug: answer, log, keep serving
        return errors.RaymxError(f"internal error: {type(e).__name__}: {e}")

    def _deposed(self, tx: Transaction | None = None) -> errors.NotPrimary | None:
        """NotPrimary if this member may no longer write (checked before a GTID
        is taken). ``tx``: the open write transaction, which reads the durable
        term without a transaction of its own."""
        term = self.e.term if tx is None else self.e.term_in(tx.t)
        if deposed(self.primary, term, self.gm.term):
            self.primary = False
            return errors.NotPrimary(f"member {self.member_id} was deposed (a higher term "
                                     "exists); nothing was written", member=self.member_id)
        return None

    def _commit(self, tx: Transaction, res, req: dict, reply: Reply) -> None:
        if tx.nops == 0:
            tx.commit()
            if self._answer_unchanged(res, req, reply):
                self.group.sync_now()
            return
        err = self._deposed(tx)
        if err is not None:
            tx.abort()
            return reply(err=err)
        g = self.gm.allocate()
        try:
            tx.commit(g)
        except BaseException:
            self._write_noop(g)  # the GTID is taken: an n entry keeps seqs dense
            raise
        self.gm.done(g)
        if self._acknowledge(g, res, req, reply):
            self.group.sync_now()

    def _write_group(self, group: list) -> None:
        """Run queued autocommit writes in one LMDB transaction, one GTID each.

        A statement that fails is undone alone (its child transaction) and
        answered at once; the others are answered after the one commit. If that
        commit fails, nothing of the group is stored and every GTID it took
        becomes an ``n`` entry, as for a single failed commit.
        """
        grp = self.e.begin_group()
        sealed = []  # (GTID or None, result or error, req, reply)
        try:
            for item in group:
                _, _, req, reply = item
                tx = grp.statement()
                holder = None
                try:
                    res = run_statement(tx, req)
                    holder = self._waits_for(tx)
                    err = None if tx.nops == 0 or holder else self._deposed(tx)
                except Exception as e:
                    res, err = None, self._write_error(e, req)
                if holder is not None:
                    tx.abort()
                    self._park(holder, item)
                    continue
                if err is not None:
                    tx.abort()
                    reply(err=err)
                    continue
                if tx.nops == 0:
                    tx.commit()
                    sealed.append((None, res, req, reply))
                    continue
                g = self.gm.allocate()
                try:
                    tx.commit(g)
                    sealed.append((g, res, req, reply))
                except Exception as e:
                    sealed.append((g, self._write_error(e, req), req, reply))
                    grp.noop(g)  # the GTID is taken: an n entry keeps seqs dense
            grp.commit()
        except BaseException as e:
            grp.abort()
            for g, *_ in sealed:
                if g is not None:
                    self._write_noop(g)
            if not isinstance(e, Exception):
                raise
            err = self._write_error(e, {"op": "write group"})
            for _, _, _, reply in sealed:
                reply(err=err)
            return
        for g, *_ in sealed:
            if g is not None:
                self.gm.done(g)
        self.write_groups += 1
        flush = False
        for g, res, req, reply in sealed:
            if isinstance(res, Exception):
                reply(err=res)
                if g is not None:  # its n entry (grp.noop)
                    self.group.note_commit(g)
            elif g is None:
                flush |= self._answer_unchanged(res, req, reply)
            else:
                try:
                    flush |= self._acknowledge(g, res, req, reply)
                except Exception as e:  # a bug: this write alone is answered with it
                    reply(err=self._write_error(e, req))
        if flush:
            self.group.sync_now()

    def _answer_unchanged(self, res, req: dict, reply: Reply) -> bool:
        """A write that changed nothing (no GTID): with ``j`` or ``w`` > 1 it is
        answered once what it saw, the last commit, is as durable as asked
        (as MongoDB waits for the last optime). True if the caller flushes."""
        last = self.group.committed
        if last is None:  # nothing committed: nothing to wait for
            reply(ok=result_out(res))
            return False
        return self._answer_when(last, result_out(res), req, reply)

    def _acknowledge(self, g: GTID, res, req: dict, reply: Reply) -> bool:
        """A write committed at ``g``: answer now, or once its write concern holds.
        True if it waits for a flush, which the caller (the writer) then runs:
        group commit without a hand-off to the syncer."""
        self.commits += 1
        if isinstance(res, WriteResult):
            res.gtid = g
        out = result_out(res)
        if not isinstance(res, WriteResult):
            out["gtid"] = gtid_out(g)
        if self._on_commit is not None:
            self._on_commit(g)
        self.after_waits.kick(g)  # reads after g (applied as it committed) may run
        # a write that waits (j, or w > 1: durable here too) has the writer flush
        self.group.note_commit(g, wake=not (req.get("j") or req.get("w", 1) not in (0, 1, None)))
        return self._answer_when(g, out, req, reply)

    def _answer_when(self, g: GTID, out: dict, req: dict, reply: Reply) -> bool:
        """Answer ``out`` once ``g`` holds the request's write concern: now, or
        (True) after a flush the caller runs, then acknowledgements for w > 1."""
        w = req.get("w", 1)
        if w not in (0, 1, None):
            self.wc.wait(g, w, req.get("wtimeout_ms"), lambda: reply(ok=out),
                         lambda e: reply(err=e))
            return True
        if req.get("j"):
            return self.group.when_durable(g, lambda: reply(ok=out), lambda e: reply(err=e))
        reply(ok=out)
        return False

    # --- the primary's own no-ops (a new term; a linearizable read) -------
    def own_noop(self) -> GTID:
        """On the writer: an n entry under this primary's term, synced now.
        A new primary writes one at once (``MemberCore.became_primary``); a
        linearizable read writes one to confirm its primacy."""
        err = self._deposed()
        if err is not None:
            raise err
        if not self._settle_unwritten([]):
            raise errors.NotPrimary(f"member {self.member_id} cannot write its oplog")
        g = self.gm.allocate()
        try:
            self.e.write_noop(g)
        except BaseException:
            self._unwritten.append(g)  # written before the next write takes a GTID
            raise
        self.gm.done(g)
        self.group.note_commit(g, wake=False)
        self.group.sync_now()
        return g

    def confirm_primary(self, timeout_ms: int) -> None:
        """A linearizable read's last step: write a no-op entry under this term
        and wait until a majority of voters hold it durably. A deposed primary
        (even one that does not know it yet) never gets that, since members
        that know a newer term acknowledge nothing of an older one; and every
        entry before the no-op (all the read saw) is then majority-committed."""
        try:
            g = self.on_writer(self.own_noop).result(timeout_ms / 1000)
        except TimeoutError:  # the writer is busy or stuck (a full disk)
            raise errors.ReadConcernTimeout(
                f"member {self.member_id} could not write the no-op that confirms it is "
                f"still the primary within {timeout_ms} ms: the linearizable read is not "
                "answered") from None
        done, out = threading.Event(), {}
        self.wc.wait(g, "majority", timeout_ms, done.set,
                     lambda e: (out.update(err=e), done.set()))
        if not done.wait(timeout_ms / 1000 + 1) or "err" in out:
            e = out.get("err")
            if isinstance(e, errors.NotPrimary):  # said of the no-op: say it of the read
                raise errors.NotPrimary(
                    f"member {self.member_id} stopped being the primary before a majority "
                    f"confirmed it (its no-op {g} was not acknowledged under its term): the "
                    "linearizable read is not answered", member=self.member_id) from None
            raise errors.ReadConcernTimeout(
                f"member {self.member_id} could not confirm with a majority within "
                f"{timeout_ms} ms that it is still the primary: the linearizable read is "
                "not answered", gtid=list(g))


    # --- state -----------------------------------------------------------
    def status(self) -> dict:
        last, _ = self.e.last()
        return {"term": self.gm.term, "last": gtid_out(last),
                "durable": gtid_out(self.group.durable),
                "replicatable": gtid_out(self.gm.replicatable()),
                "commits": self.commits, "syncs": self.group.syncs,
                "write_groups": self.write_groups, "port_writes": self.port_writes,
                "port_reads": self.port_reads,
                "majority": gtid_out(self.wc.majority_point()) if self.primary else None,
                "majority_known": gtid_out(self.majority_known),
                "open_cursors": len(self._cursors) + len(self._cursors_busy),
                "open_transactions": len(self._txns),
                "writes_waiting_for_transactions": self.writes_waiting,
                "transactions_expired": self.transactions_expired,
                "after_waits": self.after_waits.counters(), "ttl": dict(self.ttl)}

    def close(self) -> None:
        self._stopping.set()
        self._trim_wake.set()
        self.wc.stop()
        with self.majority_cond:
            self.majority_cond.notify_all()
        self.watchers.shutdown(wait=False, cancel_futures=True)
        self._q.put(None)
        for t in self._threads:  # the trimmer, then the writer (after the stop mark)
            t.join(10)
        self.group.stop()
        self.after_waits.stop()
        self.readers.shutdown(wait=True)
        self._unhook_remap()
        self._unhook_remap_txns()
        self._abort_txns()  # the writer has stopped: their snapshots end
        for cid in list(self._cursors):
            self._close_cursor(cid)
        if self.group.failed is None:  # after a failed sync, never another
            self.e.sync()

