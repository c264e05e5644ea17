"""The ``aggregate`` command and ``explain``: a pipeline over what the member
reads (``aggregate.py``), its result through a cursor, a last ``$out`` or
``$merge`` written in one member transaction, and how a read reads; and a
``find`` the port computes as a pipeline (``$expr``, computed fields). Steps
and helpers are ``crud.py``'s, which imports this module last, and reads
``queries.py``'s (referred to when called: it imports this module).
"""
from __future__ import annotations

import datetime
import time

import bson

from raymx.actors import reads
from raymx.storage.keys import encode_key
from raymx.wire import aggregate, oplog_view, queries, rs_status
from raymx.wire.crud import (_atomically, _docs, _plain, _run, _sort, ns_of, read_fields,
                             storage_stats)
from raymx.wire.errors import CommandError, integer


# MongoDB's system collections that tools read (mongosh's
# rs.printSecondaryReplicationInfo() counts local.system.replset's documents
# first), served read-only from what raymx keeps
SYSTEM = ("local.system.replset",)


def system_docs(d, conn, ns: str) -> list[dict]:
    assert ns in SYSTEM
    return [rs_status.get_config(d, {}, conn)["config"]]


def port_limit(cmd: dict, conn):
    """The limit of what the port computes itself for a command (a pipeline's
    stages, a computed find): its ``maxTimeMS`` counted from the command's
    start, as MongoDB's (the member's reads count theirs too), and a
    ``killOp`` of it. ``aggregate.run`` looks at it between stages."""
    limit = reads.time_limit(read_fields(cmd))
    if limit is not None:
        current = getattr(conn, "current", None)
        limit.counted_from(current[1] if current else time.monotonic())
    return reads.read_check(limit, conn.state)


def aggregate_command(d, cmd: dict, conn) -> dict:
    pipeline = _docs(cmd.get("pipeline"), "pipeline")
    if pipeline and isinstance(pipeline[0], dict) and "$changeStream" in pipeline[0]:
        return d.streams.start(cmd, conn, pipeline[0]["$changeStream"], _plain(pipeline[1:]))
    if cmd.get("aggregate") == 1 and pipeline and isinstance(pipeline[0], dict) \
            and "$currentOp" in pipeline[0]:  # mongosh's db.currentOp()
        from raymx.wire import commands
        ns = f"{cmd.get('$db')}.$cmd.aggregate"
        out = aggregate.run(iter(commands._current_op(d, cmd, conn)["inprog"]),
                            _plain(pipeline[1:]), variables=aggregate.let_of(cmd),
                            limit=port_limit(cmd, conn))
        return queries._results(d, conn, ns, out, None, {})
    documents = aggregate.starts_with_documents(pipeline)
    if cmd.get("aggregate") == 1 and documents:  # a pipeline over its own documents
        return _pipeline_results(d, cmd, conn, f"{cmd.get('$db')}.$cmd.aggregate",
                                 _plain(pipeline), [], {})
    if not isinstance(cmd.get("aggregate"), str):
        raise CommandError("aggregate: only collection pipelines, $documents and $currentOp "
                           "are supported with {aggregate: 1}", 73, "InvalidNamespace")
    if documents:
        raise CommandError("$documents may only be used with {aggregate: 1} (a database's "
                           "aggregate), not on a collection", 73, "InvalidNamespace")
    ns = ns_of(cmd, "aggregate")
    pipeline = _plain(_docs(cmd.get("pipeline"), "pipeline"))
    if cmd.get("explain"):  # pymongo's aggregate(..., explain=True)
        return explain(d, {"explain": {"aggregate": cmd["aggregate"],
                                        "pipeline": cmd.get("pipeline"), "$db": cmd.get("$db")},
                            "$db": cmd.get("$db")}, conn)
    aggregate.check(pipeline)
    hint = queries.check_hint(d, cmd, conn, ns) if cmd.get("hint") else None  # the source's plan
    flt, source = {}, None
    if ns in SYSTEM:
        source = system_docs(d, conn, ns)
    elif pipeline and "$collStats" in pipeline[0]:
        source, pipeline = [_coll_stats_doc(d, conn, ns, pipeline[0]["$collStats"])], pipeline[1:]
    elif pipeline and "$indexStats" in pipeline[0]:
        source, pipeline = _index_stats_docs(d, conn, ns, pipeline[0]["$indexStats"]), \
            pipeline[1:]
    elif pipeline and "$match" in pipeline[0] and aggregate.plain_filter(pipeline[0]["$match"]):
        flt, pipeline = pipeline[0]["$match"], pipeline[1:]  # pushed down to the member
    counted = aggregate.count_shape(pipeline) if source is None and ns != oplog_view.NS \
        and (cmd.get("readConcern") or {}).get("level") != "snapshot" else None
    if counted is not None and not counted[1]:
        # count_documents: the member counts, and sends no document (with a
        # limit, the documents stream instead and the count stops at it)
        skip, _, gid, name = counted
        n = d.drive(_run(d, {"op": "count", "ns": ns, "filter": flt, **read_fields(cmd),
                             **queries.hint_field(hint)}, cmd, conn))["value"]
        n = max(0, n - skip)
        source, pipeline = ([{"_id": gid, name: n}] if n else []), []
    # a leading $sort is pushed down too: the member reads in that order where
    # an index holds it, and keeps only the first skip + limit of a $limit after
    pushed = aggregate.sort_pushdown(pipeline) if source is None and ns != oplog_view.NS \
        else None
    sort, most = pushed or (None, None)
    if pushed is not None:
        pipeline = pipeline[1:]
    seen = {}
    return _pipeline_results(d, cmd, conn, ns, pipeline, source if source is not None
                             else queries.scan(d, cmd, conn, ns, flt, sort=sort, limit=most,
                                               seen=seen, hint=hint),
                             seen)


