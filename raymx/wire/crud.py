"""CRUD commands of the wire port (insert, update, delete, findAndModify,
renameCollection), each translated into the member's own requests
(``insert``/``update``/``delete``...), and the table of every CRUD command:
the reads (find, getMore, killCursors, count, distinct) are ``queries.py``'s,
aggregate and explain ``pipelines.py``'s, driver sessions' transactions and
retryable writes ``sessions.py``'s.

The commands drivers send most (insert, update, delete, find, getMore,
killCursors, count) are written as steps: generators that yield each member
request (``res = yield call(req, state)``) and return the answer. The port
runs them on its own loop, each request answered back onto it, with no thread
waiting (``Dispatcher.start``); ``Dispatcher.drive`` runs the same steps on a
thread that may wait (the other commands, and tests). A step that must wait
on a thread of its own is ``blocking(fn, ...)``: it runs on the port's pool.
"""
from __future__ import annotations

import copy
import inspect
import random
import time

import bson

from raymx import errors
from raymx.actors.statements import RETRY_NS  # lsid -> the last retryable write's record
from raymx.storage import update as update_mod
from raymx.storage.keys import encode_key
from raymx.storage.projection import project
from raymx.client import composite
from raymx.wire import aggregate, oplog_view
from raymx.wire.errors import (CommandError, bad_value, is_statement_error, write_concern_error,
                               write_error)


def ns_of(cmd: dict, name: str) -> str:
    coll = cmd.get(next(iter(cmd)))
    if not isinstance(coll, str):
        raise CommandError(f"{name}: collection name has invalid type "
                           f"{type(coll).__name__}", 73, "InvalidNamespace")
    if not coll:
        raise CommandError(f"{name}: Invalid namespace specified '{cmd.get('$db')}.' (an "
                           "empty collection name)", 73, "InvalidNamespace")
    return f"{cmd.get('$db')}.{coll}"


# MongoDB's implicit default write concern since 5.0 (a replica set without
# arbiters): what a command without one, or one without w, gets
DEFAULT_W = "majority"


def wc_fields(cmd: dict) -> dict:
    """``writeConcern`` -> the member's ``w``, ``j``, ``wtimeout_ms``; none (or
    none with a ``w``) is MongoDB's implicit default, ``w: "majority"``, as a
    driver that sends none gets from MongoDB 7 (``_run`` drops them from the
    statements of a transaction: its commit carries them)."""
    wc = cmd.get("writeConcern")
    if not wc:
        return {"w": DEFAULT_W}
    if not isinstance(wc, dict):
        raise CommandError("writeConcern must be a document", 14, "TypeMismatch")
    out = {}
    w = wc.get("w", DEFAULT_W)
    if isinstance(w, (int, float)) and not isinstance(w, bool):
        w = int(w)
        out["w"] = 1 if w == 0 else w  # w:0: the driver asked for no answer at all
    elif w == "majority":
        out["w"] = w
    else:
        raise CommandError(f"No write concern mode named '{w}' found in replica set "
                           "configuration", 79, "UnknownReplWriteConcern")
    if wc.get("j") or wc.get("fsync"):
        out["j"] = True
    if wc.get("wtimeout"):
        out["wtimeout_ms"] = int(wc["wtimeout"])
    return out


def collection_names(d, conn) -> list[str]:
    """The member's collections ("db.coll")."""
    return d.call({"op": "listCollections"}, conn.state)["value"]


def read_fields(cmd: dict) -> dict:
    """``$readPreference``, ``readConcern`` and ``maxTimeMS`` -> the member's
    ``rp``, ``readConcern`` (``after``, ``at``) and ``max_time_ms``."""
    out = {}
    rp = cmd.get("$readPreference")
    mode = rp.get("mode", "primary") if isinstance(rp, dict) else "primary"
    if mode == "primary":
        out["rp"] = "primary"  # a secondary refuses it, so drivers find the primary
    rc = cmd.get("readConcern")
    if isinstance(rc, dict) and rc.get("level"):
        lvl = rc["level"]
        out["readConcern"] = "local" if lvl == "available" else lvl
    after = rc.get("afterClusterTime") if isinstance(rc, dict) else None
    if after is not None:  # a causally consistent session: after what it saw
        if not isinstance(after, bson.Timestamp):
            raise CommandError(f"afterClusterTime must be a Timestamp, not {after!r:.40}", 14,
                               "TypeMismatch")
        out["after"] = [after.time, after.inc]  # an operationTime: a GTID (term, seq)
    at = rc.get("atClusterTime") if isinstance(rc, dict) else None
    if at is not None:  # a snapshot session's later reads: where its first read was
        if not isinstance(at, bson.Timestamp) or rc.get("level") != "snapshot":
            raise CommandError("atClusterTime needs a Timestamp and readConcern level "
                               "'snapshot'", 2, "BadValue")
        out["at"] = [at.time, at.inc]
    mt = cmd.get("maxTimeMS")
    if mt:  # the member's time limit for the read's batches (and its wait for after)
        if type(mt) is not int or mt < 0:
            raise CommandError(f"maxTimeMS must be a non-negative integer, not {mt!r:.40}", 2,
                               "BadValue")
        out["max_time_ms"] = mt
    return out


