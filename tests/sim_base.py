"""The simulation's ground: timeouts, options and scenarios, the scheduler,
the network and Ray calls over it (tests/sim.py runs them).
"""
from __future__ import annotations

import heapq
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from raymx import errors

if TYPE_CHECKING:
    from tests.sim import Sim


# Simulated timeouts of the shells' blocking calls (the real ones are 10-30 s;
# shorter here so a lost message costs seconds of simulated time, not minutes).
PULL_TIMEOUT_MS = 2_000
CONTROL_TIMEOUT_MS = 1_000
ELECT_TIMEOUT_MS = 2_000
RECONFIG_TIMEOUT_MS = 3_000
CLIENT_TIMEOUT_MS = 3_000
WTIMEOUT_MS = 2_000
# A transaction's limits where clients abandon transfers (``abandon_p``), so
# that one left open ends within the run (the real ones are 60 s).
TXN_IDLE_MS = 2_000
TXN_LIFETIME_MS = 10_000
# The liveness phase must converge within this much simulated time.
CONVERGE_MS_MAX = 60_000
EVENTS_MAX = 2_000_000


class Violation(Exception):
    """An invariant does not hold: the run failed."""


class ActorUnavailable(Exception):
    """Ray's answer to a call whose actor died or is restarting (ActorUnavailableError)."""


def reproduce_line(seed: int, broken: str | None = None, regress=(),
                   scenario: str | None = None, off=()) -> str:
    """The command that replays a run exactly."""
    out = "python -m tests.sim " + (f"--scenario {scenario}" if scenario else f"--seed {seed}")
    if broken:
        out += f" --broken {broken}"
    for n in regress:
        out += f" --regress {n}"
    for n in off:
        out += f" --off {n}"
    return out


# the random faults a run can switch off (``--off``): a reproduction found
# before a fault existed replays with it off
FAULTS = ("drop_p", "dup_p", "spike_p", "partition_p", "crash_p", "coordinator_crash_p",
          "reconfig_p", "reads_p", "fsync_fail_p", "clock_jump_p", "disk_full_p", "zombie_p",
          "bank_p", "abandon_p", "membership_p")  # bank_p: the transfers' workload,
# abandon_p: transfers left open, membership_p: members removed and added
# (seeds found before any of them replay without)


