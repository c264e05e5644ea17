"""Command dispatch for the wire port: authentication, ``hello``, and the
administrative commands. CRUD commands are in ``raymx.wire.crud``.

Every command becomes one or more of the member's own requests
(``ShardService.handle``: the msgpack port's path); nothing here touches
storage directly. Commands written as steps (``raymx.wire.crud``: insert,
update, delete, find, getMore, killCursors, count) run on the port's loop,
each member request answered back onto it (``Dispatcher.start``); the others
run on a pool thread that waits for their answers.
"""
from __future__ import annotations

import datetime
import hashlib
import logging
import os
import threading
import time

import bson
from bson import Int64, ObjectId

from raymx import errors
from raymx.actors.reads import INTERRUPT
from raymx.storage.query import compile_filter
from raymx.wire import crud, framing, indexes, oplog_view, queries, rs_status, sessions
from raymx.wire.auth import MECHANISM, USER, Scram
from raymx.wire.changestream import Streams
from raymx.wire.errors import CommandError, bad_value, command_not_found, error_doc

log = logging.getLogger("raymx.wire")

MAX_WIRE_VERSION = 21  # MongoDB 7.0
VERSION = "7.0.0"
STARTED = time.monotonic()  # serverStatus uptime: this process loaded the wire port
SESSION_TIMEOUT_MIN = 30
CALL_TIMEOUT_S = 300.0
TOPOLOGY_TTL_S = 1.0
PRE_AUTH = {"hello", "ismaster", "saslstart", "saslcontinue"}


_DEEP = frozenset((dict, list, Int64))


def plain(v):
    """A filter, a projection or a pipeline with its ``Int64``s as ints (the
    operators' integer arguments: a long ``$slice`` or bitmask); documents
    and updates keep them, and their width with them."""
    t = type(v)
    if t is dict:
        if _DEEP.isdisjoint(map(type, v.values())):  # flat, no Int64: as it is
            return v
        return {k: plain(x) for k, x in v.items()}
    if t is list:
        return [plain(x) for x in v]
    if t is Int64:
        return int(v)
    return v


