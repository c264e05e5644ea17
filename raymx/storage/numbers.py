"""Arithmetic over stored numbers as MongoDB does it (pure): ints, floats and
Decimal128 together. A Decimal128 on either side makes the result a
Decimal128 (34 digits, BSON's precision, half to even); an int result past
64 bits becomes a double, as MongoDB's long overflows into a double. Shared
by the update operators (``$inc``, ``$mul``) and the aggregation
expressions and accumulators (``$add``, ``$sum``, ``$avg``...).
"""
from __future__ import annotations

import decimal
import math
import operator

from bson import Decimal128, Int64

DEC = decimal.Context(prec=34, Emin=-6143, Emax=6144, rounding=decimal.ROUND_HALF_EVEN)
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 63) - 1
_OPS = {"add": (operator.add, DEC.add), "sub": (operator.sub, DEC.subtract),
        "mul": (operator.mul, DEC.multiply)}


def is_number(v) -> bool:
    t = type(v)
    return t is int or t is float or t is Decimal128 or t is Int64


def is_int(v) -> bool:
    """An integer value (a bool is not): an int or a ``bson.Int64``."""
    t = type(v)
    return t is int or t is Int64


def whole(v) -> bool:
    """An integer, or a double with no fraction (not NaN or infinite): what
    MongoDB takes where it wants a count (a limit, a skip, seconds)."""
    return is_int(v) or (type(v) is float and v.is_integer())


def widened(out, *args):
    """An integer result ``out`` of ``args`` as MongoDB types it: a long
    (``Int64``) when one of them was a long (a plain int's width follows
    its value). Anything else as it is."""
    if type(out) is int and any(type(a) is Int64 for a in args):
        return Int64(out)
    return out


def as_decimal(v) -> decimal.Decimal:
    """A number as a ``decimal.Decimal`` (a double by its shortest repr)."""
    if type(v) is Decimal128:
        return v.to_decimal()
    return decimal.Decimal(repr(v)) if type(v) is float else decimal.Decimal(v)


def _int_or_double(v):
    return v if type(v) is not int or _INT_MIN <= v <= _INT_MAX else float(v)


def combine(op: str, a, b):
    """``a`` op ``b`` for ``op`` in add, sub, mul (numbers, checked by the caller)."""
    native, dec = _OPS[op]
    if type(a) is Decimal128 or type(b) is Decimal128:
        return Decimal128(dec(as_decimal(a), as_decimal(b)))
    return widened(_int_or_double(native(a, b)), a, b)


def divide(a, b, op: str = "$divide"):
    """``a / b`` (a double, or a Decimal128) or, for ``$mod``, the remainder
    with the dividend's sign; the caller refuses a zero divisor."""
    if type(a) is Decimal128 or type(b) is Decimal128:
        x, y = as_decimal(a), as_decimal(b)
        return Decimal128(DEC.divide(x, y) if op == "$divide" else DEC.remainder(x, y))
    if op == "$divide":
        return a / b
    if is_int(a) and is_int(b):
        r = abs(a) % abs(b)
        return widened(-r if a < 0 else r, a, b)
    return math.fmod(a, b)


def total(values):
    """The sum of the numbers among ``values`` (others are skipped, as
    ``$sum`` skips them): 0 when there are none."""
    out = 0
    for v in values:
        if is_number(v):
            out = combine("add", out, v)
    return out


def mean(values):
    """The average of the numbers among ``values`` (a double, or a
    Decimal128 if one of them is), None if there are none."""
    nums = [v for v in values if is_number(v)]
    return divide(total(nums), len(nums)) if nums else None


def as_float(v) -> float:
    return float(v.to_decimal()) if type(v) is Decimal128 else float(v)
