"""The query language: filters, index bounds and sort (projections: ``projection.py``).

Values compare by ``encode_key`` (see ``keys.py``), so equality is numeric
across int and float and ``sort`` uses the same order as the indexes.

Paths are dotted. A component walks into a dict, or indexes a list when it is
a decimal number; as in MongoDB, any other component fans out over an array
of subdocuments: ``{"a.b": 1}`` matches ``{"a": [{"b": 0}, {"b": 1}]}``
(``reach``). At the end of the path the MongoDB array rule applies: a
condition on an array value matches if the whole array or any one element
satisfies it. So a condition matches when any value the path reaches does,
and ``$ne``/``$nin`` when none does.
"""
from __future__ import annotations

import datetime
import math
import re
import uuid
from typing import Any, Callable, Container, Iterable, NamedTuple

from bson import Decimal128, ObjectId
from bson.binary import Binary
from bson.code import Code
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.regex import Regex
from bson.timestamp import Timestamp

from raymx.storage.errors import InvalidDocument, InvalidFilter
from raymx.storage.keys import END, NAN_KEY, T_ARR, T_MAXKEY, T_MINKEY, T_NULL, encode_key
from raymx.storage.numbers import is_int


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"

    def __reduce__(self) -> str:
        return "MISSING"  # unpickles as this module's singleton


MISSING: Any = _Missing()
_NULL = bytes((T_NULL,))
_ARRAY = (list, tuple)
_COMPARE = {"$gt", "$gte", "$lt", "$lte"}
_LOGICAL = {"$and", "$or", "$nor"}

Predicate = Callable[[Any], bool]


def _parts(path: Any, err: type[Exception] = InvalidFilter) -> list[str]:
    if not isinstance(path, str):
        raise err(f"field name {path!r} is not a string")
    parts = path.split(".")
    if not all(parts):
        raise err(f"field path {path!r} has an empty component")
    return parts


def _walk(cur: Any, parts: Iterable[str]) -> Any:
    for p in parts:
        if isinstance(cur, dict):
            cur = cur.get(p, MISSING)
            if cur is MISSING:
                return MISSING
        elif isinstance(cur, _ARRAY) and p.isascii() and p.isdigit() and int(p) < len(cur):
            cur = cur[int(p)]
        else:
            return MISSING
    return cur


def get_path(doc: Any, path: str) -> Any:
    """The value at dotted ``path`` in ``doc``, or ``MISSING`` (no fan-out over arrays)."""
    return _walk(doc, path.split("."))


def _reach(cur: Any, parts: list[str], i: int = 0) -> list:
    """Every value ``parts[i:]`` reaches from ``cur``, fanning out over arrays of
    subdocuments (a component that is not an index); ``[MISSING]`` if none."""
    for j in range(i, len(parts)):
        p = parts[j]
        if isinstance(cur, dict):
            cur = cur.get(p, MISSING)
            if cur is MISSING:
                return [MISSING]
        elif isinstance(cur, _ARRAY):
            if p.isascii() and p.isdigit():
                if int(p) >= len(cur):
                    return [MISSING]
                cur = cur[int(p)]
                continue
            out = [v for el in cur if isinstance(el, dict) for v in _reach(el, parts, j)]
            return out or [MISSING]
        else:
            return [MISSING]
    return [cur]


def _values(doc: Any, parts: list[str]) -> list:
    """``_reach``, walking first: the common path reaches one value without fan-out."""
    v = _walk(doc, parts)
    return [v] if v is not MISSING or len(parts) == 1 else _reach(doc, parts)


def reach(doc: Any, path: str) -> list:
    """The values dotted ``path`` reaches in ``doc`` (``[MISSING]`` if none)."""
    return _values(doc, path.split("."))


# --- filters ---------------------------------------------------------------
def _key(v: Any, what: str) -> bytes:
    try:
        return encode_key(v)
    except InvalidDocument as e:
        raise InvalidFilter(f"{what}: {e.msg}") from None


def _candidates(v: Any) -> list[bytes]:
    """Keys a condition may match: the value (None if missing), and each element of an array."""
    if v is MISSING:
        return [_NULL]
    if isinstance(v, _ARRAY):
        ks = [encode_key(x) for x in v]
        return [bytes((T_ARR,)) + b"".join(ks) + END, *ks]
    return [encode_key(v)]


