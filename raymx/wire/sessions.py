"""Driver sessions on the wire port: multi-document transactions
(``startTransaction`` ... ``commitTransaction``, each mapped to one member
transaction) and retryable writes. Both keep the session's record in
``config.transactions`` (``{_id: lsid, n: txnNumber, ...}``), written in the
same member transaction as what it records, so it replicates with it: a
retry, here or on the next primary after a failover, is answered from the
record instead of being applied again.
"""
from __future__ import annotations

import threading
import uuid

import bson

from raymx import errors
from raymx.actors.statements import RETRY_NS  # lsid -> the session's last record
from raymx.wire.crud import again_on_conflict, call, steps_of, wc_fields
from raymx.wire.errors import CommandError, bad_value, write_concern_error
from raymx.wire.framing import CODEC


def _sid(v) -> bytes:
    """A session id (a UUID, binary subtype 4) as bytes."""
    return v.bytes if isinstance(v, uuid.UUID) else bytes(v)


# commands that only read, in a transaction (an aggregate reads unless it ends
# with $out or $merge): a transaction of only these commits without a record
_TXN_READS = {"find", "getmore", "count", "distinct", "killcursors"}


# the commands a transaction may hold, as MongoDB's (count too, which raymx
# runs in the transaction's snapshot): each runs through the transaction
# (crud._txn_of); any other is refused (OperationNotSupportedInTransaction)
IN_TXN = {"find", "getmore", "killcursors", "insert", "update", "delete", "findandmodify",
          "aggregate", "distinct", "count", "create", "createindexes", "committransaction",
          "aborttransaction"}


def not_in_transactions(name: str):
    """Steps that refuse command ``name`` inside a transaction; raised in
    them, the error aborts the transaction (``failing_aborts``), as MongoDB's."""
    raise CommandError(f"Cannot run '{name}' in a multi-document transaction.", 263,
                       "OperationNotSupportedInTransaction")
    yield  # never reached: it makes this a generator, the steps failing_aborts runs


def _may_write(cmd: dict) -> bool:
    name = next(iter(cmd)).lower()
    if name == "aggregate":
        p = cmd.get("pipeline")
        return bool(p) and isinstance(p[-1], dict) and ("$out" in p[-1] or "$merge" in p[-1])
    return name not in _TXN_READS


