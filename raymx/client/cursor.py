"""``Cursor``: a query's results, streamed in batches (``getMore``) from one
snapshot; an iterator as pymongo's (``next(cursor)``, ``close()``,
``alive``, ``with``)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from raymx import errors
from raymx.storage import catalog

if TYPE_CHECKING:
    from raymx.client.collection import Collection
    from raymx.client.connection import Connection


def hint_spec(index):
    """A hint as the member takes it: an index's name, its key as ``[[path,
    1 | -1], ...]``, or ``{"$natural": 1 | -1}`` (``Cursor.hint``)."""
    if isinstance(index, (list, tuple)) and len(index) == 1 \
            and tuple(index[0])[:1] == ("$natural",):
        return {"$natural": index[0][1]}
    if isinstance(index, str) or (isinstance(index, dict) and "$natural" in index):
        return index
    return catalog.normalize_index_key(index)


class Cursor:
    """Iterate it once (``for d in cursor``, ``next(cursor)``, ``to_list()``);
    the query is sent at the first document asked for, so ``sort``, ``skip``,
    ``limit`` and ``batch_size`` may be chained until then. ``close()`` (or
    the end of a ``with`` block, or the end of the results) frees the
    member's cursor; one left open is freed when this object is collected, or
    after the member's ``cursor_idle_ms``."""

    def __init__(self, coll: "Collection", flt, projection, sort, skip, limit, batch_size,
                 read_concern=None):
        if flt is not None and not isinstance(flt, dict):
            raise TypeError(f"filter must be a dict or None, not {type(flt).__name__}")
        _check_count("skip", skip)
        _check_count("batch_size", batch_size)
        limit = _check_limit(limit)
        self._c = coll
        self._spec = {"op": "find", "ns": coll.full_name, "filter": {} if flt is None else flt,
                      "projection": projection, "sort": sort_spec(sort), "skip": skip,
                      "limit": limit, "batch": batch_size}
        self._fields = coll._read_fields(read_concern)
        self._started = False
        self._it = iter(())        # the documents of the batch at hand
        self._cid = 0              # the member's cursor, 0: none (or none left)
        self._conn: "Connection | None" = None
        self._closed = False

    # --- options, before the query is sent ---------------------------------
    def _option(self, name: str, value) -> "Cursor":
        if self._started or self._closed:
            raise errors.InvalidOperation(f"cannot set {name} on a cursor that has already "
                                          "been iterated or closed")
        self._spec[name] = value
        return self

    def sort(self, key, direction: int = 1) -> "Cursor":
        return self._option("sort", sort_spec(key if isinstance(key, (list, dict))
                                              else [(key, direction)]))

    def skip(self, n: int) -> "Cursor":
        return self._option("skip", _check_count("skip", n))

    def limit(self, n: int) -> "Cursor":
        """At most ``n`` documents (0: no limit; a negative ``n`` as pymongo: ``-n``)."""
        return self._option("limit", _check_limit(n))

    def batch_size(self, n: int) -> "Cursor":
        return self._option("batch", _check_count("batch_size", n))

    def hint(self, index) -> "Cursor":
        """Read through this index, as pymongo's: its name (a string), its
        key (``[("a", 1), ("b", -1)]``, ``{"a": 1}``) or ``[("$natural", 1 |
        -1)]`` (the documents in stored order); a sort is
        then done over what it reads. One the collection does not have is
        refused when the query is sent."""
        return self._option("hint", hint_spec(index))

    def max_time_ms(self, ms: int | None) -> "Cursor":
        """The time the member may spend on this cursor's batches in all
        (None or 0: no limit); past it the batch fails with
        ``ExecutionTimeout`` and the cursor is closed, as pymongo's."""
        return self._option("max_time_ms", _check_count("max_time_ms", ms or 0))

    # --- iterating -----------------------------------------------------------
    def __iter__(self) -> "Cursor":
        return self

    def __next__(self) -> dict:
        try:
            return next(self._it)
        except StopIteration:
            pass
        while self._fetch():
            try:
                return next(self._it)
            except StopIteration:  # an empty batch with more to come
                continue
        raise StopIteration

    next = __next__

    def _fetch(self) -> bool:
        """Ask for the next batch: False once there is none."""
        if self._closed:
            return False
        if not self._started:
            self._started = True
            txn = self._c._txn
            if txn is not None:  # inside a transaction: one batch, no member cursor
                r = txn._call(dict(self._spec))
            else:
                r, self._conn = self._c.client._read_call(self._c.read_preference,
                                                          {**self._spec, **self._fields})
        elif self._cid:
            r = self._conn.request({"op": "getMore", "cursor": self._cid,
                                    "batch": self._spec["batch"]}, self._c.client.timeout_s)
        else:
            self._closed = True
            return False
        self._cid = r.get("cursor") or 0
        self._it = iter(r["docs"])
        return True

    def to_list(self, length: int | None = None) -> list[dict]:
        """The remaining documents as a list (batch by batch, no call per
        document); ``length``: at most that many (pymongo's), the rest left
        to read."""
        if length is not None:
            _check_count("length", length)
            return [d for _, d in zip(range(length), self)]  # range first: no doc lost
        out = list(self._it)
        while self._fetch():
            out.extend(self._it)
        return out

    @property
    def alive(self) -> bool:
        """May more documents come? (pymongo's ``alive``: False once the
        results are used up or the cursor is closed.)"""
        if self._closed:
            return False
        if not self._started or self._cid:
            return True
        # the last batch: alive while documents of it are left
        head = next(self._it, _END)
        if head is _END:
            return False
        self._it = _chain(head, self._it)
        return True

    @property
    def cursor_id(self) -> int:
        """The member's cursor id (0: none open)."""
        return self._cid

    def close(self) -> None:
        """Stop: frees the member's cursor (if one is open); iterating after
        it gives nothing more."""
        self._closed = True
        self._it = iter(())
        cid, self._cid = self._cid, 0
        conn = self._conn
        if cid and conn is not None and not conn.closed:
            try:
                conn.submit({"op": "killCursors", "cursors": [cid]})
            except (OSError, errors.RaymxError):
                pass  # the connection went: the member drops its cursors with it

    def __enter__(self) -> "Cursor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        if getattr(self, "_cid", 0):
            try:
                self.close()
            except Exception:
                pass


_END = object()


def _chain(head, rest):
    yield head
    yield from rest


def _check_limit(v) -> int:
    if type(v) is not int:
        raise TypeError(f"limit must be an int, not {v!r:.40}")
    return abs(v)


def _check_count(name: str, v) -> int:
    if type(v) is not int or v < 0:
        raise TypeError(f"{name} must be a non-negative int, not {v!r:.40}")
    return v


def sort_spec(sort):
    """``"a"``, ``[("a", 1), ("b", -1)]`` or ``{"a": 1}`` as ``[[path, dir], ...]``."""
    if sort is None:
        return None
    if isinstance(sort, str):
        return [[sort, 1]]
    if isinstance(sort, dict):
        return [[k, v] for k, v in sort.items()]
    return [list(x) if isinstance(x, (tuple, list)) else [x, 1] for x in sort]
