"""Oplog entries: format, hash chain, validation and op inversion (pure).

An entry is stored under its GTID's 16 bytes as a msgpack map::

    {"ts": <commit time, ms>, "h": <u64 hash chain>, "ops": [op, ...]}
    {"ts": ..., "h": ..., "ref": <u64 spill id>, "chunks": <n>}   # spilled

Ops (every i/u/d carries full images, so it can be undone and so replay can
keep the last image per document)::

    {"op": "i", "ns": "db.c", "post": doc}
    {"op": "u", "ns": "db.c", "pre": doc, "post": doc}     # "r": true if it replaced it
    {"op": "d", "ns": "db.c", "pre": doc}
    {"op": "c", "ns": "db.c", "cmd": "create" | "drop" | "createIndex" | "dropIndex", ...}
    {"op": "n"}

``h = sha256-64(prev_h || GTID bytes || sha256 over the packed ops)``, where the
digest streams over each op's msgpack bytes, so it is the same whether the ops
are inline or spilled into chunks, and the hash never needs the whole
transaction in memory. SHA-256 because CPUs hash it in hardware (SHA-NI,
ARMv8): on this machine kind it is twice as fast as blake2b, whose CPython
build is the portable reference code, and every byte written or replicated
goes through it.
"""
from __future__ import annotations

import hashlib
import struct

from raymx.storage import codec
from raymx.storage.errors import CorruptEntry, IrreversibleOp
from raymx.storage.gtid import GTID

OP_TYPES = ("i", "u", "d", "c", "n")
COMMANDS = ("create", "drop", "createIndex", "dropIndex", "rename")
_H = struct.Struct(">Q")


class OpsDigest:
    """Streams op bytes into the digest that the chain hash covers."""

    __slots__ = ("_h",)

    def __init__(self):
        self._h = hashlib.sha256()

    def add(self, packed_op: bytes) -> None:
        self._h.update(packed_op)

    def copy(self) -> "OpsDigest":
        d = OpsDigest.__new__(OpsDigest)
        d._h = self._h.copy()
        return d

    def digest(self) -> bytes:
        return self._h.digest()


def chain_hash(prev_h: int, gtid: GTID, ops_digest: bytes) -> int:
    h = hashlib.sha256(_H.pack(prev_h) + gtid.to_bytes() + ops_digest).digest()
    return _H.unpack_from(h)[0]


def digest_of(ops) -> bytes:
    """The digest of ops given decoded (packed here as the engine packs them)."""
    d = OpsDigest()
    for op in ops:
        d.add(codec.pack(op))
    return d.digest()


def stored_digest(entry: bytes, chunks: list[bytes]) -> bytes:
    """The digest of an entry's ops over their stored bytes, never re-encoded:
    what the chain hash covers is what the primary hashed when it committed,
    whatever msgpack encoding a client's documents came in. ``entry`` has been
    decoded once already (it is well formed); ``chunks``: its spilled ops."""
    d = OpsDigest()
    for op in codec.map_array_slices(entry, "ops"):
        d.add(op)
    for c in chunks:
        for op in codec.split_array(c):
            d.add(op)
    return d.digest()


def check_op(op, where: str) -> None:
    """Reject what no member could apply: called on every entry that arrives."""
    if type(op) is not dict:
        raise CorruptEntry(f"{where}: an op must be a map, got {type(op).__name__}")
    kind = op.get("op")
    if kind not in OP_TYPES:
        raise CorruptEntry(f"{where}: unknown op type {kind!r} (known: {', '.join(OP_TYPES)})")
    if kind == "n":
        return
    if type(op.get("ns")) is not str or "." not in op["ns"]:
        raise CorruptEntry(f"{where}: op {kind!r} has no valid 'ns'")
    need = {"i": ("post",), "u": ("pre", "post"), "d": ("pre",), "c": ()}[kind]
    for f in need:
        if type(op.get(f)) is not dict or "_id" not in op[f]:
            raise CorruptEntry(f"{where}: op {kind!r} needs a document with _id in {f!r}")
    if kind == "u" and "r" in op and op["r"] is not True:
        raise CorruptEntry(f"{where}: an update's 'r' (replaced) must be true when present")
    if kind == "c" and op.get("cmd") not in COMMANDS:
        raise CorruptEntry(f"{where}: unknown command {op.get('cmd')!r}")
    if kind == "c" and op["cmd"] == "rename" and (type(op.get("to")) is not str
                                                  or "." not in op["to"]):
        raise CorruptEntry(f"{where}: a rename needs a valid 'to'")


def check_entry(e, where: str) -> None:
    if type(e) is not dict:
        raise CorruptEntry(f"{where}: an entry must be a map")
    if type(e.get("ts")) is not int or type(e.get("h")) is not int:
        raise CorruptEntry(f"{where}: entry needs integer 'ts' and 'h'")
    if "ops" in e:
        if type(e["ops"]) is not list:
            raise CorruptEntry(f"{where}: 'ops' must be a list")
        for i, op in enumerate(e["ops"]):
            check_op(op, f"{where} op {i}")
    elif type(e.get("ref")) is not int or type(e.get("chunks")) is not int:
        raise CorruptEntry(f"{where}: entry has neither 'ops' nor 'ref'/'chunks'")


def is_irreversible(op) -> bool:
    return op.get("op") == "c" and op.get("cmd") == "drop" and op.get("irreversible", True)


def invert(op) -> dict:
    """The op that undoes ``op``, from its logged images."""
    k = op["op"]
    if k == "i":
        return {"op": "d", "ns": op["ns"], "pre": op["post"]}
    if k == "d":
        return {"op": "i", "ns": op["ns"], "post": op["pre"]}
    if k == "u":
        return {**op, "pre": op["post"], "post": op["pre"]}
    if k == "n":
        return op
    cmd = op["cmd"]
    if cmd == "drop" and op.get("irreversible") is False:
        # only the inverse of a create is a reversible drop: the collection was
        # empty again by the time it runs, since later ops are undone first
        return {"op": "c", "ns": op["ns"], "cmd": "create"}
    if cmd == "create":
        return {"op": "c", "ns": op["ns"], "cmd": "drop", "irreversible": False}
    if cmd == "createIndex":
        return {"op": "c", "ns": op["ns"], "cmd": "dropIndex", "name": op["name"],
                "spec": op["spec"]}
    if cmd == "dropIndex":
        return {"op": "c", "ns": op["ns"], "cmd": "createIndex", "name": op["name"],
                "spec": op["spec"]}
    if cmd == "rename":
        return {"op": "c", "ns": op["to"], "cmd": "rename", "to": op["ns"]}
    raise IrreversibleOp(f"op {cmd!r} on {op['ns']} cannot be undone "
                         "(dropping a collection does not log its documents)", ns=op["ns"])


def spill_key(ref: int, chunk: int) -> bytes:
    return _H.pack(ref) + struct.pack(">I", chunk)
