"""Deterministic simulation of a raymx replica set: the pure cores, no Ray.

One integer seed decides everything: the cluster's shape, the workload, every
message's delay, drop and duplication, partitions, crashes and restarts, even
the order of events that fall on the same millisecond. A failing seed replays
exactly::

    python -m tests.sim --seed 17             # replay one seed, print its trace on failure
    python -m tests.sim --seed 17 --trace     # print every event as it happens
    python -m tests.sim --seeds 0:300         # a sweep
    python -m tests.sim --seed 3 --broken ack_before_durable   # a planted bug
    python -m tests.sim --scenario coordinator_dies_mid_election   # a scripted scenario
    python -m tests.sim --bugs                # the protocol bugs it found

What runs here is the shipped code of the protocol cores
(``raymx/actors/core/``): ``MemberCore`` (terms, roles, configuration),
``ProducerCore`` (when to pull, what an answer means), ``FeederCore`` (the
pull's fencing, which reported positions count, the majority point),
``WriteConcernCore`` (acknowledgements, deposed waiters), ``deposed`` and
``sees_majority``, ``ElectionCore`` (elections with their fence, calls,
configuration changes), ``GTIDManager``, the batch checks, the applier and
rollback, over ``Engine`` on a ``MemoryStore``. What is simulated is what the
Ray shells own: processes, threads, timers, Ray calls and the disk.
``SimMember`` runs the shipped ``ShardService`` (the primary's write path:
its writer's turn, write groups, group commit, write-concern waiters) with
timers for its threads, and carries out, as events, what ``OplogShard``,
``FeederService``, ``Producer`` and ``Applier`` carry out with threads;
``SimCoordinator`` the coordinator's heartbeat loop. Where a shell blocks a
thread (a pull's long poll, a write waiting for its write concern,
``become_primary`` waiting for the producer's batch), the simulated member
keeps the waiting call as state and answers it later.

A run has two phases (TigerBeetle's VOPR):

* **safety**: clients write (``w=1`` and ``w="majority"``) and read the
  counter document (read concern ``"majority"`` from any member,
  ``"linearizable"`` from the primary) while the network drops, delays,
  duplicates and reorders messages and partitions nodes, members and the
  coordinator crash and restart (a machine crash loses what was not synced;
  a process crash keeps it), and the coordinator is asked to give or take
  votes (configuration changes under the shipped rules of
  ``check_config_change``/``config_change_blockers``). Invariants are checked
  after every event: at most one member commits under each term; no
  majority-acknowledged write, and no entry a majority or linearizable read
  returned data as of, is rolled back; every running member's oplog is dense
  and hash-chained (its new entries after every event that wrote any; the
  whole oplog at every restart, after a rollback and at the end). At the end
  every such read's point is in the final history and the value it returned
  is the final history's value there.
* **liveness**: faults stop, the network heals, everyone restarts; the set
  must elect a primary, take a ``w="majority"`` probe write, and converge:
  identical oplogs (GTIDs and hashes), nothing unapplied, identical
  collections, every majority-acknowledged write present with its hash, and
  the collections equal to a naive replay of the oplog's images.

Known protocol bugs (``KNOWN_BUGS``, ``--bugs``): the bugs the simulation
found, all fixed in the cores above. ``--regress NAME`` puts one back into
the shipped core for a run (a monkeypatch of the function the shells call
too); tests/test_simulation.py shows each is caught again that way.

Determinism traps avoided: one ``random.Random(seed)``; no wall clock (the
engine gets ``now_ms`` from the scheduler); no ``hash()`` of strings; dicts
are iterated in insertion order or sorted; sets are used for membership only;
every document has an explicit ``_id`` (the engine's ``new_id`` reads the wall
clock).
"""
from __future__ import annotations

import argparse
import hashlib
import heapq
import logging
import random
import sys
import time
import traceback
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Callable

from raymx import errors
from raymx.actors.core import replication as rep
from raymx.actors.core.election import (Action, ElectionCore, change_blockers,
                                        check_config_change)
from raymx.actors.core import producer as pc
from raymx.actors.core.member import MemberCore
from raymx.actors.core.primary import WriteConcernCore, deposed
from raymx.actors.shard import ShardService
from raymx.storage import codec, oplog
from raymx.storage.engine import Engine
from raymx.storage.gtid import GTID, ZERO
from raymx.storage.limits import Limits
from raymx.storage.store import MemoryStore

BROKEN = ("ack_before_durable", "reuse_term", "unsafe_reconfig", "dirty_reads", "fsync_retry")


# --- the protocol bugs the simulation found, as regressions of the shipped cores
def _old_too_stale_by_term() -> list:
    orig = rep.FeederCore.pull

    def pull(self, after, after_h, max_entries, max_bytes):
        out = orig(self, after, after_h, max_entries, max_bytes)
        if out["status"] == "diverged" and after is not None:
            with self.e.store.read() as t:
                first = t.first("oplog")
            if first is not None and GTID(*after) < GTID.from_bytes(first[0]):
                return {"status": "too_stale", "first": list(GTID.from_bytes(first[0]))}
        return out
    return [(rep.FeederCore, "pull", pull)]


def _old_stale_write_concern() -> list:
    orig = WriteConcernCore.sweep
    return [(WriteConcernCore, "sweep",
             lambda self, now_ms, term, primary: orig(self, now_ms, 0, True)),
            (WriteConcernCore, "step_down", lambda self, member: [])]


def _old_election_not_fenced() -> list:
    return [(ElectionCore, "fence", lambda self, a: []),
            (ElectionCore, "fenced", lambda self, a, answers, now_ms: a.member)]


def _old_deposed_role_stuck() -> list:
    return [(MemberCore, "is_primary", lambda self, serving: serving),
            (MemberCore, "heartbeat", lambda self, term, serving, lead_term:
             self.learn_term(term, serving, lead_term))]


