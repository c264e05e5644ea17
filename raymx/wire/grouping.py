"""The stages that gather documents: ``$group`` and its accumulators
(``_Acc``, which ``$bucket``, ``$bucketAuto`` and window functions share),
``$bucket``, ``$bucketAuto``, ``$setWindowFields``, and ``$fill`` and
``$densify`` over its partitions. Pure code over documents, for
``aggregate.py``.
"""
from __future__ import annotations

import bisect
import copy
import datetime
import functools
import math

from bson import Decimal128

from raymx.storage import numbers, query, types
from raymx.storage.keys import encode_key
from raymx.wire.dates import _MONTHS, _UNITS, _add_months
from raymx.wire.evaluation import MISSING, _cmp, _err, _set_path, evaluate


_N_OF = ("$firstN", "$lastN", "$maxN", "$minN")  # {input, n}
_RANKED = ("$top", "$bottom", "$topN", "$bottomN")  # {sortBy, output[, n]}
_PERCENTILES = ("$percentile", "$median")  # {input, p (not $median's), method}
_METHODS = ("approximate", "discrete", "continuous")
_ACCUMULATORS = ("$sum", "$avg", "$min", "$max", "$first", "$last", "$push", "$addToSet",
                 "$count", "$mergeObjects", "$stdDevPop", "$stdDevSamp") + _N_OF + _RANKED \
    + _PERCENTILES


def _percentile_args(op: str, v) -> tuple[list, str]:
    """(the fractions asked, the method) of a ``$percentile``/``$median``'s
    evaluated argument, checked as MongoDB checks them."""
    if not isinstance(v, dict) or "method" not in v \
            or set(v) - {"input", "method", "p"} or (op == "$percentile") != ("p" in v):
        raise _err(f"{op} needs input and method" + (", and p" if op == "$percentile" else "")
                   + " (no other field)", 7436100)
    if v["method"] not in _METHODS:
        raise _err(f"{op}'s method must be one of {', '.join(_METHODS)}, not "
                   f"{v['method']!r:.40}", 7766600)
    if op == "$median":
        return [0.5], v["method"]
    ps = v["p"]
    if not isinstance(ps, list) or not ps or not all(
            numbers.is_number(x) and 0 <= numbers.as_float(x) <= 1 for x in ps):
        raise _err(f"{op}'s p must be a non-empty array of numbers between 0.0 and 1.0, not "
                   f"{ps!r:.60}", 7750301)
    return [numbers.as_float(x) for x in ps], v["method"]


def percentiles(values: list, ps: list, method: str) -> list | None:
    """The ``ps`` percentiles of the numbers among ``values`` (doubles), None
    if there are none. ``continuous`` interpolates between the two nearest
    ranks; ``discrete`` (and ``approximate``, which MongoDB computes with a
    t-digest: exact here) takes the value of rank ceil(p*n)-1."""
    xs = sorted(numbers.as_float(x) for x in values if numbers.is_number(x))
    if not xs:
        return None
    out = []
    for p in ps:
        if method == "continuous":
            r = p * (len(xs) - 1)
            lo, hi = math.floor(r), math.ceil(r)
            out.append(xs[lo] + (xs[hi] - xs[lo]) * (r - lo))
        else:
            out.append(xs[max(0, math.ceil(p * len(xs)) - 1)])
    return out


def _ranked_expression(op: str, e) -> dict:
    """``$top``/``$bottom``(``N``)'s argument as the expression each document
    is evaluated with: its output, its sort values (``key``) and the sort's
    directions, so the accumulator sees what it orders by."""
    named = ("sortBy", "output") + (("n",) if op.endswith("N") else ())
    if not isinstance(e, dict) or set(e) != set(named) or not isinstance(e["sortBy"], dict) \
            or not e["sortBy"] or any(v not in (1, -1) for v in e["sortBy"].values()):
        raise _err(f"{op} needs exactly {', '.join(named)}; sortBy a document of fields "
                   "and 1 or -1", 5788002)
    return {"output": e["output"], "n": e.get("n", 1),
            "key": [f"${p}" for p in e["sortBy"]],
            "dirs": {"$literal": list(e["sortBy"].values())}}


