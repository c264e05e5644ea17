"""Writing: ``Transaction`` and ``WriteGroup``, and how a document's index
entries are made.

Every statement is atomic: it runs in a nested LMDB transaction (a savepoint)
inside the caller's transaction, and its ops are logged only if it succeeds.
The data change and the oplog entry (``Engine._append``) commit in the same
LMDB transaction. Secondaries, rollback and revert apply logged ops through
the same document writes (``apply_op``).
"""
from __future__ import annotations

import bisect
import functools
import itertools
import operator
from typing import TYPE_CHECKING, Callable

from raymx.storage import codec, errors, oplog, query, update as upd
from raymx.storage.catalog import (CollInfo, IndexInfo, WriteResult, _pk, check_expire,
                                   check_partial, index_name, new_id, normalize_index_key,
                                   split_ns)
from raymx.storage.gtid import GTID
from raymx.storage.keys import encode_key, encode_keys, prefix_end
from raymx.storage.overlay import Overlay
from raymx.storage.reader import Reader

if TYPE_CHECKING:
    from raymx.storage.engine import Engine


_DICT = frozenset((dict,))
_ARRAYS = frozenset((list, tuple))  # stored as msgpack arrays: indexed whole and per element
_GET_ID = operator.itemgetter("_id")
_SIMPLE_ID = frozenset((int, str))  # _ids whose key is plain encode_key (see catalog._pk)


def _none(v):
    return None if v is query.MISSING else v


def _index_entries(ix: IndexInfo, doc: dict, pk: bytes) -> list[tuple[bytes, bytes]]:
    """(prefix a unique index must not repeat, full key) for every key of ``doc``.

    Multikey: an array value is indexed as a whole and once per element (the
    query side matches elements, as MongoDB does), so a compound index over
    arrays gets the cross product of its fields' keys. None for a document a
    sparse or partial index does not hold.
    """
    if ix.holds is not None and not ix.holds(doc):
        return []
    if len(ix.key) == 1:
        p = ix.key[0][0]
        if "." not in p:
            v = doc.get(p, None)
        else:  # several values reached through arrays: a list, indexed below
            vals = query.reach(doc, p)
            v = _none(vals[0]) if len(vals) == 1 else vals
        if type(v) not in _ARRAYS:  # the common case: one key
            pre = ix.prefix + encode_key(v)
            return [(pre, pre + pk)]
    pres = [ix.prefix]
    for p, _ in ix.key:
        pres = [a + k for a in pres for k in query.index_keys(doc, p)]
    return [(pre, pre + pk) for pre in pres]


def _delete_range(t, db: str, prefix: bytes) -> None:
    for k in [k for k, _ in t.scan(db, prefix, prefix_end(prefix))]:
        t.delete(db, k)