def _old_stale_sync_source() -> list:
    return [(pc.ProducerCore, "current", lambda self: True)]


def _old_majority_of_old_terms() -> list:
    from raymx.actors.core import primary
    orig = MemberCore.became_primary

    def old(point, term):
        return point  # any point durable on a majority
    return [(rep, "committed", old), (primary, "committed", old),
            (MemberCore, "became_primary", lambda self, last: orig(self, last) and False)]


def _old_catch_up_outlives_adoption() -> list:
    orig = ElectionCore._adopt

    def _adopt(self):
        was = self.catching_up
        orig(self)
        self.catching_up = was  # kept: no member was told to follow again
    return [(ElectionCore, "_adopt", _adopt)]


def _old_producer_thread_dies() -> list:
    orig = pc.ProducerCore.on_failure

    def on_failure(self, what):
        if "find_common" in what:
            raise RuntimeError(what)  # was outside the loop's try: the thread ended
        return orig(self, what)
    return [(pc.ProducerCore, "on_failure", on_failure)]


@dataclass(frozen=True)
class KnownBug:
    """A protocol bug the simulation found, fixed in the shipped cores.
    ``old()`` returns the monkeypatches that put the old behaviour back into
    the code path the shells and the simulation both run (``--regress NAME``);
    tests/test_simulation.py shows that the sweep catches it then."""

    name: str
    where: str
    what: str
    fix: str
    old: Callable[[], list]
    symptoms: tuple         # what the failure message says when it bites (any of)
    repro: tuple            # scenario names and/or seeds that fail with it put back
    also: tuple = ()        # other bugs it needs back to show (they would mask it)


KNOWN_BUGS = {b.name: b for b in (
    KnownBug("too_stale_by_term", "raymx/actors/core/replication.py FeederCore.pull",
             "'after < first' compared GTIDs, term first: a member whose last entry is "
             "(1, 1) pulling from a source whose oplog starts at (2, 1) (another branch "
             "from seq 1) was told too_stale, not diverged, and marked itself needs_resync "
             "forever although nothing was trimmed",
             "compare seqs: too_stale only if after.seq < first.seq (seqs are dense "
             "across terms); otherwise answer diverged", _old_too_stale_by_term,
             ("resync=sync source trimmed past",), ("isolated_first_primary",)),
    KnownBug("stale_write_concern", "raymx/actors/core/primary.py WriteConcernCore",
             "write-concern waiters survived step-down and a newer term: a deposed primary "
             "rolled its write back and still acknowledged it w='majority' later, when "
             "members reported durable positions >= g (from their old copy or another "
             "branch)",
             "fail every waiting write with NotPrimary ('outcome unknown') on step-down "
             "and whenever the member's term passes the write's term; reset the positions",
             _old_stale_write_concern,
             ("majority-acknowledged write", "majority-committed point"), (138,),
             ("election_not_fenced", "stale_sync_source")),
    KnownBug("election_not_fenced", "raymx/actors/core/election.py ElectionCore.fence/fenced",
             "an election read each member's last GTID and term from heartbeat replies "
             "sent up to a round earlier, and the new term was durable only on the winner "
             "before it took writes: a restarted coordinator could hand the same term to a "
             "second member (two primaries in one term), and the old primary kept getting "
             "w='majority' acknowledgements from members that did not know the new term",
             "fence first, as Raft's vote does: send the new term to every member that "
             "answers, wait for their last GTID as of after recording it, and choose the "
             "winner among those answers only; never reuse a term once sent",
             _old_election_not_fenced,
             ("two primaries accepted writes", "majority-acknowledged write"),
             ("coordinator_dies_mid_election",)),
    KnownBug("deposed_role_stuck", "raymx/actors/core/member.py MemberCore.is_primary/heartbeat",
             "a primary that learned a higher term through a pull had its write side "
             "(ShardService.primary) cleared by its next commit, but its role stayed "
             "'primary'; step_down/follow/_learn_term acted only on the write side's flag, "
             "so the member never stepped down and never converged",
             "decide on the role, not the write side's flag, and step down a member whose "
             "role is primary while its write side is deposed, at every heartbeat",
             _old_deposed_role_stuck, ("role=primary shard_primary=False",),
             (142,), ("stale_sync_source",)),
    KnownBug("stale_sync_source", "raymx/actors/core/producer.py ProducerCore.current",
             "after a member learned a new term, its producer kept pulling from the sync "
             "source it was given for the old term and accepted the entries: the old "
             "primary's branch became 'majority durable' while the new primary lacked it",
             "a producer pulls, and takes entries, only while its follow() term is the "
             "member's term (Raft: entries only from the leader of your current term)",
             _old_stale_sync_source,
             ("majority-acknowledged write", "majority-committed point"), (138,),
             ("election_not_fenced", "stale_write_concern")),
    KnownBug("producer_thread_dies", "raymx/actors/core/producer.py ProducerCore.on_failure "
             "+ raymx/actors/member.py Producer._run",
             "a find_common call that failed or timed out (the source crashed or was cut "
             "off mid-rollback) raised out of the producer's step and ended its thread; "
             "the member never replicated again",
             "every failed step goes through ProducerCore.on_failure: wait, pull again",
             _old_producer_thread_dies, ("producer_dead=True",), (13,)),
    KnownBug("majority_of_old_terms", "raymx/actors/core/replication.py committed "
             "(WriteConcernCore.majority_point, FeederCore.majority)",
             "a primary called majority-committed any entry durable on a majority, "
             "entries of earlier terms included (Raft's figure 8): a member that never "
             "held such an entry won the next election and rolled it back, after a "
             "majority read had returned it",
             "a primary's majority point is only ever an entry of its own term; a new "
             "primary writes a no-op at once so the point moves with no client write",
             _old_majority_of_old_terms, ("majority-committed point", "majority read"),
             (2697,)),
    KnownBug("catch_up_outlives_adoption", "raymx/actors/core/election.py ElectionCore._adopt",
             "the coordinator started catching an eligible member up for an election, then "
             "adopted the old primary when it answered again; the catch-up mark stayed "
             "set, and while it is set no member is told to follow: a member that had "
             "restarted meanwhile never replicated again",
             "adopting a primary ends any catch-up",
             _old_catch_up_outlives_adoption, ("no convergence",), (2456,)),
)}


