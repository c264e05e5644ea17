"""Update documents: $operators, full replacement and the upsert seed.

``apply_update`` never mutates its input. It copies the dicts and lists on
the paths it changes and shares every untouched sub-object with the input, so
treat both documents as immutable afterwards (or deep-copy one).

Paths are dotted as in ``query``: a decimal component indexes a list
(``$set`` past the end pads with None, ``$unset`` of an element sets it to
None). Positional components are resolved against the document before the
update, into plain paths (``_positional``), as MongoDB does: ``$`` is the
first element of that array the statement's filter matched through, ``$[]``
every element, ``$[name]`` every element that ``array_filters``' filter on
``name`` matches.
"""
from __future__ import annotations

import re
import time
from typing import Any, Callable

from bson import Decimal128, Int64, Timestamp

from raymx.storage import numbers, types
from raymx.storage.errors import (ConflictingUpdateOperators, ImmutableField, InvalidDocument,
                                  InvalidFilter, InvalidUpdate, PathNotViable, TypeMismatch,
                                  UpdateBadValue, UpdateOverflow)
from raymx.storage.keys import encode_key
from raymx.storage.query import (MISSING, _is_regex, compile_filter, field_conditions,
                                 get_path, matched_element, sorted_values)

_ARRAY = (list, tuple)
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1  # what codec stores
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1  # a BSON long (Int64)
_PAD_MAX = 100_000  # the furthest past a list's end a $set may write
_LOGICAL = {"$and", "$or", "$nor"}

Container = dict | list
Loc = tuple[Container, Any]  # (container, key or list index)


def is_operator_update(u: Any) -> bool:
    """Whether ``u`` uses $operators (else it is a replacement document)."""
    return isinstance(u, dict) and any(isinstance(k, str) and k.startswith("$") for k in u)


def _fresh(v: Any, where: str) -> Any:
    """A deep copy of a value from the caller, checking its field names."""
    if isinstance(v, dict):
        out = {}
        for k, x in v.items():
            if not isinstance(k, str):
                raise InvalidUpdate(f"{where}: field name {k!r} is not a string")
            if k.startswith("$"):
                raise InvalidUpdate(f"{where}: field name {k!r} may not start with '$'")
            out[k] = _fresh(x, where)
        return out
    if isinstance(v, _ARRAY):
        return [_fresh(x, where) for x in v]
    return v


def _key(v: Any, where: str) -> bytes:
    try:
        return encode_key(v)
    except InvalidDocument as e:
        raise InvalidUpdate(f"{where}: {e.msg}") from None


def _split(op: str, path: Any) -> list[str]:
    if not isinstance(path, str) or not path:
        raise InvalidUpdate(f"{op}: field path {path!r} must be a non-empty string", operator=op)
    parts = path.split(".")
    if not all(parts):
        raise InvalidUpdate(f"{op} {path!r}: the path has an empty component", operator=op,
                            field=path)
    bad = next((p for p in parts if p.startswith("$") and not _POSITIONAL.fullmatch(p)), None)
    if bad is not None:
        raise InvalidUpdate(f"{op} {path!r}: field names may not start with '$' ({bad!r} is "
                            "not a positional operator: $, $[] or $[name])", operator=op,
                            field=path)
    return parts


# --- positional operators ---------------------------------------------------------
_IDENT = r"[a-z][a-zA-Z0-9]*"  # an array filter's identifier, as MongoDB's
_POSITIONAL = re.compile(rf"\$(\[({_IDENT})?\])?")


class Positional:
    """A statement's filter (the positional ``$``) and array filters
    (``$[name]``), compiled once, at first use, for every document the
    statement updates."""

    def __init__(self, flt: dict | None = None, array_filters: list | None = None):
        self.flt, self.array_filters = flt, array_filters
        self._filters: dict | None = None
        self._match: Callable[[dict], bool] | None = None
        # (update, its steps) once an update without positional paths was
        # checked: the same for every document, so not parsed again
        self.plan: tuple[dict, list] | None = None

    def filters(self) -> dict[str, Callable[[Any], bool]]:
        if self._filters is None:
            self._filters = _array_filters(self.array_filters)
        return self._filters

    def match(self) -> Callable[[dict], bool]:
        if self._match is None:
            self._match = compile_filter(self.flt)
        return self._match