# --- writing -------------------------------------------------------------
class Transaction(Reader):
    """One LMDB write transaction and the oplog entry it will commit.

    ``log=False`` applies ops without logging them (a secondary applying
    entries its producer already wrote, or a rollback undoing entries it is
    about to truncate).
    """

    def __init__(self, engine: "Engine", txn, log: bool = True, autocommit: bool = False,
                 group: "WriteGroup | None" = None):
        super().__init__(engine, txn)
        self._log_on = log
        self._autocommit = autocommit  # one statement: no savepoint needed
        self._group = group  # its LMDB txn is a child of the group's (see WriteGroup)
        self._buf: list[bytes] = []
        self._buf_bytes = 0
        self._bytes = 0
        self._nops = 0
        self._digest = oplog.OpsDigest()
        self._spill: int | None = None
        self._chunks = 0
        self._done = False

    # statements run here, atomically
    def statement(self, fn: Callable, *a, **kw):
        if self._done:
            raise errors.TransactionAborted("the transaction has already finished")
        if self._autocommit:
            return fn(*a, **kw)
        sp = (list(self._buf), self._buf_bytes, self._bytes, self._nops,
              self._digest.copy(), self._spill, self._chunks)
        parent = self.t
        self.t = parent.nested()
        try:
            out = fn(*a, **kw)
            self.t.commit()
            return out
        except BaseException:
            self.t.abort()
            (self._buf, self._buf_bytes, self._bytes, self._nops, self._digest,
             self._spill, self._chunks) = sp
            raise
        finally:
            self.t = parent

    def _log(self, packed: bytes) -> None:
        self._log_many((packed,))

    def _log_many(self, ops) -> None:
        """Log ``ops`` (packed ops, in order). They stay in memory while the
        transaction's ops fit ``spill_bytes``; past it they go to
        ``oplog.refs`` in chunks of at most ``spill_bytes`` each (one op
        larger than that is a chunk of its own), a run of ops at a time: one
        digest update and one list extension per chunk, not per op."""
        if not self._log_on:
            return
        spill = self.e.limits.spill_bytes
        ends = list(itertools.accumulate(map(len, ops)))  # bytes through each op
        i, done = 0, 0  # ops logged, their bytes
        while i < len(ops):
            j = bisect.bisect_right(ends, done + spill - self._buf_bytes, i)  # ops i..j-1 fit
            if j == i:  # the next op does not fit what is held
                if self._buf:
                    self._flush_spill()
                    continue
                j = i + 1  # larger than a chunk: one of its own
            run, n = ops[i:j], ends[j - 1] - done
            self._digest.add(run[0] if j - i == 1 else b"".join(run))  # the digest of a
            self._buf += run                                          # concatenation is the same
            self._buf_bytes += n
            self._bytes += n
            self._nops += j - i
            i, done = j, ends[j - 1]
        if self._bytes > self.e.limits.transaction_bytes_max:
            raise errors.TransactionTooLarge(
                f"the transaction's oplog ops exceed {self.e.limits.transaction_bytes_max:,} "
                "bytes (Limits.transaction_bytes_max): a statement and a transaction are "
                "atomic and logged whole, so split this one (update or delete by ranges of "
                "_id; drop a collection rather than delete all it holds)",
                limit=self.e.limits.transaction_bytes_max)

    def _flush_spill(self) -> None:
        if not self._buf:
            return
        if self._spill is None:
            self._spill = self.e._next_counter(self.t, b"next_spill")
        self.t.put("oplog.refs", oplog.spill_key(self._spill, self._chunks),
                   codec.array_header(len(self._buf)) + b"".join(self._buf))
        self._chunks += 1
        self._buf, self._buf_bytes = [], 0

    # catalog
    def _coll_for_write(self, ns: str, create: bool = True) -> CollInfo | None:
        split_ns(ns, self.e.limits)
        c = self.coll(ns)
        if c is None and create:
            c = CollInfo(ns, self.e._next_counter(self.t, b"next_id"))
            self._save_coll(c)
            self._log(codec.pack({"op": "c", "ns": ns, "cmd": "create"}))
        return c

    def _save_coll(self, c: CollInfo) -> None:
        self.t.put("catalog", c.ns.encode(), c.record())

    # document writes with index maintenance; the primary and the applier share them
    def _unindex(self, c: CollInfo, pk: bytes, doc: dict) -> None:
        for ix in c.indexes.values():
            for _, key in _index_entries(ix, doc, pk):
                self.t.delete("index", key)

    def _index(self, c: CollInfo, pk: bytes, doc: dict, check_unique: bool,
               put_ix=None) -> None:
        put_ix = put_ix or self.t.putter("index")
        general = c.general
        for field_, ixp in c.plain:  # the common case: one key, no unique check
            v = doc.get(field_)
            if type(v) in _ARRAYS:  # multikey: the general path writes every index
                general = c.indexes.values()
                break
            put_ix(ixp + encode_key(v) + pk, pk)
        self._index_general(c, general, pk, doc, check_unique, put_ix)

    def _index_general(self, c: CollInfo, ixs, pk: bytes, doc: dict, check_unique: bool,
                       put_ix) -> None:
        for ix in ixs:
            if check_unique and len(ix.key) > 1:  # decided here, not replayed
                both = query.parallel_arrays(doc, [p for p, _ in ix.key])
                if both:
                    raise errors.CannotIndexParallelArrays(
                        f"cannot index parallel arrays [{both[0]}] [{both[1]}]: index "
                        f"{ix.name} of {c.ns}, document _id {doc.get('_id')!r:.100}",
                        ns=c.ns, index=ix.name)
            for pre, key in _index_entries(ix, doc, pk):
                if ix.unique and check_unique:
                    if self.optimistic:  # checked again at its commit
                        self.t.note_unique(pre)
                    for k, other in self.t.scan("index", pre, prefix_end(pre)):
                        if other != pk:
                            vals = {p: _none(query.get_path(doc, p)) for p, _ in ix.key}
                            raise errors.DuplicateKey(
                                f"duplicate key in unique index {ix.name} of {c.ns}: "
                                f"{vals!r:.200}", ns=c.ns, index=ix.name,
                                key_pattern=[list(k) for k in ix.key], key_value=vals)
                put_ix(key, pk)

    def _write_doc(self, c: CollInfo, pk: bytes, old: dict | None, new: dict, new_b: bytes,
                   check_unique: bool) -> None:
        if old is not None:
            self._unindex(c, pk, old)
        self.t.put("docs", c.prefix + pk, new_b)
        self._index(c, pk, new, check_unique)

    def _delete_doc(self, c: CollInfo, pk: bytes, old: dict) -> None:
        self._unindex(c, pk, old)
        self.t.delete("docs", c.prefix + pk)

    # public statements
    def insert(self, ns: str, docs: list[dict] | codec.PackedDocuments) -> WriteResult:
        """Insert ``docs``: dicts, or documents received packed (their bytes are stored)."""
        return self.statement(self._insert, ns, docs)

    def _insert(self, ns, docs):
        """Every step runs over the whole batch (C-speed maps, no Python call
        per document where a builtin can do it): pack, keys, one put of all
        documents, one put of each plain index's entries, one log append."""
        packed = None
        if type(docs) is codec.PackedDocuments:  # decoded and checked on arrival
            docs, packed = docs.docs, docs.rows
        elif not isinstance(docs, (list, tuple)):
            raise errors.InvalidDocument("insert needs a list of documents")
        elif not _DICT.issuperset(map(type, docs)):
            bad = next(d for d in docs if type(d) is not dict)
            raise errors.InvalidDocument(f"a document must be a dict, got {type(bad).__name__}")
        try:
            ids = list(map(_GET_ID, docs))
        except KeyError:  # documents without an _id get a generated one
            docs = [d if "_id" in d else {"_id": new_id(), **d} for d in docs]
            ids = list(map(_GET_ID, docs))
            packed = None  # packed again, with their _id
        c = self._coll_for_write(ns)
        lim, op_prefix = self.e.limits.document_bytes_max, codec.insert_op_prefix(ns)
        if len(ids) == 1:  # a single document: the batch passes cost more than they save
            packed = packed or [codec.pack_document(docs[0], lim)]
            pks = [_pk(ids[0])]
            rows = [(c.prefix + pks[0], packed[0])]
            ops = [op_prefix + packed[0]]
        else:
            packed = packed or codec.pack_documents(docs, lim)
            pks = encode_keys(ids) if _SIMPLE_ID.issuperset(map(type, ids)) else list(map(_pk, ids))
            rows = list(zip(map(c.prefix.__add__, pks), packed))
            ops = list(map(op_prefix.__add__, packed))
        # all documents in one call, refused whole if an _id exists or repeats:
        # the put is the duplicate check, with no lookup before it
        if not self.t.put_new("docs", rows):
            seen = set()
            for (key, _), _id in zip(rows, ids):
                if key in seen or self.t.get("docs", key) is not None:
                    raise errors.DuplicateKey(f"duplicate _id {_id!r:.100} in {ns}",
                                              ns=ns, index="_id_", key_pattern=[["_id", 1]],
                                              key_value={"_id": _id})
                seen.add(key)
        if c.indexes:
            self._index_batch(c, docs, pks)
        self._log_many(ops)
        res = WriteResult()
        res.inserted_ids = ids
        return res

    def _index_batch(self, c: CollInfo, docs: list, pks: list) -> None:
        """``_index`` for a batch of new documents: each plain index's entries in
        one put; a multikey value sends the batch down the general path."""
        ix_rows = []
        for field_, ixp in c.plain:
            vals = [d.get(field_) for d in docs]
            if not _ARRAYS.isdisjoint(map(type, vals)):  # multikey
                put_ix = self.t.putter("index")
                for d, pk in zip(docs, pks):
                    self._index(c, pk, d, True, put_ix)
                return
            ix_rows += zip(map(b"".join, zip(itertools.repeat(ixp), encode_keys(vals), pks)),
                           pks)
        self.t.put_many("index", ix_rows)
        if c.general:
            put_ix = self.t.putter("index")
            for d, pk in zip(docs, pks):
                self._index_general(c, c.general, pk, d, True, put_ix)

    def replace_many(self, ns: str, docs: list[dict] | codec.PackedDocuments,
                     upsert: bool = False, merge: bool = False) -> WriteResult:
        """Replace the document with each row's ``_id`` by the row (``merge``:
        ``$set`` the row's top-level fields into it, the others kept); with
        ``upsert`` a row whose ``_id`` has no document is inserted, else it
        is skipped. One statement (atomic: a refused row, e.g. a unique index
        violation, leaves nothing of the batch). Rows repeating an ``_id`` run
        in their order, each over the one before. ``matched``: rows that found
        their document, ``modified``: those it changed (a row equal to the
        stored document logs nothing, so a repeated batch is a no-op),
        ``inserted_ids``: the rows upserted. Logged as the ``u`` op of
        ``update`` and the ``i`` op of ``insert``."""
        return self.statement(self._replace_many, ns, docs, upsert, merge)

    def _replace_many(self, ns, docs, upsert, merge):
        packed = None
        if type(docs) is codec.PackedDocuments:  # decoded and checked on arrival
            docs, packed = docs.docs, docs.rows
        elif not isinstance(docs, (list, tuple)) or not _DICT.issuperset(map(type, docs)):
            raise errors.InvalidDocument("replace_many needs a list of documents (dicts)")
        ids = [d.get("_id") for d in docs]
        if any(i is None for i in ids):
            i = next(i for i, x in enumerate(ids) if x is None)
            raise errors.InvalidDocument(f"replace_many: document {i} of the batch has no _id "
                                         "(null or missing): rows are matched by _id; "
                                         "nothing was written")
        res = WriteResult()
        c = self._coll_for_write(ns, create=upsert)
        if c is None:  # nothing to match, nothing to insert
            return res
        pks = encode_keys(ids) if _SIMPLE_ID.issuperset(map(type, ids)) else list(map(_pk, ids))
        if not merge and packed is None:
            packed = codec.pack_documents(docs, self.e.limits.document_bytes_max)
        if len(set(pks)) == len(pks):
            self._replace_run(c, ns, docs, ids, pks, packed, upsert, merge, res)
            return res
        start, seen = 0, set()  # runs without a repeated _id, in order
        for i, pk in enumerate(pks):
            if pk in seen:
                self._replace_run(c, ns, docs[start:i], ids[start:i], pks[start:i],
                                  packed and packed[start:i], upsert, merge, res)
                start, seen = i, set()
            seen.add(pk)
        self._replace_run(c, ns, docs[start:], ids[start:], pks[start:],
                          packed and packed[start:], upsert, merge, res)
        return res

    def _replace_run(self, c: CollInfo, ns: str, docs, ids, pks, packed, upsert: bool,
                     merge: bool, res: WriteResult) -> None:
        """``_replace_many`` over rows with distinct ``_id``s: one point lookup
        per row, then (as ``_insert``) passes over the batch: one put of every
        written document, each plain index's entries in one put, one log
        append, its ops in row order."""
        keys = list(map(c.prefix.__add__, pks))
        olds = list(map(functools.partial(self.t.get, "docs"), keys))
        if merge:  # the rows' fields over the stored documents; a new row as it is
            news = [d if b is None else {**codec.unpack_document(b), **d}
                    for d, b in zip(docs, olds)]
            packed = codec.pack_documents(news, self.e.limits.document_bytes_max)
        else:
            news = docs
        missing = olds.count(None)
        res.matched += len(olds) - missing
        # the rows that change something: a new document (upsert) or a different one
        w = [i for i, o, n in zip(itertools.count(), olds, packed)
             if o != n and (o is not None or upsert)]
        if not w:
            return
        w_olds = [olds[i] for i in w]
        w_news = [packed[i] for i in w]
        w_pks = [pks[i] for i in w]
        ins = codec.insert_op_prefix(ns)
        upd, post = codec.update_op_parts(ns, not merge)
        ops = [ins + n if o is None else b"".join((upd, o, post, n))
               for o, n in zip(w_olds, w_news)]
        res.modified += len(w) - (w_olds.count(None) if missing else 0)
        if missing:
            res.inserted_ids += [ids[i] for i, o in zip(w, w_olds) if o is None]
        if c.indexes:  # every old entry first: rows may swap unique values
            for pk, o in zip(w_pks, w_olds):
                if o is not None:
                    self._unindex(c, pk, codec.unpack_document(o))
        self.t.put_many("docs", [(keys[i], n) for i, n in zip(w, w_news)])
        if c.indexes:
            self._index_batch(c, [news[i] for i in w], w_pks)
        self._log_many(ops)

    def _hits(self, ns: str, flt, multi: bool) -> tuple[list, CollInfo | None]:
        """The documents a statement changes: collected before the first write
        (no cursor runs over what it changes), and only the first unless multi.
        The filter must be a map: ``{}`` is how to say every document."""
        if type(flt) is not dict:
            raise errors.InvalidFilter(f"an update or delete needs a filter map ({{}} matches "
                                       f"every document), got {type(flt).__name__} {flt!r:.40}")
        it = self.matching(ns, flt)
        return list(it if multi else itertools.islice(it, 1)), self.coll(ns)

    def update(self, ns: str, flt, update, multi: bool = False, upsert: bool = False,
               replace: bool = False, array_filters: list | None = None,
               computed: bool = False, upsert_id=None) -> WriteResult:
        """``array_filters``: MongoDB's ``arrayFilters`` for ``$[name]`` paths;
        the positional ``$`` takes its element from ``flt``. A replacement's
        op says it replaced the document (a ``replace`` change event), unless
        ``computed``: the caller computed it from an update (a pipeline).
        ``upsert_id``: the ``_id`` of an upserted document the filter gives
        none (MongoDB's drivers expect an ObjectId; by default ``new_id()``)."""
        return self.statement(self._update, ns, flt, update, multi, upsert, replace,
                              array_filters, computed, upsert_id)

    def _update(self, ns, flt, update, multi, upsert, replace, array_filters=None,
                computed=False, upsert_id=None):
        if type(update) is not dict:
            raise errors.InvalidUpdate("an update must be a dict")
        if replace and upd.is_operator_update(update):
            raise errors.InvalidUpdate("a replacement document cannot contain $ operators")
        if not replace and not upd.is_operator_update(update):
            raise errors.InvalidUpdate("update_one/update_many need $ operators "
                                       "(use replace_one to replace a document)")
        if replace and multi and not computed:  # MongoDB's rule, and its words
            raise errors.InvalidUpdate("multi update is not supported for replacement-style "
                                       "update")
        lim = self.e.limits.document_bytes_max
        res = WriteResult()
        hits, c = self._hits(ns, flt, multi)
        pos = upd.Positional(flt, array_filters)  # compiled once for every document
        for pk, old in hits:
            res.matched += 1
            new = upd.apply_update(old, update, positional=pos)
            old_b = codec.pack(old)
            new_b = codec.pack_document(new, lim)
            if new_b == old_b:
                continue
            self._write_doc(c, pk, old, new, new_b, True)
            self._log(codec.pack_image_op("u", ns, old_b, new_b, replace and not computed))
            res.modified += 1
        if not hits and upsert:
            seed = upd.upsert_seed(flt if flt is not None else {})
            doc = upd.apply_update(seed, update, inserting=True, positional=pos)
            if "_id" not in doc:
                doc = {"_id": seed["_id"] if "_id" in seed else
                       new_id() if upsert_id is None else upsert_id, **doc}
            res.upserted_id = doc["_id"]
            self._insert(ns, [doc])
        return res

    def delete(self, ns: str, flt, multi: bool = False) -> WriteResult:
        return self.statement(self._delete, ns, flt, multi)

    def _delete(self, ns, flt, multi):
        res = WriteResult()
        hits, c = self._hits(ns, flt, multi)
        for pk, old in hits:
            self._delete_doc(c, pk, old)
            self._log(codec.pack_image_op("d", ns, codec.pack(old), None))
            res.deleted += 1
        return res

    def create_collection(self, ns: str) -> bool:
        def run():
            split_ns(ns, self.e.limits)
            if self.coll(ns) is not None:
                return False
            self._coll_for_write(ns)
            return True
        return self.statement(run)

    def drop_collection(self, ns: str) -> bool:
        def run():
            split_ns(ns, self.e.limits)
            c = self.coll(ns)
            if c is None:
                return False
            self._drop(c)
            self._log(codec.pack({"op": "c", "ns": ns, "cmd": "drop", "irreversible": True}))
            return True
        return self.statement(run)

    def rename_collection(self, ns: str, to: str, drop_target: bool = False) -> bool:
        """Rename collection ``ns`` to ``to`` (any database), its documents and
        indexes with it: only its catalog record moves. A ``to`` that exists
        is refused, or dropped first with ``drop_target`` (an irreversible
        drop, logged before the rename in the same entry)."""
        def run():
            split_ns(ns, self.e.limits)
            split_ns(to, self.e.limits)
            if to == ns:  # before the source's existence, as MongoDB
                raise errors.IllegalOperation(f"renameCollection {ns}: Can't rename a "
                                              "collection to itself", ns=ns)
            c = self.coll(ns)
            if c is None:
                raise errors.CollectionNotFound(f"renameCollection: source namespace {ns} "
                                                "does not exist", ns=ns)
            old = self.coll(to)
            if old is not None:
                if not drop_target:
                    raise errors.CollectionExists(f"renameCollection: target namespace {to} "
                                                  "exists (pass dropTarget to replace it)",
                                                  ns=to)
                self._drop(old)
                self._log(codec.pack({"op": "c", "ns": to, "cmd": "drop",
                                      "irreversible": True}))
            self._rename(c, to)
            self._log(codec.pack({"op": "c", "ns": ns, "cmd": "rename", "to": to}))
            return True
        return self.statement(run)

    def _rename(self, c: CollInfo, to: str) -> None:
        self.t.delete("catalog", c.ns.encode())
        self._save_coll(CollInfo(to, c.id, c.indexes))

    def _drop(self, c: CollInfo) -> None:
        _delete_range(self.t, "docs", c.prefix)
        for ix in c.indexes.values():
            _delete_range(self.t, "index", ix.prefix)
        self.t.delete("catalog", c.ns.encode())

    def create_index(self, ns: str, key, unique: bool = False, name: str | None = None,
                     expire_after_s: int | None = None, sparse: bool = False,
                     partial: dict | None = None) -> str:
        """``expire_after_s``: a TTL index (``catalog.check_expire``);
        ``sparse``: only documents with one of the key's fields are indexed;
        ``partial``: only those this filter matches (``partialFilterExpression``)."""
        return self.statement(self._create_index, ns, key, unique, name, True, expire_after_s,
                              sparse, partial)

    def _create_index(self, ns, key, unique, name, deciding, expire_after_s=None,
                      sparse=False, partial=None):
        # deciding: the primary creates it here (uniqueness and one index a key
        # checked); False for an op a member replays (apply_op): already decided
        key = normalize_index_key(key)
        expire_after_s = check_expire(expire_after_s, key)
        partial = check_partial(partial)
        name = name or index_name(key)
        if not isinstance(name, str) or not name or name == "_id_" or "\x00" in name:
            raise errors.InvalidName(f"invalid index name {name!r}")
        if key == [["_id", 1]]:
            return "_id_"
        c = self._coll_for_write(ns)
        old = c.indexes.get(name)
        ix = IndexInfo(name, self.e._next_counter(self.t, b"next_id") if old is None else 0,
                       key, bool(unique), expire_after_s, bool(sparse), partial)
        if old is not None:
            if old.spec() == ix.spec():
                return name
            raise errors.IndexKeySpecsConflict(f"index {name} already exists on {ns} with "
                                               f"a different spec {old.spec()}")
        same = deciding and next(  # decided here, not replayed (apply_op)
            (x for x in c.indexes.values() if x.key == key and x.partial == partial), None)
        if same:  # one key, one index (MongoDB's rule, partial ones apart)
            raise errors.IndexOptionsConflict(
                f"index already exists on {ns} with a different name: {same.name} (key "
                f"{key}); drop it first, or create it under that name")
        for k, v in self.t.scan("docs", c.prefix, prefix_end(c.prefix)):
            # build one index at a time: _index checks uniqueness within it
            only = CollInfo(ns, c.id, {name: ix})
            self._index(only, k[4:], codec.unpack_document(v), deciding)
        self._save_coll(CollInfo(ns, c.id, {**c.indexes, name: ix}))
        self._log(codec.pack({"op": "c", "ns": ns, "cmd": "createIndex", "name": name,
                              "spec": ix.spec()}))
        return name

    def set_index_expiry(self, ns: str, name: str, expire_after_s) -> int | None:
        """Make index ``name`` of ``ns`` a TTL index of ``expire_after_s``
        seconds, or change its expiry (MongoDB's ``collMod`` of an index);
        returns the expiry it had (None: none). Logged as the index dropped
        and created again with the new expiry, in one statement, so members,
        rollback and change streams need nothing new (it is rebuilt)."""
        def run():
            split_ns(ns, self.e.limits)
            c = self.coll(ns)
            if c is None or name not in c.indexes:
                raise errors.IndexNotFound(f"index {name!r} not found on {ns}", ns=ns)
            ix = c.indexes[name]
            new = check_expire(expire_after_s, ix.key)
            if new is None or new == ix.expire_after_s:
                return ix.expire_after_s
            self._drop_index_logged(c, name)
            self._create_index(ns, ix.key, ix.unique, name, True, new, ix.sparse, ix.partial)
            return ix.expire_after_s
        return self.statement(run)

    def drop_index(self, ns: str, name: str) -> None:
        def run():
            split_ns(ns, self.e.limits)
            c = self.coll(ns)
            if name == "_id_":
                raise errors.InvalidOperation("the _id_ index cannot be dropped")
            if c is None or name not in c.indexes:
                raise errors.IndexNotFound(f"index {name!r} not found on {ns}", ns=ns)
            self._drop_index_logged(c, name)
        return self.statement(run)

    def _drop_index_logged(self, c: CollInfo, name: str) -> None:
        """Drop index ``name`` of ``c`` and log it (its spec: rollback builds it again)."""
        ix = self._drop_index(c, name)
        self._log(codec.pack({"op": "c", "ns": c.ns, "cmd": "dropIndex", "name": name,
                              "spec": ix.spec()}))

    def _drop_index(self, c: CollInfo, name: str) -> IndexInfo:
        ix = c.indexes[name]
        _delete_range(self.t, "index", ix.prefix)
        self._save_coll(CollInfo(c.ns, c.id, {n: i for n, i in c.indexes.items() if n != name}))
        return ix

    # applying logged ops (secondaries, rollback, revert): no uniqueness checks,
    # the primary has already decided; images make it idempotent per document
    def apply_op(self, op: dict) -> None:
        kind = op["op"]
        if kind == "n":
            return
        ns = op["ns"]
        if kind == "c":
            cmd = op["cmd"]
            c = self.coll(ns)
            if cmd == "create":
                self._coll_for_write(ns)
            elif cmd == "drop":
                if c is not None:
                    self._drop(c)
            elif cmd == "createIndex":
                spec = op["spec"]
                self._create_index(ns, spec["key"], spec["unique"], op["name"], False,
                                   spec.get("expireAfterSeconds"), bool(spec.get("sparse")),
                                   spec.get("partialFilterExpression"))
            elif cmd == "dropIndex":
                if c is not None and op["name"] in c.indexes:
                    self._drop_index(c, op["name"])
            elif cmd == "rename":
                if c is not None:
                    old = self.coll(op["to"])
                    if old is not None:  # never on a primary's order of ops; stay safe
                        self._drop(old)
                    self._rename(c, op["to"])
            if self._log_on and cmd in ("drop", "dropIndex", "rename"):
                self._log(codec.pack(op))
            return
        c = self._coll_for_write(ns)
        if kind == "d":
            pk = _pk(op["pre"]["_id"])
            cur = self._get_pk(c, pk)
            if cur is not None:
                self._delete_doc(c, pk, cur)
            self._log(codec.pack(op))
            return
        post = op["post"]
        pk = _pk(post["_id"])
        self._write_doc(c, pk, self._get_pk(c, pk), post, codec.pack(post), False)
        self._log(codec.pack(op))

    def revert_to(self, target) -> dict:
        """Append compensating ops that return every collection and index to
        their state right after ``target``: the inverse of every later op,
        newest first, from the logged images, in THIS transaction (one GTID, so
        the revert is atomic and replicates like any write). Later writes that
        touched the same documents are undone too. Returns the plan."""
        plan = self.revert_plan(target)
        if not plan["entries"]:
            return plan
        self._log(codec.pack({"op": "n", "revert": {"to": plan["target"], "newest": plan["newest"],
                                                    "oldest": plan["oldest"],
                                                    "entries": plan["entries"]}}))
        for _, ops in self.revert_entries(target):
            self.undo_ops(ops)
        return plan

    def undo_ops(self, ops: list[dict]) -> None:
        """Undo ``ops`` (one entry's, in their logged order) newest first."""
        inv = [oplog.invert(op) for op in reversed(ops)]  # raises before writing anything
        for op in inv:
            self.apply_op(op)

    # finishing
    @property
    def nops(self) -> int:
        return self._nops

    @property
    def optimistic(self) -> bool:
        """Begun by ``Engine.begin_snapshot`` and not yet holding the writer."""
        return type(self.t) is Overlay

    def take_writer(self) -> None:
        """An optimistic transaction's commit, first step: take the store's
        writer and move this transaction's writes into a write transaction,
        which it holds until ``commit`` or ``abort``. ``WriteConflict`` (the
        transaction aborted) if, since its snapshot, another commit changed a
        document or entry it wrote or a collection it used, or gave another
        document a unique key it added: the first to commit wins. Nothing to
        do for one that wrote nothing (its commit only ends its snapshot)."""
        ov = self.t
        if not self.optimistic or not ov.writes:
            return
        w = self.e.store.write()
        try:
            what = ov.move_into(w)
            if what is not None:
                raise errors.WriteConflict(
                    f"another write changed {what} after this transaction began; the "
                    "transaction is aborted: run it again")
        except BaseException:
            w.abort()
            self.abort()
            raise
        ov.abort()  # its snapshot
        self.t = w

    def commit(self, gtid: GTID | None = None, ts_ms: int | None = None) -> GTID | None:
        """Write the oplog entry and commit. Returns its GTID (None if nothing changed).

        Without ``gtid`` the engine takes the next one under its durable term
        (the writer lock serialises commits, so that is dense and ordered).
        """
        if self._done:
            raise errors.TransactionAborted("the transaction has already finished")
        self._done = True
        if not self._log_on or self._nops == 0:
            self.t.commit()
            return None
        grp = self._group
        try:
            gtid, h = self.e._append(self.t, gtid, ts_ms, self, None if grp is None else grp.tail)
            self.t.commit()
        except BaseException:
            self.t.abort()
            raise
        if grp is None:
            self.e._committed(gtid, h)
        else:  # durable only when the group commits
            grp.tail = (gtid, h)
        return gtid

    def abort(self) -> None:
        if not self._done:
            self._done = True
            self.t.abort()

    def __enter__(self):
        return self

    def __exit__(self, et, e, tb):
        if et is None:
            self.commit()
        else:
            self.abort()


