"""Reading: ``Reader``, the queries over one store transaction.

A read snapshot (``Engine.reader()``), or a write transaction seeing its own
writes (``Transaction`` in raymx/storage/transaction.py extends it): query
plans over the ``_id`` and secondary indexes, point-in-time answers (``at``)
from the oplog's pre-images, and what a revert would undo.
"""
from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Iterator

from bson import ObjectId

from raymx.storage import codec, errors, oplog, query
from raymx.storage.catalog import CollInfo, Stats, _applied_in, split_ns
from raymx.storage.gtid import GTID, ZERO
from raymx.storage.keys import T_ARR, encode_key, prefix_end, value_end
from raymx.storage.projection import nested_as_paths, project

if TYPE_CHECKING:
    from raymx.storage.engine import Engine


class _NotId:
    """Paths that may hold arrays: every one but _id (an array _id is refused)."""

    def __contains__(self, p) -> bool:
        return p != "_id"


_MULTIKEY = _NotId()
_ARRAYS, _ABOVE_ARRAYS = bytes((T_ARR,)), bytes((T_ARR + 1,))  # the array bracket of keys

# _id values an equality finds with one B-tree lookup, and whose equality
# with the stored _id, type for type, is the filter's match
ID_POINT_TYPES = frozenset((int, str, float, bytes, ObjectId))


def id_point(flt) -> bool:
    """Does the filter name one document by an ``_id`` equality (one B-tree
    lookup, never a scan)?"""
    return type(flt) is dict and "_id" in flt and type(flt["_id"]) in ID_POINT_TYPES


def _range_bounds(prefix: bytes, b: query.Bounds):
    """Key range [start, stop) for a one-field range condition on an index."""
    lo, hi = b.low, b.high
    tag = encode_key((lo or hi)[0])[:1]
    start = prefix + tag
    stop = prefix + bytes((tag[0] + 1,))
    if lo is not None:
        vk = encode_key(lo[0])
        k = prefix + vk
        start = k if lo[1] else (value_end(k, vk) or stop)
    if hi is not None:
        vk = encode_key(hi[0])
        k = prefix + vk
        stop = (value_end(k, vk) or stop) if hi[1] else k
    return start, stop


_RANGES_MAX = 1000  # a compound index's key ranges from points ($in x $in): at most this many


def _best_index(c: CollInfo, bounds: dict):
    """The index whose plan the filter's ``bounds`` fit best (points on its
    first field before a range, then the more fields it narrows by, then a
    unique one-field index), among those holding every document; or None."""
    best = None
    for x in c.indexes.values():
        xb = bounds.get(x.key[0][0])
        if xb is None or not x.every_document:
            continue
        score = (xb.points is not None, _bounded_fields(x, bounds), x.unique and len(x.key) == 1)
        if best is None or score > best[0]:
            best = (score, x)
    return None if best is None else best[1]


def _bounded_fields(ix, bounds: dict) -> int:
    """How many of index ``ix``'s leading fields ``_index_ranges`` narrows by."""
    n, ranges = 0, 1
    for i, (path, _) in enumerate(ix.key):
        b = bounds.get(path)
        if b is None:
            break
        if b.points is None:
            return n + 1
        ranges *= len(b.points)
        if i and ranges > _RANGES_MAX:  # the first field's points are each a range anyway
            break
        n += 1
    return n


def _examine(stats: Stats, d: dict) -> dict:
    """Count ``d`` as examined (a read's time limit is checked every
    ``CHECK_EVERY``)."""
    stats.examined += 1
    if stats.check is not None and not stats.examined & (stats.CHECK_EVERY - 1):
        stats.check()
    return d