class Dispatcher:
    """Runs one command document: ``start`` from the port's loop (the
    answer to a callback on it), ``run`` on a thread that waits for it."""

    def __init__(self, service, port):
        self.service = service
        self.port = port
        self._topo: tuple[float, dict] | None = None
        self._topo_lock = threading.Lock()
        self.txns = sessions.Transactions(self)
        self.streams = Streams(self)
        # lsid -> (term, txnNumber) of the last retryable write this member
        # committed as primary for it: a higher number in the same term is new
        # (no record read before the write); anything else reads the record
        self.retry_seen: dict[bytes, tuple[int, int]] = {}
        # member id -> its wire address, as topologies showed it (a member that
        # is down now keeps its name in rs.status())
        self.wire_names: dict[int, str] = {}

    # --- running -----------------------------------------------------------
    def _command(self, cmd: dict, conn):
        """(name, the command's steps) or, if it cannot run, its error document."""
        if not cmd:
            return error_doc(bad_value("an empty command document"))
        name = next(iter(cmd))
        key = name.lower()
        if not conn.authed and key not in PRE_AUTH:
            return error_doc(CommandError(f"command {name} requires authentication", 13,
                                          "Unauthorized"))
        fn = COMMANDS.get(key) or crud.COMMANDS.get(key)
        if fn is None:
            return error_doc(command_not_found(name))
        try:
            crud.no_collation(cmd)
        except CommandError as e:
            return error_doc(e)
        if cmd.get("autocommit") is False and key not in sessions.IN_TXN:
            return name, self.txns.failing_aborts(cmd, sessions.not_in_transactions(name))
        return name, self.txns.failing_aborts(cmd, crud.steps_of(fn)(self, cmd, conn))

    def _answer(self, name: str, out=None, e: Exception | None = None) -> dict:
        if e is None:
            out.setdefault("ok", 1.0)
            try:
                out.setdefault("operationTime",
                               crud.operation_time(self.service.e.applied_point()))
            except Exception:  # the store is closing (the member stops): answer without it
                pass
            return out
        if isinstance(e, (TypeError, ValueError, AttributeError, KeyError, OverflowError)):
            # a field of the wrong type or shape (int("x"), a number where a
            # document belongs): the sender's mistake, said with a code
            log.info("%s: bad argument: %r", name, e)
            return error_doc(CommandError(f"{name}: a field has the wrong type or form: {e}",
                                          14, "TypeMismatch"))
        return error_doc(e)

    def run(self, cmd: dict, conn, legacy: bool = False) -> dict:
        """The answer, on a thread that may wait for the member."""
        got = self._command(cmd, conn)
        if isinstance(got, dict):
            return got
        try:
            return self._answer(got[0], self.drive(got[1]))
        except Exception as e:
            return self._answer(got[0], e=e)

    def drive(self, steps):
        """Run steps (see ``raymx.wire.crud``) on this thread, waiting for each
        member request; their result."""
        val = exc = None
        while True:
            try:
                step = steps.send(val) if exc is None else steps.throw(exc)
            except StopIteration as s:
                return s.value
            val = exc = None
            try:
                val = self.call(step[1], step[2]) if step[0] == "call" else step[1](*step[2])
            except Exception as e:
                exc = e

    def start(self, cmd: dict, conn, done, pool) -> None:
        """From the port's loop: run a command; ``done(answer)`` on the loop.
        Its member requests go to the member from the loop and their answers
        come back onto it (no thread waits); a blocking step runs on ``pool``."""
        conn.current = (cmd, time.monotonic())  # for currentOp
        for state in (conn.state, self.txns.state_of(cmd)):  # a killOp of the command
            if state is not None:                            # before stopped that one
                state.pop(INTERRUPT, None)

        def finished(answer):
            conn.current = None
            done(answer)
        got = self._command(cmd, conn)
        if isinstance(got, dict):
            return finished(got)
        self._step(got[0], got[1], finished, pool, None, None)

    def _step(self, name, steps, done, pool, val, exc) -> None:
        try:
            step = steps.send(val) if exc is None else steps.throw(exc)
        except StopIteration as s:
            return done(self._answer(name, s.value))
        except Exception as e:
            return done(self._answer(name, e=e))
        loop = self.port._loop
        once = threading.Lock()
        timer = None

        def back(ok=None, err=None):  # from any thread, the first answer only
            if once.acquire(blocking=False):
                try:
                    if self.port.on_loop():  # answered on the loop (a write run there)
                        loop.call_soon(resume, ok, err)
                    else:
                        loop.call_soon_threadsafe(resume, ok, err)
                except RuntimeError:  # the loop is closed: the member stops
                    pass

        def resume(ok, err):
            if timer is not None:
                timer.cancel()
            self._step(name, steps, done, pool, ok, err)

        if step[0] == "call":
            req, state = step[1], step[2]
            timer = loop.call_later(CALL_TIMEOUT_S, lambda: back(err=errors.RequestTimeout(
                f"{req.get('op')} got no answer in {CALL_TIMEOUT_S:g} s")))
            try:
                self.service.handle(req, back, state)
            except Exception as e:  # refused before it was queued (a filter too deep...)
                back(err=e)
            return
        fn, args = step[1], step[2]

        def work():
            try:
                v = fn(*args)
            except Exception as e:
                return back(err=e)
            back(ok=v)
        try:
            pool.submit(work)
        except RuntimeError:  # the pool is shut down: the member stops
            pass

    def call(self, req: dict, state: dict, timeout_s: float = CALL_TIMEOUT_S) -> dict:
        """One member request, answered (or its error raised)."""
        return self.service.request(req, state, timeout_s)

    def connection_closed(self, conn) -> None:
        self.service.connection_closed(conn.state)

    # --- the set's shape, for hello ------------------------------------------
    def topology(self) -> dict:
        with self._topo_lock:
            now = time.monotonic()
            if self._topo is not None and now - self._topo[0] < TOPOLOGY_TTL_S:
                return self._topo[1]
            try:
                topo = self.service.topology_source()
            except Exception:  # the coordinator is restarting: the last known one
                topo = self._topo[1] if self._topo else {"members": [], "primary": None}
            self._topo = (now, topo)
            return topo