def equality_keys(doc: Any, path: str) -> set[bytes]:
    """The keys an equality on dotted ``path`` of ``doc`` matches (``{path:
    v}`` matches ``doc`` when ``v``'s key is among them): each value reached,
    each element of an array, null for a missing field. Used to join
    (``$lookup``)."""
    return {k for v in reach(doc, path) for k in _candidates(v)}


def _is_ops(cond: Any) -> bool:
    """Whether a field's condition is an operator dict (else it is a value to equal)."""
    if not isinstance(cond, dict) or not cond:
        return False
    if next(iter(cond)) == "$ref":  # a DBRef as its map: a value, as MongoDB reads it
        return False
    ops = [isinstance(k, str) and k.startswith("$") for k in cond]
    if any(ops) and not all(ops):
        raise InvalidFilter(f"condition {cond!r:.80} mixes $operators and field names")
    return ops[0]


OpPred = Callable[[Any, list[bytes]], bool]  # (value or MISSING, its candidate keys)


def _compile_op(path: str, op: str, arg: Any) -> OpPred:
    what = f"{op} on {path!r}"
    if op == "$options":
        raise InvalidFilter(f"$options on {path!r} needs a $regex beside it")
    if _is_regex(arg) and op in ("$eq", "$in"):  # {"name": re.compile("^a")}
        return _regex(what, arg)
    if op in ("$eq", "$ne"):
        k = _key(arg, what)
        if op == "$eq":
            return lambda v, ks: k in ks
        return lambda v, ks: k not in ks
    if op in ("$in", "$nin"):
        if not isinstance(arg, _ARRAY):
            raise InvalidFilter(f"{what} needs a list, got {type(arg).__name__}")
        s = {_key(x, what) for x in arg if not _is_regex(x)}
        rxs = [_regex(what, x) for x in arg if _is_regex(x)]  # a pattern matches strings
        if rxs:
            def hit(v, ks):
                return any(x in s for x in ks) or any(r(v, ks) for r in rxs)
        else:
            def hit(v, ks):
                return any(x in s for x in ks)
        if op == "$in":
            return hit
        return lambda v, ks: not hit(v, ks)
    if op in _COMPARE:
        k = _key(arg, what)
        b = k[0]
        # NaN (its key sorts below -inf) compares false with every other number
        # and equal to itself, as in MongoDB's matcher: no range of numbers
        # holds it, and a range bounded by NaN holds only NaN ($gte, $lte)
        if k == NAN_KEY:
            if op in ("$gt", "$lt"):
                return lambda v, ks: False
            return lambda v, ks: k in ks
        if b == T_MINKEY or b == T_MAXKEY:
            # MinKey and MaxKey bound every type, as in MongoDB's matcher (no
            # type bracket): {"$gte": MinKey} holds any value, a missing one too,
            # as {"$lte": MaxKey} does (the ranges a partitioner asks for)
            if op == "$gt":
                return lambda v, ks: any(x > k for x in ks)
            if op == "$gte":
                return lambda v, ks: any(x >= k for x in ks)
            if op == "$lt":
                return lambda v, ks: any(x < k for x in ks)
            return lambda v, ks: any(x <= k for x in ks)
        if op == "$gt":
            return lambda v, ks: any(x[0] == b and x > k for x in ks)
        if op == "$gte":
            return lambda v, ks: any(x[0] == b and x >= k for x in ks)
        if op == "$lt":
            return lambda v, ks: any(x[0] == b and x != NAN_KEY and x < k for x in ks)
        return lambda v, ks: any(x[0] == b and x != NAN_KEY and x <= k for x in ks)
    if op == "$exists":
        if type(arg) not in (bool, int, float):
            raise InvalidFilter(f"{what} needs true or false, got {arg!r:.40}")
        arg = bool(arg)  # as MongoDB: {"$exists": 1}, {"$exists": 0}
        return lambda v, ks: (v is not MISSING) == arg
    if op == "$not":
        if _is_regex(arg):
            inner = _regex(what, arg)
        elif not isinstance(arg, dict) or not _is_ops(arg):
            raise InvalidFilter(f"{what} needs an operator dict such as {{'$gt': 1}}, or a "
                                "regular expression")
        else:
            inner = _compile_ops(path, arg)
        return lambda v, ks: not inner(v, ks)
    if op in _MORE:
        return _MORE[op](what, arg)
    if op in _LOGICAL:
        raise InvalidFilter(f"{op} is only allowed at the top level of a filter, not on {path!r}")
    raise InvalidFilter(f"unknown operator {op} on {path!r}", operator=op)


