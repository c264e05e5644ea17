"""Aggregation pipelines, pure code over documents (the wire port's
``aggregate``): ``$match $project $addFields/$set $unset $sort $skip $limit
$group $count $unwind $sample $replaceRoot/$replaceWith $sortByCount $facet
$lookup`` (``localField``/``foreignField``, or a ``pipeline`` with or without
``let``, or both; the other collection comes from the caller's ``lookup``),
``$unionWith $bucket $bucketAuto $setWindowFields``, and a ``$match``'s
top-level ``$expr``; a last ``$out`` or
``$merge`` is checked here (``output_spec``) and written by the caller;
``$group`` accumulators ``$sum $avg $min $max $first $last $push $addToSet
$count $mergeObjects $stdDevPop $stdDevSamp``; expressions: field paths
(``"$a.b"``), variables (``"$$ROOT"``, ``"$$CURRENT"``, ``"$$REMOVE"``,
``"$$NOW"`` and those of ``$let $map $filter $reduce``), literals,
``$literal $add $subtract $multiply $divide $mod $concat $toLower $toUpper
$size $cond $ifNull $eq $ne $gt $gte $lt $lte $and $or $not $in
$arrayElemAt`` here and the rest in ``expressions.py`` (math, strings,
conversions, arrays, objects, ``$switch``, dates). Values compare in
raymx's order (``raymx.storage.keys``), as filters and sorts do.
"""
from __future__ import annotations

import bisect
import copy
import datetime
import itertools
import random
from typing import Any, Callable, Iterable

from raymx.storage import query
from raymx.storage.keys import encode_key
from raymx.wire import expressions
from raymx.wire.errors import CommandError

MISSING = query.MISSING
STAGES = ("$match", "$project", "$addFields", "$set", "$unset", "$sort", "$skip", "$limit",
          "$group", "$count", "$unwind", "$sample", "$replaceRoot", "$replaceWith",
          "$sortByCount", "$facet", "$lookup", "$collStats", "$unionWith", "$out", "$merge",
          "$bucket", "$bucketAuto", "$setWindowFields")
OUTPUTS = ("$out", "$merge")  # the last stage only: the caller writes the output
_MERGE_FIELDS = {"into", "on", "whenMatched", "whenNotMatched"}
_LOOKUP_FIELDS = {"from", "as", "localField", "foreignField", "pipeline", "let"}


def _err(msg: str, code: int = 40324) -> CommandError:
    return CommandError(msg, code, "Location%d" % code if code not in (2, 14) else "BadValue")


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
        elif name == "$lookup":
            if not isinstance(arg, dict) or not isinstance(arg.get("from"), str) \
                    or not isinstance(arg.get("as"), str):
                raise _err("$lookup needs 'from' and 'as', strings", 40321)
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


def _union_spec(arg) -> tuple[str, list]:
    if isinstance(arg, str):
        arg = {"coll": arg}
    if not isinstance(arg, dict) or not isinstance(arg.get("coll"), str) or not arg["coll"] \
            or set(arg) - {"coll", "pipeline"}:
        raise _err("$unionWith takes a collection name, or {coll, pipeline}", 40590)
    sub = arg.get("pipeline", [])
    if not isinstance(sub, list):
        raise _err("$unionWith's pipeline must be an array", 14)
    return arg["coll"], sub


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


# --- expressions -----------------------------------------------------------
def _path(doc, path: str) -> Any:
    vals = query.reach(doc, path)
    if len(vals) == 1:
        return vals[0]
    return [v for v in vals if v is not MISSING]


def _variable(e: str, doc: dict, root: dict, variables: dict | None) -> Any:
    """``$$name`` or ``$$name.path``: ``ROOT``/``CURRENT``, ``REMOVE``,
    ``NOW``, or a variable of ``$let``, ``$map``, ``$filter``, ``$reduce``."""
    name, _, rest = e[2:].partition(".")
    if name in ("ROOT", "CURRENT"):
        base = root if name == "ROOT" else doc
    elif variables is not None and name in variables:
        base = variables[name]
    elif name == "REMOVE":
        return MISSING
    elif name == "NOW":
        return datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    else:
        raise _err(f"Use of undefined variable: {name}", 17276)
    if not rest:
        return base
    return _path(base, rest) if isinstance(base, (dict, list)) else MISSING


def _num(v, op: str):
    if v is None or v is MISSING:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _err(f"{op} only supports numeric types, not {type(v).__name__}", 16554)
    return v