def _planted_ack_before_durable() -> list:
    def _answer_when(self, g, out, req, reply):
        reply(ok=out)  # acknowledged before it is durable anywhere
        return False
    return [(ShardService, "_answer_when", _answer_when)]


# planted bugs that live in shipped code: patched in for the run, as known bugs are
PLANTED = {"ack_before_durable": _planted_ack_before_durable}


class regressed:
    """Put known bugs back into the shipped cores for a run (``--regress``),
    and a planted bug that lives in shipped code (``PLANTED``)."""

    def __init__(self, names=(), broken: str | None = None):
        unknown = [n for n in names if n not in KNOWN_BUGS]
        if unknown:
            raise ValueError(f"unknown bugs {unknown} (known: {', '.join(KNOWN_BUGS)})")
        self.names = tuple(n for n in KNOWN_BUGS if n in names)
        self._patches = [KNOWN_BUGS[n].old for n in self.names] + \
            ([PLANTED[broken]] if broken in PLANTED else [])
        self._saved: list = []

    def __enter__(self):
        for old in self._patches:
            for obj, attr, fn in old():
                self._saved.append((obj, attr, obj.__dict__[attr]))
                setattr(obj, attr, fn)
        return self

    def __exit__(self, *exc):
        for obj, attr, fn in reversed(self._saved):
            setattr(obj, attr, fn)
        self._saved.clear()


# Simulated timeouts of the shells' blocking calls (the real ones are 10-30 s;
# shorter here so a lost message costs seconds of simulated time, not minutes).
PULL_TIMEOUT_MS = 2_000
CONTROL_TIMEOUT_MS = 1_000
ELECT_TIMEOUT_MS = 2_000
RECONFIG_TIMEOUT_MS = 3_000
CLIENT_TIMEOUT_MS = 3_000
WTIMEOUT_MS = 2_000
# The liveness phase must converge within this much simulated time.
CONVERGE_MS_MAX = 60_000
EVENTS_MAX = 2_000_000


class Violation(Exception):
    """An invariant does not hold: the run failed."""


class ActorUnavailable(Exception):
    """Ray's answer to a call whose actor died or is restarting (ActorUnavailableError)."""