class Transactions:
    """Driver sessions' transactions: ``(lsid, txnNumber)`` -> the member's
    transaction and the state it lives in (statements of one transaction may
    come on different connections of the driver's pool)."""

    def __init__(self, d):
        self.d = d
        self.open: dict[bytes, tuple[int, int, dict]] = {}  # lsid -> (txnNumber, txn, state)
        self.wrote: set[bytes] = set()  # sessions whose open transaction ran a write
        self.lock = threading.Lock()

    @staticmethod
    def _lsid(cmd: dict) -> bytes | None:
        ls = cmd.get("lsid")
        if isinstance(ls, dict) and ls.get("id") is not None:
            return _sid(ls["id"])
        return None

    def fields(self, cmd: dict):
        """Steps giving (fields to add to each request, the state to run them
        in) for a command that is part of a transaction; ({}, None) otherwise."""
        if cmd.get("autocommit") is not False:
            return {}, None
        lsid, num = self._lsid(cmd), int(cmd.get("txnNumber", -1))
        if lsid is None:
            raise bad_value("a transaction needs an lsid")
        if cmd.get("startTransaction"):
            yield from self._abort(lsid)
            state: dict = {}
            txn = (yield call({"op": "txnBegin"}, state))["txn"]
            with self.lock:
                self.open[lsid] = (num, txn, state)
        with self.lock:
            got = self.open.get(lsid)
        if got is None or got[0] != num:
            raise CommandError(f"Transaction with txnNumber {num} has been aborted or is not "
                               "open", 251, "NoSuchTransaction",
                               errorLabels=["TransientTransactionError"])
        if _may_write(cmd):
            with self.lock:
                self.wrote.add(lsid)
        return {"txn": got[1]}, got[2]

    def state_of(self, cmd: dict) -> dict | None:
        """The state of the open transaction ``cmd`` is a statement of, if any
        (``killOp`` marks it, as it marks the connection's)."""
        if cmd.get("autocommit") is not False:
            return None
        lsid = self._lsid(cmd)
        with self.lock:
            got = self.open.get(lsid)
        return got[2] if got is not None and got[0] == cmd.get("txnNumber", -1) else None

    def finish(self, cmd: dict, commit: bool, state: dict) -> dict:
        """commitTransaction / abortTransaction. A commit writes the session's
        record (``config.transactions``: this txnNumber committed) in the
        transaction itself, so it replicates with the commit: a commit the
        driver retries after a lost answer, here or on the next primary after
        a failover, is answered from it, as MongoDB does. Before stop 40 such a
        retry got NoSuchTransaction with TransientTransactionError, and
        pymongo's ``with_transaction`` ran the committed transaction again."""
        lsid, num = self._lsid(cmd), int(cmd.get("txnNumber", -1))
        with self.lock:
            got = self.open.get(lsid)
            wrote = lsid in self.wrote
            if got is not None and got[0] == num:
                del self.open[lsid]
                self.wrote.discard(lsid)
        if got is None or got[0] != num:
            if not commit:
                return {}
            rec = self.d.call({"op": "find", "ns": RETRY_NS, "filter": {"_id": lsid},
                               "limit": 1, "rp": "primary"}, state)["docs"]
            if _recorded(rec, num, "committed"):
                self.d.drive(outcome_durable(lsid, num, cmd, state))
                return {}
            raise CommandError(f"Transaction with txnNumber {num} is not open", 251,
                               "NoSuchTransaction", errorLabels=["TransientTransactionError"])
        if commit:
            if wrote:  # a read-only transaction writes nothing: run again, it is harmless
                self.d.call({"op": "update", "ns": RETRY_NS, "filter": {"_id": lsid},
                             "replace": True, "upsert": True, "txn": got[1],
                             "update": {"_id": lsid, "n": num, "committed": True}}, got[2])
            self.d.call({"op": "txnCommit", "txn": got[1], **wc_fields(cmd)}, got[2])
        else:
            self.d.call({"op": "txnAbort", "txn": got[1]}, got[2])
        return {}

    def failing_aborts(self, cmd: dict, steps):
        """Steps: a command's ``steps``; one of a transaction (``autocommit:
        false``; not its commit or abort) that fails, or answers a write
        error, aborts the transaction, as MongoDB does: the statement's
        error goes back, and the session's next statement or commit gets
        NoSuchTransaction (TransientTransactionError). Before, a duplicate
        key left the transaction open and its commit stored the others."""
        lsid = self._lsid(cmd)
        if cmd.get("autocommit") is not False or lsid is None \
                or next(iter(cmd)).lower() in ("committransaction", "aborttransaction"):
            return (yield from steps)
        num = int(cmd.get("txnNumber", -1))
        try:
            out = yield from steps
        except Exception:
            yield from self._abort(lsid, num)
            raise
        if isinstance(out, dict) and out.get("writeErrors"):
            yield from self._abort(lsid, num)
        return out

    def _abort(self, lsid: bytes, num: int | None = None):
        """Steps: the session's open transaction aborted (only number ``num``
        if given: a newer one the driver began meanwhile stays)."""
        with self.lock:
            got = self.open.get(lsid)
            if got is None or (num is not None and got[0] != num):
                return
            del self.open[lsid]
            self.wrote.discard(lsid)
        try:
            yield call({"op": "txnAbort", "txn": got[1]}, got[2])
        except errors.RaymxError:
            pass

    def abort(self, lsid: bytes) -> None:
        self.d.drive(self._abort(lsid))

    def end_sessions(self, ids) -> None:
        for x in ids:
            if isinstance(x, dict) and x.get("id") is not None:
                self.abort(_sid(x["id"]))


def _too_old(num: int, newer: int) -> CommandError:
    return CommandError(f"Retryable write with txnNumber {num} is prohibited on session "
                        f"because a newer retryable write with txnNumber {newer} has "
                        "already started", 225, "TransactionTooOld")


_STATEMENTS = {"insert": "documents", "update": "updates", "delete": "deletes"}
RETRY_SEEN_MAX = 100_000


def outcome_durable(lsid: bytes, num: int, cmd: dict, state: dict):
    """Steps: a retry answered from the session's record (a write or a
    commit done before) keeps the retry's write concern: the record is
    touched with it, and that write is acknowledged only once everything
    before it (the first outcome too) holds the concern (the record may have
    reached this member, a new primary, and not yet a majority)."""
    yield call({"op": "update", "ns": RETRY_NS, "filter": {"_id": lsid, "n": num},
                "update": {"$inc": {"retried": 1}}, **wc_fields(cmd)}, state)


def _recorded(rec: list, num: int, *kinds: str) -> bool:
    """Whether the session's record (``rec``: the find's documents) holds
    txnNumber ``num``'s outcome of one of ``kinds`` ("res" or "reply" for a
    retryable write, "committed" for a transaction); ``TransactionTooOld`` if
    it holds a newer number's."""
    if rec and rec[0].get("n", -1) > num:
        raise _too_old(num, rec[0]["n"])
    return bool(rec) and rec[0].get("n") == num and any(k in rec[0] for k in kinds)


def _answer(cmd: dict, rec: dict) -> dict:
    """A retryable write's first answer, from its record."""
    return _replayed(cmd, rec["res"]) if "res" in rec else bson.decode(rec["reply"], CODEC)


