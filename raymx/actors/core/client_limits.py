"""What one client may hold on a member (``Limits``; ARCHITECTURE.md, "Client
limits"): the checks the shard service runs on each request, pure (the
request and the connection's state in, an error or a decision out).

Connections themselves are counted by the client port
(``raymx.actors.admission``); parked reads by ``raymx.actors.after_waits``.
"""
from __future__ import annotations

import math

from raymx.storage import numbers
from raymx.storage.errors import (InvalidFilter, InvalidOperation, InvalidUpdate,
                                  LimitExceeded, ProtocolError)
from raymx.storage.gtid import GTID
from raymx.storage.limits import Limits

# refused multi-part inserts whose later parts are still to be dropped, per
# connection; a client that ignores this many refusals is cut off
REFUSED_INSERTS_MAX = 4096
_CONTAINERS = (dict, list, tuple)


def nesting_over(v, most: int) -> bool:
    """True if ``v`` nests more than ``most`` levels of maps and arrays.
    Iterative: a value too deep for Python's recursion is measured too."""
    if type(v) not in _CONTAINERS:
        return False
    stack = [(v, 1)]
    while stack:
        x, d = stack.pop()
        if d > most:
            return True
        for y in (x.values() if type(x) is dict else x):
            if type(y) in _CONTAINERS:
                stack.append((y, d + 1))
    return False


def _count(v) -> bool:
    return numbers.whole(v) and v >= 0


def _ms(v) -> bool:
    return type(v) in (int, float) and not v < 0 and math.isfinite(v)


def _ids(v) -> bool:
    return type(v) is list and all(numbers.is_int(x) for x in v)


_NONE = type(None)

# the request fields whose form the member's code takes for granted: the
# types that pass as they are, the test for any other value, and what a
# refusal says the field must be (None stands for absent, except for
# namespaces); checked before a request is routed
_SHAPES = {
    "ns": ({str}, lambda v: False, "a namespace string"),
    "to": ({str}, lambda v: False, "a namespace string"),
    "name": ({str, _NONE}, lambda v: False, "an index name (a string)"),
    "cursor": ({int, _NONE}, numbers.is_int, "a cursor id (an integer)"),
    "cursors": ((), _ids, "a list of cursor ids (integers)"),
    "batch": ({_NONE}, _count, "a non-negative integer"),
    "skip": ({_NONE}, _count, "a non-negative integer"),
    "limit": ({int, _NONE}, numbers.whole, "an integer"),
    "wait_ms": ({_NONE}, _ms, "a non-negative number of milliseconds"),
    "max_time_ms": ({_NONE}, _ms, "a non-negative number of milliseconds"),
    "projection": ({dict, _NONE}, lambda v: type(v) is list and all(type(x) is str for x in v),
                   "a document or a list of field paths"),
    "namespaces": ({_NONE}, lambda v: type(v) is list and all(type(x) is str for x in v),
                   "a list of namespace strings"),
}
_SHAPES = {k: (frozenset(as_is), test, what) for k, (as_is, test, what) in _SHAPES.items()}


def check_shape(req: dict) -> None:
    """Refuse a request whose fields the member cannot take as they are (a
    cursor id that is a list, a batch of NaN, a namespace that is a number),
    naming the field: before, such a request reached code that assumed the
    form and came back as an internal error."""
    for k, v in req.items():
        shape = _SHAPES.get(k)
        if shape is not None and type(v) not in shape[0] and not shape[1](v):
            raise InvalidOperation(f"{req.get('op')}: {k} must be {shape[2]}, not {v!r:.60}")


def check_nesting(req: dict, limits: Limits) -> None:
    """A request's filter and update nest at most ``nesting_depth_max`` levels."""
    most = limits.nesting_depth_max
    flt = req.get("filter")
    if flt is not None and nesting_over(flt, most):
        raise InvalidFilter(f"the filter nests deeper than {most} levels of maps and arrays "
                            "(Limits.nesting_depth_max)", limit="nesting_depth_max", max=most)
    upd = req.get("update")
    if upd is not None and nesting_over(upd, most):
        raise InvalidUpdate(f"the update nests deeper than {most} levels of maps and arrays "
                            "(Limits.nesting_depth_max)", limit="nesting_depth_max", max=most)


