"""``Client``: a replica set's members, followed through elections, and
``ClientTransaction``, a multi-statement transaction on its primary."""
from __future__ import annotations

import itertools
import random
import threading
import time
from typing import Callable

from raymx import errors
from raymx.client.change_stream import ChangeStream
from raymx.client.collection import Collection, Database
from raymx.client.connection import Connection, connect_member
from raymx.client.options import ReadConcern, ReadPreference, WriteConcern, _wc_fields
from raymx.client.results import _gtid
from raymx.storage.gtid import GTID


_READ_OPS = {"find", "getMore", "count", "distinct", "listCollections", "listIndexes",
             "killCursors", "collStats"}


class Client:
    """Talks to a replica set; ``client["db"]["coll"]`` or ``client.db.coll``
    as in pymongo.

    ``topology`` returns ``{"secret": ..., "members": [{"id", "host", "port",
    "role"}]}``; the client asks it again when the primary changes.
    """

    def __init__(self, topology: Callable[[], dict], write_concern: WriteConcern | None = None,
                 timeout_s: float = 30.0, read_preference: "ReadPreference | None" = None,
                 status: Callable[[], dict] | None = None,
                 read_concern: "ReadConcern | str | None" = None, tls=None):
        self._topology = topology
        self.tls = tls  # an ssl.SSLContext for members whose port requires TLS
        self._status = status
        self.write_concern = write_concern or WriteConcern()
        self.read_preference = read_preference or ReadPreference()
        self.read_concern = ReadConcern.of(read_concern) or ReadConcern()
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._conns: dict[int, Connection] = {}
        self._primary: int | None = None
        self._rr = itertools.count()
        self.retry_interval_s = 0.05

    def _conn_to(self, m: dict, secret: str) -> Connection:
        c = self._conns.get(m["id"])
        if c is None or c.closed:
            c = self._conns[m["id"]] = connect_member(m, secret, tls=self.tls)
        return c

    def _read_conn(self, rp: "ReadPreference", skip=()) -> Connection:
        """A connection to a member that satisfies ``rp``, not one in ``skip``
        (it refused the read) nor one the set reports recovering, needing a
        resync or synchronizing (its data may still be rolled back)."""
        if rp.mode == "primary":
            return self._primary_conn()
        topo = self._topology()
        members = [m for m in topo["members"] if not m.get("hidden")]
        if rp.mode == "secondary":
            members = [m for m in members if m.get("role") == "secondary"]
        if rp.max_staleness_s is not None:
            if self._status is None:
                raise errors.StaleRead("max-staleness reads need the replica set's status")
            lag = {s["id"]: s.get("lag_s") for s in self._status()["members"]}
            members = [m for m in members if lag.get(m["id"]) is not None
                       and lag[m["id"]] <= rp.max_staleness_s]
        ready = [m for m in members if m["id"] not in skip
                 and (m.get("role") == "primary" or m.get("state", "running") == "running")]
        if not ready:
            raise errors.StaleRead(f"no member satisfies read preference {rp}",
                                   transient=len(ready) < len(members))
        m = ready[next(self._rr) % len(ready)]
        with self._lock:
            return self._conn_to(m, topo["secret"])

    def _read_call(self, rp: "ReadPreference", req: dict) -> tuple:
        """Run a read on a member that satisfies ``rp``: (answer, connection).
        A member that refuses it (``NotPrimaryOrSecondary``) or drops the
        connection is skipped and another one tried until ``timeout_s``."""
        if rp.mode == "primary":  # a member that is not (any more) primary refuses it
            return self._call_conn(dict(req, rp="primary"))
        deadline = time.monotonic() + self.timeout_s
        skip: set = set()
        while True:
            conn = None
            try:
                conn = self._read_conn(rp, skip)
                return conn.request(req, max(0.1, deadline - time.monotonic())), conn
            except (errors.NotPrimaryOrSecondary, errors.ConnectionLost, OSError) as e:
                err = e
                hello = getattr(conn, "hello", None)
                skip.add(hello.get("member") if isinstance(hello, dict) else None)
            except errors.StaleRead as e:
                if not e.info.get("transient"):
                    raise
                err, skip = e, set()  # every fitting member refused: try them again
            if time.monotonic() >= deadline:
                raise err
            time.sleep(self.retry_interval_s)

    def _primary_conn(self) -> Connection:
        with self._lock:
            if self._primary is not None:
                c = self._conns.get(self._primary)
                if c is not None and not c.closed:
                    return c
            try:
                topo = self._topology()
            except (errors.ConfigError, errors.TLSError):
                raise  # the set was shut down, never ran, or wants TLS: final, not waited out
            except Exception as e:
                raise errors.PrimaryUnavailable(f"cannot reach the replica set: {e}") from None
            prim = [m for m in topo["members"] if m.get("role") == "primary"]
            if not prim:
                raise errors.PrimaryUnavailable("no primary is available (an election may be "
                                                "running)")
            m = prim[0]
            try:
                c = self._conn_to(m, topo["secret"])
            except OSError as e:
                raise errors.PrimaryUnavailable(f"cannot connect to the primary: {e}") from None
            self._primary = m["id"]
            return c

    def _call(self, req: dict, conn: Connection | None = None, parts=None):
        """Send to the primary, following it through elections.

        A request the member refused (NotPrimary), or that never left this
        process, is retried on the new primary until ``timeout_s``; a write lost
        in flight is not (its outcome is unknown) and says so.
        """
        if conn is not None:
            return conn.request(req, self.timeout_s, parts)
        return self._call_conn(req, parts)[0]

    def _call_conn(self, req: dict, parts=None) -> tuple:
        deadline = time.monotonic() + self.timeout_s
        write = req.get("op") not in _READ_OPS
        while True:
            try:
                c = self._primary_conn()
                return c.request(req, max(0.1, deadline - time.monotonic()), parts), c
            except (errors.NotPrimary, errors.PrimaryUnavailable,
                    errors.NotPrimaryOrSecondary) as e:
                if e.info.get("outcome") == "unknown":
                    raise  # committed there, then the primary stepped down: never retry
                err = e
            except errors.ConnectionLost as e:
                if write and e.info.get("sent", True):
                    raise errors.ConnectionLost(
                        f"{e.msg}; the write may or may not have been applied: check before "
                        "retrying", sent=True, outcome="unknown") from None
                err = e
            except errors.RequestTimeout as e:
                if write:
                    raise errors.RequestTimeout(
                        f"{e.msg}; the write may still be applied (it may be queued behind "
                        "other writes): check before retrying", outcome="unknown",
                        **e.info) from None
                raise
            with self._lock:
                self._primary = None
            if time.monotonic() >= deadline:
                raise err
            time.sleep(self.retry_interval_s)

    def __getitem__(self, name: str) -> "Database":
        return Database(self, name, self.write_concern)

    def __getattr__(self, name: str) -> "Database":
        """``client.app`` is ``client["app"]`` (as pymongo's MongoClient); names
        starting with ``_`` are not databases."""
        if name.startswith("_"):
            raise AttributeError(f"Client has no attribute {name!r}; use client[{name!r}] "
                                 "for a database of that name")
        return self[name]

    def with_options(self, write_concern: WriteConcern | None = None,
                     read_preference: ReadPreference | None = None,
                     read_concern: "ReadConcern | str | None" = None) -> "Client":
        c = Client(self._topology, write_concern or self.write_concern, self.timeout_s,
                   read_preference or self.read_preference, self._status,
                   ReadConcern.of(read_concern) or self.read_concern, self.tls)
        return c

    def get_database(self, name: str) -> "Database":
        return self[name]

    def list_database_names(self) -> list[str]:
        names = self._call({"op": "listCollections"})["value"]
        return sorted({n.split(".", 1)[0] for n in names})

    def watch(self, after=None, namespaces=None, ops=None,
              read_preference: "str | ReadPreference | None" = None, batch: int | None = None,
              wait_ms: int | None = None, read_concern: "ReadConcern | str | None" = None
              ) -> "ChangeStream":
        """A change stream over the whole replica set (see ``ChangeStream``).

        ``after``: a resume token (an event's ``token``, a stream's
        ``resume_token``, or a GTID such as ``"3:1042"``); None starts at the
        current majority-committed point. ``namespaces``: ``"db"`` or
        ``"db.coll"`` names; ``ops``: event op names. ``read_concern``:
        ``"majority"`` (the default: only majority-committed entries) or
        ``"local"`` (also entries not yet majority-committed: they may be
        rolled back).
        """
        rc = ReadConcern.of(read_concern)
        level = "majority" if rc is None else rc.level
        if level not in ("majority", "local"):
            raise errors.InvalidOperation(f"a change stream reads at read concern 'majority' "
                                          f"or 'local', not {level!r}")
        rp = read_preference or self.read_preference
        rp = rp if isinstance(rp, ReadPreference) else ReadPreference(rp)
        return ChangeStream(self, after, namespaces, ops, level, rp, batch, wait_ms)

    def transaction(self, **wc) -> "ClientTransaction":
        return ClientTransaction(self, _wc_fields(self.write_concern, wc))

    def with_transaction(self, fn, timeout_s: float = 120.0, **wc):
        """``fn(tx)`` in a transaction, committed; run again while it fails
        with ``WriteConflict`` (another commit changed what it wrote first),
        for up to ``timeout_s``, as pymongo's ``with_transaction``. Returns
        what ``fn`` returned; ``fn`` must be safe to run more than once."""
        return self._transacted(fn, _wc_fields(self.write_concern, wc), timeout_s)

    def _transacted(self, fn, wc_fields: dict, timeout_s: float = 120.0):
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with ClientTransaction(self, wc_fields) as tx:
                    return fn(tx)
            except errors.WriteConflict:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(random.uniform(0.0005, 0.005))

    def close(self):
        with self._lock:
            for c in self._conns.values():
                c.close()
            self._conns.clear()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