def operation_time(g) -> bson.Timestamp:
    """A GTID as the ``operationTime`` of an answer: ``Timestamp(term, seq)``,
    which orders as GTIDs do. A causally consistent session sends it back as
    ``readConcern.afterClusterTime`` and the read waits until the member has
    applied that GTID (``crud.read_fields``): read-your-writes on any member.
    (A seq past 2**32 - 1 would be clamped: 4 billion entries a term.)"""
    return bson.Timestamp(min(g.term, 0xFFFFFFFF), min(g.seq, 0xFFFFFFFF))


def no_collation(doc) -> None:
    """raymx compares strings by their code points, MongoDB's ``simple``
    collation: a command or statement asking for another is refused, never
    answered by other rules than it asked for."""
    c = doc.get("collation") if isinstance(doc, dict) else None
    if c is not None and c != {"locale": "simple"}:
        raise CommandError(f"collation {c!r:.80} is not supported by raymx: strings compare "
                           "by their code points (locale 'simple')", 2, "BadValue")


def _docs(v, what: str) -> list:
    if not isinstance(v, list):
        raise CommandError(f"'{what}' must be an array", 14, "TypeMismatch")
    return v


# a transaction begun for one command (_in_txn) runs again after a WriteConflict
# for up to this long
CONFLICT_RETRY_S = 60.0


def call(req: dict, state: dict) -> tuple:
    """A step: one member request; ``yield call(...)`` gives its answer (or
    raises its error)."""
    return ("call", req, state)


def blocking(fn, *args) -> tuple:
    """A step: ``fn(*args)`` on a pool thread (it waits for the member itself)."""
    return ("block", fn, args)


def steps_of(fn):
    """``fn(d, cmd, conn)`` as steps: itself if it is written so, else one
    blocking step running it whole."""
    if inspect.isgeneratorfunction(fn):
        return fn

    def run(d, cmd, conn):
        return (yield blocking(fn, d, cmd, conn))
    return run


def _plain(v):
    from raymx.wire.commands import plain
    return plain(v)


def _txn_of(d, cmd: dict):
    """(fields, state) of the member transaction a command runs in: the
    driver's transaction, or the one a retryable write wraps it in."""
    inner = cmd.get("$txn")
    if inner is not None:
        return {"txn": inner[0]}, inner[1]
    return (yield from d.txns.fields(cmd))


def _run(d, req: dict, cmd: dict, conn):
    """Steps: a request, inside the command's transaction if it has one."""
    extra, state = yield from _txn_of(d, cmd)
    if state is None:
        if "$retry" in cmd:  # its record commits in the same statement
            req = dict(req, retry=cmd["$retry"])
        return (yield call(req, conn.state))
    req = {k: v for k, v in req.items() if k not in ("w", "j", "wtimeout_ms", "rp")}
    return (yield call(dict(req, **extra), state))




PORT_WRITE = "$portWrite"  # an update or delete statement the port computes (_port_write)


def _by_port(req: dict) -> dict:
    """``req`` as a write the port computes if its filter holds ``$expr``."""
    if aggregate.plain_filter(req["filter"]):
        return req
    return dict(req, op=PORT_WRITE, kind=req["op"])