def _array_filters(array_filters) -> dict[str, Callable[[Any], bool]]:
    """name -> whether an element matches its filter (``{"name": cond}`` or
    ``{"name.field": cond, ...}``), each filter naming one identifier."""
    if array_filters is None:
        return {}
    if not isinstance(array_filters, _ARRAY):
        raise InvalidUpdate("arrayFilters must be a list of filters")
    out = {}
    for f in array_filters:
        if not isinstance(f, dict) or not f:
            raise InvalidUpdate(f"an array filter must be a non-empty dict, got {f!r:.60}")
        names = {k.split(".", 1)[0] for k in f if isinstance(k, str) and not k.startswith("$")}
        if len(names) != 1 or any(not isinstance(k, str) or k.startswith("$") for k in f):
            raise InvalidUpdate(f"an array filter must name one identifier, not {f!r:.60}")
        (name,) = names
        if not re.fullmatch(_IDENT, name):
            raise InvalidUpdate(f"the array filter identifier {name!r} must begin with a "
                                "lowercase letter and hold only letters and digits")
        if name in out:
            raise InvalidUpdate(f"two array filters for the identifier {name!r}")
        try:
            m = compile_filter(f)
        except InvalidFilter as e:
            raise InvalidUpdate(f"array filter {name!r}: {e.msg}") from None
        out[name] = (lambda m, name: lambda x: m({name: x}))(m, name)
    return out


def _match_index(doc: dict, head: list[str], pos: Positional, where: str) -> int:
    """The first element of the array at ``head`` through which the statement's
    filter matches ``doc`` (the positional ``$``)."""
    dotted = ".".join(head)
    arr = get_path(doc, dotted)
    if pos.flt is None or not any(k == dotted or k.startswith(dotted + ".")
                                  for k, _ in field_conditions(pos.flt)) \
            or not isinstance(arr, _ARRAY):
        raise UpdateBadValue(f"{where}: the positional operator did not find the match needed "
                             "from the query (filter on the array's field)")
    i = matched_element(doc, head, pos.match())
    if i is not None:
        return i
    raise UpdateBadValue(f"{where}: the positional operator did not find the match needed "
                         "from the query")


def _positional(doc: dict, op: str, path: str, parts: list[str], pos: Positional,
                used: set) -> list[list[str]]:
    """``parts`` with every positional component replaced by the element
    indexes it stands for in ``doc`` (before the update): one plain path per
    combination, none if an array holds no element that matches."""
    at = next((i for i, p in enumerate(parts) if p.startswith("$")), None)
    if at is None:
        return [parts]
    where, head, p = _where(op, path), parts[:at], parts[at]
    if p == "$":
        idx = [_match_index(doc, head, pos, where)]
    else:
        arr = get_path(doc, ".".join(head))
        if not isinstance(arr, _ARRAY):  # the document's content, not the update: BadValue
            raise UpdateBadValue(
                f"{where}: the path {'.'.join(head)!r} must exist in the document in order to "
                "apply array updates" if arr is MISSING else f"{where}: cannot apply array "
                f"updates to non-array element {'.'.join(head)}: {arr!r:.100}",
                operator=op, field=path)
        name, filters = p[2:-1], pos.filters()
        if not name:
            idx = list(range(len(arr)))
        elif name not in filters:
            raise InvalidUpdate(f"{where}: no array filter found for identifier {name!r}",
                                operator=op, field=path)
        else:
            used.add(name)
            idx = [i for i, el in enumerate(arr) if filters[name](el)]
    out = []
    for i in idx:
        out += _positional(doc, op, path, head + [str(i)] + parts[at + 1:], pos, used)
    return out


# --- copy-on-write access to the new document --------------------------------
def _index(cur: Container, p: str) -> Any:
    """The key for ``p`` in ``cur``: the name, a list index, or None if a list cannot take it."""
    if isinstance(cur, dict):
        return p
    return int(p) if p.isascii() and p.isdigit() else None