def _pipeline_results(d, cmd: dict, conn, ns: str, pipeline: list, source, seen: dict) -> dict:
    """``pipeline`` run over ``source``, a last ``$out`` or ``$merge``
    written, the output answered through a cursor."""
    db = ns.split(".", 1)[0]
    if not isinstance(cmd.get("cursor"), dict):
        raise CommandError("The 'cursor' option is required, except for aggregate with the "
                           "explain argument", 9, "FailedToParse")
    final = pipeline.pop() if pipeline and next(iter(pipeline[-1])) in aggregate.OUTPUTS \
        else None
    out = aggregate.run(iter(source), pipeline,
                        lambda coll: queries.scan(d, cmd, conn, f"{db}.{coll}", {}),
                        aggregate.let_of(cmd), port_limit(cmd, conn))
    if final is not None:  # $out / $merge: written, and an empty cursor answers
        _write_output(d, cmd, db, final, out)
        out = []
    # a cursor over the output, a batch at a time as MongoDB's: one answer of
    # it all broke drivers past maxMessageSizeBytes (48 MB)
    spec = cmd.get("cursor")
    batch = spec.get("batchSize") if isinstance(spec, dict) else None
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 0):
        raise CommandError(f"cursor.batchSize must be a non-negative integer, not {batch!r}",
                           2, "BadValue")
    return queries._results(d, conn, ns, out, batch, seen)


def _write_output(d, cmd: dict, db: str, stage: dict, docs: list) -> None:
    """A pipeline's ``$out`` or ``$merge``, in one member transaction (so a
    reader sees the target before or after, never between, and a refused
    document leaves the target as it was). ``$out`` replaces the target's
    documents and keeps its indexes; ``$merge`` matches on ``_id``. Output
    documents without an ``_id`` get an ObjectId, as MongoDB's."""
    name, spec = next(iter(stage.items()))
    target, matched, unmatched = aggregate.output_spec(name, spec, db)
    for doc in docs:
        if "_id" not in doc:
            doc["_id"] = bson.ObjectId()
    if name == "$out":
        def work(call):
            call({"op": "delete", "ns": target, "filter": {}, "multi": True})
            if docs:
                call({"op": "insert", "ns": target, "docs": docs})
        return _atomically(d, cmd, work)

    def merge(call):
        have = set()
        for i in range(0, len(docs), MERGE_LOOKUP_IDS):
            ids = [x["_id"] for x in docs[i:i + MERGE_LOOKUP_IDS]]
            got = call({"op": "find", "ns": target, "filter": {"_id": {"$in": ids}},
                        "projection": {"_id": 1}})
            while True:
                have.update(encode_key(x["_id"]) for x in got["docs"])
                if not got.get("cursor"):
                    break
                got = call({"op": "getMore", "ns": target, "cursor": got["cursor"]})
        keep = []
        for doc in docs:
            k = encode_key(doc["_id"])
            found = k in have
            mode = matched if found else unmatched
            if mode == "fail":
                raise CommandError(
                    f"$merge: the document with _id {doc['_id']!r:.60} "
                    + (f"is in {target} already (whenMatched" if found else
                       f"has no match in {target} (whenNotMatched")
                    + ": 'fail'); nothing was written", *_MERGE_FAILS[found])
            if mode in ("keepExisting", "discard"):
                continue
            have.add(k)  # a later output document with this _id matches it
            keep.append(doc)
        if keep:
            call({"op": "replaceMany", "ns": target, "docs": keep, "upsert": True,
                  "merge": matched == "merge"})
    _atomically(d, cmd, merge)


