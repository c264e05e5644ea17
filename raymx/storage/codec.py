"""msgpack codec with validation and size limits (the only msgpack import).

Documents are msgpack maps with string keys; values are None, bool, 64-bit
ints, floats, str, bytes, lists and maps, and MongoDB's datetime, ObjectId,
Decimal128, UUID and binary subtypes as msgpack extension types
(``raymx.storage.types``).
Anything else is refused before it is stored, with an error naming the
offending field.
"""
from __future__ import annotations

import functools
import itertools
import threading

import msgpack

from raymx.storage import types
from raymx.storage.errors import CorruptEntry, DocumentTooLarge, InvalidDocument, ProtocolError

_SCALARS = (type(None), bool, int, float, str, bytes) + types.STORED
_EXT = types.ext_hook
_I64_MIN, _U64_MAX = -(1 << 63), (1 << 64) - 1


_LOCAL = threading.local()


def _packer() -> msgpack.Packer:
    """This thread's Packer: reused, it packs a small map twice as fast as
    ``packb`` (which builds one per call); one per thread, never shared."""
    try:
        return _LOCAL.p
    except AttributeError:
        p = _LOCAL.p = msgpack.Packer(use_bin_type=True, default=types.default,
                                      strict_types=True)  # keeps a Binary's subtype
        return p


def pack(obj) -> bytes:
    """Encode trusted, already validated data (entries, catalog records)."""
    return _packer().pack(obj)


def unpack(b: bytes, what: str = "record", max_bytes: int | None = None):
    """Decode stored or received bytes; anything malformed is a CorruptEntry."""
    if max_bytes is not None and len(b) > max_bytes:
        raise CorruptEntry(f"{what} of {len(b)} bytes exceeds the limit of {max_bytes}")
    try:
        return msgpack.unpackb(b, raw=False, strict_map_key=False, ext_hook=_EXT)
    except Exception as e:  # msgpack raises several unrelated types
        raise CorruptEntry(f"{what} is not valid msgpack: {e}") from None


_SCALAR_SET = frozenset(_SCALARS) - {int}


NESTING_MAX = 100  # levels of maps and arrays in a document (as MongoDB's BSON)


def check_value(v, path: str = "", depth: int = 0) -> None:
    """Raise InvalidDocument naming the first field msgpack must not carry."""
    t = type(v)
    if (t is dict or t is list or t is tuple) and depth >= NESTING_MAX:
        raise InvalidDocument(f"field {path or '<value>'}: nested deeper than {NESTING_MAX} "
                              "levels of maps and arrays")
    if t is dict:
        for k, x in v.items():
            if type(k) is not str:
                raise InvalidDocument(f"field {path + '.' if path else ''}{k!r}: keys must be strings")
            tx = type(x)
            if tx in _SCALAR_SET or (tx is int and _I64_MIN <= x <= _U64_MAX):
                continue  # the common flat case, without a call
            check_value(x, f"{path}.{k}" if path else k, depth + 1)
    elif t is list or t is tuple:
        for i, x in enumerate(v):
            check_value(x, f"{path}.{i}", depth + 1)
    elif t is int:
        if not _I64_MIN <= v <= _U64_MAX:
            raise InvalidDocument(f"field {path or '<value>'}: integer {v} does not fit in 64 bits")
    elif t in types.MAPPED:  # a DBRef: the map it is stored as
        check_value(types.as_map(v), path, depth)
    elif t not in _SCALARS and not isinstance(v, types.datetime.datetime):
        raise InvalidDocument(
            f"field {path or '<value>'}: type {t.__name__} cannot be stored "
            "(allowed: None, bool, int, float, str, bytes, list, dict, datetime, ObjectId, "
            "Decimal128, UUID, Binary, DBRef)")


_FLAT = frozenset((type(None), bool, int, float, str, bytes) + types.STORED)


def _check_document(doc) -> None:
    """The precise check: raise InvalidDocument naming the first bad field."""
    check_value(doc)
    for k in doc:
        if k[:1] == "$":
            raise InvalidDocument(f"field name {k!r} may not start with '$'")


def pack_document(doc, max_bytes: int) -> bytes:
    """Validate and encode a document.

    A flat document (the common case) is checked with C-speed set and join
    operations, and msgpack itself refuses integers past 64 bits; anything
    else (nested values, a failed check, an encoder error) goes through the
    field-by-field check, which names what is wrong.
    """
    if type(doc) is not dict:
        raise InvalidDocument(f"a document must be a dict, got {type(doc).__name__}")
    try:
        # join raises TypeError for a key that is not a string; a '$' anywhere
        # in a name sends it to the precise check, which refuses only a leading one
        fast = "$" not in "".join(doc) and _FLAT.issuperset(map(type, doc.values()))
    except TypeError:
        fast = False
    if not fast:
        _check_document(doc)
    try:
        b = _packer().pack(doc)
    except Exception as e:  # OverflowError, UnicodeEncodeError, ...
        _check_document(doc)
        raise InvalidDocument(f"document _id={doc.get('_id')!r:.60} cannot be encoded: {e}") from None
    if len(b) > max_bytes:
        raise DocumentTooLarge(f"document _id={doc.get('_id')!r:.60} is {len(b)} bytes, "
                               f"over the limit of {max_bytes}", size=len(b), limit=max_bytes)
    return b


