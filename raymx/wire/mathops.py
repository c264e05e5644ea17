"""Aggregation expressions of trigonometry, bits and three-way comparison
(``fn(arg, ev)``, as in ``expressions.py``, whose argument helpers they use).
"""
from __future__ import annotations

import functools
import math
import operator
from typing import Any, Callable

from raymx.storage.numbers import is_int, widened
from raymx.wire.expressions import _err, _list, _n, _named, _null, _number, _unary_math


def _atan2(x, ev, name="$atan2"):
    y, x_ = _n(name, x, ev, 2)
    if _null(y) or _null(x_):
        return None
    return math.atan2(_number(y, name), _number(x_, name))


def _cmp3(x, ev, name="$cmp"):
    from raymx.wire.evaluation import _cmp
    a, b = _n(name, x, ev, 2)
    return _cmp(a, b)


_BITS = {"$bitAnd": operator.and_, "$bitOr": operator.or_, "$bitXor": operator.xor}


def _bits(x, ev, name="$bitAnd"):
    vals = _n(name, x, ev, 1, 1) if name == "$bitNot" else [ev(a) for a in _list(x)]
    if any(_null(v) for v in vals):
        return None
    if not all(map(is_int, vals)):
        raise _err(f"{name} only supports int and long operands", 28766)
    if name == "$bitNot":
        return widened(~int(vals[0]), vals[0])
    return widened(functools.reduce(_BITS[name], map(int, vals), -1 if name == "$bitAnd" else 0),
                   *vals)


OPS: dict[str, Callable[[Any, Callable], Any]] = {}
for _name, _fn in {
    "$cmp": _cmp3, "$atan2": _atan2,
    "$bitAnd": _bits, "$bitOr": _bits, "$bitXor": _bits, "$bitNot": _bits,
    **{f"${n}": _unary_math(getattr(math, n)) for n in ("sin", "cos", "tan", "atan", "sinh",
                                                       "cosh", "tanh", "asinh")},
    **{f"${n}": _unary_math(getattr(math, n), domain=lambda v: -1 <= v <= 1) for n in ("asin",
                                                                                "acos")},
    "$acosh": _unary_math(math.acosh, domain=lambda v: v >= 1),
    "$atanh": _unary_math(math.atanh, domain=lambda v: -1 < v < 1),
    "$degreesToRadians": _unary_math(math.radians),
    "$radiansToDegrees": _unary_math(math.degrees),
}.items():
    OPS[_name] = _named(_fn, _name)
