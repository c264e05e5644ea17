"""Aggregation expressions beyond the core ones in ``aggregate.py``: math,
strings, type conversions, arrays (with ``$map``/``$filter``/``$reduce``
and their variables), objects, ``$switch``/``$let`` and dates, as MongoDB
computes them. Pure code over decoded documents.

Each operator is ``fn(arg, ev)``: ``arg`` is its unevaluated argument and
``ev(expr, more_vars=None)`` evaluates an expression against the current
document, with ``more_vars`` (``$$name``) added for ``$map``, ``$filter``,
``$reduce`` and ``$let``. The date operators are in ``dates.py``.
"""
from __future__ import annotations

import datetime
import math
import random
import re
from typing import Any, Callable

import bson
from bson.decimal128 import Decimal128
from bson.int64 import Int64

from raymx.storage import numbers, query
from raymx.wire.errors import CommandError

MISSING = query.MISSING
EPOCH = datetime.datetime(1970, 1, 1)
_INT32 = (-(1 << 31), (1 << 31) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _err(msg: str, code: int) -> CommandError:
    return CommandError(msg, code, "Location%d" % code)


def _conversion(msg: str) -> CommandError:
    return CommandError(msg, 241, "ConversionFailure")


def _null(v) -> bool:
    return v is None or v is MISSING


def _list(x) -> list:
    return x if isinstance(x, list) else [x]


def _n(op: str, x, ev, lo: int, hi: int | None = None) -> list:
    args = _list(x)
    hi = lo if hi is None else hi
    if not lo <= len(args) <= hi:
        want = lo if lo == hi else f"{lo} to {hi}"
        raise _err(f"Expression {op} takes {want} arguments, {len(args)} were passed in", 16020)
    return [ev(a) for a in args]


def _fields(op: str, x, required: tuple, optional: tuple = ()) -> dict:
    if not isinstance(x, dict):
        raise _err(f"{op} expects an object of named arguments", 40515)
    extra = set(x) - set(required) - set(optional)
    if extra:
        raise _err(f"{op} found an unknown argument: {sorted(extra)[0]}", 40515)
    missing = [k for k in required if k not in x]
    if missing:
        raise _err(f"{op} requires '{missing[0]}'", 40516)
    return x


def _number(v, op: str):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _err(f"{op} only supports numeric types, not {_type(v)}", 28765)
    return v


# --- strings -----------------------------------------------------------------
def _string(v, op: str) -> str:
    if _null(v):
        return ""
    if not isinstance(v, str):
        raise _err(f"{op} requires a string, not {_type(v)}", 16702)
    return v


def _int_arg(v, op: str, what: str) -> int:
    if not numbers.whole(v):
        raise _err(f"{op}'s {what} must be an integer, not {v!r:.40}", 34448)
    return int(v)


def _substr(x, ev, name="$substrCP"):
    s, start, n = _n(name, x, ev, 3)
    start, n = _int_arg(start, name, "start"), _int_arg(n, name, "length")
    if name == "$substrBytes":
        b = _string(s, name).encode()
        start = max(start, 0)
        end = len(b) if n < 0 else min(start + n, len(b))
        if start < len(b) and b[start] & 0xC0 == 0x80:
            raise _err("$substrBytes: Invalid range, starting index is a UTF-8 continuation "
                       "byte.", 28656)
        if start < end < len(b) and b[end] & 0xC0 == 0x80:
            raise _err("$substrBytes: Invalid range, ending index is in the middle of a "
                       "UTF-8 character.", 28657)
        return b[start:end].decode()
    s = _string(s, name) if not isinstance(s, (int, float)) else _to_string(s)
    if start < 0:
        return ""
    return s[start:] if n < 0 else s[start:start + n]


def _str_len(x, ev, name="$strLenCP"):
    (s,) = _n(name, x, ev, 1)
    if not isinstance(s, str):
        raise _err(f"{name} requires a string, not {_type(s)}", 34471)
    return len(s.encode()) if name == "$strLenBytes" else len(s)


def _split(x, ev, name="$split"):
    s, sep = _n(name, x, ev, 2)
    if _null(s) or _null(sep):
        return None
    if not isinstance(s, str) or not isinstance(sep, str):
        raise _err("$split requires a string and a string delimiter", 40085)
    if not sep:
        raise _err("$split requires a non-empty separator", 40087)
    return s.split(sep)


def _trim(x, ev, name="$trim"):
    a = _fields(name, x, ("input",), ("chars",))
    s, chars = ev(a["input"]), ev(a["chars"]) if "chars" in a else None
    if _null(s):
        return None
    s = _string(s, name)
    if chars is not None and not isinstance(chars, str):
        raise _err(f"{name}'s chars must be a string", 50699)
    fn = {"$trim": str.strip, "$ltrim": str.lstrip, "$rtrim": str.rstrip}[name]
    return fn(s, chars) if chars is not None else fn(s)


def _strcasecmp(x, ev, name="$strcasecmp"):
    a, b = (_string(v, name).lower() for v in _n(name, x, ev, 2))
    return (a > b) - (a < b)


def _index_of(x, ev, name="$indexOfCP"):
    vals = _n(name, x, ev, 2, 4)
    s, sub = vals[0], vals[1]
    if _null(s):
        return None
    start = _int_arg(vals[2], name, "start") if len(vals) > 2 else 0
    end = _int_arg(vals[3], name, "end") if len(vals) > 3 else None
    if name == "$indexOfArray":
        if not isinstance(s, list):
            raise _err("$indexOfArray requires an array as its first argument", 40090)
        from raymx.wire.evaluation import _cmp
        hit = [i for i, v in enumerate(s[:end]) if i >= start and _cmp(v, sub) == 0]
        return hit[0] if hit else -1
    if not isinstance(s, str) or not isinstance(sub, str):
        raise _err(f"{name} requires strings", 40091)
    if name == "$indexOfBytes":
        b = s.encode()
        return b.find(sub.encode(), start, end if end is not None else len(b))
    return s.find(sub, start, end if end is not None else len(s))


def _replace(x, ev, name="$replaceAll"):
    a = _fields(name, x, ("input", "find", "replacement"))
    s, f, r = ev(a["input"]), ev(a["find"]), ev(a["replacement"])
    if _null(s) or _null(f) or _null(r):
        return None
    if not all(isinstance(v, str) for v in (s, f, r)):
        raise _err(f"{name} requires strings", 51746)
    return s.replace(f, r) if name == "$replaceAll" else s.replace(f, r, 1)


def _regex(x, ev, name="$regexMatch"):
    a = _fields(name, x, ("input", "regex"), ("options",))
    s, rx, opts = ev(a["input"]), ev(a["regex"]), ev(a["options"]) if "options" in a else ""
    if isinstance(rx, bson.regex.Regex):
        rx, opts = rx.pattern, (opts or "") + (rx.flags if isinstance(rx.flags, str) else "")
    elif isinstance(rx, re.Pattern):
        rx = rx.pattern
    if _null(rx) or not isinstance(rx, str):
        raise _err(f"{name} needs a regex string", 51105)
    flags = 0
    for o in opts or "":
        flags |= {"i": re.I, "m": re.M, "s": re.S, "x": re.X}.get(o, 0)
    if _null(s):
        return {"$regexMatch": False, "$regexFindAll": []}.get(name)
    if not isinstance(s, str):
        raise _err(f"{name} needs a string input", 51104)
    if name == "$regexFindAll":
        return [_found(m) for m in re.finditer(rx, s, flags)]
    m = re.search(rx, s, flags)
    if name == "$regexMatch":
        return m is not None
    return None if m is None else _found(m)


def _found(m: re.Match) -> dict:
    return {"match": m.group(0), "idx": m.start(), "captures": list(m.groups())}


# --- types and conversions ---------------------------------------------------
def _type(v) -> str:
    """``$type``'s name of ``v``'s BSON type: the query engine's (``$type`` in
    filters)."""
    if v is MISSING:
        return "missing"
    return query.type_name(v) or type(v).__name__


def _ms(d: datetime.datetime) -> int:
    return (d - EPOCH) // datetime.timedelta(milliseconds=1)


def _date_of_ms(ms: int) -> datetime.datetime:
    return EPOCH + datetime.timedelta(milliseconds=ms)


def _iso(d: datetime.datetime) -> str:
    return d.strftime("%Y-%m-%dT%H:%M:%S.") + f"{d.microsecond // 1000:03d}Z"


def _to_string(v):
    if _null(v):
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return v
    if isinstance(v, int):
        return str(int(v))
    if isinstance(v, float):
        if v.is_integer() and abs(v) < 1e15:
            return str(int(v))
        return repr(v)
    if isinstance(v, datetime.datetime):
        return _iso(v)
    if isinstance(v, (bson.ObjectId, Decimal128)):
        return str(v)
    raise _conversion(f"Unsupported conversion from {_type(v)} to string")


def _to_int(v, kind: str = "int"):
    if _null(v):
        return None
    lo, hi = _INT32 if kind == "int" else _INT64
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, datetime.datetime) and kind == "long":
        return _ms(v)
    if isinstance(v, int):
        out = int(v)
    elif isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            raise _conversion(f"Attempt to convert NaN or infinity to {kind}")
        out = math.trunc(v)
    elif isinstance(v, Decimal128):
        return _to_int(float(v.to_decimal()), kind)
    elif isinstance(v, str):
        if not re.fullmatch(r"[+-]?\d+", v.strip()):
            raise _conversion(f"Failed to parse number '{v}' in $convert with no onError "
                              "value: Did not consume whole string.")
        out = int(v)
    else:
        raise _conversion(f"Unsupported conversion from {_type(v)} to {kind}")
    if not lo <= out <= hi:
        raise _conversion(f"Conversion would overflow target type in $convert with no "
                          f"onError value: {v!r:.40}")
    return Int64(out) if kind == "long" else out


