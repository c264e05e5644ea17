"""The simulated coordinator and clients, and the checker of invariants
(tests/sim.py).
"""
from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Callable

from raymx import errors
from raymx.actors.core import replication as rep
from raymx.actors.core.election import (Action, ElectionCore, change_blockers,
                                        check_config_change, edit_config, keeps_primary,
                                        next_join)
from raymx.storage import codec, oplog
from raymx.storage.gtid import GTID, ZERO
from tests.sim_base import (ActorUnavailable, CLIENT_TIMEOUT_MS, CONTROL_TIMEOUT_MS,
                            ELECT_TIMEOUT_MS, RECONFIG_TIMEOUT_MS, Violation, WTIMEOUT_MS)

if TYPE_CHECKING:
    from tests.sim import Sim
    from tests.sim_member import SimMember


# --- the election coordinator --------------------------------------------------
class SimCoordinator:
    """The coordinator actor's loop: a heartbeat round, then ``tick`` and its
    actions in order, each a call with a timeout. The decisions are the
    shipped ``ElectionCore``'s (``tick``, ``call``, the election's ``fence``
    and ``fenced``, ``change_blockers``)."""

    name = "c"

    def __init__(self, sim: "Sim"):
        self.sim = sim
        # as the actor's constructor: the newest configuration a running member holds
        cfgs = [m.engine.get_meta("rs_config") for m in sim.members()]
        cfg = max((c for c in cfgs if c), key=lambda c: c["version"],
                  default={"version": 1, "members": sim.specs})
        self.version, self.config = max(1, cfg["version"]), [dict(m) for m in cfg["members"]]
        self.core = ElectionCore.from_specs(self.config, sim.limits.heartbeat_timeout_ms)
        self.core.settled = sim.epoch(self.name) <= 1  # restarted: config_standing decides
        self._taking = False  # a newer configuration asked of a member
        self.changing = False
        self.queued: deque = deque()
        self._join_start: dict[int, dict] = {}  # a joining member's start point
        self.inbox: dict[int, list] = {}
        self._round_ids: list[int] = []
        self._round_start = 0
        self.later(0, self._round)

    def later(self, delay_ms, fn, *args):
        ep = self.sim.epoch(self.name)

        def fire():
            if self.sim.node(self.name) is self and self.sim.epoch(self.name) == ep:
                fn(*args)
        self.sim.sched.at(delay_ms, fire)

    def _round(self) -> None:
        self._round_start = self.sim.sched.now
        alive = [v.id for v in self.core.members.values() if v.alive]
        self._round_ids = [m["id"] for m in self.config]  # Coordinator._beat: its members
        for mid in self._round_ids:
            self.sim.rpc.call(self.name, f"m{mid}", "heartbeat", (self.core.term, alive),
                              lambda r, err, mid=mid: self.inbox.setdefault(mid, []).append(
                                  err if err is not None else r),
                              10 * self.sim.limits.heartbeat_interval_ms)
        self.later(self.sim.limits.heartbeat_interval_ms, self._round_end)

    def _round_end(self) -> None:
        now = self.sim.sched.now
        for mid in self._round_ids:
            replies = self.inbox.pop(mid, [])
            for r in replies:
                if isinstance(r, ActorUnavailable):  # died or restarting: down now
                    self.core.on_heartbeat(mid, None, now, dead=True)
                elif isinstance(r, Exception):  # the call raised (its disk is full): no answer
                    self.core.on_heartbeat(mid, None, now)
                else:
                    self.core.on_heartbeat(mid, r, now)
            if not replies:
                self.core.on_heartbeat(mid, None, now)
        had = self.core.primary
        actions = self.core.tick(now) if self._standing() else []
        for v in self.core.members.values():  # Coordinator._push_to
            if self.core.settled and v.alive and v.config_version < self.version:
                self._push(v.id)
        if had is not None and self.core.primary is None:
            self.sim.trace(self.name, f"primary m{had} failed")
        if self.sim.broken == "reuse_term":
            for a in actions:
                if a.kind == "elect" and a.term > 1:
                    a.term -= 1  # planted bug: elect without a new term
        self._finish_joins()
        self._act(actions)

    def _standing(self) -> bool:
        """``Coordinator._standing``: a member reporting a newer configuration
        gives the coordinator its own (asked now, taken when it answers); the
        members no configuration holds once it is settled are the operator's
        failed additions (``ReplicaSet.add_member`` stops them)."""
        was = self.core.settled
        mid = self.core.config_standing(self.version, self.config)
        if mid is None:
            if self.core.settled and not was:
                self.sim.trace(self.name, f"settled on config {self.version}")
                self.sim.retire_unconfigured()
            return True
        if not self._taking:
            self._taking = True
            self.sim.rpc.call(self.name, f"m{mid}", "get_config", (), self._take,
                              CONTROL_TIMEOUT_MS, lambda: self._take(None, None))
        return False

    def _take(self, cfg, err) -> None:
        self._taking = False
        if err is not None or cfg is None or cfg["version"] <= self.version:
            return
        self.sim.trace(self.name, f"config {cfg['version']} taken from a member "
                       f"(this coordinator held {self.version})")
        self.version, self.config = cfg["version"], [dict(m) for m in cfg["members"]]
        self.core.reconfigure(self.config)

    def _act(self, actions: list[Action]) -> None:
        if not actions:
            wait = self._round_start + self.sim.limits.heartbeat_interval_ms - self.sim.sched.now
            return self.later(max(0, wait), self._round)
        a = actions.pop(0)
        if a.kind == "elect":
            return self._fence(a, actions)
        self._call(a, actions, CONTROL_TIMEOUT_MS)

    def _call(self, a: Action, actions: list[Action], timeout_ms: int) -> None:
        method, args = self.core.call(a)
        self.sim.trace(self.name, f"{a.kind} m{a.member} term={a.term}"
                       + (f" source=m{a.source}" if a.source is not None else ""))

        def on_reply(r, err):
            if err is not None:
                self.sim.trace(self.name, f"{a.kind} m{a.member} failed: {type(err).__name__}")
                self.core.on_failed(a)
            elif a.kind == "elect":
                self.core.on_elected(a.member, a.term)
            self._act(actions)

        def on_timeout():
            self.sim.trace(self.name, f"{a.kind} m{a.member} timed out")
            self.core.on_failed(a)
            self._act(actions)
        self.sim.rpc.call(self.name, f"m{a.member}", method, args, on_reply, timeout_ms,
                          on_timeout)

    def _fence(self, a: Action, actions: list[Action]) -> None:
        """Coordinator._prepare: the new term to every member that answers
        heartbeats, then the winner from their fresh answers."""
        core, term = self.core, a.term
        targets = core.fence(a)
        replies: dict[int, dict] = {}
        state = {"open": True}
        self.sim.trace(self.name, f"fence term={term} -> {targets}"
                       + (f" ({a.why}: m{core.primary} -> m{a.member})" if a.why else ""))

        def close():
            if not state["open"]:
                return
            state["open"] = False
            best = core.fenced(a, replies, self.sim.sched.now)
            if best is None:
                self.sim.trace(self.name, f"fence term={term}: no winner")
                core.on_failed(a)  # the core sends catch_up on its next tick if needed
                return self._act(actions)
            self._call(Action("elect", best, term), actions, ELECT_TIMEOUT_MS)

        def on_reply(mid, r, err):
            if err is None and state["open"]:
                replies[mid] = r
                if len(replies) == len(targets):
                    close()
        for mid in targets:
            self.sim.rpc.call(self.name, f"m{mid}", "heartbeat", (term, []),
                              lambda r, err, mid=mid: on_reply(mid, r, err), CONTROL_TIMEOUT_MS)
        if not targets:
            return close()
        self.later(3 * self.sim.limits.heartbeat_interval_ms, close)

    # -- configuration changes: Coordinator.change ------------------------
    def set_votes(self, member: int, votes: int) -> None:
        """An operator gives or takes a member's vote (``reconfigure_member``)."""
        self.change(f"votes m{member}={votes}", lambda cfg: [
            dict(m, votes=votes) if m["id"] == member else dict(m) for m in cfg])

    def remove(self, member: int) -> None:
        """``remove_member``: once installed and recorded by a majority of the
        voters that remain, the member stops for good."""
        self.change(f"remove m{member}",
                    lambda cfg: edit_config(cfg, self.core.primary, remove=member),
                    done=lambda finish, deadline: self._stop_when_recorded(member, deadline,
                                                                           finish))

    def _stop_when_recorded(self, member: int, deadline: int, finish) -> None:
        """``Coordinator._await_recorded`` (the newest configuration, which
        does not hold the member), holding the changes queued behind, as the
        actor's change does until its deadline; then ``remove_member``'s kill
        (or, past the deadline, the operator's ``kill_member`` once it is
        recorded)."""
        if self.core.config_recorded(self.version, self.config):
            self.sim.retire_member(member, "removed")
            return finish and finish()
        if finish and self.sim.sched.now >= deadline:
            finish()  # remove_member's ConfigError: the member runs on for now
            finish = None
        # (the heartbeat round pushes the configuration to those behind)
        self.later(self.sim.limits.heartbeat_interval_ms, self._stop_when_recorded, member,
                   deadline, finish)

    def put(self, spec: dict, refused: Callable[[], None]) -> None:
        """``add_member``'s change: the new member, joining."""
        self.change(f"add m{spec['id']}",
                    lambda cfg: edit_config(cfg, self.core.primary, put=spec),
                    done=lambda finish, _: (self._added(spec["id"]), finish()),
                    refused=refused)

    def _added(self, mid: int) -> None:
        self.sim.adding.discard(mid)
        self.sim.membership[0] += 1

    def change(self, what: str, edit: Callable[[list], list], done=None, refused=None) -> None:
        """One change, applied to the configuration current when its turn comes,
        each after the one before; a voter change waits like the actor's
        ``change`` (every heartbeat interval, up to RECONFIG_TIMEOUT_MS)."""
        if self.changing:
            self.queued.append((what, edit, done, refused))
            return self.sim.trace(self.name, f"{what} queued")
        if self.core.unsettled(self.config):  # Coordinator._await_settled
            self.changing = True
            return self._settle_then(what, edit, done, refused,
                                     self.sim.sched.now + RECONFIG_TIMEOUT_MS)
        try:
            new = edit(self.config)
            voters_change = check_config_change(self.config, new)
        except errors.ConfigError as e:
            self.sim.trace(self.name, f"{what} refused: {e}")
            if refused:
                refused()
            return self._next_change()  # the operators' other calls go on
        self.changing = True
        self.sim.trace(self.name, f"{what} asked")
        self._try_change(new, voters_change and self.sim.broken != "unsafe_reconfig",
                         self.sim.sched.now + RECONFIG_TIMEOUT_MS, {}, done, refused)

    def _settle_then(self, what, edit, done, refused, deadline: int) -> None:
        why = self.core.unsettled(self.config)
        if not why:
            self.changing = False
            return self.change(what, edit, done, refused)
        if self.sim.sched.now >= deadline:
            self.sim.trace(self.name, f"{what} refused: {'; '.join(why)}")
            if refused:
                refused()
            return self._next_change()
        self.later(self.sim.limits.heartbeat_interval_ms, self._settle_then, what, edit, done,
                   refused, deadline)

    def _try_change(self, new: list, voters_change: bool, deadline: int, start: dict,
                    done=None, refused=None, quiet: bool = False) -> None:
        def install():
            try:
                keeps_primary(new, self.core.primary)  # elected while the change waited?
            except errors.ConfigError as e:
                self.sim.trace(self.name, f"change refused: {e}")
                if refused:
                    refused()
                return self._next_change()
            self._install(new)
            if done:  # it calls _next_change (finish) when the caller's change returns
                return done(self._next_change, deadline)
            self._next_change()
        if not voters_change:
            return install()

        def decide(st):
            why = change_blockers(self.core, self.version, self.config, new, start, st)
            if not why:
                return install()
            if self.sim.sched.now >= deadline:
                if not quiet:
                    self.sim.trace(self.name, f"change refused: {'; '.join(why)}")
                if refused:
                    refused()
                return self._next_change()
            self.later(self.sim.limits.heartbeat_interval_ms, self._try_change, new,
                       voters_change, deadline, start, done, refused)
        prim = self.core.primary
        if prim is None:
            return decide(None)
        self.sim.rpc.call(self.name, f"m{prim}", "commit_state", (),
                          lambda r, err: decide(None if err is not None else r),
                          CONTROL_TIMEOUT_MS, lambda: decide(None))

    def _finish_joins(self) -> None:
        """Coordinator._finish_one_join: a joining member that caught up gets its
        votes, when no operator's change is under way; a voter change that must
        wait is tried again next round (never blocking heartbeats)."""
        if self.changing:
            return
        ready = next_join(self.core, self.config, self.sim.limits.join_lag_entries)
        if ready is None:
            return
        mid, new = ready
        self.changing = True
        self.sim.trace(self.name, f"m{mid} caught up: its votes asked")
        self._try_change(new, check_config_change(self.config, new)
                         and self.sim.broken != "unsafe_reconfig", self.sim.sched.now,
                         self._join_start.setdefault(mid, {}),
                         done=lambda finish, _: (self._join_start.pop(mid, None), finish()),
                         quiet=True)

    def _install(self, new: list) -> None:
        self.version += 1
        self.config = new
        self.core.reconfigure(new)
        self.sim.trace(self.name, f"config {self.version}: voters "
                       f"{[m['id'] for m in new if m.get('votes', 1)]}"
                       + "".join(f" m{m['id']} joining" for m in new if m.get("joining")))
        for m in self.config:
            self._push(m["id"])

    def _next_change(self) -> None:
        self.changing = False
        if self.queued:
            self.change(*self.queued.popleft())

    def _push(self, mid: int) -> None:
        self.sim.rpc.call(self.name, f"m{mid}", "set_config",
                          ({"version": self.version, "members": self.config},),
                          lambda r, err: None, CONTROL_TIMEOUT_MS)