def reproduce_line(seed: int, broken: str | None = None, regress=(),
                   scenario: str | None = None) -> str:
    """The command that replays a run exactly."""
    out = "python -m tests.sim " + (f"--scenario {scenario}" if scenario else f"--seed {seed}")
    if broken:
        out += f" --broken {broken}"
    for n in regress:
        out += f" --regress {n}"
    return out


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
    # scripted faults (scenarios): (at_ms, "partition", groups) | (at_ms, "heal")
    # | (at_ms, "crash", member, machine) | (at_ms, "restart", member)
    # | (at_ms, "crash_c") | (at_ms, "restart_c") | (at_ms, "drop_p", p)
    # | (at_ms, "votes", member, votes)
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
            disk_full_p=random.Random(seed * 86028121 + 17).choice((0.0, 0.0, 0.005, 0.02)))


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
    # fsyncs fail now and then (issue 20): the member stops and restarts; with
    # the planted "fsync_retry" it carries on over lost pages instead
    "fsync_fails": lambda: Options.quiet(majority_p=0.7, fsync_fail_p=0.02, safety_ms=8_000),
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
        if node is None or sim.epoch(dst) != dst_epoch:
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
        cfg = self.engine.get_meta("rs_config") or {"version": 0, "members": sim.specs}
        self.svc = ShardService(self.engine, sim.limits, primary=False, on_commit=self._committed,
                                on_durable=self._on_durable, member_id=mid,
                                votes={s["id"]: s.get("votes", 1) for s in cfg["members"]},
                                on_fatal=self._fatal, timer=self._svc_timer, clock_ms=self.now)
        self._hashes: dict[GTID, int] = {}  # each commit's hash, for the checker
        # Feeder
        self.feeder = rep.FeederCore(self.engine, sim.limits)
        self.feeder.votes = dict(self.votes)
        self.feeder.upstream_majority = self.majority_known
        self.feeder_waiting: list = []
        self.feeder_primary = False  # FeederService.primary
        self._feeder_reset()
        # Producer: starts paused; the coordinator says whom to follow
        self.producer = pc.ProducerCore(self.engine, mid, sim.limits)
        self.p_inflight = False      # a pull or find_common is out
        self.p_locked = False        # the producer's write lock (batch or rollback)
        self.p_dead = False          # an exception ended the producer's thread
        self._p_queued = False
        self.rollbacks: list = []
        # Applier
        self.apply_limits = sim.limits.with_(apply_batch_ops=sim.opts.apply_batch_ops)
        self.apply_held = False
        self._apply_queued = False
        self._kick_applier()

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
        respond(self.core.reply(self.gm.term))

    def on_set_config(self, respond, config: dict) -> None:
        if self.core.set_config(config, self.primary):
            self.svc.set_votes({s["id"]: s.get("votes", 1) for s in config["members"]})
            self.feeder.votes = dict(self.votes)  # FeederService.set_votes
            self.svc.wc.tick()
        respond(None)

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
        self.producer.paused = True  # producer.pause(wait=True): no new batch after this
        if self.p_locked:
            # a batch or a rollback holds the producer's write lock: wait for it
            self.later(5, self._become_primary, done, term)
            return
        # applying the backlog takes a while; heartbeats and pulls go on meanwhile
        self.later(self.sim.rng.randint(0, 30), self._become_primary_2, done, term)

    def _become_primary_2(self, done, term: int) -> None:
        try:
            self._become_primary_3(done, term)
        except errors.DiskFull as e:  # OplogShard.become_primary raises it to the caller
            done(err=e)

    def _become_primary_3(self, done, term: int) -> None:
        while rep.min_unapplied(self.engine) is not None:
            rep.apply_batch(self.engine, self.limits, self.now())
        try:
            self.engine.set_term(term)  # durable before the first write under it
        except errors.StaleTerm as e:
            self.trace(f"become_primary term={term} refused: {e}")
            return done(err=e)
        self._feeder_reset(primary=True)  # feeder.set_primary(True)
        try:
            self.svc.become_primary(term)
        except errors.DiskFailed as e:  # its sync failed: OplogShard stops the process
            return self._fatal(e)
        last, _ = self.engine.last()
        noop = self.core.became_primary(last)
        self._on_durable()
        self.sim.checker.on_elected(self, term)
        self.trace(f"primary term={term} last={last}")
        if noop:
            try:
                self._own_noop()
            except errors.RaymxError as e:  # the shell queues it and does not wait
                self.trace(f"no-op of term {term} refused: {e}")
        done({"term": term, "last": list(last)})

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
    def on_write(self, respond, req: dict) -> None:
        """ShardService.handle, then the writer's turn (its thread's loop body)."""
        def reply(ok=None, err=None):
            if err is not None:
                return respond(err=err)
            if req.get("w", 1) not in (0, 1, None) and ok.get("gtid"):
                g = GTID(*ok["gtid"])
                self.sim.checker.on_majority_ack(self, g, self._hashes[g])
            respond(ok)
        self.svc.handle(req, reply, {})
        self.svc.run_queued()
        self.oplog_dirty = True

    def _committed(self, g: GTID) -> None:
        """ShardService's on_commit: ``g`` is in the oplog (not yet durable)."""
        with self.engine.store.read() as t:
            h = codec.unpack(t.get("oplog", g.to_bytes()), "oplog entry")["h"]
        self._hashes[g] = h
        self.trace(f"commit {g}")
        self.sim.checker.on_commit(self, g, h)

    def _own_noop(self) -> GTID:
        """ShardService._own_noop (run here, not queued: this is the writer's turn)."""
        g = self.svc._own_noop()
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
        if not self.primary:
            return
        rp = self.gm.replicatable()
        self.feeder_on_limit(GTID(rp.term, rp.seq - 1) if rp.seq > 1 else ZERO)

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
            g = self._own_noop()
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

    # -- Producer: Producer._run over ProducerCore ------------------------------
    def _kick_producer(self, delay_ms: int = 0) -> None:
        if not self._p_queued:
            self._p_queued = True
            self.later(delay_ms, self._producer_step, self._producer_iter)

    def _producer_step(self, fn: Callable, *args) -> None:
        """One step of the producer's thread: an exception that escapes it
        ends the thread (the shell's loop catches the pull's and the step's
        failures and asks ``ProducerCore.on_failure``; nothing else)."""
        if self.p_dead:
            return
        try:
            fn(*args)
        except (Violation, AssertionError):
            raise
        except errors.DiskFailed as e:  # Producer._run: the process stops
            self._fatal(e)
        except errors.DiskFull as e:  # Producer._run: a failed step, tried again
            self.p_locked = self.p_inflight = False
            self._kick_producer(self.producer.on_failure(f"DiskFull: {e}"))
        except Exception as e:
            self.trace(f"producer thread dies: {type(e).__name__}: {e}")
            self.p_dead = True
            self.p_locked = self.p_inflight = False

    def _producer_iter(self) -> None:
        self._p_queued = False
        pcore = self.producer
        if self.p_inflight or self.p_locked or pcore.blocked():
            return  # follow() kicks it again
        src = pcore.source
        req, last, last_h = pcore.request(self.feeder_positions())
        self.p_inflight = True

        def on_reply(out, err):
            self.p_inflight = False
            if err is not None:
                return self._kick_producer(pcore.on_failure(f"pull from m{src}: {err}"))
            if pcore.paused:
                return  # paused while pulling: write nothing more
            self._handle(out, src, last, last_h)

        def on_timeout():
            self.p_inflight = False
            self._kick_producer(pcore.on_failure(f"pull from m{src} timed out"))
        self.sim.rpc.call(self.name, f"m{src}", "pull", (req,),
                          lambda out, err: self._producer_step(on_reply, out, err),
                          PULL_TIMEOUT_MS, lambda: self._producer_step(on_timeout))

    def _handle(self, out: dict, src: int, last: GTID, last_h: int) -> None:
        step, learned = self.producer.on_answer(out, last)
        if learned is not None:  # by doorbell to OplogShard._note_majority
            self.svc.note_majority(learned)
            fm = self.feeder.upstream_majority  # FeederService.on_majority
            if fm is None or learned > fm:
                self.feeder.upstream_majority = learned
        self.core.on_sync_state(self.producer.state)  # Notifier "on_sync_state"
        if step == pc.ROLLBACK:
            return self._roll_back(src)
        if step == pc.RETRY:
            return self._kick_producer(pc.RETRY_MS)
        if step == pc.IDLE:
            return self._kick_producer()
        try:
            g, _ = self.producer.write(out, last, last_h)
            self.oplog_dirty = True
        except errors.RaymxError as e:
            self.trace(f"batch refused: {e}")
            return self._kick_producer(pc.BATCH_REFUSED_MS)
        # the sync takes a while: a crash before it loses the batch (not yet reported)
        self.p_locked = True
        self.later(self.sim.rng.randint(0, self.sim.opts.disk_ms_max), self._batch_synced, g)

    def _batch_synced(self, g: GTID) -> None:
        try:
            self.engine.sync()  # durable before the next pull reports it upstream
        except errors.DiskFailed as e:  # the Producer shell stops the process
            return self._fatal(e)
        self.p_locked = False
        self._kick_applier()
        self.feeder_on_limit(g)
        self._kick_producer()

    def _roll_back(self, src: int) -> None:
        self.p_locked = True
        self._rb_round(src, None)

    def _rb_round(self, src: int, before: GTID | None) -> None:
        cands = rep.own_hashes(self.engine, before, self.sim.opts.hashes_per_round)
        if not cands:
            return self._rb_finish(src, ZERO)
        self.p_inflight = True

        def on_reply(g, err):
            self.p_inflight = False
            if err is not None:
                return self._rb_abort(src)
            if g is None:
                return self._rb_round(src, GTID(*cands[-1][0]))
            self._rb_finish(src, GTID(*g))

        def on_timeout():
            self.p_inflight = False
            self._rb_abort(src)
        self.sim.rpc.call(self.name, f"m{src}", "find_common", (cands,),
                          lambda g, err: self._producer_step(on_reply, g, err),
                          PULL_TIMEOUT_MS, lambda: self._producer_step(on_timeout))

    def _rb_abort(self, src: int) -> None:
        self.p_locked = False
        delay = self.producer.on_failure(f"find_common with m{src} failed")
        self.trace(f"rollback: find_common with m{src} failed, retrying")
        self._kick_producer(delay)

    def _rb_finish(self, src: int, common: GTID) -> None:
        undone = [(g, e["h"]) for g, e in self.engine.read_oplog(after=common)]
        self.sim.checker.on_rollback(self, src, common, undone)
        self.apply_held = True
        try:
            n = rep.rollback_to(self.engine, common, self.limits.rollback_ops_max,
                                lambda records: self.rollbacks.append((common, records)))
            self.engine.sync()
            self.trace(f"rolled back {n} entries to {common} (source m{src})")
        except errors.IrreversibleOp as e:
            self.engine.put_meta("needs_resync", str(e))
            self.producer.state = "resync"
            self.core.on_sync_state("resync")
            self.trace(f"cannot roll back: {e}")
        finally:
            self.apply_held = False
            self.oplog_dirty = True
        self._feeder_reset()  # feeder.truncated()
        self.p_locked = False
        self._kick_applier()
        self._kick_producer()

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
            n, _, _ = rep.apply_batch(self.engine, self.apply_limits, self.now())
        except errors.DiskFull:  # Applier._run: logged, tried again in a second
            self._apply_queued = True
            return self.later(1000, self._apply)
        if n:
            self._kick_applier()


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
        self.changing = False
        self.queued: deque = deque()
        self.inbox: dict[int, list] = {}
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
        for mid in self.sim.member_ids:
            self.sim.rpc.call(self.name, f"m{mid}", "heartbeat", (self.core.term, alive),
                              lambda r, err, mid=mid: self.inbox.setdefault(mid, []).append(
                                  err if err is not None else r),
                              10 * self.sim.limits.heartbeat_interval_ms)
        self.later(self.sim.limits.heartbeat_interval_ms, self._round_end)

    def _round_end(self) -> None:
        now = self.sim.sched.now
        for mid in self.sim.member_ids:
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
        actions = self.core.tick(now)
        for v in self.core.members.values():  # Coordinator._push_to
            if v.alive and v.config_version < self.version:
                self._push(v.id)
        if had is not None and self.core.primary is None:
            self.sim.trace(self.name, f"primary m{had} failed")
        if self.sim.broken == "reuse_term":
            for a in actions:
                if a.kind == "elect" and a.term > 1:
                    a.term -= 1  # planted bug: elect without a new term
        self._act(actions)

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
        self.sim.trace(self.name, f"fence term={term} -> {targets}")

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
        """An operator gives or takes a member's vote; waits like the actor's
        ``change`` (every heartbeat interval, up to RECONFIG_TIMEOUT_MS)."""
        if self.changing:  # one at a time, each after the one before
            self.queued.append((member, votes))
            return self.sim.trace(self.name, f"votes m{member}={votes} queued")
        new = [dict(m, votes=votes) if m["id"] == member else dict(m) for m in self.config]
        try:
            voters_change = check_config_change(self.config, new)
        except errors.ConfigError as e:
            return self.sim.trace(self.name, f"votes m{member}={votes} refused: {e}")
        self.changing = True
        self.sim.trace(self.name, f"votes m{member}={votes} asked")
        self._try_change(new, voters_change and self.sim.broken != "unsafe_reconfig",
                         self.sim.sched.now + RECONFIG_TIMEOUT_MS, {})

    def _try_change(self, new: list, voters_change: bool, deadline: int, start: dict) -> None:
        if not voters_change:
            return self._install(new)

        def decide(st):
            why = change_blockers(self.core, self.version, self.config, new, start, st)
            if not why:
                return self._install(new)
            if self.sim.sched.now >= deadline:
                self.sim.trace(self.name, f"change refused: {'; '.join(why)}")
                return self._next_change()
            self.later(self.sim.limits.heartbeat_interval_ms, self._try_change, new,
                       voters_change, deadline, start)
        prim = self.core.primary
        if prim is None:
            return decide(None)
        self.sim.rpc.call(self.name, f"m{prim}", "commit_state", (),
                          lambda r, err: decide(None if err is not None else r),
                          CONTROL_TIMEOUT_MS, lambda: decide(None))

    def _install(self, new: list) -> None:
        self.version += 1
        self.config = new
        self.core.reconfigure(new)
        self.sim.trace(self.name, f"config {self.version}: voters "
                       f"{[m['id'] for m in new if m.get('votes', 1)]}")
        for m in self.sim.member_ids:
            self._push(m)
        self._next_change()

    def _next_change(self) -> None:
        self.changing = False
        if self.queued:
            self.set_votes(*self.queued.popleft())

    def _push(self, mid: int) -> None:
        self.sim.rpc.call(self.name, f"m{mid}", "set_config",
                          ({"version": self.version, "members": self.config},),
                          lambda r, err: None, CONTROL_TIMEOUT_MS)