def _to_double(v):
    if _null(v):
        return None
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, datetime.datetime):
        return float(_ms(v))
    if isinstance(v, Decimal128):
        return float(v.to_decimal())
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            raise _conversion(f"Failed to parse number '{v}' in $convert with no onError "
                              "value") from None
    raise _conversion(f"Unsupported conversion from {_type(v)} to double")


def _to_decimal(v):
    if _null(v):
        return None
    if isinstance(v, Decimal128):
        return v
    try:
        return Decimal128(str(_to_double(v) if not isinstance(v, (int, str)) or
                              isinstance(v, bool) else v))
    except Exception as e:  # noqa: BLE001 (the reason goes into the answer)
        raise _conversion(f"Failed to convert {v!r:.40} to decimal: {e}") from None


def _to_bool(v):
    if _null(v):
        return None
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return v != 0
    if isinstance(v, Decimal128):
        return v.to_decimal() != 0
    return True


def _to_date(v):
    if _null(v):
        return None
    if isinstance(v, datetime.datetime):
        return v
    if isinstance(v, bool):
        raise _conversion("Unsupported conversion from bool to date")
    if isinstance(v, (int, float)):
        return _date_of_ms(int(v))
    if isinstance(v, bson.ObjectId):
        return v.generation_time.replace(tzinfo=None)
    if isinstance(v, str):
        from raymx.wire.dates import parse_date  # it builds on this module's helpers
        return parse_date(v, None, None)
    raise _conversion(f"Unsupported conversion from {_type(v)} to date")


