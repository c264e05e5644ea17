"""Aggregation pipelines, pure code over documents (the wire port's
``aggregate``): ``$match $project $addFields/$set $unset $sort $skip $limit
$count $unwind $sample $replaceRoot/$replaceWith $sortByCount $facet
$lookup`` (``localField``/``foreignField``, or a ``pipeline`` with or without
``let``, or both; the other collection comes from the caller's ``lookup``),
``$unionWith``, and a ``$match``'s top-level ``$expr``; ``$group $bucket
$bucketAuto $setWindowFields`` are ``grouping.py``'s; a last ``$out`` or
``$merge`` is checked here (``output_spec``) and written by the caller.
Expressions are evaluated by ``evaluation.py`` (with ``expressions.py`` and
``dates.py``).
"""
from __future__ import annotations

import copy
import functools
import itertools
import random
from typing import Callable, Iterable

from bson import Int64

from raymx.storage import numbers, query
from raymx.storage.projection import nested_as_paths, project
from raymx.wire import grouping
from raymx.wire.errors import CommandError
from raymx.wire.evaluation import (MISSING, _err, _set_path, _truthy, cluster_time, evaluate,
                                   now)

STAGES = ("$match", "$project", "$addFields", "$set", "$unset", "$sort", "$skip", "$limit",
          "$group", "$count", "$unwind", "$sample", "$replaceRoot", "$replaceWith",
          "$sortByCount", "$facet", "$lookup", "$collStats", "$indexStats", "$unionWith",
          "$out", "$merge",
          "$bucket", "$bucketAuto", "$setWindowFields", "$fill", "$densify",
          "$graphLookup", "$redact", "$documents")
OUTPUTS = ("$out", "$merge")  # the last stage only: the caller writes the output
_MERGE_FIELDS = {"into", "on", "whenMatched", "whenNotMatched"}
_LOOKUP_FIELDS = {"from", "as", "localField", "foreignField", "pipeline", "let"}
_GRAPH_FIELDS = {"from", "as", "startWith", "connectFromField", "connectToField", "maxDepth",
                 "depthField", "restrictSearchWithMatch"}


def check(pipeline: list, top: bool = True) -> None:
    """Refuse an unknown or malformed stage before reading anything (``top``:
    the command's own pipeline, where ``$out`` or ``$merge`` may end it)."""
    for i, st in enumerate(pipeline):
        if not isinstance(st, dict) or len(st) != 1:
            raise _err("A pipeline stage specification object must contain exactly one "
                       "field.", 40323)
        name = next(iter(st))
        if name not in STAGES:
            raise _err(f"Unrecognized pipeline stage name: '{name}'", 40324)
        arg = st[name]
        if name == "$documents" and i:
            raise _err("$documents is only valid as the first stage in a pipeline", 40602)
        if name in OUTPUTS:
            if not top or i != len(pipeline) - 1:
                raise _err(f"{name} can only be the final stage in the pipeline", 40601)
            output_spec(name, arg, "db")
        elif name == "$unionWith":
            coll, sub = _union_spec(arg)
            check(sub, False)
        if name == "$facet":
            if not isinstance(arg, dict) or not arg:
                raise _err("the $facet specification must be a non-empty object", 40169)
            for sub in arg.values():
                if not isinstance(sub, list):
                    raise _err("arguments to $facet must be arrays", 40170)
                check(sub, False)
        elif name == "$graphLookup":
            _graph_spec(arg)
        elif name == "$lookup":
            if not isinstance(arg, dict) or not isinstance(arg.get("as"), str) or (
                    not isinstance(arg.get("from"), str) if "from" in arg
                    else not starts_with_documents(arg.get("pipeline"))):
                raise _err("$lookup needs 'from' (unless its pipeline starts with "
                           "$documents) and 'as', strings", 9 if isinstance(arg, dict)
                           and "from" not in arg else 40321)
            let = arg.get("let")
            if let is not None:
                if not isinstance(let, dict) or "pipeline" not in arg:
                    raise _err("$lookup's let must be an object, with a pipeline", 9)
                for name in let:
                    if not isinstance(name, str) or not name[:1].islower() \
                            or not name.replace("_", "").isalnum():
                        raise _err(f"$lookup: {name!r} is not a valid variable name", 16867)
            extra = set(arg) - _LOOKUP_FIELDS
            if extra:
                raise _err(f"unknown argument to $lookup: {sorted(extra)[0]}", 9)
            if ("localField" in arg) != ("foreignField" in arg) or not (
                    "localField" in arg or "pipeline" in arg):
                raise _err("$lookup needs localField and foreignField, or a pipeline", 40322)
            if "pipeline" in arg:
                if not isinstance(arg["pipeline"], list):
                    raise _err("$lookup's pipeline must be an array", 14)
                check(arg["pipeline"], False)