def _in_txn(d, cmd: dict, work):
    """Steps: ``work(run)``'s steps in one member transaction: the command's
    own (a driver's transaction, or a retryable write's), else one begun
    here and committed with the command's write concern (aborted if
    ``work`` raises). ``run(req)`` is the step of one request inside it.
    One begun here that meets a ``WriteConflict`` (another write changed
    what it read and wrote first) runs again, from its reads, as MongoDB
    retries a write that conflicts: the command never fails with it."""
    extra, state = yield from _txn_of(d, cmd)
    if state is not None:
        return (yield from work(lambda req: call(dict(req, **extra), state)))
    return (yield from again_on_conflict(lambda: _own_txn(cmd, work)))


def again_on_conflict(attempt):
    """Steps: ``attempt()``'s (a transaction begun and ended in them), run
    again from the start while they fail with ``WriteConflict``, for up to
    ``CONFLICT_RETRY_S``, after a pause of a few milliseconds."""
    deadline = time.monotonic() + CONFLICT_RETRY_S
    while True:
        try:
            return (yield from attempt())
        except errors.WriteConflict:
            if time.monotonic() >= deadline:
                raise
            yield blocking(time.sleep, random.uniform(0.0005, 0.005))


def _own_txn(cmd: dict, work):
    """Steps: ``work`` in a member transaction begun, and committed, here."""
    state: dict = {}
    extra = {"txn": (yield call({"op": "txnBegin"}, state))["txn"]}
    done = False
    try:
        out = yield from work(lambda req: call(dict(req, **extra), state))
        if "$retry" in cmd:  # a retryable write's record commits with it (retryable)
            rec = cmd["$retry"]
            yield call({"op": "update", "ns": RETRY_NS, "filter": {"_id": rec["_id"]},
                        "update": dict(rec, res=out), "replace": True, "upsert": True,
                        **extra}, state)
        yield call({"op": "txnCommit", **extra, **wc_fields(cmd)}, state)
        done = True
        return out
    finally:
        if not done:
            try:
                yield call({"op": "txnAbort", **extra}, state)
            except errors.RaymxError:
                pass


def _matching(run, ns: str, flt: dict, multi: bool, variables: dict):
    """Steps: the documents an update or delete statement matches (the first
    only unless ``multi``), inside its transaction: the member reads what
    the plain part of the filter selects, and the port tests a ``$expr``."""
    plain = aggregate.plain_filter(flt)
    rest = flt if plain else {k: v for k, v in flt.items() if k != "$expr"}
    got = yield run({"op": "find", "ns": ns, "filter": rest,
                     **({"limit": 1} if plain and not multi else {})})
    docs = got["docs"]
    while got.get("cursor"):
        got = yield run({"op": "getMore", "ns": ns, "cursor": got["cursor"]})
        docs += got["docs"]
    if not plain:
        test = aggregate.matcher(flt, variables)
        docs = [x for x in docs if test(x)]
    return docs if multi else docs[:1]


def _port_write(req: dict, run, variables: dict):
    """Steps of an update or delete the member cannot run alone, inside a
    transaction: its filter holds ``$expr``, or its update is a pipeline
    (``$set $addFields $unset $project $replaceRoot $replaceWith``). The
    port finds the matching documents (``_matching``); a delete or an
    operator update then runs on exactly those (by ``_id``, with the rest of
    the filter for a positional ``$``); a pipeline update computes each new
    version here and replaces each changed one. The member's result shape."""
    ns, flt = req["ns"], req["filter"]
    docs = yield from _matching(run, ns, flt, req["multi"], variables)
    rest = {k: v for k, v in flt.items() if k != "$expr"}
    if "pipeline" not in req:
        by_id = {"_id": {"$in": [x["_id"] for x in docs]}}
        if req["kind"] == "delete":
            if not docs:
                return {"deleted": 0}
            return (yield run({"op": "delete", "ns": ns, "filter": by_id, "multi": True}))
        fields = {k: req[k] for k in ("update", "replace", "array_filters", "upsert_id")
                  if k in req}
        if docs:
            return (yield run({"op": "update", "ns": ns, "multi": req["multi"], **fields,
                               "filter": {"$and": [by_id, rest]} if rest else by_id}))
        if req["upsert"]:  # seeded from the plain part of the filter, as MongoDB's
            return (yield run({"op": "update", "ns": ns, "filter": rest, "upsert": True,
                               **fields}))
        return {"matched": 0, "modified": 0, "upserted_id": None}
    pipeline = req["pipeline"]
    res = {"matched": len(docs), "modified": 0, "upserted_id": None}
    for doc in docs:
        new = _pipelined(doc, pipeline, variables)
        if new != doc:
            yield run({"op": "update", "ns": ns, "filter": {"_id": doc["_id"]}, "update": new,
                       "replace": True, "computed": True})  # an update's event, as MongoDB's
            res["modified"] += 1
    if not docs and req["upsert"]:
        new = _pipelined(update_mod.upsert_seed(rest), pipeline, variables)
        new.setdefault("_id", bson.ObjectId())
        yield run({"op": "insert", "ns": ns, "docs": [new]})
        res["upserted_id"] = new["_id"]
    return res