def _cmp(a, b) -> int:
    ka = encode_key(None if a is MISSING else a)
    kb = encode_key(None if b is MISSING else b)
    return (ka > kb) - (ka < kb)


def _args(x, doc, root, n: int | None = None, op: str = "", variables=None) -> list:
    args = x if isinstance(x, list) else [x]
    if n is not None and len(args) != n:
        raise _err(f"Expression {op} takes exactly {n} arguments. {len(args)} were passed in.",
                   16020)
    return [evaluate(a, doc, root, variables) for a in args]


def _arith(op, vals):
    vals = [_num(v, op) for v in vals]
    if any(v is None for v in vals):
        return None
    if op == "$add":
        return sum(vals)
    if op == "$multiply":
        out = 1
        for v in vals:
            out *= v
        return out
    a, b = vals
    if op == "$subtract":
        return a - b
    if b == 0:
        raise _err(f"can't {op[1:]} by zero", 16608)
    return a / b if op == "$divide" else a % b


_COMPARE = {"$eq": lambda c: c == 0, "$ne": lambda c: c != 0, "$gt": lambda c: c > 0,
            "$gte": lambda c: c >= 0, "$lt": lambda c: c < 0, "$lte": lambda c: c <= 0}


def _truthy(v) -> bool:
    return v not in (None, False, 0, MISSING) if not isinstance(v, (list, dict, str)) else True


def _op(op: str, x, doc, root, variables=None):
    if op == "$literal":
        return x
    if op in ("$add", "$multiply"):
        return _arith(op, _args(x, doc, root, variables=variables))
    if op in ("$subtract", "$divide", "$mod"):
        return _arith(op, _args(x, doc, root, 2, op, variables))
    if op in _COMPARE:
        a, b = _args(x, doc, root, 2, op, variables)
        return _COMPARE[op](_cmp(a, b))
    if op == "$concat":
        vals = _args(x, doc, root, variables=variables)
        if any(v is None or v is MISSING for v in vals):
            return None
        if not all(isinstance(v, str) for v in vals):
            raise _err("$concat only supports strings", 16702)
        return "".join(vals)
    if op in ("$toLower", "$toUpper"):
        (v,) = _args(x, doc, root, 1, op, variables)
        s = "" if v is None or v is MISSING else str(v)
        return s.lower() if op == "$toLower" else s.upper()
    if op == "$size":
        (v,) = _args(x, doc, root, 1, op, variables)
        if not isinstance(v, list):
            raise _err("The argument to $size must be an array", 17124)
        return len(v)
    if op == "$cond":
        if isinstance(x, dict):
            x = [x.get("if"), x.get("then"), x.get("else")]
        c, a, b = x
        return evaluate(a if _truthy(evaluate(c, doc, root, variables)) else b, doc, root,
                        variables)
    if op == "$ifNull":
        vals = _args(x, doc, root, variables=variables)
        return next((v for v in vals[:-1] if v is not None and v is not MISSING), vals[-1])
    if op == "$and":
        return all(_truthy(v) for v in _args(x, doc, root, variables=variables))
    if op == "$or":
        return any(_truthy(v) for v in _args(x, doc, root, variables=variables))
    if op == "$not":
        (v,) = _args(x, doc, root, 1, op, variables)
        return not _truthy(v)
    if op == "$in":
        v, arr = _args(x, doc, root, 2, op, variables)
        if not isinstance(arr, list):
            raise _err("$in requires an array as a second argument", 40081)
        return any(_cmp(v, a) == 0 for a in arr)
    if op == "$arrayElemAt":
        arr, i = _args(x, doc, root, 2, op, variables)
        if not isinstance(arr, list):
            return None
        return arr[i] if -len(arr) <= i < len(arr) else MISSING
    fn = expressions.OPS.get(op)
    if fn is None:
        raise _err(f"Unrecognized expression '{op}'", 168)
    return fn(x, lambda e, more=None: evaluate(
        e, doc, root, variables if not more else dict(variables or {}, **more)))