# --- options (swarm testing: the seed draws the shape and the fault mix) ----
@dataclass
class Options:
    seed: int
    members: int
    priority0: list          # member ids that may never be primary (catch-up path)
    clients: int
    write_gap_ms: int        # mean think time between a client's writes
    majority_p: float        # share of writes with w="majority"
    drop_p: float
    dup_p: float
    delay_ms_max: int
    spike_p: float           # share of messages delayed by up to 10 x delay_ms_max
    partition_p: float       # per fault tick (100 ms)
    crash_p: float
    machine_crash_p: float   # of crashes: lose unsynced writes (else a process crash)
    coordinator_crash_p: float
    disk_ms_max: int         # latency of a group-commit or producer sync
    apply_batch_ops: int
    hashes_per_round: int    # own_hashes batch when looking for the common point
    safety_ms: int
    # timing limits are drawn too (not the project's defaults), so a seed keeps
    # replaying the same run when a default changes
    heartbeat_interval_ms: int = 100
    heartbeat_timeout_ms: int = 600
    pull_wait_ms: int = 500
    # per fault tick: the coordinator is asked to give or take one member's
    # vote (a configuration change, while members may lag)
    reconfig_p: float = 0.0
    # per fault tick: an operator removes a member (a secondary: the primary is
    # refused; its process stops for good once the change is installed, as
    # ``ReplicaSet.remove_member`` kills it) or adds one (``add_member``: a new
    # id, an empty store, configured with no vote while it replicates the whole
    # oplog, then given its vote by the coordinator, ``next_join``), while
    # members may lag: the mission's worst fault was two members removed while
    # the rest lagged
    membership_p: float = 0.0
    # share of a client's requests that are reads ("majority" or "linearizable"
    # of the counter document), checked against the final committed history
    reads_p: float = 0.0
    # per sync (group commit or a producer's batch): the fsync fails. The
    # shells stop the process (stop_process: never retry a failed fsync) and
    # what the sync covered may be gone: a machine crash, then a restart
    fsync_fail_p: float = 0.0
    # per member per fault tick: its machine's clock jumps (forward or back, by
    # 0.1-5 s). Safety must not depend on clocks; they only time failure
    # detection, write-concern timeouts and trimming by age
    clock_jump_p: float = 0.0
    # a member's disk (or LMDB map) fills up for 0.1-3 s (MemoryStore.full)
    disk_full_p: float = 0.0
    # per member per fault tick: Ray takes the member's process for dead and
    # restarts it while the old one runs on (a zombie) for 0.3-3 s: Ray calls
    # to it fail, its clients' connections still reach it, and the new process
    # cannot take the folder's lock until the zombie is gone (process.lock_member)
    zombie_p: float = 0.0
    # share of a client's turns that move money between two accounts of
    # db.bank in an interactive transaction (txnBegin, a read, two $sets,
    # txnCommit, each a request of its own on the client's connection): the
    # balances must sum to zero on every member at the end
    bank_p: float = 0.0
    # share of transfers whose client walks away before its commit (a client
    # that hung or died): the transaction stays open, holding its accounts,
    # until it runs past its idle limit, which is short then (``Sim.limits``);
    # the member's trimmer round (a timer here) ends it, and the plain writes
    # parked behind it run
    abandon_p: float = 0.0
    # a member this many entries behind catches up by parallel replay (the
    # applier's replay path) instead of entry by entry
    replay_entries_min: int = 10_000
    # scripted faults (scenarios): (at_ms, "partition", groups) | (at_ms, "heal")
    # | (at_ms, "crash", member, machine) | (at_ms, "restart", member)
    # | (at_ms, "crash_c") | (at_ms, "restart_c") | (at_ms, "drop_p", p)
    # | (at_ms, "votes", member, votes) | (at_ms, "cut", [(a, b), ...])
    # | (at_ms, "reads_p", p) | (at_ms, "remove", member) | (at_ms, "add")
    script: tuple = ()

    @classmethod
    def quiet(cls, seed: int = 0, **kw) -> "Options":
        """No random faults: a base for scripted scenarios."""
        o = cls(seed=seed, members=3, priority0=[], clients=2, write_gap_ms=20, majority_p=0.5,
                drop_p=0.0, dup_p=0.0, delay_ms_max=5, spike_p=0.0, partition_p=0.0,
                crash_p=0.0, machine_crash_p=0.0, coordinator_crash_p=0.0, disk_ms_max=2,
                apply_batch_ops=50, hashes_per_round=1000, safety_ms=5_000)
        for k, v in kw.items():
            setattr(o, k, v)
        return o

    @classmethod
    def swarm(cls, seed: int) -> "Options":
        r = random.Random(seed * 7919 + 1)
        members = r.choice((3, 3, 5))
        pri0 = [members] if members == 5 and r.random() < 0.3 else []
        quiet = r.random() < 0.15  # some seeds run almost fault-free
        f = 0.2 if quiet else 1.0
        return cls(
            seed=seed, members=members, priority0=pri0, clients=r.randint(1, 3),
            write_gap_ms=r.choice((20, 50, 100)), majority_p=r.choice((0.3, 0.6, 0.9)),
            drop_p=round(f * r.choice((0.0, 0.01, 0.05, 0.1)), 4),
            dup_p=round(f * r.choice((0.0, 0.02, 0.05)), 4),
            delay_ms_max=r.choice((2, 10, 40, 150)),
            spike_p=round(f * r.choice((0.0, 0.01, 0.03)), 4),
            partition_p=round(f * r.choice((0.0, 0.02, 0.04, 0.08)), 4),
            crash_p=round(f * r.choice((0.0, 0.002, 0.005, 0.01)), 4),
            machine_crash_p=r.choice((0.0, 0.5, 1.0)),
            coordinator_crash_p=round(f * r.choice((0.0, 0.005, 0.02)), 4),
            disk_ms_max=r.choice((1, 5, 20)), apply_batch_ops=r.choice((1, 3, 50)),
            hashes_per_round=r.choice((2, 5, 1000)), safety_ms=r.choice((4_000, 6_000, 8_000)),
            heartbeat_interval_ms=r.choice((50, 100, 200)),
            heartbeat_timeout_ms=r.choice((300, 600, 1000)), pull_wait_ms=r.choice((100, 500)),
            reconfig_p=random.Random(seed * 104729 + 3).choice((0.0, 0.0, 0.01, 0.03)),
            reads_p=random.Random(seed * 15485863 + 5).choice((0.0, 0.0, 0.1, 0.3)),
            fsync_fail_p=random.Random(seed * 32452843 + 9).choice((0.0, 0.0, 0.0, 0.01)),
            clock_jump_p=random.Random(seed * 49979687 + 13).choice((0.0, 0.0, 0.005, 0.02)),
            disk_full_p=random.Random(seed * 86028121 + 17).choice((0.0, 0.0, 0.005, 0.02)),
            zombie_p=random.Random(seed * 15487469 + 19).choice((0.0, 0.0, 0.003, 0.01)),
            replay_entries_min=random.Random(seed * 67867967 + 23).choice((10_000,) * 3 + (3,)),
            bank_p=random.Random(seed * 98764321 + 29).choice((0.0, 0.0, 0.1, 0.3)),
            abandon_p=random.Random(seed * 32452867 + 31).choice((0.0, 0.0, 0.05, 0.2)),
            membership_p=random.Random(seed * 49979693 + 37).choice((0.0, 0.0, 0.02, 0.1)))