def _is_regex(v: Any) -> bool:
    return isinstance(v, re.Pattern) or (hasattr(v, "pattern") and hasattr(v, "flags")
                                          and not isinstance(v, (str, bytes, dict)))


_RE_FLAGS = {"i": re.I, "m": re.M, "s": re.S, "x": re.X}
_RE_MASK = re.I | re.M | re.S | re.X


def _regex(what: str, arg: Any) -> OpPred:
    """``$regex`` (a pattern string with ``$options``, a compiled pattern or a
    BSON regex): strings, or an array's string elements, that it searches."""
    pattern, options = (arg if isinstance(arg, tuple) else (arg, ""))
    flags = 0
    if _is_regex(pattern):
        flags = pattern.flags if isinstance(pattern.flags, int) else 0
        pattern = pattern.pattern
    if not isinstance(pattern, str) or not isinstance(options, str):
        raise InvalidFilter(f"{what} needs a pattern string (and $options a string)")
    for o in options:
        if o not in _RE_FLAGS:
            raise InvalidFilter(f"{what}: unknown option {o!r} (i, m, s, x)")
        flags |= _RE_FLAGS[o]
    try:
        rx = re.compile(pattern, flags & _RE_MASK)
    except re.error as e:
        raise InvalidFilter(f"{what}: invalid pattern {pattern!r:.60}: {e}") from None

    same = flags & _RE_MASK

    def one(x):  # a string it finds, or a stored regex that is the same one (MongoDB's)
        if type(x) is str:  # not a Code, a str subclass
            return rx.search(x) is not None
        return type(x) is Regex and x.pattern == pattern and x.flags & _RE_MASK == same

    def match(v, ks):
        return one(v) or isinstance(v, _ARRAY) and any(map(one, v))
    return match


def _size(what: str, arg: Any) -> OpPred:
    if not is_int(arg) or arg < 0:
        raise InvalidFilter(f"{what} needs a non-negative integer")
    return lambda v, ks: isinstance(v, _ARRAY) and len(v) == arg


def _all(what: str, arg: Any) -> OpPred:
    if not isinstance(arg, _ARRAY):
        raise InvalidFilter(f"{what} needs a list")
    if arg and all(isinstance(x, dict) and list(x) == ["$elemMatch"] for x in arg):
        # every $elemMatch must find an element (MongoDB's idiom for arrays of documents)
        preds = [_elem_match(what, x["$elemMatch"]) for x in arg]
        return lambda v, ks: all(p(v, ks) for p in preds)
    want = [_key(x, what) for x in arg if not _is_regex(x)]
    rxs = [_regex(what, x) for x in arg if _is_regex(x)]  # each must match, as {f: /re/}
    if not rxs:
        return lambda v, ks: bool(want) and all(k in ks for k in want)
    return lambda v, ks: all(k in ks for k in want) and all(r(v, ks) for r in rxs)


def _number_of(v: Any) -> bool:
    return type(v) in (int, float, Int64)


def _mod(what: str, arg: Any) -> OpPred:
    """``$mod: [divisor, remainder]``: numbers (or an array's) whose value,
    truncated toward zero, leaves that remainder, as MongoDB's."""
    if not isinstance(arg, _ARRAY) or len(arg) != 2 or not all(_number_of(x) for x in arg):
        raise InvalidFilter(f"{what} needs [divisor, remainder], two numbers")
    if not all(math.isfinite(x) for x in arg):
        raise InvalidFilter(f"{what}: the divisor and remainder must be finite numbers, not "
                            f"{arg!r:.60}")
    div, rem = math.trunc(arg[0]), math.trunc(arg[1])
    if div == 0:
        raise InvalidFilter(f"{what}: the divisor cannot be 0")

    def one(x):
        return _number_of(x) and not (isinstance(x, float) and not math.isfinite(x)) and \
            math.fmod(math.trunc(x), div) == rem
    return lambda v, ks: one(v) or isinstance(v, _ARRAY) and any(one(x) for x in v)