def _all_flat(docs: list) -> bool:
    """True if every document of the batch passes the flat check (one C-speed
    pass: all keys joined as one string, all value types as one set)."""
    try:
        return ("$" not in "".join(itertools.chain.from_iterable(docs)) and _FLAT.issuperset(
            map(type, itertools.chain.from_iterable(map(dict.values, docs)))))
    except TypeError:
        return False


def pack_documents(docs: list, max_bytes: int) -> list[bytes]:
    """``pack_document`` for a batch of dicts: the flat check and the packing
    run over the whole batch at C speed (no Python call per document); a batch
    that is not all flat, or that fails, is done document by document, so the
    error names the first bad document and field."""
    if _all_flat(docs):
        try:
            out = list(map(_packer().pack, docs))
        except Exception:
            pass  # the per-document path says which document and why
        else:
            if max(map(len, out), default=0) <= max_bytes:
                return out
    return [pack_document(d, max_bytes) for d in docs]


class PackedDocuments:
    """Documents that arrived as their msgpack bytes (``rows``, one per
    document, packed by the driver), decoded and checked by
    ``unpack_documents``: an insert stores those bytes as they are instead of
    packing the documents again."""
    __slots__ = ("docs", "rows", "nbytes")

    def __init__(self, docs: list, rows: list):
        self.docs, self.rows = docs, rows
        self.nbytes = sum(map(len, rows))

    def __len__(self):
        return len(self.docs)

    def extend(self, more: "PackedDocuments") -> "PackedDocuments":
        """Append the documents of the next part of the same insert."""
        self.docs += more.docs
        self.rows += more.rows
        self.nbytes += more.nbytes
        return self


_BYTES, _DICT = frozenset((bytes,)), frozenset((dict,))


def unpack_documents(rows, max_bytes: int, first: int = 0) -> PackedDocuments:
    """Decode documents received one msgpack binary each and check them as
    ``pack_documents`` checks what it packs (C-speed passes over the batch;
    the error names the first bad document, counted from ``first``, and its
    field).

    What passes is stored byte for byte, also when it is valid msgpack encoded
    another way than this packer would (a float32, an int or a string header
    wider than needed): the oplog's hash chain covers the stored bytes
    (``oplog.stored_digest``). Every reader decodes them into the document
    checked and indexed here."""
    if type(rows) is not list or not _BYTES.issuperset(map(type, rows)):
        raise InvalidDocument("packed documents must be a list of msgpack binaries, "
                              "one per document")
    if max(map(len, rows), default=0) > max_bytes:
        i, n = next((i, len(r)) for i, r in enumerate(rows) if len(r) > max_bytes)
        raise DocumentTooLarge(f"document {first + i} of the batch is {n} bytes, over the "
                               f"limit of {max_bytes}", size=n, limit=max_bytes)
    try:  # a comprehension passing ext_hook itself: a functools.partial copies
        # its keywords into a new dict at every call (0.1-0.3 us more a document)
        ub, ext = msgpack.unpackb, _EXT
        docs = [ub(r, ext_hook=ext) for r in rows]
    except Exception:
        docs = []
        for i, r in enumerate(rows):
            try:
                docs.append(unpack_document(r))
            except Exception as e:
                raise InvalidDocument(f"document {first + i} of the batch is not one msgpack "
                                      f"map with string keys: {e}") from None
    if not _DICT.issuperset(map(type, docs)):
        i, d = next((i, d) for i, d in enumerate(docs) if type(d) is not dict)
        raise InvalidDocument(f"document {first + i} of the batch must be a map, "
                              f"got {type(d).__name__}")
    if not _all_flat(docs):
        for i, d in enumerate(docs, first):
            try:
                _check_document(d)
            except InvalidDocument as e:
                raise InvalidDocument(f"document {i} of the batch: {e.msg}") from None
    return PackedDocuments(docs, rows)


def pack_each(docs: list, max_bytes: int) -> list[bytes]:
    """Each document packed on its own, for sending (``unpack_documents`` at
    the other end checks them): one C-level pass; on failure the precise
    check of ``pack_documents`` names the document and the field."""
    try:
        return list(map(_packer().pack, docs))
    except Exception:
        return pack_documents(docs, max_bytes)


def pack_rows(rows) -> bytes:
    """A run of stored (key, value) rows as one msgpack array (snapshot copies:
    one object to ship and to hash instead of one per row)."""
    return msgpack.packb(rows, use_bin_type=True)


def unpack_rows(b: bytes) -> tuple:
    """The rows of ``pack_rows``, as (key, value) tuples."""
    try:
        rows = msgpack.unpackb(b, raw=False, use_list=False)
    except Exception as e:
        raise CorruptEntry(f"a snapshot run is not valid msgpack: {e}") from None
    if type(rows) is not tuple or any(type(r) is not tuple or len(r) != 2 for r in rows):
        raise CorruptEntry("a snapshot run must be an array of [key, value] pairs")
    return rows