def _pipelined(doc: dict, pipeline: list, variables: dict | None = None) -> dict:
    """``doc`` after an update pipeline; its ``_id`` may not change (an
    upsert's seed without one may get one from the pipeline)."""
    new = aggregate.run(iter([copy.deepcopy(doc)]), pipeline, variables=variables)[0]
    if "_id" in doc and ("_id" not in new or encode_key(new["_id"]) != encode_key(doc["_id"])):
        raise CommandError("Performing an update on the path '_id' would modify the "
                           "immutable field '_id'", 66, "ImmutableField")
    return new


def _write(d, cmd: dict, conn, statements: list, to_req, count):
    """Steps: run write statements in order; MongoDB's answer shape (n, writeErrors,
    writeConcernError). ``count(result, i, out)`` adds one statement's result."""
    ordered = cmd.get("ordered", True) is not False
    wc = wc_fields(cmd)
    out: dict = {"n": 0}
    werrs = []
    variables = None
    for i, st in enumerate(statements):
        # a write the port computes: its pipeline's and expressions' errors are its own
        piped = isinstance(st, dict) and (isinstance(st.get("u"), list) or isinstance(
            st.get("q"), dict) and not aggregate.plain_filter(st["q"]))
        try:
            req = to_req(st)
            if isinstance(st, dict) and st.get("hint") and "ns" in req:
                try:  # an update's or a delete's hint names an index, as a find's
                    yield blocking(queries.check_hint, d, st, conn, req["ns"])
                except CommandError as e:
                    werrs.append(write_error(i, e))
                    if ordered:
                        break
                    continue
            if req["op"] == PORT_WRITE:
                if variables is None:
                    variables = aggregate.let_of(cmd)
                # an update statement's constants (c) beside the command's let
                v = aggregate.let_of({"let": st["c"]}, given=variables) \
                    if st.get("c") is not None else variables
                res = yield from _in_txn(d, cmd, lambda run: _port_write(req, run, v))
            else:
                res = yield from _run(d, dict(req, **wc), cmd, conn)
            count(res, i, out)
        except errors.WriteConcernTimeout as e:
            out["writeConcernError"] = write_concern_error(e)
        except Exception as e:
            if isinstance(e, errors.WriteConflict):
                raise  # its transaction is aborted: the command fails (or runs again)
            if not (is_statement_error(e) or piped and isinstance(e, CommandError)):
                # not this statement's fault (not primary...)
                if i == 0:
                    raise  # the command fails as a whole: drivers retry it elsewhere
                werrs.append(write_error(i, e))
                break
            werrs.append(write_error(i, e))
            if ordered:
                break
    if werrs:
        out["writeErrors"] = werrs
    return out


def _insert(d, cmd: dict, conn):
    ns = ns_of(cmd, "insert")
    # a document without an _id gets an ObjectId, as MongoDB's server gives it
    docs = [{"_id": bson.ObjectId(), **x} if isinstance(x, dict) and "_id" not in x else x
            for x in _docs(cmd.get("documents"), "documents")]  # Int64s kept: their width
    wc = wc_fields(cmd)
    if len(docs) > 1:  # all in one statement; one by one only if that fails
        try:
            yield from _run(d, {"op": "insert", "ns": ns, "docs": docs, **wc}, cmd, conn)
            return {"n": len(docs)}
        except errors.WriteConcernTimeout as e:
            return {"n": len(docs), "writeConcernError": write_concern_error(e)}
        except Exception as e:
            if not is_statement_error(e) or cmd.get("autocommit") is False:
                raise

    def count(res, i, out):
        out["n"] += 1
    return (yield from _write(d, cmd, conn, docs,
                              lambda x: {"op": "insert", "ns": ns, "docs": [x]}, count))