class Reader:
    """Queries over one transaction (a read snapshot, or a write txn seeing its own writes).

    ``at(point)`` makes its queries answer as of an older GTID (read concern
    "majority": the majority-committed point): every document an op touched
    after ``point`` is read as the pre-image of the first such op, from the
    oplog; the rest as stored. One implementation with Spark's ``at=`` reads
    (``overrides``)."""

    def __init__(self, engine: "Engine", txn):
        self.e = engine
        self.t = txn
        self.point: GTID | None = None  # answer as of this GTID (None: as stored)
        self._ov: dict[str, dict | None] = {}
        self.stored_bytes = 0  # the last document decoded, as stored (``Stats.sized``)

    def at(self, point: GTID | None) -> "Reader":
        """Answer as of ``point`` (None, or at/after this snapshot: as stored)."""
        g = _applied_in(self.t) or ZERO
        self.point = None if point is None or point >= g else point
        self._until, self._ov = g, {}
        return self

    def overrides(self, ns: str, at: GTID, until: GTID) -> list[tuple[bytes, bytes | None]] | None:
        """(pk, packed document as of ``at`` or None) for every document of ``ns``
        an op changed in (at, until]: the pre-image of its first such op. None
        if the collection did not exist at ``at`` (created in the range);
        InvalidOperation if it was dropped in the range (a drop logs no documents)."""
        first: dict[bytes, bytes | None] = {}
        start = prefix_end(at.to_bytes()) if at != ZERO else None
        for k, v in self.t.scan("oplog", start, prefix_end(until.to_bytes())):
            for op in self.e.entry_ops(self.t, codec.unpack(v, "oplog entry")):
                if op.get("ns") != ns and op.get("to") != ns:
                    continue
                kind = op["op"]
                if kind == "c":
                    if op["cmd"] == "create" and not first or op.get("to") == ns and not first:
                        return None  # created (or renamed to this name) after `at`
                    if op["cmd"] == "drop" or op["cmd"] == "rename":
                        what = "dropped" if op["cmd"] == "drop" else "renamed"
                        raise errors.InvalidOperation(
                            f"{ns} was {what} at {GTID.from_bytes(k)}, after {at}, and a "
                            f"{'drop' if what == 'dropped' else 'rename'} does not log the "
                            f"documents: it cannot be read as of {at}; read it at a later "
                            "GTID", ns=ns)
                    continue
                img = op["post"] if kind == "i" else op["pre"]
                pk = encode_key(img["_id"])
                if pk not in first:
                    first[pk] = None if kind == "i" else codec.pack(op["pre"])
        return sorted(first.items())

    def _point_view(self, ns: str) -> dict | None:
        """{pk: packed doc or None} as of ``self.point``; {"": None} when the
        collection did not exist then. Computed once per collection."""
        if ns not in self._ov:
            ov = self.overrides(ns, self.point, self._until)
            if self.point != ZERO and self.t.get("oplog", self.point.to_bytes()) is None:
                first = self.t.first("oplog")
                if first is not None and GTID.from_bytes(first[0]) > self.point:
                    raise errors.TooStale(f"{self.point} is before the oplog's first entry")
            self._ov[ns] = {b"": None} if ov is None else dict(ov)
        return self._ov[ns]

    def coll(self, ns: str) -> CollInfo | None:
        """The catalog entry, parsed once per record version and shared: never
        mutate it, save a new CollInfo instead."""
        b = self.t.get("catalog", ns.encode())
        if b is None:
            return None
        hit = self.e._catalog_cache.get(ns)
        if hit is None or hit[0] != b:
            hit = self.e._catalog_cache[ns] = (b, CollInfo.from_record(ns, b))
        return hit[1]

    def _get_pk(self, c: CollInfo, pk: bytes):
        b = self.t.get("docs", c.prefix + pk)
        return None if b is None else self._doc(b)

    def _doc(self, b: bytes) -> dict:
        """The document stored as ``b``, its size noted (``stored_bytes``)."""
        self.stored_bytes = len(b)
        return codec.unpack_document(b)

    def _candidates(self, c: CollInfo, flt, stats: Stats, hint=None
                    ) -> Iterator[tuple[bytes, dict]]:
        """(pk, doc) of the documents a filter's plan reads (to be matched):
        by ``_id`` where the filter bounds it, else through the index its
        bounds fit best (points before ranges, a unique one-field index
        first), else every document. ``hint`` (an index's name or key, as
        ``[[path, 1 | -1], ...]``, or ``{"$natural": 1 | -1}``) takes that
        plan, as MongoDB's: an index the filter does not bound is read whole,
        in its keys' order (a sparse or partial one only has what it holds,
        as in MongoDB)."""
        if isinstance(hint, list):  # an index's key: the index with it
            hint = "_id_" if hint == [["_id", 1]] else next(
                (x.name for x in c.indexes.values() if x.key == hint), hint)
        if hint is not None and not isinstance(hint, (str, list)) and not (
                isinstance(hint, dict) and list(hint) == ["$natural"]
                and hint["$natural"] in (1, -1)):
            raise errors.InvalidOperation(f"a hint is an index's name or key, or {{$natural: "
                                          f"1 | -1}}, not {hint!r:.100}")
        bounds = query.extract_bounds(flt, multikey=_MULTIKEY)
        b = bounds.get("_id")
        if hint == "_id_" or (hint is None and b is not None):
            yield from self._through_ids(c, b, stats)
            return
        ix = None
        if hint is None:
            ix = _best_index(c, bounds)
            if ix is None:
                plans = self._or_plans(c, flt)
                if plans is not None:
                    yield from self._through_or(c, plans, stats)
                    return
        elif not isinstance(hint, dict):
            ix = c.indexes.get(hint) if isinstance(hint, str) else None
            if ix is None:
                raise errors.InvalidOperation(f"hint provided does not correspond to an "
                                              f"existing index: {hint!r:.200}")
        if ix is not None:
            yield from self._through_index(c, ix, bounds, flt, stats)
            return
        stats.plan = "COLLSCAN"
        reverse = isinstance(hint, dict) and hint.get("$natural") == -1
        for k, v in self.t.scan("docs", c.prefix, prefix_end(c.prefix), reverse):
            yield k[4:], self._doc(v)

    def _or_plans(self, c: CollInfo, flt) -> list | None:
        """For a filter with a top-level ``$or`` none of whose other conditions
        an index serves: each clause's plan (``_id`` bounds, or its best index
        and bounds), when every clause has one; else None (a collection scan)."""
        clauses = flt.get("$or") if type(flt) is dict else None
        if type(clauses) is not list or len(clauses) < 2:
            return None
        plans = []
        for clause in clauses:
            cb = query.extract_bounds(clause, multikey=_MULTIKEY)
            x = None if cb.get("_id") is not None else _best_index(c, cb)
            if cb.get("_id") is None and x is None:
                return None  # a clause only a scan serves: one scan for all of them
            plans.append((x, cb, clause))
        return plans

    def _through_or(self, c: CollInfo, plans: list, stats: Stats
                    ) -> Iterator[tuple[bytes, dict]]:
        """Each ``$or`` clause's plan in turn, each document once (MongoDB's
        OR stage): every match of the filter matches a clause, so its plan
        reads it."""
        stats.plan = "OR"
        seen, sub = set(), Stats()
        for x, cb, clause in plans:
            it = self._through_ids(c, cb["_id"], sub) if x is None else \
                self._through_index(c, x, cb, clause, sub)
            for pk, d in it:
                if pk not in seen:
                    seen.add(pk)
                    yield pk, d

    def _through_ids(self, c: CollInfo, b, stats: Stats) -> Iterator[tuple[bytes, dict]]:
        """The documents whose ``_id`` is within bounds ``b`` (None: all), in order."""
        self.e.note_index(c.ns, "_id_")
        if b is not None and b.points is not None:
            stats.plan = "IDHACK"
            for pk in sorted({encode_key(v) for v in b.points}):
                d = self._get_pk(c, pk)
                if d is not None:
                    yield pk, d
            return
        stats.plan = "IXSCAN _id_"
        start, stop = _range_bounds(c.prefix, b) if b is not None else (
            c.prefix, prefix_end(c.prefix))
        for k, v in self.t.scan("docs", start, stop):
            yield k[4:], self._doc(v)

    def _through_index(self, c: CollInfo, ix, bounds: dict, flt, stats: Stats
                       ) -> Iterator[tuple[bytes, dict]]:
        """The documents of index ``ix``'s entries within the filter's
        ``bounds`` (``_index_ranges``), each once, in the index's order."""
        stats.plan = f"IXSCAN {ix.name}"
        self.e.note_index(c.ns, ix.name)
        seen = set()
        for start, stop in self._index_ranges(ix, bounds, flt):
            for _, pk in self.t.scan("index", start, stop):
                if pk in seen:
                    continue
                seen.add(pk)
                d = self._get_pk(c, pk)
                if d is not None:
                    yield pk, d

    def _index_ranges(self, ix, bounds: dict, flt) -> list[tuple[bytes, bytes | None]]:
        """The key ranges of index ``ix`` that hold every entry a document
        matching ``flt`` (its ``bounds``) has: the leading fields the filter
        sets to points narrow them one field after another (a range per
        combination of points, at most ``_RANGES_MAX``), then a field it
        bounds by a range narrows each once more; the first field it does
        not bound ends them. No bound on the first field: the whole index.

        Sound for arrays as the one-field bounds are (``extract_bounds``'
        multikey rules: of a range, only its low end, since different
        elements may meet each end): a document's entries are the cross
        product of its fields' keys, so one that matches has an entry within
        each field's bounds. A range on a top-level field keeps both ends
        where one probe of the array bracket under the range's head finds no
        array there (no document with those points holds one at that field)."""
        heads = [(ix.prefix, None)]  # (key so far, the last point's value key)
        for path, _ in ix.key[:_bounded_fields(ix, bounds)]:
            b = bounds[path]
            if b.points is None:
                exact = None
                if b.high is None and "." not in path:
                    exact = query.extract_bounds(flt, multikey=False).get(path)
                    exact = exact if exact is not None and exact.high is not None else None
                return [_range_bounds(h, exact if exact is not None and next(iter(
                    self.t.scan("index", h + _ARRAYS, h + _ABOVE_ARRAYS)), None) is None
                    else b) for h, _ in heads]
            vks = sorted({encode_key(v) for v in b.points})
            heads = [(h + vk, vk) for h, _ in heads for vk in vks]
        if not heads:  # $in: [] matches nothing
            return []
        if heads[0][1] is None:
            return [(ix.prefix, prefix_end(ix.prefix))]
        return [(h, value_end(h, vk)) for h, vk in heads]

    def by_id(self, ns: str, flt, stats: Stats | None = None) -> list | None:
        """(pk, doc) matching ``flt`` by one lookup, when ``flt`` is exactly
        ``{"_id": v}`` and the lookup is certain (see ``_id_point``); None
        when only the general plan (``matching``) can tell."""
        split_ns(ns, self.e.limits)
        if self.point is None and id_point(flt) and len(flt) == 1:
            return self._id_point(ns, flt["_id"], stats if stats is not None else Stats())
        return None

    def matching(self, ns: str, flt, stats: Stats | None = None, hint=None
                 ) -> Iterator[tuple[bytes, dict]]:
        """(pk, doc) of every document matching ``flt``, in plan order
        (``hint``: that plan, see ``_candidates``)."""
        stats = stats if stats is not None else Stats()
        hits = self.by_id(ns, flt, stats) if hint is None else None
        if hits is not None:  # certain: no filter to compile, no bounds to derive
            yield from hits
            return
        match = query.compile_filter(flt)
        ov = self._point_view(ns) if self.point is not None else None
        c = self.coll(ns)
        if c is None or (ov is not None and b"" in ov):
            stats.plan = "EOF"
            return
        check, every = stats.check, stats.CHECK_EVERY - 1
        for pk, d in self._candidates(c, flt, stats, hint):
            if ov and pk in ov:
                continue  # changed after the point: its image then is matched below
            stats.examined += 1
            if check is not None and not stats.examined & every:
                check()
            if match(d):
                yield pk, d
        for pk, b in sorted((ov or {}).items()):
            if b is not None:
                stats.examined += 1
                if check is not None and not stats.examined & every:
                    check()
                d = self._doc(b)
                if match(d):
                    yield pk, d

    def _id_point(self, ns: str, v, stats: Stats) -> list | None:
        """``{"_id": v}`` by one lookup: the matching (pk, doc), if any; None
        when only the general plan can tell (a stored _id of another type that
        sorts equal, 1.0 for 1, or a NaN) or names what is wrong (an integer
        no key holds)."""
        try:
            pk = encode_key(v)
        except errors.InvalidDocument:
            return None
        c = self.coll(ns)
        if c is None:
            stats.plan = "EOF"
            return []
        stats.plan = "IDHACK"
        self.e.note_index(ns, "_id_")
        d = self._get_pk(c, pk)
        if d is None:
            return []  # the general plan looks up this same key
        got = d.get("_id")
        if type(got) is not type(v) or got != v:
            return None
        stats.examined += 1
        return [(pk, d)]

    def find(self, ns: str, flt=None, projection=None, sort=None, skip: int = 0,
             limit: int = 0, stats: Stats | None = None, hint=None) -> Iterator[dict]:
        """``hint``: the plan to read by (``_candidates``); a sort is then
        done over what it reads, not by an index holding the sort's order."""
        if not isinstance(skip, int) or skip < 0 or not isinstance(limit, int) or limit < 0:
            raise errors.InvalidFilter("skip and limit must be non-negative integers")
        if isinstance(projection, dict):  # sub-objects as dotted paths once, not per document
            projection = nested_as_paths(projection)
        if projection is not None:
            project({}, projection, flt)  # validate before doing any work
        keyf = query.sort_key(sort) if sort else None
        stats = stats if stats is not None else Stats()
        ordered = self._in_sort_order(ns, flt, sort, stats) \
            if keyf is not None and hint is None else None
        stats.sized = keyf is None  # each document yielded as decoded, or smaller (projected)
        if ordered is not None:  # a scan that reads them in the sort's order: no sort
            match = query.compile_filter(flt)
            docs: Iterator[dict] = (d for d in ordered if match(d))
        else:
            docs = (d for _, d in self.matching(ns, flt, stats, hint))
            if keyf is not None:  # the first skip + limit of the sorted order, kept so
                docs = iter(heapq.nsmallest(skip + limit, docs, key=keyf) if limit
                            else sorted(docs, key=keyf))
        n = 0
        for i, d in enumerate(docs):
            if i < skip:
                continue
            yield d if projection is None else project(d, projection, flt)
            n += 1
            if limit and n >= limit:
                return

    def _in_sort_order(self, ns: str, flt, sort, stats: Stats) -> Iterator[dict] | None:
        """The candidates for ``flt`` (to be matched still) in the order of
        ``sort``, the order ``sorted(key=query.sort_key(sort))`` gives, from a
        scan that holds them so; then a ``find(...).sort(...).limit(n)`` reads
        about n documents. The scans: the documents by ``_id`` (a sort on
        ``_id``); an index that holds every document, whose last field is the
        sort's (a sort on that field, then maybe ``_id``, one direction),
        whose other fields the filter sets to one value each, and which holds
        no array at the sort's field there. None where no such scan exists,
        where the filter bounds another indexed field or names points on the
        sort's field (that plan reads fewer documents, then sorts them), or
        as of an older point."""
        fields = query.sort_spec(sort)
        d = fields[0][1]
        paths = [".".join(p) for p, x in fields if x == d]
        if self.point is not None or len(paths) != len(fields) or len(paths) > 2 \
                or (len(paths) == 2 and paths[1] != "_id"):
            return None
        c = self.coll(ns)
        by_id = paths[0] == "_id"
        ends = [] if c is None or by_id else [
            x for x in c.indexes.values() if x.every_document and x.key[-1][0] == paths[0]]
        if c is None or not (by_id or ends):  # decided before the filter's bounds are read
            return None
        bounds = query.extract_bounds(flt, multikey=_MULTIKEY)
        reverse, direction = d == -1, "backward" if d == -1 else "forward"
        ix, eq = None, []
        if not by_id:
            fit = [x for x in ends if all(p in bounds and bounds[p].points is not None
                                          and len(bounds[p].points) == 1 for p, _ in x.key[:-1])]
            if not fit:
                return None
            ix = max(fit, key=lambda x: len(x.key))  # the most fields the filter sets
            eq = [p for p, _ in ix.key[:-1]]
        indexed = {"_id", *(x.key[0][0] for x in c.indexes.values() if x.every_document)}
        if any(p in indexed and p not in eq and (b.points is not None or p != paths[0])
               for p, b in bounds.items()):
            return None  # the filter's own plan reads fewer documents, or as few
        b = bounds.get(paths[0])
        if b is not None and "." in paths[0]:
            # an array along the path leaves no array entry to probe for, and a
            # document's place is its least (greatest, backward) key, which the
            # filter's bounds may leave out while another of its keys matches:
            # {b: [{}, {c: 1}]} sorts by b.c as null, yet {b.c: {$gte: 1}} finds it
            return None
        if by_id:
            if len(paths) > 1:
                return None
            start, stop = _range_bounds(c.prefix, b) if b is not None else (
                c.prefix, prefix_end(c.prefix))
            stats.plan, stats.in_order = "IXSCAN _id_", direction
            self.e.note_index(ns, "_id_")
            return (_examine(stats, self._doc(v))
                    for _, v in self.t.scan("docs", start, stop, reverse))
        vks = [encode_key(bounds[p].points[0]) for p in eq]
        head = ix.prefix + b"".join(vks)
        if next(iter(self.t.scan("index", head + _ARRAYS, head + _ABOVE_ARRAYS)), None) \
                is not None:
            return None  # an array's entries (each element, the whole) are not its sort place
        if b is not None:
            start, stop = _range_bounds(head, b)
        else:
            start, stop = head, value_end(head, vks[-1]) if vks else prefix_end(head)
        stats.plan, stats.in_order = f"IXSCAN {ix.name}", direction
        self.e.note_index(ns, ix.name)
        return self._by_index(c, len(head), start, stop, reverse, len(paths) == 1, stats)

    def _by_index(self, c: CollInfo, head: int, start: bytes, stop: bytes, reverse: bool,
                  ties_by_id: bool, stats: Stats) -> Iterator[dict]:
        """The documents of the index entries in [start, stop), once each (a
        value reached through an array of subdocuments has several), in key
        order; ``ties_by_id``: each run of one key (the entry's bytes after
        the first ``head``, to its primary key) in ``_id`` order, also when
        ``reverse`` (as a stable sort by that key leaves them)."""
        seen, run, run_key = set(), [], None
        runs = reverse and ties_by_id
        for entry, pk in self.t.scan("index", start, stop, reverse):
            if pk in seen:
                continue
            seen.add(pk)
            if runs:  # a new key ends the run before it: no document read past it
                k = entry[head:len(entry) - len(pk)]
                if k != run_key:
                    yield from reversed(run)
                    run, run_key = [], k
            d = self._get_pk(c, pk)
            if d is None:
                continue
            _examine(stats, d)
            if runs:
                run.append(d)
            else:
                yield d
        yield from reversed(run)

    def count(self, ns: str, flt=None, stats: Stats | None = None, hint=None) -> int:
        """The documents matching ``flt``; with no filter (and no hint),
        counted by their keys alone (nothing decoded), as stored or as of
        ``at``."""
        if not flt and self.point is None and hint is None:
            query.compile_filter(flt)  # a filter of the wrong type says so
            split_ns(ns, self.e.limits)
            c = self.coll(ns)
            if stats is not None:
                stats.plan = "RECORD_STORE_FAST_COUNT"
            return 0 if c is None else sum(
                1 for _ in self.t.scan_keys("docs", c.prefix, prefix_end(c.prefix)))
        return sum(1 for _ in self.matching(ns, flt, stats, hint))

    def distinct(self, ns: str, key: str, flt=None, stats: Stats | None = None) -> list:
        """The distinct values at ``key`` among the documents matching ``flt``
        (``query.distinct_values``: an array's elements count, MongoDB's
        order). With no filter and a one-field index on ``key`` that holds
        every document and no array, read off the index: one document per
        value (MongoDB's DISTINCT_SCAN), not every document. The answer
        travels in one frame: more than ``document_bytes_max`` of values is
        refused, as MongoDB's 16 MB cap."""
        if not isinstance(key, str) or not key:
            raise errors.InvalidFilter(f"distinct: the key must be a non-empty string, not "
                                       f"{key!r:.40}")
        stats = stats if stats is not None else Stats()
        vals = self._distinct_by_index(ns, key, flt, stats)
        if vals is None:
            vals = query.distinct_values((d for _, d in self.matching(ns, flt, stats)), key)
        if len(codec.pack(vals)) > self.e.limits.document_bytes_max:
            raise errors.InvalidOperation(
                f"distinct too big: the values of {key!r} exceed "
                f"{self.e.limits.document_bytes_max:,} bytes; use an aggregate "
                f"([{{$group: {{_id: '${key}'}}}}]), whose answer comes in batches")
        return vals

    def _distinct_by_index(self, ns: str, key: str, flt, stats: Stats) -> list | None:
        if flt or self.point is not None:
            return None
        query.compile_filter(flt)  # a filter of the wrong type says so
        split_ns(ns, self.e.limits)
        c = self.coll(ns)
        ix = None if c is None else next(
            (x for x in c.indexes.values()
             if x.every_document and len(x.key) == 1 and x.key[0][0] == key), None)
        if ix is None or next(iter(self.t.scan(
                "index", ix.prefix + _ARRAYS, ix.prefix + _ABOVE_ARRAYS)), None) is not None:
            return None  # an array's entries (the whole, each element) are not its values
        stats.plan = f"DISTINCT_SCAN {ix.name}"
        self.e.note_index(ns, ix.name)
        out, start, stop = [], ix.prefix, prefix_end(ix.prefix)
        while start is not None:
            entry = next(iter(self.t.scan("index", start, stop)), None)
            if entry is None:
                break
            k, pk = entry
            vk = k[len(ix.prefix):len(k) - len(pk)]
            start = value_end(ix.prefix + vk, vk)  # past this value's entries
            # the value as the first document under its key holds it; null's
            # key also holds the documents without the field, which have none
            for _, pk in self.t.scan("index", k, start):
                d = self._get_pk(c, pk)
                if d is None:
                    continue
                got = [x for x in query.spread(_examine(stats, d), key) if encode_key(x) == vk]
                if got:
                    out.append(got[0])
                    break
        return out

    def coll_stats(self, ns: str) -> dict:
        """``ns``'s documents and their stored bytes, and each index's entries
        and key bytes (``_id_``: the documents' keys), read without decoding
        anything; all zero for a collection that does not exist."""
        split_ns(ns, self.e.limits)
        c = self.coll(ns)
        if c is None:
            return {"ns": ns, "count": 0, "size": 0, "indexes": {"_id_": [0, 0]}}
        n, keys, size = self._tally("docs", c.prefix)
        ixs = {"_id_": [n, keys]}
        for name, ix in c.indexes.items():
            m, kb, vb = self._tally("index", ix.prefix)
            ixs[name] = [m, kb + vb]
        return {"ns": ns, "count": n, "size": size, "indexes": ixs}

    def validate(self, ns: str, errors_max: int = 20) -> dict:
        """Check ``ns`` against itself: every document decodes and is stored
        under its own ``_id``'s key, and every index holds exactly the entries
        its documents give (no entry missing, none left over). A full read of
        the collection and its indexes; what ``validate`` answers."""
        from raymx.storage.transaction import _index_entries  # it builds on this module
        split_ns(ns, self.e.limits)
        c = self.coll(ns)
        if c is None:
            raise errors.CollectionNotFound(f"validate: {ns} does not exist", ns=ns)
        problems: list[str] = []
        want: dict[str, set] = {name: set() for name in c.indexes}
        held: dict[str, dict] = {n: {} for n, ix in c.indexes.items() if ix.unique}
        n = 0
        for k, v in self.t.scan("docs", c.prefix, prefix_end(c.prefix)):
            n += 1
            pk = k[len(c.prefix):]
            try:
                doc = codec.unpack_document(v)
                if encode_key(doc.get("_id")) != pk:
                    problems.append(f"the document stored under key {pk.hex()} has _id "
                                    f"{doc.get('_id')!r:.60}")
            except Exception as e:  # noqa: BLE001 (reported, not raised)
                problems.append(f"the document under key {pk.hex()} does not decode: {e}")
                continue
            for name, ix in c.indexes.items():
                for pre, key in _index_entries(ix, doc, pk):
                    want[name].add(key)
                    if ix.unique and held[name].setdefault(pre, pk) != pk:
                        problems.append(f"index {name} is unique and two documents have its "
                                        f"key {pre[len(ix.prefix):].hex()}")
        keys, details = {"_id_": n}, {"_id_": {"valid": True}}
        for name, ix in c.indexes.items():
            have = {k for k, _ in self.t.scan("index", ix.prefix, prefix_end(ix.prefix))}
            keys[name] = len(have)
            missing, extra = len(want[name] - have), len(have - want[name])
            details[name] = {"valid": not missing and not extra}
            if missing or extra:
                problems.append(f"index {name}: {missing} missing, {extra} extra entries")
        return {"ns": ns, "nrecords": n, "nIndexes": len(keys), "keysPerIndex": keys,
                "indexDetails": details, "valid": not problems, "errors": problems[:errors_max],
                "warnings": []}

    def _tally(self, db: str, prefix: bytes) -> tuple[int, int, int]:
        """(entries, key bytes, value bytes) of ``db`` under ``prefix``."""
        n = kb = vb = 0
        for k, v in self.t.scan(db, prefix, prefix_end(prefix)):
            n, kb, vb = n + 1, kb + len(k), vb + len(v)
        return n, kb, vb

    def list_collections(self) -> list[str]:
        return [k.decode() for k, _ in self.t.scan("catalog")]

    # point-in-time recovery (DESIGN section 9)
    def revert_entries(self, target) -> Iterator[tuple[GTID, list[dict]]]:
        """Every entry after ``target``, newest first, with its ops; raises
        (before yielding anything) if one cannot be undone or the oplog no
        longer reaches back to ``target``."""
        target = GTID.parse(target)
        first, last = self.t.first("oplog"), self.t.last("oplog")
        if last is None:
            return
        fg, lg = GTID.from_bytes(first[0]), GTID.from_bytes(last[0])
        if target > lg:
            raise errors.InvalidOperation(f"revert target {target} is after the oplog's last "
                                          f"entry {lg}", target=list(target))
        if target < fg and not (target == ZERO and fg.seq == 1):
            raise errors.OplogTrimmed(
                f"revert target {target} is below the oplog's first entry {fg}: the entries "
                f"after it were trimmed; the oldest point to revert to is {fg}",
                target=list(target), oldest=list(fg))
        if target >= fg and self.t.get("oplog", target.to_bytes()) is None:
            raise errors.InvalidOperation(f"revert target {target} is not an entry of this oplog",
                                          target=list(target))
        start = prefix_end(target.to_bytes()) if target != ZERO else None
        for k, v in self.t.scan("oplog", start, None, reverse=True):
            ops = self.e.entry_ops(self.t, codec.unpack(v, "oplog entry"))
            for op in ops:
                if oplog.is_irreversible(op):
                    g = GTID.from_bytes(k)
                    raise errors.IrreversibleOp(
                        f"cannot revert to {target}: entry {g} holds '{op.get('cmd')}' of "
                        f"{op.get('ns')}, which cannot be undone (dropping a collection does not "
                        "log its documents); the newest point to revert to is "
                        f"{g} or later", gtid=list(g), op=op.get("cmd"), ns=op.get("ns"))
        for k, v in self.t.scan("oplog", start, None, reverse=True):
            yield GTID.from_bytes(k), self.e.entry_ops(self.t, codec.unpack(v, "oplog entry"))

    def revert_plan(self, target, gtids_max: int = 1000) -> dict:
        """What ``revert_to(target)`` would undo: entries, ops per namespace."""
        names = {"i": "insert", "u": "update", "d": "delete", "c": "command"}
        out = {"target": list(GTID.parse(target)), "entries": 0, "ops": 0, "newest": None,
               "oldest": None, "gtids": [], "namespaces": {}}
        for g, ops in self.revert_entries(target):
            out["entries"] += 1
            out["newest"] = out["newest"] or list(g)
            out["oldest"] = list(g)
            if len(out["gtids"]) < gtids_max:
                out["gtids"].append(list(g))
            for op in ops:
                if op["op"] == "n":
                    continue
                out["ops"] += 1
                per = out["namespaces"].setdefault(op["ns"], {})
                per[names[op["op"]]] = per.get(names[op["op"]], 0) + 1
        return out