class WriteGroup:
    """Several autocommit statements in one store transaction, each still its
    own oplog entry under its own GTID.

    The writer of a member runs the writes queued at one moment as a group:
    one LMDB commit (one flush of the touched pages) instead of one per
    statement. Each statement runs in a child transaction, so one that fails
    leaves no trace while the others stand; nothing is visible, or durable,
    before ``commit``. The GTIDs must follow each other, as for single commits.
    """

    def __init__(self, engine: "Engine"):
        self.e = engine
        self.t = engine.store.write()
        self.tail: tuple[GTID, int] | None = None  # the last entry sealed in this group
        self._done = False

    def statement(self) -> Transaction:
        """A transaction for one statement; its ``commit(gtid)`` seals it into the group."""
        if self._done:
            raise errors.TransactionAborted("the write group has already finished")
        return Transaction(self.e, self.t.nested(), autocommit=True, group=self)

    def noop(self, gtid: GTID) -> None:
        """An ``n`` entry for a GTID taken by a statement that then failed."""
        tx = self.statement()
        tx._log(codec.pack({"op": "n"}))
        tx.commit(gtid)

    def commit(self) -> None:
        self._done = True
        self.t.commit()
        if self.tail is not None:
            self.e._committed(*self.tail)

    def abort(self) -> None:
        if not self._done:
            self._done = True
            self.t.abort()