# the fields of an update and a delete statement, as MongoDB 7 parses them:
# any other fails the command (40415) rather than being ignored (an update's
# ``sort``, MongoDB 8's, used to update another document than it asked for)
_STATEMENT = {"update": {"q", "u", "c", "upsert", "multi", "arrayFilters", "hint", "collation",
                         "upsertSupplied"},
              "delete": {"q", "limit", "hint", "collation"}}


def _statements(cmd: dict, kind: str) -> list:
    sts = _docs(cmd.get(kind + "s"), kind + "s")
    for st in sts:
        extra = set(st) - _STATEMENT[kind] if isinstance(st, dict) else ()
        if extra:
            name = sorted(extra)[0]
            raise CommandError(
                f"BSON field '{kind}.{kind}s.{name}' is an unknown field"
                + (" (an update picks the first of a sort with findAndModify: "
                   "find_one_and_update(sort=...))" if name == "sort" else ""),
                40415, "Location40415")
        if kind == "delete" and isinstance(st, dict):
            if "limit" not in st:
                raise CommandError("BSON field 'delete.deletes.limit' is missing but a "
                                   "required field", 40414, "Location40414")
            if st["limit"] not in (0, 1):
                raise CommandError(f"The limit field in delete objects must be 0 or 1. Got "
                                   f"{st['limit']!r:.40}", 9, "FailedToParse")
    return sts


def _update(d, cmd: dict, conn):
    ns = ns_of(cmd, "update")

    def to_req(st):
        if not isinstance(st, dict) or "q" not in st or "u" not in st:
            raise bad_value("each update needs 'q' and 'u'")
        no_collation(st)
        u = st["u"]
        if isinstance(u, list):
            if st.get("arrayFilters") is not None:
                raise CommandError("arrayFilters may not be specified for pipeline-style "
                                   "updates", 51198, "FailedToParse")
            return {"op": PORT_WRITE, "ns": ns, "filter": _plain(st["q"]),
                    "pipeline": aggregate.update_pipeline(_plain(u)),
                    "multi": bool(st.get("multi")), "upsert": bool(st.get("upsert"))}
        req = {"op": "update", "ns": ns, "filter": _plain(st["q"]), "update": u,
               "multi": bool(st.get("multi")), "upsert": bool(st.get("upsert")),
               "replace": composite.is_replacement(u)}
        if req["upsert"]:  # an upserted document's _id: an ObjectId, as MongoDB's
            req["upsert_id"] = bson.ObjectId()
        if st.get("arrayFilters") is not None:
            req["array_filters"] = _plain(st["arrayFilters"])
        return _by_port(req)

    def count(res, i, out):
        out.setdefault("nModified", 0)
        out["nModified"] += res.get("modified") or 0
        out["n"] += res.get("matched") or 0
        if res.get("upserted_id") is not None:
            out["n"] += 1
            out.setdefault("upserted", []).append({"index": i, "_id": res["upserted_id"]})
    out = yield from _write(d, cmd, conn, _statements(cmd, "update"), to_req, count)
    out.setdefault("nModified", 0)
    return out


def _delete(d, cmd: dict, conn):
    ns = ns_of(cmd, "delete")

    def to_req(st):
        if not isinstance(st, dict) or "q" not in st:
            raise bad_value("each delete needs 'q'")
        no_collation(st)
        return _by_port({"op": "delete", "ns": ns, "filter": _plain(st["q"]),
                         "multi": int(st.get("limit", 0)) == 0})

    def count(res, i, out):
        out["n"] += res.get("deleted") or 0
    return (yield from _write(d, cmd, conn, _statements(cmd, "delete"), to_req, count))


def _sort(v):
    if not v:
        return None
    if not isinstance(v, dict):
        raise CommandError("sort must be a document", 14, "TypeMismatch")
    return aggregate.sort_fields(v)


def _atomically(d, cmd: dict, work):
    """``work(call)`` in one member transaction (``_in_txn``), ``call(req)``
    running one member request inside it; on a pool thread (it blocks)."""
    def steps(run):
        return (yield blocking(work, lambda req: d.call(*run(req)[1:])))
    return d.drive(_in_txn(d, cmd, steps))