# --- clients ------------------------------------------------------------------
BANK_ACCOUNTS = 5
class SimClient:
    """A driver: pipelines up to ``inflight_max`` writes to the member it believes
    is primary; on NotPrimary or a timeout it tries the next member."""

    def __init__(self, sim: "Sim", cid: int, active: bool = True):
        self.sim, self.id, self.name = sim, cid, f"k{cid}"
        self.n = 0
        self.target = sim.rng.choice(sim.member_ids)
        self.inserted: list[str] = []
        self.inflight = 0
        self.inflight_max = sim.rng.choice((1, 2, 4))
        self.transferring = False
        self.active = active
        if active:
            self.sim.sched.at(sim.rng.randint(0, 100), self._tick)

    def _pick(self) -> dict:
        rng, o = self.sim.rng, self.sim.opts
        self.n += 1
        w = "majority" if rng.random() < o.majority_p else 1
        r = rng.random()
        if r < 0.45 or not self.inserted:
            _id = f"{self.id}-{self.n}"
            req = {"op": "insert", "ns": "db.c", "docs": [{"_id": _id, "c": self.id, "n": self.n}]}
            self.inserted.append(_id)
        elif r < 0.75:
            req = {"op": "update", "ns": "db.k", "filter": {"_id": "ctr"},
                   "update": {"$inc": {"n": 1}}, "upsert": True}
        elif r < 0.88:
            req = {"op": "update", "ns": "db.c", "filter": {"_id": rng.choice(self.inserted)},
                   "update": {"$set": {"x": self.n}}}
        elif r < 0.96:
            req = {"op": "delete", "ns": "db.c", "filter": {"_id": rng.choice(self.inserted)}}
        else:
            req = {"op": "createIndex", "ns": "db.c", "key": "n"}
        req["w"] = w
        if w == "majority":
            req["wtimeout_ms"] = WTIMEOUT_MS
        return req

    def _tick(self) -> None:
        if not self.active:
            return
        o = self.sim.opts
        if o.reads_p and self.sim.read_rng.random() < o.reads_p:
            self._read()
        elif o.bank_p and self.sim.bank_rng.random() < o.bank_p:
            if not self.transferring:
                self._transfer()
            else:
                self._touch()
        elif self.inflight < self.inflight_max:
            self.send(self._pick(), lambda ok: None)
        self.sim.sched.at(self.sim.rng.randint(1, 2 * self.sim.opts.write_gap_ms), self._tick)

    def _read(self) -> None:
        """A read of the counter: "majority" from any member, "linearizable"
        from the member this client believes is primary."""
        rr = self.sim.read_rng
        level = rr.choice(("majority", "majority", "linearizable"))
        target = self.target if level == "linearizable" else rr.choice(self.sim.member_ids)

        def on_reply(r, err):
            if err is None:
                self.sim.checker.on_read(target, r)
        self.sim.rpc.call(self.name, f"m{target}", "read", (level,), on_reply,
                          CLIENT_TIMEOUT_MS, lambda: None)

    def _touch(self) -> None:
        """A write outside transactions to an account (a counter beside its
        balance) while this client's transfer is open: it waits for every
        open transaction that wrote the account (its own among them) to end
        (``ShardService._park``), then runs."""
        rr = self.sim.bank_rng
        self.send({"op": "update", "ns": "db.bank", "filter": {"_id": rr.randrange(BANK_ACCOUNTS)},
                   "update": {"$inc": {"touched": 1}}, "w": rr.choice((1, "majority")),
                   "wtimeout_ms": WTIMEOUT_MS}, lambda ok: None)

    def _transfer(self) -> None:
        """Move money between two accounts in one interactive transaction, as
        a driver does on one connection: txnBegin, a read of both balances in
        its snapshot, a $set of each (idempotent, so a duplicated message
        changes nothing), txnCommit. A conflict, an error or a lost answer
        ends the attempt (an abort, if the transaction may be open)."""
        rr, sim = self.sim.bank_rng, self.sim
        a, b = rr.sample(range(BANK_ACCOUNTS), 2)
        x, w = rr.randint(1, 9), "majority" if rr.random() < 0.5 else 1
        target, state = self.target, {}
        self.transferring = True
        sim.checker.transfers[0] += 1

        def call(req: dict, then: Callable) -> None:
            def on_reply(r, err):
                if err is None:
                    return then(r)
                end(err)
            sim.rpc.call(self.name, f"m{target}", "write", (req, self.name), on_reply,
                         CLIENT_TIMEOUT_MS, lambda: end(TimeoutError()))

        def end(err=None) -> None:
            self.transferring = False
            if err is None:
                sim.checker.transfers[1] += 1
                return
            if isinstance(err, errors.WriteConflict):
                sim.checker.transfers[2] += 1
            if isinstance(err, (errors.NotPrimary, ActorUnavailable, TimeoutError)) \
                    and self.target == target:
                self._next_target()
            if "txn" in state and not isinstance(err, errors.WriteConflict):
                sim.rpc.call(self.name, f"m{target}", "write",
                             ({"op": "txnAbort", "txn": state["txn"]}, self.name),
                             lambda r, e: None, CLIENT_TIMEOUT_MS, lambda: None)

        def begun(r):
            state["txn"] = r["txn"]
            call({"op": "find", "ns": "db.bank", "filter": {"_id": {"$in": [a, b]}},
                  "txn": r["txn"]}, read)

        def read(r):
            bal = {d["_id"]: d["bal"] for d in r["docs"]}
            put(a, bal.get(a, 0) - x, lambda _: put(b, bal.get(b, 0) + x, commit))

        def walk_away() -> None:  # neither commit nor abort: the transaction stays open
            self.transferring = False
            sim.checker.transfers[3] += 1

        def put(acct, v, then):
            call({"op": "update", "ns": "db.bank", "filter": {"_id": acct},
                  "update": {"$set": {"bal": v}}, "upsert": True, "txn": state["txn"]}, then)

        def commit(_):
            if sim.abandoning and sim.abandon_rng.random() < sim.opts.abandon_p:
                return walk_away()
            req = {"op": "txnCommit", "txn": state["txn"], "w": w}
            if w == "majority":
                req["wtimeout_ms"] = WTIMEOUT_MS
            call(req, lambda r: end())
        call({"op": "txnBegin"}, begun)

    def _next_target(self) -> None:
        ids = self.sim.member_ids  # a removed member's clients move on to the first
        self.target = ids[(ids.index(self.target) + 1) % len(ids) if self.target in ids else 0]

    def send(self, req: dict, done: Callable[[bool], None]) -> None:
        sim = self.sim
        target = self.target
        self.inflight += 1

        def on_reply(r, err):
            self.inflight -= 1
            if err is not None and self.target == target and \
                    isinstance(err, (errors.NotPrimary, ActorUnavailable)):
                self._next_target()
            done(err is None)

        def on_timeout():
            self.inflight -= 1
            if self.target == target:
                self._next_target()
            done(False)
        sim.rpc.call(self.name, f"m{target}", "write", (req,), on_reply, CLIENT_TIMEOUT_MS,
                     on_timeout)


