"""``Database`` and ``Collection`` (its writes and reads; ``Cursor`` is in
raymx/client/cursor.py, ``bulk_write`` in raymx/client/bulk.py)."""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from raymx import errors
from raymx.client import bulk, composite
from raymx.client.cursor import Cursor, _check_count, hint_spec, sort_spec
from raymx.client.options import (ReadConcern, ReadPreference, ReturnDocument, WriteConcern,
                                  _wc_fields)
from raymx.client.results import (BulkWriteResult, DeleteResult, InsertManyResult,
                                  InsertOneResult, ReplaceManyResult, UpdateResult,
                                  _gtid)
from raymx.storage import catalog, codec
from raymx.storage.limits import DEFAULT as DEFAULT_LIMITS
from raymx.storage.projection import project

if TYPE_CHECKING:
    from raymx.client.change_stream import ChangeStream
    from raymx.client.client import Client


INSERT_PART_DOCS = 256
INSERT_PART_BYTES = 8 << 20


def _pack(docs: list) -> list[bytes]:
    return codec.pack_each(docs, DEFAULT_LIMITS.document_bytes_max)


def _packed_part(docs: list) -> list[dict]:
    """The frames' fields of one part of an insert: one frame unless its
    documents pass INSERT_PART_BYTES (then cut into runs, each at most that
    or one document)."""
    frames, run, n = [], [], 0
    for r in _pack(docs):
        if run and n + len(r) > INSERT_PART_BYTES:
            frames.append({"packed": run})
            run, n = [], 0
        run.append(r)
        n += len(r)
    frames.append({"packed": run})
    return frames


class Database:
    def __init__(self, client: Client, name: str, wc: WriteConcern, txn=None):
        self.client, self.name, self.write_concern, self._txn = client, name, wc, txn

    def __getitem__(self, coll: str) -> "Collection":
        return Collection(self.client, f"{self.name}.{coll}", self.write_concern, self._txn,
                          self.client.read_preference, self.client.read_concern)

    def __getattr__(self, n: str) -> "Collection":
        if n.startswith("_"):
            raise AttributeError(n)
        return self[n]

    def get_collection(self, name: str) -> "Collection":
        return self[name]

    def watch(self, after=None, ops=None, **kw) -> "ChangeStream":
        """Change events of every collection of this database."""
        return self.client.watch(after, [self.name], ops, **kw)

    def list_collection_names(self) -> list[str]:
        names = self.client._call({"op": "listCollections"})["value"]
        return sorted(n.split(".", 1)[1] for n in names if n.split(".", 1)[0] == self.name)

    def drop_collection(self, name: str) -> bool:
        return self[name].drop()


