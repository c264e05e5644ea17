"""The primary's decisions: may it write, does it see a majority, which
waiting writes are acknowledged (pure: time comes in as ``now_ms``).

``WriteConcernCore`` holds the durable positions of the members as this
primary knows them and the writes waiting for their write concern; the shell
(``raymx.actors.shard.WriteConcernWaiters``) wraps it in a lock and a timer
thread and runs the callbacks it returns; the simulation calls it directly.
"""
from __future__ import annotations

from typing import Any

from raymx import errors
from raymx.actors.core.replication import acknowledged, committed, majority_count, majority_point
from raymx.storage.gtid import GTID


def deposed(primary: bool, term: int, lead_term: int) -> bool:
    """May this member no longer write? It is not (or no longer) primary, or a
    newer term than the one it leads exists (a pull or a heartbeat told it)."""
    return not primary or term > lead_term


def sees_majority(votes: dict[int, int], heard_ms: dict[int, int], self_id: int,
                  now_ms: int, timeout_ms: int) -> bool:
    """Can this primary still reach a majority of voting members (itself included)?"""
    if len(votes) == 1:
        return True
    up = sum(1 for m, v in votes.items() if v > 0 and (
        m == self_id or now_ms - heard_ms.get(m, 0) < timeout_ms))
    return up >= majority_count(list(votes.values()))


class WriteConcernCore:
    """Durable positions and the writes waiting on them.

    A write waits as ``(g, w, deadline_ms, token)``; ``token`` is the
    caller's (its answer callbacks). ``sweep`` takes every waiter that is
    decided off the list and returns ``(token, error or None)``. A waiter is
    failed with NotPrimary ("outcome unknown") as soon as its primary is
    deposed: positions a deposed primary hears may be on another branch, and
    the entry may be rolled back here while others hold another branch past
    the same seq (the ``stale_write_concern`` bug of the simulation).
    """

    def __init__(self, votes: dict[int, int]):
        self.votes = votes
        self.durable: dict[int, GTID | None] = {}
        self.waiting: list[tuple[GTID, Any, int | None, Any]] = []

    def set_votes(self, votes: dict[int, int]) -> None:
        """A new configuration: the positions of members no longer in it go, so
        a member configured again later starts from what it reports then."""
        self.votes = votes
        self.durable = {m: g for m, g in self.durable.items() if m in votes}

    def update(self, member: int, g: GTID | None) -> bool:
        """A member's durable position; True if it moved (sweep then)."""
        cur = self.durable.get(member)
        if g is None or (cur is not None and g <= cur):
            return False
        self.durable[member] = g
        return True

    def majority_point(self, term: int) -> GTID | None:
        """The majority-committed point of a primary of ``term`` (``committed``)."""
        return committed(majority_point(self.durable, self.votes), term)

    def reset(self, member: int | None = None, last: GTID | None = None) -> None:
        """Forget every position (a change of role); a new primary knows its own."""
        self.durable = {}
        if member is not None and last is not None and last.seq:
            self.durable[member] = last

    def wait(self, g: GTID, w, deadline_ms: int | None, token) -> errors.RaymxError | None:
        """Queue a write committed at ``g``; an error if ``w`` can never hold."""
        n = len(self.votes)
        need = majority_count(list(self.votes.values())) if w == "majority" else w
        if not isinstance(need, int) or need < 0 or need > n:
            return errors.UnsatisfiableWriteConcern(
                f"w={w!r} cannot be satisfied by {n} members; the write committed "
                f"at {g} and was not undone", gtid=list(g))
        self.waiting.append((g, w, deadline_ms, token))
        return None

    def ready(self, g: GTID, w, primary: bool) -> bool:
        """Can a write just queued at ``g`` be decided now: its write concern
        already holds, or its member is no longer primary? Else a position
        that moves, its deadline or a step-down decides it (a sweep then)."""
        return not primary or acknowledged(g, w, self.durable, self.votes)

    def next_deadline(self) -> int | None:
        dl = [d for _, _, d, _ in self.waiting if d is not None]
        return min(dl) if dl else None

    def sweep(self, now_ms: int, term: int, primary: bool) -> list[tuple[Any, Exception | None]]:
        """Decide every waiter that can be: acknowledged (None), deposed
        (NotPrimary), timed out (WriteConcernTimeout). ``term``: the member's
        durable term."""
        done, keep = [], []
        for item in self.waiting:
            g, w, d, token = item
            if term > g.term or not primary:
                done.append((token, errors.NotPrimary(
                    f"the write at {g} was not acknowledged before a newer term began;"
                    " its outcome is unknown", gtid=list(g), outcome="unknown")))
            elif acknowledged(g, w, self.durable, self.votes):
                done.append((token, None))
            elif d is not None and now_ms >= d:
                have = sum(1 for x in self.durable.values() if x is not None and x >= g)
                done.append((token, errors.WriteConcernTimeout(
                    f"write at {g} reached {have} member(s), w={w!r} not met in "
                    "time; it stays committed (a timeout is not a rollback)", gtid=list(g))))
            else:
                keep.append(item)
        self.waiting = keep
        return done

    def step_down(self, member: int) -> list[tuple[Any, Exception]]:
        """This member stopped being primary: every waiter fails now (its outcome
        is unknown) and the positions are forgotten."""
        waiting, self.waiting = self.waiting, []
        self.durable = {}
        return [(token, errors.NotPrimary(
            f"member {member} stepped down before the write at {g} was acknowledged; "
            "its outcome is unknown", gtid=list(g), outcome="unknown"))
            for g, _, _, token in waiting]