def _union_spec(arg) -> tuple[str | None, list]:
    """(collection, pipeline) of a ``$unionWith``; no collection for a pipeline
    that starts with ``$documents``."""
    if isinstance(arg, str):
        arg = {"coll": arg}
    if not isinstance(arg, dict) or set(arg) - {"coll", "pipeline"} or (
            "coll" in arg and (not isinstance(arg["coll"], str) or not arg["coll"])):
        raise _err("$unionWith takes a collection name, or {coll, pipeline}", 40590)
    sub = arg.get("pipeline", [])
    if not isinstance(sub, list):
        raise _err("$unionWith's pipeline must be an array", 14)
    if "coll" not in arg and not starts_with_documents(sub):
        raise _err("$unionWith needs a collection ('coll'), unless its pipeline starts "
                   "with $documents", 9)
    return arg.get("coll"), sub


def starts_with_documents(pipeline) -> bool:
    return bool(pipeline) and isinstance(pipeline[0], dict) and "$documents" in pipeline[0]


def _documents(arg, v: dict | None) -> list[dict]:
    """The documents a ``$documents`` stage gives: its expression, evaluated
    once, must be an array of objects."""
    docs = evaluate(arg, {}, None, v)
    if not isinstance(docs, list):
        raise _err(f"$documents must evaluate to an array of objects, not {docs!r:.60}",
                   5858203)
    for d in docs:
        if not isinstance(d, dict):
            raise _err(f"$documents: every element must be an object, not {d!r:.60}", 40228)
    return copy.deepcopy(docs)


def _target(name: str, spec, db: str, what: str) -> str:
    if isinstance(spec, str):
        spec = {"db": db, "coll": spec}
    if not isinstance(spec, dict) or not isinstance(spec.get("coll"), str) \
            or not isinstance(spec.get("db", db), str) or set(spec) - {"db", "coll"}:
        raise _err(f"{name}'s {what} must be a collection name, or {{db, coll}}", 13111)
    tdb, coll = spec.get("db", db), spec["coll"]
    if not tdb or not coll or "$" in coll or "$" in tdb or "." in tdb \
            or coll.startswith("system.") or tdb in ("admin", "local", "config"):
        raise _err(f"{name} cannot write to {tdb}.{coll}: an invalid or reserved namespace",
                   17385)
    return f"{tdb}.{coll}"