# Named scenarios (TigerBeetle's replica_test style): a quiet cluster and a
# script of faults. ``python -m tests.sim --scenario NAME``.
_HB = Options.__dataclass_fields__["heartbeat_interval_ms"].default  # quiet()'s interval


SCENARIOS = {
    # the coordinator restarts while the primary (m1, the most advanced) is healthy
    "coordinator_restart": lambda: Options.quiet(script=((2_000, "crash_c"),
                                                         (2_100, "restart_c"))),
    # the primary's process dies and is back before heartbeat_timeout_ms
    "primary_quick_restart": lambda: Options.quiet(script=((2_000, "crash", 1, False),
                                                           (2_300, "restart", 1))),
    # m1 is elected with term 1 but no member can pull from it, so it alone takes
    # w=1 writes from seq 1; then it is cut off from the coordinator too, the others
    # elect term 2 and write from seq 1; then it returns
    "isolated_first_primary": lambda: Options.quiet(
        majority_p=0.0, script=((0, "partition", [["m1"], ["m2", "m3"]]),
                                (1_500, "partition", [["m1"], ["m2", "m3", "c"]]),
                                (4_000, "heal"))),
    # isolated_first_primary over a lossy network with a slow common-point search:
    # some find_common call of m1's rollback is lost
    "lossy_rollback": lambda: Options.quiet(
        majority_p=0.0, hashes_per_round=2, safety_ms=10_000,
        script=((0, "partition", [["m1"], ["m2", "m3"]]),
                (1_500, "partition", [["m1"], ["m2", "m3", "c"]]),
                (4_000, "heal"), (4_000, "drop_p", 0.3))),
    # the primary (m1) loses the coordinator but not the secondaries, which learn
    # the new term from the coordinator while still pulling from m1
    "primary_cut_from_coordinator": lambda: Options.quiet(
        script=((2_000, "partition", [["m1"], ["c"]]), (4_000, "heal"))),
    # The coordinator sends become_primary(1) to m1 at the end of its first round
    # and dies before the answer; m1 is cut off from the others and the coordinator
    # (clients still reach it); the restarted coordinator has never heard of term 1
    # issue 19 scenario 1: m4 and m5 cannot pull (they lag) while majority writes
    # are acknowledged by m1-m3; m2 then m3 lose their votes and are killed, as
    # remove_member does, and the primary's machine crashes. The changes must
    # wait (and time out): else m4 and m5 elect one of them without the writes
    "reconfigure_while_lagging": lambda: Options.quiet(
        members=5, majority_p=1.0, safety_ms=9_000,
        script=((500, "partition", [["m4", "m5"], ["m1", "m2", "m3"]]),
                (2_000, "votes", 2, 0), (2_050, "votes", 3, 0),
                (5_500, "crash", 2, False), (5_500, "crash", 3, False),
                (5_600, "crash", 1, True), (5_700, "heal"))),
    # the same with members really removed and added (ReplicaSet.remove_member,
    # add_member): m2 and m3 are removed while m4 and m5 lag, the primary's
    # machine crashes, two new members are added, then the partition heals. The
    # removals must wait (once the primary crashed, nobody can tell what is
    # committed: they time out), else m4 and m5 elect one of them without the
    # writes; the new members vote only once caught up
    "remove_two_while_lagging": lambda: Options.quiet(
        members=5, majority_p=1.0, safety_ms=9_000,
        script=((500, "partition", [["m4", "m5"], ["m1", "m2", "m3"]]),
                (2_000, "remove", 2), (2_050, "remove", 3), (2_600, "crash", 1, True),
                (3_000, "add"), (3_050, "add"), (4_000, "heal"))),
    # the set grows from 3 to 5 members (m4 and m5 vote once caught up), then the
    # primary's process crashes and comes back at once, and is elected again
    # (the most advanced); then it and m2 are cut from the others. Restarted
    # with the votes it was created with ({m1, m2, m3}: Ray restarts an actor
    # with its creation's arguments), it would count m1 and m2 as a majority,
    # acknowledge w="majority" writes the others never had, and lose them when
    # m3, m4 and m5 elect one of them (the restart_with_creation_votes bug)
    "restart_after_growing": lambda: Options.quiet(
        majority_p=1.0, safety_ms=9_000,
        script=((300, "add"), (350, "add"), (2_000, "crash", 1, False), (2_050, "restart", 1),
                (3_500, "partition", [["m1", "m2"], ["m3", "m4", "m5", "c"]]),
                (6_000, "heal"))),
    # fsyncs fail now and then (issue 20): the member stops and restarts; with
    # the planted "fsync_retry" it carries on over lost pages instead
    "fsync_fails": lambda: Options.quiet(majority_p=0.7, fsync_fail_p=0.02, safety_ms=8_000),
    # Raft's figure 8 (the majority_of_old_terms bug). m1 (term 1) writes alone;
    # m2 is elected in term 2 with m3 cut from it, and writes alone; m1 is
    # elected in term 3 (m3 never primary) and copies its term-1 entries to m3,
    # while clients only read; m1's machine crashes and m2 is elected in term 4.
    # A majority read in term 3 must not have returned m1's term-1 entries
    "figure_eight": lambda: Options.quiet(
        majority_p=0.0, reads_p=0.0, priority0=[3], safety_ms=9_000,
        script=((0, "partition", [["m1"], ["m2", "m3"]]),
                (1_500, "partition", [["m1"], ["m2", "m3", "c"]]),
                (1_501, "cut", [("m2", "m3")]),
                (3_000, "reads_p", 1.0),
                (3_000, "partition", [["m2"], ["m1", "m3", "c"]]),
                (4_500, "crash", 1, True),
                (4_500, "partition", [["m1"], ["m2", "m3", "c"]]),
                (6_000, "restart", 1), (6_000, "heal"))),
    # the catch_up_outlives_adoption bug: m2 lags (cut from m1), m1 is lost by
    # the coordinator, which starts catching m2 up from m3 (most advanced, never
    # primary) while m2 cannot reach m3; m1 answers again and is adopted; m2
    # restarts meanwhile and must be told whom to follow
    "catch_up_then_adopt": lambda: Options.quiet(
        majority_p=0.0, priority0=[3], safety_ms=6_000,
        script=((500, "partition", [["m1"], ["m2"]]),
                (1_500, "cut", [("m1", "c"), ("m2", "m3")]),
                (2_600, "partition", [["m1"], ["m2"]]),
                (2_601, "cut", [("m2", "m3")]),
                (3_000, "crash", 2, False), (3_100, "restart", 2),
                (3_500, "heal"))),
    "coordinator_dies_mid_election": lambda: Options.quiet(
        script=((_HB + 1, "crash_c"),
                (_HB + 6, "partition", [["m1"], ["m2", "m3", "c"]]),
                (3 * _HB, "restart_c"))),
}