def _count_n(op: str, n) -> int:
    if type(n) is not int or n < 1:
        raise _err(f"{op}: 'n' must be a positive integer, got {n!r:.40}", 5787908)
    return n


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
            if numbers.is_number(v):
                if op in ("$stdDevPop", "$stdDevSamp"):
                    v = numbers.as_float(v)
                    self.vals.append(v)
                self.sum = numbers.combine("add", self.sum, v)
                self.n += 1
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
        elif op in _PERCENTILES:
            self.v = _percentile_args(op, v)  # the same for every value
            self.vals.append(v.get("input"))  # a missing one is no number
        elif op in _N_OF or op in _RANKED:
            if not isinstance(v, dict) or "n" not in v:
                raise _err(f"{op} needs an object with 'n'", 5787901)
            self.n = _count_n(op, v["n"])
            if op in _N_OF:
                x = v.get("input", MISSING)
                x = None if x is MISSING else x
                if op in ("$maxN", "$minN") and x is None:
                    return  # null and missing are not among the largest or smallest
                self.vals.append(x)
            else:
                out = v.get("output", MISSING)
                self.v = v["dirs"]  # the sort's directions: the same for every value
                self.vals.append((v["key"], None if out is MISSING else out))

    def result(self):
        op = self.op
        if op in ("$sum", "$count"):
            return self.sum
        if op == "$avg":
            return numbers.divide(self.sum, self.n) if self.n else None
        if op in ("$stdDevPop", "$stdDevSamp"):
            n = self.n - (op == "$stdDevSamp")
            mean = self.sum / self.n if self.n else 0
            return (sum((x - mean) ** 2 for x in self.vals) / n) ** 0.5 if n > 0 else None
        if op == "$mergeObjects":
            return self.v or {}
        if op == "$push":
            return list(self.vals)
        if op in _N_OF or op in _RANKED:
            return self._nth()
        if op in _PERCENTILES:
            got = percentiles(self.vals, *self.v) if self.v is not None else None
            return got if got is None or op == "$percentile" else got[0]
        if op == "$addToSet":
            return list(self.seen.values())
        return self.v

    def _nth(self):
        """``$firstN $lastN $maxN $minN $top $bottom $topN $bottomN``."""
        op, vals, n = self.op, self.vals, self.n
        if op == "$firstN":
            return vals[:n]
        if op == "$lastN":
            return vals[-n:] if vals else []
        if op in ("$maxN", "$minN"):
            key = functools.cmp_to_key(_cmp)
            return sorted(vals, key=key, reverse=op == "$maxN")[:n]

        dirs = self.v

        def order(a, b):
            for x, y, d in zip(a[0], b[0], dirs):
                c = _cmp(x, y)
                if c:
                    return c * d
            return 0
        ranked = sorted(vals, key=functools.cmp_to_key(order))
        chosen = ranked[:n] if op.startswith("$top") else ranked[-n:]
        outs = [out for _, out in chosen]
        return outs if op.endswith("N") else (outs[0] if outs else None)


def _accumulators(spec: dict, what: str) -> dict:
    """{field: (op, expression)} of a stage's accumulator fields (all but ``_id``)."""
    accs = {}
    for field, acc in spec.items():
        if field == "_id":
            continue
        if isinstance(acc, dict) and list(acc) == ["$accumulator"]:
            raise _err("$accumulator (server-side JavaScript) is not supported by raymx: "
                       "use the built-in accumulators", 31264)
        if not isinstance(acc, dict) or len(acc) != 1 or next(iter(acc)) not in _ACCUMULATORS:
            raise _err(f"unknown {what} operator for field '{field}'", 15952)
        op, e = next(iter(acc.items()))
        if op in _PERCENTILES and (not isinstance(e, dict) or "input" not in e):
            raise _err(f"{op} needs input and method", 7436100)
        accs[field] = (op, _ranked_expression(op, e) if op in _RANKED else e)
    return accs


def group(docs, spec: dict, variables=None, key=None):
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


def bucket(docs, spec: dict, variables=None):
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
    out = list(group(docs, dict(output), variables, key))
    order = {encode_key(b): i for i, b in enumerate(bounds)}
    return sorted(out, key=lambda g: order.get(encode_key(g["_id"]), len(bounds)))


def bucket_auto(docs, spec: dict, variables=None):
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
_FILLS = ("$locf", "$linearFill")  # over the partition in sortBy order, no window