class Collection:
    def __init__(self, client: Client, ns: str, wc: WriteConcern, txn=None,
                 rp: ReadPreference | None = None, rc: ReadConcern | None = None):
        self.client, self.full_name, self.write_concern, self._txn = client, ns, wc, txn
        self.read_preference = rp or client.read_preference
        self.read_concern = rc or client.read_concern
        self.database_name, self.name = ns.split(".", 1)

    def with_options(self, write_concern: WriteConcern | None = None,
                     read_preference: ReadPreference | None = None,
                     read_concern: "ReadConcern | str | None" = None) -> "Collection":
        return Collection(self.client, self.full_name, write_concern or self.write_concern,
                          self._txn, read_preference or self.read_preference,
                          ReadConcern.of(read_concern) or self.read_concern)

    def _read_fields(self, read_concern=None) -> dict:
        """The read preference's and read concern's fields of a request (the
        call's ``read_concern`` over the collection's)."""
        asked = ReadConcern.of(read_concern)
        if self._txn is not None:  # the transaction's reads see one snapshot
            if asked is not None and asked.level not in ("local", "snapshot"):
                raise errors.InvalidOperation(f"read concern {asked.level!r} inside a "
                                              "transaction: its reads see one snapshot")
            return {}
        rc = asked or self.read_concern
        if rc.level == "linearizable" and self.read_preference.mode != "primary":
            raise errors.InvalidOperation("read concern 'linearizable' reads from the primary "
                                          f"only, not with read preference {self.read_preference}")
        out = {**self.read_preference.fields(), **rc.fields()}
        if rc.level == "linearizable":  # the member's confirmation round waits this long
            out["read_timeout_ms"] = max(100, int(self.client.timeout_s * 800))
        return out

    def _read(self, req: dict, read_concern=None):
        req.update(self._read_fields(read_concern))
        if self._txn is not None:
            return self._txn._call(req)
        return self.client._read_call(self.read_preference, req)[0]

    def _write(self, req: dict, wc_fields: dict, parts=None):
        req["ns"] = self.full_name
        if self._txn is not None:
            return self._txn._call(req, parts)
        req.update(wc_fields)
        return self.client._call(req, parts=parts)

    # writes
    # Documents travel packed one by one ("packed": a msgpack binary each): the
    # member decodes them to check them and stores these bytes, never packing
    # them again. What msgpack cannot encode fails here, before it is sent.
    #
    # A document without ``_id`` gets the one the member generated (a
    # time-ordered 24-hex-digit string, the same generator as for upserts) set
    # on the caller's dict after the answer, as pymongo sets one: nothing more
    # travels, the bytes packed here stay the bytes stored, and the result
    # keeps its GTID. (Generating a bson.ObjectId here, as pymongo does,
    # would give inserts and upserts ids of two types.)
    def insert_one(self, doc: dict, **wc) -> InsertOneResult:
        r = self._write({"op": "insert", "packed": _pack([doc])},
                        _wc_fields(self.write_concern, wc))
        _id = r["inserted_ids"][0]
        if "_id" not in doc:
            doc["_id"] = _id
        return InsertOneResult(_id, _gtid(r["gtid"]))

    # A large insert goes in parts of INSERT_PART_DOCS documents (a frame each,
    # or more past INSERT_PART_BYTES), still one atomic statement: the member
    # decodes each part while the next is packed here, and the whole may
    # exceed one frame (up to the member's transaction_bytes_max).
    def insert_many(self, docs, **wc) -> InsertManyResult:
        docs = list(docs)
        r = self._write_packed({"op": "insert"}, docs, _wc_fields(self.write_concern, wc))
        ids = r["inserted_ids"]
        for d, _id in zip(docs, ids):
            if "_id" not in d:
                d["_id"] = _id
        return InsertManyResult(ids, _gtid(r["gtid"]))

    def _write_packed(self, req: dict, docs: list, wc_fields: dict):
        """``req`` with ``docs`` packed: in one frame, or in parts past
        INSERT_PART_DOCS (one statement all the same)."""
        if len(docs) <= INSERT_PART_DOCS:
            return self._write(dict(req, packed=_pack(docs)), wc_fields)
        parts = [functools.partial(_packed_part, docs[i:i + INSERT_PART_DOCS])
                 for i in range(0, len(docs), INSERT_PART_DOCS)]
        return self._write(req, wc_fields, parts)

    def replace_many(self, docs, upsert: bool = False, merge: bool = False,
                     **wc) -> ReplaceManyResult:
        """Replace the document with each row's ``_id`` by the row, in ONE
        atomic statement (one GTID); with ``upsert`` a row whose ``_id`` has
        no document is inserted, else skipped. ``merge``: ``$set`` each row's
        top-level fields into its document instead (the other fields kept).

        Every row needs an ``_id`` (else ``InvalidDocument``, nothing written).
        A unique index refusing a row (``DuplicateKey``) leaves nothing of
        the batch written. Rows repeating an ``_id`` apply in their order. A
        row equal to its stored document changes nothing and is not logged,
        so running the same batch again is harmless. Replicated as the ``u``
        ops of ``replace_one``/``update_one`` and the ``i`` ops of inserts
        (change events ``update`` and ``insert``). What ``insert_many`` does
        with a large batch (parts, limits) applies here too."""
        docs = list(docs)
        r = self._write_packed({"op": "replaceMany", "upsert": bool(upsert), "merge": bool(merge)},
                               docs, _wc_fields(self.write_concern, wc))
        return ReplaceManyResult(r["matched"], r["modified"], r["inserted_ids"], _gtid(r["gtid"]))

    def _update(self, flt, update, multi, upsert, replace, wc,
                array_filters=None) -> UpdateResult:
        req = {"op": "update", "filter": flt, "update": update, "multi": multi,
               "upsert": upsert, "replace": replace}
        if array_filters is not None:
            req["array_filters"] = array_filters
        r = self._write(req, _wc_fields(self.write_concern, wc))
        return UpdateResult(r["matched"], r["modified"], r["upserted_id"], _gtid(r["gtid"]))

    def update_one(self, flt, update, upsert=False, array_filters=None, **wc) -> UpdateResult:
        """``array_filters``: filters for ``$[name]`` paths, as pymongo's; the
        positional ``$`` takes its element from ``flt``."""
        return self._update(flt, update, False, upsert, False, wc, array_filters)

    def update_many(self, flt, update, upsert=False, array_filters=None, **wc) -> UpdateResult:
        return self._update(flt, update, True, upsert, False, wc, array_filters)

    def replace_one(self, flt, replacement, upsert=False, **wc) -> UpdateResult:
        return self._update(flt, replacement, False, upsert, True, wc)

    def delete_one(self, flt, **wc) -> DeleteResult:
        r = self._write({"op": "delete", "filter": flt, "multi": False},
                        _wc_fields(self.write_concern, wc))
        return DeleteResult(r["deleted"], _gtid(r["gtid"]))

    def delete_many(self, flt, **wc) -> DeleteResult:
        r = self._write({"op": "delete", "filter": flt, "multi": True},
                        _wc_fields(self.write_concern, wc))
        return DeleteResult(r["deleted"], _gtid(r["gtid"]))

    def bulk_write(self, requests, ordered: bool = True, **wc) -> BulkWriteResult:
        """Run ``InsertOne``, ``UpdateOne``, ``UpdateMany``, ``ReplaceOne``,
        ``DeleteOne`` and ``DeleteMany`` requests in order (pymongo's).

        Not atomic as a whole: each request is its own statement under its own
        GTID (consecutive ``InsertOne``s run as one statement), as pymongo's
        bulk against MongoDB; for all or nothing, call it inside
        ``client.transaction()``. ``ordered`` (default): the first request the
        member refuses (a duplicate key, a bad update...) stops the bulk; what
        ran before it stays written, it wrote nothing, the rest did not run.
        Unordered: the refused ones are skipped and the others run. Either way
        a refusal raises ``BulkWriteError`` once the bulk stops; its
        ``details`` name each refused request's ``index`` and the counts of
        what was written (a write concern timeout is listed in
        ``writeConcernErrors``: that write stays). An error that is no
        request's fault (the primary lost, the connection dropped) is raised
        as it is, ``info["bulk_details"]`` saying what was written before it.
        """
        _wc_fields(self.write_concern, dict(wc))  # a bad argument fails before any write
        return bulk.bulk_write(self, requests, ordered, wc)

    def create_index(self, keys, unique: bool = False, name: str | None = None,
                     expire_after_seconds: int | None = None, sparse: bool = False,
                     partial_filter_expression: dict | None = None, **wc) -> str:
        """``expire_after_seconds``: a TTL index, as pymongo's ``expireAfterSeconds``:
        the primary deletes documents whose field is a date (or an array
        holding one) older than that, once a minute (``Limits.ttl_interval_ms``).
        ``sparse``: only documents holding one of the key's fields are indexed;
        ``partial_filter_expression``: only those the filter matches. Such an
        index enforces ``unique`` among the documents it holds; queries never
        read through it (it does not hold every document)."""
        if isinstance(keys, list):
            keys = [list(k) if isinstance(k, tuple) else k for k in keys]
        req = {"op": "createIndex", "key": keys, "unique": unique, "name": name}
        if expire_after_seconds is not None:
            req["expire_after_s"] = expire_after_seconds
        if sparse:
            req["sparse"] = True
        if partial_filter_expression is not None:
            req["partial"] = partial_filter_expression
        return self._write(req, _wc_fields(self.write_concern, wc))["value"]

    def drop_index(self, index_or_name, **wc) -> None:
        """As pymongo's: an index's name (a string), or the key it was
        created with (``[("a", 1), ("b", -1)]``, ``{"a": 1}``), which names
        the index ``create_index`` gave that key by default."""
        name = index_or_name
        if not isinstance(name, str):
            name = catalog.index_name(catalog.normalize_index_key(name))
        self._write({"op": "dropIndex", "name": name}, _wc_fields(self.write_concern, wc))

    def drop(self, **wc) -> bool:
        return self._write({"op": "dropCollection"}, _wc_fields(self.write_concern, wc))["value"]

    def rename(self, new_name: str, drop_target: bool = False, **wc) -> "Collection":
        """Rename this collection to ``new_name`` in its database (as pymongo's
        ``rename``), its documents and indexes with it; a target that exists
        is refused (``CollectionExists``) unless ``drop_target``. The
        collection under its new name is returned."""
        if not isinstance(new_name, str) or not new_name:
            raise errors.InvalidName(f"rename: the new name must be a non-empty string, not "
                                     f"{new_name!r:.60}")
        to = f"{self.database_name}.{new_name}"
        self._write({"op": "renameCollection", "to": to, "drop_target": bool(drop_target)},
                    _wc_fields(self.write_concern, wc))
        return Collection(self.client, to, self.write_concern, self._txn)

    def list_indexes(self) -> list[dict]:
        return self.client._call({"op": "listIndexes", "ns": self.full_name})["value"]

    def stats(self) -> dict:
        """``{"ns", "count", "size", "indexes": {name: [entries, bytes]}}``:
        documents and their stored (msgpack) bytes, and each index's entries
        and key bytes, counted by the member (a scan of the collection and
        its indexes, no document decoded); zeros if it does not exist."""
        return self.client._call({"op": "collStats", "ns": self.full_name})["value"]

    def watch(self, after=None, ops=None, **kw) -> "ChangeStream":
        """Change events of this collection."""
        return self.client.watch(after, [self.full_name], ops, **kw)

    # reads
    def find(self, filter=None, projection=None, skip: int = 0, limit: int = 0, *,
             sort=None, batch_size: int = 0,
             read_concern: "ReadConcern | str | None" = None,
             max_time_ms: int | None = None, hint=None) -> Cursor:
        """A ``Cursor`` over the matching documents; the arguments in pymongo's
        order (``filter, projection, skip, limit``; ``sort`` by name).
        ``max_time_ms``: the time the member may spend on its batches in all
        (``ExecutionTimeout`` past it), as pymongo's; ``hint``: the index to
        read through (``Cursor.hint``)."""
        c = Cursor(self, filter, projection, sort, skip, limit, batch_size, read_concern)
        if hint is not None:
            c.hint(hint)
        return c if max_time_ms is None else c.max_time_ms(max_time_ms)

    def find_one(self, filter=None, *args, **kwargs):
        """The first matching document or None; a filter that is not a map
        means ``{"_id": filter}`` (as in pymongo). Other arguments as ``find``."""
        if filter is not None and not isinstance(filter, dict):
            filter = {"_id": filter}
        if not args and not kwargs and self._txn is None:
            # what find(filter).limit(1) sends, in one request with no Cursor
            r, conn = self.client._read_call(self.read_preference, {
                "op": "find", "ns": self.full_name, "filter": {} if filter is None else filter,
                "limit": 1, **self._read_fields()})
            if r.get("cursor"):  # (none: a limit of one is one batch)
                conn.submit({"op": "killCursors", "cursors": [r["cursor"]]})
            return r["docs"][0] if r["docs"] else None
        c = self.find(filter, *args, **kwargs)
        c._spec["limit"] = 1
        doc = next(c, None)
        if c.cursor_id:  # (none: one document is one batch)
            c.close()
        return doc

    def count_documents(self, filter=None, read_concern: "ReadConcern | str | None" = None,
                        max_time_ms: int | None = None, hint=None) -> int:
        """``hint``: the index to count through (``Cursor.hint``)."""
        req = {"op": "count", "ns": self.full_name, "filter": {} if filter is None else filter}
        if max_time_ms is not None:
            req["max_time_ms"] = _check_count("max_time_ms", max_time_ms)
        if hint is not None:
            req["hint"] = hint_spec(hint)
        return self._read(req, read_concern)["value"]

    def estimated_document_count(self, read_concern: "ReadConcern | str | None" = None) -> int:
        """The number of documents (exact here: the member counts them)."""
        return self.count_documents({}, read_concern)

    def distinct(self, key: str, filter=None,
                 read_concern: "ReadConcern | str | None" = None) -> list:
        """The distinct values of ``key`` (a dotted path; each element of an
        array counts) among the matching documents, in MongoDB's order of
        values."""
        if not isinstance(key, str) or not key:
            raise TypeError(f"distinct: key must be a non-empty str, not {key!r:.40}")
        req = {"op": "distinct", "ns": self.full_name, "key": key,
               "filter": {} if filter is None else filter}
        return self._read(req, read_concern)["value"]

    # findAndModify: the member has no request for it; its find and update or
    # delete run in one member transaction (raymx/client/composite.py, as the
    # wire port's findAndModify), or in the caller's.
    def _find_and_modify(self, flt, update, remove: bool, projection, sort, upsert: bool,
                         new: bool, wc: dict, array_filters=None):
        if not isinstance(flt, dict):
            raise TypeError(f"filter must be a dict, not {type(flt).__name__}")
        run = dict(ns=self.full_name, flt=flt, update=update, remove=remove,
                   sort=sort_spec(sort), upsert=upsert, new=bool(new),
                   array_filters=array_filters)
        if self._txn is not None:
            _, value = composite.find_and_modify(self._txn._call, **run)
        else:  # in a transaction of its own, run again after a WriteConflict
            _, value = self.client._transacted(
                lambda tx: composite.find_and_modify(tx._call, **run),
                _wc_fields(self.write_concern, wc))
        if value is not None and projection is not None:
            value = project(value, projection, flt)
        return value

    def find_one_and_update(self, filter, update, projection=None, sort=None,
                            upsert: bool = False, return_document=ReturnDocument.BEFORE,
                            array_filters=None, **wc):
        """Update the first match (in ``sort`` order) and return it as it was
        (``return_document=ReturnDocument.AFTER``: as it is after), or None;
        atomic: no other write comes between finding and updating it."""
        if not isinstance(update, dict) or composite.is_replacement(update) or not update:
            raise errors.InvalidUpdate("find_one_and_update needs update operators ($set...); "
                                       "to replace the document use find_one_and_replace")
        return self._find_and_modify(filter, update, False, projection, sort, upsert,
                                     return_document, wc, array_filters)

    def find_one_and_replace(self, filter, replacement, projection=None, sort=None,
                             upsert: bool = False, return_document=ReturnDocument.BEFORE, **wc):
        """As ``find_one_and_update``, replacing the document (its ``_id`` stays)."""
        if not isinstance(replacement, dict) or not composite.is_replacement(replacement):
            raise errors.InvalidUpdate("find_one_and_replace needs a replacement document "
                                       "without $ operators")
        return self._find_and_modify(filter, replacement, False, projection, sort, upsert,
                                     return_document, wc)

    def find_one_and_delete(self, filter, projection=None, sort=None, **wc):
        """Delete the first match (in ``sort`` order) and return it, or None."""
        return self._find_and_modify(filter, None, True, projection, sort, False, False, wc)
