"""Change streams: oplog entries as change events (pure: no threads, no Ray).

A change event is a map (msgpack on the client port, a dict in the driver)::

    {"gtid": [term, seq],  # the entry (transaction) the change belongs to
     "ts": ms,              # its commit time
     "op": "insert" | "update" | "replace" | "delete" | "create" | "drop" | "createIndex"
           | "dropIndex" | "rename",
     "ns": "db.coll",
     "_id": ...,            # the document's _id (None for commands)
     "pre": {...} | None,   # full image before (update, delete)
     "post": {...} | None,  # full image after (insert, update, replace)
     "index": {"name", "key", "unique"} | None,   # createIndex / dropIndex
     "token": [term, seq, i],   # resume after this event (op i of the entry)
     "session": [lsid, txnNumber]}  # only for a driver transaction's changes (wire port)

Events come in GTID order and, inside an entry, in op order. A resume token is
``[term, seq]`` (after that whole entry) or ``[term, seq, i]`` (after its op
``i``), so a consumer that stores the token of the last event it processed
resumes exactly after it, also in the middle of a multi-document transaction.
``n`` ops (no-ops, the marker of a revert) produce no event.
"""
from __future__ import annotations

from raymx.storage import codec, errors
from raymx.storage.gtid import GTID, ZERO
from raymx.storage.keys import prefix_end

OP_NAMES = {"i": "insert", "u": "update", "d": "delete"}
EVENT_OPS = ("insert", "update", "replace", "delete", "create", "drop", "createIndex",
             "dropIndex", "rename")
SCAN_ENTRIES_MAX = 10_000  # entries one batch may look at (filtered streams stay responsive)


def parse_token(t) -> tuple:
    """``[term, seq]`` or ``[term, seq, i]`` (also a GTID or "term:seq");
    ``i`` is -1 for a stream that starts at the entry ``[term, seq]``
    itself (MongoDB's ``startAtOperationTime``)."""
    if isinstance(t, (list, tuple)) and len(t) == 3:
        try:
            g, i = GTID.parse(t[:2]), int(t[2])
        except (TypeError, ValueError):
            g = None
        if g is not None and i >= -1:
            return (g.term, g.seq, i)
    try:
        g = GTID.parse(t if not isinstance(t, list) else tuple(t))
    except (TypeError, ValueError):
        raise errors.InvalidOperation(
            f"resume token {t!r:.60} must be [term, seq] or [term, seq, op index]") from None
    return (g.term, g.seq)


class Filter:
    """Which events a stream wants: namespaces ("db" or "db.coll") and op names."""

    def __init__(self, namespaces=None, ops=None):
        if namespaces is not None and (not isinstance(namespaces, (list, tuple)) or not all(
                isinstance(n, str) and n for n in namespaces)):
            raise errors.InvalidOperation("namespaces must be a list of 'db' or 'db.coll' names")
        if ops is not None and (not isinstance(ops, (list, tuple)) or set(ops) - set(EVENT_OPS)):
            raise errors.InvalidOperation(f"ops must be a list among {', '.join(EVENT_OPS)}")
        self.colls = None if namespaces is None else {n for n in namespaces if "." in n}
        self.dbs = None if namespaces is None else {n for n in namespaces if "." not in n}
        self.ops = None if ops is None else set(ops)

    def wants_ns(self, ns: str) -> bool:
        if ns == SESSIONS_NS:  # the wire port's session records: internal, never an event
            return False       # (MongoDB's config.transactions is not watched either)
        if self.colls is None:
            return True
        return ns in self.colls or ns.split(".", 1)[0] in self.dbs


SESSIONS_NS = "config.transactions"  # the wire port's session records (lsid -> the last)


def session_of(ops: list) -> list | None:
    """``[lsid, txnNumber]`` of the driver transaction an entry committed:
    its session record (written in the transaction itself, marked
    ``committed``; a retryable write's record is not), else None."""
    for op in ops:
        if op.get("ns") == SESSIONS_NS and op.get("op") in ("i", "u"):
            rec = op.get("post") or {}
            if rec.get("committed") is True:
                return [rec.get("_id"), rec.get("n")]
    return None


def command_event(ev: dict, op: dict) -> dict:
    """``ev`` completed from command op ``op`` (live, or archived)."""
    ev["op"] = op.get("cmd")
    if ev["op"] in ("createIndex", "dropIndex"):
        ev["index"] = {"name": op.get("name"), **(op.get("spec") or {})}
    elif ev["op"] == "rename":
        ev["to"] = op.get("to")
    return ev