# --- clients ------------------------------------------------------------------
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

    def _next_target(self) -> None:
        ids = self.sim.member_ids
        self.target = ids[(ids.index(self.target) + 1) % len(ids)]

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
        docs: dict[str, dict] = {"db.c": {}, "db.k": {}}
        for _, e in m.engine.read_oplog():
            for op in e["ops"]:
                if op["op"] in ("i", "u"):
                    docs[op["ns"]][op["post"]["_id"]] = op["post"]
                elif op["op"] == "d":
                    docs[op["ns"]].pop(op["pre"]["_id"], None)
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


# --- the cluster ----------------------------------------------------------------
@dataclass
class Result:
    seed: int
    ok: bool
    message: str = ""
    broken: str | None = None
    regress: tuple = ()
    scenario: str | None = None
    events: int = 0
    sim_ms: int = 0
    stats: dict = field(default_factory=dict)
    trace_tail: list = field(default_factory=list)
    options: dict = field(default_factory=dict)
    digest: str = ""

    @property
    def reproduce(self) -> str:
        return reproduce_line(self.seed, self.broken, self.regress, self.scenario)

    def report(self) -> str:
        lines = [f"SEED={self.seed}" + (f" SCENARIO={self.scenario}" if self.scenario else "")
                 + (f" BROKEN={self.broken}" if self.broken else "")
                 + "".join(f" REGRESS={n}" for n in self.regress),
                 "options: " + " ".join(f"{k}={v}" for k, v in self.options.items()),
                 f"{'ok' if self.ok else 'FAILED'} after {self.events} events, "
                 f"{self.sim_ms} simulated ms; " + " ".join(f"{k}={v}" for k, v in
                                                          self.stats.items()),
                 f"trace digest {self.digest} (a replay prints the same)"]
        if not self.ok:
            lines += ["", self.message, "", "last events:"] + self.trace_tail + [
                "", f"reproduce: {self.reproduce}"]
        return "\n".join(lines)