def _bits(op: str):
    def compile_bits(what: str, arg: Any) -> OpPred:
        if is_int(arg) and arg >= 0:
            mask = arg
        elif isinstance(arg, _ARRAY) and all(is_int(b) and 0 <= b < 64 for b in arg):
            mask = sum(1 << b for b in set(arg))
        else:
            raise InvalidFilter(f"{what} needs a non-negative bitmask or a list of bit "
                                "positions (0-63)")
        test = {"$bitsAllSet": lambda x: x & mask == mask, "$bitsAnySet": lambda x: x & mask != 0,
                "$bitsAllClear": lambda x: x & mask == 0,
                "$bitsAnyClear": lambda x: x & mask != mask}[op]
        return lambda v, ks: is_int(v) and test(v)
    return compile_bits


def _elem_match(what: str, arg: Any) -> OpPred:
    if not isinstance(arg, dict) or not arg:
        raise InvalidFilter(f"{what} needs a filter or an operator dict")
    if _is_ops(arg):  # conditions on each element
        inner = _compile_ops(what, arg)
        return lambda v, ks: isinstance(v, _ARRAY) and any(
            not isinstance(x, _ARRAY) and inner(x, _candidates(x)) for x in v)
    sub = _compile(arg)  # a filter on subdocument elements
    return lambda v, ks: isinstance(v, _ARRAY) and any(isinstance(x, dict) and sub(x) for x in v)


_TYPE_CODES = {1: "double", 2: "string", 3: "object", 4: "array", 5: "binData", 7: "objectId",
               8: "bool", 9: "date", 10: "null", 11: "regex", 13: "javascript", 16: "int",
               17: "timestamp", 18: "long", 19: "decimal", -1: "minKey", 127: "maxKey"}
_OTHER_TYPES = {ObjectId: "objectId", Decimal128: "decimal", Int64: "long",
                Timestamp: "timestamp", Regex: "regex", re.Pattern: "regex",
                Code: "javascript", MinKey: "minKey", MaxKey: "maxKey"}


def type_name(v: Any) -> str | None:
    """The BSON type name (``$type``'s) of a stored value; None for another."""
    t = type(v)
    if v is None:
        return "null"
    if t is bool:
        return "bool"
    if t is int:
        return "int" if -(1 << 31) <= v < (1 << 31) else "long"
    if t is float:
        return "double"
    if t is str:
        return "string"
    if t is dict:
        return "object"
    if t in _ARRAY:
        return "array"
    if t is bytes or t is uuid.UUID or t is Binary:
        return "binData"
    if isinstance(v, datetime.datetime):
        return "date"
    return _OTHER_TYPES.get(t)


def _type(what: str, arg: Any) -> OpPred:
    names = set()
    for a in (arg if isinstance(arg, _ARRAY) else [arg]):
        if is_int(a) and a in _TYPE_CODES:
            names.add(_TYPE_CODES[a])
        elif a == "number":
            names |= {"double", "int", "long", "decimal"}
        elif a in _TYPE_CODES.values():
            names.add(a)
        else:
            raise InvalidFilter(f"{what}: unknown type {a!r:.40}")

    def match(v, ks):
        if v is MISSING:
            return False
        if type_name(v) in names:
            return True
        return isinstance(v, _ARRAY) and any(type_name(x) in names for x in v)
    return match


_MORE: dict[str, Callable[[str, Any], OpPred]] = {
    "$regex": _regex, "$size": _size, "$all": _all, "$elemMatch": _elem_match, "$type": _type,
    "$mod": _mod, **{b: _bits(b) for b in ("$bitsAllSet", "$bitsAnySet", "$bitsAllClear",
                                           "$bitsAnyClear")}}


def _compile_ops(path: str, ops: dict) -> OpPred:
    if "$regex" in ops:  # $options belongs to it
        ops = dict(ops)
        rx = ops.pop("$regex")
        ops["$regex"] = (rx, ops.pop("$options", ""))
    preds = [_compile_op(path, op, arg) for op, arg in ops.items()]
    return preds[0] if len(preds) == 1 else lambda v, ks: all(p(v, ks) for p in preds)


def _fanned(vals: list) -> tuple[Any, list[bytes]]:
    """(a value standing for ``vals``: MISSING if none is present; their candidate keys)."""
    ks = [k for v in vals for k in _candidates(v)]
    return (vals if any(v is not MISSING for v in vals) else MISSING), ks


def _compile_field(path: str, cond: Any) -> Predicate:
    parts = _parts(path)
    pred = _compile_ops(path, cond) if _is_ops(cond) else _compile_op(path, "$eq", cond)
    if len(parts) == 1:
        def match(doc: Any) -> bool:
            v = _walk(doc, parts)
            return pred(v, _candidates(v))
        return match

    def match_path(doc: Any) -> bool:
        vals = _values(doc, parts)
        return pred(vals[0], _candidates(vals[0])) if len(vals) == 1 else pred(*_fanned(vals))
    return match_path


