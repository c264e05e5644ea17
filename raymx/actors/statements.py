"""Write statements of a request, run inside a transaction (pure: no threads).

``run_statement`` is what ``ShardService`` runs for each write request, on
the writer (or the client port's thread), in its own transaction or a
group's child transaction.
"""
from __future__ import annotations

from raymx import errors
from raymx.actors.reads import _gtid_in, gtid_out
from raymx.storage import codec
from raymx.storage.changes import SESSIONS_NS
from raymx.storage.engine import Transaction, WriteResult
from raymx.storage.reader import id_point

WRITE_OPS = {"insert", "replaceMany", "update", "delete", "createIndex", "dropIndex",
             "setIndexExpiry", "dropCollection", "createCollection", "renameCollection",
             "revertTo"}
PACKED_OPS = ("insert", "replaceMany")  # their documents arrive packed, maybe in parts
READ_OPS = {"find", "getMore", "killCursors", "count", "distinct", "listCollections", "listIndexes",
            "indexStats", "revertPlan", "collStats", "explain", "validate"}
TXN_OPS = {"txnBegin", "txnCommit", "txnAbort"}

RETRY_NS = SESSIONS_NS  # driver sessions' records (raymx/wire/sessions.py)


def result_out(r) -> dict:
    if isinstance(r, WriteResult):
        return {"inserted_ids": r.inserted_ids, "matched": r.matched, "modified": r.modified,
                "deleted": r.deleted, "upserted_id": r.upserted_id, "gtid": gtid_out(r.gtid)}
    return {"value": r}


def run_statement(tx: Transaction, req: dict):
    """Execute one write statement ``req`` inside ``tx`` (atomically); with
    ``retry`` (a driver's retryable write, raymx/wire/crud.py) its record and
    result commit with it."""
    if "retry" in req:  # checked here, in the write's transaction: a racing retry
        lsid, num = req["retry"]["_id"], req["retry"]["n"]
        done = next(iter(tx.matching(RETRY_NS, {"_id": lsid})), None)
        if done is not None and done[1].get("n", -1) >= num:
            raise errors.RetryRecorded(f"retryable write {num} of its session is recorded "
                                       f"already (the record holds {done[1].get('n')}): not "
                                       "applied again", n=done[1].get("n"))
    res = _statement(tx, req)
    if "retry" in req:
        rec = dict(req["retry"], res=result_out(res))
        tx.update(RETRY_NS, {"_id": rec["_id"]}, rec, upsert=True, replace=True)
    return res


def _statement(tx: Transaction, req: dict):
    op, ns = req["op"], req.get("ns")
    if op == "insert":  # "packed" was decoded on arrival (ShardService._receive_insert)
        return tx.insert(ns, req["packed"] if "packed" in req else req.get("docs"))
    if op == "replaceMany":  # "packed" as for insert
        return tx.replace_many(ns, req["packed"] if "packed" in req else req.get("docs"),
                               upsert=bool(req.get("upsert")), merge=bool(req.get("merge")))
    if op == "update":
        return tx.update(ns, req.get("filter"), req.get("update"),
                         multi=bool(req.get("multi")), upsert=bool(req.get("upsert")),
                         replace=bool(req.get("replace")),
                         array_filters=req.get("array_filters"),
                         computed=bool(req.get("computed")),
                         upsert_id=req.get("upsert_id"))
    if op == "delete":
        return tx.delete(ns, req.get("filter"), multi=bool(req.get("multi")))
    if op == "createIndex":
        return tx.create_index(ns, req.get("key"), unique=bool(req.get("unique")),
                               name=req.get("name"), expire_after_s=req.get("expire_after_s"),
                               sparse=bool(req.get("sparse")), partial=req.get("partial"))
    if op == "dropIndex":
        return tx.drop_index(ns, req.get("name"))
    if op == "setIndexExpiry":
        return tx.set_index_expiry(ns, req.get("name"), req.get("expire_after_s"))
    if op == "dropCollection":
        return tx.drop_collection(ns)
    if op == "createCollection":
        return tx.create_collection(ns)
    if op == "renameCollection":
        return tx.rename_collection(ns, req.get("to"), bool(req.get("drop_target")))
    if op == "revertTo":
        return tx.revert_to(_gtid_in(req.get("target"), "target"))
    raise errors.InvalidOperation(f"unknown write operation {op!r}")


def runs_on_port(item: tuple, insert_docs_max: int) -> bool:
    """A write small enough to run on the client port's thread: an autocommit
    insert of a few documents, or an update or delete of the one document its
    filter names by ``_id`` (a point lookup: never a scan that would hold
    the port)."""
    kind, _, req, _ = item
    if kind != "write":
        return False
    op = req["op"]
    if op == "insert":
        docs = req.get("packed", req.get("docs"))
        return isinstance(docs, (list, codec.PackedDocuments)) and len(docs) <= insert_docs_max
    if op not in ("update", "delete") or req.get("multi"):
        return False
    return id_point(req.get("filter"))