def output_spec(name: str, spec, db: str) -> tuple[str, str, str]:
    """(target namespace, whenMatched, whenNotMatched) of an ``$out`` or a
    ``$merge`` stage of a pipeline on database ``db``; refused if raymx
    cannot do it as asked."""
    if name == "$out":
        return _target(name, spec, db, "argument"), "replace", "insert"
    if isinstance(spec, str):
        spec = {"into": spec}
    if not isinstance(spec, dict) or "into" not in spec:
        raise _err("$merge needs 'into': a collection name, or {db, coll}", 40414)
    extra = set(spec) - _MERGE_FIELDS
    if extra:
        raise _err(f"$merge: unknown argument '{sorted(extra)[0]}'"
                   + (" (let: raymx's $merge takes no variables)" if "let" in extra else ""),
                   40415)
    on = spec.get("on", "_id")
    if on not in ("_id", ["_id"]):
        raise _err("raymx's $merge matches documents on _id only ('on' must be '_id')", 51183)
    matched = spec.get("whenMatched", "merge")
    unmatched = spec.get("whenNotMatched", "insert")
    if isinstance(matched, list):
        raise _err("$merge with a pipeline for whenMatched is not supported by raymx: "
                   "use 'replace', 'merge', 'keepExisting' or 'fail'", 2)
    if matched not in ("replace", "merge", "keepExisting", "fail"):
        raise _err(f"$merge: whenMatched must be 'replace', 'merge', 'keepExisting' or "
                   f"'fail', not {matched!r:.40}", 51191)
    if unmatched not in ("insert", "discard", "fail"):
        raise _err(f"$merge: whenNotMatched must be 'insert', 'discard' or 'fail', not "
                   f"{unmatched!r:.40}", 51191)
    return _target(name, spec["into"], db, "'into'"), matched, unmatched


UPDATE_STAGES = ("$addFields", "$set", "$project", "$unset", "$replaceRoot", "$replaceWith")


def update_pipeline(pipeline) -> list:
    """An update's pipeline, checked: only the stages MongoDB allows there."""
    if not isinstance(pipeline, list):
        raise _err("an update pipeline must be an array of stages", 14)
    check(pipeline, False)
    for st in pipeline:
        name = next(iter(st))
        if name not in UPDATE_STAGES:
            raise _err(f"{name} is not allowed to be used within an update", 40324)
    return pipeline


def plain_filter(flt) -> bool:
    """A ``$match`` the member's query engine runs (no ``$expr``, no ``$text``)."""
    return isinstance(flt, dict) and not any(k in ("$expr", "$text", "$where") for k in flt)


# --- stages ----------------------------------------------------------------
def _flag(v) -> bool | None:
    """A projection value's inclusion (a boolean, or any number: non-zero is
    true, as MongoDB's), None for an expression."""
    if isinstance(v, bool):
        return v
    if numbers.is_number(v):
        return numbers.as_float(v) != 0
    return None


def _project(docs, spec: dict, variables=None):
    if not isinstance(spec, dict) or not spec:
        raise _err("$project requires at least one output field", 40177)
    spec = nested_as_paths(spec)
    plain = {k: f for k, f in ((k, _flag(v)) for k, v in spec.items()) if f is not None}
    computed = {k: v for k, v in spec.items() if k not in plain}
    # {_id: 0} alone (and $unset of _id) excludes too: every other field is kept
    excluding = any(not v for k, v in plain.items() if k != "_id") or (
        set(spec) == {"_id"} and not computed and not plain["_id"])
    if excluding and computed:
        raise _err("Cannot do exclusion and computed fields in the same $project", 31254)
    keep_id = spec.get("_id", 1) not in (0, False) if "_id" not in computed else False
    include = {k: 1 for k, v in plain.items() if v and k != "_id"}
    for d in docs:
        if excluding:
            yield project(d, plain)
            continue
        out = {"_id": d["_id"]} if keep_id and "_id" in d else {}
        if include:
            out.update(project(d, dict(include, _id=0)))
        for k, e in computed.items():
            _set_path(out, k, evaluate(e, d, None, variables))
        yield out


def _add_fields(docs, spec: dict, variables=None):
    if not isinstance(spec, dict):
        raise _err("$addFields specification stage must be an object", 40272)
    spec = nested_as_paths(spec, empty_ok=True)
    for d in docs:
        out = copy.deepcopy(d)
        for k, e in spec.items():
            _set_path(out, k, evaluate(e, d, None, variables))
        yield out