class Sim:
    def __init__(self, seed: int = 0, broken: str | None = None, trace: bool = False,
                 regress=(), scenario: str | None = None):
        if broken is not None and broken not in BROKEN:
            raise ValueError(f"unknown broken variant {broken!r} (known: {', '.join(BROKEN)})")
        self.seed, self.broken, self.verbose = seed, broken, trace
        self.regress = regressed(regress).names  # the caller applies them (``run``)
        self.scenario = scenario
        if scenario is not None:
            if scenario not in SCENARIOS:
                raise ValueError(f"unknown scenario {scenario!r} (known: {', '.join(SCENARIOS)})")
            self.opts = SCENARIOS[scenario]()
            seed = self.seed = self.opts.seed
        else:
            self.opts = Options.swarm(seed)
        self.rng = random.Random(seed)
        self.read_rng = random.Random(seed * 31 + 7)  # reads' own draws (seeds without reads replay as before)
        self.disk_rng = random.Random(seed * 37 + 11)  # failed fsyncs' own draws
        self.clock_rng = random.Random(seed * 41 + 13)  # clock jumps' own draws
        self.full_rng = random.Random(seed * 43 + 17)  # full disks' own draws
        self.clock_offsets: dict[int, int] = {}  # member -> its clock minus simulated time
        self.sched = Scheduler(self.rng)
        o = self.opts
        self.limits = Limits().with_(heartbeat_interval_ms=o.heartbeat_interval_ms,
                                     heartbeat_timeout_ms=max(o.heartbeat_timeout_ms,
                                                              2 * o.heartbeat_interval_ms),
                                     pull_wait_ms=o.pull_wait_ms)
        self.net = Network(self)
        self.rpc = Rpc(self)
        self.checker = Checker(self)
        self.trail: deque = deque(maxlen=120)
        self._digest = hashlib.blake2b(digest_size=8)  # of every trace line: replays compare equal
        self.member_ids = list(range(1, self.opts.members + 1))
        self.specs = [{"id": m, "priority": 0 if m in self.opts.priority0 else 1}
                      for m in self.member_ids]
        self.stores = {m: MemoryStore(f"m{m}") for m in self.member_ids}
        self._nodes: dict[str, object] = {}
        self._epochs: dict[str, int] = {}
        self.crashes = 0
        for m in self.member_ids:
            self.start_member(m)
        self.start_coordinator()
        self.clients = [SimClient(self, k) for k in range(1, self.opts.clients + 1)]
        for item in self.opts.script:
            self.sched.at(item[0], self._scripted, item)

    def _scripted(self, item: tuple) -> None:
        if not self.net.faults:
            return  # the liveness phase has begun
        op = item[1]
        if op == "partition":
            self.net.partition(item[2], False)
            self.trace("net", f"partition {item[2]}")
        elif op == "heal":
            self.net.heal()
            self.trace("net", "heal")
        elif op == "crash":
            if f"m{item[2]}" in self._nodes:
                self.crash_member(item[2], item[3])
        elif op == "restart":
            self._restart_member(item[2])
        elif op == "drop_p":
            self.opts.drop_p = item[2]
            self.trace("net", f"drop_p={item[2]}")
        elif op == "crash_c":
            if "c" in self._nodes:
                self.crash_coordinator()
        elif op == "restart_c":
            self._restart_coordinator()
        elif op == "votes":
            if "c" in self._nodes:
                self._nodes["c"].set_votes(item[2], item[3])
        else:
            raise ValueError(f"unknown scripted fault {item!r}")

    # nodes and incarnations
    def node(self, name: str):
        if name.startswith("k"):
            return next((c for c in self.clients if c.name == name), None)
        return self._nodes.get(name)

    def epoch(self, name: str) -> int:
        return self._epochs.get(name, 0)

    def members(self) -> list[SimMember]:
        return [self._nodes[f"m{m}"] for m in self.member_ids if f"m{m}" in self._nodes]

    def start_member(self, m: int) -> None:
        name = f"m{m}"
        self._epochs[name] = self.epoch(name) + 1
        self._nodes[name] = SimMember(self, m, self.stores[m])
        self.checker.check_oplog(self._nodes[name])
        self.trace(name, f"start last={self._nodes[name].engine.last()[0]} "
                   f"term={self._nodes[name].engine.term}")

    def crash_member(self, m: int, machine: bool) -> None:
        name = f"m{m}"
        self._nodes.pop(name, None)
        self._epochs[name] = self.epoch(name) + 1
        if machine:
            self.stores[m].crash()
        self.crashes += 1
        self.trace(name, "crash (machine: unsynced writes lost)" if machine else
                   "crash (process)")

    def start_coordinator(self) -> None:
        self._epochs["c"] = self.epoch("c") + 1
        self._nodes["c"] = SimCoordinator(self)
        self.trace("c", "start")

    def crash_coordinator(self) -> None:
        self._nodes.pop("c", None)
        self._epochs["c"] = self.epoch("c") + 1
        self.trace("c", "crash")

    def trace(self, node: str, what: str) -> None:
        line = f"{self.sched.now:>7} {node:>3} {what}"
        self.trail.append(line)
        self._digest.update(line.encode() + b"\n")
        if self.verbose:
            print(line)

    # faults (safety phase only)
    def _faults(self) -> None:
        if not self.net.faults:
            return
        o, rng = self.opts, self.rng
        if rng.random() < o.partition_p:
            if self.net.cut and rng.random() < 0.5:
                self.net.heal()
                self.trace("net", "heal")
            else:
                nodes = [f"m{m}" for m in self.member_ids] + ["c"]
                primaries = [m.name for m in self.members() if m.role == "primary"]
                r = rng.random()
                if r < 0.4 and primaries:
                    # the interesting one: the primary keeps its clients but loses
                    # its secondaries (and maybe the coordinator), writes on alone
                    alone = [rng.choice(primaries)] + (["c"] if rng.random() < 0.5 else [])
                    groups = [alone, [n for n in nodes if n not in alone]]
                elif r < 0.7:
                    alone = [rng.choice(nodes)]
                    groups = [alone, [n for n in nodes if n not in alone]]
                else:
                    side = [n for n in nodes if rng.random() < 0.5]
                    groups = [side, [n for n in nodes if n not in side]]
                one_way = rng.random() < 0.2
                self.net.partition(groups, one_way)
                self.trace("net", f"partition {groups}" + (" one-way" if one_way else ""))
        for m in self.member_ids:
            name = f"m{m}"
            if name in self._nodes and rng.random() < o.crash_p:
                self.crash_member(m, rng.random() < o.machine_crash_p)
                self.sched.at(rng.randint(50, 2000), self._restart_member, m)
        for m in self.member_ids:
            if o.clock_jump_p and self.clock_rng.random() < o.clock_jump_p:
                jump = self.clock_rng.choice((-1, 1)) * self.clock_rng.randint(100, 5_000)
                self.clock_offsets[m] = self.clock_offsets.get(m, 0) + jump
                self.trace(f"m{m}", f"clock jumps {jump:+} ms")
            store = self.stores[m]
            if o.disk_full_p and not store.full and self.full_rng.random() < o.disk_full_p:
                store.full = True  # writes are refused with DiskFull; reads go on
                self.trace(f"m{m}", "disk full")
                self.sched.at(self.full_rng.randint(100, 3_000), self._disk_freed, m)
        if o.reconfig_p and "c" in self._nodes and rng.random() < o.reconfig_p:
            c = self._nodes["c"]
            m = rng.choice(c.config)
            c.set_votes(m["id"], 0 if m.get("votes", 1) else 1)
        if "c" in self._nodes and rng.random() < o.coordinator_crash_p:
            self.crash_coordinator()
            self.sched.at(rng.randint(50, 2000), self._restart_coordinator)
        self.sched.at(100, self._faults)

    def _disk_freed(self, m: int) -> None:
        if self.stores[m].full:
            self.stores[m].full = False
            self.trace(f"m{m}", "disk has room again")

    def _restart_member(self, m: int) -> None:
        if f"m{m}" not in self._nodes:
            try:
                self.start_member(m)
            except errors.DiskFull:  # its constructor writes: Ray tries again later
                self.trace(f"m{m}", "start failed: disk full")
                self.sched.at(500, self._restart_member, m)

    def _restart_coordinator(self) -> None:
        if "c" not in self._nodes:
            self.start_coordinator()

    # running
    def _step(self) -> None:
        """One event, then the invariants on every member it touched."""
        self.sched.step()
        for m in self.members():
            if m.oplog_dirty:
                self.checker.check_tail(m)

    def run(self) -> Result:
        try:
            self.sched.at(100, self._faults)
            while self.sched.now < self.opts.safety_ms:
                self._step()
            self._liveness()
            self.checker.final(self.members())
            return self._result(True)
        except Violation as v:
            return self._result(False, str(v))
        except Exception as e:  # a core raised where the protocol says it must not
            return self._result(False, "unexpected exception:\n" + "".join(
                traceback.format_exception(type(e), e, e.__traceback__)).rstrip())

    def _liveness(self) -> None:
        """Heal, restart everyone, stop faults and new writes; then the set must
        elect, take a majority write and converge."""
        self.trace("sim", "liveness phase: faults off, network healed")
        self.net.faults = False
        self.net.heal()
        for m in self.member_ids:
            self._disk_freed(m)
        for c in self.clients:
            c.active = False
        for m in self.member_ids:
            self._restart_member(m)
        self._restart_coordinator()
        start = self.sched.now
        probe = {"ok": False, "sent": False}
        prober = SimClient(self, 0, active=False)
        self.clients.append(prober)
        n = [0]

        def send_probe():
            if probe["ok"]:
                return
            n[0] += 1
            req = {"op": "insert", "ns": "db.c", "docs": [{"_id": f"probe-{n[0]}"}],
                   "w": "majority", "wtimeout_ms": WTIMEOUT_MS}

            def done(ok):
                if ok:
                    probe["ok"] = True
                    self.trace("k0", f"probe write {n[0]} acknowledged")
                else:
                    self.sched.at(100, send_probe)
            prober.send(req, done)
        self.sched.at(0, send_probe)
        stable_since = None
        next_check = start
        while True:
            self._step()
            if self.sched.now < next_check:
                continue
            next_check = self.sched.now + 100
            if probe["ok"] and self._quiescent():
                if stable_since is None:
                    stable_since = self.sched.now
                elif self.sched.now - stable_since >= 1_000:
                    return
            else:
                stable_since = None
            if self.sched.now - start > CONVERGE_MS_MAX:
                self.checker.fail(self._stuck_report())

    def _quiescent(self) -> bool:
        c = self._nodes.get("c")
        ms = self.members()
        if c is None or c.core.primary is None or len(ms) != len(self.member_ids):
            return False
        p = self._nodes.get(f"m{c.core.primary}")
        if p is None or not p.primary:
            return False
        tails = {m.engine.last() for m in ms}
        return len(tails) == 1 and all(rep.min_unapplied(m.engine) is None for m in ms)

    def _stuck_report(self) -> str:
        c = self._nodes.get("c")
        lines = [f"liveness: no convergence within {CONVERGE_MS_MAX} ms after faults stopped; "
                 f"coordinator primary={c.core.primary if c else None} "
                 f"term={c.core.term if c else None}"]
        for m in self.members():
            last, h = m.engine.last()
            lines.append(f"  m{m.id}: role={m.role} shard_primary={m.primary} term={m.engine.term} "
                         f"last={last} h={h:016x} following={m.core.following} "
                         f"source={m.producer.source} paused={m.producer.paused} "
                         f"producer_dead={m.p_dead} "
                         f"unapplied_from={rep.min_unapplied(m.engine)} "
                         f"resync={m.engine.get_meta('needs_resync')}")
        return "\n".join(lines)

    def _result(self, ok: bool, message: str = "") -> Result:
        ck = self.checker
        return Result(seed=self.seed, ok=ok, message=message, broken=self.broken,
                      regress=self.regress, scenario=self.scenario,
                      events=self.sched.events, sim_ms=self.sched.now,
                      stats={"commits": ck.commits, "majority_acks": len(ck.acked),
                             "reads": len(ck.reads),
                             "elections": ck.elections, "crashes": self.crashes,
                             "rollbacks": ck.rollbacks,
                             "rolled_back_entries": ck.rolled_back_entries},
                      trace_tail=list(self.trail), options=asdict(self.opts),
                      digest=self._digest.hexdigest())