def _gap(v) -> bool:
    return v is None or v is MISSING


def _locf(vals: list) -> list:
    """Each value, or the last one before it that is not null or missing."""
    out, last = [], None
    for v in vals:
        if not _gap(v):
            last = v
        out.append(last)
    return out


def _fill_axis(x):
    """A ``$linearFill`` sort value as a number (a date: its milliseconds)."""
    if isinstance(x, datetime.datetime):
        return types.millis(x)
    if not numbers.is_number(x):
        raise _err("$linearFill: the sortBy value must be numeric or a date, but found "
                   f"{'null' if _gap(x) else type(x).__name__}", 14)
    return numbers.as_float(x)


def _linear_fill(vals: list, sort_vals: list) -> list:
    """Each gap (null or missing) between two numbers, in sort order, filled
    on the line through them (a double); a gap before the first or after the
    last number stays null. As MongoDB's: the sort values are all numbers
    or all dates, none repeated in a partition, and the values numbers."""
    axis = [_fill_axis(x) for x in sort_vals]
    if len({type(x) is datetime.datetime for x in sort_vals}) > 1:
        raise _err("$linearFill: the sortBy field must be either numeric or a date, but not "
                   "both", 14)
    if any(a == b for a, b in zip(axis, axis[1:])):
        raise _err("$linearFill: there can be no repeated values in the sort field", 6050106)
    known = [i for i, v in enumerate(vals) if not _gap(v)]
    if any(not numbers.is_number(vals[i]) for i in known):
        raise _err("$linearFill: the value to be filled must be numeric or nullish", 14)
    out = [None if _gap(v) else v for v in vals]
    for a, b in zip(known, known[1:]):
        va, vb = numbers.as_float(vals[a]), numbers.as_float(vals[b])
        for i in range(a + 1, b):
            out[i] = va + (vb - va) * (axis[i] - axis[a]) / (axis[b] - axis[a])
    return out


def _sort_key(sort_by: dict):
    """The key a ``sortBy`` document orders documents by."""
    return query.sort_key([[k, int(v)] for k, v in sort_by.items()])


def _field_names(stage: str, fs, code: int) -> list:
    """A stage's ``partitionByFields``: a list of field names, checked."""
    if not isinstance(fs, list) or not all(isinstance(f, str) and f and f[0] != "$" for f in fs):
        raise _err(f"{stage} partitionByFields must be a list of field names", code)
    return fs