def _to_object_id(v):
    if _null(v):
        return None
    if isinstance(v, bson.ObjectId):
        return v
    if isinstance(v, str) and bson.ObjectId.is_valid(v) and len(v) == 24:
        return bson.ObjectId(v)
    raise _conversion(f"Failed to parse objectId '{v!r:.40}' in $convert with no onError value")


_CONVERT = {
    "double": _to_double, 1: _to_double, "string": _to_string, 2: _to_string,
    "objectId": _to_object_id, 7: _to_object_id, "bool": _to_bool, 8: _to_bool,
    "date": _to_date, 9: _to_date, "int": _to_int, 16: _to_int,
    "long": lambda v: _to_int(v, "long"), 18: lambda v: _to_int(v, "long"),
    "decimal": _to_decimal, 19: _to_decimal,
}


def _converter(fn):
    def op(x, ev, name=""):
        (v,) = _n(name, x, ev, 1)
        return fn(v)
    return op


def _convert(x, ev, name="$convert"):
    a = _fields(name, x, ("input", "to"), ("onError", "onNull", "format", "base"))
    to = ev(a["to"])
    fn = _CONVERT.get(to)
    if fn is None:
        raise _err(f"$convert: unknown or unsupported type to convert to: {to!r}", 50865)
    try:
        v = ev(a["input"])
    except CommandError:
        if "onError" in a:
            return ev(a["onError"])
        raise
    if _null(v):
        return ev(a["onNull"]) if "onNull" in a else None
    try:
        return fn(v)
    except CommandError as e:
        if e.code == 241 and "onError" in a:
            return ev(a["onError"])
        raise


