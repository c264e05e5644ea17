"""``Database``, ``Collection`` (its writes and reads) and ``Cursor``."""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Iterator

from raymx import errors
from raymx.client.options import ReadConcern, ReadPreference, WriteConcern, _wc_fields
from raymx.client.results import (DeleteResult, InsertManyResult, InsertOneResult,
                                  UpdateResult, _gtid)
from raymx.storage import codec
from raymx.storage.limits import DEFAULT as DEFAULT_LIMITS

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
        self.client._no_open_transaction("a write outside it")
        req.update(wc_fields)
        return self.client._call(req, parts=parts)

    # writes
    # Documents travel packed one by one ("packed": a msgpack binary each): the
    # member decodes them to check them and stores these bytes, never packing
    # them again. What msgpack cannot encode fails here, before it is sent.
    def insert_one(self, doc: dict, **wc) -> InsertOneResult:
        r = self._write({"op": "insert", "packed": _pack([doc])},
                        _wc_fields(self.write_concern, wc))
        return InsertOneResult(r["inserted_ids"][0], _gtid(r["gtid"]))

    # A large insert goes in parts of INSERT_PART_DOCS documents (a frame each,
    # or more past INSERT_PART_BYTES), still one atomic statement: the member
    # decodes each part while the next is packed here, and the whole may
    # exceed one frame (up to the member's transaction_bytes_max).
    def insert_many(self, docs, **wc) -> InsertManyResult:
        docs, wc_fields = list(docs), _wc_fields(self.write_concern, wc)
        if len(docs) <= INSERT_PART_DOCS:
            r = self._write({"op": "insert", "packed": _pack(docs)}, wc_fields)
        else:
            parts = [functools.partial(_packed_part, docs[i:i + INSERT_PART_DOCS])
                     for i in range(0, len(docs), INSERT_PART_DOCS)]
            r = self._write({"op": "insert"}, wc_fields, parts)
        return InsertManyResult(r["inserted_ids"], _gtid(r["gtid"]))

    def _update(self, flt, update, multi, upsert, replace, wc) -> UpdateResult:
        r = self._write({"op": "update", "filter": flt, "update": update, "multi": multi,
                         "upsert": upsert, "replace": replace}, _wc_fields(self.write_concern, wc))
        return UpdateResult(r["matched"], r["modified"], r["upserted_id"], _gtid(r["gtid"]))

    def update_one(self, flt, update, upsert=False, **wc) -> UpdateResult:
        return self._update(flt, update, False, upsert, False, wc)

    def update_many(self, flt, update, upsert=False, **wc) -> UpdateResult:
        return self._update(flt, update, True, upsert, False, wc)

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

    def create_index(self, keys, unique: bool = False, name: str | None = None, **wc) -> str:
        if isinstance(keys, list):
            keys = [list(k) if isinstance(k, tuple) else k for k in keys]
        return self._write({"op": "createIndex", "key": keys, "unique": unique, "name": name},
                           _wc_fields(self.write_concern, wc))["value"]

    def drop_index(self, name: str, **wc) -> None:
        self._write({"op": "dropIndex", "name": name}, _wc_fields(self.write_concern, wc))

    def drop(self, **wc) -> bool:
        return self._write({"op": "dropCollection"}, _wc_fields(self.write_concern, wc))["value"]

    def list_indexes(self) -> list[dict]:
        return self.client._call({"op": "listIndexes", "ns": self.full_name})["value"]

    def watch(self, after=None, ops=None, **kw) -> "ChangeStream":
        """Change events of this collection."""
        return self.client.watch(after, [self.full_name], ops, **kw)

    # reads
    def find(self, filter=None, projection=None, sort=None, skip: int = 0, limit: int = 0,
             batch_size: int = 0, read_concern: "ReadConcern | str | None" = None) -> "Cursor":
        return Cursor(self, filter, projection, sort, skip, limit, batch_size, read_concern)

    def find_one(self, filter=None, projection=None, sort=None,
                 read_concern: "ReadConcern | str | None" = None):
        """The first matching document or None; a filter that is not a map
        means ``{"_id": filter}`` (as in pymongo)."""
        if filter is not None and not isinstance(filter, dict):
            filter = {"_id": filter}
        for d in self.find(filter, projection, sort, limit=1, read_concern=read_concern):
            return d
        return None

    def count_documents(self, filter=None, read_concern: "ReadConcern | str | None" = None
                        ) -> int:
        return self._read({"op": "count", "ns": self.full_name,
                           "filter": {} if filter is None else filter}, read_concern)["value"]


class Cursor:
    """Streams a query's results in batches (``getMore``) from one snapshot."""

    def __init__(self, coll: Collection, flt, projection, sort, skip, limit, batch_size,
                 read_concern=None):
        self._c = coll
        self._spec = {"op": "find", "ns": coll.full_name, "filter": {} if flt is None else flt,
                      "projection": projection, "sort": _sort_spec(sort), "skip": skip,
                      "limit": limit, "batch": batch_size}
        self._fields = coll._read_fields(read_concern)
        self._started = False

    def sort(self, key, direction: int = 1) -> "Cursor":
        self._spec["sort"] = _sort_spec(key if isinstance(key, list) else [(key, direction)])
        return self

    def skip(self, n: int) -> "Cursor":
        self._spec["skip"] = n
        return self

    def limit(self, n: int) -> "Cursor":
        self._spec["limit"] = n
        return self

    def batch_size(self, n: int) -> "Cursor":
        self._spec["batch"] = n
        return self

    def __iter__(self) -> Iterator[dict]:
        if self._started:
            raise errors.InvalidOperation("a cursor can be iterated once")
        self._started = True
        txn = self._c._txn
        if txn is not None:
            yield from txn._call(dict(self._spec))["docs"]
            return
        rp = self._c.read_preference
        r, conn = self._c.client._read_call(rp, {**self._spec, **self._fields})
        cid = r["cursor"]
        try:
            while True:
                yield from r["docs"]
                if not cid:
                    return
                r = conn.request({"op": "getMore", "cursor": cid, "batch": self._spec["batch"]},
                                 self._c.client.timeout_s)
                cid = r["cursor"]
        finally:
            if cid and not conn.closed:
                conn.submit({"op": "killCursors", "cursors": [cid]})

    def to_list(self) -> list[dict]:
        return list(self)


def _sort_spec(sort):
    if sort is None:
        return None
    if isinstance(sort, str):
        return [[sort, 1]]
    if isinstance(sort, dict):
        return [[k, v] for k, v in sort.items()]
    return [list(x) if isinstance(x, (tuple, list)) else [x, 1] for x in sort]