def _get(c: Container, k: Any) -> Any:
    if isinstance(c, dict):
        return c.get(k, MISSING)
    return c[k] if k < len(c) else MISSING


def _put(c: Container, k: Any, v: Any, where: str) -> None:
    if isinstance(c, dict):
        c[k] = v
        return
    if k >= len(c):
        if k - len(c) > _PAD_MAX:
            raise InvalidUpdate(f"{where}: index {k} is too far past the end of the array")
        c.extend([None] * (k + 1 - len(c)))
    c[k] = v


def _delete(c: Container, k: Any) -> None:
    if isinstance(c, dict):
        c.pop(k, None)
    elif k < len(c):
        c[k] = None


class _Cow:
    """The new document; containers are copied the first time a path goes through them."""

    def __init__(self, doc: dict):
        self.root: dict = dict(doc)
        self._own: dict[int, Container] = {id(self.root): self.root}  # keeps ids unique
        self.inserting = False  # an upsert's insert ($setOnInsert)

    def _owned(self, c: Container) -> bool:
        return self._own.get(id(c)) is c

    def loc(self, where: str, parts: list[str], create: bool) -> Loc | None:
        """(container, key) of the last component; None if absent and not ``create``."""
        cur: Container = self.root
        for i, p in enumerate(parts):
            k = _index(cur, p)
            if k is None:
                if not create:
                    return None
                raise InvalidUpdate(f"{where}: cannot use {p!r} to index an array")
            if i == len(parts) - 1:
                return cur, k
            nxt = _get(cur, k)
            if isinstance(nxt, (dict, *_ARRAY)):
                if not self._owned(nxt):
                    nxt = dict(nxt) if isinstance(nxt, dict) else list(nxt)
                    _put(cur, k, nxt, where)
            elif nxt is MISSING and create:
                nxt = {}
                _put(cur, k, nxt, where)
            elif create:
                raise PathNotViable(f"{where}: {p!r} holds {nxt!r:.40}, which cannot have fields")
            else:
                return None
            self._own[id(nxt)] = nxt
            cur = nxt
        raise AssertionError("unreachable")


# --- operators -----------------------------------------------------------------
def _where(op: str, path: str) -> str:
    return f"{op} on {path!r}"


def _set(d: _Cow, op: str, path: str, parts: list[str], arg: Any) -> None:
    c, k = d.loc(_where(op, path), parts, True)
    _put(c, k, _fresh(arg, _where(op, path)), _where(op, path))


def _unset(d: _Cow, op: str, path: str, parts: list[str], arg: Any) -> None:
    loc = d.loc(_where(op, path), parts, False)
    if loc is not None:
        _delete(*loc)


def _arith(d: _Cow, op: str, path: str, parts: list[str], arg: Any) -> None:
    """$inc and $mul: a missing field counts as 0 (as MongoDB: it becomes 0
    of the factor's type for $mul); ints stay within 64 bits; a Decimal128 on
    either side makes the result a Decimal128 (34 digits, as BSON's)."""
    w = _where(op, path)
    if not numbers.is_number(arg):
        what = "increment" if op == "$inc" else "factor"
        raise TypeMismatch(f"{w}: the {what} must be a number, got {arg!r:.40}",
                           operator=op, field=path)
    c, k = d.loc(w, parts, True)
    cur = _get(c, k)
    if cur is MISSING:
        cur = 0
    elif not numbers.is_number(cur):
        raise TypeMismatch(f"{w}: the field holds a non-number {cur!r:.40}", operator=op,
                           field=path)
    if type(cur) is Decimal128 or type(arg) is Decimal128:
        _put(c, k, numbers.combine("add" if op == "$inc" else "mul", cur, arg), w)
        return
    new = cur + arg if op == "$inc" else cur * arg
    out = numbers.widened(new, cur, arg)
    if type(new) is int:
        long = type(out) is Int64  # a long among the operands makes the result one
        if not (_LONG_MIN <= new <= _LONG_MAX if long else _INT_MIN <= new <= _INT_MAX):
            # MongoDB's words and code (BadValue): nothing is changed
            shown = f"(NumberLong){cur}" if type(cur) is Int64 else repr(cur)
            raise UpdateOverflow(
                f"Failed to apply {op} operations to current value ({shown}) for document "
                f"{{_id: {d.root.get('_id')!r}}}: the result {new} does not fit in "
                f"{'a 64-bit signed integer (a long)' if long else '64 bits'}",
                operator=op, field=path)
    _put(c, k, out, w)


