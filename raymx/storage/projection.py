"""Projections (pure): which fields of a document a find or a ``$project``
returns. ``{path: 0|1}``, a list of paths, ``$slice``, ``$elemMatch`` and
the positional ``{"arr.$": 1}`` (its element from the find's filter,
``query.matched_element``, as the positional ``$`` of updates). Paths are
``query``'s: dotted, walking dicts, and over an array of subdocuments each
subdocument's part.
"""
from __future__ import annotations

from typing import Any

from raymx.storage.errors import InvalidFilter
from raymx.storage.query import (_ARRAY, MISSING, _parts, _walk, compile_filter,
                                 field_conditions, get_path, matched_element)

Tree = dict  # field -> True (the whole field) or a subtree


def _projection(projection: Any) -> tuple[bool, Tree]:
    """(inclusion?, tree of paths) for a validated projection."""
    if isinstance(projection, _ARRAY):
        projection = {p: 1 for p in projection}
    if not isinstance(projection, dict):
        raise InvalidFilter(f"a projection must be a dict or a list of paths, "
                            f"got {type(projection).__name__}")
    spec: dict[str, bool] = {}
    for path, flag in projection.items():
        _parts(path)
        if type(flag) not in (bool, int, float) or flag not in (0, 1):
            raise InvalidFilter(f"projection of {path!r} must be 0, 1, true or false, "
                                f"got {flag!r:.40}")
        spec[path] = bool(flag)
    modes = [flag for path, flag in spec.items() if path != "_id"]
    include = modes[0] if modes else spec.get("_id", True)
    for path, flag in spec.items():
        if path != "_id" and flag != include:
            raise InvalidFilter(  # MongoDB's words (its codes 31253/31254)
                f"Cannot do {'exclusion' if include else 'inclusion'} on field {path} in "
                f"{'inclusion' if include else 'exclusion'} projection (a projection cannot "
                "mix them, except for _id)")
    if include and not any(p == "_id" or p.startswith("_id.") for p in spec):
        spec["_id"] = True
    tree: Tree = {}
    for path in sorted(p for p, flag in spec.items() if flag == include):
        *head, last = path.split(".")
        node = tree
        for p in head:
            node = node.setdefault(p, {})
            if node is True:
                raise InvalidFilter(f"projection path {path!r} collides with a parent path")
        if last in node:
            raise InvalidFilter(f"projection path {path!r} collides with a sub-path")
        node[last] = True
    return include, tree


def _include(d: dict, tree: Tree) -> dict:
    out = {}
    for k, v in d.items():
        t = tree.get(k)
        if t is True:
            out[k] = v
        elif t is not None and isinstance(v, dict):
            out[k] = _include(v, t)
        elif t is not None and isinstance(v, _ARRAY):  # the path fans out over its subdocuments
            out[k] = [_include(x, t) for x in v if isinstance(x, dict)]
    return out


def _exclude(d: dict, tree: Tree) -> dict:
    out = {}
    for k, v in d.items():
        t = tree.get(k)
        if t is None:
            out[k] = v
        elif t is not True:
            if isinstance(v, dict):
                out[k] = _exclude(v, t)
            elif isinstance(v, _ARRAY):
                out[k] = [_exclude(x, t) if isinstance(x, dict) else x for x in v]
            else:
                out[k] = v
    return out


def nested_as_paths(projection: dict, prefix: str = "", empty_ok: bool = False) -> dict:
    """A projection's sub-objects that are no operator (``{a: {b: 1}}``, not
    ``{a: {$slice: 2}}``) as dotted paths (``{"a.b": 1}``), as MongoDB reads
    them (in finds, ``$project`` and ``$addFields``); an empty one is
    refused, as MongoDB refuses it, unless ``empty_ok`` (``$addFields``: the
    value ``{}``)."""
    out = {}
    for k, v in projection.items():
        path = f"{prefix}{k}"
        if type(v) is dict and not v:
            if not empty_ok:
                raise InvalidFilter("An empty sub-projection is not a valid value. Found "
                                    f"empty object at path {path}")
            out[path] = v
        elif type(v) is dict and not str(next(iter(v))).startswith("$"):
            out.update(nested_as_paths(v, path + ".", empty_ok))
        else:
            out[path] = v
    return out


def project(doc: dict, projection: Any, flt: dict | None = None) -> dict:
    """A new dict with the projected fields of ``doc``, in the document's field order.

    ``projection`` is None (everything), ``{path: 0|1|True|False}`` or a list
    of paths to include. ``_id`` is kept unless excluded. Dotted paths walk
    dicts only; ``{"a.b": 1}`` keeps ``a: {}`` when ``a`` is a dict without
    ``b``; over an array of subdocuments it keeps each subdocument's part, as
    MongoDB does. Values are shared with ``doc``, not copied. ``flt``: the
    find's filter, which a positional projection (``{"arr.$": 1}``) needs.
    """
    if projection is None:
        return dict(doc)
    if isinstance(projection, dict):
        positional = [p for p in projection if isinstance(p, str) and p.endswith(".$")]
        if positional:
            return _project_positional(doc, projection, positional, flt)
        if any(type(v) is dict for v in projection.values()):
            if any(type(v) is dict and not (v and str(next(iter(v))).startswith("$"))
                   for v in projection.values()):
                return project(doc, nested_as_paths(projection), flt)
            return _project_with_operators(doc, projection)
    include, tree = _projection(projection)
    if not projection:
        return dict(doc)
    return _include(doc, tree) if include else _exclude(doc, tree)