def _window(w, n: int, sort_vals: list | None, descending: bool):
    """The bounds of window ``w`` over a partition of ``n`` documents: a
    function of a position ``i`` giving [lo, hi) of the documents in its
    window. ``documents: [lo, hi]`` counts positions; ``range: [lo, hi]``
    (an ascending sort on one field) takes the documents whose sort value
    lies within the current one's plus lo and plus hi (numbers; with
    ``unit``, dates moved by that many of the unit, as ``$dateAdd``).
    Either end may be "unbounded", or "current": the current document's
    position, as MongoDB's (not its value)."""
    if w is None:
        return lambda i: (0, n)
    kinds = set(w) if isinstance(w, dict) else set()
    if kinds not in ({"documents"}, {"range"}, {"range", "unit"}):
        raise _err("a window is {documents: [lo, hi]} or {range: [lo, hi], unit: <unit>}",
                   5371600)
    kind = "documents" if "documents" in kinds else "range"
    bounds = w[kind]
    if not isinstance(bounds, list) or len(bounds) != 2 or not all(
            b in ("current", "unbounded") or (numbers.is_number(b) and not isinstance(b, bool))
            for b in bounds):
        raise _err(f"a window's {kind} must be [lower, upper], each a number, \"current\" or "
                   "\"unbounded\"", 5371601)
    lo, hi = bounds
    if kind == "documents":
        if any(numbers.is_number(b) and b != int(b) for b in bounds):
            raise _err("a documents window's bounds must be whole numbers", 5371601)

        def positions(i):
            a = 0 if lo == "unbounded" else i if lo == "current" else i + int(lo)
            b = n if hi == "unbounded" else i + 1 if hi == "current" else i + int(hi) + 1
            a = min(max(a, 0), n)
            return a, min(max(b, a), n)  # an empty window past either end: [a, a)
        return positions
    if sort_vals is None:
        raise _err("a range window needs a sortBy of exactly one field", 5339902)
    if descending:
        raise _err("a range window needs an ascending sortBy", 5339901)
    unit = w.get("unit")
    if unit is not None:
        if unit not in _UNITS and unit not in _MONTHS:
            raise _err(f"unknown time unit value: {unit!r:.40}", 9)
        if any(numbers.is_number(b) and b != int(b) for b in bounds):
            raise _err("a range window with a unit needs whole-number bounds", 5429411)
    bad = [x for x in sort_vals if not (isinstance(x, datetime.datetime) if unit is not None
                                        else numbers.is_number(x))]
    if bad:
        hint = " (a range over dates needs a unit)" if unit is None and isinstance(
            bad[0], datetime.datetime) else ""
        raise _err(f"Invalid range: Expected the sortBy field to be a "
                   f"{'number' if unit is None else 'date'}, but it was "
                   f"{_type_name(bad[0])}{hint}", 5429414 if unit is None else 5429513)
    if any(isinstance(x, Decimal128) for x in sort_vals):
        sort_vals = [numbers.as_float(x) for x in sort_vals]

    def moved(x, by):
        if unit is None:
            return x + by
        by = int(by)
        return x + by * _UNITS[unit] if unit in _UNITS else _add_months(x, by * _MONTHS[unit])

    def values(i):  # in sort order, each window is one run, found by bisection
        x = sort_vals[i]
        a = 0 if lo == "unbounded" else i if lo == "current" else \
            bisect.bisect_left(sort_vals, moved(x, lo))
        b = n if hi == "unbounded" else i + 1 if hi == "current" else \
            bisect.bisect_right(sort_vals, moved(x, hi))
        return a, b
    return values


def _type_name(x) -> str:
    return "missing" if x is MISSING else "null" if x is None else type(x).__name__


def set_window_fields(docs, spec: dict, variables=None):
    """``$setWindowFields``: per partition (``partitionBy``), in ``sortBy``
    order, each output field is an accumulator over a window of documents
    (``documents`` positions or a ``range`` of the sort field's values,
    numbers or dates with a ``unit``; the whole partition by default),
    ``$rank``/``$denseRank``/``$documentNumber``, ``$shift``, or a gap filled
    by ``$locf`` (the last value before it) or ``$linearFill`` (interpolated
    along the one sort field)."""
    if not isinstance(spec, dict) or not isinstance(spec.get("output"), dict) \
            or set(spec) - {"partitionBy", "sortBy", "output"}:
        raise _err("$setWindowFields needs output (and may take partitionBy, sortBy)", 40415)
    sort_by = spec.get("sortBy")
    outs = {}
    for field, o in spec["output"].items():
        if not isinstance(o, dict):
            raise _err(f"$setWindowFields output {field!r} must be an object", 40415)
        ops = [k for k in o if k != "window"]
        if len(ops) != 1 or (ops[0] not in _ACCUMULATORS + _RANKS + _FILLS + ("$shift",)):
            raise _err(f"$setWindowFields output {field!r}: unknown window function "
                       f"{ops[:1]}", 5371601)
        if ops[0] in _RANKS + _FILLS + ("$shift",) and not sort_by:
            raise _err(f"{ops[0]} needs a sortBy", 5371602)
        if ops[0] in _FILLS and "window" in o:
            raise _err(f"{ops[0]} takes no window: it fills over the whole partition", 5371601)
        if ops[0] == "$linearFill" and len(sort_by) != 1:
            raise _err("$linearFill needs a sortBy of exactly one field", 605001)
        arg = _ranked_expression(ops[0], o[ops[0]]) if ops[0] in _RANKED else o[ops[0]]
        outs[field] = (ops[0], arg, o.get("window"))
    parts: dict[bytes, list] = {}
    for d in docs:
        pid = evaluate(spec["partitionBy"], d, None, variables) if "partitionBy" in spec \
            else None
        parts.setdefault(encode_key(None if pid is MISSING else pid), []).append(d)
    keyf = _sort_key(sort_by) if sort_by else None
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
            elif op in _FILLS:
                vals = [evaluate(arg, d, None, variables) for d in part]
                col = _locf(vals) if op == "$locf" else _linear_fill(vals, sort_vals)
            else:
                vals = [1 if op == "$count" else evaluate(arg, d, None, variables)
                        for d in part]
                bounds = _window(w, n, sort_vals, one is not None and sort_by[one] == -1)
                acc, was = None, None  # a window that only grows feeds one accumulator
                for i in range(n):
                    lo, hi = bounds(i)
                    if was == (lo, hi):  # the same window (the whole partition): its value
                        col.append(copy.deepcopy(col[-1]))
                        continue
                    if was is None or lo != was[0] or hi < was[1]:
                        acc, was = _Acc(op), (lo, lo)
                    for v in vals[was[1]:hi]:
                        acc.add(v)
                    was = (lo, hi)
                    col.append(acc.result())
            results[field] = col
        for i, d in enumerate(part):
            out = copy.deepcopy(d)
            for field, col in results.items():
                _set_path(out, field, col[i])
            yield out