def _pop(d: _Cow, op: str, path: str, parts: list[str], arg: Any) -> None:
    if arg not in (1, -1) or type(arg) is bool:
        raise InvalidUpdate(f"{_where(op, path)}: $pop needs 1 (last) or -1 (first)",
                            operator=op, field=path)
    found = _array(d, op, path, parts, False)
    if found is not None:
        (c, k), cur = found
        _put(c, k, cur[:-1] if arg == 1 else cur[1:], _where(op, path))


def _set_on_insert(d: _Cow, op: str, path: str, parts: list[str], arg: Any) -> None:
    if d.inserting:
        _set(d, op, path, parts, arg)


def _min_max(d: _Cow, op: str, path: str, parts: list[str], arg: Any) -> None:
    w = _where(op, path)
    new = _fresh(arg, w)
    c, k = d.loc(w, parts, True)
    cur = _get(c, k)
    if cur is MISSING:
        _put(c, k, new, w)
        return
    kn, kc = _key(new, w), _key(cur, w)
    if (kn < kc) if op == "$min" else (kn > kc):
        _put(c, k, new, w)


def _each(op: str, path: str, arg: Any, modifiers: set[str]) -> tuple[list, dict]:
    """(items, modifiers) of a $push/$addToSet argument."""
    w = _where(op, path)
    if isinstance(arg, dict) and any(isinstance(k, str) and k.startswith("$") for k in arg):
        if "$each" not in arg:
            raise InvalidUpdate(f"{w}: modifiers need $each", operator=op, field=path)
        bad = set(arg) - {"$each"} - modifiers
        if bad:
            raise InvalidUpdate(f"{w}: unknown modifier {sorted(map(str, bad))[0]}",
                                operator=op, field=path)
        if not isinstance(arg["$each"], _ARRAY):
            raise InvalidUpdate(f"{w}: $each needs a list", operator=op, field=path)
        for m in modifiers & set(arg):
            if not numbers.is_int(arg[m]):
                raise InvalidUpdate(f"{w}: {m} needs an integer", operator=op, field=path)
        return _fresh(arg["$each"], w), arg
    return [_fresh(arg, w)], {}


def _array(d: _Cow, op: str, path: str, parts: list[str], create: bool) -> tuple[Loc, list] | None:
    w = _where(op, path)
    loc = d.loc(w, parts, create)
    if loc is None:
        return None
    cur = _get(*loc)
    if cur is MISSING:
        return (loc, []) if create else None
    if not isinstance(cur, _ARRAY):
        raise UpdateBadValue(f"{w}: the field holds a non-array {cur!r:.40}", operator=op,
                             field=path)
    return loc, list(cur)


def _push(d: _Cow, op: str, path: str, parts: list[str], arg: Any) -> None:
    sort = arg.get("$sort") if isinstance(arg, dict) and "$sort" in arg else None
    if sort is not None:  # checked apart: not an integer modifier
        arg = {m: v for m, v in arg.items() if m != "$sort"}
    items, mods = _each(op, path, arg, {"$position", "$slice"})
    (c, k), cur = _array(d, op, path, parts, True)
    pos = mods.get("$position", len(cur))
    new = cur[:pos] + items + cur[pos:]
    if sort is not None:
        new = _sorted_elements(new, sort, _where(op, path), path)
    if "$slice" in mods:
        n = mods["$slice"]
        new = new[:n] if n >= 0 else new[n:]
    _put(c, k, new, _where(op, path))


