"""``$changeStream`` on the wire port: an ``aggregate`` that opens a stream,
``getMore`` long-polling the member's own change stream (``op: watch``, see
``raymx.storage.changes``), events in MongoDB's shape.

Resume tokens are ``{"_data": "term:seq[:op]"}``: raymx's GTID-based tokens,
so a driver resuming after a failover continues on the new primary exactly
after the last event it saw (every member's oplog holds the same GTIDs).
"""
from __future__ import annotations

import datetime
import itertools
import threading
import time

from bson import Binary, Int64, Timestamp

from raymx import errors
from raymx.storage.changes import parse_token
from raymx.wire import aggregate, oplog_view
from raymx.wire.errors import CommandError, integer

_IDS = itertools.count(1)
CURSOR_BASE = 1 << 62  # above the member's own cursor ids
WAIT_MS_DEFAULT = 1000
WAIT_MS_MAX = 60_000  # a getMore waits at most this long (as the member's watch)
IDLE_S = 600  # an open cursor no getMore asked for this long is closed (MongoDB's 10 minutes)
FIRST_BATCH = 101  # a find's first batch, by default (MongoDB's)
TAIL_POLL_S = 0.01  # how often an awaiting tailable cursor looks for new oplog entries
_FOLLOW = ("$match", "$project", "$addFields", "$set", "$unset")
_EXPANDED = ("create", "createIndexes", "dropIndexes")  # with showExpandedEvents only
_KINDS = {"insert": "insert", "update": "update", "replace": "replace", "delete": "delete",
          "drop": "drop", "create": "create", "createIndex": "createIndexes",
          "dropIndex": "dropIndexes", "rename": "rename"}


def token_out(t) -> dict:
    return {"_data": ":".join(str(int(x)) for x in t)}


def token_in(doc) -> tuple:
    if not isinstance(doc, dict) or not isinstance(doc.get("_data"), str):
        raise CommandError(f"invalid resume token {doc!r:.80}", 2, "BadValue")
    try:
        return parse_token([int(x) for x in doc["_data"].split(":")])
    except (ValueError, errors.RaymxError):
        raise CommandError(f"invalid resume token {doc!r:.80}", 2, "BadValue") from None


WALL_CLOCK_MIN = 1_000_000_000  # a Timestamp's time from here on is seconds (2001-09-09)


def _start_at(at) -> tuple:
    """``startAtOperationTime``: an ``operationTime`` raymx answered is
    ``Timestamp(term, seq)``, a GTID; the stream starts at that entry,
    included (the token before its first op). A wall-clock time: ``(ms,
    inc)``, for the member to find the entry (``Engine.oplog_at``): an
    event's ``clusterTime`` (and a ``ts`` of ``local.oplog.rs``) is
    ``Timestamp(second, seq)`` and names its entry exactly; any other time
    (seconds since 1970, as MongoDB's connectors send) starts at the first
    entry committed in or after that second."""
    if not isinstance(at, Timestamp):
        raise CommandError(f"startAtOperationTime must be a Timestamp, not {at!r:.40}", 14,
                           "TypeMismatch")
    if at.time >= WALL_CLOCK_MIN:
        return (at.time * 1000, at.inc)
    if at.inc < 1:
        raise CommandError(f"startAtOperationTime {at} names no oplog entry (seq starts at 1)",
                           2, "BadValue")
    return (at.time, at.inc, -1)