def _unwind(docs, spec):
    if isinstance(spec, str):
        spec = {"path": spec}
    path = spec.get("path")
    if not isinstance(path, str) or not path.startswith("$"):
        raise _err("$unwind path must be a string starting with '$'", 28818)
    path = path[1:]
    keep, index = bool(spec.get("preserveNullAndEmptyArrays")), spec.get("includeArrayIndex")
    for d in docs:
        v = query.get_path(d, path)
        if isinstance(v, list) and v:
            for i, x in enumerate(v):
                out = copy.deepcopy(d)
                _set_path(out, path, x)
                if index:
                    out[index] = i
                yield out
        elif isinstance(v, list) or v is None or v is MISSING:
            if keep:
                out = copy.deepcopy(d)
                if isinstance(v, list):
                    _set_path(out, path, MISSING)
                if index:
                    out[index] = None
                yield out
        else:
            out = copy.deepcopy(d)
            if index:
                out[index] = None
            yield out


def _match(flt, variables=None) -> Callable[[dict], bool]:
    """A ``$match``'s test: the query engine's filter, and a top-level
    ``$expr`` (an aggregation expression, true by MongoDB's truthiness)
    evaluated here, where the expressions live."""
    if not isinstance(flt, dict) or "$expr" not in flt:
        return query.compile_filter(flt)
    expr = flt["$expr"]
    rest = query.compile_filter({k: v for k, v in flt.items() if k != "$expr"})
    return lambda d: rest(d) and _truthy(evaluate(expr, d, None, variables))


def _sample(docs, spec) -> list:
    if not isinstance(spec, dict) or set(spec) != {"size"}:
        raise _err("$sample stage must specify a size", 28745)
    n = spec["size"]
    if isinstance(n, bool) or not isinstance(n, (int, float)) or n < 0:
        raise _err("size argument to $sample must not be negative", 28747)
    pool = list(docs)
    return random.sample(pool, min(int(n), len(pool)))


def _replace_root(docs, expr, variables=None):
    for d in docs:
        v = evaluate(expr, d, None, variables)
        if not isinstance(v, dict):
            raise _err("'newRoot' expression must evaluate to an object, but resulting value "
                       f"was: {None if v is MISSING else v!r:.80}", 40228)
        yield v


_KEEP, _PRUNE, _DESCEND = (object() for _ in range(3))
_REDACT_VARIABLES = {"KEEP": _KEEP, "PRUNE": _PRUNE, "DESCEND": _DESCEND}


def _redact(docs, expr, variables=None):
    """``$redact``: the expression, at each document level ($$CURRENT that
    level, $$ROOT the whole document), says $$KEEP the level as it is,
    $$PRUNE it, or $$DESCEND: keep its fields and look into each subdocument,
    in arrays too. The whole document pruned is left out."""
    v = {**(variables or {}), **_REDACT_VARIABLES}

    def level(d: dict, root: dict):
        how = evaluate(expr, d, root, v)
        if how is _KEEP:
            return d
        if how is _PRUNE:
            return None
        if how is not _DESCEND:
            raise _err("$redact's expression should not return anything aside from the "
                       "variables $$KEEP, $$DESCEND, and $$PRUNE, but returned "
                       f"{None if how is MISSING else how!r:.80}", 17053)
        out = {}
        for k, x in d.items():
            x = inside(x, root)
            if x is not None or not isinstance(d[k], dict):
                out[k] = x
        return out

    def inside(x, root):
        if isinstance(x, dict):
            return level(x, root)
        if isinstance(x, list):
            kept = (inside(e, root) for e in x)
            return [e for e, orig in zip(kept, x) if e is not None or not isinstance(orig, dict)]
        return x

    for d in docs:
        out = level(d, d)
        if out is not None:
            yield out