def _sorted_elements(arr: list, sort: Any, w: str, path: str) -> list:
    """``$push``'s ``$sort``: 1 or -1 sorts the elements by raymx's order of
    values; ``{field: 1 | -1, ...}`` sorts subdocuments by those fields."""
    out = sorted_values(arr, sort)
    if out is None:
        raise InvalidUpdate(f"{w}: $sort needs 1, -1 or {{field: 1 | -1}}", operator="$push",
                            field=path)
    return out


def _pull_all(d: _Cow, op: str, path: str, parts: list[str], arg: Any) -> None:
    w = _where(op, path)
    if not isinstance(arg, _ARRAY):
        raise InvalidUpdate(f"{w}: $pullAll needs a list of values", operator=op, field=path)
    gone = {_key(x, w) for x in arg}
    found = _array(d, op, path, parts, False)
    if found is not None:
        (c, k), cur = found
        _put(c, k, [x for x in cur if encode_key(x) not in gone], w)


def _bit(d: _Cow, op: str, path: str, parts: list[str], arg: Any) -> None:
    w = _where(op, path)
    if not isinstance(arg, dict) or not arg or set(arg) - {"and", "or", "xor"} or not all(
            numbers.is_int(v) for v in arg.values()):
        raise InvalidUpdate(f"{w}: $bit needs {{and|or|xor: integer}}", operator=op, field=path)
    c, k = d.loc(w, parts, True)
    cur = _get(c, k)
    cur = 0 if cur is MISSING else cur
    if not numbers.is_int(cur):
        raise TypeMismatch(f"{w}: the field holds a non-integer {cur!r:.40}", operator=op,
                           field=path)
    new = cur
    for how, v in arg.items():
        new = new & v if how == "and" else new | v if how == "or" else new ^ v
    _put(c, k, numbers.widened(int(new), cur, *arg.values()), w)


_last_ts = [0, 0]


def _timestamp_now() -> Timestamp:
    """A BSON Timestamp of the primary's clock: its seconds and an increment
    that grows within a second (``$currentDate``'s ``{$type: "timestamp"}``;
    MongoDB takes the operation's oplog time, which is ordered the same way).
    Only the member's writer thread applies updates."""
    secs = int(time.time())
    _last_ts[:] = [secs, _last_ts[1] + 1] if secs <= _last_ts[0] else [secs, 1]
    return Timestamp(*_last_ts)


def _current_date(d: _Cow, op: str, path: str, parts: list[str], arg: Any) -> None:
    """The primary's clock, to the millisecond (BSON's precision), or as a
    Timestamp; the oplog carries the value, so every member stores the same
    one."""
    w = _where(op, path)
    if isinstance(arg, bool) or arg == {"$type": "date"}:
        value: Any = types.now()
    elif arg == {"$type": "timestamp"}:
        value = _timestamp_now()
    else:
        raise InvalidUpdate(f"{w}: $currentDate takes a boolean, {{$type: 'date'}} or "
                            f"{{$type: 'timestamp'}}, not {arg!r:.60}", operator=op, field=path)
    c, k = d.loc(w, parts, True)
    _put(c, k, value, w)


def _add_to_set(d: _Cow, op: str, path: str, parts: list[str], arg: Any) -> None:
    items, _ = _each(op, path, arg, set())
    (c, k), cur = _array(d, op, path, parts, True)
    seen = {_key(x, _where(op, path)) for x in cur}
    for x in items:
        kx = _key(x, _where(op, path))
        if kx not in seen:
            seen.add(kx)
            cur.append(x)
    _put(c, k, cur, _where(op, path))


def _pull_match(op: str, path: str, arg: Any) -> Callable[[Any], bool]:
    """Which elements ``$pull`` removes: equal ones, or ones matching a condition."""
    w = _where(op, path)
    if not isinstance(arg, dict) or not arg:
        k = _key(arg, w)
        return lambda x: encode_key(x) == k
    try:
        names = [k for k in arg if isinstance(k, str)]
        if len(names) == len(arg) and all(k.startswith("$") and k not in _LOGICAL for k in names):
            m = compile_filter({"v": arg})  # an operator condition on each element
            return lambda x: m({"v": x})
        sub = compile_filter(arg)  # a filter on subdocument elements
        return lambda x: isinstance(x, dict) and sub(x)
    except InvalidFilter as e:
        raise InvalidUpdate(f"{w}: {e.msg}", operator=op, field=path) from None