def _replayed(cmd: dict, res: dict) -> dict:
    """The answer of a one-statement write from its stored member result."""
    kind = next(iter(cmd)).lower()
    if kind == "insert":
        return {"n": len(res.get("inserted_ids") or ())}
    if kind == "delete":
        return {"n": res.get("deleted") or 0}
    out = {"n": (res.get("matched") or 0), "nModified": res.get("modified") or 0}
    if res.get("upserted_id") is not None:
        out["n"] += 1
        out["upserted"] = [{"index": 0, "_id": res["upserted_id"]}]
    return out


def retryable(fn):
    """A write with ``lsid`` and ``txnNumber`` outside a transaction (a driver's
    retryable write) commits with its record in ``config.transactions``: the
    record replicates with the write, so a retry (also on a new primary after
    a failover) gets the first answer back and is not applied twice. A write
    of one statement carries its record in that statement (``retry``: one
    member write, group commit as any other); others (and findAndModify) run
    as one member transaction."""
    fn = steps_of(fn)

    def run(d, cmd: dict, conn):
        lsid = Transactions._lsid(cmd)
        if lsid is None or cmd.get("txnNumber") is None or "autocommit" in cmd:
            return (yield from fn(d, cmd, conn))
        num = int(cmd["txnNumber"])
        field = _STATEMENTS.get(next(iter(cmd)).lower())
        if field is not None and isinstance(cmd.get(field), list) and len(cmd[field]) == 1:
            term = d.service.gm.term
            known = d.retry_seen.get(lsid)
            if known is None or known[0] != term or known[1] >= num:
                # not known to be new: read the record (a retry, or a session this
                # member has not written for as primary in this term)
                rec = (yield call({"op": "find", "ns": RETRY_NS, "filter": {"_id": lsid},
                                   "limit": 1, "rp": "primary"}, conn.state))["docs"]
                if _recorded(rec, num, "res", "reply"):
                    yield from outcome_durable(lsid, num, cmd, conn.state)
                    return _answer(cmd, rec[0])
            d.retry_seen.pop(lsid, None)  # unknown until this write's outcome is
            try:
                out = yield from fn(d, dict(cmd, **{"$retry": {"_id": lsid, "n": num}}), conn)
            except errors.RetryRecorded:
                # its first attempt raced it and got there first (the member
                # checks the record in the write's transaction): once that one
                # holds the write concern (a write queued after it), the answer
                # is the record's
                yield from outcome_durable(lsid, num, cmd, conn.state)
                rec = (yield call({"op": "find", "ns": RETRY_NS, "filter": {"_id": lsid},
                                   "limit": 1, "rp": "primary"}, conn.state))["docs"]
                if not _recorded(rec, num, "res", "reply"):
                    raise
                return _answer(cmd, rec[0])
            if "writeErrors" not in out:  # committed: its record says num now
                if len(d.retry_seen) >= RETRY_SEEN_MAX:
                    d.retry_seen.clear()  # forgetting only costs a record read
                d.retry_seen[lsid] = (term, num)
            return out

        def attempt():  # one member transaction: run again after a WriteConflict
            state: dict = {}
            txn = (yield call({"op": "txnBegin"}, state))["txn"]
            done = False
            try:
                rec = (yield call({"op": "find", "ns": RETRY_NS, "filter": {"_id": lsid},
                                   "limit": 1, "txn": txn}, state))["docs"]
                if _recorded(rec, num, "res", "reply"):
                    yield call({"op": "txnAbort", "txn": txn}, state)
                    done = True
                    yield from outcome_durable(lsid, num, cmd, conn.state)
                    return _answer(cmd, rec[0])
                inner = {k: v for k, v in cmd.items() if k != "writeConcern"}
                inner["$txn"] = (txn, state)
                out = yield from fn(d, inner, conn)
                yield call({"op": "update", "ns": RETRY_NS, "filter": {"_id": lsid}, "replace": True,
                            "upsert": True, "txn": txn,
                            "update": {"_id": lsid, "n": num,
                                       "reply": bson.encode(out, codec_options=CODEC)}}, state)
                done = True
                try:
                    yield call({"op": "txnCommit", "txn": txn, **wc_fields(cmd)}, state)
                except errors.WriteConcernTimeout as e:
                    out["writeConcernError"] = write_concern_error(e)
                return out
            finally:
                if not done:
                    try:
                        yield call({"op": "txnAbort", "txn": txn}, state)
                    except errors.RaymxError:
                        pass
        return (yield from again_on_conflict(attempt))

    return run


def commit(d, cmd: dict, conn) -> dict:
    return d.txns.finish(cmd, True, conn.state)


def abort(d, cmd: dict, conn) -> dict:
    return d.txns.finish(cmd, False, conn.state)