def _find_and_modify(d, cmd: dict, conn) -> dict:
    ns = ns_of(cmd, "findAndModify")
    remove, upd = bool(cmd.get("remove")), cmd.get("update")
    if remove == (upd is not None):
        raise bad_value("findAndModify needs exactly one of 'remove' and 'update'")
    compute = None
    if isinstance(upd, list):  # a pipeline: the port computes the replacement
        upd = _plain(upd)
        if cmd.get("arrayFilters") is not None:
            raise CommandError("arrayFilters may not be specified for pipeline-style "
                               "updates", 51198, "FailedToParse")
        pipeline, upd = aggregate.update_pipeline(upd), None
        variables = aggregate.let_of(cmd)
        compute = lambda doc: _pipelined(doc, pipeline, variables)  # noqa: E731
    fields = _plain(cmd.get("fields")) or None
    flt, sort = _plain(cmd.get("query") or {}), _sort(cmd.get("sort"))

    def work(call):
        f = flt
        if not aggregate.plain_filter(flt):  # $expr: the port picks the document
            rest = {k: v for k, v in flt.items() if k != "$expr"}
            test = aggregate.matcher(flt, aggregate.let_of(cmd))
            got = call({"op": "find", "ns": ns, "filter": rest, "sort": sort})
            hit = next((x for x in got["docs"] if test(x)), None)
            while hit is None and got.get("cursor"):
                got = call({"op": "getMore", "ns": ns, "cursor": got["cursor"]})
                hit = next((x for x in got["docs"] if test(x)), None)
            if got.get("cursor"):
                call({"op": "killCursors", "cursors": [got["cursor"]]})
            f = {"$and": [{"_id": {"$in": [] if hit is None else [hit["_id"]]}}, rest]}
        return composite.find_and_modify(
            call, ns, f, upd, remove=remove, sort=sort, upsert=bool(cmd.get("upsert")),
            new=bool(cmd.get("new")), array_filters=_plain(cmd.get("arrayFilters")),
            compute=compute, upsert_id=bson.ObjectId())
    leo, value = _atomically(d, cmd, work)
    if value is not None and fields:
        value = project(value, fields, flt)
    return {"lastErrorObject": leo, "value": value}


def storage_stats(d, conn, ns: str, scale: int = 1) -> dict:
    """``collStats``' answer (and ``$collStats``' ``storageStats``), from the
    member's count of ``ns``: sizes are raymx's stored (msgpack) bytes, not
    BSON's; nothing is compressed, so storage equals data."""
    if ns == oplog_view.NS:
        return oplog_view.stats(d.service.e, d.service.oplog_cap, scale)
    st = d.call({"op": "collStats", "ns": ns}, conn.state)["value"]
    n, size = st["count"], st["size"]
    ix = {k: v[1] // scale for k, v in st["indexes"].items()}
    return {"ns": ns, "count": n, "size": size // scale, "avgObjSize": size // n if n else 0,
            "storageSize": size // scale, "freeStorageSize": 0, "capped": False,
            "nindexes": len(ix), "indexSizes": ix, "totalIndexSize": sum(ix.values()),
            "totalSize": size // scale + sum(ix.values()), "scaleFactor": scale}


def _rename_collection(d, cmd: dict, conn):
    src, to = cmd.get("renameCollection"), cmd.get("to")
    for what, v in (("renameCollection", src), ("to", to)):
        if not isinstance(v, str) or "." not in v:
            raise bad_value(f"{what} must be a full namespace ('db.collection'), not {v!r:.60}")
    try:
        yield from _run(d, {"op": "renameCollection", "ns": src, "to": to,
                            "drop_target": bool(cmd.get("dropTarget")), **wc_fields(cmd)},
                        cmd, conn)
    except errors.WriteConcernTimeout as e:
        return {"writeConcernError": write_concern_error(e)}
    return {}


# they build on this module: imported last
from raymx.wire import pipelines, queries, sessions  # noqa: E402

COMMANDS = {
    "insert": sessions.retryable(_insert), "update": sessions.retryable(_update),
    "delete": sessions.retryable(_delete),
    "find": queries._find,
    "getmore": queries._get_more, "killcursors": queries._kill_cursors,
    "count": queries._count, "distinct": queries._distinct,
    "findandmodify": sessions.retryable(_find_and_modify),
    "aggregate": pipelines.aggregate_command,
    "committransaction": sessions.commit, "aborttransaction": sessions.abort,
    "renamecollection": _rename_collection, "explain": pipelines.explain,
}