def _pull(d: _Cow, op: str, path: str, parts: list[str], arg: Any) -> None:
    match = _pull_match(op, path, arg)
    found = _array(d, op, path, parts, False)
    if found is not None:
        (c, k), cur = found
        _put(c, k, [x for x in cur if not match(x)], _where(op, path))


def _array_on(root: dict, parts: list[str]) -> str | None:
    """The first field of the path ``parts`` (up to its parent) that holds an
    array in ``root``, or None."""
    cur = root
    for i, p in enumerate(parts[:-1]):
        cur = cur.get(p, MISSING) if isinstance(cur, dict) else MISSING
        if isinstance(cur, _ARRAY):
            return ".".join(parts[:i + 1])
        if cur is MISSING:
            return None
    return None


def _rename(d: _Cow, op: str, path: str, parts: list[str], arg: Any) -> None:
    """As MongoDB: neither the source nor the destination may be inside an
    array (an element, or a field of elements), even when the source is
    missing there."""
    w = _where(op, path)
    dparts = _split(op, arg)
    for which, ps, shown in (("source", parts, path), ("destination", dparts, arg)):
        arr = _array_on(d.root, ps)
        if arr is not None:
            raise UpdateBadValue(f"{w}: the {which} field {shown!r} cannot be an array "
                                 f"element ({arr!r} holds an array)", operator=op, field=path)
    src = d.loc(w, parts, False)
    if src is None or _get(*src) is MISSING:
        return
    dst = d.loc(w, dparts, True)  # neither container is a list: no path met an array
    v = src[0].pop(src[1])
    _put(*dst, v, w)


_APPLY: dict[str, Callable[[_Cow, str, str, list[str], Any], None]] = {
    "$set": _set, "$unset": _unset, "$inc": _arith, "$min": _min_max, "$max": _min_max,
    "$push": _push, "$addToSet": _add_to_set, "$pull": _pull, "$rename": _rename,
    "$mul": _arith, "$pop": _pop, "$setOnInsert": _set_on_insert, "$pullAll": _pull_all,
    "$bit": _bit, "$currentDate": _current_date,
}


def _replace(doc: dict, repl: dict) -> dict:
    new = _fresh(repl, "replacement document")
    if "_id" in doc:
        if "_id" in new and _key(new["_id"], "_id") != _key(doc["_id"], "_id"):
            raise ImmutableField("a replacement may not change _id", field="_id")
        new.pop("_id", None)
        return {"_id": doc["_id"], **new}
    return {"_id": new.pop("_id"), **new} if "_id" in new else new


