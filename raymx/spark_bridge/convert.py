"""Documents <-> Arrow rows (pure: pyarrow and json, no Ray, no Spark).

The type mapping, one way and back (Spark sees the Arrow types as the types
named in brackets):

=================  ==========================  ===============================
stored value       Arrow (Spark)               written back as
=================  ==========================  ===============================
missing / None     null in the field's column  missing (``keep_nulls``: None)
bool               bool (boolean)              bool
int (64-bit)       int64 (long)                int
float              float64 (double)            float
int and float      float64 (double)            float: 3 becomes 3.0 (equal in
  in one field                                 raymx: 3 == 3.0, same key)
str                string (string)             str
bytes, Binary      binary (binary)             bytes (a Binary's subtype
                                               is not kept)
dict               struct (struct), fields     dict; absent fields stay absent
                   merged over all documents
list               list<T> (array<T>)          list
datetime           timestamp[us, UTC]          datetime (naive UTC)
                   (timestamp)
Decimal128         decimal128(38, 18)          Decimal128 (a value with more
                   (decimal(38,18))            than 18 decimals is refused)
ObjectId, UUID     string: 24 hex digits,      str (not converted back)
                   or the UUID's text
=================  ==========================  ===============================

Lossless: documents whose fields keep one type each (ints and floats mix
as above), nested to any depth. Not representable, with an error naming the
field and the document: a field holding two kinds of values (a string here,
a number there), an int above 2**63-1 (Arrow has no unsigned 64-bit column
Spark reads), lists mixing kinds. Pass an explicit schema to read such a
collection (fields outside it are then left out, like Spark's JSON reader).
Null and missing are one thing in a DataFrame: reading turns both into null,
writing leaves null fields out unless ``keep_nulls``. A field that is null
everywhere (or a list that is always empty) reads as a string column.

Writing accepts boolean, integer (all widths), float, double, string, binary,
struct, array, map (string keys), timestamp (stored as a datetime, UTC), date
(a datetime at midnight UTC) and decimal (Decimal128) columns; the rest are
refused with the column named (cast them first).
"""
from __future__ import annotations

import base64
import datetime
import decimal
import json
import uuid

import pyarrow as pa
from bson import Decimal128, Int64, ObjectId, json_util
from bson.binary import Binary
from bson.code import Code
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.regex import Regex
from bson.timestamp import Timestamp

from raymx import errors
from raymx.storage import changes, codec
from raymx.storage.gtid import GTID

_I64_MAX = (1 << 63) - 1

# Inference builds a small type tree: ("null",), ("bool",), ("int",),
# ("float",), ("str",), ("bytes",), ("struct", {name: tree}), ("list", tree).
_NULL = ("null",)
_SCALAR_KIND = {bool: "bool", int: "int", Int64: "int", float: "float", str: "str",
                bytes: "bytes", Binary: "bytes",
                datetime.datetime: "date", Decimal128: "decimal", ObjectId: "str",
                uuid.UUID: "str", Code: "str",
                # string columns of their extended JSON ({"$timestamp": ...})
                Timestamp: "str", Regex: "str", MinKey: "str", MaxKey: "str"}
_AS_JSON = (Timestamp, Regex, MinKey, MaxKey)
DECIMAL = pa.decimal128(38, 18)
TIMESTAMP = pa.timestamp("us", tz="UTC")  # the unit Spark reads (values are ms)


def _kind_name(t) -> str:
    return {"int": "integer", "float": "float", "str": "string", "bytes": "binary",
            "bool": "boolean", "struct": "document", "list": "array", "null": "null",
            "date": "datetime", "decimal": "decimal"}[t[0]]


def _type_of(v, path: str):
    t = type(v)
    if v is None:
        return _NULL
    k = _SCALAR_KIND.get(t)
    if k is not None:
        if k == "int" and v > _I64_MAX:
            raise errors.SchemaMismatch(f"field {path}: integer {v} is above 2**63-1, which "
                                        "no Spark column holds", field=path)
        return (k,)
    if t is dict:
        return ("struct", {key: _type_of(x, f"{path}.{key}") for key, x in v.items()})
    if t is list or t is tuple:
        el = _NULL
        for i, x in enumerate(v):
            el = _merge(el, _type_of(x, f"{path}.{i}"), f"{path}[]")
        return ("list", el)
    raise errors.SchemaMismatch(f"field {path}: type {t.__name__} has no column type",
                                field=path)


