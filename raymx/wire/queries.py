"""Read commands of the wire port (find, getMore, killCursors, count,
distinct) and the reads other commands build on: ``scan`` (every matching
document, through a member cursor), ``check_hint`` (a command's hint as the
member's plan) and ``_results`` (a cursor over documents the port computed).
Like ``crud.py``'s, the commands are steps (``crud.call``, ``crud.blocking``).
"""
from __future__ import annotations

from bson import Int64

from raymx import errors
from raymx.storage import query
from raymx.storage.gtid import GTID
from raymx.wire import aggregate, oplog_view, pipelines
from raymx.wire.crud import (_docs, _plain, _run, _sort, blocking, call, ns_of,
                             operation_time, read_fields)
from raymx.wire.errors import CommandError, integer


# find's options that change its answer and that raymx does not serve: refused,
# never ignored (comment, noCursorTimeout, allowDiskUse... only change how an
# answer is reached, and are ignored; a hint is checked; maxTimeMS is the
# member's max_time_ms, read_fields)
_FIND_REFUSED = {
    "min": "min/max are not supported by raymx: use a range filter ($gte/$lt) on the "
           "index's fields",
    "max": "min/max are not supported by raymx: use a range filter ($gte/$lt) on the "
           "index's fields",
    "returnKey": "returnKey is not supported by raymx: project the index's fields",
    "showRecordId": "showRecordId is not supported by raymx: its documents have no record id",
    "tailable": "tailable cursors need a capped collection: raymx's only one is "
                "local.oplog.rs; watch() the collection (a change stream) instead",
}


def check_hint(d, cmd: dict, conn, ns: str):
    """The member's hint for the command's ``hint`` (an index's name or key
    pattern, or ``{$natural: 1 | -1}``): the index's name, or the
    ``$natural`` order; None when the collection does not exist. An index the
    collection does not have fails, as MongoDB's planner refuses it.
    Blocking: call it only when the command has a hint."""
    hint = cmd["hint"]
    if isinstance(hint, dict) and "$natural" in hint:
        if len(hint) != 1 or hint["$natural"] not in (1, -1):
            raise CommandError("$natural hint must be {$natural: 1} or {$natural: -1}", 2,
                               "BadValue")
        return {"$natural": int(hint["$natural"])}
    ixs = d.call({"op": "listIndexes", "ns": ns}, conn.state)["value"]
    if isinstance(hint, str):
        found = [ix["name"] for ix in ixs if ix["name"] == hint]
    elif isinstance(hint, dict):
        want = [[k, v] for k, v in hint.items()]
        found = [ix["name"] for ix in ixs if [[k, v] for k, v in ix["key"]] == want]
    else:
        raise CommandError("hint must be an index name or a key pattern", 2, "BadValue")
    if found:
        return found[0]
    if ns in d.call({"op": "listCollections"}, conn.state)["value"]:
        raise CommandError("error processing query: planner returned error :: caused by :: "
                           f"hint provided does not correspond to an existing index: "
                           f"{hint!r:.200}", 2, "BadValue")
    return None


def hint_field(hint) -> dict:
    """A member request's ``hint`` for ``check_hint``'s answer (the plan to
    read by, as MongoDB's): none when the command has none, or the collection
    does not exist."""
    return {} if hint is None else {"hint": hint}


def check_objects(cmd: dict, fields: tuple) -> None:
    """Each of the command's ``fields`` that is given is a document, as
    MongoDB's parser requires (a list filter failed deep inside, with
    Python's words)."""
    name = next(iter(cmd))
    for f in fields:
        v = cmd.get(f)
        if v is not None and not isinstance(v, dict):
            kind = {list: "array", str: "string", bool: "bool", float: "double"}.get(
                type(v), type(v).__name__)
            raise CommandError(f"BSON field '{name}.{f}' is the wrong type '{kind}', "
                               "expected type 'object'", 14, "TypeMismatch")