def _role(svc) -> tuple[bool, bool]:
    """(takes writes, serves reads as a secondary): ``hello``'s and ``serverStatus``'."""
    writable = bool(svc.primary and not svc.handing_over)
    return writable, not writable and svc.read_refusal() is None


def _hello(d: Dispatcher, cmd: dict, conn) -> dict:
    svc, port = d.service, d.port
    me = port.address
    topo = d.topology()
    members = [m for m in topo.get("members", ()) if m.get("wire")]
    hosts = [f"{m['wire'][0]}:{m['wire'][1]}" for m in members if not m.get("hidden")]
    if me not in hosts and not any(m.get("id") == port.info.get("member") and m.get("hidden")
                                   for m in members):
        hosts.append(me)
    writable, secondary = _role(svc)
    primary = me if writable else next(
        (f"{m['wire'][0]}:{m['wire'][1]}" for m in members
         if m.get("id") == topo.get("primary") and m.get("id") != port.info.get("member")),
        None)
    first = next(iter(cmd))
    out = {"helloOk": True,
           ("ismaster" if first.lower() == "ismaster" else "isWritablePrimary"): writable,
           "secondary": secondary,
           "setName": port.info.get("replset", "raymx"), "setVersion": 1,
           "hosts": hosts, "me": me,
           "maxBsonObjectSize": min(16 * 1024 * 1024, svc.limits.document_bytes_max),
           "maxMessageSizeBytes": framing.MAX_MESSAGE_BYTES, "maxWriteBatchSize": 100_000,
           "localTime": datetime.datetime.now(datetime.timezone.utc),
           "logicalSessionTimeoutMinutes": SESSION_TIMEOUT_MIN,
           "connectionId": conn.id, "minWireVersion": 0, "maxWireVersion": MAX_WIRE_VERSION,
           "readOnly": False}
    if primary is not None:
        out["primary"] = primary
    if any(m.get("id") == port.info.get("member") and m.get("hidden") for m in members):
        out["hidden"] = True  # drivers leave it out of the set's servers
    if writable:  # drivers order primaries by (electionId, setVersion): the term
        out["electionId"] = ObjectId(b"\x7f\xff\xff\xff" + int(svc.gm.term).to_bytes(8, "big"))
    out["lastWrite"] = rs_status.last_write(svc)
    if "saslSupportedMechs" in cmd:
        out["saslSupportedMechs"] = [MECHANISM]
    if "client" in cmd and isinstance(cmd["client"], dict):
        conn.wire["client"] = cmd["client"]
    return out


def _sasl_start(d: Dispatcher, cmd: dict, conn) -> dict:
    conn.scram = Scram(d.port.credential)
    payload = conn.scram.start(cmd.get("mechanism"), cmd.get("payload", b""))
    return {"conversationId": 1, "done": False, "payload": payload}


def _sasl_continue(d: Dispatcher, cmd: dict, conn) -> dict:
    s = conn.scram
    if s is None:
        raise CommandError("No SASL session state found", 17, "ProtocolError")
    if conn.authed:  # the empty last step of drivers that do not skip it
        return {"conversationId": 1, "done": True, "payload": b""}
    try:
        payload = s.finish(cmd.get("payload", b""))
    finally:
        conn.scram = None
    conn.authed = True
    conn.wire["user"] = s.user
    conn.scram = s  # kept for an empty final saslContinue
    return {"conversationId": 1, "done": True, "payload": payload}


