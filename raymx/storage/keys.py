"""Order-preserving key encoding: the one documented comparison order.

``encode_key(v)`` turns a value into bytes whose byte order is raymx's value
order, so the same function serves primary keys, index keys, ``sort`` and the
comparison operators. The order across types (MongoDB's, minus the types
msgpack lacks):

    MinKey < null/missing < numbers (int, Int64, float and Decimal128
    together) < strings < maps < arrays < binary (every subtype, UUIDs
    too) < ObjectIds < booleans < dates < timestamps < regexes < code
    < MaxKey

Within a type: numbers numerically and exactly (1 == 1.0 == Decimal128("1") ==
Decimal128("1.00"), but Decimal128("0.1") != 0.1, whose double is
0.1000000000000000055511151231257827..., as in MongoDB), strings by UTF-8
bytes, maps field by field in stored order (each field by its value's type,
then its name, then its value, as MongoDB compares objects; a map that is a
prefix of another first), arrays element by element (a prefix sorts first),
binary as MongoDB's BinData (by length, then subtype, then bytes: a UUID is
16 bytes of subtype 4), ObjectIds by their bytes (an ObjectId's start is its
creation time), false < true, dates by their milliseconds since 1970 UTC,
timestamps by time then increment, regexes by pattern then flags, code by
its text.

Every encoding is self-delimiting (strings escape 0x00 and end with 0x00
0x00, binary starts with its length; maps and arrays end with 0x00, below
every type tag), so the
concatenation of several encodings (a compound index key) still sorts field by
field and a prefix scan finds all keys that start with given values.
"""
from __future__ import annotations

import datetime
import itertools
import math
import operator
import re
import struct
import uuid

from bson import Decimal128, ObjectId
from bson.binary import Binary
from bson.code import Code
from bson.datetime_ms import DatetimeMS
from bson.dbref import DBRef
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.regex import Regex
from bson.timestamp import Timestamp

from raymx.storage.errors import InvalidDocument
from raymx.storage.types import BASES, as_map, millis, stored_binary

T_MINKEY = 0x02
T_NULL = 0x05
T_NUM = 0x10
T_STR = 0x20
T_MAP = 0x30
T_ARR = 0x40
T_BIN = 0x50  # every binary subtype (MongoDB's BinData), UUIDs too
T_OID = 0x58
T_BOOL = 0x60
T_DATE = 0x70
T_TS = 0x74
T_RE = 0x78
T_CODE = 0x7C
T_MAXKEY = 0x7F
END = b"\x00"

# Type brackets: comparison operators ($gt, $lt, ...) only match values of the
# same bracket as the operand, as in MongoDB: {"a": {"$gt": 5}} never matches a
# string. The bracket is the first byte of the encoding.
_D = struct.Struct(">d")
_Q = struct.Struct(">Q")
_EXACT = 1 << 53


_NUM_TAG = bytes((T_NUM,))
NAN_KEY = _NUM_TAG + bytes(8)  # every NaN's key (a query's comparisons treat it apart)
_FLIP = (1 << 64) - 1
_TAG_Q = struct.Struct(">BQ")
_TAG_D = struct.Struct(">Bd")
_OID_TAG = bytes((T_OID,))


def _num(v) -> bytes:
    f = float(v)
    if f != f:
        return NAN_KEY  # every NaN is one value, below -inf (as in MongoDB)
    b = _D.pack(f + 0.0)  # + 0.0 folds -0.0 into 0.0
    if b[0] < 0x80:  # positive: set the sign bit
        out = bytes((T_NUM, b[0] | 0x80)) + b[1:]
    else:            # negative: flip every bit
        out = _NUM_TAG + _Q.pack(_Q.unpack(b)[0] ^ _FLIP)
    if _EXACT <= abs(f) < math.inf:
        # Past 2**53 a double skips integers: append the exact distance from the
        # double so distinct large ints never collide in a unique index. Floats
        # there (all integral) get it too, so 2**60 and 2.0**60 encode the same
        # and the length still follows from the first 9 bytes (self-delimiting).
        out += _Q.pack(int(v) - int(f) + (1 << 63))
    return out


# A Decimal128 that no double or integer equals sorts between the two keyed
# numbers around it: the key of the greatest one below it (a double, or in
# [2**53, 2**64) the integer below it), then DEC_MARK, above every byte a value's
# encoding starts with (so above that number followed by anything), then the
# decimal itself (see _decimal_key). A number's key followed by DEC_MARK
# therefore bounds the keys equal to it from above (``value_end``).
DEC_MARK = 0xFF
_H = struct.Struct(">H")
_DEC_BIAS = 0x4000  # adjusted exponents of Decimal128: -6176 .. 6144


def _decimal_key(v: Decimal128) -> bytes:
    x = v.to_decimal()
    if x.is_nan():
        return NAN_KEY
    if x.is_infinite():
        return _num(float(x))
    if x == x.to_integral_value():
        n = int(x)
        if -(1 << 63) <= n < (1 << 64):
            return encode_key(n)
    f = float(x)  # the nearest double (correctly rounded)
    if x == f:    # Decimal and float compare exactly
        return _num(f)
    if _EXACT <= x.copy_abs() and -(1 << 63) <= math.floor(x) < (1 << 64):
        base = encode_key(math.floor(x))  # doubles here are integers: the int below
    else:
        base = _num(f if f < x else math.nextafter(f, -math.inf))
    # x itself, ordered among the decimals of this bucket (all of one sign): the
    # adjusted exponent, then the digits without trailing zeros ("1.20" and
    # "1.2" are one value), ended below every digit; negatives with every byte
    # complemented, so a larger magnitude sorts lower
    sign, digits, exp = x.as_tuple()
    digits = list(digits)
    while digits[-1] == 0:
        digits.pop()
        exp += 1
    tail = _H.pack(exp + len(digits) - 1 + _DEC_BIAS) + bytes(0x30 + d for d in digits) + b"\x00"
    if sign:
        tail = bytes(0xFF - b for b in tail)
    return base + bytes((DEC_MARK,)) + tail


