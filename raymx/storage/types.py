"""MongoDB's value types stored natively: msgpack extension types.

=========  ====  ========================================================
type       code  payload
=========  ====  ========================================================
datetime      1  8 bytes: milliseconds since 1970-01-01 UTC, signed,
                 big-endian (as BSON, millisecond precision: microseconds
                 are dropped; a naive datetime is taken as UTC)
ObjectId      2  its 12 bytes
Decimal128    3  its 16 bytes (IEEE 754-2008 BID, little-endian, as BSON)
UUID          4  its 16 bytes (uuid.UUID; BSON binary subtype 4)
Binary        5  its subtype (1 byte), then its bytes (``bson.Binary`` of a
                 subtype other than 0, plain ``bytes``, and 4 with 16 bytes,
                 a UUID: stored as those)
Int64         6  8 bytes, signed, big-endian: a ``bson.Int64`` keeps BSON's
                 width (a plain int is stored as msgpack's int, and BSON
                 gets an int32 for it when it fits one)
Timestamp     7  8 bytes: its time and its increment, unsigned, big-endian
Regex         8  its ``re`` flags (4 bytes, big-endian), then its pattern
                 (UTF-8); a compiled ``re.Pattern`` is stored as one
MinKey        9  nothing
MaxKey       10  nothing
Code         11  its JavaScript (UTF-8); a Code with a scope is refused
=========  ====  ========================================================

A ``bson.DBRef`` is stored as what BSON holds it as, a map ``{"$ref", "$id"[,
"$db"], ...}``: pymongo reads such a map back as a DBRef.

Decoded: datetime as a naive UTC ``datetime`` (as pymongo by default),
``bson.ObjectId``, ``bson.Decimal128``, ``uuid.UUID``, ``bson.Binary``,
``bson.Int64``, ``bson.Timestamp``, ``bson.Regex``, ``bson.MinKey``,
``bson.MaxKey``, ``bson.Code``: what pymongo decodes the BSON types as.
Packing checks types exactly (``strict_types``): ``bson.Binary`` is a
``bytes`` subclass that msgpack would otherwise store as plain bytes,
dropping its subtype; other subclasses (an ``IntEnum``, an ``OrderedDict``)
and tuples are stored as their base type, as before. The classes are those
of pymongo's ``bson`` package; this module only maps them onto msgpack.
Their place in the order of values is in ``raymx.storage.keys``.
"""
from __future__ import annotations

import datetime
import re
import struct
import uuid

import msgpack
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

EXT_DATE, EXT_OID, EXT_DEC, EXT_UUID, EXT_BIN = 1, 2, 3, 4, 5
EXT_I64, EXT_TS, EXT_RE, EXT_MIN, EXT_MAX, EXT_CODE = 6, 7, 8, 9, 10, 11
STORED = (datetime.datetime, ObjectId, Decimal128, uuid.UUID, DatetimeMS, Binary,
          Int64, Timestamp, Regex, re.Pattern, MinKey, MaxKey, Code)
BASES = (int, float, str, bytes, dict, list)  # their subclasses are stored as them
MAPPED = (DBRef,)  # stored as a map (``as_map``)


def stored_binary(v: Binary):
    """What a Binary is stored as: ``bytes`` (subtype 0), a ``uuid.UUID``
    (subtype 4 of 16 bytes), else itself (extension type 5)."""
    if v.subtype == 0:
        return bytes(v)
    if v.subtype == 4 and len(v) == 16:
        return uuid.UUID(bytes=bytes(v))
    return v


def as_map(ref: DBRef) -> dict:
    """A DBRef as the map BSON stores it as: ``$ref``, ``$id``, ``$db`` if any,
    then its other fields."""
    return dict(ref.as_doc())
_Q = struct.Struct(">q")
_II = struct.Struct(">II")
_I = struct.Struct(">I")
EPOCH = datetime.datetime(1970, 1, 1)
_EPOCH_UTC = EPOCH.replace(tzinfo=datetime.timezone.utc)
_MS = datetime.timedelta(milliseconds=1)


