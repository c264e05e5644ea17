"""Interactive transactions and multi-part inserts of a client connection:
what ``ShardService`` keeps per connection between frames (``SessionPath``).

A transaction (``txnBegin``) is a ``Session``: its statements queue on it and
run on the writer thread, which the transaction holds until commit, abort,
``transaction_lifetime_ms`` or ``transaction_idle_ms``. A large insert comes
in parts, decoded as they arrive and run as one statement with the last.
"""
from __future__ import annotations

import logging
import queue
import threading
import time

from raymx import errors
from raymx.actors.core import client_limits
from raymx.actors.reads import Reply
from raymx.actors.statements import WRITE_OPS, result_out, run_statement
from raymx.storage import codec
from raymx.storage.engine import WriteResult

log = logging.getLogger("raymx.shard")


class Session:
    """An interactive transaction: its statements run on the writer thread."""

    def __init__(self, sid: int, rid=None):
        self.id = sid
        self.rid = rid  # the id of the txnBegin request (see SessionPath._cancel_begin)
        self.q: queue.Queue = queue.Queue()
        self.closed = False
        self.lock = threading.Lock()

    def submit(self, req: dict, reply: Reply) -> None:
        with self.lock:
            if not self.closed:
                return self.q.put((req, reply))
        reply(err=errors.TransactionAborted(
            f"transaction {self.id} is no longer open (finished, timed out or aborted)"))

    def end(self) -> None:
        with self.lock:
            self.closed = True
        while True:
            try:
                req, reply = self.q.get_nowait()
            except queue.Empty:
                return
            reply(err=errors.TransactionAborted(f"transaction {self.id} is no longer open"))


class SessionPath:
    """``ShardService``'s per-connection state between frames (a mixin: it
    uses the service's engine, limits, writer queue, commit and reads)."""

    def _to_session(self, op: str, req: dict, reply: Reply, conn: dict) -> None:
        """``txnBegin`` opens a session (counted per connection) and queues it
        for the writer; a statement with ``txn`` goes to its open session."""
        if op == "txnBegin":
            sessions = conn.setdefault("sessions", {})
            for old in [x for x in sessions.values() if x.closed]:  # timed out
                del sessions[old.id]
            client_limits.check_transactions(sessions, self.limits)
            s = Session(next(self._ids), req.get("id"))
            sessions[s.id] = s
            return self._to_writer(("session", s, req, reply))
        s = conn.get("sessions", {}).get(req["txn"])
        if s is None:
            return reply(err=errors.TransactionAborted(
                f"transaction {req['txn']} is not open (finished, timed out or aborted)"))
        if op in ("txnCommit", "txnAbort"):
            conn["sessions"].pop(s.id, None)
        s.submit(req, reply)

    @staticmethod
    def _abort_sessions(conn: dict) -> None:
        for s in conn.get("sessions", {}).values():
            s.submit({"op": "txnAbort"}, lambda **kw: None)

    @staticmethod
    def _cancel_begin(rid, conn: dict) -> None:
        """The ``txnBegin`` request ``rid`` of this connection timed out at its
        caller, who will never learn the transaction's id: abort it (at once
        if it is still queued behind another transaction). Not answered."""
        sessions = conn.get("sessions", {})
        s = next((x for x in sessions.values() if x.rid == rid), None)
        if s is not None:  # it stays counted (transactions_per_connection_max) until it ends
            s.submit({"op": "txnAbort"}, lambda **kw: None)

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

    def _run_session(self, s: Session, req: dict, reply: Reply) -> None:
        try:
            self._session_loop(s, req, reply)
        finally:
            s.end()

    def _session_loop(self, s: Session, req: dict, reply: Reply) -> None:
        tx = self.e.begin()
        reply(ok={"txn": s.id})
        deadline = time.monotonic() + self.limits.transaction_lifetime_ms / 1000
        idle_s = self.limits.transaction_idle_ms / 1000
        while True:
            try:
                sreq, sreply = s.q.get(timeout=max(0.0, min(idle_s, deadline - time.monotonic())))
            except queue.Empty:  # it holds the writer: past its lifetime, or idle too long
                tx.abort()
                log.warning("transaction %d aborted: %s", s.id, client_limits.txn_ended_why(
                    deadline - time.monotonic(), self.limits))
                return
            op = sreq.get("op")
            try:
                if op == "txnCommit":
                    return self._commit(tx, WriteResult(), sreq, sreply)
                if op == "txnAbort":
                    tx.abort()
                    return sreply(ok={"aborted": True})
                if op in WRITE_OPS and op != "revertTo":
                    sreply(ok=result_out(run_statement(tx, sreq)))
                elif op in ("find", "count"):
                    sreply(ok=self._read_in(tx, sreq, {}))
                else:
                    sreply(err=errors.InvalidOperation(f"{op!r} is not allowed in a transaction"))
            except errors.RaymxError as e:
                sreply(err=e)
            except Exception as e:
                log.exception("transaction statement failed")
                tx.abort()
                return sreply(err=errors.TransactionAborted(f"internal error: {e}"))