_UNSERVED = {
    "$text": "$text needs a text index, which raymx does not have: match with $regex",
    "$where": "$where (server-side JavaScript) is not supported by raymx: use $expr",
    "$expr": "$expr is evaluated by the MongoDB wire port (aggregation expressions), not in "
             "the native driver's filters",
}


def _compile(flt: Any) -> Predicate:
    if not isinstance(flt, dict):
        raise InvalidFilter(f"a filter must be a dict, got {type(flt).__name__}")
    preds: list[Predicate] = []
    for k, cond in flt.items():
        if k == "$comment":  # a note for the logs: matches everything
            continue
        if isinstance(k, str) and k.startswith("$"):
            if k not in _LOGICAL:
                raise InvalidFilter(_UNSERVED.get(k, f"unknown top-level operator {k}"),
                                    operator=k)
            if not isinstance(cond, _ARRAY) or not cond or \
                    not all(isinstance(c, dict) for c in cond):
                raise InvalidFilter(f"{k} needs a non-empty list of filter dicts")
            subs = [_compile(c) for c in cond]
            if k == "$and":
                preds.append(lambda d, subs=subs: all(s(d) for s in subs))
            elif k == "$or":
                preds.append(lambda d, subs=subs: any(s(d) for s in subs))
            else:
                preds.append(lambda d, subs=subs: not any(s(d) for s in subs))
        else:
            preds.append(_compile_field(k, cond))
    if not preds:
        return lambda d: True
    return preds[0] if len(preds) == 1 else lambda d: all(p(d) for p in preds)


def compile_filter(flt: dict | None) -> Callable[[dict], bool]:
    """A predicate for ``flt``; a malformed filter raises ``InvalidFilter`` here, not later."""
    return (lambda d: True) if flt is None else _compile(flt)


# --- index bounds ----------------------------------------------------------
class Bounds(NamedTuple):
    """What a matching document's value at one path must satisfy.

    ``points``: it equals one of them (sorted by key, distinct). Otherwise
    ``low``/``high`` as ``(value, inclusive)``, either may be None. Comparison
    operators match only their operand's type bracket, so a scan may stop at
    the end of that bracket. ``low`` may sort above ``high`` (nothing matches).
    """

    points: list | None
    low: tuple[Any, bool] | None
    high: tuple[Any, bool] | None


def index_keys(doc: Any, path: str) -> list[bytes]:
    """The index keys under which ``doc`` must be found for ``extract_bounds`` to be safe.

    The whole value's key (None's when missing) and, for an array, each
    element's key (a "multikey" entry), for every value the path reaches,
    sorted and distinct.
    """
    return sorted(set(_fanned(reach(doc, path))[1]))


def distinct_values(docs, key: str) -> list:
    """The distinct values at ``key`` (a dotted path; arrays count each
    element, as MongoDB's ``distinct``) over ``docs``, in the order of
    values; of values that sort equal (1 and 1.0), the first seen."""
    seen: dict = {}
    for doc in docs:
        for x in spread(doc, key):
            seen.setdefault(encode_key(x), x)
    return [seen[k] for k in sorted(seen)]


def spread(doc: Any, key: str) -> list:
    """The values ``distinct`` takes from ``doc`` at ``key``: each value
    reached, an array's elements instead of the array."""
    return [x for v in reach(doc, key) if v is not MISSING
            for x in (v if isinstance(v, _ARRAY) else [v])]


def array_paths(doc: Any, path: str) -> set[str]:
    """The prefixes of dotted ``path`` (the whole path included) at which
    ``doc`` holds an array: {"a"} for ``{"a": [{"b": 1}]}`` and "a.b", an
    empty set when the path meets no array. A numeric part after an array
    picks an element (``a.0.b``), as MongoDB's index key paths do."""
    parts, out = path.split("."), set()

    def walk(v, i):
        if isinstance(v, _ARRAY):
            if i < len(parts) and parts[i].isascii() and parts[i].isdigit():  # a position
                j = int(parts[i])
                if j < len(v):
                    walk(v[j], i + 1)
                return
            out.add(".".join(parts[:i]))
            if i < len(parts):
                for x in v:
                    if isinstance(x, dict):
                        walk(x.get(parts[i], MISSING), i + 1)
        elif i < len(parts) and isinstance(v, dict):
            walk(v.get(parts[i], MISSING), i + 1)
    walk(doc, 0)
    return out