def _lookup(docs, spec: dict, lookup, variables=None, limit=None):
    if lookup is None:
        raise _err("$lookup is not available here", 2)
    sub, dest, let = spec.get("pipeline"), spec["as"], spec.get("let")
    if "from" not in spec:  # the pipeline's $documents are the foreign documents
        yield from _lookup_documents(docs, spec, lookup, variables, limit)
        return
    foreign = list(lookup(spec["from"]))
    if "localField" not in spec and not let:  # uncorrelated: the pipeline runs once
        res = _stages(iter(foreign), sub, lookup, variables, limit)
        for d in docs:
            out = copy.deepcopy(d)
            _set_path(out, dest, copy.deepcopy(res))
            yield out
        return
    index: dict[bytes, list[int]] = {}
    if "localField" in spec:
        for i, f in enumerate(foreign):
            for k in query.equality_keys(f, spec["foreignField"]):
                index.setdefault(k, []).append(i)
    for d in docs:
        if "localField" in spec:
            hit = sorted({i for k in query.equality_keys(d, spec["localField"])
                          for i in index.get(k, ())})
            matched = [copy.deepcopy(foreign[i]) for i in hit]
        else:
            matched = copy.deepcopy(foreign)
        if sub:  # let: its variables are this document's values, for every stage
            v = variables if not let else dict(variables or {}, **{
                k: evaluate(e, d, None, variables) for k, e in let.items()})
            matched = _stages(iter(matched), sub, lookup, v, limit)
        out = copy.deepcopy(d)
        _set_path(out, dest, matched)
        yield out


def _lookup_documents(docs, spec: dict, lookup, variables=None, limit=None):
    """A ``$lookup`` without ``from``: its pipeline (``$documents`` first) run
    for each document with the document's ``let``, then, with ``localField``,
    what of it equals the document's field."""
    sub, dest, let = spec["pipeline"], spec["as"], spec.get("let")
    fixed = None if let else _stages(iter(()), sub, lookup, variables, limit)
    for d in docs:
        if fixed is None:
            v = dict(variables or {}, **{k: evaluate(e, d, None, variables)
                                         for k, e in let.items()})
            matched = _stages(iter(()), sub, lookup, v, limit)
        else:
            matched = copy.deepcopy(fixed)
        if "localField" in spec:
            mine = set(query.equality_keys(d, spec["localField"]))
            matched = [f for f in matched
                       if mine.intersection(query.equality_keys(f, spec["foreignField"]))]
        out = copy.deepcopy(d)
        _set_path(out, dest, matched)
        yield out


def _graph_spec(arg) -> None:
    if not isinstance(arg, dict):
        raise _err("$graphLookup takes an object", 40327)
    extra = set(arg) - _GRAPH_FIELDS
    if extra:
        raise _err(f"unknown argument to $graphLookup: {sorted(extra)[0]}", 40104)
    for f in ("from", "as", "connectFromField", "connectToField"):
        if not isinstance(arg.get(f), str) or not arg[f]:
            raise _err(f"$graphLookup needs '{f}', a non-empty string", 40105)
    if "startWith" not in arg:
        raise _err("$graphLookup needs 'startWith', an expression", 40105)
    if arg.get("maxDepth") is not None:
        _nonneg(arg["maxDepth"], "$graphLookup's maxDepth")
    if "depthField" in arg and (not isinstance(arg["depthField"], str) or not arg["depthField"]):
        raise _err("$graphLookup's depthField must be a non-empty string", 40103)
    if not isinstance(arg.get("restrictSearchWithMatch", {}), dict):
        raise _err("$graphLookup's restrictSearchWithMatch must be an object", 40185)


def _join_keys(values) -> set:
    """The equality keys of each present value (each element of an array too)."""
    return {k for x in values if x is not query.MISSING
            for k in query.equality_keys({"v": x}, "v")}