def value_end(k: bytes, vk: bytes) -> bytes | None:
    """The smallest key above every key that is ``k`` (ending with the value
    key ``vk``) followed by more: for a number no decimal extends, ``k`` with
    DEC_MARK (the decimals just above that number stay outside), else
    ``prefix_end(k)``."""
    if vk[0] == T_NUM and (len(vk) == 9 or (len(vk) == 17 and vk[9] != DEC_MARK)):
        return k + bytes((DEC_MARK,))
    return prefix_end(k)


# small integers are most index keys (ages, counts, flags): encode them once
_SMALL_INTS = {i: _num(i) for i in range(-1024, 4096)}


_BIN_HEAD = struct.Struct(">BIB")  # T_BIN, length, subtype: self-delimiting, no escapes


def _binary_key(subtype: int, b: bytes) -> bytes:
    return _BIN_HEAD.pack(T_BIN, len(b), subtype) + b


def _escaped(tag: int, b: bytes) -> bytes:
    return bytes((tag,)) + b.replace(b"\x00", b"\x00\xff") + b"\x00\x00"


def encode_key(v) -> bytes:
    if v is None:
        return bytes((T_NULL,))
    t = type(v)
    if t is bool:
        return bytes((T_BOOL, 1 if v else 0))
    if t is int:
        k = _SMALL_INTS.get(v)
        if k is not None:
            return k
        if 0 < v < _EXACT:  # _num's bytes: -v is the double with the sign bit set
            return _TAG_D.pack(T_NUM, -v)
        if -_EXACT < v < 0:
            return _TAG_Q.pack(T_NUM, _Q.unpack(_D.pack(v))[0] ^ _FLIP)
        if not -(1 << 63) <= v < (1 << 64):
            raise InvalidDocument(f"integer {v} does not fit in 64 bits")
        return _num(v)
    if t is float:
        return _num(v)
    if t is str:
        return _escaped(T_STR, v.encode("utf-8", "surrogatepass"))
    if t is bytes or t is bytearray or t is memoryview:
        return _binary_key(0, bytes(v))
    if t is dict:
        parts = [bytes((T_MAP,))]
        for k, x in v.items():
            if type(k) is not str:
                raise InvalidDocument(f"map key {k!r} is not a string")
            vk = encode_key(x)  # its type bracket, its name, its value (MongoDB's order)
            parts.append(_escaped(vk[0], k.encode("utf-8", "surrogatepass")))
            parts.append(vk)
        parts.append(END)
        return b"".join(parts)
    if t is list or t is tuple:
        return bytes((T_ARR,)) + b"".join(encode_key(x) for x in v) + END
    if t is ObjectId:
        return _OID_TAG + v.binary
    if isinstance(v, datetime.datetime) or t is DatetimeMS:
        ms = millis(v) if t is not DatetimeMS else int(v)
        return _TAG_Q.pack(T_DATE, (ms + (1 << 63)) & _FLIP)
    if t is Decimal128:
        return _decimal_key(v)
    if t is uuid.UUID:
        return _binary_key(4, v.bytes)
    if t is Binary:  # subtype 0 is bytes, 4 of 16 bytes a UUID, as stored
        v = stored_binary(v)
        return _binary_key(v.subtype, bytes(v)) if type(v) is Binary else encode_key(v)
    if t is DBRef:  # stored as its map
        return encode_key(as_map(v))
    if t is Int64:
        return encode_key(int(v))
    if t is Timestamp:
        return _TAG_Q.pack(T_TS, (v.time << 32) | v.inc)
    if t is Regex or t is re.Pattern:  # flags: an int in both
        return _escaped(T_RE, str(v.pattern).encode("utf-8", "surrogatepass")) + \
            _Q.pack(v.flags)
    if t is Code:
        return _escaped(T_CODE, str(v).encode("utf-8", "surrogatepass"))
    if t is MinKey:
        return bytes((T_MINKEY,))
    if t is MaxKey:
        return bytes((T_MAXKEY,))
    for base in BASES:  # subclasses: IntEnum, OrderedDict...
        if isinstance(v, base):
            return encode_key(base(v))
    raise InvalidDocument(f"value of type {type(v).__name__} cannot be stored: {v!r:.80}")


_INTS, _STRS = frozenset((int,)), frozenset((str,))
_NEG_D = struct.Struct(">Bd").pack
_STR_KEY = (chr(T_STR) + "{}\x00\x00").format
_UTF8 = operator.methodcaller("encode", "utf-8", "surrogatepass")


def encode_keys(values: list) -> list[bytes]:
    """``[encode_key(v) for v in values]``, at C speed for the common batches
    (an insert's _ids, an index's values): all integers in (0, 2**53), whose
    key is the tag and the negated double, or all strings without a NUL,
    whose key needs no escaping."""
    types = set(map(type, values))
    if types == _INTS and 0 < min(values) and max(values) < _EXACT:
        return list(map(_NEG_D, itertools.repeat(T_NUM), map(operator.neg, values)))
    if types == _STRS and "\x00" not in "".join(values):
        return list(map(_UTF8, map(_STR_KEY, values)))
    return list(map(encode_key, values))


def bracket(v) -> int:
    """The type bracket of a value (its encoding's first byte)."""
    return encode_key(v)[0]


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix``."""
    p = bytearray(prefix)
    while p:
        if p[-1] != 0xFF:
            p[-1] += 1
            return bytes(p)
        p.pop()
    return None
