"""``bulk_write`` and its requests, with pymongo's names and arguments:
``InsertOne``, ``UpdateOne``, ``UpdateMany``, ``ReplaceOne``, ``DeleteOne``,
``DeleteMany``."""
from __future__ import annotations

from typing import TYPE_CHECKING

from raymx import errors
from raymx.client.results import BulkWriteResult

if TYPE_CHECKING:
    from raymx.client.collection import Collection


def _unsupported(kind: str, **opts) -> None:
    given = sorted(k for k, v in opts.items() if v is not None)
    if given:
        raise errors.InvalidOperation(f"{kind}: {', '.join(given)} not supported by raymx")


def _check_filter(kind: str, flt) -> None:
    if not isinstance(flt, dict):
        raise TypeError(f"{kind}: filter must be a dict, not {type(flt).__name__}")


class _Request:
    __slots__ = ()

    def __eq__(self, other):
        return type(other) is type(self) and all(
            getattr(self, k) == getattr(other, k) for k in self.__slots__)

    def __repr__(self):
        args = ", ".join(repr(getattr(self, k)) for k in self.__slots__)
        return f"{type(self).__name__}({args})"


class InsertOne(_Request):
    """Insert ``document`` (its ``_id`` is set on it once inserted, if absent)."""

    __slots__ = ("document",)

    def __init__(self, document: dict):
        if not isinstance(document, dict):
            raise TypeError(f"InsertOne: document must be a dict, not "
                            f"{type(document).__name__}")
        self.document = document


class _Update(_Request):
    __slots__ = ("filter", "update", "upsert", "array_filters")
    multi = False

    def __init__(self, filter: dict, update: dict, upsert: bool = False, collation=None,
                 array_filters=None, hint=None):
        _check_filter(type(self).__name__, filter)
        _unsupported(type(self).__name__, collation=collation, hint=hint)
        self.filter, self.update, self.upsert = filter, update, bool(upsert)
        self.array_filters = array_filters

    def _run(self, coll: "Collection", wc: dict):
        return coll._update(self.filter, self.update, self.multi, self.upsert, False, dict(wc),
                            self.array_filters)


class UpdateOne(_Update):
    """Update the first document that matches ``filter``."""


class UpdateMany(_Update):
    """Update every document that matches ``filter`` (one statement)."""

    multi = True


class ReplaceOne(_Request):
    """Replace the first document that matches ``filter`` with ``replacement``."""

    __slots__ = ("filter", "replacement", "upsert")

    def __init__(self, filter: dict, replacement: dict, upsert: bool = False, collation=None,
                 hint=None):
        _check_filter("ReplaceOne", filter)
        _unsupported("ReplaceOne", collation=collation, hint=hint)
        self.filter, self.replacement, self.upsert = filter, replacement, bool(upsert)

    def _run(self, coll: "Collection", wc: dict):
        return coll._update(self.filter, self.replacement, False, self.upsert, True, dict(wc))


class _Delete(_Request):
    __slots__ = ("filter",)

    def __init__(self, filter: dict, collation=None, hint=None):
        _check_filter(type(self).__name__, filter)
        _unsupported(type(self).__name__, collation=collation, hint=hint)
        self.filter = filter

    def _run(self, coll: "Collection", wc: dict):
        return coll.delete_many(self.filter, **wc) if self.multi \
            else coll.delete_one(self.filter, **wc)


class DeleteOne(_Delete):
    """Delete the first document that matches ``filter``."""

    multi = False


class DeleteMany(_Delete):
    """Delete every document that matches ``filter`` (one statement)."""

    multi = True


REQUESTS = (InsertOne, UpdateOne, UpdateMany, ReplaceOne, DeleteOne, DeleteMany)


def _runs(requests: list):
    """(first index, [requests]): consecutive ``InsertOne``s together, the
    other requests one by one."""
    i = 0
    while i < len(requests):
        j = i + 1
        if type(requests[i]) is InsertOne:
            while j < len(requests) and type(requests[j]) is InsertOne:
                j += 1
        yield i, requests[i:j]
        i = j


