"""The index commands of the wire port: ``listIndexes``, ``createIndexes``,
``dropIndexes`` and ``collMod`` (an index's ``expireAfterSeconds``), in
MongoDB's shapes, over the member's index requests."""
from __future__ import annotations

from typing import TYPE_CHECKING

from bson import Int64

from raymx.wire import crud
from raymx.wire.errors import CommandError, bad_value

if TYPE_CHECKING:
    from raymx.wire.commands import Dispatcher


def index_doc(ix: dict) -> dict:
    """An index as `listIndexes` shows it (MongoDB's spec document)."""
    out = {"v": 2, "key": {p: dr for p, dr in ix["key"]}, "name": ix["name"]}
    if ix.get("unique") and ix["name"] != "_id_":
        out["unique"] = True
    for opt in ("expireAfterSeconds", "sparse", "partialFilterExpression"):
        if ix.get(opt) is not None:
            out[opt] = ix[opt]
    return out


def _must_exist(d: Dispatcher, conn, ns: str) -> None:
    if ns not in crud.collection_names(d, conn):
        raise CommandError(f"ns does not exist: {ns}", 26, "NamespaceNotFound")


def _with_key(ixs: list[dict], pattern) -> list[str]:
    """The names of the indexes in ``ixs`` whose key is ``pattern`` ({path: direction})."""
    key = [[p, int(v)] for p, v in pattern.items()] if isinstance(pattern, dict) else None
    return [x["name"] for x in ixs if [list(k) for k in x["key"]] == key]


def list_indexes(d: Dispatcher, cmd: dict, conn) -> dict:
    ns = crud.ns_of(cmd, "listIndexes")
    _must_exist(d, conn, ns)
    ixs = d.call({"op": "listIndexes", "ns": ns}, conn.state)["value"]
    return {"cursor": {"firstBatch": [index_doc(x) for x in ixs], "id": Int64(0), "ns": ns}}


_INDEX_OPTIONS = {"key", "name", "unique", "v", "background", "expireAfterSeconds", "sparse",
                  "partialFilterExpression"}


def create_indexes(d: Dispatcher, cmd: dict, conn) -> dict:
    ns = crud.ns_of(cmd, "createIndexes")
    specs = cmd.get("indexes")
    if not isinstance(specs, list) or not specs:
        raise bad_value("createIndexes needs a non-empty array 'indexes'")
    existed = ns in crud.collection_names(d, conn)  # in a transaction: as committed
    names = [x["name"] for x in d.call({"op": "listIndexes", "ns": ns}, conn.state)["value"]]
    before, made = len(names) or 1, set()
    for spec in specs:
        if not isinstance(spec, dict) or not isinstance(spec.get("key"), dict):
            raise bad_value("each index needs a 'key' document")
        other = sorted(set(spec) - _INDEX_OPTIONS)
        if other:
            raise CommandError(f"index option(s) {', '.join(other)} are not supported by "
                               "raymx", 197, "InvalidIndexSpecificationOption")
        key = [[p, int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v]
               for p, v in spec["key"].items()]
        req = {"op": "createIndex", "ns": ns, "key": key, "unique": bool(spec.get("unique")),
               "name": spec.get("name"), **crud.wc_fields(cmd)}
        if spec.get("expireAfterSeconds") is not None:
            req["expire_after_s"] = spec["expireAfterSeconds"]
        if spec.get("sparse"):
            req["sparse"] = True
        if spec.get("partialFilterExpression") is not None:
            req["partial"] = crud._plain(spec["partialFilterExpression"])
        made.add(d.drive(crud._run(d, req, cmd, conn))["value"])  # in the transaction if any
    after = before + len(made - set(names))
    return {"createdCollectionAutomatically": not existed, "numIndexesBefore": before,
            "numIndexesAfter": after}