MERGE_LOOKUP_IDS = 500  # output _ids looked up in the target per find
_MERGE_FAILS = {True: (11000, "DuplicateKey"), False: (13113, "MergeStageNoMatchingDocument")}


def _coll_stats_doc(d, conn, ns: str, spec) -> dict:
    """``$collStats``' one document: ``storageStats`` and ``count`` if asked."""
    if not isinstance(spec, dict) or set(spec) - {"storageStats", "count", "latencyStats",
                                                   "queryExecStats"}:
        raise CommandError(f"$collStats takes storageStats, count, latencyStats and "
                           f"queryExecStats, not {spec!r:.80}", 40415, "Location40415")
    out = {"ns": ns, "host": d.port.address,
           "localTime": datetime.datetime.now(datetime.timezone.utc)}
    if "storageStats" in spec or "count" in spec:
        st = storage_stats(d, conn, ns)
        if "storageStats" in spec:
            out["storageStats"] = st
        if "count" in spec:
            out["count"] = st["count"]
    return out


def _index_stats_docs(d, conn, ns: str, spec) -> list[dict]:
    """``$indexStats``: each index of ``ns`` with the queries (finds, counts,
    updates and deletes) whose plan used it since this member opened its
    store, in MongoDB's shape."""
    if spec != {}:
        raise CommandError("$indexStats takes no arguments ({})", 28803, "Location28803")
    from raymx.wire.indexes import index_doc
    out = []
    for ix in d.call({"op": "indexStats", "ns": ns}, conn.state)["value"]:
        doc = index_doc(ix)
        since = datetime.datetime.fromtimestamp(ix["since_ms"] / 1000, datetime.timezone.utc)
        out.append({"name": ix["name"], "key": doc["key"], "host": d.port.address,
                    "accesses": {"ops": bson.Int64(ix["ops"]), "since": since}, "spec": doc})
    return out


_EXPLAINED = {"find": "filter", "count": "query", "distinct": "query", "aggregate": None}