def _find(d, cmd: dict, conn):
    ns = ns_of(cmd, "find")
    check_objects(cmd, ("filter", "sort", "projection", "let", "collation"))
    tail = ns == oplog_view.NS and bool(cmd.get("tailable"))
    for k, why in _FIND_REFUSED.items():
        if cmd.get(k) not in (None, False, {}) and not (tail and k == "tailable"):
            raise CommandError(why, 2, "BadValue")
    if cmd.get("awaitData") and not cmd.get("tailable"):
        raise CommandError("Cannot set 'awaitData' without also setting 'tailable'", 9,
                           "FailedToParse")
    hint = (yield blocking(check_hint, d, cmd, conn, ns)) if cmd.get("hint") else None
    limit = integer(cmd, "limit")
    single = bool(cmd.get("singleBatch")) or limit < 0
    limit = abs(limit)
    flt = _plain(cmd.get("filter") or {})
    if tail:
        if not aggregate.plain_filter(flt) or pipelines.computed_projection(
                cmd.get("projection")):
            raise CommandError(f"a tailable cursor on {ns} takes a plain filter and "
                               "projection ($expr and computed fields are not served)", 2,
                               "BadValue")
        return (yield blocking(d.streams.tail, _plain(cmd), conn, ns, flt))
    if ns == oplog_view.NS and aggregate.plain_filter(flt) \
            and not pipelines.computed_projection(cmd.get("projection")):
        out = yield blocking(oplog_view.find, d.service.e, flt, _plain(cmd.get("sort")),
                             integer(cmd, "skip"), limit, _plain(cmd.get("projection")))
        return _results(d, conn, ns, out, len(out) if single else cmd.get("batchSize"), {})
    if ns in pipelines.SYSTEM:
        return (yield blocking(lambda: pipelines.find_computed(
            d, cmd, conn, ns, flt, limit, single, pipelines.system_docs(d, conn, ns))))
    if not aggregate.plain_filter(flt) or pipelines.computed_projection(cmd.get("projection")):
        # $expr or computed fields: the port's expressions, over a scan
        return (yield blocking(pipelines.find_computed, d, cmd, conn, ns, flt, limit, single))
    batch = _batch_size(cmd)
    req = {"op": "find", "ns": ns, "filter": flt,
           "projection": _plain(cmd.get("projection")) or None, "sort": _sort(cmd.get("sort")),
           "skip": integer(cmd, "skip"), "limit": limit, **hint_field(hint),
           **read_fields(cmd)}
    if batch:
        req["batch"] = batch
    elif limit:
        req["batch"] = limit
    res = yield from _run(d, req, cmd, conn)
    cid = res.get("cursor") or 0
    if cid and single:
        yield call({"op": "killCursors", "cursors": [cid]}, conn.state)
        cid = 0
    return {"cursor": {"firstBatch": res["docs"], "id": Int64(cid), "ns": ns, **_at(res)}}


def _at(res: dict) -> dict:
    """A snapshot read's ``atClusterTime`` (the GTID it read at), which a
    snapshot session sends back so that its later reads see the same data."""
    at = res.get("at")
    return {} if at is None else {"atClusterTime": operation_time(GTID(*at))}


def _results(d, conn, ns: str, out: list, batch: int | None, seen: dict) -> dict:
    """A command's cursor over documents the port computed (the member's
    cursor table keeps them: ``ReadPath.open_results``), a batch at a time;
    ``seen``: what ``scan`` saw (a snapshot read's point)."""
    res = d.service.open_results(out, batch, conn.state)
    return {"cursor": {"firstBatch": res["docs"], "id": Int64(res["cursor"]), "ns": ns,
                       **_at(seen)}}


def _batch_size(cmd: dict) -> int:
    """A find's or getMore's ``batchSize`` (0: the default), never negative."""
    n = integer(cmd, "batchSize")
    if n < 0:
        raise CommandError(f"BatchSize value must be non-negative, but received: {n}", 51024,
                           "Location51024")
    return n


def _get_more(d, cmd: dict, conn):
    cid = cmd.get("getMore")
    coll = cmd.get("collection")
    if not isinstance(cid, int) or not isinstance(coll, str):
        raise CommandError("getMore needs a cursor id (long) and 'collection'", 14,
                           "TypeMismatch")
    if d.streams.owns(int(cid)):
        return (yield blocking(d.streams.get_more, int(cid), cmd, conn))
    req = {"op": "getMore", "cursor": int(cid)}
    if _batch_size(cmd):
        req["batch"] = _batch_size(cmd)
    try:
        res = yield call(req, conn.state)
    except errors.InvalidOperation as e:
        if "not found" in str(e):
            raise CommandError(f"cursor id {int(cid)} not found", 43, "CursorNotFound") \
                from None
        raise
    ns = f"{cmd.get('$db')}.{coll}"
    return {"cursor": {"nextBatch": res["docs"], "id": Int64(res.get("cursor") or 0), "ns": ns}}