def _is_number(x, ev, name="$isNumber"):
    (v,) = _n(name, x, ev, 1)
    return not isinstance(v, bool) and isinstance(v, (int, float, Decimal128))


# --- arrays ------------------------------------------------------------------
def _array(v, op: str) -> list:
    if not isinstance(v, list):
        raise _err(f"{op} requires an array, not {_type(v)}", 28651)
    return v


def _var_name(a: dict, default: str, op: str) -> str:
    name = a.get("as", default)
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][A-Za-z0-9_]*", name):
        raise _err(f"{op}: {name!r} is not a valid variable name", 16867)
    return name


def _map(x, ev, name="$map"):
    a = _fields(name, x, ("input", "in"), ("as",))
    arr, var = ev(a["input"]), _var_name(a, "this", name)
    if _null(arr):
        return None
    return [ev(a["in"], {var: v}) for v in _array(arr, name)]


def _filter(x, ev, name="$filter"):
    from raymx.wire.evaluation import _truthy
    a = _fields(name, x, ("input", "cond"), ("as", "limit"))
    arr, var = ev(a["input"]), _var_name(a, "this", name)
    if _null(arr):
        return None
    limit = ev(a["limit"]) if "limit" in a else None
    if limit is not None:
        limit = _int_arg(limit, name, "limit")
        if limit < 1:
            raise _err("$filter's limit must be positive", 327)
    out = []
    for v in _array(arr, name):
        if _truthy(ev(a["cond"], {var: v})):
            out.append(v)
            if limit is not None and len(out) >= limit:
                break
    return out


def _reduce(x, ev, name="$reduce"):
    a = _fields(name, x, ("input", "initialValue", "in"))
    arr = ev(a["input"])
    if _null(arr):
        return None
    acc = ev(a["initialValue"])
    for v in _array(arr, name):
        acc = ev(a["in"], {"value": acc, "this": v})
    return acc


def _concat_arrays(x, ev, name="$concatArrays"):
    vals = [ev(a) for a in _list(x)]
    if any(_null(v) for v in vals):
        return None
    return [e for v in vals for e in _array(v, name)]


def _slice(x, ev, name="$slice"):
    vals = _n(name, x, ev, 2, 3)
    arr = vals[0]
    if _null(arr):
        return None
    arr = _array(arr, name)
    if len(vals) == 2:
        n = _int_arg(vals[1], name, "count")
        return arr[:n] if n >= 0 else arr[n:]
    pos, n = _int_arg(vals[1], name, "position"), _int_arg(vals[2], name, "count")
    if n <= 0:
        raise _err("$slice's count must be positive", 28729)
    start = pos if pos >= 0 else max(len(arr) + pos, 0)
    return arr[start:start + n]


def _range(x, ev, name="$range"):
    vals = _n(name, x, ev, 2, 3)
    start, end = _int_arg(vals[0], name, "start"), _int_arg(vals[1], name, "end")
    step = _int_arg(vals[2], name, "step") if len(vals) > 2 else 1
    if step == 0:
        raise _err("$range requires a non-zero step value", 34449)
    out = range(start, end, step)
    if len(out) > RANGE_MAX:  # as MongoDB's 64 MiB bound: refused, not built
        raise CommandError(f"$range would make {len(out)} values, over the limit of "
                           f"{RANGE_MAX} (it is built in memory)", 146, "ExceededMemoryLimit")
    return list(out)


RANGE_MAX = 1 << 22  # values of one $range (MongoDB bounds its bytes at 64 MiB)


