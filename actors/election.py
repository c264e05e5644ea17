"""ElectionCore: failure detection and elections for one replica set (pure).

Input: heartbeat replies (or failures) with ``now_ms``; output: actions for
the shell to carry out, in order. The core imports no Ray, clock or randomness,
so the simulation drives the same decisions the coordinator actor makes.

Rules (DESIGN section 7, TokuMX 2.0):

* the primary has failed when it has not answered for ``heartbeat_timeout_ms``
  or its actor is dead;
* an election needs a majority of voting, running members (never a
  synchronizing one); the winner is the most advanced (largest last GTID),
  ties by priority then lowest id;
* if the most advanced member may not be primary (priority 0, hidden,
  delayed), the best eligible member first catches up from it;
* the winner takes term ``max known term + 1`` (durably, before it accepts a
  write); every other member is told to follow it under that term;
* a member that reports itself primary under an older term is told to step
  down (a deposed primary); a primary that cannot see a majority steps down
  by itself (see ShardService).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from raymx.storage.gtid import GTID, ZERO


@dataclass
class View:
    id: int
    priority: float = 1
    votes: int = 1
    hidden: bool = False
    delay_s: float = 0
    sync_source: int | None = None
    alive: bool = False
    dead: bool = False          # the actor is gone for good (not just slow)
    seen_ms: int | None = None  # last successful heartbeat
    term: int = 0
    last: GTID = ZERO
    role: str = "unknown"
    state: str = "unknown"
    loading: bool = False       # an initial sync has not finished loading its snapshot
    loaded_at: GTID | None = None  # the snapshot's GTID once loaded (this process's life)
    following: tuple | None = None  # (sync source, term) the member says it follows

    @property
    def eligible(self) -> bool:
        return self.priority > 0 and not self.hidden and not self.delay_s


@dataclass
class Action:
    kind: str          # "elect" | "catch_up" | "follow" | "step_down"
    member: int
    term: int = 0
    source: int | None = None
    target: GTID | None = None


@dataclass
class ElectionCore:
    members: dict[int, View]
    heartbeat_timeout_ms: int
    primary: int | None = None
    term: int = 0
    catching_up: tuple[int, int, GTID] | None = None  # (member, source, target)
    elections: int = 0
    log: list = field(default_factory=list)

    @classmethod
    def from_specs(cls, specs: list[dict], heartbeat_timeout_ms: int) -> "ElectionCore":
        views = {s["id"]: View(s["id"], s.get("priority", 1), s.get("votes", 1),
                               bool(s.get("hidden")), s.get("delay_s", 0),
                               s.get("sync_source")) for s in specs}
        return cls(views, heartbeat_timeout_ms)

    # --- input -----------------------------------------------------------
    def on_heartbeat(self, member: int, reply: dict | None, now_ms: int, dead: bool = False):
        v = self.members.get(member)
        if v is None:
            return
        if reply is None:
            v.dead = v.dead or dead
            if v.seen_ms is None or now_ms - v.seen_ms >= self.heartbeat_timeout_ms or dead:
                v.alive = False
            return
        v.alive, v.dead, v.seen_ms = True, False, now_ms
        v.term = reply["term"]
        v.last = GTID(*reply["last"]) if reply.get("last") else ZERO
        v.role = reply.get("role", "unknown")
        v.state = reply.get("state", "running")
        v.loading = bool(reply.get("loading"))
        v.loaded_at = GTID(*reply["loaded_at"]) if reply.get("loaded_at") else None
        f = reply.get("following")
        v.following = None if f is None else (f[0], f[1])
        self.term = max(self.term, v.term)

    def on_elected(self, member: int, term: int) -> None:
        self.primary = member
        self.term = max(self.term, term)
        v = self.members[member]
        v.role, v.term = "primary", max(v.term, term)
        self.catching_up = None
        self.elections += 1
        self.log.append(("elected", member, term))

    def on_failed(self, action: Action) -> None:
        """The shell could not carry out ``action``: try again next tick."""
        if action.kind in ("elect", "catch_up"):
            self.catching_up = None

    # --- decisions -------------------------------------------------------
    def majority(self) -> int:
        return sum(1 for v in self.members.values() if v.votes > 0) // 2 + 1

    def _candidates(self) -> list[View]:
        return [v for v in self.members.values() if v.alive and v.state == "running"]

    def sync_source_for(self, v: View) -> int | None:
        """The configured source if it is alive and not this member, else the primary."""
        src = v.sync_source
        if src is not None and src != self.primary and src in self.members and \
                self.members[src].alive and src != v.id:
            return src
        return self.primary

    def tick(self, now_ms: int) -> list[Action]:
        out: list[Action] = []
        p = self.members.get(self.primary) if self.primary is not None else None
        # a primary that answers as a secondary in the current term has restarted
        restarted = p is not None and p.role != "primary" and p.term >= self.term
        if p is not None and (p.dead or not p.alive or restarted or (
                p.seen_ms is not None and now_ms - p.seen_ms >= self.heartbeat_timeout_ms)):
            self.log.append(("primary_failed", p.id, now_ms, p.seen_ms))
            self.primary = None
        if self.primary is None:
            out += self._elect()
        chosen = {a.member for a in out if a.kind == "elect"}
        # deposed or confused primaries step down; everyone follows the primary
        for v in self.members.values():
            if not v.alive or v.id == self.primary or v.id in chosen:
                continue
            if v.role == "primary":
                out.append(Action("step_down", v.id, self.term))
            elif self.primary is not None and self.catching_up is None:
                src = self.sync_source_for(v)
                if v.term < self.term or v.following != (src, self.term):
                    out.append(Action("follow", v.id, self.term, src))
        return out

    def _elect(self) -> list[Action]:
        cands = self._candidates()
        voting_up = sum(1 for v in cands if v.votes > 0)
        if voting_up < self.majority():
            return []  # no majority: no primary, writes fail with PrimaryUnavailable
        best = max(cands, key=lambda v: (v.last, v.priority, -v.id))
        new_term = max([self.term] + [v.term for v in self.members.values()]) + 1
        if best.eligible:
            return [Action("elect", best.id, new_term)]
        eligible = [v for v in cands if v.eligible]
        if not eligible:
            return []
        e = max(eligible, key=lambda v: (v.last, v.priority, -v.id))
        if e.last >= best.last:
            return [Action("elect", e.id, new_term)]
        self.catching_up = (e.id, best.id, best.last)
        return [Action("catch_up", e.id, new_term, source=best.id, target=best.last)]

    def reconfigure(self, specs: list[dict]) -> None:
        """Members added, removed or changed: views follow, majorities with them."""
        new = {}
        for sp in specs:
            v = self.members.get(sp["id"]) or View(sp["id"])
            v.priority, v.votes = sp.get("priority", 1), sp.get("votes", 1)
            v.hidden, v.delay_s = bool(sp.get("hidden")), sp.get("delay_s", 0)
            v.sync_source = sp.get("sync_source")
            new[sp["id"]] = v
        self.members = new
        if self.primary not in new:
            self.primary = None

    def ready_to_join(self, member: int, lag_entries: int) -> bool:
        """A member created from a snapshot (configured with no vote while it
        synchronizes) may take its votes and priority: its snapshot is loaded and
        its oplog is within ``lag_entries`` of the primary's. Decided here, on
        heartbeats, so the join completes even if the driver that started the
        copy went away after it."""
        v, p = self.members.get(member), self.members.get(self.primary)
        if v is None or p is None or not v.alive or v.loading or not p.alive:
            return False
        if v.loaded_at is not None and v.last <= v.loaded_at and v.last < p.last:
            return False  # not one pull since the load yet: its sources still hold for it
        return v.last != ZERO and p.last.seq - v.last.seq <= lag_entries

    def step_down_to(self, member: int) -> list[Action]:
        """Planned hand-over: the shell has made ``member`` catch up already."""
        new_term = max([self.term] + [v.term for v in self.members.values()]) + 1
        return [Action("elect", member, new_term)]