_FILL_METHODS = {"locf": "$locf", "linear": "$linearFill"}


def fill(docs, spec: dict, variables=None):
    """``$fill``: in each output field, a null or missing value becomes the
    ``value`` expression (evaluated over the document) or what ``method``
    gives, ``locf`` (the last value before it) or ``linear`` (interpolated):
    ``$setWindowFields`` with ``$locf``/``$linearFill`` per partition
    (``partitionBy`` or ``partitionByFields``) in ``sortBy`` order, as
    MongoDB runs it."""
    if not isinstance(spec, dict) or not isinstance(spec.get("output"), dict) \
            or not spec["output"] or set(spec) - {"partitionBy", "partitionByFields",
                                                   "sortBy", "output"}:
        raise _err("$fill needs output (and may take partitionBy or partitionByFields, "
                   "sortBy)", 40415)
    if "partitionBy" in spec and "partitionByFields" in spec:
        raise _err("$fill takes partitionBy or partitionByFields, not both", 6050204)
    methods, values = {}, {}
    for field, o in spec["output"].items():
        if not isinstance(o, dict) or len(o) != 1 or next(iter(o)) not in ("value", "method"):
            raise _err(f"$fill output {field!r} must be {{value: <expression>}} or "
                       "{method: 'locf' | 'linear'}", 6050203)
        if "method" in o:
            if o["method"] not in _FILL_METHODS:
                raise _err(f"$fill output {field!r}: method must be 'locf' or 'linear', got "
                           f"{o['method']!r:.40}", 6050202)
            methods[field] = _FILL_METHODS[o["method"]]
        else:
            values[field] = o["value"]
    sort_by = spec.get("sortBy")
    if sort_by is not None and (not isinstance(sort_by, dict) or not sort_by or any(
            v not in (1, -1) for v in sort_by.values())):
        raise _err("$fill sortBy must be a document of fields and 1 or -1", 6050205)
    if methods and not sort_by:
        raise _err("$fill with a method needs a sortBy", 6050205)
    part = spec.get("partitionBy")
    if "partitionByFields" in spec:
        part = [f"${f}" for f in _field_names("$fill", spec["partitionByFields"], 6050206)]
    if methods:
        sws = {"sortBy": sort_by, "output": {f: {m: f"${f}"} for f, m in methods.items()}}
        if part is not None:
            sws["partitionBy"] = part
        docs = set_window_fields(docs, sws, variables)
    elif sort_by:
        docs = iter(sorted(docs, key=_sort_key(sort_by)))
    for d in docs:
        gaps = [(f, e) for f, e in values.items() if _gap(query.get_path(d, f))]
        if gaps:
            d = copy.deepcopy(d)  # the stage before may hold it still
            for field, e in gaps:
                _set_path(d, field, evaluate(e, d, None, variables))
        yield d