def evaluate(e, doc: dict, root: dict | None = None, variables: dict | None = None):
    root = doc if root is None else root
    if isinstance(e, str):
        if e.startswith("$$"):
            return _variable(e, doc, root, variables)
        if e.startswith("$"):
            return _path(doc, e[1:])
        return e
    if isinstance(e, dict):
        if len(e) == 1:
            k = next(iter(e))
            if k.startswith("$"):
                return _op(k, e[k], doc, root, variables)
        return {k: v for k, v in ((k, evaluate(x, doc, root, variables)) for k, x in e.items())
                if v is not MISSING}
    if isinstance(e, list):
        return [evaluate(x, doc, root, variables) for x in e]
    return e


# --- stages ----------------------------------------------------------------
def _set_path(doc: dict, path: str, value) -> None:
    parts = path.split(".")
    cur = doc
    for p in parts[:-1]:
        nxt = cur.get(p)
        if not isinstance(nxt, dict):
            nxt = cur[p] = {}
        cur = nxt
    if value is MISSING:
        cur.pop(parts[-1], None)
    else:
        cur[parts[-1]] = value


def _project(docs, spec: dict, variables=None):
    if not isinstance(spec, dict) or not spec:
        raise _err("$project requires at least one output field", 40177)
    plain = {k: v for k, v in spec.items() if v in (0, 1, True, False)}
    computed = {k: v for k, v in spec.items() if k not in plain}
    excluding = any(not v for k, v in plain.items() if k != "_id")
    if excluding and computed:
        raise _err("Cannot do exclusion and computed fields in the same $project", 31254)
    keep_id = spec.get("_id", 1) not in (0, False) if "_id" not in computed else False
    include = {k: 1 for k, v in plain.items() if v and k != "_id"}
    for d in docs:
        if excluding:
            yield query.project(d, plain)
            continue
        out = {"_id": d["_id"]} if keep_id and "_id" in d else {}
        if include:
            out.update(query.project(d, dict(include, _id=0)))
        for k, e in computed.items():
            _set_path(out, k, evaluate(e, d, None, variables))
        yield out


def _add_fields(docs, spec: dict, variables=None):
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


_ACCUMULATORS = ("$sum", "$avg", "$min", "$max", "$first", "$last", "$push", "$addToSet",
                 "$count", "$mergeObjects", "$stdDevPop", "$stdDevSamp")


class _Acc:
    """One accumulator (``$group``'s, ``$bucket``'s, a window's) fed value by
    value; ``result()`` is its value so far."""

    __slots__ = ("op", "n", "sum", "sq", "v", "set", "vals", "seen")

    def __init__(self, op: str):
        self.op, self.n, self.sum, self.sq, self.v, self.set = op, 0, 0, 0.0, None, False
        self.vals: list = []
        self.seen: dict = {}

    def add(self, v) -> None:
        op = self.op
        if op in ("$sum", "$count", "$avg", "$stdDevPop", "$stdDevSamp"):
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                self.sum += v
                self.n += 1
                if op in ("$stdDevPop", "$stdDevSamp"):
                    self.vals.append(v)
        elif op in ("$min", "$max"):
            if v is not None and v is not MISSING and (
                    not self.set or (_cmp(v, self.v) < 0) == (op == "$min") and _cmp(v, self.v)):
                self.v, self.set = v, True
        elif op == "$first":
            if not self.set:
                self.v, self.set = (None if v is MISSING else v), True
        elif op == "$last":
            self.v, self.set = (None if v is MISSING else v), True
        elif op == "$push":
            if v is not MISSING:
                self.vals.append(v)
        elif op == "$addToSet":
            if v is not MISSING:
                self.seen.setdefault(encode_key(v), v)
        elif op == "$mergeObjects":
            if isinstance(v, dict):
                self.v = {**(self.v or {}), **v}
            elif v is not None and v is not MISSING:
                raise _err(f"$mergeObjects requires object inputs, not {v!r:.40}", 40400)

    def result(self):
        op = self.op
        if op in ("$sum", "$count"):
            return self.sum
        if op == "$avg":
            return self.sum / self.n if self.n else None
        if op in ("$stdDevPop", "$stdDevSamp"):
            n = self.n - (op == "$stdDevSamp")
            mean = self.sum / self.n if self.n else 0
            return (sum((x - mean) ** 2 for x in self.vals) / n) ** 0.5 if n > 0 else None
        if op == "$mergeObjects":
            return self.v or {}
        if op == "$push":
            return list(self.vals)
        if op == "$addToSet":
            return list(self.seen.values())
        return self.v


