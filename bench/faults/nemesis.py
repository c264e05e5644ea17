"""Linearizable registers on a real replica set under faults: a Jepsen-style
nemesis for raymx.

Clients (raymx's driver and pymongo through the wire ports) read, write and
compare-and-set a few registers (documents ``{"_id": key, "v": value}``):
reads with read concern ``linearizable``, writes and compare-and-sets with
``w: "majority"`` (``update_one`` with ``upsert``, and ``update_one`` whose
filter names the expected value). Every value written is unique, so a read
names the write it saw. Each operation is recorded with its call and return
times on one clock; one whose outcome is unknown (a timeout, a lost
connection, "outcome unknown") is recorded as such and may have happened or
not. Meanwhile a nemesis, one fault at a time, each healed before the next:

- ``kill-primary``: every process of the primary killed (``kill_member``),
  started again a few seconds later;
- ``sigkill-primary``: the primary's shard process SIGKILLed (Ray restarts it);
- ``sigkill-any``: one process (shard, producer or applier) of any member
  SIGKILLed (Ray restarts it);
- ``kill-secondary``: every process of a secondary killed, started again;
- ``freeze-primary``: the primary's processes SIGSTOPped for 1-8 s (a long
  pause: the others may elect a new primary while it sleeps), then SIGCONT;
- ``freeze-primary-lag``: the same while one secondary's producer is paused;
- ``freeze-secondary``: one secondary's processes SIGSTOPped for 2-6 s;
- ``lag``: both secondaries' producers paused for 1-4 s (no write can reach
  a majority meanwhile);
- ``step-down``: the primary asked to step down;
- ``coordinator``: the set's coordinator killed (Ray restarts it);
- ``remove-add`` (asked for by ``--faults`` or ``--reconfig``): a secondary
  removed from the set, half the time while the other secondaries' producers
  are paused (the removal then waits for them, up to 10 s, or is refused),
  and a new member added in its place a moment later (``initial_sync``
  ``auto``: the whole oplog if every member holds it, else a snapshot; or
  ``snapshot``);
- ``remove-two`` (likewise; 5 members or more): two secondaries removed at
  once while the rest lag, then two new members added;
- ``revote`` (likewise): a secondary's vote and priority taken away, half
  the time while the others lag, and given back a moment later;
- ``disk-full`` (with ``--disk-mib``, which puts each member's folder on a
  tmpfs of its own: needs root): a ballast file fills one member's file
  system (the primary's half the time) for 1-6 s, then goes.

Beside them, ``--bank`` pymongo clients move money between accounts in
transactions (``with_transaction``, ``bank.py``).

At the end every fault is healed, each register is read once more, every
member must converge to the same state (``state_digest``), the history
of each register must be linearizable (``linearizable.py``), and the bank
must hold every acknowledged transfer exactly once, with balances that
follow from them (``bank.check``). Prints the figures and the first
violation found; exits 1 on a violation.

    RAY_AUTH_MODE=disabled PYTHONPATH=. .venv/bin/python bench/faults/nemesis.py \\
        --seconds 120 --seed 1 [--members 3] [--clients 4] [--pymongo 2] [--bank 1]
"""
from __future__ import annotations

import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import click  # noqa: E402
import ray  # noqa: E402

import raymx  # noqa: E402
from raymx import errors  # noqa: E402
import bank  # noqa: E402
import checks  # noqa: E402
import disks as disks_mod  # noqa: E402
from linearizable import INF, Op, check  # noqa: E402

DB, COLL = "nem", "reg"
ROLES = ("", "producer", "applier")


class History:
    def __init__(self):
        self.ops: list[Op] = []
        self.lock = threading.Lock()
        self.errors: Counter = Counter()
        self.examples: dict[str, str] = {}  # the first message of each kind of error

    def add(self, op: Op) -> None:
        with self.lock:
            self.ops.append(op)

    def error(self, what: str, e: BaseException) -> None:
        with self.lock:
            self.errors[what] += 1
            self.examples.setdefault(what, str(e)[:300])


def _not_applied(e: BaseException) -> bool:
    """raymx said the request was never executed (not sent, refused as such),
    or the member refused it for want of room (``DiskFull``: "nothing was
    written", which the history then checks; the driver resends only what a
    member refused or never got, so the answer is about the one execution).
    pymongo's OutOfDiskSpace may follow a retryable write's first try, which
    may have been applied: not counted."""
    if isinstance(e, errors.DiskFull):
        return True
    info = getattr(e, "info", None) or {}
    return info.get("sent") is False and info.get("outcome") != "unknown"