def _build_info(d: Dispatcher, cmd: dict, conn) -> dict:
    return {"version": VERSION, "versionArray": [7, 0, 0, 0], "gitVersion": "raymx",
            "bits": 64, "maxBsonObjectSize": 16 * 1024 * 1024, "storageEngines": ["raymx"],
            "modules": [], "javascriptEngine": "none", "debug": False}


_names = crud.collection_names


def _stored_names(d: Dispatcher, conn) -> list[str]:
    """The member's collections and the oplog (``local.oplog.rs``, read-only),
    as databases and their stats count them."""
    return _names(d, conn) + [oplog_view.NS]


def _db(cmd: dict) -> str:
    db = cmd.get("$db")
    if not isinstance(db, str) or not db:
        raise bad_value("the command has no $db")
    return db


def _list_databases(d: Dispatcher, cmd: dict, conn) -> dict:
    """Each database with its size: its collections' stored bytes and index
    bytes, as ``collStats`` counts them (skipped with ``nameOnly``); ``local``
    holds the oplog (``local.oplog.rs``)."""
    names = _stored_names(d, conn)
    dbs = sorted({ns.split(".", 1)[0] for ns in names})
    size = dict.fromkeys(dbs, 0)
    if not cmd.get("nameOnly"):
        for ns in names:
            st = crud.storage_stats(d, conn, ns)
            size[ns.split(".", 1)[0]] += st["totalSize"]
    out = [{"name": n, "sizeOnDisk": size[n], "empty": size[n] == 0} for n in dbs]
    flt = cmd.get("filter")
    if flt:
        m = compile_filter(plain(flt))
        out = [x for x in out if m(x)]
    if cmd.get("nameOnly"):
        out = [{"name": x["name"]} for x in out]
    total = sum(x.get("sizeOnDisk", 0) for x in out)
    return {"databases": out, "totalSize": total, "totalSizeMb": total >> 20}


def _db_hash(d: Dispatcher, cmd: dict, conn) -> dict:
    """An md5 of each collection of the database (its documents' BSON, in
    ``_id`` order as stored) and of them all: what replica-set checkers
    compare between members once writes stopped. The values are raymx's own
    (they match between raymx members, not with a mongod's)."""
    db, t0 = _db(cmd), time.monotonic()
    want = cmd.get("collections")
    if want is not None and (not isinstance(want, list)
                             or not all(isinstance(c, str) for c in want)):
        raise bad_value("dbHash's collections must be an array of names")
    colls = sorted(ns.partition(".")[2] for ns in _names(d, conn)
                   if ns.partition(".")[0] == db)
    if want is not None:
        colls = [c for c in colls if c in set(want)]
    hashes = {}
    for c in colls:
        h = hashlib.md5()
        for doc in queries.scan(d, cmd, conn, f"{db}.{c}", {}):
            h.update(bson.encode(doc, codec_options=framing.CODEC))
        hashes[c] = h.hexdigest()
    whole = hashlib.md5()
    for c in colls:
        whole.update(hashes[c].encode())
    return {"host": d.port.address, "collections": hashes, "capped": [], "uuids": {},
            "md5": whole.hexdigest(), "timeMillis": int((time.monotonic() - t0) * 1000)}


def _validate(d: Dispatcher, cmd: dict, conn) -> dict:
    """The member checks the collection's documents and indexes against each
    other (``Reader.validate``); ``valid`` false with ``errors`` if not."""
    ns = crud.ns_of(cmd, "validate")
    return d.call({"op": "validate", "ns": ns}, conn.state)["value"]


