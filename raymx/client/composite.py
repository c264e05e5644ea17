"""Operations the member has no request of its own for, built from the ones it
has; one piece of code shared by the native driver (``Collection.distinct``,
``Collection.find_one_and_*``) and the MongoDB wire port (``distinct``,
``findAndModify`` in raymx/wire/crud.py), so both answer alike.

- ``find_and_modify``: find the first match (in ``sort`` order), then update,
  replace or delete that document by its ``_id``: the member's ``find``,
  ``update`` and ``delete`` requests inside one member transaction (the
  caller opens and ends it), so no other write comes between the find and
  the change.
"""
from __future__ import annotations

from typing import Callable

from raymx.storage.update import upsert_seed


def is_replacement(update) -> bool:
    """A document without ``$`` operators replaces the matched one."""
    return isinstance(update, dict) and not any(k.startswith("$") for k in update)


def find_and_modify(call: Callable[[dict], dict], ns: str, flt: dict, update=None, *,
                    remove: bool = False, sort=None, upsert: bool = False,
                    new: bool = False, array_filters=None,
                    compute: Callable[[dict], dict] | None = None,
                    upsert_id=None) -> tuple[dict, dict | None]:
    """Run inside an open member transaction: ``call(req)`` sends ``req`` in it
    and returns the member's answer. ``sort``: ``[[path, 1 | -1], ...]`` or
    None. Returns ``(lastErrorObject, value)`` in MongoDB's shape: ``value``
    is the document before the change (``new``: after it), or None when none
    matched and none was upserted. ``compute(doc)`` instead of ``update``:
    the replacement of the matched document (or of the upsert's seed), as
    the wire port computes a pipeline update (logged as an update, not a
    replacement: ``computed``). ``upsert_id``: the ``_id`` an upserted
    document without one gets (the wire port's ObjectId; else the member's)."""
    replace = compute is not None or is_replacement(update)
    extra = {} if array_filters is None else {"array_filters": array_filters}
    if compute is not None:
        extra["computed"] = True

    def one(f, s=None):
        docs = call({"op": "find", "ns": ns, "filter": f, "sort": s, "limit": 1})["docs"]
        return docs[0] if docs else None
    doc = one(flt, sort)
    leo: dict = {"n": 0}
    value = None
    if doc is not None:
        sel = {"_id": doc["_id"]}
        leo["n"] = 1
        if remove:
            call({"op": "delete", "ns": ns, "filter": sel})
            value = doc
        else:
            # the filter too: a positional $ takes its element from it
            call({"op": "update", "ns": ns, "filter": {"$and": [sel, flt]} if flt else sel,
                  "update": compute(doc) if compute else update, "replace": replace, **extra})
            leo["updatedExisting"] = True
            value = one(sel) if new else doc
    elif upsert and not remove:
        res = call({"op": "update", "ns": ns, "filter": flt,
                    "update": compute(upsert_seed(flt)) if compute else update,
                    "replace": replace, "upsert": True, **extra,
                    **({} if upsert_id is None else {"upsert_id": upsert_id})})
        leo.update(n=1, updatedExisting=False, upserted=res.get("upserted_id"))
        if new:
            value = one({"_id": res.get("upserted_id")})
    elif not remove:
        leo["updatedExisting"] = False
    return leo, value