def _graph_lookup(docs, spec: dict, lookup, variables=None, limit=None):
    """``$graphLookup``: from each document's ``startWith`` values, the
    documents of ``from`` whose ``connectToField`` equals one of them, then
    recursively those equal to the found ones' ``connectFromField`` (breadth
    first, each document once, to ``maxDepth``; ``depthField``: the round
    that found it, 0 first)."""
    if lookup is None:
        raise _err("$graphLookup is not available here", 2)
    foreign = list(lookup(spec["from"]))
    if spec.get("restrictSearchWithMatch"):
        keep = query.compile_filter(spec["restrictSearchWithMatch"])
        foreign = [f for f in foreign if keep(f)]
    index: dict[bytes, list[int]] = {}
    for i, f in enumerate(foreign):
        for k in query.equality_keys(f, spec["connectToField"]):
            index.setdefault(k, []).append(i)
    most, depth_field = spec.get("maxDepth"), spec.get("depthField")
    for d in docs:
        frontier = _join_keys([evaluate(spec["startWith"], d, None, variables)])
        found: dict[int, int] = {}  # index in foreign -> depth
        asked: set[bytes] = set()
        depth = 0
        while frontier and (most is None or depth <= most):
            if limit is not None:
                limit()
            asked |= frontier
            nxt: set[bytes] = set()
            for k in frontier:
                for i in index.get(k, ()):
                    if i not in found:
                        found[i] = depth
                        nxt |= _join_keys(query.reach(foreign[i], spec["connectFromField"]))
            frontier, depth = nxt - asked, depth + 1
        out_docs = []
        for i, depth_of in found.items():
            x = copy.deepcopy(foreign[i])
            if depth_field:
                _set_path(x, depth_field, Int64(depth_of))
            out_docs.append(x)
        out = copy.deepcopy(d)
        _set_path(out, spec["as"], out_docs)
        yield out


def sort_fields(spec: dict) -> list[list]:
    """A sort document as ``[[path, 1 | -1], ...]``: ``$natural`` is raymx's
    stored order, by ``_id``; a ``$meta`` sort (text score) is refused."""
    out = []
    for k, d in spec.items():
        if isinstance(d, dict):
            raise _err(f"sort by {d!r:.60} is not supported by raymx: it has no text "
                       "search, so no $meta score to sort by", 2)
        if isinstance(d, bool) or not isinstance(d, (int, float)) or d not in (1, -1):
            raise _err(f"sort direction of {k!r} must be 1 or -1, not {d!r:.40}", 15975)
        out.append(["_id" if k == "$natural" else k, int(d)])
    return out


def _skip_limit(pipeline: list) -> tuple[int, int | None, int]:
    """(skip, limit or None, stages read) of an optional ``$skip`` then an
    optional ``$limit`` at ``pipeline``'s start; a bad argument raises the
    stage's own error."""
    skip, limit, i = 0, None, 0
    if i < len(pipeline) and "$skip" in pipeline[i]:
        skip, i = _nonneg(pipeline[i]["$skip"], "$skip"), i + 1
    if i < len(pipeline) and "$limit" in pipeline[i]:
        limit, i = _nonneg(pipeline[i]["$limit"], "$limit"), i + 1
    return skip, limit, i


def sort_pushdown(pipeline: list) -> tuple[list, int | None] | None:
    """(sort fields, how many documents the stages after it pass on at most,
    or None) when ``pipeline`` starts with a ``$sort`` the member can read in
    order (a non-empty document: a bad one stays, for its stage to say what
    is wrong); else None."""
    if not pipeline or not isinstance(pipeline[0].get("$sort"), dict) \
            or not pipeline[0]["$sort"]:
        return None
    skip, limit, _ = _skip_limit(pipeline[1:])
    return sort_fields(pipeline[0]["$sort"]), (skip + limit if limit else None)


