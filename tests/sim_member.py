"""A simulated member: the shipped ShardService and cores over simulated
processes, timers, Ray calls and disks (tests/sim.py).
"""
from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Callable

from raymx import errors
from raymx.actors.core import replication as rep
from raymx.actors.core import producer as pc
from raymx.actors.core import member as mc
from raymx.actors.core.member import MemberCore
from raymx.actors.core.primary import deposed
from raymx.actors.shard import ShardService
from raymx.storage import codec
from raymx.storage.engine import Engine
from raymx.storage.gtid import GTID, ZERO
from raymx.storage.store import MemoryStore
from tests.sim_base import PULL_TIMEOUT_MS, Violation, WTIMEOUT_MS

if TYPE_CHECKING:
    from tests.sim import Sim


# --- a member: the shells' glue over the shipped cores ------------------------
class SimMember:
    """One member's four actors over one store. The primary's write path is
    the shipped ``ShardService`` itself (``handle``, the writer's turn, write
    groups, n entries of failed commits, ``GroupCommit``, the write-concern
    waiters, step-down), built with this member's timers and clock instead
    of its threads. What ``OplogShard``, ``FeederService``, ``Producer`` and
    ``Applier`` do with their threads is here as events, and every decision
    in them is the shipped cores': ``MemberCore`` (terms, roles,
    configuration), ``ProducerCore`` (when to pull, what an answer means),
    ``FeederCore.admit``/``answer`` (fencing, which positions count),
    ``WriteConcernCore``, ``deposed``. Volatile state is rebuilt on restart
    exactly as the shells' constructors rebuild it."""

    def __init__(self, sim: "Sim", mid: int, store: MemoryStore):
        self.sim, self.id, self.store = sim, mid, store
        self.name = f"m{mid}"
        self.limits = sim.limits
        self.engine = Engine(store, sim.limits, now_ms=self.now)
        self.engine.sync()  # what survived a crash is now the durable, recovered state
        self.engine.put_meta("member_id", mid)
        self.verified: tuple = (ZERO, 0)  # the checker's verified oplog prefix (last, hash)
        self._conns: dict[str, dict] = {}  # client connections' state (transactions)
        self.oplog_dirty = True
        # OplogShard
        self.core = MemberCore(self.engine, mid)
        self._majority_at = -10**9
        self._control: deque = deque()  # the role lock: one control call at a time
        self._control_busy = False
        # ShardService: the shipped one (writes, group commit, write concern),
        # its threads replaced by this member's timers and clock
        self.engine.sync = self._sync_engine  # the fsync, with injected failures
        self._sync_failed: Exception | None = None
        # what Ray restarts the shell's actors with: the arguments of their creation
        boot = sim.boot_specs.get(mid, sim.specs)
        _, votes = mc.start_config(self.engine, mid, next(s for s in boot if s["id"] == mid),
                                   {s["id"]: s.get("votes", 1) for s in boot})
        self.svc = ShardService(self.engine, sim.limits, primary=False, on_commit=self._committed,
                                on_durable=self._on_durable, member_id=mid,
                                votes=votes,
                                on_fatal=self._fatal, timer=self._svc_timer, clock_ms=self.now)
        self._hashes: dict[GTID, int] = {}  # each commit's hash, for the checker
        # Feeder
        self.feeder = rep.FeederCore(self.engine, sim.limits)
        self.feeder.set_votes(self.votes)
        self.feeder.upstream_majority = self.majority_known
        self.feeder_waiting: list = []
        self.feeder_primary = False  # FeederService.primary
        self._feeder_reset()
        # Producer: starts paused; the coordinator says whom to follow
        self.producer = pc.ProducerCore(self.engine, mid, sim.limits)
        self.p_locked = False        # the producer's write lock (batch or rollback)
        self.p_dead = False          # an exception ended the producer's loop
        self._ploop = pc.run(self.producer, self, sim.opts.hashes_per_round)
        self._p_blocked = False
        self.later(0, self._p_resume)
        self.rollbacks: list = []
        # Applier
        replay = {} if sim.opts.replay_entries_min >= sim.limits.replay_entries_min else {
            "replay_entries_min": sim.opts.replay_entries_min, "replay_entries_max": 7,
            "replay_txn_docs_max": 2}  # small rounds of small transactions: crashes between
        self.apply_limits = sim.limits.with_(apply_batch_ops=sim.opts.apply_batch_ops, **replay)
        self.apply_held = False
        self._apply_queued = False
        self._kick_applier()
        if sim.abandoning:  # the trimmer's round (its share that matters here)
            self.later(sim.limits.trim_interval_ms, self._trimmer_round)

    @property
    def role(self) -> str:
        return self.core.role

    # the ShardService's state, under the names the shell reads it by
    primary = property(lambda self: self.svc.primary)
    gm = property(lambda self: self.svc.gm)
    votes = property(lambda self: self.svc.votes)
    majority_known = property(lambda self: self.svc.majority_known)

    # -- helpers ---------------------------------------------------------
    def later(self, delay_ms: int, fn: Callable, *args) -> None:
        """A timer of this incarnation: it does not fire after a crash."""
        ep = self.sim.epoch(self.name)

        def fire():
            if self.sim.node(self.name) is self and self.sim.epoch(self.name) == ep:
                try:
                    fn(*args)
                except errors.DiskFailed as e:  # a thread's sync failed: it stops the process
                    self._fatal(e)
        self.sim.sched.at(delay_ms, fire)

    def now(self) -> int:
        """This member's machine clock (``clock_jump_p`` moves it)."""
        return self.sim.sched.now + self.sim.clock_offsets.get(self.id, 0)

    def trace(self, what: str) -> None:
        self.sim.trace(self.name, what)

    # -- the role lock: become_primary / follow / step_down run one at a time
    def _control_call(self, fn: Callable, respond: Callable, *args) -> None:
        self._control.append((fn, respond, args))
        self._control_next()

    def _control_next(self) -> None:
        if self._control_busy or not self._control:
            return
        fn, respond, args = self._control.popleft()
        self._control_busy = True

        def done(result=None, err=None):
            self._control_busy = False
            respond(result, err)
            self._control_next()
        try:
            fn(done, *args)
        except errors.RaymxError as e:
            done(err=e)

    # -- elections (coordinator calls): OplogShard -------------------------
    def on_heartbeat(self, respond, term: int, alive: list | None) -> None:
        if self.core.heartbeat(term, self.primary, self.gm.term):
            self._become_secondary()
        if alive:
            now = self.now()
            self.set_positions({}, {int(m): now for m in alive})
        respond(self.core.reply(self.gm.term, self.sim.sched.now))  # a monotonic clock

    def on_set_config(self, respond, config: dict) -> None:
        if self.core.set_config(config, self.primary):
            self.svc.set_votes({s["id"]: s.get("votes", 1) for s in config["members"]})
            self.feeder.set_votes(self.votes)  # as the Feeder shell does
            self.svc.wc.tick()
            self._on_durable()  # as OplogShard.set_config
        respond(None)

    def on_get_config(self, respond) -> None:
        respond(self.engine.get_meta("rs_config"))

    def on_commit_state(self, respond) -> None:
        last, _ = self.engine.last()
        fence = self.core.fence
        respond({"primary": self.primary and self.role == "primary", "term": self.engine.term,
                 "last": list(last), "fence": None if fence is None else list(fence),
                 "durable": {m: list(g) for m, g in self.svc.wc.positions().items()
                             if g is not None}})

    def on_become_primary(self, respond, term: int) -> None:
        self._control_call(self._become_primary, respond, term)

    def _become_primary(self, done, term: int) -> None:
        """OplogShard.become_primary: the steps of ``MemberCore.promote``."""
        self._promote(done, term, self.core.promote(term), None)

    def _promote(self, done, term: int, steps, answer) -> None:
        while True:
            try:
                what, arg = steps.send(answer)
            except StopIteration as stop:
                last = stop.value
                self.trace(f"primary term={term} last={last}")
                return done({"term": term, "last": list(last)})
            except errors.StaleTerm as e:
                self.trace(f"become_primary term={term} refused: {e}")
                return done(err=e)
            except errors.DiskFull as e:  # raised to the caller
                return done(err=e)
            answer = None
            if what == mc.PAUSE_PRODUCER:  # producer.pause(wait=True)
                self.producer.paused = True
                if self.p_locked:  # a batch or a rollback holds its write lock: wait
                    return self._wait_unlocked(done, term, steps)
            elif what == mc.DRAIN:  # applying the backlog takes a while
                return self.later(self.sim.rng.randint(0, 30), self._drain, done, term, steps)
            elif what == mc.FEEDER_PRIMARY:
                self._feeder_reset(primary=True)
            elif what == mc.TAKE_WRITES:
                try:
                    self.svc.become_primary(arg)
                except errors.DiskFailed as e:  # its sync failed: OplogShard stops the process
                    return self._fatal(e)
                self.sim.checker.on_elected(self, arg)
            elif what == mc.NOOP:
                try:
                    self.own_noop()
                except errors.RaymxError as e:  # the shell queues it and does not wait
                    self.trace(f"no-op of term {term} refused: {e}")
            elif what == mc.DURABLE:
                self._on_durable()

    def _wait_unlocked(self, done, term: int, steps) -> None:
        if self.p_locked:
            return self.later(5, self._wait_unlocked, done, term, steps)
        self._promote(done, term, steps, None)

    def _drain(self, done, term: int, steps) -> None:
        try:
            while rep.min_unapplied(self.engine) is not None:
                rep.apply_step(self.engine, self.apply_limits, self.now())
        except errors.DiskFull as e:
            return done(err=e)
        self._promote(done, term, steps, None)

    def _become_secondary(self) -> None:
        self.core.became_secondary()
        self.svc.step_down()
        self._feeder_reset(primary=False)  # feeder.set_primary(False)
        self.trace("secondary")

    def on_follow(self, respond, term: int, source: int | None) -> None:
        self._control_call(self._follow, respond, term, source)

    def _follow(self, done, term: int, source: int | None) -> None:
        if self.core.follow(term, source, self.primary, self.gm.term):
            self._become_secondary()
        if source is not None:
            self.producer.follow(source, term)
            self._kick_producer()
            self.core.following_now(source, term)
        done(None)

    def on_step_down(self, respond, term: int) -> None:
        self._control_call(self._step_down, respond, term)

    def _step_down(self, done, term: int) -> None:
        if self.core.step_down(term, self.primary, self.gm.term):
            self._become_secondary()
        done(None)

    def on_positions(self, durable: dict, heard: dict) -> None:
        self.set_positions({int(m): None if g is None else GTID(*g) for m, g in durable.items()},
                           {int(m): at for m, at in heard.items()})
        mp = self.svc.wc.majority_point() if self.primary else None
        self.svc.note_majority(mp)
        if self.majority_known is not None and self.now() - self._majority_at >= 1000:
            self._majority_at = self.now()
            self.engine.set_majority(self.majority_known)  # a restart point, not a gate

    def set_positions(self, durable: dict, heard_ms: dict) -> None:
        self.svc.set_positions(durable, heard_ms)

    # -- ShardService: the shipped one; its threads are these events --------
    def on_write(self, respond, req: dict, conn: str | None = None) -> None:
        """ShardService.handle, then the writer's turn (its thread's loop body).
        ``conn``: the client connection's name, whose state (its open
        transactions) lives in this process as long as it does."""
        def reply(ok=None, err=None):
            if err is not None:
                return respond(err=err)
            if req.get("w", 1) not in (0, 1, None) and ok.get("gtid"):
                g = GTID(*ok["gtid"])
                self.sim.checker.on_majority_ack(self, g, self._hashes[g])
            respond(ok)
        self.svc.handle(req, reply, {} if conn is None else self._conns.setdefault(conn, {}))
        self.svc.run_queued()
        self.oplog_dirty = True

    def _trimmer_round(self) -> None:
        """What the trimmer thread's round does for transactions: while plain
        writes wait for them, the writer ends those past their limits."""
        self.svc.sweep_waiting_writes()
        self.svc.run_queued()
        self.later(self.sim.limits.trim_interval_ms, self._trimmer_round)

    def _committed(self, g: GTID) -> None:
        """ShardService's on_commit: ``g`` is in the oplog (not yet durable)."""
        with self.engine.store.read() as t:
            h = codec.unpack(t.get("oplog", g.to_bytes()), "oplog entry")["h"]
        self._hashes[g] = h
        self.trace(f"commit {g}")
        self.sim.checker.on_commit(self, g, h)

    def own_noop(self) -> GTID:
        """ShardService.own_noop (run here, not queued: this is the writer's turn)."""
        g = self.svc.own_noop()
        self.oplog_dirty = True
        self._committed(g)
        return g

    def _svc_timer(self, delay_ms: int, fn: Callable) -> None:
        """The ShardService's timers (its syncer's, its waiters' deadlines); the
        disk takes a while."""
        self.later(delay_ms + self.sim.rng.randint(0, self.sim.opts.disk_ms_max), fn)

    def _sync_engine(self) -> None:
        """Engine.sync with the injected failures (``fsync_fail_p``). A failure
        is final, as LMDBStore's is: every later sync fails too."""
        o = self.sim.opts
        if self._sync_failed is None and o.fsync_fail_p and self.sim.net.faults \
                and self.sim.disk_rng.random() < o.fsync_fail_p:
            if self.sim.broken == "fsync_retry":
                # planted bug (PostgreSQL's old way): the kernel dropped the dirty
                # pages and cleared the error; the retry "succeeds" over them
                self.trace("fsync failed: retried")
                self.store.crash()
            else:
                self._sync_failed = errors.DiskFailed(f"m{self.id}: injected fsync failure")
        if self._sync_failed is not None:
            raise self._sync_failed
        Engine.sync(self.engine)

    def _fatal(self, e: Exception) -> None:
        """process.stop_process: a failed fsync stops the member's processes;
        Ray restarts them."""
        self.trace(f"fsync failed: the process stops ({e})")
        self.sim.crash_member(self.id, machine=True)
        self.sim.sched.at(self.sim.disk_rng.randint(50, 2000), self.sim._restart_member, self.id)

    def _on_durable(self, g: GTID | None = None) -> None:
        """OplogShard._on_durable: the feeder ships what is durable."""
        limit = rep.shipping_limit(self.primary, self.votes, self.gm.replicatable())
        if limit is not None:
            self.feeder_on_limit(limit)

    def on_read(self, respond, level: str) -> None:
        """ShardService._read of the counter document at read concern ``level``."""
        if level == "linearizable" and deposed(self.primary, self.engine.term, self.gm.term):
            return respond(err=errors.NotPrimary(f"member {self.id} is not the primary"))
        refusal = self.core.read_refusal()
        if refusal is not None:
            return respond(err=errors.NotPrimaryOrSecondary(f"member {self.id} is {refusal}"))
        r = self.engine.reader()
        try:
            if level == "majority" and self.sim.broken != "dirty_reads":
                point = self.majority_known or ZERO
                r.at(point)
                if r.point is None:  # the point is at or past what this member applied
                    point = rep.applied_point(self.engine)
            else:
                point = rep.applied_point(self.engine)
            value = next(iter(r.find("db.k", {"_id": "ctr"})), None)
        finally:
            r.t.abort()
        h = 0
        if point != ZERO:
            with self.engine.store.read() as t:
                h = codec.unpack(t.get("oplog", point.to_bytes()), "oplog entry")["h"]
        out = {"level": level, "value": value, "point": list(point), "h": h}
        if level != "linearizable":
            return respond(out)
        # confirm_primary: a no-op entry under this term, acknowledged by a majority
        try:
            g = self.own_noop()
        except errors.RaymxError as e:
            return respond(err=e)

        def ok():
            self.sim.checker.on_majority_ack(self, g, self._hashes[g])
            respond(out)
        self.svc.wc.wait(g, "majority", WTIMEOUT_MS, ok, lambda e: respond(err=e))

    # -- Feeder: FeederService.pull over FeederCore ---------------------------
    def _feeder_reset(self, primary: bool | None = None) -> None:
        if primary is not None:
            self.feeder_primary = primary
        self.feeder.truncated()
        self.feeder.advance(self.engine.last()[0])
        self._feeder_wake()

    def feeder_on_limit(self, limit: GTID) -> None:
        if self.feeder.advance(limit):
            self._feeder_wake()

    def _feeder_wake(self) -> None:
        waiting, self.feeder_waiting = self.feeder_waiting, []
        for w in waiting:
            self._feeder_try(w, final=False)

    def _feeder_try(self, w: dict, final: bool) -> None:
        if w["done"]:
            return
        r = w["req"]
        out, report, _ = self.feeder.answer(
            r["after"], r["after_h"], r["max_entries"], r["max_bytes"], w["term"], r["member"],
            self.id, self.feeder_primary, w.pop("caller", None), self.now())
        if report:
            self.on_positions({m: None if p["durable"] is None else list(p["durable"])
                               for m, p in report.items()},
                              {m: p["at_ms"] for m, p in report.items()})
        if out["status"] != "ok" or out["rows"] or final:
            w["done"] = True
            w["respond"](out)
        else:
            self.feeder_waiting.append(w)

    def on_pull(self, respond, req: dict) -> None:
        stale = self.feeder.admit(req["term"], self.id)
        if stale is not None:
            self.svc.wc.tick()  # a deposed primary's waiters fail now
            return respond(stale)
        w = {"req": req, "term": self.engine.term, "respond": respond, "done": False,
             "caller": {"durable": req["durable"], "applied": req["applied"],
                        "downstream": req["downstream"]}}
        self._feeder_try(w, final=False)
        if not w["done"]:
            self.later(req["wait_ms"], self._feeder_try, w, True)

    def on_find_common(self, respond, candidates: list) -> None:
        g = rep.match_common(self.engine, candidates)
        respond(None if g is None else list(g))

    def feeder_positions(self) -> dict:
        return {m: {"durable": None if p["durable"] is None else list(p["durable"]),
                    "applied": None if p["applied"] is None else list(p["applied"]),
                    "at_ms": p["at_ms"]} for m, p in self.feeder.positions.items()}

    # -- Producer: the shipped loop (pc.run); its effects are events here ----
    def _kick_producer(self) -> None:
        """follow(): a loop waiting in ``BLOCKED`` looks again."""
        if self._p_blocked:
            self._p_blocked = False
            self.later(0, self._p_resume)

    def _p_resume(self, value=None, thrown: Exception | None = None) -> None:
        """Run the loop to its next effect that takes time, carrying out the
        instant ones on the way (Producer._run, with this member's timers
        and simulated calls for its thread and Ray calls)."""
        if self.p_dead:
            return
        while True:
            try:
                eff = self._ploop.throw(thrown) if thrown is not None else self._ploop.send(value)
            except (Violation, AssertionError):
                raise
            except errors.DiskFailed as e:  # Producer._run: the process stops
                return self._fatal(e)
            except Exception as e:  # the loop ended: the shell's thread would be gone
                self.trace(f"producer thread dies: {type(e).__name__}: {e}")
                self.p_dead = True
                self.p_locked = False
                return
            value, thrown = None, None
            if isinstance(eff, (pc.Pull, pc.FindCommon)):
                method, args = (("pull", (eff.req,)) if isinstance(eff, pc.Pull)
                                else ("find_common", (eff.candidates,)))
                what = f"{method} from m{eff.source}"

                def reply(out, err, what=what):
                    if err is not None:
                        return self._p_resume(thrown=pc.CallFailed(f"{what}: {err}"))
                    self._p_resume(out)
                self.sim.rpc.call(self.name, f"m{eff.source}", method, args, reply,
                                  PULL_TIMEOUT_MS, lambda what=what: self._p_resume(
                                      thrown=pc.CallFailed(f"{what} timed out")))
                return
            if isinstance(eff, pc.Sleep):
                return self.later(eff.ms, self._p_resume)
            if eff == pc.SYNC:  # the sync takes a while: a crash before it loses the batch
                self.oplog_dirty = True
                return self.later(self.sim.rng.randint(0, self.sim.opts.disk_ms_max),
                                  self._p_sync)
            if eff == pc.BLOCKED:
                self._p_blocked = True  # follow() kicks it
                return
            if eff in (pc.LOCK, pc.UNLOCK):
                self.p_locked = eff == pc.LOCK
            elif eff in (pc.HOLD_APPLIER, pc.RELEASE_APPLIER):
                self.apply_held = eff == pc.HOLD_APPLIER
                if not self.apply_held:
                    self._kick_applier()

    def _p_sync(self) -> None:
        try:
            self.engine.sync()
        except errors.DiskFailed as e:  # the Producer shell stops the process
            return self._fatal(e)
        self._p_resume()

    # what the loop tells its shell (pc.ProducerIO)
    def downstream(self) -> dict:
        return self.feeder_positions()

    def learned(self, g: GTID) -> None:
        self.svc.note_majority(g)  # by doorbell to OplogShard._note_majority
        fm = self.feeder.upstream_majority  # FeederService.on_majority
        if fm is None or g > fm:
            self.feeder.upstream_majority = g

    def state(self, state: str) -> None:
        self.core.on_sync_state(state)  # Notifier "on_sync_state"

    def written(self, g: GTID, n: int, rows: list) -> None:
        self._kick_applier()
        self.feeder_on_limit(g)

    def rollback_file(self, common: GTID):
        return "memory", lambda records: self.rollbacks.append((common, records))

    def rolling_back(self, source: int, common: GTID) -> None:
        undone = [(g, e["h"]) for g, e in self.engine.read_oplog(after=common)]
        self.sim.checker.on_rollback(self, source, common, undone)

    def rolled_back(self, common: GTID, n: int, where: str) -> None:
        self.oplog_dirty = True
        self.trace(f"rolled back {n} entries to {common}")
        self._feeder_reset()  # OplogShard.truncated: feeder.truncated()

    def failed(self, e: Exception) -> None:
        if isinstance(e, (Violation, AssertionError)):
            raise e
        self.trace(f"producer: {type(e).__name__}: {e}")

    # -- Applier ---------------------------------------------------------------
    def _kick_applier(self) -> None:
        if not self._apply_queued:
            self._apply_queued = True
            self.later(self.sim.rng.randint(0, 10), self._apply)

    def _apply(self) -> None:
        self._apply_queued = False
        if self.apply_held:
            return self._kick_applier()
        try:
            n, _, _, _ = rep.apply_step(self.engine, self.apply_limits, self.now())  # Applier._run
        except errors.DiskFull:  # Applier._run: logged, tried again in a second
            self._apply_queued = True
            return self.later(1000, self._apply)
        if n:
            self._kick_applier()