def parallel_arrays(doc: Any, paths) -> tuple[str, str] | None:
    """Two of ``paths`` (a compound index's fields) at which ``doc`` holds
    different arrays, neither inside the other, or None. MongoDB refuses to
    index such a document (CannotIndexParallelArrays): its keys would be the
    cross product of the arrays' elements."""
    seen: list[tuple[str, str]] = []  # (field, an array prefix of it)
    for p in paths:
        for a in array_paths(doc, p):
            for q, b in seen:
                if q != p and not (a == b or a.startswith(b + ".") or b.startswith(a + ".")):
                    return q, p
            seen.append((p, a))
    return None


def field_conditions(flt: dict):
    """(field, condition) of a filter's top level, through nested ``$and``s
    (what every matching document must satisfy; ``$or``/``$nor`` are left out,
    but an ``$or`` of one clause is that clause, as MongoDB reads it)."""
    for k, cond in flt.items():
        if k == "$and" or (k == "$or" and isinstance(cond, list) and len(cond) == 1):
            for c in cond:
                yield from field_conditions(c)
        elif not k.startswith("$"):
            yield k, cond


def extract_bounds(flt: dict | None, *,
                   multikey: bool | Container[str] = True) -> dict[str, Bounds]:
    """Per path, bounds implied by the top-level conjunction of ``flt`` (index selection).

    Contract: for every document ``d`` matching ``flt`` and every ``(p, b)`` in
    the result, some key of ``index_keys(d, p)`` satisfies ``b``. An index
    that stores only the whole value (``encode_key(get_path(d, p))``, None if
    missing) is therefore safe only for documents that hold no array at ``p``:
    ``{"a": 5}`` matches ``{"a": [5, 6]}`` through an element.

    When ``p`` may hold an array (``multikey`` is True, or a container holding
    ``p``), ``low`` and ``high`` are never both given, because
    ``{"a": {"$gt": 5, "$lt": 10}}`` matches ``{"a": [1, 20]}`` through
    different elements; only ``low`` is kept. Pass ``multikey=False`` (or the
    set of paths that may hold arrays) to get both sides.

    Only necessary conditions are used ($eq, plain values, $in, $gt/$gte/
    $lt/$lte at the top level, in a top-level $and or in a one-clause $or); a
    condition whose value is a list or dict is skipped, and so is a comparison
    with MinKey or MaxKey
    (it spans every type bracket). Bounds are a superset: re-check every
    candidate with ``compile_filter``.
    """
    compile_filter(flt)  # validates
    acc: dict[str, tuple[list[list], list, list]] = {}

    def scalar(v: Any) -> bool:
        return not isinstance(v, (dict, *_ARRAY)) and not _is_regex(v)

    def bracketed(v: Any) -> bool:  # MinKey and MaxKey bound no type bracket: no bound
        return scalar(v) and not isinstance(v, (MinKey, MaxKey))

    def add(path: str, cond: Any) -> None:
        points, lows, highs = acc.setdefault(path, ([], [], []))
        ops = cond if _is_ops(cond) else {"$eq": cond}
        for op, arg in ops.items():
            if op == "$eq" and scalar(arg):
                points.append([arg])
            elif op == "$in" and all(scalar(x) for x in arg):
                points.append(list(arg))
            elif op in ("$gt", "$gte") and bracketed(arg):
                lows.append((arg, op == "$gte"))
            elif op in ("$lt", "$lte") and bracketed(arg):
                highs.append((arg, op == "$lte"))

    for k, cond in field_conditions(flt or {}):
        add(k, cond)
    out = {}
    for path, (points, lows, highs) in acc.items():
        if points:
            # Each equality alone is necessary: keep the most selective one.
            best = min(points, key=len)
            out[path] = Bounds([v for _, v in sorted({encode_key(v): v for v in best}.items())],
                               None, None)
        elif lows or highs:
            # The tightest low is necessary too (a value above it is above every low).
            low = max(lows, key=lambda t: (encode_key(t[0]), not t[1])) if lows else None
            high = min(highs, key=lambda t: (encode_key(t[0]), t[1])) if highs else None
            mk = multikey if isinstance(multikey, bool) else path in multikey
            if mk and low is not None:
                high = None
            out[path] = Bounds(None, low, high)
    return out