def count_shape(pipeline: list) -> tuple | None:
    """(skip, limit, group _id, field) when ``pipeline`` only counts what
    reaches it: an optional ``$skip``, an optional ``$limit``, then ``{$group:
    {_id: <constant>, field: {$sum: 1}}}`` (pymongo's ``count_documents``);
    else None (also where a stage is wrong: running it says how)."""
    try:
        skip, limit, i = _skip_limit(pipeline)
    except CommandError:
        return None
    if limit == 0 or i != len(pipeline) - 1 or "$group" not in pipeline[i]:
        return None
    g = pipeline[i]["$group"]
    if not isinstance(g, dict) or len(g) != 2 or "_id" not in g:
        return None
    gid = g["_id"]
    (name, acc), = ((k, v) for k, v in g.items() if k != "_id")
    if isinstance(gid, (dict, list)) or (isinstance(gid, str) and gid.startswith("$")) \
            or not isinstance(acc, dict) or list(acc) != ["$sum"] or type(acc["$sum"]) is not int \
            or acc["$sum"] != 1 or name.startswith("$") or "." in name:
        return None
    return skip, limit or 0, gid, name


def _nonneg(v, stage: str) -> int:
    if not numbers.whole(v) or v < 0:
        raise _err(f"invalid argument to {stage} stage: expected a non-negative integer", 15956)
    return int(v)


def run(docs: Iterable[dict], pipeline: list, lookup=None,
        variables: dict | None = None, limit: Callable[[], None] | None = None) -> list[dict]:
    """The pipeline's output documents. ``lookup(collection)``: the documents
    of another collection of the same database (``$lookup``). ``variables``:
    the command's ``let`` (``$$name`` in its expressions). ``limit()``: raises
    once the command must stop (its ``maxTimeMS`` passed, a ``killOp``);
    called as documents pass between stages, at least every ``CHECK_EVERY``."""
    check(pipeline)  # nested pipelines too: they run unchecked (``_stages``)
    if limit is not None and lookup is not None:  # a $lookup's foreign documents too
        lookup = functools.partial(_limited_lookup, lookup, limit)
    return _stages(docs, pipeline, lookup, variables, limit)


CHECK_EVERY = 64  # documents between two looks at a pipeline's limit


def _limited(it: Iterable, limit: Callable[[], None] | None) -> Iterable:
    """``it``, with ``limit()`` called before its first item and after every
    ``CHECK_EVERY``."""
    if limit is None:
        return it
    return _limited_gen(iter(it), limit)


def _limited_gen(it, limit):
    limit()
    while True:
        chunk = list(itertools.islice(it, CHECK_EVERY))
        yield from chunk
        if len(chunk) < CHECK_EVERY:
            return
        limit()


def let_of(cmd: dict, evaluate_in: dict | None = None, given: dict | None = None) -> dict:
    """A command's variables: ``$$NOW`` and ``$$CLUSTER_TIME``, fixed for
    the whole command as MongoDB fixes them, and its ``let``, each evaluated
    once (constants, ``$$NOW``...), for the expressions of its filter or
    pipeline. ``given``: variables already bound (the command's, beside a
    statement's own constants)."""
    out = dict(given) if given is not None else {"NOW": now(), "CLUSTER_TIME": cluster_time()}
    let = cmd.get("let")
    if let is None:
        return out
    if not isinstance(let, dict):
        raise _err("let must be an object", 10065)
    for name, e in let.items():
        if not isinstance(name, str) or not name[:1].islower() \
                or not name.replace("_", "").isalnum():
            raise _err(f"let: {name!r} is not a valid variable name", 16867)
        out[name] = evaluate(e, evaluate_in or {}, None, out)
    return out


def matcher(flt: dict, variables: dict | None = None) -> Callable[[dict], bool]:
    """A filter's test in the port: the query engine's, and a top-level
    ``$expr`` evaluated here."""
    return _match(flt, variables)


def _stages(docs: Iterable[dict], pipeline: list, lookup, v: dict | None = None,
            limit: Callable[[], None] | None = None) -> list[dict]:
    """``v``: the variables the stages' expressions see (a ``$lookup``'s ``let``).
    ``limit``: ``run``'s, looked at between every two stages."""
    it: Iterable[dict] = _limited(docs, limit)
    for st in pipeline:
        it = _limited(_stage(it, st, lookup, v, limit), limit)
    return list(it)


def _limited_lookup(lookup, limit, coll):
    return _limited(lookup(coll), limit)