def _accumulators(spec: dict, what: str) -> dict:
    """{field: (op, expression)} of a stage's accumulator fields (all but ``_id``)."""
    accs = {}
    for field, acc in spec.items():
        if field == "_id":
            continue
        if not isinstance(acc, dict) or len(acc) != 1 or next(iter(acc)) not in _ACCUMULATORS:
            raise _err(f"unknown {what} operator for field '{field}'", 15952)
        accs[field] = next(iter(acc.items()))
    return accs


def _group(docs, spec: dict, variables=None, key=None):
    """``$group``; ``key(doc)`` instead of evaluating ``spec["_id"]`` (``$bucket``)."""
    if not isinstance(spec, dict) or ("_id" not in spec and key is None):
        raise _err("a group specification must include an _id", 15955)
    accs = _accumulators(spec, "group")
    groups: dict[bytes, tuple] = {}
    for d in docs:
        gid = key(d) if key is not None else evaluate(spec["_id"], d, None, variables)
        gid = None if gid is MISSING else gid
        k = encode_key(gid)
        g = groups.get(k)
        if g is None:
            g = groups[k] = (gid, {f: _Acc(op) for f, (op, _) in accs.items()})
        for field, (op, e) in accs.items():
            g[1][field].add(1 if op == "$count" else evaluate(e, d, None, variables))
    for gid, st in groups.values():
        yield {"_id": gid, **{f: a.result() for f, a in st.items()}}


def _bucket(docs, spec: dict, variables=None):
    """``$bucket``: documents by ``groupBy`` into ``[boundary, next)``, the
    rest into ``default``; buckets in boundary order, ``default`` last."""
    if not isinstance(spec, dict) or "groupBy" not in spec or "boundaries" not in spec \
            or set(spec) - {"groupBy", "boundaries", "default", "output"}:
        raise _err("$bucket needs groupBy and boundaries (and may take default, output)",
                   40197)
    bounds = spec["boundaries"]
    if not isinstance(bounds, list) or len(bounds) < 2 or any(
            _cmp(a, b) >= 0 for a, b in zip(bounds, bounds[1:])):
        raise _err("$bucket's boundaries must be an array of at least two values, "
                   "ascending", 40194)
    output = spec.get("output") or {"count": {"$sum": 1}}
    keys = [encode_key(b) for b in bounds]
    has_default = "default" in spec

    def key(d):
        v = evaluate(spec["groupBy"], d, None, variables)
        k = encode_key(None if v is MISSING else v)
        i = bisect.bisect_right(keys, k) - 1
        if 0 <= i < len(bounds) - 1:
            return bounds[i]
        if not has_default:
            raise _err(f"$bucket could not find a matching branch for an input, and no "
                       f"default was specified: {v!r:.60}", 40066)
        return spec["default"]
    out = list(_group(docs, dict(output), variables, key))
    order = {encode_key(b): i for i, b in enumerate(bounds)}
    return sorted(out, key=lambda g: order.get(encode_key(g["_id"]), len(bounds)))