class Client(threading.Thread):
    """One client: ``kind`` "raymx" (the native driver) or "pymongo"."""

    def __init__(self, cid: int, kind: str, rs, keys, hist: History, stop, seed: int,
                 pad: str = ""):
        super().__init__(daemon=True, name=f"client-{cid}")
        self.cid, self.kind, self.rs, self.keys, self.hist = cid, kind, rs, keys, hist
        self.set = (lambda v: {"v": v, "pad": pad}) if pad else (lambda v: {"v": v})
        self.stop, self.rnd, self.seq = stop, random.Random(seed), 0
        self.seen: dict = {}  # key -> the last value this client read or wrote

    def _connect(self):
        if self.kind == "raymx":
            cl = self.rs.client(w="majority", wtimeout_ms=4000, timeout_s=6)
            coll = cl[DB][COLL]
            return cl, coll, coll.with_options(read_concern="linearizable")
        import pymongo
        from pymongo.read_concern import ReadConcern
        from pymongo.write_concern import WriteConcern
        cl = pymongo.MongoClient(self.rs.mongodb_uri(driver="pymongo"),
                                 serverSelectionTimeoutMS=6000, socketTimeoutMS=6000,
                                 connectTimeoutMS=3000, heartbeatFrequencyMS=500)
        coll = cl.get_database(DB, write_concern=WriteConcern("majority", wtimeout=4000))[COLL]
        return cl, coll, coll.with_options(read_concern=ReadConcern("linearizable"))

    def run(self):
        cl, coll, lin = self._connect()
        try:
            while not self.stop.is_set():
                self.one(coll, lin)
        finally:
            cl.close()

    def one(self, coll, lin):
        k = self.rnd.choice(self.keys)
        kind = self.rnd.choices(("read", "write", "cas"), (4, 3, 3))[0]
        self.seq += 1
        new = self.cid * 1_000_000 + self.seq  # every value written is unique
        arg = {"read": None, "write": new, "cas": (self.seen.get(k, 0), new)}[kind]
        t0 = time.monotonic()
        try:
            if kind == "read":
                d = lin.find_one({"_id": k})
                ok = None if d is None else d.get("v")
                self.seen[k] = ok
            elif kind == "write":
                coll.update_one({"_id": k}, {"$set": self.set(new)}, upsert=True)
                ok = True
                self.seen[k] = new
            else:
                r = coll.update_one({"_id": k, "v": arg[0]}, {"$set": self.set(new)})
                ok = r.matched_count == 1
                if ok:
                    self.seen[k] = new
            self.hist.add(Op(k, kind, arg, ok, t0, time.monotonic(), self.cid))
        except Exception as e:  # noqa: BLE001 - every failure is recorded by its kind
            self.hist.error(f"{self.kind} {kind}: {type(e).__name__}", e)
            if kind != "read" and not (self.kind == "raymx" and _not_applied(e)):
                # may have happened or not; a failed read observed nothing
                self.hist.add(Op(k, kind, arg, None, t0, INF, self.cid, {"err": repr(e)[:200]}))
            time.sleep(0.05)