class ClientTransaction:
    """``with client.transaction() as tx: tx["db"]["coll"].insert_one(...)``.

    All statements run on the primary, reading one snapshot, and commit
    under one GTID; an exception in the block aborts and leaves no trace.
    Other writes and transactions run meanwhile (snapshot isolation): a
    statement writing a document another open transaction wrote, or a commit
    after another commit changed what this one wrote, fails with
    ``WriteConflict`` and the transaction is aborted; run it again
    (``Client.with_transaction`` does).
    """

    def __init__(self, client: Client, wc: dict):
        self.client = client
        self._wc_fields = wc
        self._conn: Connection | None = None
        self._id = None
        self.gtid: GTID | None = None

    def __enter__(self):
        self._conn = self.client._primary_conn()
        try:
            self._id = self._conn.request({"op": "txnBegin"}, self.client.timeout_s)["txn"]
        except errors.RequestTimeout as e:  # the member may open it later: it must abort that one
            self._conn.cancel(e.request_id, "txnBegin")
            raise
        return self

    def _call(self, req: dict, parts=None):
        if self._id is None:
            raise errors.TransactionAborted("the transaction is not open")
        req["txn"] = self._id
        return self._conn.request(req, self.client.timeout_s, parts)

    def __getitem__(self, db: str) -> Database:
        return Database(self.client, db, self.client.write_concern, self)

    def collection(self, ns: str) -> Collection:
        db, coll = ns.split(".", 1)
        return self[db][coll]

    def commit(self):
        try:
            r = self._call({"op": "txnCommit", **self._wc_fields})
        finally:
            self._ended()
        self.gtid = _gtid(r.get("gtid"))
        return self.gtid

    def abort(self):
        if self._id is not None:
            try:
                self._call({"op": "txnAbort"})
            except errors.TransactionAborted:
                pass  # the member ended it already (a conflict, a timeout): it is aborted
            finally:
                self._ended()

    def _ended(self) -> None:
        self._id = None

    def __exit__(self, et, e, tb):
        if self._id is None:
            return
        if et is None:
            self.commit()
        else:
            self.abort()