def _densify_spec(spec) -> tuple:
    """(field, step, unit, bounds, partition fields) of a ``$densify``, checked."""
    if not isinstance(spec, dict) or set(spec) - {"field", "range", "partitionByFields"} \
            or "field" not in spec or "range" not in spec:
        raise _err("$densify needs field and range (and may take partitionByFields)", 40415)
    field, rng = spec["field"], spec["range"]
    if not isinstance(field, str) or not field or field.startswith("$"):
        raise _err("$densify field must be a field name, not an expression", 5733001)
    parts = _field_names("$densify", spec.get("partitionByFields", []), 5733002)
    if field in parts:
        raise _err("$densify field may not be one of its partitionByFields", 5733003)
    if not isinstance(rng, dict) or set(rng) - {"step", "unit", "bounds"} \
            or "step" not in rng or "bounds" not in rng:
        raise _err("$densify range needs step and bounds (and unit for dates)", 5733004)
    step, unit, bounds = rng["step"], rng.get("unit"), rng["bounds"]
    if not numbers.is_number(step) or isinstance(step, bool) or numbers.as_float(step) <= 0:
        raise _err("$densify step must be a positive number", 5733005)
    if unit is not None and (unit not in _UNITS and unit not in _MONTHS
                             or not numbers.is_int(step)):
        raise _err(f"$densify unit must be a time unit with an integer step, got {unit!r:.40}",
                   5733006)
    if bounds not in ("full", "partition") and not (
            isinstance(bounds, list) and len(bounds) == 2
            and all(map(_densify_value(unit), bounds)) and bounds[0] < bounds[1]):
        raise _err("$densify bounds must be 'full', 'partition' or [lower, upper], lower "
                   f"below upper, {'numbers' if unit is None else 'dates (with a unit)'}",
                   5733007)
    return field, step, unit, bounds, parts


def _densify_value(unit):
    """The test of a value ``$densify`` steps through: a number (not a
    Decimal128), or a date when there is a unit."""
    if unit is not None:
        return lambda v: isinstance(v, datetime.datetime)
    return lambda v: numbers.is_number(v) and type(v) is not Decimal128


def densify(docs, spec: dict, variables=None):
    """``$densify`` (MongoDB 5.1): per partition (``partitionByFields``), in
    the order of ``field``, a document holding only ``field`` (and the
    partition's fields) for every value of the grid ``lower + k * step``
    (``unit``: a date's) that no document has: from the smallest to the
    largest value of all documents (``bounds: "full"``), of the partition
    (``"partition"``), or in [lower, upper). Documents stay as they are,
    outside the bounds too; those without a number or date in ``field``
    pass through after the rest."""
    field, step, unit, bounds, parts = _densify_spec(spec)

    def at(lo, k):  # the grid's k-th value from lo
        if unit is None:
            return lo + k * step
        if unit in _UNITS:
            return lo + k * step * _UNITS[unit]
        return _add_months(lo, k * step * _MONTHS[unit])

    ok = _densify_value(unit)
    groups: dict[bytes, tuple[list, list]] = {}
    rest = []
    for d in docs:
        v = query.get_path(d, field)
        if _gap(v):
            rest.append(d)
            continue
        if not ok(v):
            raise _err(f"$densify: the value of {field!r} must be a "
                       f"{'number' if unit is None else 'date'} here, not "
                       f"{type(v).__name__}", 5733201)
        pv = [query.get_path(d, f) for f in parts]
        groups.setdefault(encode_key([None if x is MISSING else x for x in pv]),
                          (pv, []))[1].append((v, d))
    values = [v for _, g in groups.values() for v, _ in g]
    full = (min(values), max(values)) if values else None
    for key in sorted(groups):
        pv, g = groups[key]
        g.sort(key=lambda t: t[0])
        if bounds == "full":
            lo, hi, closed = full[0], full[1], True
        elif bounds == "partition":
            lo, hi, closed = g[0][0], g[-1][0], True
        else:
            lo, hi, closed = bounds[0], bounds[1], False
        have = {v for v, _ in g}
        k, i = 0, 0
        while True:
            x = at(lo, k)
            if x > hi or (x == hi and not closed):
                break
            while i < len(g) and g[i][0] <= x:  # the documents up to this grid value
                yield g[i][1]
                i += 1
            if x not in have:
                new: dict = {}
                for f, fv in zip(parts, pv):
                    if fv is not MISSING:
                        _set_path(new, f, fv)
                _set_path(new, field, x)
                yield new
            k += 1
            if k > 1_000_000:
                raise _err("$densify would generate more than 1,000,000 documents in a "
                           "partition: use a larger step or narrower bounds", 5897900)
        for _, d in g[i:]:
            yield d
    yield from rest
