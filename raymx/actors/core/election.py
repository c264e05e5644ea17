"""ElectionCore: failure detection and elections for one replica set (pure).

Input: heartbeat replies (or failures) with ``now_ms``; output: actions for
the shell to carry out, in order. The core imports no Ray, clock or randomness,
so the simulation drives the same decisions the coordinator actor makes.

Rules (DESIGN section 7, TokuMX 2.0):

* the primary has failed when it has not answered for ``heartbeat_timeout_ms``
  or its actor is dead;
* an election needs a majority of voting members that answer; a member that
  cannot stand (resync, synchronizing, priority 0) still votes, as in MongoDB,
  but only for a winner at least as advanced as itself (Raft's vote rule:
  it may hold a committed entry the others lack); the winner is the most
  advanced running member (largest last GTID), ties by priority then lowest
  id, and is never one that needs a resync or is synchronizing;
* if the most advanced member may not be primary (priority 0, hidden,
  delayed), the best eligible member first catches up from it;
* the winner takes term ``max known term + 1`` (durably, before it accepts a
  write); every other member is told to follow it under that term;
* a member that reports itself primary under an older term is told to step
  down (a deposed primary); a primary that cannot see a majority steps down
  by itself (see ShardService);
* a coordinator that has no primary (it restarted) adopts a member that
  reports itself primary in the highest term it knows, with a majority of
  voters up, instead of electing again.
* a primary that refuses writes for a full disk (``disk_full`` in its
  heartbeats) hands over, as a mongod that aborts on ENOSPC fails over: an
  election, fenced as any other, proposing a running eligible member that
  holds everything the primary has and has ``DISK_ROOM_BYTES`` free; at most
  one such hand-over every ``DISK_HAND_OVER_EVERY_MS``. Among equally advanced
  members, every election prefers one with room.

Configuration changes (``check_config_change``, ``config_change_blockers``)
follow MongoDB's safe reconfig and Raft's single-server changes: one voter
added or removed at a time; the current configuration recorded by a majority
of its voters, and everything acknowledged under the configuration before it
durable on a majority of the current voters; the majority-committed point
durable on a majority of the new voters. Only then is the new one installed.
So a majority of the new configuration holds every write a majority
acknowledged before it, and single-voter quorums overlap for the writes
acknowledged while the change is installed.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from raymx import errors
from raymx.storage.gtid import GTID, ZERO

DISK_ROOM_BYTES = 64 << 20  # the least free space of a member a full primary hands over to
DISK_HAND_OVER_EVERY_MS = 10_000  # a full disk on every member must not make elections loop


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
    config_version: int = 0     # the newest configuration the member has recorded
    lead_term: int | None = None  # the term it takes writes in, if it says it is primary
    disk_full: bool = False     # it refused a write for a full disk lately
    disk_free: int | None = None  # bytes free on its disk (None: unknown)

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
    why: str = ""      # "disk_full": a full primary's hand-over


@dataclass
class ElectionCore:
    members: dict[int, View]
    heartbeat_timeout_ms: int
    primary: int | None = None
    term: int = 0
    catching_up: tuple[int, int, GTID] | None = None  # (member, source, target)
    elections: int = 0
    adoptions: int = 0
    started_ms: int | None = None  # the first tick (a restarted coordinator's too)
    disk_hand_over_ms: int | None = None  # the last hand-over from a full primary
    # False in a restarted coordinator until it knows its configuration is the
    # newest (``config_standing``): until then it elects no one and changes nothing
    settled: bool = True
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
        v.config_version = reply.get("config_version", 0)
        v.lead_term = reply.get("lead_term")
        v.disk_full = bool(reply.get("disk_full"))
        v.disk_free = reply.get("disk_free")
        self.term = max(self.term, v.term)

    def on_elected(self, member: int, term: int) -> None:
        self.term = max(self.term, term)
        self.catching_up = None
        v = self.members.get(member)
        if v is None:
            # removed from the configuration while its election was under way:
            # no primary, as ``reconfigure`` leaves it when it removes one; the
            # next tick elects among the members, under a newer term
            return
        self.primary = member
        v.role, v.term = "primary", max(v.term, term)
        self.elections += 1
        self.log.append(("elected", member, term))

    def on_failed(self, action: Action) -> None:
        """The shell could not carry out ``action``: try again next tick."""
        if action.kind in ("elect", "catch_up"):
            self.catching_up = None

    # --- decisions -------------------------------------------------------
    def majority_count(self) -> int:
        return sum(1 for v in self.members.values() if v.votes > 0) // 2 + 1

    def _candidates(self) -> list[View]:
        return candidates([v for v in self.members.values() if v.alive])

    def choose_winner(self, answered: list[View], proposed: int | None = None) -> int | None:
        """The winner of a fenced election among the members that ``answered``
        (with their last GTID as of after recording the new term), or None:
        no majority of votes for the most advanced candidate, or it may not
        lead (the next tick catches an eligible member up first). ``proposed``
        (the core's choice, or a planned hand-over's target) wins if it is
        among the best."""
        cands = candidates(answered)
        if not cands:
            return None
        best = max(cands, key=rank)
        if votes_for(answered, best.last) < self.majority_count():
            return None
        eligible = [v for v in cands if v.eligible and v.last >= best.last]
        if not eligible:
            return None
        if any(v.id == proposed for v in eligible):
            return proposed
        return max(eligible, key=rank).id

    def call(self, a: Action) -> tuple[str, tuple]:
        """The member call that carries out ``a`` (an ``elect`` after its fence)."""
        if a.kind == "elect":
            return "become_primary", (a.term,)
        if a.kind == "catch_up":
            return "follow", (self.term, a.source)
        if a.kind == "follow":
            return "follow", (a.term, a.source)
        return "step_down", (a.term,)

    def fence(self, a: Action) -> list[int]:
        """An election starts with its fence (Raft's vote): every member that is
        not known down is sent the new term in a heartbeat; they record it
        durably (from then on they refuse entries from, and acknowledgements to,
        older terms) and answer with their last GTID as of after that. A term
        once sent is never handed out again. Returns whom to send it to: the
        members that answer heartbeats (waiting for one that does not would
        only delay the election)."""
        self.term = max(self.term, a.term)
        return [v.id for v in self.members.values() if v.alive]

    def fenced(self, a: Action, answers: dict[int, dict], now_ms: int) -> int | None:
        """The fence's answers are in (those that came in time): the winner among
        the members that recorded ``a.term``, or None (no majority, or nobody
        eligible: the next tick tries again)."""
        for mid, r in answers.items():
            self.on_heartbeat(mid, r, now_ms)
        return self.choose_winner([self.members[m] for m, r in answers.items()
                                   if m in self.members and r.get("term") == a.term],
                                  a.member)

    def sync_source_for(self, v: View) -> int | None:
        """The configured source if it is alive and not this member, else the primary."""
        src = v.sync_source
        if src is not None and src != self.primary and src in self.members and \
                self.members[src].alive and src != v.id:
            return src
        return self.primary

    def tick(self, now_ms: int) -> list[Action]:
        if not self.settled:
            return []  # its configuration may be an old one (config_standing)
        out: list[Action] = []
        p = self.members.get(self.primary) if self.primary is not None else None
        # a primary that answers as a secondary in the current term has restarted
        restarted = p is not None and p.role != "primary" and p.term >= self.term
        if p is not None and (p.dead or not p.alive or restarted or (
                p.seen_ms is not None and now_ms - p.seen_ms >= self.heartbeat_timeout_ms)):
            self.log.append(("primary_failed", p.id, now_ms, p.seen_ms))
            self.primary = None
        if self.started_ms is None:
            self.started_ms = now_ms
        if self.primary is None:
            self._adopt()
        if self.primary is None and not self._first_round_open(now_ms):
            out += self._elect()
        if self.primary is not None and self.catching_up is None:
            hand_over = self._disk_hand_over(now_ms)
            if hand_over is not None:
                return [hand_over]  # the others follow the winner at the next tick
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

    def _disk_hand_over(self, now_ms: int) -> Action | None:
        """The primary refuses writes for a full disk: an election proposing the
        member with room that holds everything it has (its fence deposes the
        primary, which writes nothing meanwhile), or None."""
        p = self.members[self.primary]
        if not p.disk_full or (self.disk_hand_over_ms is not None and
                               now_ms - self.disk_hand_over_ms < DISK_HAND_OVER_EVERY_MS):
            return None
        room = [v for v in self._candidates() if v.id != p.id and v.eligible
                and v.state == "running" and not v.disk_full and v.last >= p.last
                and v.disk_free is not None and v.disk_free >= DISK_ROOM_BYTES]
        if not room:
            return None
        to = max(room, key=rank)
        self.disk_hand_over_ms = now_ms
        self.log.append(("disk_hand_over", p.id, to.id, now_ms))
        return Action("elect", to.id, self._new_term(), why="disk_full")

    def _first_round_open(self, now_ms: int) -> bool:
        """Before its first election or adoption, a coordinator waits until every
        member answered or is known down, or a heartbeat timeout passed: a
        primary whose answer is late must be adopted, not replaced."""
        if self.elections or self.adoptions:
            return False
        if now_ms - self.started_ms >= self.heartbeat_timeout_ms:
            return False
        return any(v.seen_ms is None and not v.dead for v in self.members.values())

    def _adopt(self) -> None:
        """No primary known (a restarted coordinator): a member that reports
        itself primary in the highest term anyone holds, with a majority of
        voters up, keeps the role; no new election, no lost availability."""
        up = [v for v in self.members.values() if v.alive]
        top = max([self.term] + [v.term for v in up])
        p = [v for v in up if v.role == "primary" and v.term == top and v.lead_term == top
             and v.state == "running"]
        if len(p) == 1 and sum(1 for v in up if v.votes > 0) >= self.majority_count():
            self.primary = p[0].id
            self.term = top
            self.catching_up = None  # a catch-up for an election that is not needed now
            self.adoptions += 1
            self.log.append(("adopted", p[0].id, top))

    def _elect(self) -> list[Action]:
        cands = self._candidates()
        if not cands:
            return []
        best = max(cands, key=rank)
        up = [v for v in self.members.values() if v.alive]
        if votes_for(up, best.last) < self.majority_count():
            return []  # no majority: no primary, writes fail with PrimaryUnavailable
        new_term = self._new_term()
        if best.eligible:
            return [Action("elect", best.id, new_term)]
        eligible = [v for v in cands if v.eligible]
        if not eligible:
            return []
        e = max(eligible, key=rank)
        if e.last >= best.last:
            return [Action("elect", e.id, new_term)]
        self.catching_up = (e.id, best.id, best.last)
        return [Action("catch_up", e.id, new_term, source=best.id, target=best.last)]

    def config_standing(self, version: int, specs: list[dict]) -> int | None:
        """Is ``version`` (members ``specs``) the newest configuration? Ray
        restarts a coordinator with its launch's arguments, and the members it
        asked for theirs may not have answered (down, cut off, removed since),
        so a restarted one's configuration is a guess until members answer.

        Returns a member that reports a newer configuration (the shell takes
        that member's, then ``reconfigure``), else None. ``settled`` becomes
        True once a majority of the voters of ``specs`` answered with nothing
        newer: voters change one at a time, and each configuration is recorded
        by a majority of its voters before the next is installed
        (``config_change_blockers``), so any majority of an older
        configuration's voters holds a member that recorded the next one.
        Until then ``tick`` elects no one and every change waits
        (``unsettled``): a coordinator that took an old configuration counted
        votes of members removed since, so it could never elect (the members
        removed were gone for good), and it gave out configuration versions
        the members already held with other members (simulation seed
        241,875); with fewer voters than the newest it could elect with a
        majority of the old ones only."""
        newer = [v for v in self.members.values() if v.alive and v.config_version > version]
        if newer:
            return max(newer, key=lambda v: (v.config_version, -v.id)).id
        if not self.settled and len(self._heard(specs)) >= _majority_of(voters(specs)):
            self.settled = True
            self.log.append(("settled", version))
        return None

    def _heard(self, specs: list[dict]) -> list[int]:
        return [m for m in voters(specs) if m in self.members and self.members[m].alive]

    def unsettled(self, specs: list[dict]) -> list[str]:
        """Why a configuration change must wait while ``settled`` is False."""
        if self.settled:
            return []
        ids = voters(specs)
        return [f"the coordinator restarted and has heard from voters {self._heard(specs)} of "
                f"{ids} only; it needs {_majority_of(ids)} to know its configuration "
                "is the newest"]

    def config_committed(self, version: int, specs: list[dict]) -> list[int]:
        """Voters of ``specs`` that have recorded configuration ``version``."""
        return [m for m in voters(specs)
                if m in self.members and self.members[m].config_version >= version]

    def config_recorded(self, version: int, specs: list[dict]) -> bool:
        """Has a majority of the voters of ``specs`` recorded configuration
        ``version``? Only then may a member it removed stop: a coordinator that
        restarts rebuilds the newest configuration from the members it finds,
        and one that found only the configuration before would count the
        stopped member's vote for good."""
        return len(self.config_committed(version, specs)) >= _majority_of(voters(specs))

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
        return [Action("elect", member, self._new_term(), why="step_down")]

    def _new_term(self) -> int:
        """A term above every term known (an election's)."""
        return max([self.term] + [v.term for v in self.members.values()]) + 1


def rank(v: View) -> tuple:
    """Who wins among candidates: the most advanced; among equals one with room
    on its disk, then the highest priority, then the lowest id."""
    return (v.last, not v.disk_full, v.priority, -v.id)


def candidates(views) -> list[View]:
    """Members that may be elected: running (or recovering: a restarted member
    not yet confirmed by a sync source, which may hold committed entries);
    never one that needs a resync or is loading a snapshot."""
    return [v for v in views if v.state in ("running", "recovering")]


def votes_for(views, last: GTID) -> int:
    """Votes a candidate whose last GTID is ``last`` gets from ``views``: every
    voting member, running or not, that is not more advanced than it."""
    return sum(1 for v in views if v.votes > 0 and v.last <= last)


# --- configuration changes -------------------------------------------------
def voters(specs: list[dict]) -> list[int]:
    return sorted(s["id"] for s in specs if s.get("votes", 1) > 0)


def check_config_change(old: list[dict], new: list[dict]) -> bool:
    """Is ``old`` -> ``new`` allowed? Raises ConfigError if it adds or removes
    more than one voter or leaves none. True if it changes the voters (it must
    then wait for ``config_change_blockers``), False if majorities stay as they are."""
    a, b = set(voters(old)), set(voters(new))
    if not b:
        raise errors.ConfigError("at least one voting member must remain")
    changed = sorted(a ^ b)
    if len(changed) > 1:
        raise errors.ConfigError(
            f"a configuration change adds or removes at most one voter; this one changes "
            f"the votes of members {changed}: make one change at a time (each waits for "
            "the one before it)")
    return bool(changed)


def edit_config(members: list[dict], primary: int | None, put: dict | None = None,
                remove: int | None = None) -> list[dict]:
    """``members`` with ``remove`` removed (never the primary) and ``put`` added
    or replacing its id's spec, in id order: one operator's change, applied to
    the configuration current when its turn comes."""
    new = [dict(m) for m in members]
    if remove is not None:
        if not any(m["id"] == remove for m in new):
            raise errors.ConfigError(f"no member {remove}")
        new = [m for m in new if m["id"] != remove]
    if put is not None:
        new = sorted([m for m in new if m["id"] != put["id"]] + [dict(put)],
                     key=lambda m: m["id"])
    keeps_primary(new, primary)
    return new


def keeps_primary(new: list[dict], primary: int | None) -> None:
    """Raises ConfigError if configuration ``new`` leaves out the primary:
    checked when a change is asked for and again when it is installed, since a
    change that waited may find the member it removes elected meanwhile (its
    removal would then kill the primary, an unplanned failover)."""
    if primary is not None and not any(m["id"] == primary for m in new):
        raise errors.ConfigError(f"member {primary} is the primary: step_down() first; "
                                 "nothing changed")


def next_join(core: ElectionCore, members: list[dict],
              lag_entries: int) -> tuple[int, list[dict]] | None:
    """The first joining member (``joining`` in its spec: added with no vote
    while it catches up) that ``core`` finds caught up, and the member list
    with its votes and priority given; None if none is ready (or ``core`` is
    not ``settled``: its configuration may be an old one)."""
    if not core.settled:
        return None
    for m in members:
        j = m.get("joining")
        if j and core.ready_to_join(m["id"], lag_entries):
            new = [dict(x) for x in members]
            for x in new:
                if x["id"] == m["id"]:
                    x.update(votes=j["votes"], priority=j["priority"])
                    del x["joining"]
            return m["id"], new
    return None


def _majority_of(ids) -> int:
    return len(ids) // 2 + 1


def committed_point(specs: list[dict], durable: dict[int, GTID | None]) -> GTID | None:
    """The majority-committed point under configuration ``specs``, from the
    primary's view of durable positions (a change captures it once, at its start)."""
    from raymx.actors.core.replication import majority_point
    return majority_point(durable, {s["id"]: s.get("votes", 1) for s in specs})


def config_change_blockers(old: list[dict], new: list[dict], recorded: list[int],
                           primary: int | None, committed: GTID | None, fence: GTID | None,
                           durable: dict[int, GTID | None]) -> list[str]:
    """Why a voter change ``old`` -> ``new`` may not be installed yet ([]: it may).

    ``recorded``: voters of ``old`` that hold ``old`` durably. From the primary
    (None, None, None, {}: there is no primary): ``committed``, the
    majority-committed point under ``old`` when the change began; ``fence``,
    its last entry when ``old`` was installed on it or it became primary (any
    write acknowledged under an earlier configuration is at most that);
    ``durable``, each member's durable position as it knows them."""
    out = []
    ov, nv = voters(old), voters(new)
    if len(recorded) < _majority_of(ov):
        out.append(f"the current configuration is recorded by voters {sorted(recorded)} "
                   f"only, it needs {_majority_of(ov)} of {ov}")
    if primary is None:
        out.append("there is no primary to tell which writes are committed")
        return out
    for what, ids, g in (("current", ov, fence), ("new", nv, committed)):
        if g is None:
            continue
        have = [m for m in ids if durable.get(m) is not None and durable[m] >= g]
        if len(have) < _majority_of(ids):
            out.append(f"the {what} configuration's voters {ids}: only {have} hold {g} "
                       f"durably, {_majority_of(ids)} must (the "
                       + ("majority-committed point)" if what == "new" else
                          "primary's last entry under the configuration before)"))
    return out


def change_blockers(core: ElectionCore, version: int, old: list[dict], new: list[dict],
                    start: dict, state: dict | None) -> list[str]:
    """What a voter change from ``old`` (configuration ``version``) to ``new``
    waits for, from the primary's ``commit_state`` answer (``state``; None if
    there is no primary or it did not answer). The committed point waited for
    is the one when the change began (kept in ``start``, per primary), so a
    busy primary's newer writes never keep the change waiting."""
    recorded = core.config_committed(version, old)
    prim, committed, fence, durable = core.primary, None, None, {}
    if prim is not None and state is not None and state.get("primary"):
        durable = {int(m): GTID(*g) for m, g in state["durable"].items()}
        committed = start.setdefault(prim, committed_point(old, durable))
        fence = None if state.get("fence") is None else GTID(*state["fence"])
    else:
        prim = None
    return config_change_blockers(old, new, recorded, prim, committed, fence, durable)
