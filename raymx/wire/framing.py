"""MongoDB wire messages: the 16-byte header, OP_MSG, and the legacy
OP_QUERY / OP_REPLY pair drivers still use for their first ``hello``.

Pure code (bytes in, documents out); BSON is pymongo's ``bson`` package.
See https://www.mongodb.com/docs/manual/reference/mongodb-wire-protocol/.
"""
from __future__ import annotations

import struct
import uuid

import bson
from bson.binary import Binary, UuidRepresentation
from bson.codec_options import CodecOptions

from raymx.storage.errors import ProtocolError

OP_REPLY = 1
OP_QUERY = 2004
OP_COMPRESSED = 2012
OP_MSG = 2013

HEADER = struct.Struct("<iiii")  # messageLength, requestID, responseTo, opCode
HEADER_BYTES = 16
MAX_MESSAGE_BYTES = 48_000_000  # hello's maxMessageSizeBytes: drivers refuse a longer answer
CHECKSUM_PRESENT = 1
MORE_TO_COME = 2
EXHAUST_ALLOWED = 1 << 16
_KNOWN_FLAGS = CHECKSUM_PRESENT | MORE_TO_COME | EXHAUST_ALLOWED

# documents decode to plain dicts (insertion order kept), datetimes as naive
# UTC, binary subtype 4 as uuid.UUID (and back): the values raymx stores
CODEC = CodecOptions(tz_aware=False, uuid_representation=UuidRepresentation.STANDARD)
# a subtype 4 that is not 16 bytes is no UUID, and CODEC refuses it; MongoDB
# stores it as it is, so such a message is decoded again keeping every
# binary, and the 16-byte subtype-4 ones become UUIDs as CODEC would make them
_AS_BINARY = CodecOptions(tz_aware=False, uuid_representation=UuidRepresentation.UNSPECIFIED)


def _uuids(v):
    t = type(v)
    if t is dict:
        return {k: _uuids(x) for k, x in v.items()}
    if t is list:
        return [_uuids(x) for x in v]
    if t is Binary and v.subtype == 4 and len(v) == 16:
        return uuid.UUID(bytes=bytes(v))
    return v


def _decode(raw: bytes, one: bool):
    """bson.decode (``one``) or bson.decode_all of ``raw`` with CODEC."""
    try:
        return bson.decode(raw, CODEC) if one else bson.decode_all(raw, CODEC)
    except bson.errors.InvalidBSON as e:
        if "uuid" not in str(e):
            raise
        return _uuids(bson.decode(raw, _AS_BINARY) if one else bson.decode_all(raw, _AS_BINARY))


class WireError(ProtocolError):
    """A message that cannot be parsed: the connection is closed after an answer."""


def parse_header(b: bytes, max_bytes: int) -> tuple[int, int, int, int]:
    """(length, request id, response to, opcode) of a message header."""
    length, rid, rto, op = HEADER.unpack(b)
    if length < HEADER_BYTES or length > max_bytes:
        raise WireError(f"message length {length} is outside 16..{max_bytes}")
    return length, rid, rto, op


def _doc(body: memoryview, pos: int, what: str) -> tuple[dict, int]:
    if len(body) - pos < 5:
        raise WireError(f"{what}: truncated document")
    n = int.from_bytes(body[pos:pos + 4], "little")
    if n < 5 or pos + n > len(body):
        raise WireError(f"{what}: document length {n} does not fit the message")
    try:
        return _decode(bytes(body[pos:pos + n]), True), pos + n
    except Exception as e:  # InvalidBSON and friends
        raise WireError(f"{what}: invalid BSON ({e})") from None


def parse_msg(body: bytes) -> tuple[int, dict]:
    """An OP_MSG body -> (flag bits, command document). Document sequences
    (kind 1 sections) become lists under their identifier, as MongoDB does."""
    mv = memoryview(body)
    if len(mv) < 5:
        raise WireError("OP_MSG: shorter than its flags and a section")
    flags = int.from_bytes(mv[:4], "little")
    if flags & 0xFFFF & ~_KNOWN_FLAGS:
        raise WireError(f"OP_MSG: unknown required flag bits {flags & 0xFFFF:#x}")
    end = len(mv) - (4 if flags & CHECKSUM_PRESENT else 0)
    mv = mv[:end]
    pos, cmd, seqs = 4, None, {}
    while pos < end:
        kind = mv[pos]
        pos += 1
        if kind == 0:
            if cmd is not None:
                raise WireError("OP_MSG: more than one body section")
            cmd, pos = _doc(mv, pos, "OP_MSG body")
        elif kind == 1:
            if end - pos < 4:
                raise WireError("OP_MSG: truncated document sequence")
            size = int.from_bytes(mv[pos:pos + 4], "little")
            stop = pos + size
            if size < 5 or stop > end:
                raise WireError(f"OP_MSG: document sequence of {size} bytes does not fit")
            name_end = bytes(mv[pos + 4:stop]).find(b"\x00")
            if name_end < 0:
                raise WireError("OP_MSG: document sequence without an identifier")
            ident = bytes(mv[pos + 4:pos + 4 + name_end]).decode("utf-8", "replace")
            p = pos + 4 + name_end + 1
            try:  # the whole sequence in one C call
                seqs[ident] = _decode(bytes(mv[p:stop]), False)
            except Exception as e:
                raise WireError(f"OP_MSG sequence {ident!r}: invalid BSON ({e})") from None
            pos = stop
        else:
            raise WireError(f"OP_MSG: unknown section kind {kind}")
    if cmd is None:
        raise WireError("OP_MSG: no body section")
    for k, v in seqs.items():
        if k in cmd:
            raise WireError(f"OP_MSG: {k!r} is both in the body and a document sequence")
        cmd[k] = v
    return flags, cmd


def parse_query(body: bytes) -> tuple[str, dict]:
    """A legacy OP_QUERY body -> (full collection name, query document)."""
    mv = memoryview(body)
    nul = bytes(mv[4:]).find(b"\x00")
    if nul < 0:
        raise WireError("OP_QUERY: no collection name")
    name = bytes(mv[4:4 + nul]).decode("utf-8", "replace")
    pos = 4 + nul + 1 + 8  # numberToSkip, numberToReturn
    q, _ = _doc(mv, pos, "OP_QUERY query")
    if "$query" in q and isinstance(q["$query"], dict):  # the old wrapped form
        q = q["$query"]
    return name, q


def _encode(doc: dict) -> bytes:
    return bson.encode(doc, codec_options=CODEC)


def build_msg(request_id: int, response_to: int, doc: dict, flags: int = 0) -> bytes:
    payload = struct.pack("<i", flags) + b"\x00" + _encode(doc)
    return HEADER.pack(HEADER_BYTES + len(payload), request_id, response_to, OP_MSG) + payload


def build_reply(request_id: int, response_to: int, doc: dict) -> bytes:
    """An OP_REPLY carrying one document (the answer to a legacy OP_QUERY)."""
    payload = struct.pack("<iqii", 0, 0, 0, 1) + _encode(doc)
    return HEADER.pack(HEADER_BYTES + len(payload), request_id, response_to, OP_REPLY) + payload
