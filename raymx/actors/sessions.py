"""Interactive transactions and multi-part inserts of a client connection:
what ``ShardService`` keeps per connection between frames (``SessionPath``).

A transaction (``txnBegin``) is a ``Session``: an optimistic transaction of
the engine (it reads a snapshot and keeps its writes in memory; its commit
fails with ``WriteConflict`` if another commit changed what it wrote). Its
steps run on the writer one at a time, each holding the writer only while it
runs; it ends at commit, abort, ``transaction_lifetime_ms`` or
``transaction_idle_ms``. A large insert comes in parts, decoded as they
arrive and run as one statement with the last.
"""
from __future__ import annotations

import logging

from raymx import errors
from raymx.actors.core import client_limits
from raymx.actors.reads import Reply
from raymx.actors.statements import WRITE_OPS, result_out, run_statement
from raymx.storage import codec
from raymx.storage.engine import WriteResult

log = logging.getLogger("raymx.shard")


class Session:
    """An interactive transaction of a connection: an optimistic engine
    transaction (``Engine.begin_snapshot``) once its ``txnBegin`` ran. Every
    step (begin, statement, commit, abort) is a writer item, so a
    transaction's steps run in order and one at a time with every other
    write, but it holds the writer only for the step: other writes and
    transactions run between them."""

    def __init__(self, sid: int, rid=None, conn: dict | None = None):
        self.id = sid
        self.rid = rid  # the id of the txnBegin request (see SessionPath._cancel_begin)
        self.conn = {} if conn is None else conn  # the state it lives in (its reads' killOp)
        self.tx = None  # the engine transaction, from its begin to its end
        self.closed = False
        self.deadline = self.used = 0.0  # seconds of the service's clock (mono_ms)
        self.locked: list[bytes] = []  # documents' keys it wrote (the member's _txn_locks)
        self.waiting: list[tuple] = []  # writer items of plain writes waiting for its end