def _current_op(d: Dispatcher, cmd: dict, conn) -> dict:
    """The commands running on this member's wire port now, this one
    included: one per connection (a connection runs one at a time)."""
    now, out = time.monotonic(), []
    for c in sorted(list(d.port._conns), key=lambda c: c.id):
        cur = getattr(c, "current", None)
        if cur is None:
            continue
        running, t0 = cur
        name = next(iter(running), "")
        ns = next((v for v in (running.get(name), running.get("collection"))
                   if isinstance(v, str)), None)  # a getMore names its collection
        took = now - t0
        out.append({"type": "op", "host": d.port.address, "desc": f"conn{c.id}",
                    "connectionId": c.id, "opid": c.id, "active": True,
                    "op": "command" if name.lower() not in ("find", "getmore", "insert",
                                                             "update", "delete") else
                    {"getmore": "getmore"}.get(name.lower(), name.lower()),
                    "ns": f"{running.get('$db')}.{ns}" if ns else f"{running.get('$db')}.$cmd",
                    "command": {k: v for k, v in running.items()
                                if k not in ("lsid", "$clusterTime", "$readPreference")},
                    "secs_running": int(took), "microsecs_running": Int64(int(took * 1e6))})
    return {"inprog": out}


def _kill_op(d: Dispatcher, cmd: dict, conn) -> dict:
    """``killOp`` (``db.killOp(opid)``, an ``opid`` from ``currentOp``: the
    connection's id): the read that command is running stops at its next
    look at the clock (every 256 documents examined) with ``Interrupted``
    (11601), as MongoDB's. Writes and waits are not interrupted."""
    op = cmd.get("op")
    if isinstance(op, bool) or not isinstance(op, (int, float)):
        raise CommandError(f"killOp needs op, a number from currentOp, not {op!r:.40}", 2,
                           "BadValue")
    for c in list(d.port._conns):
        current = getattr(c, "current", None)
        if c.id == op and current is not None and c is not conn:
            c.state[INTERRUPT] = True
            txn = d.txns.state_of(current[0])  # a read of its transaction: in that state
            if txn is not None:
                txn[INTERRUPT] = True
    return {"info": "attempting to kill op"}


def _host_info(d: Dispatcher, cmd: dict, conn) -> dict:
    un = os.uname()
    try:
        mem_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20
    except (ValueError, OSError, AttributeError):
        mem_mb = 0
    return {"system": {"currentTime": datetime.datetime.now(datetime.timezone.utc),
                       "hostname": un.nodename, "cpuAddrSize": 64, "memSizeMB": mem_mb,
                       "memLimitMB": mem_mb, "numCores": os.cpu_count() or 1,
                       "cpuArch": un.machine, "numaEnabled": False},
            "os": {"type": un.sysname, "name": un.sysname, "version": un.release},
            "extra": {"versionString": un.version, "pageSize": os.sysconf("SC_PAGE_SIZE")}}


def _list_commands(d: Dispatcher, cmd: dict, conn) -> dict:
    return {"commands": {name: {"help": "", "requiresAuth": name.lower() not in PRE_AUTH,
                                "secondaryOk": name not in WRITE_COMMANDS, "adminOnly": False,
                                "apiVersions": []}
                         for name in sorted(COMMAND_NAMES)}}


def _list_collections(d: Dispatcher, cmd: dict, conn) -> dict:
    db = _db(cmd)
    out = []
    for ns in sorted(_names(d, conn)):
        dbn, _, coll = ns.partition(".")
        if dbn == db:
            out.append({"name": coll, "type": "collection", "options": {},
                        "info": {"readOnly": False},
                        "idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"}})
    if db == "local":
        out.append(oplog_view.listing())
    flt = cmd.get("filter")
    if flt:
        m = compile_filter(plain(flt))
        out = [x for x in out if m(x)]
    if cmd.get("nameOnly"):
        out = [{"name": x["name"], "type": x["type"]} for x in out]
    return {"cursor": {"firstBatch": out, "id": Int64(0), "ns": f"{db}.$cmd.listCollections"}}


_CREATE_OPTIONS = {"create", "$db", "lsid", "writeConcern", "$readPreference", "$clusterTime",
                   "txnNumber", "autocommit", "startTransaction", "comment",
                   "changeStreamPreAndPostImages"}  # always on here, as collMod says