def _bucket_auto(docs, spec: dict, variables=None):
    """``$bucketAuto``: documents sorted by ``groupBy`` into ``buckets`` groups
    of about equal size (equal values stay together); ``_id`` is ``{min,
    max}``, each ``max`` the next bucket's ``min`` (the last: its largest)."""
    if not isinstance(spec, dict) or "groupBy" not in spec or "buckets" not in spec \
            or set(spec) - {"groupBy", "buckets", "output", "granularity"}:
        raise _err("$bucketAuto needs groupBy and buckets (and may take output)", 40241)
    if "granularity" in spec:
        raise _err("$bucketAuto's granularity is not supported by raymx", 2)
    n = spec["buckets"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise _err("$bucketAuto's buckets must be a positive integer", 40243)
    output = spec.get("output") or {"count": {"$sum": 1}}
    accs = _accumulators(output, "bucketAuto")
    rows = sorted(((evaluate(spec["groupBy"], d, None, variables), d) for d in docs),
                  key=lambda r: encode_key(None if r[0] is MISSING else r[0]))
    size = -(-len(rows) // n) if rows else 0
    groups, i = [], 0
    while i < len(rows):
        j = min(i + size, len(rows))
        while j < len(rows) and _cmp(rows[j][0], rows[j - 1][0]) == 0:
            j += 1  # equal values share a bucket
        groups.append(rows[i:j])
        i = j
    out = []
    for gi, g in enumerate(groups):
        st = {f: _Acc(op) for f, (op, _) in accs.items()}
        for _, d in g:
            for f, (op, e) in accs.items():
                st[f].add(1 if op == "$count" else evaluate(e, d, None, variables))
        hi = groups[gi + 1][0][0] if gi + 1 < len(groups) else g[-1][0]
        out.append({"_id": {"min": g[0][0], "max": hi}, **{f: a.result() for f, a in st.items()}})
    return out


_RANKS = ("$rank", "$denseRank", "$documentNumber")


def _window_bounds(w, i: int, n: int, sort_vals: list | None) -> tuple[int, int]:
    """[lo, hi) of the documents in window ``w`` around position ``i`` of ``n``."""
    if w is None:
        return 0, n
    if not isinstance(w, dict) or len(w) != 1 or next(iter(w)) not in ("documents", "range"):
        raise _err("a window is {documents: [lo, hi]} or {range: [lo, hi]}", 5371600)
    kind, (lo, hi) = next(iter(w.items()))
    if kind == "documents":
        a = 0 if lo == "unbounded" else i if lo == "current" else i + int(lo)
        b = n if hi == "unbounded" else i + 1 if hi == "current" else i + int(hi) + 1
        return max(a, 0), min(b, n)
    if sort_vals is None:
        raise _err("a range window needs sortBy on one numeric field", 5339902)
    x = sort_vals[i]
    a = 0 if lo == "unbounded" else next((k for k in range(n) if sort_vals[k] >= (
        x if lo == "current" else x + lo)), n)
    b = n if hi == "unbounded" else next((k for k in range(n - 1, -1, -1) if sort_vals[k] <= (
        x if hi == "current" else x + hi)), -1) + 1
    return a, b


def _set_window_fields(docs, spec: dict, variables=None):
    """``$setWindowFields``: per partition (``partitionBy``), in ``sortBy``
    order, each output field is an accumulator over a window of documents
    (``documents`` positions or a numeric ``range`` of the sort field; the
    whole partition by default), ``$rank``/``$denseRank``/``$documentNumber``,
    or ``$shift``."""
    if not isinstance(spec, dict) or not isinstance(spec.get("output"), dict) \
            or set(spec) - {"partitionBy", "sortBy", "output"}:
        raise _err("$setWindowFields needs output (and may take partitionBy, sortBy)", 40415)
    sort_by = spec.get("sortBy")
    outs = {}
    for field, o in spec["output"].items():
        if not isinstance(o, dict):
            raise _err(f"$setWindowFields output {field!r} must be an object", 40415)
        ops = [k for k in o if k != "window"]
        if len(ops) != 1 or (ops[0] not in _ACCUMULATORS + _RANKS + ("$shift",)):
            raise _err(f"$setWindowFields output {field!r}: unknown window function "
                       f"{ops[:1]}", 5371601)
        if ops[0] in _RANKS + ("$shift",) and not sort_by:
            raise _err(f"{ops[0]} needs a sortBy", 5371602)
        outs[field] = (ops[0], o[ops[0]], o.get("window"))
    parts: dict[bytes, list] = {}
    for d in docs:
        pid = evaluate(spec["partitionBy"], d, None, variables) if "partitionBy" in spec \
            else None
        parts.setdefault(encode_key(None if pid is MISSING else pid), []).append(d)
    keyf = query.sort_key([[k, int(v)] for k, v in sort_by.items()]) if sort_by else None
    one = next(iter(sort_by)) if sort_by and len(sort_by) == 1 else None
    for part in parts.values():
        if keyf is not None:
            part.sort(key=keyf)
        n = len(part)
        sort_vals = [query.get_path(d, one) for d in part] if one is not None else None
        keys = [keyf(d) for d in part] if keyf is not None else None
        results = {}
        for field, (op, arg, w) in outs.items():
            col = []
            if op in _RANKS:
                rank = dense = 0
                for i in range(n):
                    if i == 0 or keys[i] != keys[i - 1]:
                        rank, dense = i + 1, dense + 1
                    col.append({"$rank": rank, "$denseRank": dense,
                                "$documentNumber": i + 1}[op])
            elif op == "$shift":
                if not isinstance(arg, dict) or "output" not in arg or not isinstance(
                        arg.get("by"), int) or isinstance(arg.get("by"), bool):
                    raise _err("$shift needs output and an integer by", 5371603)
                for i in range(n):
                    j = i + arg["by"]
                    col.append(evaluate(arg["output"], part[j], None, variables)
                               if 0 <= j < n else evaluate(arg.get("default"), {}, None,
                                                           variables))
            else:
                vals = [1 if op == "$count" else evaluate(arg, d, None, variables)
                        for d in part]
                for i in range(n):
                    lo, hi = _window_bounds(w, i, n, sort_vals)
                    acc = _Acc(op)
                    for v in vals[lo:hi]:
                        acc.add(v)
                    col.append(acc.result())
            results[field] = col
        for i, d in enumerate(part):
            out = copy.deepcopy(d)
            for field, col in results.items():
                _set_path(out, field, col[i])
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


def _lookup(docs, spec: dict, lookup, variables=None):
    if lookup is None:
        raise _err("$lookup is not available here", 2)
    foreign = list(lookup(spec["from"]))
    sub, dest, let = spec.get("pipeline"), spec["as"], spec.get("let")
    if "localField" not in spec and not let:  # uncorrelated: the pipeline runs once
        res = _stages(iter(foreign), sub, lookup, variables)
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
            matched = _stages(iter(matched), sub, lookup, v)
        out = copy.deepcopy(d)
        _set_path(out, dest, matched)
        yield out


def _nonneg(v, stage: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v != int(v):
        raise _err(f"invalid argument to {stage} stage: expected a non-negative integer", 15956)
    return int(v)


def run(docs: Iterable[dict], pipeline: list, lookup=None,
        variables: dict | None = None) -> list[dict]:
    """The pipeline's output documents. ``lookup(collection)``: the documents
    of another collection of the same database (``$lookup``). ``variables``:
    the command's ``let`` (``$$name`` in its expressions)."""
    check(pipeline)  # nested pipelines too: they run unchecked (``_stages``)
    return _stages(docs, pipeline, lookup, variables)


def let_of(cmd: dict, evaluate_in: dict | None = None) -> dict | None:
    """A command's ``let``: its variables, each evaluated once (constants,
    ``$$NOW``...), for the expressions of its filter or pipeline."""
    let = cmd.get("let")
    if let is None:
        return None
    if not isinstance(let, dict):
        raise _err("let must be an object", 10065)
    out = {}
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


def _stages(docs: Iterable[dict], pipeline: list, lookup, v: dict | None = None) -> list[dict]:
    """``v``: the variables the stages' expressions see (a ``$lookup``'s ``let``)."""
    it: Iterable[dict] = docs
    for st in pipeline:
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
            it = iter(sorted(it, key=query.sort_key([[k, int(d)] for k, d in arg.items()])))
        elif name == "$skip":
            it = itertools.islice(it, _nonneg(arg, "$skip"), None)
        elif name == "$limit":
            n = _nonneg(arg, "$limit")
            if n == 0:
                raise _err("the limit must be positive", 15958)
            it = itertools.islice(it, n)
        elif name == "$group":
            it = _group(it, arg, v)
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
        elif name == "$sortByCount":
            if not (isinstance(arg, str) and arg.startswith("$")) and not (
                    isinstance(arg, dict) and len(arg) == 1 and next(iter(arg)).startswith("$")):
                raise _err("the sortByCount field must be a $-prefixed path or an expression",
                           40148)
            it = iter(sorted(_group(it, {"_id": arg, "count": {"$sum": 1}}, v),
                             key=lambda g: -g["count"]))
        elif name == "$facet":
            pool = list(it)
            it = iter([{k: _stages(iter(copy.deepcopy(pool)), sub, lookup, v)
                        for k, sub in arg.items()}])
        elif name == "$lookup":
            it = _lookup(it, arg, lookup, v)
        elif name == "$bucket":
            it = iter(_bucket(it, arg, v))
        elif name == "$bucketAuto":
            it = iter(_bucket_auto(it, arg, v))
        elif name == "$setWindowFields":
            it = _set_window_fields(it, arg, v)
        elif name == "$unionWith":
            if lookup is None:
                raise _err("$unionWith is not available here", 2)
            coll, sub = _union_spec(arg)
            it = itertools.chain(it, _stages(iter(lookup(coll)), sub, lookup, v))
        elif name in OUTPUTS:  # the caller takes the last stage off and writes the output
            raise _err(f"{name} can only be the final stage in the pipeline", 40601)
        elif name == "$collStats":  # the caller serves a leading one (the member's count)
            raise _err("$collStats is only valid as the first stage in a pipeline", 40602)
    return list(it)

