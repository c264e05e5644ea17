"""Is a history of register operations linearizable? (Wing and Gong's search,
with Lowe's cache, as in Porcupine and Knossos.)

A history is a list of ``Op``: which client, what it asked (``read``,
``write``, ``cas``), what it answered, and when it was called and answered
(one clock for all clients). An operation whose outcome is unknown (a
timeout, a lost connection, "outcome unknown") has ``ret = INF``: it may
have taken effect at any point after its call, or never (taking effect after
every other operation is the same as never, as nothing observes it).

Registers are independent, so each key is checked alone (a history is
linearizable if and only if each key's is: P-compositionality). For each key
the search keeps the operations not yet linearized in time order and, at the
first call event, tries to linearize that operation now (its effect valid in
the current state); a return event reached means the operation returning
there could not be placed before it: back up. ``(set linearized, state)``
pairs already explored are not explored again.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

INF = math.inf


@dataclass
class Op:
    key: object
    kind: str           # "read" | "write" | "cas"
    arg: object         # read: None; write: the value; cas: (expected, new)
    ok: object          # read: the value read; write: True; cas: True or False (no match)
    call: float
    ret: float = INF    # INF: outcome unknown
    client: object = None
    info: dict = field(default_factory=dict)


def step(state, op: Op):
    """(valid, new state) of ``op`` taking effect in ``state``."""
    if op.kind == "read":
        return op.ok == state, state
    if op.kind == "write":
        return True, op.arg
    if op.kind == "cas":
        expected, new = op.arg
        if op.ret == INF:  # unknown: if it takes effect, it matched
            return expected == state, new
        if op.ok:
            return expected == state, new
        return expected != state, state
    raise ValueError(f"unknown operation kind {op.kind!r}")


class _Entry:
    __slots__ = ("op", "i", "call", "match", "prev", "next", "t")

    def __init__(self, op, i, call, t):
        self.op, self.i, self.call, self.t = op, i, call, t
        self.match = self.prev = self.next = None


def check_key(ops: list[Op], init=None, max_steps: int = 5_000_000) -> tuple[bool | None, dict]:
    """(True, {}) if ``ops`` (one key's) are linearizable from ``init``;
    (False, details) if not; (None, details) if the search gave up after
    ``max_steps`` steps."""
    events = []
    for i, op in enumerate(ops):
        if op.ret < op.call:
            raise ValueError(f"operation {op} returns before its call")
        c = _Entry(op, i, True, op.call)
        r = _Entry(op, i, False, op.ret)
        c.match = r
        events += [c, r]
    # at equal times, calls first: operations touching at an instant overlap
    events.sort(key=lambda e: (e.t, not e.call))
    head = _Entry(None, -1, False, -INF)
    prev = head
    for e in events:
        prev.next, e.prev = e, prev
        prev = e

    def lift(e):
        e.prev.next = e.next
        if e.next is not None:
            e.next.prev = e.prev
        r = e.match
        r.prev.next = r.next
        if r.next is not None:
            r.next.prev = r.prev

    def unlift(e):
        r = e.match
        r.prev.next = r
        if r.next is not None:
            r.next.prev = r
        e.prev.next = e
        if e.next is not None:
            e.next.prev = e

    cache: set = set()
    stack: list = []
    state, linearized = init, 0
    entry = head.next
    steps = 0
    deepest, blocked = -1, None  # the op that could not be placed, in the deepest try
    while head.next is not None:
        steps += 1
        if steps > max_steps:
            return None, {"reason": f"gave up after {max_steps:,} steps", "ops": len(ops)}
        if entry.call:
            valid, new = step(state, entry.op)
            if valid:
                lin = linearized | (1 << entry.i)
                if (lin, new) not in cache:
                    cache.add((lin, new))
                    stack.append((entry, state))
                    state, linearized = new, lin
                    lift(entry)
                    entry = head.next
                    continue
            entry = entry.next
        else:
            if entry.t == INF:
                return True, {}  # every operation left has an unknown outcome
            if len(stack) > deepest:
                deepest, blocked = len(stack), entry.op
            if not stack:
                return False, {"reason": "no order of the operations explains this one's "
                               "answer", "op": blocked, "linearized_before": deepest,
                               "ops": len(ops)}
            entry, state = stack.pop()
            linearized &= ~(1 << entry.i)
            unlift(entry)
            entry = entry.next
    return True, {}


def check(history: list[Op], init=None, max_steps: int = 5_000_000) -> dict:
    """Check every key's history; returns {"valid": True | False | None,
    "keys": n, "failures": {key: details}, "unknown": {key: details}}."""
    by_key: dict = {}
    for op in history:
        by_key.setdefault(op.key, []).append(op)
    failures, unknown = {}, {}
    for k, ops in by_key.items():
        ops.sort(key=lambda o: o.call)
        ok, why = check_key(ops, init, max_steps)
        if ok is False:
            failures[k] = why
        elif ok is None:
            unknown[k] = why
    valid = False if failures else (None if unknown else True)
    return {"valid": valid, "keys": len(by_key), "failures": failures, "unknown": unknown}