def _array_end(x, ev, name="$first"):
    (v,) = _n(name, x, ev, 1)
    if _null(v):
        return None
    v = _array(v, name)
    if not v:
        return MISSING
    return v[0] if name == "$first" else v[-1]


def _reverse(x, ev, name="$reverseArray"):
    (v,) = _n(name, x, ev, 1)
    return None if _null(v) else list(reversed(_array(v, name)))


def _sort_array(x, ev, name="$sortArray"):
    """An array's elements sorted: whole values (``sortBy`` 1 or -1, in
    raymx's documented order) or documents by fields (a sort document)."""
    a = _fields(name, x, ("input", "sortBy"))
    v, by = ev(a["input"]), a["sortBy"]
    if _null(v):
        return None
    out = query.sorted_values(_array(v, name), by)
    if out is None:
        raise _err("$sortArray's sortBy must be 1, -1 or a sort document of fields", 2942505)
    return out


def _is_array(x, ev, name="$isArray"):
    (v,) = _n(name, x, ev, 1)
    return isinstance(v, list)


def _numbers_of(x, ev, name: str) -> list:
    """``$sum``/``$avg``/``$min``/``$max`` as expressions: over one array
    argument's elements, or over several arguments."""
    vals = [ev(a) for a in _list(x)]
    if len(vals) == 1 and isinstance(vals[0], list):
        vals = vals[0]
    return vals


def _sum(x, ev, name="$sum"):
    vals = _numbers_of(x, ev, name)
    return numbers.total(vals) if name == "$sum" else numbers.mean(vals)


def _extreme(x, ev, name="$max"):
    from raymx.wire.evaluation import _cmp
    vals = [v for v in _numbers_of(x, ev, name) if not _null(v)]
    if not vals:
        return None
    best = vals[0]
    for v in vals[1:]:
        if (_cmp(v, best) > 0) == (name == "$max") and _cmp(v, best) != 0:
            best = v
    return best


def _all_any(x, ev, name="$allElementsTrue"):
    from raymx.wire.evaluation import _truthy
    (v,) = _n(name, x, ev, 1)
    v = _array(v, name)
    return all(map(_truthy, v)) if name == "$allElementsTrue" else any(map(_truthy, v))


def _sets(x, ev, name="$setUnion"):
    from raymx.storage.keys import encode_key
    vals = [ev(a) for a in _list(x)]
    if any(_null(v) for v in vals):
        return None
    keyed = [{encode_key(e): e for e in _array(v, name)} for v in vals]
    if name == "$setUnion":
        out: dict = {}
        for k in keyed:
            out.update(k)
        return list(out.values())
    if name == "$setIntersection":
        first = keyed[0] if keyed else {}
        return [v for k, v in first.items() if all(k in o for o in keyed[1:])]
    if len(keyed) != 2:
        raise _err(f"{name} takes exactly 2 arguments", 17048)
    a, b = keyed
    if name == "$setDifference":
        return [v for k, v in a.items() if k not in b]
    if name == "$setIsSubset":
        return set(a) <= set(b)
    return set(a) == set(b)  # $setEquals


# --- objects -----------------------------------------------------------------
def _merge_objects(x, ev, name="$mergeObjects"):
    out: dict = {}
    for v in (ev(a) for a in _list(x)):
        if _null(v):
            continue
        if not isinstance(v, dict):
            raise _err(f"$mergeObjects requires object inputs, but input {v!r:.40} is of "
                       f"type {_type(v)}", 40400)
        out.update(v)
    return out


def _object_to_array(x, ev, name="$objectToArray"):
    (v,) = _n(name, x, ev, 1)
    if _null(v):
        return None
    if not isinstance(v, dict):
        raise _err(f"$objectToArray requires a document input, found: {_type(v)}", 40390)
    return [{"k": k, "v": val} for k, val in v.items()]