# --- scheduler: the only source of time and order ---------------------------
class Scheduler:
    def __init__(self, rng: random.Random):
        self.rng = rng
        self.now = 0
        self.events = 0
        self._heap: list = []
        self._seq = 0

    def at(self, delay_ms: int, fn: Callable, *args) -> None:
        # same-millisecond events run in a seeded random order (a tie-break
        # drawn from the RNG), like trio's shuffled scheduler made replayable
        self._seq += 1
        heapq.heappush(self._heap, (self.now + max(0, int(delay_ms)), self.rng.random(),
                                    self._seq, fn, args))

    def step(self) -> None:
        t, _, _, fn, args = heapq.heappop(self._heap)
        self.now = t
        self.events += 1
        if self.events > EVENTS_MAX:
            raise Violation(f"more than {EVENTS_MAX} events: a livelock?")
        fn(*args)


# --- network: drop, delay, duplicate, reorder, partition --------------------
class Network:
    def __init__(self, sim: "Sim"):
        self.sim = sim
        self.faults = True
        self.cut: set[tuple[str, str]] = set()  # (src, dst) links that deliver nothing

    def send(self, src: str, dst: str, deliver: Callable[[], None], what: str) -> None:
        o, rng = self.sim.opts, self.sim.rng
        if self.faults and rng.random() < o.drop_p:
            self.sim.trace(src, f"drop {what} -> {dst}")
            return
        copies = 2 if self.faults and rng.random() < o.dup_p else 1
        for _ in range(copies):
            d = rng.randint(1, o.delay_ms_max) if self.faults else rng.randint(1, 2)
            if self.faults and rng.random() < o.spike_p:
                d += rng.randint(1, 10 * o.delay_ms_max)
            self.sim.sched.at(d, self._arrive, src, dst, deliver)

    def _arrive(self, src: str, dst: str, deliver: Callable[[], None]) -> None:
        # a partition also cuts messages already in flight
        if (src, dst) in self.cut:
            return
        deliver()

    def partition(self, groups: list[list[str]], one_way: bool) -> None:
        self.cut = set()
        for i, a in enumerate(groups):
            for j, b in enumerate(groups):
                if i == j or (one_way and i > j):
                    continue
                for x in a:
                    for y in b:
                        self.cut.add((x, y))

    def heal(self) -> None:
        self.cut = set()