def unpack_document(b: bytes):
    return msgpack.unpackb(b, raw=False, ext_hook=_EXT)


# --- building entries from already packed parts (no re-encoding) ---------
_P = msgpack.Packer(use_bin_type=True)


def array_header(n: int) -> bytes:
    return _P.pack_array_header(n)


def map_header(n: int) -> bytes:
    return _P.pack_map_header(n)


_K_OP, _K_NS, _K_PRE, _K_POST = (pack(k) for k in ("op", "ns", "pre", "post"))
_OPS = {k: pack(k) for k in "iudcn"}
_K_R, _TRUE = pack("r"), pack(True)  # "r": true, a u op that replaced the document


def pack_image_op(kind: str, ns: str, pre: bytes | None, post: bytes | None,
                  replace: bool = False) -> bytes:
    """Pack an i/u/d op from documents that are already msgpack bytes;
    ``replace``: a u op that replaced the document (``"r": true``)."""
    parts = [_K_OP, _OPS[kind], _K_NS, pack(ns)]
    if pre is not None:
        parts += (_K_PRE, pre)
    if replace:
        parts += (_K_R, _TRUE)
    if post is not None:
        parts += (_K_POST, post)
    return map_header(len(parts) // 2) + b"".join(parts)


@functools.lru_cache(maxsize=4096)
def insert_op_prefix(ns: str) -> bytes:
    """``pack_image_op("i", ns, None, b) == insert_op_prefix(ns) + b``: the part
    every insert op into ``ns`` shares, packed once."""
    return map_header(3) + _K_OP + _OPS["i"] + _K_NS + pack(ns) + _K_POST


@functools.lru_cache(maxsize=4096)
def update_op_parts(ns: str, replace: bool = False) -> tuple[bytes, bytes]:
    """``(a, b)`` with ``pack_image_op("u", ns, pre, post, replace) == a + pre
    + b + post`` (packed once per ``ns``)."""
    return (map_header(5 if replace else 4) + _K_OP + _OPS["u"] + _K_NS + pack(ns) + _K_PRE,
            (_K_R + _TRUE if replace else b"") + _K_POST)


def map_array_slices(blob: bytes, key: str) -> list[bytes]:
    """The packed elements of the array under ``key`` in the msgpack map
    ``blob``, each as its own bytes (sliced, never re-encoded); [] if the map
    has no such key."""
    up = _unpacker_over(blob)
    for _ in range(up.read_map_header()):
        if up.unpack() == key:
            return _array_slices(up, blob)
        up.skip()
    return []


def split_array(blob: bytes) -> list[bytes]:
    """The packed elements of a msgpack array, each as its own bytes (sliced,
    never re-encoded): documents read in bulk stay their stored bytes."""
    return _array_slices(_unpacker_over(blob), blob)


def _unpacker_over(blob: bytes) -> msgpack.Unpacker:
    up = msgpack.Unpacker(max_buffer_size=max(1, len(blob)))
    up.feed(blob)
    return up


def _array_slices(up: msgpack.Unpacker, blob: bytes) -> list[bytes]:
    """The elements of the array ``up`` is at in ``blob``, sliced."""
    n = up.read_array_header()
    out, pos = [], up.tell()
    for _ in range(n):
        up.skip()
        end = up.tell()
        out.append(blob[pos:end])
        pos = end
    return out


# --- client-port frames: 4-byte big-endian length, then one msgpack map ---
FRAME_HEADER_BYTES = 4


def pack_frame(obj) -> bytes:
    b = _packer().pack(obj)
    return len(b).to_bytes(4, "big") + b


def frame_length(header: bytes, max_bytes: int) -> int:
    n = int.from_bytes(header, "big")
    if n == 0 or n > max_bytes:
        raise ProtocolError(f"frame of {n} bytes refused (limit {max_bytes})")
    return n


def unpack_frame(body: bytes) -> dict:
    try:
        obj = msgpack.unpackb(body, raw=False, strict_map_key=False, ext_hook=_EXT)
    except Exception as e:
        raise ProtocolError(f"frame is not valid msgpack: {e}") from None
    if type(obj) is not dict:
        raise ProtocolError(f"a frame must be a msgpack map, got {type(obj).__name__}")
    return obj


def entry_ts(b: bytes) -> int:
    """The ``ts`` field of a stored oplog entry, without decoding its ops."""
    u = msgpack.Unpacker(raw=False, strict_map_key=False)
    u.feed(b[:64])
    try:
        for _ in range(u.read_map_header()):
            if u.unpack() == "ts":
                return u.unpack()
            u.skip()
    except msgpack.OutOfData:
        pass
    except Exception as e:
        raise CorruptEntry(f"oplog entry is not valid msgpack: {e}") from None
    return unpack(b, "oplog entry")["ts"]
