"""Aggregation expressions of arithmetic beyond the four operations (one-number
functions, rounding, powers and logarithms), trigonometry, bits and three-way
comparison (``fn(arg, ev)``, as in ``expressions.py``, whose argument helpers
they use). ints, doubles and Decimal128 as ``raymx.storage.numbers`` types them.
"""
from __future__ import annotations

import decimal
import functools
import math
import operator
from typing import Any, Callable

from bson.decimal128 import Decimal128

from raymx.storage import numbers
from raymx.storage.numbers import is_int, widened
from raymx.wire.expressions import _err, _list, _n, _named, _null, _number


# --- math --------------------------------------------------------------------
def _unary_math(fn: Callable[[float], Any], dec: Callable[[decimal.Decimal], Any] | None = None,
                domain=None):
    """A one-number expression: ``fn`` over an int or a double (an int's
    result keeps its width), ``dec`` over a Decimal128's value (without one,
    ``fn`` over it as a double); a Decimal128's result is a Decimal128, as
    MongoDB's. ``domain`` refuses what is outside it (a NaN passes through,
    as MongoDB's)."""
    def op(x, ev, name=""):
        (v,) = _n(name, x, ev, 1)
        if _null(v):
            return None
        d = v.to_decimal() if type(v) is Decimal128 else None
        if d is None:
            v = _number(v, name)
        w = d if d is not None else v
        if domain is not None and w == w and not domain(w):
            raise _err(f"{name}'s argument is out of its domain: {v!r}", 28766)
        if d is not None:
            out = dec(d) if dec is not None else decimal.Decimal(repr(fn(float(d))))
            return Decimal128(numbers.DEC.create_decimal(out))
        try:
            out = fn(v)
        except OverflowError:
            out = math.inf
        return numbers.widened(out, v)
    return op


def _integral(fn: Callable[[float], int]) -> Callable[[Any], Any]:
    """``$ceil``/``$floor``: an integer stays as it is, a double stays a
    double (an infinity or a NaN too)."""
    return lambda v: v if numbers.is_int(v) or not math.isfinite(v) else float(fn(v))


def _decimal_integral(rounding: str) -> Callable[[decimal.Decimal], decimal.Decimal]:
    return lambda d: d.to_integral_value(rounding=rounding, context=numbers.DEC)


def _round(x, ev, name="$round"):
    vals = _n(name, x, ev, 1, 2)
    v, place = vals[0], (vals[1] if len(vals) > 1 else 0)
    if _null(v) or _null(place):
        return None
    if type(v) is not Decimal128:
        v = _number(v, name)
    if isinstance(place, bool) or not isinstance(place, int) or not -20 < place < 100:
        raise _err(f"{name}'s place must be an integer between -20 and 100", 51083)
    if type(v) is Decimal128:
        d = v.to_decimal()
        if not d.is_finite():
            return v
        how = decimal.ROUND_DOWN if name == "$trunc" else decimal.ROUND_HALF_EVEN
        return Decimal128(d.quantize(decimal.Decimal(1).scaleb(-place), rounding=how,
                                     context=numbers.DEC))
    if name == "$trunc":
        f = 10 ** place
        out = math.trunc(v * f) / f if place > 0 else math.trunc(v / 10 ** -place) * 10 ** -place
    else:
        out = round(v, place)  # half to even, as MongoDB
    return numbers.widened(int(out), v) if isinstance(v, int) else float(out)


def _pow(x, ev, name="$pow"):
    a, b = _n(name, x, ev, 2)
    if _null(a) or _null(b):
        return None
    a, b = _number(a, name), _number(b, name)
    if a == 0 and b < 0:
        raise _err("$pow cannot take a base of 0 and a negative exponent", 28764)
    if numbers.is_int(a) and numbers.is_int(b) and b > 0 and abs(a) > 1 \
            and b * math.log2(abs(a)) >= 63:
        a = float(a)  # past a long: a double, as MongoDB's (never a huge exact int)
    try:
        out = a ** b
    except OverflowError:  # a double past its range: infinite, signed as the result
        odd = numbers.is_int(b) or (isinstance(b, float) and b.is_integer())
        return -math.inf if a < 0 and odd and int(b) % 2 else math.inf
    return out if isinstance(out, (int, float)) else float("nan")


def _log(x, ev, name="$log"):
    a, b = _n(name, x, ev, 2)
    if _null(a) or _null(b):
        return None
    a, b = _number(a, name), _number(b, name)
    if a <= 0 or b <= 0 or b == 1:
        raise _err("$log's argument must be positive and its base positive and not 1", 28758)
    return math.log(a, b)




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
    "$abs": _unary_math(abs, abs),
    "$ceil": _unary_math(_integral(math.ceil), _decimal_integral(decimal.ROUND_CEILING)),
    "$floor": _unary_math(_integral(math.floor), _decimal_integral(decimal.ROUND_FLOOR)),
    "$sqrt": _unary_math(math.sqrt, numbers.DEC.sqrt, domain=lambda v: v >= 0),
    "$exp": _unary_math(math.exp, numbers.DEC.exp),
    "$ln": _unary_math(math.log, numbers.DEC.ln, domain=lambda v: v > 0),
    "$log10": _unary_math(math.log10, numbers.DEC.log10, domain=lambda v: v > 0),
    "$round": _round, "$trunc": _round, "$pow": _pow, "$log": _log,
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