def _array_to_object(x, ev, name="$arrayToObject"):
    (v,) = _n(name, x, ev, 1)
    if _null(v):
        return None
    out = {}
    for e in _array(v, name):
        if isinstance(e, dict) and set(e) == {"k", "v"} and isinstance(e["k"], str):
            out[e["k"]] = e["v"]
        elif isinstance(e, list) and len(e) == 2 and isinstance(e[0], str):
            out[e[0]] = e[1]
        else:
            raise _err("$arrayToObject requires an array of [k, v] pairs or {k, v} "
                       "documents with string keys", 40392)
    return out


def _get_field(x, ev, name="$getField"):
    a = x if isinstance(x, dict) else {"field": x}
    a = _fields(name, a, ("field",), ("input",))
    field = ev(a["field"])
    if not isinstance(field, str):
        raise _err("$getField requires 'field' to evaluate to a string", 3041704)
    src = ev(a["input"]) if "input" in a else ev("$$CURRENT")
    if _null(src):
        return None
    if not isinstance(src, dict):
        return MISSING
    return src.get(field, MISSING)


def _set_field(x, ev, name="$setField"):
    """``$setField``/``$unsetField``: a copy of ``input`` with ``field`` (a
    name, taken whole: dots and dollars included) set to ``value``, or
    removed (``$$REMOVE``, or ``$unsetField``)."""
    named = ("field", "input", "value") if name == "$setField" else ("field", "input")
    a = _fields(name, x, named)
    field = a["field"]
    if isinstance(field, str) and field.startswith("$"):
        raise _err(f"{name}: 'field' {field!r} is a field path, not allowed here; for a "
                   f"name with a '$', write {{$literal: {field!r}}}", 4161108)
    if isinstance(field, dict) and set(field) == {"$literal"}:
        field = field["$literal"]
    if not isinstance(field, str):
        raise _err(f"{name} requires 'field' to be a string constant", 4161106)
    src = ev(a["input"])
    if _null(src):
        return None
    if not isinstance(src, dict):
        raise _err(f"{name} requires 'input' to evaluate to an object", 4161105)
    out = dict(src)
    value = ev(a["value"]) if name == "$setField" else MISSING
    if value is MISSING:
        out.pop(field, None)
    else:
        out[field] = value
    return out


def _binary_size(x, ev, name="$binarySize"):
    """``$binarySize`` (a string's UTF-8 bytes, a binary's) and ``$bsonSize``
    (an object's BSON bytes); null for null."""
    (v,) = _n(name, x, ev, 1)
    if _null(v):
        return None
    if name == "$bsonSize":
        if not isinstance(v, dict):
            raise _err(f"$bsonSize requires a document input, found: {_type(v)}", 31393)
        return len(bson.encode(v))
    if isinstance(v, str):
        return len(v.encode())
    if isinstance(v, (bytes, bson.Binary)):
        return len(v)
    raise _err(f"$binarySize requires a string or BinData argument, found: {_type(v)}", 51276)


def _percentile(x, ev, name="$percentile"):
    """``$percentile``/``$median`` of an array's numbers (or of one number)."""
    from raymx.wire.grouping import _percentile_args, percentiles
    if not isinstance(x, dict) or "input" not in x:
        raise _err(f"{name} needs input and method", 7436100)
    v = {k: ev(e) for k, e in x.items()}
    ps, method = _percentile_args(name, v)
    arr = v["input"]
    got = percentiles(arr if isinstance(arr, list) else [arr], ps, method)
    return got if got is None or name == "$percentile" else got[0]


# --- control -----------------------------------------------------------------
def _switch(x, ev, name="$switch"):
    from raymx.wire.evaluation import _truthy
    a = _fields(name, x, ("branches",), ("default",))
    if not isinstance(a["branches"], list):
        raise _err("$switch expected an array for 'branches'", 40061)
    for b in a["branches"]:
        if not isinstance(b, dict) or set(b) != {"case", "then"}:
            raise _err("$switch requires each branch to have exactly 'case' and 'then'", 40064)
        if _truthy(ev(b["case"])):
            return ev(b["then"])
    if "default" not in a:
        raise _err("$switch could not find a matching branch for an input, and no default "
                   "was specified.", 40066)
    return ev(a["default"])