def apply_update(doc: dict, update: dict, inserting: bool = False, flt: dict | None = None,
                 array_filters: list | None = None, positional: Positional | None = None
                 ) -> dict:
    """The document after ``update`` ($operators, or a replacement that keeps ``_id``).
    ``inserting``: an upsert inserts ``doc`` (``$setOnInsert`` applies only then).
    ``flt``: the statement's filter (the positional ``$``); ``array_filters``:
    MongoDB's ``arrayFilters`` (``$[name]``), each of which must be used;
    ``positional``: both, compiled once for a statement's documents.

    Errors raise ``InvalidUpdate`` and leave ``doc`` untouched. Paths in one
    update must be disjoint (``a`` with ``a`` or ``a.b`` is a conflict, also
    across operators and with $rename's target). ``_id`` may not change (a
    ``$set`` to an equal value is a no-op; a ``doc`` without ``_id`` may gain one).
    """
    if not isinstance(update, dict):
        raise InvalidUpdate(f"an update must be a dict, got {type(update).__name__}")
    pos = positional or Positional(flt, array_filters)
    if pos.plan is not None and pos.plan[0] is update:
        return _applied(doc, inserting, pos.plan[1])
    if not is_operator_update(update):  # an empty one too: MongoDB's update {} replaces
        return _replace(doc, update)   # the document by its _id alone
    steps = []
    touched: list[tuple[list[str], str]] = []
    plain = True  # no positional path: the same steps for every document
    filters, used = pos.filters(), set()
    for op, args in update.items():
        if not isinstance(op, str) or not op.startswith("$"):
            raise InvalidUpdate(f"an update cannot mix $operators with plain fields ({op!r})",
                                field=op)
        if op not in _APPLY:
            raise InvalidUpdate(f"unknown update operator {op}", operator=op)
        if not isinstance(args, dict):
            raise InvalidUpdate(f"{op} needs a dict of field: value, got {type(args).__name__}",
                                operator=op)
        for path, arg in args.items():
            parts = _split(op, path)
            if op == "$rename" and any(p.startswith("$") for p in parts + _split(op, arg)):
                raise InvalidUpdate(f"$rename {path!r}: positional operators are not allowed",
                                    operator=op, field=path)
            plain = plain and not any(p.startswith("$") for p in parts)
            for parts in _positional(doc, op, path, parts, pos, used):
                touched.append((parts, f"{path!r} ({op})"))
                if op == "$rename":
                    touched.append((_split(op, arg), f"{arg!r} ({op} target)"))
                steps.append((op, ".".join(parts), parts, arg))
    unused = sorted(set(filters) - used)
    if unused:
        raise InvalidUpdate(f"the array filter for identifier {unused[0]!r} was not used in "
                            "the update")
    touched.sort(key=lambda t: t[0])
    for (a, wa), (b, wb) in zip(touched, touched[1:]):
        if b[:len(a)] == a:  # sorted, so any prefix pair also shows up as a neighbour pair
            raise ConflictingUpdateOperators(f"updating {wb} conflicts with {wa}")
    if plain and positional is not None:
        positional.plan = (update, steps)
    return _applied(doc, inserting, steps)


def _applied(doc: dict, inserting: bool, steps: list) -> dict:
    """``doc`` after an update's checked ``steps`` (op, path, parts, arg)."""
    d = _Cow(doc)
    d.inserting = bool(inserting)
    for op, path, parts, arg in steps:
        _APPLY[op](d, op, path, parts, arg)
    new = d.root
    if "_id" in doc:
        if "_id" not in new or _key(new["_id"], "_id") != _key(doc["_id"], "_id"):
            raise ImmutableField("an update may not change _id", field="_id")
        new["_id"] = doc["_id"]  # not even from 1 to 1.0
    return new


def upsert_seed(flt: dict | None) -> dict:
    """The document an upsert starts from: the filter's equality conditions.

    Top-level fields and members of a top-level ``$and`` (or of an ``$or`` of
    one clause), with a plain value, ``$eq``, or an ``$in`` or ``$all`` of one
    value (MongoDB reads those as equalities); dotted paths become nested
    dicts. A path given twice with
    different values, or as both ``a`` and ``a.b``, raises ``InvalidUpdate``.
    """
    compile_filter(flt)  # validates
    seed: dict = {}

    def put(path: str, v: Any) -> None:
        *head, last = path.split(".")
        node = seed
        for p in head:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise InvalidUpdate(f"upsert: {path!r} conflicts with another equality", field=path)
        v = _fresh(v, f"upsert field {path!r}")
        if last in node and _key(node[last], path) != _key(v, path):
            raise InvalidUpdate(f"upsert: {path!r} conflicts with another equality", field=path)
        node[last] = v

    for k, cond in field_conditions(flt or {}):
        first = next(iter(cond), None) if isinstance(cond, dict) else None
        if not (isinstance(first, str) and first.startswith("$")):
            put(k, cond)
        elif "$eq" in cond:
            put(k, cond["$eq"])
        else:
            one = next((cond[op] for op in ("$in", "$all") if isinstance(cond.get(op), list)
                        and len(cond[op]) == 1), None)
            v = one[0] if one is not None else None
            if one is not None and not _is_regex(v) and not (
                    isinstance(v, dict) and "$elemMatch" in v):
                put(k, v)
    return seed


__all__ = ["Positional", "apply_update", "is_operator_update", "upsert_seed"]