def _cluster_time(ev: dict) -> Timestamp:
    """An event's ``clusterTime``: ``Timestamp(commit second, seq)``, as its
    entry's ``ts`` in ``local.oplog.rs`` (the events of one entry, a
    transaction's, share it, as in MongoDB)."""
    return Timestamp(ev["ts"] // 1000, ev["token"][1] % (1 << 32))


class Stream:
    def __init__(self, namespaces, token, full: str, before: str, pipeline: list, ns: str):
        self.namespaces, self.token, self.full, self.before = namespaces, token, full, before
        self.pipeline, self.ns = pipeline, ns
        self.expanded = False


def _same(a, b) -> bool:
    """Equal and of one type (1, 1.0 and True are three values here)."""
    return type(a) is type(b) and a == b


def _nameable(d: dict) -> bool:
    """Every key of ``d`` can be a step of a dotted path: no dot, no ``$``,
    not all digits (an array index)."""
    return all(k and "." not in k and not k.startswith("$") and not k.isdigit() for k in d)


def _diff(pre: dict, post: dict) -> dict:
    """An update's ``updateDescription`` from its images, as MongoDB's diff of
    two documents (its delta format) names the changes: a field of a
    subdocument there before and after by its dotted path (``a.b``);
    elements appended to an array as ``arr.i``; an array cut short in
    ``truncatedArrays``; anything else (a new value, another type, an array
    changed within, keys a path cannot name) whole. Applied to the image
    before, as a consumer applies them, they give the image after."""
    updated: dict = {}
    removed: list = []
    truncated: list = []

    def walk(a: dict, b: dict, path: str) -> None:
        for k, v in b.items():
            p = path + k
            if k not in a:
                updated[p] = v
                continue
            old = a[k]
            if _same(old, v):
                continue
            if type(old) is dict and type(v) is dict and _nameable(old) and _nameable(v):
                walk(old, v, p + ".")
            elif type(old) is list and type(v) is list and all(
                    _same(x, y) for x, y in zip(old, v)):
                if len(v) > len(old):  # appended
                    for i in range(len(old), len(v)):
                        updated[f"{p}.{i}"] = v[i]
                else:  # cut short
                    truncated.append({"field": p, "newSize": len(v)})
            else:
                updated[p] = v
        removed.extend(path + k for k in a if k not in b)
    walk(pre, post, "")
    return {"updatedFields": updated, "removedFields": removed, "truncatedArrays": truncated}


def event_doc(ev: dict, s: Stream) -> dict | None:
    kind = _KINDS.get(ev["op"])
    if kind is None or (kind in _EXPANDED and not s.expanded):
        return None
    db, _, coll = ev["ns"].partition(".")
    ts = ev["ts"]
    out = {"_id": token_out(ev["token"]), "operationType": kind,
           "clusterTime": _cluster_time(ev),
           "wallTime": datetime.datetime(1970, 1, 1) + datetime.timedelta(milliseconds=ts),
           "ns": {"db": db, "coll": coll} if coll else {"db": db}}
    if kind == "rename":
        to_db, _, to_coll = ev["to"].partition(".")
        out["to"] = {"db": to_db, "coll": to_coll}
    if ev["_id"] is not None or kind in ("insert", "update", "replace", "delete"):
        out["documentKey"] = {"_id": ev["_id"]}
    if kind in ("insert", "replace"):  # MongoDB sends a replacement's document always
        out["fullDocument"] = ev["post"]
    elif kind == "update":
        out["updateDescription"] = _diff(ev["pre"] or {}, ev["post"] or {})
        if s.full in ("updateLookup", "whenAvailable", "required"):
            out["fullDocument"] = ev["post"]  # the image right after this change
    if kind in ("update", "replace", "delete") and s.before in ("whenAvailable", "required"):
        out["fullDocumentBeforeChange"] = ev["pre"]
    if ev.get("session") is not None:  # a driver transaction's change, as MongoDB's
        lsid, num = ev["session"]
        out["lsid"] = {"id": Binary(lsid, 4) if len(lsid) == 16 else Binary(lsid)}
        out["txnNumber"] = Int64(num)
    return out


def _invalidates(ev: dict, s: Stream) -> bool:
    """A drop or rename of the one collection a stream watches."""
    return ev["op"] in ("drop", "rename") and s.namespaces is not None \
        and len(s.namespaces) == 1 and "." in s.namespaces[0] and ev["ns"] == s.namespaces[0]


class Streams:
    """Open change-stream cursors and tailable cursors on ``local.oplog.rs``
    (``oplog_view.Tailer``) of one member: any connection may getMore; one
    idle for ``IDLE_S`` is closed."""

    def __init__(self, d):
        self.d = d
        self.open: dict[int, list] = {}  # cid -> [Stream or Tailer, last used (monotonic)]
        self.lock = threading.Lock()

    def owns(self, cid: int) -> bool:
        return cid >= CURSOR_BASE

    def _add(self, s) -> int:
        cid = CURSOR_BASE + next(_IDS)
        now = time.monotonic()
        with self.lock:
            for c in [c for c, (_, at) in self.open.items() if now - at > IDLE_S]:
                del self.open[c]
            self.open[cid] = [s, now]
        return cid

    def _get(self, cid: int):
        with self.lock:
            got = self.open.get(cid)
            if got is not None:
                got[1] = time.monotonic()
        if got is None:
            raise CommandError(f"cursor id {cid} not found", 43, "CursorNotFound")
        return got[0]

    def tail(self, cmd: dict, conn, ns: str, flt: dict) -> dict:
        """A tailable ``find`` on ``local.oplog.rs``: its first batch, and a
        cursor that stays open at the end of the oplog (closed at once only
        if its limit is reached)."""
        svc = self.d.service
        t = oplog_view.Tailer(svc.e, cmd, flt, cmd.get("projection"))
        docs = t.batch(svc.e, svc.oplog_end(), integer(cmd, "batchSize") or FIRST_BATCH,
                       svc.member_id)
        cid = 0 if t.done() else self._add(t)
        return {"cursor": {"firstBatch": docs, "id": Int64(cid), "ns": ns}}

    def _tail_more(self, cid: int, t: oplog_view.Tailer, cmd: dict, conn) -> dict:
        """A tailable cursor's next batch. With ``awaitData``, an empty one
        waits up to ``maxTimeMS`` (1 s by default, 60 s at most) for entries
        to be written, looking every ``TAIL_POLL_S``."""
        svc = self.d.service
        n = min(integer(cmd, "batchSize") or oplog_view.TAIL_BATCH, oplog_view.TAIL_BATCH)
        wait_ms = min(cmd.get("maxTimeMS") or WAIT_MS_DEFAULT, WAIT_MS_MAX)
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            docs = t.batch(svc.e, svc.oplog_end(), n, svc.member_id)
            left = deadline - time.monotonic()
            if docs or t.done() or not t.await_data or left <= 0 or svc._stopping.is_set():
                break
            time.sleep(min(left, TAIL_POLL_S))
        if t.done():
            self.kill([cid])
            cid = 0
        return {"cursor": {"nextBatch": docs, "id": Int64(cid), "ns": oplog_view.NS}}

    def start(self, cmd: dict, conn, spec: dict, rest: list) -> dict:
        if not isinstance(spec, dict):
            raise CommandError("$changeStream needs a document", 14, "TypeMismatch")
        for st in rest:
            if next(iter(st)) not in _FOLLOW:
                raise CommandError(f"{next(iter(st))} is not allowed in a $changeStream "
                                   f"pipeline (raymx serves {', '.join(_FOLLOW)})", 2,
                                   "BadValue")
        aggregate.check(rest)
        db, target = cmd.get("$db"), cmd.get("aggregate")
        if spec.get("allChangesForCluster"):
            namespaces, ns = None, "admin.$cmd.aggregate"
        elif isinstance(target, str):
            namespaces, ns = [f"{db}.{target}"], f"{db}.{target}"
        else:
            namespaces, ns = [db], f"{db}.$cmd.aggregate"
        tok = spec.get("resumeAfter") or spec.get("startAfter")
        at = spec.get("startAtOperationTime")
        if tok is not None and at is not None:
            raise CommandError("Only one type of resume option is allowed, but multiple were "
                               "found", 40674, "Location40674")
        from raymx.wire.crud import read_fields
        rf = {k: v for k, v in read_fields(cmd).items() if k == "rp"}
        if at is not None:
            token = _start_at(at)
            if len(token) == 2:  # a wall-clock time: the member finds its entry
                try:
                    token = tuple(self.d.call({"op": "watch", "namespaces": namespaces,
                                               "since_ms": token[0], "since_seq": token[1],
                                               **rf}, conn.state)["resume"])
                except errors.OplogTrimmed as e:
                    raise CommandError(e.msg, 286, "ChangeStreamHistoryLost") from None
        elif tok is not None:
            token = token_in(tok)
        else:
            token = tuple(self.d.call({"op": "watch", "namespaces": namespaces, **rf},
                                      conn.state)["resume"])
        s = Stream(namespaces, token, spec.get("fullDocument", "default"),
                   spec.get("fullDocumentBeforeChange", "off"), rest, ns)
        s.expanded = bool(spec.get("showExpandedEvents"))
        cid = self._add(s)
        return {"cursor": {"firstBatch": [], "id": Int64(cid), "ns": ns,
                           "postBatchResumeToken": token_out(s.token)}}

    def get_more(self, cid: int, cmd: dict, conn) -> dict:
        s = self._get(cid)
        if isinstance(s, oplog_view.Tailer):
            return self._tail_more(cid, s, cmd, conn)
        wait = cmd.get("maxTimeMS") or WAIT_MS_DEFAULT
        req = {"op": "watch", "after": list(s.token), "namespaces": s.namespaces,
               "wait_ms": int(wait)}
        if integer(cmd, "batchSize"):
            req["batch"] = integer(cmd, "batchSize")
        try:
            res = self.d.call(req, conn.state)
        except errors.OplogTrimmed as e:
            raise CommandError(e.msg, 286, "ChangeStreamHistoryLost") from None
        except errors.Diverged as e:
            raise CommandError(e.msg, 280, "ChangeStreamFatalError") from None
        events, end = res["events"], None
        for i, ev in enumerate(events):
            if _invalidates(ev, s):
                events, end = events[:i + 1], ev
                break
        docs = [x for x in (event_doc(ev, s) for ev in events) if x is not None]
        if s.pipeline:
            docs = aggregate.run(iter(docs), s.pipeline)
        if end is not None:
            # a collection's stream ends at its drop or rename, with an invalidate
            # event (never filtered), as MongoDB's: its token starts a new stream
            # after it (startAfter), and the cursor is closed
            docs.append({"_id": token_out(end["token"]), "operationType": "invalidate",
                         "clusterTime": _cluster_time(end),
                         "wallTime": datetime.datetime(1970, 1, 1)
                         + datetime.timedelta(milliseconds=end["ts"])})
            self.kill([cid])
            s.token, cid = tuple(end["token"]), 0
        else:
            s.token = tuple(res["resume"])
        return {"cursor": {"nextBatch": docs, "id": Int64(cid), "ns": s.ns,
                           "postBatchResumeToken": token_out(s.token)}}

    def kill(self, ids) -> list:
        """Close the streams ``ids``; returns those that were not open."""
        with self.lock:
            return [cid for cid in ids if self.open.pop(cid, None) is None]