def _let(x, ev, name="$let"):
    a = _fields(name, x, ("vars", "in"))
    if not isinstance(a["vars"], dict):
        raise _err("invalid parameter: expected an object (vars)", 10065)
    more = {}
    for k, e in a["vars"].items():
        _var_name({"as": k}, k, name)
        more[k] = ev(e)
    return ev(a["in"], more)


def _rand(x, ev, name="$rand"):
    if x != {}:
        raise _err("$rand takes no arguments ({})", 3040501)
    return random.random()


def _zip(x, ev, name="$zip"):
    a = _fields(name, x, ("inputs",), ("useLongestLength", "defaults"))
    arrays = [ev(e) for e in _list(a["inputs"])]
    if any(_null(v) for v in arrays):
        return None
    arrays = [_array(v, name) for v in arrays]
    longest = bool(ev(a["useLongestLength"])) if "useLongestLength" in a else False
    defaults = _array(ev(a["defaults"]), name) if "defaults" in a else None
    if defaults is not None and (not longest or len(defaults) != len(arrays)):
        raise _err(f"{name}: defaults need useLongestLength and one value per input", 34466)
    n = max(map(len, arrays), default=0) if longest else min(map(len, arrays), default=0)
    pad = defaults or [None] * len(arrays)
    return [[arr[i] if i < len(arr) else pad[j] for j, arr in enumerate(arrays)]
            for i in range(n)]


def _n_of(x, ev, name="$firstN"):
    """``$firstN $lastN $maxN $minN`` over an array: the accumulators' rules."""
    from raymx.wire.grouping import _Acc
    a = _fields(name, x, ("input", "n"))
    arr, n = ev(a["input"]), ev(a["n"])
    if _null(arr):
        return None
    acc = _Acc(name)
    for el in _array(arr, name):
        acc.add({"input": el, "n": n})
    return acc.result()


def _named(fn, name):
    return lambda x, ev: fn(x, ev, name)


OPS: dict[str, Callable[[Any, Callable], Any]] = {}
for _name, _fn in {
    "$substr": _substr, "$substrCP": _substr, "$substrBytes": _substr,
    "$strLenCP": _str_len, "$strLenBytes": _str_len, "$split": _split,
    "$trim": _trim, "$ltrim": _trim, "$rtrim": _trim, "$strcasecmp": _strcasecmp,
    "$indexOfCP": _index_of, "$indexOfArray": _index_of, "$indexOfBytes": _index_of,
    "$setField": _set_field, "$unsetField": _set_field,
    "$binarySize": _binary_size, "$bsonSize": _binary_size,
    "$percentile": _percentile, "$median": _percentile,
    "$replaceOne": _replace, "$replaceAll": _replace,
    "$regexMatch": _regex, "$regexFind": _regex,
    "$toString": _converter(_to_string), "$toInt": _converter(_to_int),
    "$toLong": _converter(lambda v: _to_int(v, "long")), "$toDouble": _converter(_to_double),
    "$toDecimal": _converter(_to_decimal), "$toBool": _converter(_to_bool),
    "$toDate": _converter(_to_date), "$toObjectId": _converter(_to_object_id),
    "$type": _converter(_type), "$convert": _convert, "$isNumber": _is_number,
    "$map": _map, "$filter": _filter, "$reduce": _reduce, "$concatArrays": _concat_arrays,
    "$slice": _slice, "$range": _range, "$first": _array_end, "$last": _array_end,
    "$reverseArray": _reverse, "$isArray": _is_array, "$sortArray": _sort_array,
    "$sum": _sum, "$avg": _sum, "$min": _extreme, "$max": _extreme,
    "$allElementsTrue": _all_any, "$anyElementTrue": _all_any,
    "$setUnion": _sets, "$setIntersection": _sets, "$setDifference": _sets,
    "$setIsSubset": _sets, "$setEquals": _sets,
    "$mergeObjects": _merge_objects, "$objectToArray": _object_to_array,
    "$arrayToObject": _array_to_object, "$getField": _get_field,
    "$switch": _switch, "$let": _let, "$rand": _rand, "$zip": _zip,
    "$regexFindAll": _regex, "$firstN": _n_of, "$lastN": _n_of, "$maxN": _n_of,
    "$minN": _n_of,
}.items():
    OPS[_name] = _named(_fn, _name)