def drop_indexes(d: Dispatcher, cmd: dict, conn) -> dict:
    ns = crud.ns_of(cmd, "dropIndexes")
    ixs = d.call({"op": "listIndexes", "ns": ns}, conn.state)["value"]
    which = cmd.get("index")
    if which == "*":
        names = [x["name"] for x in ixs if x["name"] != "_id_"]
    elif isinstance(which, str):
        names = [which]
    elif isinstance(which, dict):
        names = _with_key(ixs, which)
        if not names:
            raise CommandError(f"can't find index with key: {which}", 27, "IndexNotFound")
    elif isinstance(which, list):
        names = which
        bad = [n for n in names if not isinstance(n, str)]
        if bad:
            raise CommandError(f"dropIndexes: a list of index names holds {bad[0]!r:.60}, "
                               "not a name (a string)", 14, "TypeMismatch")
        have = {x["name"] for x in ixs}
        missing = [n for n in names if n not in have]
        if missing:  # as MongoDB: none of the list is dropped
            raise CommandError(f"index not found with name [{missing[0]}]", 27, "IndexNotFound")
    else:
        raise bad_value("dropIndexes needs 'index': a name, a key document, a list or '*'")
    for n in names:
        d.call({"op": "dropIndex", "ns": ns, "name": n, **crud.wc_fields(cmd)}, conn.state)
    return {"nIndexesWas": len(ixs)}


_COLL_MOD_REFUSED = {
    "validator": "validators are not served by raymx",
    "validationLevel": "validators are not served by raymx",
    "validationAction": "validators are not served by raymx",
    "viewOn": "views are not served by raymx", "pipeline": "views are not served by raymx",
    "expireAfterSeconds": "raymx has no time-series or clustered collections: set "
                          "expireAfterSeconds on a TTL index ({index: {name, "
                          "expireAfterSeconds}})",
    "cappedSize": "raymx has no capped collections",
    "cappedMax": "raymx has no capped collections",
}
_COMMAND_FIELDS = {"$db", "lsid", "txnNumber", "writeConcern", "$clusterTime",
                   "$readPreference", "comment", "apiVersion", "apiStrict",
                   "apiDeprecationErrors"}


def coll_mod(d: Dispatcher, cmd: dict, conn) -> dict:
    """``collMod``: an index's ``expireAfterSeconds`` (a TTL index made, or
    its expiry changed: the member drops and builds it again in one write,
    ``Transaction.set_index_expiry``); ``changeStreamPreAndPostImages``
    (always on here: every change event can have both images). What raymx
    does not serve (validators, views, hidden indexes) is refused by name."""
    ns = crud.ns_of(cmd, "collMod")
    for k, why in _COLL_MOD_REFUSED.items():
        if k in cmd:
            raise bad_value(f"collMod: {why}")
    other = sorted(set(cmd) - _COMMAND_FIELDS - {"collMod", "index",
                                                 "changeStreamPreAndPostImages"})
    if other:
        raise CommandError(f"collMod: unknown option(s) {', '.join(other)}", 40415,
                           "Location40415")
    _must_exist(d, conn, ns)
    spec, out = cmd.get("index"), {}
    if spec is None:
        return out
    if not isinstance(spec, dict) or ("name" in spec) == ("keyPattern" in spec):
        raise bad_value("collMod: index needs a document with either name or keyPattern")
    if spec.get("hidden") is not None:
        raise bad_value("collMod: hidden indexes are not served by raymx")
    other = sorted(set(spec) - {"name", "keyPattern", "expireAfterSeconds"})
    if other:
        raise bad_value(f"collMod: index option(s) {', '.join(other)} are not served by raymx")
    ixs = d.call({"op": "listIndexes", "ns": ns}, conn.state)["value"]
    found = [x["name"] for x in ixs if x["name"] == spec["name"]] if "name" in spec \
        else _with_key(ixs, crud._plain(spec["keyPattern"]))
    if not found:
        raise CommandError(f"cannot find index {spec.get('name') or spec.get('keyPattern')} "
                           f"for ns {ns}", 27, "IndexNotFound")
    if "expireAfterSeconds" in spec:
        old = d.call({"op": "setIndexExpiry", "ns": ns, "name": found[0],
                      "expire_after_s": spec["expireAfterSeconds"], **crud.wc_fields(cmd)},
                     conn.state)["value"]
        if old != spec["expireAfterSeconds"]:
            if old is not None:
                out["expireAfterSeconds_old"] = old
            out["expireAfterSeconds_new"] = spec["expireAfterSeconds"]
    return out