def millis(dt: datetime.datetime) -> int:
    """Milliseconds since the epoch (UTC; naive is UTC), microseconds dropped."""
    if dt.tzinfo is None:
        return (dt - EPOCH) // _MS
    return (dt - _EPOCH_UTC) // _MS


def from_millis(ms: int) -> datetime.datetime:
    return EPOCH + datetime.timedelta(milliseconds=ms)


def now() -> datetime.datetime:
    """The clock as a naive UTC datetime to the millisecond, BSON's precision
    (``$currentDate``, ``$$NOW``)."""
    t = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    return t.replace(microsecond=t.microsecond // 1000 * 1000)


def default(v):
    """msgpack's ``default`` hook: the types above as extension types (a
    DBRef as its map; a subclass or a tuple as its base type)."""
    if isinstance(v, datetime.datetime):
        return msgpack.ExtType(EXT_DATE, _Q.pack(millis(v)))
    t = type(v)
    if t is ObjectId:
        return msgpack.ExtType(EXT_OID, v.binary)
    if t is Decimal128:
        return msgpack.ExtType(EXT_DEC, v.bid)
    if t is uuid.UUID:
        return msgpack.ExtType(EXT_UUID, v.bytes)
    if t is DatetimeMS:
        return msgpack.ExtType(EXT_DATE, _Q.pack(int(v)))
    if t is Binary:
        v = stored_binary(v)
        if type(v) is Binary:
            return msgpack.ExtType(EXT_BIN, bytes((v.subtype,)) + v)
        return v if type(v) is bytes else msgpack.ExtType(EXT_UUID, v.bytes)
    if t is DBRef:
        return as_map(v)
    if t is Int64:
        if not -(1 << 63) <= v < (1 << 63):
            raise TypeError(f"Int64 {int(v)} does not fit in 64 bits")
        return msgpack.ExtType(EXT_I64, _Q.pack(v))
    if t is Timestamp:
        return msgpack.ExtType(EXT_TS, _II.pack(v.time, v.inc))
    if t is Regex or t is re.Pattern:  # flags: an int in both
        if not isinstance(v.pattern, str):
            raise TypeError("a regex with a bytes pattern cannot be stored")
        return msgpack.ExtType(EXT_RE, _I.pack(v.flags) + v.pattern.encode("utf-8"))
    if t is MinKey:
        return msgpack.ExtType(EXT_MIN, b"")
    if t is MaxKey:
        return msgpack.ExtType(EXT_MAX, b"")
    if t is Code:
        if v.scope is not None:
            raise TypeError("a Code with a scope cannot be stored (MongoDB deprecated "
                            "it): store its scope as a field of its own")
        return msgpack.ExtType(EXT_CODE, str(v).encode("utf-8"))
    if isinstance(v, tuple):  # tuples and named tuples (a GTID): arrays, as before
        return list(v)
    for base in BASES:
        if isinstance(v, base):
            return base(v)
    raise TypeError(f"type {t.__name__} cannot be stored")


def ext_hook(code: int, data: bytes):
    """msgpack's ``ext_hook``: extension types back into values."""
    if code == EXT_DATE and len(data) == 8:
        ms = _Q.unpack(data)[0]
        try:
            return from_millis(ms)
        except OverflowError:  # outside datetime's years 1-9999: kept as BSON does
            return DatetimeMS(ms)
    if code == EXT_OID and len(data) == 12:
        return ObjectId(data)
    if code == EXT_DEC and len(data) == 16:
        return Decimal128.from_bid(data)
    if code == EXT_UUID and len(data) == 16:
        return uuid.UUID(bytes=data)
    if code == EXT_BIN and data:
        return Binary(data[1:], data[0])
    if code == EXT_I64 and len(data) == 8:
        return Int64(_Q.unpack(data)[0])
    if code == EXT_TS and len(data) == 8:
        return Timestamp(*_II.unpack(data))
    if code == EXT_RE and len(data) >= 4:
        return Regex(data[4:].decode("utf-8"), _I.unpack(data[:4])[0])
    if code == EXT_MIN and not data:
        return MinKey()
    if code == EXT_MAX and not data:
        return MaxKey()
    if code == EXT_CODE:
        return Code(data.decode("utf-8"))
    return msgpack.ExtType(code, data)
