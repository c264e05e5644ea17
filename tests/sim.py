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
import logging
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
from collections import deque
from dataclasses import asdict, dataclass, field

from raymx import errors
from raymx.actors.core import replication as rep
from raymx.storage.limits import Limits
from raymx.storage.lmdb_store import LMDBStore
from raymx.storage.store import MemoryStore
from tests.sim_base import (CONVERGE_MS_MAX, FAULTS, Network, Options, Rpc, SCENARIOS,
                            Scheduler, TXN_IDLE_MS, TXN_LIFETIME_MS, Violation, WTIMEOUT_MS,
                            reproduce_line)
from tests.sim_bugs import BROKEN, KNOWN_BUGS, regressed
from tests.sim_member import SimMember  # noqa: F401
from tests.sim_actors import Checker, SimClient, SimCoordinator  # noqa: F401


# --- the cluster ----------------------------------------------------------------
@dataclass
class Result:
    seed: int
    ok: bool
    message: str = ""
    broken: str | None = None
    regress: tuple = ()
    scenario: str | None = None
    off: tuple = ()
    events: int = 0
    sim_ms: int = 0
    stats: dict = field(default_factory=dict)
    trace_tail: list = field(default_factory=list)
    options: dict = field(default_factory=dict)
    digest: str = ""

    @property
    def reproduce(self) -> str:
        return reproduce_line(self.seed, self.broken, self.regress, self.scenario, self.off)

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
                 regress=(), scenario: str | None = None, off=()):
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
        unknown = [n for n in off if n not in FAULTS]
        if unknown:
            raise ValueError(f"unknown faults {unknown} (known: {', '.join(FAULTS)})")
        self.off = tuple(off)
        for n in off:
            setattr(self.opts, n, 0.0)
        self.rng = random.Random(seed)
        self.read_rng = random.Random(seed * 31 + 7)  # reads' own draws (seeds without reads replay as before)
        self.disk_rng = random.Random(seed * 37 + 11)  # failed fsyncs' own draws
        self.clock_rng = random.Random(seed * 41 + 13)  # clock jumps' own draws
        self.full_rng = random.Random(seed * 43 + 17)  # full disks' own draws
        self.zombie_rng = random.Random(seed * 47 + 19)  # zombies' own draws
        self.bank_rng = random.Random(seed * 53 + 23)  # transfers' own draws
        self.abandon_rng = random.Random(seed * 59 + 29)  # transfers left open: their own draws
        self.member_rng = random.Random(seed * 61 + 31)  # members removed and added: their own
        self.zombies: set[str] = set()  # members whose old process runs on
        self.clock_offsets: dict[int, int] = {}  # member -> its clock minus simulated time
        self.sched = Scheduler(self.rng)
        o = self.opts
        self.limits = Limits().with_(heartbeat_interval_ms=o.heartbeat_interval_ms,
                                     heartbeat_timeout_ms=max(o.heartbeat_timeout_ms,
                                                              2 * o.heartbeat_interval_ms),
                                     pull_wait_ms=o.pull_wait_ms)
        if self.abandoning:  # transactions left open end within the run
            self.limits = self.limits.with_(transaction_idle_ms=TXN_IDLE_MS,
                                            transaction_lifetime_ms=TXN_LIFETIME_MS)
        self.net = Network(self)
        self.rpc = Rpc(self)
        self.checker = Checker(self)
        self.trail: deque = deque(maxlen=120)
        self._digest = hashlib.blake2b(digest_size=8)  # of every trace line: replays compare equal
        self.member_ids = list(range(1, self.opts.members + 1))  # running or to restart
        self.specs = [{"id": m, "priority": 0 if m in self.opts.priority0 else 1}
                      for m in self.member_ids]
        self.boot_specs: dict[int, list] = {}  # an added member's first member list
        self.next_id = self.opts.members + 1  # the coordinator's next_id
        self.adding: set[int] = set()  # added members not configured yet
        self.membership = [0, 0]  # members added, removed (configurations installed)
        # the LMDB store in every seed whose faults it can carry (a machine
        # crash, a failed fsync and a full disk need the in-memory store's
        # switches), the in-memory one elsewhere: one contract, both checked
        self._dir = None
        if scenario is None and not (o.machine_crash_p or o.fsync_fail_p or o.disk_full_p):
            self._dir = tempfile.mkdtemp(prefix="raymx-sim-", dir="/dev/shm"
                                         if os.path.isdir("/dev/shm") else None)
        self.stores = {m: self._new_store(m) for m in self.member_ids}
        self._nodes: dict[str, object] = {}
        self._epochs: dict[str, int] = {}
        self.crashes = 0
        self.started: list[SimMember] = []  # every member process this run started
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
        elif op == "cut":  # these links too, both ways (on top of a partition)
            for a, b in item[2]:
                self.net.cut |= {(a, b), (b, a)}
            self.trace("net", f"cut {item[2]}")
        elif op in ("drop_p", "reads_p"):
            setattr(self.opts, op, item[2])
            self.trace("net", f"{op}={item[2]}")
        elif op == "crash_c":
            if "c" in self._nodes:
                self.crash_coordinator()
        elif op == "restart_c":
            self._restart_coordinator()
        elif op == "votes":
            if "c" in self._nodes:
                self._nodes["c"].set_votes(item[2], item[3])
        elif op == "remove":
            if "c" in self._nodes:
                self._nodes["c"].remove(item[2])
        elif op == "add":
            if "c" in self._nodes:
                self.add_member()
        else:
            raise ValueError(f"unknown scripted fault {item!r}")

    # nodes and incarnations
    def node(self, name: str):
        if name.startswith("k"):
            return next((c for c in self.clients if c.name == name), None)
        return self._nodes.get(name)

    @property
    def abandoning(self) -> bool:
        """Clients leave some transfers open (``Options.abandon_p``)."""
        return bool(self.opts.bank_p and self.opts.abandon_p)

    def epoch(self, name: str) -> int:
        return self._epochs.get(name, 0)

    def members(self) -> list[SimMember]:
        return [self._nodes[f"m{m}"] for m in self.member_ids if f"m{m}" in self._nodes]

    def _new_store(self, m: int):
        if self._dir is not None:
            return LMDBStore(os.path.join(self._dir, f"m{m}"), map_bytes=256 << 20)
        return MemoryStore(f"m{m}")

    # an operator's membership changes (ReplicaSet.add_member, remove_member)
    def add_member(self) -> None:
        """``add_member``: the coordinator's next id, an empty store started
        with the member list it joins, then the change that configures it
        joining (no vote, priority 0); refused or lost, the member goes."""
        from raymx.members import _joining
        c = self._nodes["c"]
        m, self.next_id = self.next_id, self.next_id + 1
        spec = _joining({"id": m, "priority": 1, "votes": 1, "hidden": False, "delay_s": 0,
                         "sync_source": None})
        self.stores[m] = self._new_store(m)
        self.boot_specs[m] = [dict(x) for x in c.config] + [spec]
        self.member_ids.append(m)
        self.adding.add(m)
        self.start_member(m)
        c.put(spec, refused=lambda: self.retire_member(m, "never configured"))

    def retire_member(self, m: int, why: str) -> None:
        """Its processes stop for good (``remove_member`` kills them); its files stay."""
        if m not in self.member_ids:
            return
        self.member_ids.remove(m)
        self.adding.discard(m)
        self.membership[1] += why == "removed"
        self.zombies.discard(f"m{m}")
        self._nodes.pop(f"m{m}", None)
        self._epochs[f"m{m}"] = self.epoch(f"m{m}") + 1
        self.trace(f"m{m}", f"stopped for good: {why}")

    def start_member(self, m: int) -> None:
        name = f"m{m}"
        self._epochs[name] = self.epoch(name) + 1
        self._nodes[name] = SimMember(self, m, self.stores[m])
        self.started.append(self._nodes[name])
        self.checker.check_oplog(self._nodes[name])
        self.trace(name, f"start last={self._nodes[name].engine.last()[0]} "
                   f"term={self._nodes[name].engine.term}")

    def crash_member(self, m: int, machine: bool) -> None:
        name = f"m{m}"
        self._nodes.pop(name, None)
        self.zombies.discard(name)
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

    def retire_unconfigured(self) -> None:
        """A restarted coordinator settled on its configuration: a member it
        does not hold, and no addition under way adds, is one whose change
        completed only in a configuration none of the members that answered
        recorded, and the operator's ``add_member`` stops it (a known limit)."""
        known = {m["id"] for m in self._nodes["c"].config} | self.adding  # (their
        for m in [m for m in self.member_ids if m not in known]:       # changes decide)
            self.retire_member(m, "not in the restarted coordinator's configuration")

    def crash_coordinator(self) -> None:
        self._nodes.pop("c", None)
        for m in sorted(self.adding):  # the operator's add_member fails with it
            self.retire_member(m, "the coordinator died before configuring it")
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
            name = f"m{m}"
            if o.zombie_p and name in self._nodes and name not in self.zombies \
                    and self.zombie_rng.random() < o.zombie_p:
                self.zombies.add(name)
                self.trace(name, "zombie: Ray restarts it while the old process runs on")
                self.sched.at(300, self._zombie_restart, m)
                self.sched.at(self.zombie_rng.randint(300, 3_000), self._zombie_dies, m)
        if o.reconfig_p and "c" in self._nodes and rng.random() < o.reconfig_p:
            c = self._nodes["c"]
            m = rng.choice(c.config)
            c.set_votes(m["id"], 0 if m.get("votes", 1) else 1)
        mr = self.member_rng
        if o.membership_p and "c" in self._nodes and mr.random() < o.membership_p:
            c = self._nodes["c"]  # between 1 and 7 members; the primary may be picked
            n = len(c.config)
            if n < 7 and (n <= 1 or mr.random() < 0.5):
                self.add_member()
            else:
                c.remove(mr.choice(c.config)["id"])
        if "c" in self._nodes and rng.random() < o.coordinator_crash_p:
            self.crash_coordinator()
            self.sched.at(rng.randint(50, 2000), self._restart_coordinator)
        self.sched.at(100, self._faults)

    def _zombie_restart(self, m: int) -> None:
        """Ray's restart of a member whose old process runs on: refused while
        the old process holds the folder's lock (ConfigError), tried again."""
        if f"m{m}" in self.zombies:
            self.trace(f"m{m}", "new process refused: the folder is locked by the old one")
            self.sched.at(300, self._zombie_restart, m)

    def _zombie_dies(self, m: int) -> None:
        if f"m{m}" in self.zombies:
            self.crash_member(m, machine=False)
            self._restart_member(m)

    def _disk_freed(self, m: int) -> None:
        if getattr(self.stores[m], "full", False):  # (LMDB seeds never fill their disk)
            self.stores[m].full = False
            self.trace(f"m{m}", "disk has room again")

    def _restart_member(self, m: int) -> None:
        if f"m{m}" not in self._nodes and m in self.member_ids:
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
            return self._run()
        finally:
            if self._dir is not None:
                for s in self.stores.values():
                    s.close()
                shutil.rmtree(self._dir, ignore_errors=True)

    def _run(self) -> Result:
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
            self._zombie_dies(m)
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
                      regress=self.regress, scenario=self.scenario, off=self.off,
                      events=self.sched.events, sim_ms=self.sched.now,
                      stats={"commits": ck.commits, "majority_acks": len(ck.acked),
                             "reads": len(ck.reads),
                             "elections": ck.elections, "crashes": self.crashes,
                             "rollbacks": ck.rollbacks,
                             "rolled_back_entries": ck.rolled_back_entries,
                             "members_added_removed": "/".join(map(str, self.membership)),
                             "transfers": "/".join(map(str, ck.transfers)),
                             "transactions_expired": sum(m.svc.transactions_expired
                                                         for m in self.started)},
                      trace_tail=list(self.trail),
                      options=dict(asdict(self.opts), store="lmdb" if self._dir else "memory"),
                      digest=self._digest.hexdigest())