def check_transactions(sessions: dict, limits: Limits) -> None:
    """Before a ``txnBegin``: the connection's open transactions (``sessions``,
    those not closed) are under ``transactions_per_connection_max``."""
    most = limits.transactions_per_connection_max
    open_ = sum(1 for s in sessions.values() if not s.closed)
    if open_ >= most:
        raise LimitExceeded(
            f"this connection has {open_} open transactions, the most allowed "
            f"(Limits.transactions_per_connection_max = {most}): commit or abort one first",
            limit="transactions_per_connection_max", max=most)


def check_cursors(n: int, limits: Limits) -> None:
    """A find that leaves a cursor open: the connection's ``n`` other open
    cursors are fewer than ``cursors_per_connection_max``."""
    most = limits.cursors_per_connection_max
    if n >= most:
        raise LimitExceeded(
            f"this connection has {n} open cursors, the most allowed "
            f"(Limits.cursors_per_connection_max = {most}): read them to the end or kill "
            "them (each holds a snapshot of the data)", limit="cursors_per_connection_max",
            max=most)


def txn_ended_why(left_s: float, limits: Limits) -> str:
    """Why an interactive transaction that waited for its next statement ended."""
    if left_s <= 0:
        return f"older than Limits.transaction_lifetime_ms = {limits.transaction_lifetime_ms}"
    return f"no statement for Limits.transaction_idle_ms = {limits.transaction_idle_ms}"


DROP = "drop"


def insert_part(conn: dict, rid, more: bool, cancel: bool, limits: Limits):
    """Admission of one frame of an insert sent in parts (``more`` on every
    frame but the last). None: go on as usual. ``DROP``: a later part of an
    insert already refused (drop it silently: it was answered). A
    ``LimitExceeded``: the first part of a new insert while the connection has
    ``inserts_pending_per_connection_max`` incomplete ones; answer it now, and
    its later parts are dropped (never run as an insert of their own)."""
    refused = conn.get("inserts_refused")
    if refused and rid in refused:
        if not more or cancel:
            refused.discard(rid)
        return DROP
    held = conn.get("inserts")
    if not more or cancel or (held and rid in held):
        return None
    most = limits.inserts_pending_per_connection_max
    if held is None or len(held) < most:
        return None
    refused = conn.setdefault("inserts_refused", set())
    if len(refused) >= REFUSED_INSERTS_MAX:
        raise ProtocolError(f"{REFUSED_INSERTS_MAX} refused inserts still sending parts: "
                            "the connection is closed")
    refused.add(rid)
    return LimitExceeded(
        f"this connection has {len(held)} inserts still arriving in parts, the most allowed "
        f"(Limits.inserts_pending_per_connection_max = {most}); nothing of this one was "
        "written", limit="inserts_pending_per_connection_max", max=most)


def read_after(req: dict, limits: Limits) -> tuple[GTID, int]:
    """A read's ``after`` GTID and its wait in ms (default its ``max_time_ms``,
    else 10 s, or the limit if lower), checked against ``after_timeout_ms_max``."""
    try:
        g = GTID.parse(req["after"])
    except (ValueError, TypeError):
        raise InvalidOperation(f"after must be a GTID [term, seq], got {req['after']!r:.60}") \
            from None
    most = limits.after_timeout_ms_max
    t = req.get("after_timeout_ms")
    if t is None or t == 0:  # the read's own time limit bounds its wait too
        t = min(req.get("max_time_ms") or 10_000, most)
    if type(t) not in (int, float) or t < 0:
        raise InvalidOperation(f"after_timeout_ms must be a non-negative number of "
                               f"milliseconds, got {t!r:.40}")
    if t > most:
        raise LimitExceeded(f"after_timeout_ms={t} exceeds Limits.after_timeout_ms_max = {most}",
                            limit="after_timeout_ms_max", max=most)
    return g, t