def _create(d: Dispatcher, cmd: dict, conn) -> dict:
    other = sorted(set(cmd) - _CREATE_OPTIONS)
    if other:
        raise CommandError(f"create: option(s) {', '.join(other)} are not supported by "
                           "raymx", 2, "BadValue")
    images = cmd.get("changeStreamPreAndPostImages", {"enabled": True})
    if not isinstance(images, dict) or set(images) != {"enabled"} \
            or not isinstance(images["enabled"], bool):
        raise bad_value("create: changeStreamPreAndPostImages must be {enabled: <bool>}")
    d.drive(crud._run(d, {"op": "createCollection", "ns": crud.ns_of(cmd, "create"),
                             **crud.wc_fields(cmd)}, cmd, conn))
    return {}


def _drop(d: Dispatcher, cmd: dict, conn) -> dict:
    ns = crud.ns_of(cmd, "drop")
    n = len(d.call({"op": "listIndexes", "ns": ns}, conn.state)["value"])
    d.call({"op": "dropCollection", "ns": ns, **crud.wc_fields(cmd)}, conn.state)
    return {"ns": ns, "nIndexesWas": n}


def _drop_database(d: Dispatcher, cmd: dict, conn) -> dict:
    db = _db(cmd)
    for ns in _names(d, conn):
        if ns.split(".", 1)[0] == db:
            d.call({"op": "dropCollection", "ns": ns, **crud.wc_fields(cmd)}, conn.state)
    return {"dropped": db}


def _scale(cmd: dict) -> int:
    sc = cmd.get("scale", 1)
    if isinstance(sc, bool) or not isinstance(sc, (int, float)) or not 1 <= sc < float("inf"):
        raise CommandError(f"scale has to be a finite number >= 1, not {sc!r:.40}", 2,
                           "BadValue")
    return int(sc)


def _coll_stats(d: Dispatcher, cmd: dict, conn) -> dict:
    ns = crud.ns_of(cmd, "collStats")
    if ns not in _stored_names(d, conn):
        raise CommandError(f"Collection [{ns}] not found.", 26, "NamespaceNotFound")
    return crud.storage_stats(d, conn, ns, _scale(cmd))


def _db_stats(d: Dispatcher, cmd: dict, conn) -> dict:
    db, scale = _db(cmd), _scale(cmd)
    st = [crud.storage_stats(d, conn, ns, scale) for ns in sorted(_stored_names(d, conn))
          if ns.split(".", 1)[0] == db]
    objects, data = sum(x["count"] for x in st), sum(x["size"] for x in st)
    ix = sum(x["totalIndexSize"] for x in st)
    out = {"db": db, "collections": len(st), "views": 0, "objects": objects,
           "avgObjSize": data * scale / objects if objects else 0, "dataSize": data,
           "storageSize": data, "indexes": sum(x["nindexes"] for x in st), "indexSize": ix,
           "totalSize": data + ix, "scaleFactor": scale}
    try:
        fs = os.statvfs(d.service.e.store.path)
        out["fsUsedSize"] = (fs.f_blocks - fs.f_bfree) * fs.f_frsize // scale
        out["fsTotalSize"] = fs.f_blocks * fs.f_frsize // scale
    except (OSError, AttributeError):
        pass
    return out


def _server_status(d: Dispatcher, cmd: dict, conn) -> dict:
    """The parts of MongoDB's ``serverStatus`` that monitoring tools read
    first: who and what this is, its uptime, connections, and its role."""
    svc, port = d.service, d.port
    up = time.monotonic() - STARTED
    writable, secondary = _role(svc)
    return {"host": port.address, "version": VERSION, "process": "raymx", "pid": os.getpid(),
            "uptime": int(up), "uptimeMillis": int(up * 1000), "uptimeEstimate": int(up),
            "localTime": datetime.datetime.now(datetime.timezone.utc),
            "connections": {"current": port.connections,
                            "available": max(0, svc.limits.connections_max - port.connections)},
            "repl": {"setName": port.info.get("replset", "raymx"),
                     "isWritablePrimary": writable,
                     "secondary": secondary,
                     "me": port.address, "term": svc.gm.term},
            "storageEngine": {"name": "raymx", "supportsCommittedReads": True,
                              "persistent": True}}