def _merge(a, b, path: str):
    if a == _NULL:
        return b
    if b == _NULL or a == b:
        return a
    if {a[0], b[0]} == {"int", "float"}:
        return ("float",)
    if a[0] == b[0] == "struct":
        out = dict(a[1])
        for k, t in b[1].items():
            out[k] = _merge(out[k], t, f"{path}.{k}") if k in out else t
        return ("struct", out)
    if a[0] == b[0] == "list":
        return ("list", _merge(a[1], b[1], f"{path}[]"))
    raise errors.SchemaMismatch(
        f"field {path} holds both {_kind_name(a)} and {_kind_name(b)} values: no single "
        "column type fits; pass schema= naming the fields and types to read", field=path)


def _arrow(t) -> pa.DataType:
    k = t[0]
    if k == "null" or k == "str":
        return pa.string()  # all-null fields read as strings (any type would do)
    if k == "bool":
        return pa.bool_()
    if k == "int":
        return pa.int64()
    if k == "float":
        return pa.float64()
    if k == "bytes":
        return pa.binary()
    if k == "date":
        return TIMESTAMP
    if k == "decimal":
        return DECIMAL
    if k == "list":
        return pa.list_(_arrow(t[1]))
    return pa.struct([pa.field(n, _arrow(x)) for n, x in t[1].items()])


def infer_schema(docs) -> pa.Schema:
    """The Arrow schema every one of ``docs`` fits (``_id`` first), or SchemaMismatch."""
    top = ("struct", {"_id": _NULL})
    for d in docs:
        top = _merge(top, _type_of(d, _doc_path(d)), "")
    fields = top[1]
    return pa.schema([pa.field(n, _arrow(x)) for n, x in fields.items()])


def _doc_path(d) -> str:
    return f"<document _id={d.get('_id')!r:.40}>" if isinstance(d, dict) else "<document>"


# --- documents -> Arrow ------------------------------------------------------
def _extra(v, t: pa.DataType, path: str):
    """The first field of ``v`` the Arrow type ``t`` has no place for, or None."""
    if v is None:
        return None
    if pa.types.is_struct(t):
        if type(v) is not dict:
            return None  # a type mismatch: Arrow reports it, _locate names it
        names = {t.field(i).name: t.field(i).type for i in range(t.num_fields)}
        for k, x in v.items():
            ft = names.get(k)
            if ft is None:
                return f"{path}.{k}" if path else k
            bad = _extra(x, ft, f"{path}.{k}" if path else k)
            if bad:
                return bad
    elif pa.types.is_list(t) and type(v) in (list, tuple):
        for i, x in enumerate(v):
            bad = _extra(x, t.value_type, f"{path}.{i}")
            if bad:
                return bad
    return None