def _project_positional(doc: dict, projection: dict, positional: list[str],
                        flt: dict | None) -> dict:
    """``{"arr.$": 1, ...}``: the array with only its first element through
    which the find's filter matches, as MongoDB's positional projection (an
    inclusion; the filter must have a condition on the array's field)."""
    path = positional[0][:-2]
    parts = _parts(path)
    if len(positional) > 1 or "$" in parts or type(projection[positional[0]]) is dict \
            or projection[positional[0]] not in (1, True):
        raise InvalidFilter(f"a projection takes one positional operator, at the end of an "
                            f"included path ('arr.$': 1), not {projection!r:.80}")
    if flt is None or not any(k == path or k.startswith(path + ".")
                              for k, _ in field_conditions(flt)):
        raise InvalidFilter(f"positional projection {path + '.$'!r} needs a find whose filter "
                            f"has a condition on {path!r}")
    rest = {k: v for k, v in projection.items() if k != positional[0]}
    out = project(doc, {**rest, path: 1})
    i = matched_element(doc, parts, compile_filter(flt))
    if i is None:
        if isinstance(_walk(doc, parts), _ARRAY):
            raise InvalidFilter(f"positional projection {path + '.$'!r}: no element of the "
                                "array matches the filter")
        return out  # not an array: the field as it is (or absent)
    node = out
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            raise InvalidFilter(f"positional projection {path + '.$'!r}: the path goes "
                                "through an array before the projected one")
        node[p] = node = dict(node[p])
    node[parts[-1]] = [_walk(doc, parts)[i]]
    return out


def _projection_operators(projection: dict) -> tuple[dict, dict]:
    """(the 0/1 part, {path: ("slice", arg) | ("elem", test)}) of a projection
    with ``$slice`` or ``$elemMatch``."""
    plain, ops = {}, {}
    for path, v in projection.items():
        if type(v) is not dict:
            plain[path] = v
            continue
        _parts(path)
        if len(v) != 1 or next(iter(v)) not in ("$slice", "$elemMatch"):
            raise InvalidFilter(f"projection of {path!r}: raymx's projections take 0, 1, "
                                f"$slice and $elemMatch, not {v!r:.60}")
        op, arg = next(iter(v.items()))
        if op == "$slice":
            ok = type(arg) is int or (isinstance(arg, _ARRAY) and len(arg) == 2 and all(
                type(x) is int for x in arg) and arg[1] > 0)
            if not ok:
                raise InvalidFilter(f"$slice of {path!r} takes a count or [skip, positive "
                                    f"count], not {arg!r:.40}")
            ops[path] = ("slice", arg)
        else:
            if "." in path:
                raise InvalidFilter(f"$elemMatch projection of {path!r}: top-level fields only")
            if not isinstance(arg, dict):
                raise InvalidFilter(f"$elemMatch of {path!r} takes a filter document")
            test = compile_filter({"x": {"$elemMatch": arg}})
            ops[path] = ("elem", lambda x, t=test: t({"x": [x]}))
    return plain, ops


def _project_with_operators(doc: dict, projection: dict) -> dict:
    """A projection with ``$slice`` (an array's first or last n elements, or
    [skip, n]) or ``$elemMatch`` (an array's first element matching a filter,
    as a one-element array; the field is left out if none does), as
    MongoDB's: ``$elemMatch`` includes its field; ``$slice`` includes it
    beside other included fields, and keeps every field otherwise."""
    plain, ops = _projection_operators(projection)
    inclusion = any(flag for p, flag in plain.items() if p != "_id") or any(
        kind == "elem" for kind, _ in ops.values())
    base = dict(plain, **{p: 1 for p in ops}) if inclusion else plain
    out = project(doc, base) if base else dict(doc)
    for path, (kind, arg) in ops.items():
        v = get_path(doc, path)
        if not isinstance(v, _ARRAY):
            if kind == "elem":
                out.pop(path, None)
            continue
        if kind == "elem":
            hit = next((x for x in v if arg(x)), MISSING)
            if hit is MISSING:
                out.pop(path, None)
            else:
                out[path] = [hit]
            continue
        if type(arg) is int:
            part = list(v[:arg]) if arg >= 0 else list(v[arg:])
        else:
            skip, n = arg
            start = skip if skip >= 0 else max(len(v) + skip, 0)
            part = list(v[start:start + n])
        *head, last = path.split(".")
        node = out
        for p in head:  # copied on the way: the projection shares values with doc
            if not isinstance(node.get(p), dict):
                break
            node[p] = node = dict(node[p])
        else:
            if last in node:
                node[last] = part
    return out
