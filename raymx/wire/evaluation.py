"""Aggregation expressions evaluated against a document (``evaluate``):
field paths, variables (``$$ROOT``, ``$$CURRENT``, ``$$REMOVE``, ``$$NOW`` and
those of ``$let $map $filter $reduce`` or a command's ``let``), literals and
the core operators here; the rest are ``expressions.py``'s, ``dates.py``'s and
``mathops.py``'s.
Values compare in raymx's order (``raymx.storage.keys``), as filters and
sorts do.
"""
from __future__ import annotations

import datetime
import time
from typing import Any

import bson

from raymx.storage import numbers, query
from raymx.storage.types import now
from raymx.storage.keys import encode_key
from raymx.wire import dates, expressions, mathops
from raymx.wire.errors import CommandError

MISSING = query.MISSING
_MORE_OPS = {**expressions.OPS, **dates.OPS, **mathops.OPS}


def _err(msg: str, code: int = 40324) -> CommandError:
    return CommandError(msg, code, "Location%d" % code if code not in (2, 14) else "BadValue")


def _path(doc, path: str) -> Any:
    vals = query.reach(doc, path)
    if len(vals) == 1:
        return vals[0]
    return [v for v in vals if v is not MISSING]


def cluster_time() -> bson.Timestamp:
    """``$$CLUSTER_TIME``: a Timestamp of the member's clock (its seconds)."""
    return bson.Timestamp(int(time.time()), 0)


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
    elif name == "NOW":  # a command binds it once (aggregate.let_of); here, the clock
        return now()
    elif name == "CLUSTER_TIME":
        return cluster_time()
    else:
        raise _err(f"Use of undefined variable: {name}", 17276)
    if not rest:
        return base
    return _path(base, rest) if isinstance(base, (dict, list)) else MISSING


def _num(v, op: str, allow_dates: bool = False):
    if v is None or v is MISSING:
        return None
    if not numbers.is_number(v) and not (allow_dates and isinstance(v, datetime.datetime)):
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
    """``$add $multiply $subtract $divide $mod`` over ints, doubles and
    Decimal128 (``numbers``); ``$add`` takes one date and adds milliseconds
    to it, ``$subtract`` takes milliseconds from a date or gives the
    milliseconds between two, as MongoDB's."""
    vals = [_num(v, op, op in ("$add", "$subtract")) for v in vals]
    if any(v is None for v in vals):
        return None
    if op == "$add":
        when = [v for v in vals if isinstance(v, datetime.datetime)]
        if len(when) > 1:
            raise _err("only one date allowed in an $add expression", 16612)
        out = numbers.total(vals)
        return when[0] + datetime.timedelta(milliseconds=round(numbers.as_float(out))) \
            if when else out
    if op == "$multiply":
        out = 1
        for v in vals:
            out = numbers.combine("mul", out, v)
        return out
    a, b = vals
    if op == "$subtract":
        if isinstance(a, datetime.datetime):
            if isinstance(b, datetime.datetime):
                return (a - b) // datetime.timedelta(milliseconds=1)
            return a - datetime.timedelta(milliseconds=round(numbers.as_float(b)))
        if isinstance(b, datetime.datetime):
            raise _err("can't $subtract a date from a number", 16556)
        return numbers.combine("sub", a, b)
    if b == 0:
        raise _err(f"can't {op[1:]} by zero", 16608)
    return numbers.divide(a, b, op)


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
        if len(vals) < 2:
            raise _err(f"$ifNull needs at least two arguments, had: {len(vals)}", 1257300)
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
    fn = _MORE_OPS.get(op)
    if fn is None:
        if op == "$function":
            raise _err("$function (server-side JavaScript) is not supported by raymx: write "
                       "the computation with aggregation expressions", 31264)
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
    if isinstance(e, list):  # an array literal: a missing element is null, as MongoDB's
        return [None if v is MISSING else v
                for v in (evaluate(x, doc, root, variables) for x in e)]
    return e


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