def _fits(v, t: pa.DataType) -> bool:
    if v is None:
        return True
    tv = type(v)
    if pa.types.is_boolean(t):
        return tv is bool
    if pa.types.is_integer(t):
        return (tv is int or tv is Int64) and -(1 << 63) <= v <= _I64_MAX
    if pa.types.is_floating(t):
        return tv in (int, float, Int64) and (tv is float or abs(v) <= 1 << 53)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return tv in (str, ObjectId, uuid.UUID, Code) or tv in _AS_JSON
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return tv is bytes or tv is Binary
    if pa.types.is_timestamp(t):
        return isinstance(v, datetime.datetime)
    if pa.types.is_decimal(t):
        return tv is Decimal128 and _fits_decimal(v.to_decimal(), t)
    if pa.types.is_struct(t):
        if tv is not dict:
            return False
        return all(_fits(v.get(t.field(i).name), t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t):
        return tv in (list, tuple) and all(_fits(x, t.value_type) for x in v)
    return False


def _mismatch(v, t: pa.DataType, path: str):
    """(path, value) of the first value in ``v`` that does not fit ``t``."""
    if v is None or _fits(v, t):
        return None
    if pa.types.is_struct(t) and type(v) is dict:
        for i in range(t.num_fields):
            f = t.field(i)
            bad = _mismatch(v.get(f.name), f.type, f"{path}.{f.name}" if path else f.name)
            if bad:
                return bad
    if pa.types.is_list(t) and type(v) in (list, tuple):
        for i, x in enumerate(v):
            bad = _mismatch(x, t.value_type, f"{path}.{i}")
            if bad:
                return bad
    return path, v


def docs_to_table(docs: list, schema: pa.Schema, strict: bool = True) -> pa.Table:
    """Arrow rows for ``docs`` in ``schema``. ``strict``: a field the schema has
    no place for is an error (an inferred schema must hold every document);
    otherwise it is left out (an explicit schema projects)."""
    st = pa.struct(list(schema))
    # the common case at C speed: no field outside a schema without documents
    # inside (the per-document walk below only names what is wrong)
    if strict and (not all(map(_flat, schema.types))
                   or not set(schema.names).issuperset(set().union(*map(dict.keys, docs)))):
        for d in docs:
            bad = _extra(d, st, "")
            if bad:
                raise errors.SchemaMismatch(
                    f"{_doc_path(d)}: field {bad} is not in the schema (inferred from a "
                    "sample of the collection); pass schema= to read it", field=bad)
    try:
        # one C++ pass over the dicts (Table.from_pylist walks them in Python,
        # ~4x slower); fields outside the struct are not read
        return pa.Table.from_batches([pa.RecordBatch.from_struct_array(pa.array(docs, st))],
                                     schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        pass
    try:  # ObjectId, UUID and Decimal128 values: as Arrow takes them
        return pa.Table.from_batches([pa.RecordBatch.from_struct_array(
            pa.array([_arrowable(d) for d in docs], st))], schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError,
            decimal.InvalidOperation):
        pass
    for d in docs:  # the slow path only to name what failed
        bad = _mismatch(d, st, "")
        if bad:
            path, v = bad
            t = schema.field(path.split(".")[0]).type if path.split(".")[0] in schema.names \
                else st
            raise errors.SchemaMismatch(
                f"{_doc_path(d)}: field {path} = {v!r:.60} does not fit the column type "
                f"({_describe(_type_at(st, path) or t)}); pass schema= with a type that "
                "holds it", field=path)
    raise errors.SchemaMismatch("documents do not fit the schema")  # not reached in practice


def _fits_decimal(d: decimal.Decimal, t) -> bool:
    try:
        return d.is_finite() and d == d.quantize(decimal.Decimal(1).scaleb(-t.scale)) and \
            len(d.quantize(decimal.Decimal(1).scaleb(-t.scale)).as_tuple().digits) <= t.precision
    except decimal.InvalidOperation:
        return False


def _arrowable(v):
    """A stored value as pyarrow converts it (ObjectId and UUID as text)."""
    t = type(v)
    if t is dict:
        return {k: _arrowable(x) for k, x in v.items()}
    if t is list or t is tuple:
        return [_arrowable(x) for x in v]
    if t is ObjectId or t is uuid.UUID or t is Code:
        return str(v)
    if t is Decimal128:
        return v.to_decimal()
    if t is Int64:
        return int(v)
    if t in _AS_JSON:
        return to_json(v)
    return v


def _flat(t: pa.DataType) -> bool:
    """No struct anywhere in ``t``: a document fits it if its top-level fields do."""
    if pa.types.is_struct(t):
        return False
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _flat(t.value_type)
    return True


def _type_at(st: pa.DataType, path: str):
    t = st
    for p in path.split("."):
        if pa.types.is_struct(t) and t.get_field_index(p) >= 0:
            t = t.field(p).type
        elif pa.types.is_list(t) and p.isdigit():
            t = t.value_type
        else:
            return None
    return t


def _describe(t: pa.DataType) -> str:
    return str(t).replace("int64", "long").replace("large_", "")


# --- Arrow -> documents ------------------------------------------------------
def check_writable(schema: pa.Schema) -> None:
    """Refuse, naming the column, any Arrow type that has no document value."""
    for f in schema:
        _check_type(f.type, f.name)


def _check_type(t: pa.DataType, path: str) -> None:
    if (pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_floating(t)
            or pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_null(t) or pa.types.is_timestamp(t)
            or pa.types.is_date(t) or pa.types.is_decimal(t)):
        return
    if pa.types.is_struct(t):
        for i in range(t.num_fields):
            _check_type(t.field(i).type, f"{path}.{t.field(i).name}")
        return
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        _check_type(t.value_type, f"{path}[]")
        return
    if pa.types.is_map(t):
        if not (pa.types.is_string(t.key_type) or pa.types.is_large_string(t.key_type)):
            raise errors.InvalidDocument(f"column {path}: a map needs string keys to become a "
                                         f"document, got {t.key_type}", field=path)
        _check_type(t.item_type, f"{path}[]")
        return
    raise errors.InvalidDocument(
        f"column {path} has type {t}, which documents cannot hold (supported: boolean, "
        f"integers, float/double, string, binary, struct, array, map with string keys, "
        f"timestamp, date, decimal); cast it to a supported type", field=path)


def _clean(v, keep_nulls: bool, maps: bool):
    t = type(v)
    if t is datetime.date:
        return datetime.datetime(v.year, v.month, v.day)
    if t is decimal.Decimal:
        return Decimal128(v)
    if t is dict:
        return {k: _clean(x, keep_nulls, maps) for k, x in v.items()
                if keep_nulls or x is not None}
    if t is list:
        if maps and v and all(type(x) is tuple and len(x) == 2 for x in v):
            return {k: _clean(x, keep_nulls, maps) for k, x in v
                    if keep_nulls or x is not None}
        return [_clean(x, keep_nulls, maps) for x in v]
    return v


def table_to_docs(table: pa.Table, keep_nulls: bool = False) -> list[dict]:
    """Documents for Arrow rows (null fields left out unless ``keep_nulls``)."""
    check_writable(table.schema)
    maps = any(_has_map(f.type) for f in table.schema)
    if not table.num_columns:
        return [{} for _ in range(table.num_rows)]
    # one C++ pass building the dicts (Table.to_pylist builds them in Python)
    rows = pa.StructArray.from_arrays([c.combine_chunks() for c in table.columns],
                                      fields=list(table.schema)).to_pylist()
    if not maps and all(map(_flat, table.schema.types)) and not any(map(_converted,
                                                                         table.schema.types)):
        if keep_nulls or not any(c.null_count for c in table.columns):
            return rows  # nothing to clean
        return [{k: v for k, v in r.items() if v is not None} for r in rows]
    return [_clean(r, keep_nulls, maps) for r in rows]


def _converted(t) -> bool:
    """A column whose values are not stored as Arrow gives them (date, decimal)."""
    if pa.types.is_date(t) or pa.types.is_decimal(t):
        return True
    if pa.types.is_struct(t):
        return any(_converted(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        return _converted(t.value_type if not pa.types.is_map(t) else t.item_type)
    return False


def _has_map(t) -> bool:
    if pa.types.is_map(t):
        return True
    if pa.types.is_struct(t):
        return any(_has_map(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _has_map(t.value_type)
    return False


# --- JSON for the change stream -------------------------------------------
def _json_default(v):
    if type(v) is Binary and v.subtype != 0:  # canonical extended JSON keeps the subtype
        return {"$binary": {"base64": base64.b64encode(v).decode(), "subType": f"{v.subtype:02x}"}}
    if isinstance(v, (bytes, bytearray)):
        return {"$binary": base64.b64encode(bytes(v)).decode()}
    if isinstance(v, datetime.datetime):  # MongoDB's extended JSON
        return {"$date": v.isoformat(timespec="milliseconds") + "Z"}
    if type(v) is ObjectId:
        return {"$oid": str(v)}
    if type(v) is Decimal128:
        return {"$numberDecimal": str(v)}
    if type(v) is uuid.UUID:
        return {"$uuid": str(v)}
    if type(v) in _AS_JSON:  # {"$timestamp": ...}, {"$regularExpression": ...}, {"$minKey": 1}
        return json_util.default(v)
    raise TypeError(f"{type(v).__name__} is not a document value")


def to_json(v) -> str | None:
    """JSON text of a stored value: binary as {"$binary": base64}, NaN/Infinity
    as JSON5-style tokens Spark's JSON functions accept; None stays None."""
    if v is None:
        return None
    return _JSON(v)


def _json_encoder():
    """One encoder for every value: ``json.dumps`` with options builds an
    encoder per call, and ``JSONEncoder.encode`` the C one per call."""
    from json import encoder as E
    if E.c_make_encoder is not None:
        c = E.c_make_encoder(None, _json_default, E.c_encode_basestring, None, ":", ",",
                             False, False, True)  # no circularity check: documents are trees
        return lambda v: "".join(c(v, 0))
    return json.JSONEncoder(default=_json_default, separators=(",", ":"),
                            ensure_ascii=False).encode


_JSON = _json_encoder()


def id_text(v) -> str | None:
    """An ``_id`` as a string column: a string ``_id`` as itself, anything else
    as its JSON text (so ``5`` -> ``"5"``: cast a long ``_id`` to string to join)."""
    if v is None or type(v) is str:
        return v
    if type(v) is int or type(v) is Int64:
        return str(int(v))  # its JSON text
    return to_json(v)


# --- the change stream as rows --------------------------------------------
CHANGES_SCHEMA = pa.schema([
    ("gtid", pa.string()),        # "term:seq"
    ("term", pa.int64()),
    ("seq", pa.int64()),          # dense across terms: order by (seq, idx)
    ("idx", pa.int32()),          # the op's position inside its entry (transaction)
    # the entry's commit time (ms precision; microseconds: the unit Spark reads)
    ("ts", pa.timestamp("us", tz="UTC")),
    ("op", pa.string()),          # i (insert), u (update), d (delete), c (command)
    ("ns", pa.string()),          # "db.collection"
    ("_id", pa.string()),         # a string _id as is, any other as its JSON text
    ("pre", pa.string()),         # JSON of the image before (u, d), else null
    ("post", pa.string()),        # JSON of the image after (i, u), else null
    ("cmd", pa.string()),         # JSON of a command op (c), else null
    ("replace", pa.bool_()),      # true: the update (u) replaced the whole document
    # a driver transaction's changes (the wire port's): its session id and number
    ("lsid", pa.binary()),
    ("txn_number", pa.int64()),
])


def changes_rows(entries, ns_filter=None) -> pa.Table:
    """Arrow rows for ``[(gtid bytes, ts, ops)]`` (``ops``: a list, or packed):
    one per op, no-ops left out; built a column at a time per entry."""
    gtid, term, seq, idx, tss, kind, nss, ids, pre, post, cmd, rep, lsid, txn = (
        [] for _ in range(14))
    for k, ts, ops in entries:
        if type(ops) is not list:
            ops = codec.unpack(ops, "oplog ops")
        sel = [(i, op) for i, op in enumerate(ops) if op.get("op") != "n"
               and (ns_filter is None or op.get("ns") in ns_filter)]
        n = len(sel)
        if not n:
            continue
        session = changes.session_of(ops) if len(ops) > 1 else None  # as the live stream
        if session is not None and not isinstance(session[0], (bytes, bytearray)):
            session = None  # (the wire port's session ids are binary)
        lsid += [None if session is None else bytes(session[0])] * n
        txn += [None if session is None else int(session[1] or 0)] * n
        g = GTID.from_bytes(k)
        gtid += [str(g)] * n
        term += [g.term] * n
        seq += [g.seq] * n
        tss += [ts * 1000] * n
        idx += [i for i, _ in sel]
        ops = [op for _, op in sel]
        kind += [op.get("op") for op in ops]
        nss += [op.get("ns") for op in ops]
        pr = [op.get("pre") for op in ops]
        po = [op.get("post") for op in ops]
        ids += [None if img is None else id_text(img.get("_id"))
                for img in (b if b is not None else a for a, b in zip(pr, po))]
        pre += map(to_json, pr)
        post += map(to_json, po)
        cmd += [to_json({x: v for x, v in op.items() if x not in ("op", "ns")})
                if op.get("op") == "c" else None for op in ops]
        rep += [op.get("r") if op.get("op") == "u" else None for op in ops]
    cols = (gtid, term, seq, idx, tss, kind, nss, ids, pre, post, cmd, rep, lsid, txn)
    return pa.Table.from_arrays([pa.array(c, f.type) for c, f in zip(cols, CHANGES_SCHEMA)],
                                schema=CHANGES_SCHEMA)