# --- RPC over the network ----------------------------------------------------
class Rpc:
    """Request/reply with a timeout. A request reaches the incarnation of the
    destination that was running when it was sent (a call to a restarted Ray
    actor fails); a reply reaches only the incarnation that asked."""

    def __init__(self, sim: "Sim"):
        self.sim = sim
        self._ids = 0
        self.pending: dict[int, tuple] = {}

    def call(self, src: str, dst: str, method: str, args: tuple,
             on_reply: Callable, timeout_ms: int, on_timeout: Callable | None = None) -> None:
        sim = self.sim
        self._ids += 1
        rid = self._ids
        self.pending[rid] = (src, sim.epoch(src), on_reply, on_timeout)
        dst_epoch = sim.epoch(dst)
        sim.net.send(src, dst, lambda: self._serve(src, dst, dst_epoch, rid, method, args),
                     f"{method}#{rid}")
        sim.sched.at(timeout_ms, self._timeout, rid)

    def _serve(self, src, dst, dst_epoch, rid, method, args) -> None:
        sim = self.sim
        node = sim.node(dst)
        if node is None or sim.epoch(dst) != dst_epoch or \
                (dst in sim.zombies and not src.startswith("k")):
            # (a zombie: Ray routes calls to its new process; only the old
            # process's open client connections still reach it)
            # Ray knows the actor died: the caller gets an error, not silence
            sim.net.send(dst, src, lambda: self._reply(rid, None, ActorUnavailable(dst)),
                         f"err:{method}#{rid}")
            return

        def respond(result=None, err=None):
            if sim.node(dst) is not node:
                return  # crashed before it could answer
            sim.net.send(dst, src, lambda: self._reply(rid, result, err), f"re:{method}#{rid}")
        try:
            getattr(node, "on_" + method)(respond, *args)
        except (errors.DiskFailed, errors.DiskFull) as e:  # the Ray call raises it
            respond(err=e)

    def _reply(self, rid, result, err) -> None:
        p = self.pending.pop(rid, None)
        if p is None:
            return  # a duplicate, or it timed out already
        src, ep, on_reply, _ = p
        if self.sim.node(src) is None or self.sim.epoch(src) != ep:
            return
        on_reply(result, err)

    def _timeout(self, rid) -> None:
        p = self.pending.pop(rid, None)
        if p is None:
            return
        src, ep, _, on_timeout = p
        if on_timeout is not None and self.sim.node(src) is not None and \
                self.sim.epoch(src) == ep:
            on_timeout()