def _stage(it: Iterable[dict], st: dict, lookup, v: dict | None, limit) -> Iterable[dict]:
    """One stage over ``it``."""
    name, arg = next(iter(st.items()))
    if name == "$match":
        it = filter(_match(arg, v), it)
    elif name == "$project":
        it = _project(it, arg, v)
    elif name in ("$addFields", "$set"):
        it = _add_fields(it, arg, v)
    elif name == "$unset":
        fields = [arg] if isinstance(arg, str) else arg
        it = _project(it, {f: 0 for f in fields})
    elif name == "$sort":
        if not isinstance(arg, dict) or not arg:
            raise _err("$sort key specification must be an object", 15973)
        it = iter(sorted(it, key=query.sort_key(sort_fields(arg))))
    elif name == "$skip":
        it = itertools.islice(it, _nonneg(arg, "$skip"), None)
    elif name == "$limit":
        n = _nonneg(arg, "$limit")
        if n == 0:
            raise _err("the limit must be positive", 15958)
        it = itertools.islice(it, n)
    elif name == "$group":
        it = grouping.group(it, arg, v)
    elif name == "$count":
        if not isinstance(arg, str) or not arg or arg.startswith("$") or "." in arg:
            raise _err("the count field must be a non-empty string without '$' or '.'",
                       40156)
        n = sum(1 for _ in it)
        it = iter([{arg: n}] if n else [])
    elif name == "$unwind":
        it = _unwind(it, arg)
    elif name == "$sample":
        it = iter(_sample(it, arg))
    elif name == "$replaceRoot":
        if not isinstance(arg, dict) or "newRoot" not in arg:
            raise _err("no newRoot specified for the $replaceRoot stage", 40231)
        it = _replace_root(it, arg["newRoot"], v)
    elif name == "$replaceWith":
        it = _replace_root(it, arg, v)
    elif name == "$redact":
        it = _redact(it, arg, v)
    elif name == "$sortByCount":
        if not (isinstance(arg, str) and arg.startswith("$")) and not (
                isinstance(arg, dict) and len(arg) == 1 and next(iter(arg)).startswith("$")):
            raise _err("the sortByCount field must be a $-prefixed path or an expression",
                       40148)
        it = iter(sorted(grouping.group(it, {"_id": arg, "count": {"$sum": 1}}, v),
                         key=lambda g: -g["count"]))
    elif name == "$facet":
        pool = list(it)
        it = iter([{k: _stages(iter(copy.deepcopy(pool)), sub, lookup, v, limit)
                    for k, sub in arg.items()}])
    elif name == "$lookup":
        it = _lookup(it, arg, lookup, v, limit)
    elif name == "$graphLookup":
        it = _graph_lookup(it, arg, lookup, v, limit)
    elif name == "$bucket":
        it = iter(grouping.bucket(it, arg, v))
    elif name == "$bucketAuto":
        it = iter(grouping.bucket_auto(it, arg, v))
    elif name == "$setWindowFields":
        it = grouping.set_window_fields(it, arg, v)
    elif name == "$fill":
        it = grouping.fill(it, arg, v)
    elif name == "$densify":
        it = grouping.densify(it, arg, v)
    elif name == "$unionWith":
        if lookup is None:
            raise _err("$unionWith is not available here", 2)
        coll, sub = _union_spec(arg)
        it = itertools.chain(it, _stages(iter(lookup(coll) if coll is not None else ()), sub,
                                         lookup, v, limit))
    elif name == "$documents":  # the first stage (``check``): what came before is nothing
        it = iter(_documents(arg, v))
    elif name in OUTPUTS:  # the caller takes the last stage off and writes the output
        raise _err(f"{name} can only be the final stage in the pipeline", 40601)
    elif name in ("$collStats", "$indexStats"):  # the caller serves a leading one
        raise _err(f"{name} is only valid as the first stage in a pipeline", 40602)
    return it