def _kill_cursors(d, cmd: dict, conn):
    ids = [int(x) for x in _docs(cmd.get("cursors"), "cursors")]
    gone = set(d.streams.kill([x for x in ids if d.streams.owns(x)]))
    mine = [x for x in ids if not d.streams.owns(x)]
    if mine:
        res = yield call({"op": "killCursors", "cursors": mine}, conn.state)
        gone.update(res.get("notFound", ()))  # as MongoDB: no open cursor, not found
    return {"cursorsKilled": [Int64(x) for x in ids if x not in gone],
            "cursorsNotFound": [Int64(x) for x in ids if x in gone],
            "cursorsAlive": [], "cursorsUnknown": []}


def scan(d, cmd: dict, conn, ns: str, flt, projection=None, sort=None, limit=None,
         seen=None, hint=None):
    """Every matching document (a find and its getMores; the first ``limit``
    only, if given, from a collection). ``seen``: a dict that gets the first
    answer's snapshot point (``at``), if any; ``hint``: the member's plan
    (``check_hint``)."""
    if ns == oplog_view.NS:  # an aggregate, a distinct, a computed find of the oplog
        yield from oplog_view.docs(d.service.e, flt, sort, projection)
        return
    res = d.drive(_run(d, {"op": "find", "ns": ns, "filter": flt or {},
                           "projection": projection, "sort": sort,
                           **({"limit": limit} if limit else {}),
                           **hint_field(hint), **read_fields(cmd)},
                       cmd, conn))
    if seen is not None and "at" not in seen:
        seen["at"] = res.get("at")
    yield from res["docs"]
    cid = res.get("cursor")
    try:
        while cid:
            res = d.call({"op": "getMore", "cursor": cid}, conn.state)
            cid = res.get("cursor")
            yield from res["docs"]
    finally:
        if cid:
            d.call({"op": "killCursors", "cursors": [cid]}, conn.state)


def _port_matched(d, cmd: dict, conn, ns: str, flt) -> list:
    """The documents of ``ns`` matching ``flt``, a filter the port evaluates
    (``$expr``: its aggregation expressions) over a scan. Blocking."""
    if aggregate.plain_filter(flt):
        return list(scan(d, cmd, conn, ns, flt))
    return aggregate.run(scan(d, cmd, conn, ns, {}), [{"$match": flt}], None, None,
                         pipelines.port_limit(cmd, conn))


def _count(d, cmd: dict, conn):
    ns = ns_of(cmd, "count")
    check_objects(cmd, ("query",))
    hint = (yield blocking(check_hint, d, cmd, conn, ns)) if cmd.get("hint") else None
    flt = _plain(cmd.get("query") or {})
    if ns == oplog_view.NS:  # counted as it streams (scan)
        n = yield blocking(lambda: sum(1 for _ in scan(d, cmd, conn, ns, flt)))
    elif not aggregate.plain_filter(flt):  # $expr: the port's, over a scan
        n = yield blocking(lambda: len(_port_matched(d, cmd, conn, ns, flt)))
    else:
        n = (yield from _run(d, {"op": "count", "ns": ns, "filter": flt, **hint_field(hint),
                                 **read_fields(cmd)}, cmd, conn))["value"]
    n = max(0, n - integer(cmd, "skip"))
    lim = abs(integer(cmd, "limit"))
    return {"n": min(n, lim) if lim else n}


def _distinct(d, cmd: dict, conn) -> dict:
    ns = ns_of(cmd, "distinct")
    check_objects(cmd, ("query",))
    key = cmd.get("key")
    if not isinstance(key, str) or not key:
        raise CommandError("distinct needs a string 'key'", 14, "TypeMismatch")
    flt = _plain(cmd.get("query") or {})
    if ns == oplog_view.NS or not aggregate.plain_filter(flt):
        # the oplog's view is read as it streams; an $expr is the port's, over a scan
        docs = yield blocking(lambda: _port_matched(d, cmd, conn, ns, flt))
        return {"values": query.distinct_values(docs, key)}
    return {"values": (yield from _run(d, {"op": "distinct", "ns": ns, "key": key,
                                           "filter": flt, **read_fields(cmd)},
                                       cmd, conn))["value"]}