def run(seed: int = 0, broken: str | None = None, trace: bool = False, regress=(),
        scenario: str | None = None) -> Result:
    """One run; ``regress``: known bugs put back into the shipped cores for it."""
    log = logging.getLogger("raymx")  # the shipped code's logs: the trace tells it here
    level, log.level = log.level, logging.CRITICAL + 1
    try:
        with regressed(regress, broken):
            return Sim(seed, broken, trace, regress, scenario).run()
    finally:
        log.setLevel(level)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, help="replay this seed")
    ap.add_argument("--seeds", help="a sweep, START:STOP")
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), help="replay a scripted scenario")
    ap.add_argument("--broken", choices=BROKEN, help="run with a planted bug")
    ap.add_argument("--regress", action="append", default=[], choices=list(KNOWN_BUGS),
                    help="put this known bug back into the shipped cores (repeatable)")
    ap.add_argument("--bugs", action="store_true", help="list the known bugs and exit")
    ap.add_argument("--trace", action="store_true", help="print every event")
    a = ap.parse_args(argv)
    if a.bugs:
        for b in KNOWN_BUGS.values():
            print(f"{b.name} ({b.where})\n  bug: {b.what}\n  fix: {b.fix}\n")
        return 0
    fixes = tuple(a.regress)
    if a.seed is None and a.seeds is None and a.scenario is None:
        ap.error("give --seed N, --seeds START:STOP or --scenario NAME")
    if a.seed is not None or a.scenario is not None:
        r = run(a.seed or 0, a.broken, a.trace, fixes, a.scenario)
        print(r.report())
        return 0 if r.ok else 1
    start, stop = (int(x) for x in a.seeds.split(":"))
    failed = []
    t0 = time.monotonic()  # reporting only; never feeds the simulation
    for s in range(start, stop):
        r = run(s, a.broken, False, fixes)
        print(f"seed {s}: {'ok' if r.ok else 'FAILED: ' + r.message.splitlines()[0]} "
              f"({r.events} events, {r.stats})", flush=True)
        if not r.ok:
            failed.append(r)
    print(f"{stop - start - len(failed)}/{stop - start} seeds ok in "
          f"{time.monotonic() - t0:.1f}s" + (f"; failed: {[r.seed for r in failed]}"
                                              if failed else ""))
    for r in failed:
        print(f"  reproduce: {r.reproduce}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