class Nemesis(threading.Thread):
    FAULTS = ("kill-primary", "sigkill-primary", "sigkill-any", "kill-secondary",
              "freeze-primary", "freeze-primary-lag", "freeze-secondary", "lag", "step-down",
              "coordinator")
    RECONFIG = ("remove-add", "remove-two", "revote")  # asked for: --faults or --reconfig

    def __init__(self, rs, n: int, stop, seed: int, faults=FAULTS, disks=()):
        super().__init__(daemon=True, name="nemesis")
        self.rs, self.stop, self.rnd = rs, stop, random.Random(seed)
        self.ids = list(range(n))  # the members now configured (reconfiguration changes them)
        self.faults = faults
        self.disks = disks  # member -> the mount point of its own file system
        self.ballast: list[str] = []  # files filling a member's file system
        self.done: list[tuple[float, str, str]] = []
        self.failed: list[str] = []
        self.stopped: set[int] = set()  # pids SIGSTOPped, not yet continued
        self.paused: set[int] = set()   # members whose producer is paused
        self.killed: set[int] = set()   # members killed, not yet started

    def _actor(self, m, role=""):
        return ray.get_actor(f"{self.rs.name}/m{m}" + (f"/{role}" if role else ""),
                             namespace="raymx")

    def roles(self, m) -> dict[str, int]:
        """The pid of each of member ``m``'s processes that answers ("": the shard)."""
        out = {}
        for role in ROLES:
            try:
                h = self._actor(m, role)
                out[role] = ray.get(h.__ray_call__.remote(lambda self: os.getpid()), timeout=10)
            except Exception:  # noqa: BLE001 - a member being restarted
                pass
        return out

    def pids(self, m) -> list[int]:
        return list(self.roles(m).values())

    def primary(self):
        try:
            return self.rs._topology().get("primary")
        except Exception:  # noqa: BLE001
            return None

    def _freeze(self, pids):
        for p in pids:
            try:
                os.kill(p, signal.SIGSTOP)
                self.stopped.add(p)
            except ProcessLookupError:
                pass

    def _thaw(self):
        for p in list(self.stopped):
            try:
                os.kill(p, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.stopped.discard(p)

    def _pause(self, ms, paused=True):
        for m in ms:
            try:
                ray.get(self._actor(m, "producer").pause.remote(paused, wait=False), timeout=10)
                (self.paused.add if paused else self.paused.discard)(m)
            except Exception as e:  # noqa: BLE001
                self.failed.append(f"pause {m} {paused}: {type(e).__name__}: {e}")

    def _fill(self, m) -> str:
        """Fill member ``m``'s file system with a ballast file; what it took."""
        path = disks_mod.fill(self.disks[m], f"ballast.{time.monotonic_ns()}")
        self.ballast.append(path)
        return f"{os.path.getsize(path) >> 20} MiB"

    def _remove_add(self, others: list, k: int) -> str:
        """Remove ``k`` secondaries (at once), maybe while the rest lag; then
        add as many new members. What happened, for the log."""
        if len(self.ids) - k < 2 or len(others) < k:
            return "skipped: too few members"
        gone = self.rnd.sample(others, k)
        lag = [m for m in others if m not in gone] if k > 1 or self.rnd.random() < 0.5 else []
        self._pause(lag)
        out = []

        def remove(m):
            try:
                self.rs.remove_member(m, timeout_s=10)
                self.ids.remove(m)
                out.append(f"removed m{m}")
            except Exception as e:  # noqa: BLE001 - refused (the set lags): nothing changed
                out.append(f"m{m} not removed ({type(e).__name__}: {str(e)[:80]})")
        ts = [threading.Thread(target=remove, args=(m,)) for m in gone]
        for t in ts:
            t.start()
        self.stop.wait(self.rnd.uniform(0.5, 2))
        self._pause(lag, False)
        for t in ts:
            t.join(180)
        for _ in range(sum(1 for m in gone if m not in self.ids)):
            how = self.rnd.choice(("auto", "snapshot"))
            try:
                new = self.rs.add_member(initial_sync=how, progress=False, timeout_s=120)
                self.ids.append(new)
                out.append(f"added m{new} ({how})")
            except Exception as e:  # noqa: BLE001
                self.failed.append(f"add ({how}): {type(e).__name__}: {e}")
                out.append(f"add failed ({how})")
        return "; ".join(out) + (f"; lagging {lag}" if lag else "")

    def _revote(self, others: list) -> str:
        """A secondary loses its vote (and priority), half the time while the
        others lag, and gets them back a moment later."""
        m = self.rnd.choice(others)
        lag = [x for x in others if x != m] if self.rnd.random() < 0.5 else []
        self._pause(lag)
        out = []
        for votes in (0, 1):
            try:
                self.rs.reconfigure_member(m, timeout_s=10, votes=votes, priority=votes)
                out.append(f"m{m} votes={votes}")
            except Exception as e:  # noqa: BLE001 - refused (the set lags): nothing changed
                out.append(f"m{m} votes={votes} refused ({type(e).__name__})")
            self.stop.wait(self.rnd.uniform(0.5, 2))
            self._pause(lag, False)
        return "; ".join(out) + (f"; lagging {lag}" if lag else "")

    def heal(self):
        self._thaw()
        for path in self.ballast:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
        self.ballast.clear()
        if self.paused:
            self._pause(list(self.paused), False)
        for m in list(self.killed):
            try:
                self.rs.start_member(m)
                self.killed.discard(m)
            except Exception as e:  # noqa: BLE001
                self.failed.append(f"start {m}: {type(e).__name__}: {e}")

    def run(self):
        while not self.stop.wait(self.rnd.uniform(1.5, 4.0)):
            fault = self.rnd.choice(self.faults)
            p = self.primary()
            if p is None:
                continue
            others = [m for m in self.ids if m != p]
            t = time.monotonic()
            note = ""
            try:
                if fault == "kill-primary":
                    self.rs.kill_member(p)
                    self.killed.add(p)
                    self.stop.wait(self.rnd.uniform(1, 5))
                elif fault == "sigkill-primary":
                    pid = self.roles(p).get("")
                    if pid:
                        os.kill(pid, signal.SIGKILL)
                    self.stop.wait(self.rnd.uniform(1, 4))
                elif fault == "sigkill-any":
                    m = self.rnd.choice(self.ids)
                    roles = sorted(self.roles(m).items())
                    if roles:
                        role, pid = self.rnd.choice(roles)
                        note = f"m{m} {role or 'shard'}"
                        os.kill(pid, signal.SIGKILL)
                    self.stop.wait(self.rnd.uniform(0.5, 3))
                elif fault == "kill-secondary":
                    m = self.rnd.choice(others)
                    note = f"m{m}"
                    self.rs.kill_member(m)
                    self.killed.add(m)
                    self.stop.wait(self.rnd.uniform(1, 4))
                elif fault in ("freeze-primary", "freeze-primary-lag"):
                    if fault == "freeze-primary-lag":
                        self._pause([self.rnd.choice(others)])
                    secs = self.rnd.uniform(1, 8)
                    note = f"{secs:.1f} s"
                    self._freeze(self.pids(p))
                    self.stop.wait(secs)
                elif fault == "freeze-secondary":
                    m = self.rnd.choice(others)
                    secs = self.rnd.uniform(2, 6)
                    note = f"m{m} {secs:.1f} s"
                    self._freeze(self.pids(m))
                    self.stop.wait(secs)
                elif fault == "lag":
                    secs = self.rnd.uniform(1, 4)
                    note = f"{secs:.1f} s"
                    self._pause(others)
                    self.stop.wait(secs)
                elif fault == "step-down":
                    self.rs.step_down()
                elif fault == "coordinator":
                    ray.kill(self.rs._coord, no_restart=False)
                elif fault == "revote":
                    note = self._revote(others)
                elif fault in self.RECONFIG:
                    note = self._remove_add(others, 2 if fault == "remove-two" else 1)
                elif fault == "disk-full":  # members added later have no disk of their own
                    on = sorted(m for m in self.disks if m in self.ids)
                    if not on:
                        continue
                    m = p if p in on and self.rnd.random() < 0.5 else self.rnd.choice(on)
                    secs = self.rnd.uniform(1, 6)
                    note = f"m{m} {self._fill(m)} {secs:.1f} s"
                    self.stop.wait(secs)
            except Exception as e:  # noqa: BLE001 - the fault failed: say so, go on
                self.failed.append(f"{fault}: {type(e).__name__}: {e}")
            finally:
                self.heal()
            self.done.append((t, fault, f"m{p} {note}".strip()))
            print(f"  .. {time.strftime('%H:%M:%S')} {fault} (primary m{p}) {note}",
                  file=sys.stderr, flush=True)


def _final_reads(rs, keys, hist: History):
    coll = rs.client(timeout_s=30, read_concern="linearizable")[DB][COLL]
    for k in keys:
        for _ in range(20):
            t0 = time.monotonic()
            try:
                d = coll.find_one({"_id": k})
            except errors.RaymxError:
                time.sleep(0.5)
                continue
            hist.add(Op(k, "read", None, None if d is None else d.get("v"), t0,
                        time.monotonic(), "final"))
            break


@click.command(context_settings={"help_option_names": ["-h", "--help"]},
               help=__doc__.split("\n\n")[0])
@click.option("--seconds", default=120.0, show_default=True, help="How long the faults go on.")
@click.option("--seed", default=1, show_default=True)
@click.option("--members", default=3, show_default=True)
@click.option("--clients", default=4, show_default=True, help="raymx driver clients.")
@click.option("--pymongo", "pymongo_clients", default=2, show_default=True,
              help="pymongo clients (through the wire ports).")
@click.option("--bank", "bank_clients", default=1, show_default=True,
              help="pymongo clients doing transfers in transactions (bank.py).")
@click.option("--keys", default=6, show_default=True, help="Registers.")
@click.option("--faults", default=",".join(Nemesis.FAULTS), show_default=True,
              help="The kinds of fault to draw from, comma-separated.")
@click.option("--map-mib", default=0, show_default=True,
              help="Each member's LMDB map in MiB (0: the default); a small map makes the "
                   "write-ahead log checkpoint often (every 1/64 of it).")
@click.option("--pad-kib", default=0, show_default=True,
              help="KiB of padding each write carries: with a small --map-mib the map "
                   "fills and grows under the faults.")
@click.option("--reconfig", is_flag=True,
              help="Add the membership faults (remove-add, remove-two, revote) to --faults.")
@click.option("--disk-mib", default=0, show_default=True,
              help="Put each member's folder on a tmpfs of this many MiB of its own and add "
                   "the disk-full fault (needs root; 0: no).")
def main(seconds, seed, members, clients, pymongo_clients, bank_clients, keys, faults,
         map_mib, pad_kib, reconfig, disk_mib) -> None:
    kinds = faults.split(",")
    if reconfig:
        kinds += [k for k in Nemesis.RECONFIG if k not in kinds]
    unknown = sorted(set(kinds) - set(Nemesis.FAULTS) - set(Nemesis.RECONFIG) - {"disk-full"})
    if unknown:
        raise click.BadParameter(f"unknown fault kinds {unknown}; the kinds are "
                                 f"{', '.join(Nemesis.FAULTS + Nemesis.RECONFIG)}, disk-full",
                                 param_hint="--faults")
    if disk_mib and "disk-full" not in kinds:
        kinds.append("disk-full")
    if "disk-full" in kinds and not disk_mib:
        raise click.BadParameter("disk-full needs --disk-mib", param_hint="--faults")
    if disk_mib and os.geteuid() != 0:
        raise click.BadParameter("mounting a tmpfs per member needs root",
                                 param_hint="--disk-mib")
    sys.exit(run(seconds, seed, members, clients, pymongo_clients, keys, ",".join(kinds),
                 map_mib, pad_kib, disk_mib, bank_clients))


def run(seconds, seed, members, n_raymx, n_pymongo, n_keys, faults, map_mib, pad_kib=0,
        disk_mib=0, n_bank=1) -> int:
    """One run; 1 if a history is not linearizable, the members did not
    converge, or a member could not restart (its folders are kept, and named;
    not those on a tmpfs of --disk-mib, which go with it)."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    from raymx.storage.limits import Limits
    data_dir = tempfile.mkdtemp(prefix="nemesis-")
    disks = {}
    for m in range(members if disk_mib else 0):
        disks[m] = os.path.join(data_dir, f"m{m}")
        why = disks_mod.mount_tmpfs(disks[m], disk_mib)
        if why:
            raise RuntimeError(why)
    rs = raymx.ReplicaSet.launch(f"nem{seed}", members=members, data_dir=data_dir,
                                 limits=Limits(map_bytes=map_mib << 20) if map_mib else None)
    rc = 0
    try:
        rs.wait_for_primary()
        keys = [f"k{i}" for i in range(n_keys)]
        rs.client(w="majority")[DB][COLL].insert_many([{"_id": k, "v": 0} for k in keys])
        hist = History()
        stop, nstop = threading.Event(), threading.Event()
        kinds = ["raymx"] * n_raymx + ["pymongo"] * n_pymongo
        pad = "x" * (pad_kib << 10)
        clients = [Client(i + 1, kind, rs, keys, hist, stop, seed * 100 + i, pad)
                   for i, kind in enumerate(kinds)]
        book, uri = bank.Book(), rs.mongodb_uri(driver="pymongo")
        if n_bank:
            accounts = bank.setup(rs, 5)
            clients += [bank.Client(i + 1, uri, accounts, book, stop, seed * 1000 + i)
                        for i in range(n_bank)]
        nem = Nemesis(rs, members, nstop, seed, tuple(faults.split(",")), disks)
        t0 = time.monotonic()
        for c in clients:
            c.start()
        nem.start()
        while time.monotonic() - t0 < seconds:
            time.sleep(1)
        nstop.set()
        nem.join(120)
        nem.heal()
        time.sleep(3)  # the clients go on a while on a healed set
        stop.set()
        for c in clients:
            c.join(150)  # a transfer's with_transaction retries for up to 120 s
        stuck = [c.name for c in clients if c.is_alive()]
        rs.wait_for_primary(60)
        _final_reads(rs, keys, hist)
        deadline = time.monotonic() + 120
        digests = None
        while time.monotonic() < deadline:
            try:
                digests = [ray.get(rs.member(m).state_digest.remote(), timeout=30)
                           for m in nem.ids]
            except Exception:  # noqa: BLE001 - a member still restarting
                digests = None
            if digests and checks.converged(digests):
                break
            time.sleep(1)
        converged = bool(digests) and checks.converged(digests)
        res = check(hist.ops, 0)
        bank_problems = []
        if n_bank:
            with book.lock:
                acked, touches = list(book.acked), tuple(book.touches)
            bal, logs, touched = bank.final_state(rs.mongodb_uri(driver="pymongo"))
            bank_problems = bank.check(bal, logs, acked, touched=touched, touches=touches,
                                       seen=dict(book.seen), torn=list(book.torn))
        by = Counter((o.kind, "ok" if o.ret != INF else "unknown") for o in hist.ops)
        cas_ok = sum(1 for o in hist.ops if o.kind == "cas" and o.ok is True)
        print(f"nemesis seed {seed}: {members} members, {len(clients)} clients "
              f"({n_raymx} raymx, {n_pymongo} pymongo, {n_bank} bank), {n_keys} registers, "
              f"{seconds:.0f} s")
        print(f"  faults: {len(nem.done)} ({', '.join(f'{f} {n}' for f, n in Counter(x[1] for x in nem.done).most_common())})")
        if nem.failed:
            print(f"  faults that failed to apply: {len(nem.failed)}; first: {nem.failed[0]}")
        print(f"  operations: {len(hist.ops)}; " + ", ".join(
            f"{k} {s} {n}" for (k, s), n in sorted(by.items())) + f"; cas matched {cas_ok}")
        per = Counter(kinds[o.client - 1] for o in hist.ops if o.client != "final")
        print(f"  operations by client kind: {dict(per)}")
        print(f"  errors: {dict(hist.errors.most_common(10))}")
        for what, n in hist.errors.items():
            if n <= 2:  # the rare ones, to look at
                print(f"    {what}: {hist.examples[what]}")
        print(f"  members converged: {converged} (members {', '.join(f'm{m}' for m in nem.ids)})")
        if stuck:
            print(f"  clients still running at the end (not checked after): {stuck}")
        if n_bank:
            tried = sum(c.seq for c in clients if isinstance(c, bank.Client))
            print(f"  bank: {len(acked)} transfers acknowledged of {tried} tried, "
                  f"{len(logs)} logged, {book.runs - tried} run again by the driver, "
                  f"counted outside transactions {touched} times ({touches[0]} "
                  f"acknowledged, {touches[1]} unknown), reads {dict(book.reads)} "
                  f"({len(book.seen)} transfers seen), errors {dict(book.errors)}; "
                  + ("; ".join(f"VIOLATION: {p}" for p in bank_problems) or "every "
                     "acknowledged transfer once, balances follow from the log"))
        print("  data files (MiB): " + ", ".join(
            f"{os.path.basename(dp)} {os.path.getsize(os.path.join(dp, 'data.mdb')) >> 20}"
            for dp, _, fs in sorted(os.walk(data_dir)) if "data.mdb" in fs)
            + (f"; each map opened at {map_mib}" if map_mib else ""))
        print(f"  linearizable: {res['valid']} ({res['keys']} registers"
              + (f"; gave up on {list(res['unknown'])}" if res["unknown"] else "") + ")")
        for k, why in list(res["failures"].items())[:3]:
            print(f"  VIOLATION on {k}: {why['reason']}: {why['op']}")
            _dump(hist.ops, k, why["op"])
        restarts_failed = [f for f in nem.failed if f.startswith("start ")]
        if res["valid"] is False or not converged or restarts_failed or bank_problems:
            rc = 1
    finally:
        rs.shutdown()
        ray.shutdown()
        for mnt in disks.values():
            disks_mod.umount(mnt)
    if rc:
        print(f"  the members' folders are kept in {data_dir}")
    else:
        shutil.rmtree(data_dir, ignore_errors=True)
    return rc


def _dump(ops, key, bad, around_s=3.0):
    """The operations on ``key`` within ``around_s`` of the violating one."""
    t = bad.call
    for o in sorted((o for o in ops if o.key == key), key=lambda o: o.call):
        if abs(o.call - t) <= around_s or (o.ret != INF and abs(o.ret - t) <= around_s):
            ret = "unknown" if o.ret == INF else f"{o.ret - t:+.3f}"
            print(f"    {o.call - t:+.3f} .. {ret}  client {o.client} {o.kind} {o.arg} -> {o.ok}"
                  + (f"  {o.info.get('err', '')}" if o.info else "")
                  + ("   <== this one" if o is bad else ""))


if __name__ == "__main__":
    main()