# --- the positional element (updates' and projections' $) -----------------
def matched_element(doc: dict, parts: list[str], match: Callable[[dict], bool]) -> int | None:
    """The first element of the array at ``parts`` through which ``match`` (a
    compiled filter) holds when the array holds that element alone: what the
    positional ``$`` stands for in an update and a projection. None if no
    element does, or no array is there."""
    arr = _walk(doc, parts)
    if not isinstance(arr, _ARRAY):
        return None
    for i, el in enumerate(arr):
        if match(_with_value(doc, parts, [el])):
            return i
    return None


def _with_value(doc: dict, parts: list[str], value: Any) -> dict:
    """A copy of ``doc`` with ``value`` at ``parts`` (a path ``_walk``
    reaches), copying only the containers on the way."""
    root: Any = dict(doc)
    node = root
    for j, p in enumerate(parts):
        k: Any = int(p) if isinstance(node, list) else p
        if j == len(parts) - 1:
            node[k] = value
        else:
            nxt = node[k]
            node[k] = nxt = dict(nxt) if isinstance(nxt, dict) else list(nxt)
            node = nxt
    return root


# --- sort --------------------------------------------------------------------
_INVERT = bytes(range(255, -1, -1))


def sort_spec(spec: Any) -> list[tuple[list[str], int]]:
    """A sort as [(path parts, 1 | -1), ...], or InvalidFilter naming what is wrong."""
    if isinstance(spec, str):
        spec = [(spec, 1)]
    elif isinstance(spec, dict):
        spec = list(spec.items())
    if not isinstance(spec, _ARRAY):
        raise InvalidFilter("a sort must be a list of (path, direction), "
                            f"got {type(spec).__name__}")
    out = []
    for item in spec:
        if isinstance(item, str):
            item = (item, 1)
        if not isinstance(item, _ARRAY) or len(item) != 2:
            raise InvalidFilter(f"sort item {item!r:.60} is not (path, direction)")
        path, direction = item
        if type(direction) is not int or direction not in (1, -1):
            raise InvalidFilter(f"sort direction of {path!r} must be 1 or -1, "
                                f"got {direction!r:.40}")
        out.append((_parts(path), direction))
    return out


def sort_key(spec: Any) -> Callable[[dict], tuple]:
    """A ``sorted(..., key=)`` function: by ``encode_key`` of each path (missing as None).

    As in MongoDB, a path reaching an array (or several values, through arrays
    of subdocuments) sorts by its smallest element ascending and its largest
    descending; an empty array is the smallest value. Descending fields use
    the complemented key, which reverses the order because encodings are
    prefix-free (self-delimiting).
    """
    fields = sort_spec(spec)

    def key(doc: dict) -> tuple:
        out = []
        for parts, direction in fields:
            vals = _values(doc, parts)
            if len(vals) == 1 and not isinstance(vals[0], _ARRAY):  # the common case
                k = _NULL if vals[0] is MISSING else encode_key(vals[0])
            else:
                ks = [_NULL if x is MISSING else encode_key(x)
                      for y in vals for x in (y if isinstance(y, _ARRAY) else (y,))]
                # an empty array is the smallest value ("\x00" inverts above every key)
                k = (min(ks) if direction == 1 else max(ks)) if ks else \
                    (b"" if direction == 1 else b"\x00")
            out.append(k if direction == 1 else k.translate(_INVERT))
        return tuple(out)
    return key


def sorted_values(arr: list, spec: Any) -> list | None:
    """``arr`` sorted as ``$push``'s ``$sort`` and ``$sortArray`` sort it: by
    raymx's order of whole values (``spec`` 1 or -1), or subdocuments by
    fields (``{field: 1 | -1, ...}``; other elements sort as empty ones).
    None if ``spec`` is neither (the caller says how it is wrong)."""
    if type(spec) is int and spec in (1, -1):
        return sorted(arr, key=encode_key, reverse=spec == -1)
    if not isinstance(spec, dict) or not spec or not all(
            type(v) is int and v in (1, -1) for v in spec.values()):
        return None
    key = sort_key(list(spec.items()))
    return sorted(arr, key=lambda x: key(x if isinstance(x, dict) else {}))


__all__ = ["MISSING", "Bounds", "compile_filter", "extract_bounds", "get_path", "index_keys",
           "matched_element", "reach", "sort_key", "sort_spec", "sorted_values"]