class _Bulk:
    def __init__(self, coll: "Collection", wc: dict, ordered: bool):
        self.coll, self.wc, self.ordered = coll, wc, ordered
        self.res = BulkWriteResult()
        self.write_errors: list[dict] = []
        self.wc_errors: list[dict] = []

    def details(self) -> dict:
        """pymongo's raw result with this bulk's errors, and the GTIDs."""
        return {**self.res.bulk_api_result, "writeErrors": self.write_errors,
                "writeConcernErrors": self.wc_errors,
                "gtids": [None if g is None else str(g) for g in self.res.gtids]}

    def _wc_error(self, i: int, e: errors.WriteConcernTimeout) -> None:
        """Request ``i`` committed; its write concern did not hold."""
        self.wc_errors.append({"index": i, "code": "WriteConcernTimeout", "errmsg": e.msg,
                               "gtid": e.info.get("gtid")})

    def _count(self, i: int, req, out) -> None:
        # (insert_one and insert_many have set each inserted _id on its document)
        r = self.res
        if out.gtid is not None:
            r.gtids.append(out.gtid)
        if isinstance(req, list):  # a run of InsertOne
            r.inserted_count += len(out.inserted_ids)
        elif isinstance(req, InsertOne):
            r.inserted_count += 1
        elif isinstance(req, _Delete):
            r.deleted_count += out.deleted_count
        else:
            r.matched_count += out.matched_count
            r.modified_count += out.modified_count
            if out.upserted_id is not None:
                r.upserted_count += 1
                r.upserted_ids[i] = out.upserted_id

    def one(self, i: int, req) -> bool:
        """Run request ``i``; False: stop here (ordered, and it was refused)."""
        try:
            if isinstance(req, InsertOne):
                out = self.coll.insert_one(req.document, **self.wc)
            else:
                out = req._run(self.coll, self.wc)
        except errors.WriteConcernTimeout as e:
            self._wc_error(i, e)
            return True
        except errors.InvalidInput as e:  # this request's own fault: it wrote nothing
            self.write_errors.append({"index": i, "code": type(e).__name__, "errmsg": e.msg,
                                      "op": req})
            return not self.ordered
        self._count(i, req, out)
        return True

    def run(self, requests: list) -> BulkWriteResult:
        try:
            for i, run in _runs(requests):
                if len(run) > 1 and not self._insert_run(i, run):
                    break
                if len(run) == 1 and not self.one(i, run[0]):
                    break
        except errors.RaymxError as e:  # not a request's fault (lost primary...): as it is
            e.info.setdefault("bulk_details", self.details())
            raise
        if self.write_errors or self.wc_errors:
            first = (self.write_errors or self.wc_errors)[0]
            raise errors.BulkWriteError(
                f"bulk write error: request {first['index']} ({first['code']}): "
                f"{first['errmsg']}", **self.details())
        return self.res

    def _insert_run(self, i: int, run: list) -> bool:
        """Consecutive inserts as one statement (one GTID, the speed of
        ``insert_many``); if it is refused, one by one, to write those before
        the bad one (and, unordered, after it) and name it."""
        try:
            out = self.coll.insert_many([q.document for q in run], **self.wc)
        except errors.WriteConcernTimeout as e:
            self._wc_error(i, e)
            self.res.inserted_count += len(run)
            return True
        except errors.InvalidInput:
            for k, q in enumerate(run):
                if not self.one(i + k, q):
                    return False
            return True
        self._count(i, run, out)
        return True


def bulk_write(coll: "Collection", requests, ordered: bool, wc: dict) -> BulkWriteResult:
    """See ``Collection.bulk_write``."""
    if not isinstance(requests, (list, tuple)):
        raise TypeError(f"bulk_write: requests must be a list, not {type(requests).__name__}")
    requests = list(requests)
    if not requests:
        raise errors.InvalidOperation("bulk_write: no requests to run (an empty list)")
    for i, r in enumerate(requests):
        if not isinstance(r, REQUESTS):
            raise TypeError(f"bulk_write: request {i}, {r!r:.80}, is not a valid request "
                            f"(one of {', '.join(c.__name__ for c in REQUESTS)})")
    return _Bulk(coll, wc, bool(ordered)).run(requests)