def _ok(d, cmd, conn) -> dict:
    return {}


def _end_sessions(d: Dispatcher, cmd: dict, conn) -> dict:
    d.txns.end_sessions(cmd.get(next(iter(cmd))) or [])
    return {}


def _whats_my_uri(d, cmd, conn) -> dict:
    peer = conn.transport.get_extra_info("peername") or ("", 0)
    return {"you": f"{peer[0]}:{peer[1]}"}


def _connection_status(d, cmd, conn) -> dict:
    user = conn.wire.get("user")
    users = [{"user": user, "db": cmd.get("$db", "admin")}] if user else []
    return {"authInfo": {"authenticatedUsers": users, "authenticatedUserRoles": []}}


# the server parameters raymx answers getParameter with (MongoDB 7's values
# for what raymx does: one log verbosity, its one mechanism)
_PARAMETERS = {"featureCompatibilityVersion": {"version": "7.0"},
               "logLevel": 0, "logComponentVerbosity": {"verbosity": 0},
               "authenticationMechanisms": [MECHANISM], "quiet": False}
_GET_PARAMETER_FIELDS = {"getParameter", "$db", "lsid", "$clusterTime", "$readPreference",
                         "comment", "apiVersion", "apiStrict", "apiDeprecationErrors"}


def _get_parameter(d, cmd, conn) -> dict:
    """``getParameter``: the parameters asked for (``*``: all) among
    ``_PARAMETERS``; none of them known is MongoDB's "no option found to get"."""
    if cmd.get("getParameter") == "*":
        return dict(_PARAMETERS)
    asked = set(cmd) - _GET_PARAMETER_FIELDS
    out = {k: _PARAMETERS[k] for k in asked if k in _PARAMETERS}
    if not out:
        raise CommandError("no option found to get" + (
            f" (raymx answers {', '.join(sorted(_PARAMETERS))})" if asked else ""), 72,
            "InvalidOptions")
    return out


def _get_log(d, cmd, conn) -> dict:
    """mongosh asks for ``startupWarnings`` at start-up: raymx keeps no server
    log to show here (its members log through Python's logging), so each log
    is empty, as a MongoDB 7 with nothing to warn about answers."""
    which = cmd.get("getLog")
    if which == "*":
        return {"names": ["global", "startupWarnings"]}
    if which in ("global", "startupWarnings"):
        return {"totalLinesWritten": 0, "log": []}
    if not isinstance(which, str):
        raise CommandError("Argument to getLog must be of type String; found "
                           f"{which!r:.40} of type {type(which).__name__}", 14, "TypeMismatch")
    raise CommandError(f"No log named '{which}'", 96, "OperationFailed")


def _users_info(d, cmd, conn) -> dict:
    """``db.getUsers()``: raymx has one user, ``raymx`` (the set's secret is
    its password), with every right; asked for another, there is none."""
    q = cmd.get("usersInfo")
    me = {"_id": f"admin.{USER}", "user": USER, "db": "admin",
          "roles": [{"role": "root", "db": "admin"}], "mechanisms": [MECHANISM]}
    names = q if isinstance(q, list) else [q]
    hit = any(n == 1 or n == USER or (isinstance(n, dict) and n.get("user") == USER)
              for n in names)
    return {"users": [me] if hit else []}


def _get_cmd_line_opts(d, cmd, conn) -> dict:
    """What a member was started with, as MongoDB's ``parsed`` options show it."""
    host, _, port = d.port.address.rpartition(":")
    return {"argv": ["raymx-member"], "parsed": {
        "replication": {"replSetName": d.port.info.get("replset", "raymx")},
        "net": {"bindIp": host, "port": int(port)}}}