# --- the checker: invariants after every event, convergence at the end -------
class Checker:
    """Safety, checked as it happens: one member commits per term (and a GTID
    never names two different entries); a majority-acknowledged write is never
    rolled back; oplogs stay dense and hash-chained. Liveness and convergence,
    checked at the end: see ``final``."""

    def __init__(self, sim: "Sim"):
        self.sim = sim
        self.term_owner: dict[int, int] = {}       # term -> the member that committed under it
        self.committed: dict[GTID, int] = {}       # GTID -> hash, as its primary wrote it
        self.acked: dict[GTID, tuple] = {}         # majority-acknowledged: GTID -> (hash, member)
        self.reads: list[tuple] = []               # (member, level, point, hash, value read)
        self.read_points: dict[tuple, str] = {}    # (GTID, hash) a read was served at
        self.commits = 0
        self.rollbacks = 0
        self.rolled_back_entries = 0
        self.elections = 0
        self.transfers = [0, 0, 0, 0]  # bank transfers begun, committed, in conflict, abandoned

    def fail(self, msg: str) -> None:
        raise Violation(msg)

    def on_elected(self, m: SimMember, term: int) -> None:
        self.elections += 1

    def on_commit(self, m: SimMember, g: GTID, h: int) -> None:
        self.commits += 1
        owner = self.term_owner.setdefault(g.term, m.id)
        if owner != m.id:
            self.fail(f"two primaries accepted writes in term {g.term}: m{owner} and m{m.id} "
                      f"(m{m.id} committed {g})")
        if self.committed.get(g, h) != h:
            self.fail(f"GTID {g} committed twice with different contents")
        self.committed[g] = h

    def on_majority_ack(self, m: SimMember, g: GTID, h: int) -> None:
        self.acked[g] = (h, m.id)
        self.sim.trace(m.name, f"ack w=majority {g}")

    def on_read(self, member: int, r: dict) -> None:
        point = GTID(*r["point"])
        self.reads.append((member, r["level"], point, r["h"], r["value"]))
        if point != ZERO:
            self.read_points[(point, r["h"])] = f"{r['level']} read on m{member}"
        self.sim.trace(f"m{member}", f"read {r['level']} at {point}: {r['value']}")

    def on_rollback(self, m: SimMember, src: int, common: GTID, undone: list) -> None:
        self.rollbacks += 1
        self.rolled_back_entries += len(undone)
        for g, h in undone:
            if (g, h) in self.read_points:
                self.fail(f"m{m.id} rolls back {g}, which a {self.read_points[(g, h)]} "
                          "returned data as of: that read saw a write that is rolled back")
            a = self.acked.get(g)
            if a is not None and a[0] == h:
                self.fail(f"m{m.id} rolls back majority-acknowledged write {g} (acknowledged by "
                          f"m{a[1]}): its sync source m{src} does not hold it; "
                          f"common point {common}")

    def check_oplog(self, m: SimMember) -> None:
        """The whole oplog: dense from seq 1 and hash-chained."""
        try:
            m.engine.verify_oplog()
        except errors.CorruptEntry as e:
            self.fail(f"m{m.id}: oplog is not gap-free and hash-chained: {e}")
        first = next(iter(m.engine.read_oplog(limit=1)), None)
        if first is not None and first[0].seq != 1:
            self.fail(f"m{m.id}: oplog starts at {first[0]}, not at seq 1 (nothing trims here)")
        m.verified = m.engine.last()
        m.oplog_dirty = False

    def check_tail(self, m: SimMember) -> None:
        """After an event that changed m's oplog: the new entries continue the
        verified prefix densely and chain to it; a changed prefix (rollback,
        crash) is verified whole again."""
        m.oplog_dirty = False
        g0, h0 = m.verified
        if g0 != ZERO:
            with m.store.read() as t:
                b = t.get("oplog", g0.to_bytes())
            if b is None or codec.unpack(b)["h"] != h0:
                return self.check_oplog(m)
        prev, prev_h = g0, h0
        for g, e in m.engine.read_oplog(after=None if g0 == ZERO else g0):
            if g.seq != prev.seq + 1 or g < prev:
                self.fail(f"m{m.id}: oplog gap or order break between {prev} and {g}")
            if oplog.chain_hash(prev_h, g, oplog.digest_of(e["ops"])) != e["h"]:
                self.fail(f"m{m.id}: hash chain broken at {g}")
            prev, prev_h = g, e["h"]
        m.verified = (prev, prev_h)

    def final(self, members: list[SimMember]) -> None:
        ref = members[0]
        ref_log = [(g, e["h"]) for g, e in ref.engine.read_oplog()]
        ref_state = ref.engine.snapshot_state()
        for m in members:
            self.check_oplog(m)
            if rep.min_unapplied(m.engine) is not None:
                self.fail(f"m{m.id} still has unapplied entries from {rep.min_unapplied(m.engine)}")
            log = [(g, e["h"]) for g, e in m.engine.read_oplog()]
            if log != ref_log:
                i = next((i for i, (a, b) in enumerate(zip(log, ref_log)) if a != b),
                         min(len(log), len(ref_log)))
                self.fail(f"oplogs differ: m{m.id} has {len(log)} entries, m{ref.id} "
                          f"{len(ref_log)}; first difference at index {i}: "
                          f"{log[i] if i < len(log) else None} vs "
                          f"{ref_log[i] if i < len(ref_log) else None}")
            if m.engine.snapshot_state() != ref_state:
                self.fail(f"collections differ between m{m.id} and m{ref.id}")
        have = dict(ref_log)
        self._check_reads(ref, have)
        for g, (h, by) in self.acked.items():
            if have.get(g) != h:
                self.fail(f"majority-acknowledged write {g} (acknowledged by m{by}) is lost: "
                          f"final oplogs hold {'a different entry' if g in have else 'nothing'} "
                          "there")
        self._model(ref)

    def _check_reads(self, ref: SimMember, have: dict) -> None:
        """Every majority or linearizable read was of committed data: its point is
        in the final history, and the counter it returned is the final history's
        counter as of that point."""
        ctr_at: list[tuple[GTID, dict | None]] = []
        cur = None
        for g, e in ref.engine.read_oplog():
            for op in e["ops"]:
                if op.get("ns") == "db.k":
                    cur = op.get("post") if op["op"] in ("i", "u") else None
            ctr_at.append((g, cur))
        at = dict(ctr_at)
        for member, level, point, h, value in self.reads:
            if point != ZERO and have.get(point) != h:
                self.fail(f"a {level} read on m{member} returned data as of {point}, which "
                          "the final history does not hold: it saw a rolled-back write")
            want = None if point == ZERO else at.get(point)
            if value != want:
                self.fail(f"a {level} read on m{member} at {point} returned {value}; the "
                          f"final history has {want} there")

    def _model(self, m: SimMember) -> None:
        """The collections must equal a naive replay of the oplog's images."""
        docs: dict[str, dict] = {"db.c": {}, "db.k": {}, "db.bank": {}}
        for _, e in m.engine.read_oplog():
            for op in e["ops"]:
                if op["op"] in ("i", "u"):
                    docs[op["ns"]][op["post"]["_id"]] = op["post"]
                elif op["op"] == "d":
                    docs[op["ns"]].pop(op["pre"]["_id"], None)
        total = sum(d["bal"] for d in docs["db.bank"].values())
        if total:  # every transfer took from one account what it gave another
            self.fail(f"m{m.id}: the bank's balances sum to {total}, not 0: a transaction "
                      "was applied in part, or over a write it did not see")
        state = m.engine.snapshot_state()
        for ns, want in docs.items():
            got = {d["_id"]: d for d in state.get(ns, {}).get("docs", [])}
            if got != want:
                self.fail(f"m{m.id}: {ns} does not match a replay of the oplog "
                          f"({len(got)} documents vs {len(want)})")
        incs = sum(1 for _, e in m.engine.read_oplog() for op in e["ops"]
                   if op.get("ns") == "db.k" and op["op"] in ("i", "u"))
        ctr = docs["db.k"].get("ctr", {}).get("n", 0)
        if ctr != incs:
            self.fail(f"counter is {ctr} but the oplog holds {incs} increments")