def run(seed: int = 0, broken: str | None = None, trace: bool = False, regress=(),
        scenario: str | None = None, off=()) -> Result:
    """One run; ``regress``: known bugs put back into the shipped cores for it."""
    log = logging.getLogger("raymx")  # the shipped code's logs: the trace tells it here
    level, log.level = log.level, logging.CRITICAL + 1
    try:
        with regressed(regress, broken):
            return Sim(seed, broken, trace, regress, scenario, off).run()
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
    ap.add_argument("--off", action="append", default=[], choices=FAULTS,
                    help="switch this random fault off (repeatable)")
    a = ap.parse_args(argv)
    if a.bugs:
        for b in KNOWN_BUGS.values():
            print(f"{b.name} ({b.where})\n  bug: {b.what}\n  fix: {b.fix}\n")
        return 0
    fixes = tuple(a.regress)
    if a.seed is None and a.seeds is None and a.scenario is None:
        ap.error("give --seed N, --seeds START:STOP or --scenario NAME")
    if a.seed is not None or a.scenario is not None:
        r = run(a.seed or 0, a.broken, a.trace, fixes, a.scenario, a.off)
        print(r.report())
        return 0 if r.ok else 1
    start, stop = (int(x) for x in a.seeds.split(":"))
    failed = []
    t0 = time.monotonic()  # reporting only; never feeds the simulation
    for s in range(start, stop):
        r = run(s, a.broken, False, fixes, off=a.off)
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