def explain(d, cmd: dict, conn) -> dict:
    """``explain`` of a find, count, distinct or aggregate: the member runs the
    read (a find to its end, or the aggregate's leading ``$match``) and says
    how it read (``IDHACK``, an index scan and its index, or a collection
    scan) and what it examined, in MongoDB's ``queryPlanner`` /
    ``executionStats`` shape. Nothing is written."""
    inner = cmd.get("explain")
    kind = next(iter(inner), "").lower() if isinstance(inner, dict) else ""
    kind = {k.lower(): k for k in _EXPLAINED}.get(kind, "")
    if not kind:
        raise CommandError("explain: raymx explains find, count, distinct and aggregate, not "
                           f"{next(iter(inner), None) if isinstance(inner, dict) else inner!r}",
                           2, "BadValue")
    inner = dict(inner, **({"$db": cmd["$db"]} if "$db" in cmd and "$db" not in inner else {}))
    ns = ns_of(inner, next(iter(inner)))
    if kind == "aggregate":
        stages = _plain(_docs(inner.get("pipeline"), "pipeline"))
        aggregate.check(stages)
        matched = bool(stages) and "$match" in stages[0] \
            and aggregate.plain_filter(stages[0]["$match"])
        flt = stages[0]["$match"] if matched else {}
        req = {"filter": flt}
        pushed = aggregate.sort_pushdown(stages[1:] if matched else stages) \
            if ns != oplog_view.NS else None  # as aggregate_command pushes it
        if pushed is not None:
            req["sort"], req["limit"] = pushed[0], pushed[1] or 0
    else:
        flt = _plain(inner.get(_EXPLAINED[kind]) or {})
        if not aggregate.plain_filter(flt):
            raise CommandError("explain: a filter with $expr is computed in the port and not "
                               "explained", 2, "BadValue")
        req = {"filter": flt}
        if kind != "distinct" and inner.get("hint"):
            req.update(queries.hint_field(queries.check_hint(d, inner, conn, ns)))
        if kind == "distinct":
            req["key"] = inner.get("key")
        if kind == "find":
            req.update(projection=_plain(inner.get("projection")) or None,
                       sort=_sort(inner.get("sort")), skip=int(inner.get("skip") or 0),
                       limit=abs(int(inner.get("limit") or 0)))
    got = d.call({"op": "explain", "ns": ns, **req, **read_fields(inner)}, conn.state)["value"]
    plan = got["plan"] or "EOF"
    stage, _, name = plan.partition(" ")
    if stage in ("IXSCAN", "DISTINCT_SCAN"):  # a distinct's: one document per value
        keys = {x["name"]: x["key"] for x in d.call({"op": "listIndexes", "ns": ns},
                                                      conn.state)["value"]}
        winning = {"stage": "FETCH" if stage == "IXSCAN" else "PROJECTION_COVERED",
                   "inputStage": {
                       "stage": stage, "indexName": name,
                       "keyPattern": {p: dr for p, dr in keys.get(name, [["_id", 1]])},
                       "direction": got.get("in_order") or "forward"}}
    else:
        winning = {"stage": plan, **({"direction": "forward"} if plan == "COLLSCAN" else {})}
    if req.get("sort") and not got.get("in_order"):  # else the index scan gave the order
        winning = {"stage": "SORT", "sortPattern": dict(inner.get("sort") or req["sort"]),
                   "inputStage": winning}
    if req.get("limit"):
        winning = {"stage": "LIMIT", "limitAmount": req["limit"], "inputStage": winning}
    return {"explainVersion": "1",
            "queryPlanner": {"namespace": ns, "parsedQuery": flt, "winningPlan": winning,
                             "rejectedPlans": []},
            "executionStats": {"executionSuccess": True, "nReturned": got["returned"],
                               "executionTimeMillis": int(got["ms"]),
                               "totalDocsExamined": got["examined"],
                               "totalKeysExamined": got["examined"]
                               if stage in ("IXSCAN", "IDHACK", "DISTINCT_SCAN") else 0},
            "serverInfo": {"host": d.port.address, "version": _version(), "gitVersion": "raymx"},
            "command": inner}


def _version() -> str:
    from raymx.wire.commands import VERSION  # commands imports this module
    return VERSION


def computed_projection(proj) -> bool:
    """A find's projection with aggregation expressions (MongoDB 4.4's), which
    the port computes; 0/1, ``$slice`` and ``$elemMatch`` the member does."""
    if not isinstance(proj, dict):
        return False
    return any(not (type(v) in (bool, int, float) and v in (0, 1)) and not (
        isinstance(v, dict) and len(v) == 1 and next(iter(v)) in ("$slice", "$elemMatch"))
        for v in proj.values())


def find_computed(d, cmd: dict, conn, ns: str, flt: dict, limit: int, single: bool,
                  source: list | None = None) -> dict:
    """A find whose filter holds ``$expr``: the member reads what the rest of
    the filter selects, the port runs the same steps as a pipeline and hands
    the result to a cursor, as an aggregate's. ``source``: the documents, where
    the member holds none (``SYSTEM``)."""
    pipeline = [{"$match": flt}]
    if cmd.get("sort"):
        pipeline.append({"$sort": dict(_plain(cmd["sort"]))})
    if cmd.get("skip"):
        pipeline.append({"$skip": integer(cmd, "skip")})
    if limit:
        pipeline.append({"$limit": limit})
    if cmd.get("projection"):
        pipeline.append({"$project": _plain(cmd["projection"])})
    rest, seen = {k: v for k, v in flt.items() if k != "$expr"}, {}
    out = aggregate.run(iter(source) if source is not None else queries.scan(
        d, cmd, conn, ns, rest if aggregate.plain_filter(rest) else {}, seen=seen),
        pipeline, variables=aggregate.let_of(cmd), limit=port_limit(cmd, conn))
    return queries._results(d, conn, ns, out,
                    len(out) if single else (cmd.get("batchSize") or limit or None), seen)