def _fsync(d, cmd, conn):
    """``{fsync: 1}``: everything committed is made durable before the answer.
    ``lock`` (``db.fsyncLock()``, for copying the files) is refused: raymx
    copies a member while it runs (``rs.backup``, ``raymx backup``)."""
    if cmd.get("lock"):
        raise CommandError("fsync with lock is not supported by raymx: take a consistent "
                           "copy of a running member with rs.backup(member, path) or "
                           "'raymx backup'", 2, "BadValue")
    yield crud.blocking(d.service.group.sync_now)
    return {"numFiles": 1}


def _profile(d, cmd, conn) -> dict:
    """The profiler's status (``db.getProfilingStatus()``): off. Turning it
    on is refused; raymx's latencies are in its metrics and ``rs.status()``."""
    level = cmd.get("profile")
    if level not in (-1, 0):
        raise CommandError("the profiler is not supported by raymx (only level 0, off): its "
                           "request latencies are in the members' metrics", 2, "BadValue")
    return {"was": 0, "slowms": 100, "sampleRate": 1.0}


def _logout(d, cmd, conn) -> dict:
    conn.authed = False
    return {}


COMMANDS = {
    "dbhash": _db_hash, "hostinfo": _host_info, "listcommands": _list_commands,
    "currentop": _current_op, "killop": _kill_op, "validate": _validate,
    "hello": _hello, "ismaster": _hello, "saslstart": _sasl_start,
    "saslcontinue": _sasl_continue, "logout": _logout, "ping": _ok, "buildinfo": _build_info,
    "listdatabases": _list_databases, "listcollections": _list_collections,
    "create": _create, "drop": _drop, "dropdatabase": _drop_database,
    "listindexes": indexes.list_indexes, "createindexes": indexes.create_indexes,
    "collmod": indexes.coll_mod, "dropindexes": indexes.drop_indexes,
    "endsessions": _end_sessions, "killsessions": _end_sessions,
    "refreshsessions": _ok, "whatsmyuri": _whats_my_uri,
    "connectionstatus": _connection_status, "getparameter": _get_parameter,
    "getlog": _get_log, "replsetgetstatus": rs_status.get_status,
    "replsetgetconfig": rs_status.get_config, "replsetstepdown": rs_status.step_down,
    "getdefaultrwconcern": rs_status.get_default_rw_concern,
    "collstats": _coll_stats, "dbstats": _db_stats, "serverstatus": _server_status,
    "usersinfo": _users_info, "getcmdlineopts": _get_cmd_line_opts, "fsync": _fsync,
    "profile": _profile,
}
# the commands' names as MongoDB spells them (listCommands); tests check that
# they are exactly the dispatch tables' keys
COMMAND_NAMES = (
    "abortTransaction", "aggregate", "buildInfo", "collMod", "collStats", "commitTransaction",
    "connectionStatus", "count", "create", "createIndexes", "currentOp", "dbHash", "dbStats",
    "delete", "distinct", "drop", "dropDatabase", "dropIndexes", "endSessions", "explain",
    "find", "findAndModify", "fsync", "getCmdLineOpts", "getDefaultRWConcern", "getLog",
    "getMore", "getParameter",
    "hello", "hostInfo", "insert", "isMaster", "killCursors", "killOp", "killSessions",
    "listCollections", "listCommands", "listDatabases", "listIndexes", "logout", "ping",
    "profile", "refreshSessions", "renameCollection", "replSetGetConfig", "replSetGetStatus",
    "replSetStepDown",
    "saslContinue", "saslStart", "serverStatus", "update", "usersInfo", "validate",
    "whatsmyuri")
WRITE_COMMANDS = {"insert", "update", "delete", "findAndModify", "create", "drop", "collMod",
                  "dropDatabase", "createIndexes", "dropIndexes", "commitTransaction",
                  "abortTransaction", "renameCollection"}