class SessionPath:
    """``ShardService``'s per-connection state between frames (a mixin: it
    uses the service's engine, limits, writer queue, commit and reads)."""

    def _to_session(self, op: str, req: dict, reply: Reply, conn: dict) -> None:
        """``txnBegin`` opens a session (counted per connection); it and each
        statement, commit or abort of an open one go to the writer in turn."""
        if op == "txnBegin":
            sessions = conn.setdefault("sessions", {})
            for old in [x for x in sessions.values() if x.closed]:  # timed out
                del sessions[old.id]
            client_limits.check_transactions(sessions, self.limits)
            s = Session(next(self._ids), req.get("id"), conn)
            sessions[s.id] = s
            return self._to_writer(("txn", s, req, reply))
        s = conn.get("sessions", {}).get(req["txn"])
        if s is None:
            return reply(err=self._not_open(req["txn"]))
        if op in ("txnCommit", "txnAbort"):
            conn["sessions"].pop(s.id, None)
        self._to_writer(("txn", s, req, reply))

    @staticmethod
    def _not_open(sid) -> errors.TransactionAborted:
        return errors.TransactionAborted(
            f"transaction {sid} is not open (finished, timed out or aborted)")

    def _abort_sessions(self, conn: dict) -> None:
        for s in conn.get("sessions", {}).values():
            self._to_writer(("txn", s, {"op": "txnAbort"}, lambda **kw: None))

    def _cancel_begin(self, rid, conn: dict) -> None:
        """The ``txnBegin`` request ``rid`` of this connection timed out at its
        caller, who will never learn the transaction's id: abort it (once
        its begin has run). Not answered."""
        sessions = conn.get("sessions", {})
        s = next((x for x in sessions.values() if x.rid == rid), None)
        if s is not None:  # it stays counted (transactions_per_connection_max) until it ends
            self._to_writer(("txn", s, {"op": "txnAbort"}, lambda **kw: None))

    # --- on the writer ----------------------------------------------------
    def _txn_step(self, s: Session, req: dict, reply: Reply) -> None:
        """One step of transaction ``s`` (the writer held for it alone)."""
        op = req.get("op")
        now = self.mono_ms() / 1000
        self._expire_txns(now)
        if op == "txnBegin":
            if s.closed:  # aborted before it began (its caller gave up)
                return
            if len(self._txns) >= self.limits.transactions_max:
                s.closed = True
                return reply(err=errors.LimitExceeded(
                    f"{len(self._txns)} transactions are open on this member, the most "
                    f"allowed (Limits.transactions_max = {self.limits.transactions_max}): "
                    "retry once some have ended", limit="transactions_max",
                    max=self.limits.transactions_max))
            s.tx = self.e.begin_snapshot()
            s.deadline, s.used = now + self.limits.transaction_lifetime_ms / 1000, now
            self._txns[s.id] = s
            return reply(ok={"txn": s.id})
        if s.closed or s.tx is None:
            s.closed = True
            return reply(err=self._not_open(s.id))
        if self._expired(s, now):
            return reply(err=self._not_open(s.id))
        s.used = now
        try:
            if op == "txnAbort":
                self._end_txn(s, abort=True)
                return reply(ok={"aborted": True})
            if op == "txnCommit":
                self._end_txn(s)
                s.tx.take_writer()  # WriteConflict: aborted
                return self._commit(s.tx, WriteResult(), req, reply)
            if op in WRITE_OPS and op != "revertTo":
                res = run_statement(s.tx, req)
                self._lock_written(s)
                reply(ok=result_out(res))
            elif op in ("find", "count", "distinct"):
                reply(ok=self._read_in(s.tx, req, s.conn))
            else:
                reply(err=errors.InvalidOperation(f"{op!r} is not allowed in a transaction"))
        except errors.WriteConflict as e:
            self._end_txn(s, abort=True)
            reply(err=e)
        except errors.RaymxError as e:
            if op == "txnCommit":
                s.tx.abort()
            reply(err=e)
        except Exception as e:
            log.exception("transaction step %s failed", op)
            self._end_txn(s, abort=True)
            reply(err=errors.TransactionAborted(f"internal error: {e}"))

    def _lock_written(self, s: Session) -> None:
        """The documents a statement of ``s`` wrote are its own until it ends:
        a statement of another open transaction writing one fails with
        ``WriteConflict`` (and its transaction is aborted), at once, as in
        MongoDB; the first writer keeps it. A write outside transactions
        that writes one waits until ``s`` ends (``_waits_for``), as in
        MongoDB; one that committed before ``s`` wrote the document makes
        the commit of ``s`` fail."""
        fresh = s.tx.t.fresh
        if not fresh:
            return
        locks, now = self._txn_locks, self.mono_ms() / 1000
        for key in fresh:
            holder = locks.get(key)
            if holder is not None and holder is not s and self._expired(holder, now):
                holder = None  # it ran out of time: aborted now, its documents free
            if holder is None:
                locks[key] = s
                s.locked.append(key)
            elif holder is not s:
                fresh.clear()
                raise errors.WriteConflict(
                    f"transaction {holder.id} has written a document this statement writes "
                    "and has not ended; this transaction is aborted: run it again")
        fresh.clear()

    def _end_txn(self, s: Session, abort: bool = False) -> None:
        """``s`` ends: out of the open table, its documents unlocked (and its
        engine transaction aborted with ``abort``); the plain writes that
        waited for it go to the writer again, in the order they came."""
        s.closed = True
        self._txns.pop(s.id, None)
        locks = self._txn_locks
        for key in s.locked:
            if locks.get(key) is s:
                del locks[key]
        s.locked = []
        if abort and s.tx is not None:
            s.tx.abort()
        waiting, s.waiting = s.waiting, []
        self.writes_waiting -= len(waiting)
        for item in waiting:
            self._q.put(item)

    def _waits_for(self, tx) -> Session | None:
        """The open transaction holding a document that the plain write just
        run in ``tx`` (not committed) wrote: that write waits until it ends,
        as a write outside a transaction waits for a transaction's document
        lock in MongoDB. None: it goes ahead (no transaction holds one; or
        the write changed too many documents to tell, and then a transaction
        holding one of them fails at its commit)."""
        locks = self._txn_locks
        if not locks:
            return None
        keys = tx.t.written("docs")
        now = self.mono_ms() / 1000
        for key in keys or ():
            s = locks.get(key)
            if s is not None and not self._expired(s, now):
                return s
        return None

    def _park(self, s: Session, item: tuple) -> None:
        """Writer item ``item`` (a plain write, undone) runs again once ``s``
        ends. An expired ``s`` ends at the next sweep (``_sweep_txns``)."""
        s.waiting.append(item)
        self.writes_waiting += 1

    def sweep_waiting_writes(self) -> None:
        """A round of the trimmer's (once a second; the simulation's timer):
        while plain writes wait for transactions, the writer ends those past
        their limits, and the writes waiting for them run."""
        if self.writes_waiting:
            self.on_writer(self._sweep_txns)

    def _sweep_txns(self) -> None:
        """On the writer: open transactions past their limits end, and the
        writes waiting for them run."""
        if self.writes_waiting:
            self._expire_txns(self.mono_ms() / 1000)

    def _expire_txns(self, now: float) -> None:
        """Abort the transactions past ``transaction_lifetime_ms`` or idle past
        ``transaction_idle_ms`` (looked at most once a second, at a step of
        any transaction): their snapshots and documents are released."""
        if now < self._txns_swept + 1.0:
            return
        self._txns_swept = now
        for s in list(self._txns.values()):
            self._expired(s, now)

    def _expired(self, s: Session, now: float) -> bool:
        """True (and ``s`` aborted) if ``s`` is past its lifetime or idle limit."""
        if now <= s.deadline and now - s.used <= self.limits.transaction_idle_ms / 1000:
            return False
        log.warning("transaction %d aborted: %s", s.id,
                    client_limits.txn_ended_why(s.deadline - now, self.limits))
        self.transactions_expired += 1
        self._end_txn(s, abort=True)
        return True

    def _abort_txns(self) -> None:
        """Every open transaction ends, aborted (the member stepped down)."""
        for s in list(self._txns.values()):
            self._end_txn(s, abort=True)

    def _release_txns(self) -> None:
        """The store's map is being remapped and waits for this process's
        snapshots: the open transactions' are ended (each is aborted; its next
        step says so). Runs on the resizing thread: it waits briefly for the
        writer, and leaves them if a step holds it."""
        if not self._wlock.acquire(timeout=0.05):
            return
        try:
            open_ = len(self._txns)
            self._abort_txns()
        finally:
            self._wlock.release()
        if open_:
            log.warning("%d open transaction(s) aborted: the store's map grew and its remap "
                        "waits for every open snapshot of this process", open_)

    def _receive_insert(self, req: dict, reply: Reply, conn: dict) -> dict | None:
        """Decode an insert's documents as they arrive. A large insert comes in
        parts: frames with ``more`` and the same id, unanswered, each decoded
        while the driver packs the next; its last frame runs the statement over
        all of them (nothing is written before). A ``cancel`` frame drops what
        came (the driver could not pack a document). None: nothing to run now."""
        verdict = client_limits.insert_part(conn, req.get("id"), bool(req.get("more")),
                                            bool(req.get("cancel")), self.limits)
        if verdict is not None:  # a part of a refused insert, or the refusal itself
            return None if verdict is client_limits.DROP else reply(err=verdict)
        held = conn.get("inserts")
        got = None if held is None else held.pop(req.get("id"), None)
        if req.get("cancel"):
            return None
        if not isinstance(got, errors.RaymxError):
            try:
                part = codec.unpack_documents(req["packed"], self.limits.document_bytes_max,
                                              0 if got is None else len(got))
                got = part if got is None else got.extend(part)
                if got.nbytes > self.limits.transaction_bytes_max:
                    raise errors.TransactionTooLarge(
                        f"insert of {got.nbytes} bytes so far exceeds the transaction limit "
                        f"of {self.limits.transaction_bytes_max}")
            except Exception as e:  # answered when the last part comes; the parts between are dropped
                got = e if isinstance(e, errors.RaymxError) else self._write_error(e, req)
        if req.get("more"):
            conn.setdefault("inserts", {})[req.get("id")] = got
            return None
        if isinstance(got, errors.RaymxError):
            reply(err=got)
            return None
        return dict(req, packed=got)