def event(g: GTID, ts: int, i: int, op: dict) -> dict | None:
    kind = op.get("op")
    if kind == "n":
        return None
    ev = {"gtid": [g.term, g.seq], "ts": ts, "ns": op["ns"], "_id": None, "pre": None,
          "post": None, "index": None, "token": [g.term, g.seq, i]}
    if kind == "c":
        return command_event(ev, op)
    return image_event(ev, kind, op.get("pre"), op.get("post"), op.get("r") is True)


def image_event(ev: dict, kind: str, pre, post, replaced: bool) -> dict:
    """``ev`` completed from an i/u/d op (live, or archived): a u op that
    replaced the whole document is a ``replace``, as MongoDB names it."""
    ev["op"] = "replace" if replaced and kind == "u" else OP_NAMES[kind]
    ev["pre"], ev["post"] = pre, post
    ev["_id"] = (post or pre)["_id"]
    return ev


def oplog_span(t, token: tuple, member: int = 0) -> tuple[GTID, GTID] | None:
    """The first and last GTIDs of the oplog read in ``t`` (None: it is
    empty), once every entry after ``token`` it holds is known to be the
    one a reader positioned at ``token`` expects. Raises ``OplogTrimmed``
    (with the oldest GTID available) if entries after ``token`` were
    trimmed here, ``Diverged`` if ``token`` names an entry this oplog does
    not hold (it was rolled back: not majority-committed)."""
    first, last = t.first("oplog"), t.last("oplog")
    if first is None:
        return None
    g0 = GTID(token[0], token[1])
    fg, lg = GTID.from_bytes(first[0]), GTID.from_bytes(last[0])
    need = g0.seq if len(token) == 3 else g0.seq + 1  # the first entry still needed
    if need < fg.seq:
        raise errors.OplogTrimmed(
            f"resume token {list(token)} is older than member {member}'s oplog: entries "
            f"after it were trimmed; the oldest entry available is {fg} (resume from a "
            f"token at or after {GTID(fg.term, fg.seq - 1) if fg.seq > 1 else ZERO}, or "
            "start a new stream)", token=list(token), oldest=list(fg))
    if g0 != ZERO and fg.seq <= g0.seq <= lg.seq and t.get("oplog", g0.to_bytes()) is None:
        raise errors.Diverged(
            f"resume token {list(token)} names an entry member {member} does not "
            "hold (rolled back: it was not majority-committed)", token=list(token))
    return fg, lg


def scan(engine, token: tuple, gate: GTID | None, flt: Filter, n_max: int,
         member: int = 0) -> dict:
    """Events after ``token`` up to ``gate`` (inclusive), at most ``n_max``
    (a big entry is split between batches; the token then carries the op
    index). Returns ``{"events",
    "resume"}``: ``resume`` is the token after the last entry looked at, or
    ``gate`` when everything up to it was looked at (the high-water mark that
    moves a quiet or filtered stream on); never below ``token``.

    Raises ``OplogTrimmed`` (with the oldest GTID available) if entries after
    ``token`` were trimmed here, ``Diverged`` if ``token`` names an entry this
    oplog does not hold (it was rolled back: not majority-committed).
    """
    g0 = GTID(token[0], token[1])
    skip = token[2] if len(token) == 3 else None
    events: list[dict] = []
    resume = list(token)
    with engine.store.read() as t:
        span = oplog_span(t, token, member)
        if span is None or (g0 != ZERO and g0.seq > span[1].seq):
            return {"events": events, "resume": resume}  # empty, or this member is behind: wait
        if gate is None or gate < g0 or (skip is None and gate == g0):
            return {"events": events, "resume": resume}
        start = g0.to_bytes() if skip is not None else prefix_end(g0.to_bytes())
        if g0 == ZERO and skip is None:
            start = None
        stop = prefix_end(gate.to_bytes())
        scanned = 0
        done = True
        for k, v in t.scan("oplog", start, stop):
            g = GTID.from_bytes(k)
            e = codec.unpack(v, "oplog entry")
            ops = engine.entry_ops(t, e)
            lo = skip + 1 if (skip is not None and g == g0) else 0
            resume = [g.term, g.seq]
            session = session_of(ops) if len(ops) > 1 else None
            for i in range(lo, len(ops)):
                op = ops[i]
                if op.get("op") == "n" or not flt.wants_ns(op["ns"]):
                    continue
                ev = event(g, e["ts"], i, op)
                if session is not None:
                    ev["session"] = session
                if flt.ops is None or ev["op"] in flt.ops:
                    events.append(ev)
                    if len(events) >= n_max and i < len(ops) - 1:
                        resume = [g.term, g.seq, i]  # a big entry: split at an op
                        break
            scanned += 1
            if len(events) >= n_max or scanned >= SCAN_ENTRIES_MAX:
                done = False
                break
        if done and GTID(*resume[:2]) <= gate:
            resume = [gate.term, gate.seq]
    return {"events": events, "resume": resume}
