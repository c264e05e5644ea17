"""Power loss under raymx members, with LazyFS (issue 24 part 1).

Each member's data folder is its own LazyFS mount (LazyFS keeps every write
in its cache until fsync). Writers run (``j=True`` and ``w="majority"``);
at random points the harness crashes members, then checks them:

- power loss: SIGSTOP every process of the member(s) (the shard, producer
  and applier Ray actors; a stopped process writes nothing more), drop the
  mount's unsynced writes (``lazyfs::clear-cache``), SIGKILL the processes;
- process crash: SIGKILL only (the unsynced writes stay, as in the OS cache).

Ray restarts the killed actors over their folders (every member actor has
unlimited restarts), as after a crash. After every restart, every member's
folder is checked through raymx's storage API (``checks.py``, in a child
process): it opens, ``verify_oplog`` passes, the crashed members' indexes
equal the indexes rebuilt from their documents, and every acknowledged
write is stored: on a single member
every acknowledged ``j=True`` and majority write, on the 3-member set every
acknowledged majority write on every member once it caught up.

Needs root, FUSE (``/dev/fuse``, fuse3) and a LazyFS binary built from
https://github.com/dsrhaslab/lazyfs (see its README); never runs in CI:

    sudo env RAY_AUTH_MODE=disabled PYTHONPATH=. .venv/bin/python \\
        bench/faults/powerloss.py --lazyfs ~/lazyfs/lazyfs/build/lazyfs --cycles 100

Dropping every unsynced write at once leaves exactly what the last fsync
covered; ``torn.py`` covers the other half of a power loss (some unsynced
pages written back, in any order).

Prints one line per crash and a summary: crash points tried, corruptions
found, acknowledged writes lost and checked, and the wall time.
Exit code 0 when nothing was found, 1 when something was, 2 when a
prerequisite is missing.
"""
from __future__ import annotations

import os
import random
import shutil
import signal
import sys
import threading
import time

import click

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Ledger, check_folder_isolated  # noqa: E402
from lazyfs import LazyFS, missing_prerequisites, unmount_under  # noqa: E402

NS_DB, NS_COLL = "pl", "docs"
NS = f"{NS_DB}.{NS_COLL}"
CATCH_UP_S = 90.0


def say(msg: str) -> None:
    print(msg, flush=True)


# --- writers ------------------------------------------------------------------
class Writers:
    """Writer threads, each its own client and write concern, recording every
    acknowledged write in the ledger (after the acknowledgement)."""

    def __init__(self, rs, ledger: Ledger, kinds: dict, seed: int, rate: float):
        self.rs, self.ledger, self.kinds = rs, ledger, kinds
        self.gap = 1.0 / rate if rate > 0 else 0.0
        self.stop = threading.Event()
        self.failed = 0  # refused, timed out or unknown: not acknowledged, not checked
        self.threads = [threading.Thread(target=self._run, args=(tag, wc, seed + k),
                                         daemon=True, name=f"writer-{tag}")
                        for k, (tag, wc) in enumerate(kinds.items())]

    def start(self):
        for t in self.threads:
            t.start()

    def _run(self, tag: str, wc: dict, seed: int):
        rnd = random.Random(seed)
        coll = self.rs.client(timeout_s=20, wtimeout_ms=20_000, **wc)[NS_DB][NS_COLL]
        i = 0
        while not self.stop.is_set():
            i += 1
            if self.gap:
                time.sleep(rnd.uniform(0, 2 * self.gap))
            try:
                r = rnd.random()
                if r < 0.15:  # a counter: $set n = i, the stored n never below an acked i
                    coll.update_one({"_id": f"ctr-{tag}"}, {"$set": {"n": i}}, upsert=True)
                    self.ledger.counter(NS, f"ctr-{tag}", "n", i)
                elif r < 0.2:  # a batch: all or nothing, acknowledged together
                    batch = [self._doc(tag, f"{i}.{b}", rnd) for b in range(rnd.randint(2, 10))]
                    coll.insert_many(batch)
                    for d in batch:
                        self.ledger.doc(NS, d)
                else:
                    d = self._doc(tag, str(i), rnd)
                    coll.insert_one(d)
                    self.ledger.doc(NS, d)
            except Exception:
                self.failed += 1
                time.sleep(0.05)

    @staticmethod
    def _doc(tag: str, i: str, rnd: random.Random) -> dict:
        # sizes from a few bytes to several LMDB pages (overflow pages)
        pad = "x" * (rnd.choice((0, 50, 300, 1500)) if rnd.random() < 0.9
                     else rnd.randint(4000, 20000))
        return {"_id": f"{tag}-{i}", "w": tag, "seq": i, "u": f"{tag}:{i}",
                "tags": [rnd.randrange(7), f"t{rnd.randrange(3)}"], "pad": pad}

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join(60)


# --- processes ----------------------------------------------------------------
def member_pids(ray, rs, m: int) -> list[int]:
    from raymx.actors.process import actor_name
    from raymx.members import NAMESPACE
    hs = [ray.get_actor(actor_name(rs.name, m, r), namespace=NAMESPACE)
          for r in ("", "producer", "applier")]
    return ray.get([h.pid.remote() for h in hs], timeout=30)


def wait_back(ray, rs, m: int, old: list[int], timeout_s: float) -> list[int]:
    """The member's actors answer again from new processes."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            pids = member_pids(ray, rs, m)
            if not set(pids) & set(old):
                return pids
        except Exception:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"member {m} did not come back within {timeout_s}s")
        time.sleep(0.1)


def _threads_stopped(pid: int) -> bool:
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, IndexError):
            continue
        if state not in ("T", "t", "Z", "X"):
            return False
    return True


def freeze(pids: list[int], timeout_s: float = 10.0) -> bool:
    """SIGSTOP, and wait until every thread is stopped (a thread inside a file
    system call stops when it returns): nothing more reaches the disk."""
    for p in pids:
        os.kill(p, signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s
    while not all(_threads_stopped(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


# --- one configuration -------------------------------------------------------
MODES = {  # mode: (weight, power loss?, all members?)
    1: {"power": (3, True, False), "process": (1, False, False)},
    3: {"power-one": (4, True, False), "power-all": (3, True, True),
        "process-one": (2, False, False)},
}


def run_config(ray, binary: str, work: str, members: int, cycles: int, seed: int,
               pause: tuple[float, float], rate: float) -> dict:
    import raymx
    rnd = random.Random(seed)
    name = f"pl{members}x{os.getpid()}"
    base = os.path.join(work, name)
    data = os.path.join(base, "data")
    mounts = [LazyFS(binary, base, f"m{i}", os.path.join(data, f"m{i}")) for i in range(members)]
    stats = {"config": f"{members} member{'s' if members > 1 else ''}", "cycles": 0,
             "modes": {}, "corrupt": [], "lost": [], "checks": 0, "checked": 0,
             "dropped": 0, "restart_s": [], "check_s": [], "failed": 0}
    rs = writers = None
    t0 = time.monotonic()
    try:
        for lz in mounts:
            lz.start()
        rs = raymx.ReplicaSet.launch(name, members=members, data_dir=data, placement="pack")
        c = rs.client(w="majority", timeout_s=60)[NS_DB][NS_COLL]
        c.create_index("u", unique=True)
        c.create_index([("w", 1), ("seq", -1)])
        c.create_index("tags")
        kinds = ({"j": {"w": 1, "j": True}, "m": {"w": "majority"}} if members == 1 else
                 {"m": {"w": "majority"}, "mj": {"w": "majority", "j": True}})
        ledger = Ledger()
        writers = Writers(rs, ledger, kinds, seed, rate)
        writers.start()
        modes = MODES[members]
        names, weights = list(modes), [modes[m][0] for m in modes]
        for cyc in range(1, cycles + 1):
            time.sleep(rnd.uniform(*pause))  # the crash point: wherever the writers are
            mode = rnd.choices(names, weights)[0]
            _, power, every = modes[mode]
            if every or members == 1:
                victims = list(range(members))
            else:
                prim = rs.status().get("primary")
                victims = [prim if prim is not None and rnd.random() < 0.5
                           else rnd.randrange(members)]
            pids = {m: member_pids(ray, rs, m) for m in victims}
            allp = [p for ps in pids.values() for p in ps]
            dropped = 0
            if power:
                if not freeze(allp):
                    say(f"  cycle {cyc}: some thread did not stop within 10 s; "
                        "clearing anyway")
                for m in victims:
                    dropped += mounts[m].unsynced_bytes() or 0
                    mounts[m].clear_cache()
            for p in allp:
                os.kill(p, signal.SIGKILL)
            t1 = time.monotonic()
            for m in victims:
                wait_back(ray, rs, m, pids[m], 180)
            rs.wait_for_primary(120)
            restart_s = time.monotonic() - t1
            t2 = time.monotonic()
            res = check_members(rs, data, members, ledger, rebuild=victims)
            stats["check_s"].append(time.monotonic() - t2)
            stats["cycles"] += 1
            stats["modes"][mode] = stats["modes"].get(mode, 0) + 1
            stats["dropped"] += dropped
            stats["restart_s"].append(restart_s)
            bad = []
            for fc in res:
                stats["checks"] += 1
                stats["checked"] += fc.checked
                if fc.problems:
                    stats["corrupt"].append((cyc, mode, fc.path, fc.problems[:5]))
                    bad.append(f"CORRUPT {fc.path}: {fc.problems[:3]}")
                if fc.missing:
                    stats["lost"].append((cyc, mode, fc.path, fc.missing[:5], len(fc.missing)))
                    bad.append(f"LOST {len(fc.missing)} acknowledged at {fc.path}: "
                               f"{fc.missing[:3]}")
            say(f"  cycle {cyc:3d}/{cycles} {mode:11s} members {victims}: "
                f"{dropped:>9,} unsynced bytes dropped, back in {restart_s:5.1f} s; "
                f"{res[0].oplog_entries} oplog entries, {res[0].documents} docs, "
                f"{ledger.acked} acknowledged; "
                + ("ok" if not bad else "; ".join(bad)))
        writers.close()
        writers_failed = writers.failed
        writers = None
        # the last word: every member once more, with the writers stopped
        for fc in check_members(rs, data, members, ledger, rebuild=range(members)):
            stats["checks"] += 1
            stats["checked"] += fc.checked
            if fc.problems:
                stats["corrupt"].append(("final", "-", fc.path, fc.problems[:5]))
            if fc.missing:
                stats["lost"].append(("final", "-", fc.path, fc.missing[:5], len(fc.missing)))
        stats["acked"] = ledger.acked
        stats["failed"] = writers_failed
    finally:
        if writers is not None:
            writers.close()
        if rs is not None:
            try:
                rs.shutdown()
            except Exception as e:
                say(f"  shutdown: {e!r}")
        for lz in mounts:
            lz.stop()
    stats["wall_s"] = time.monotonic() - t0
    return stats


def check_members(rs, data: str, members: int, ledger: Ledger, rebuild) -> list:
    """Check every member's folder (the index rebuild only on the members in
    ``rebuild``: the crashed ones); on the set, a member missing acknowledged
    majority writes is given CATCH_UP_S to catch up (rechecked without the
    index rebuild meanwhile) before they count as lost."""
    view = ledger.view()  # before any read: all of it was acknowledged before
    out = []
    for m in range(members):
        path = os.path.join(data, f"m{m}")
        fc = check_folder_isolated(path, view, indexes=m in rebuild)
        deadline = time.monotonic() + (CATCH_UP_S if members > 1 else 0)
        while fc.missing and not fc.problems and time.monotonic() < deadline:
            time.sleep(0.5)
            again = check_folder_isolated(path, view, indexes=False)
            fc.missing, fc.problems = again.missing, fc.problems + again.problems
        out.append(fc)
    return out


def report(s: dict) -> None:
    rst = sorted(s["restart_s"]) or [0]
    say(f"\n== {s['config']}: {s['cycles']} crash points tried "
        f"({', '.join(f'{k} {v}' for k, v in s['modes'].items())}), wall {s['wall_s']:.0f} s")
    say(f"   unsynced bytes dropped by power losses: {s['dropped']:,}")
    say(f"   restart to checked: median {rst[len(rst) // 2]:.1f} s, max {rst[-1]:.1f} s "
        f"(check median {sorted(s['check_s'] or [0])[len(s['check_s']) // 2]:.1f} s)")
    say(f"   acknowledged writes: {s.get('acked', 0):,} (+{s['failed']:,} not acknowledged, "
        f"unchecked); {s['checks']} folder checks covered {s['checked']:,} acknowledged writes")
    say(f"   corruptions found: {len(s['corrupt'])}; folder checks with lost acknowledged "
        f"writes: {len(s['lost'])} ({sum(x[4] for x in s['lost'])} writes)")
    for x in s["corrupt"][:10]:
        say(f"   CORRUPT cycle {x[0]} ({x[1]}) {x[2]}: {x[3]}")
    for x in s["lost"][:10]:
        say(f"   LOST cycle {x[0]} ({x[1]}) {x[2]}: {x[4]} writes, e.g. {x[3]}")


HELP = """Power loss under raymx members, with LazyFS (issue 24 part 1).

Each member's data folder is its own LazyFS mount under --work. Writers run
(j=True and w="majority") while, at random points, members crash:

\b
- power loss: SIGSTOP the member's processes (its shard, producer and
  applier Ray actors), drop the mount's unsynced writes
  (lazyfs::clear-cache), SIGKILL them;
- process crash: SIGKILL only (unsynced writes stay, as in the OS cache).

Ray restarts the actors over their folders. After each restart every
member's folder must open, pass verify_oplog, hold indexes equal to indexes
rebuilt from its documents, and hold every acknowledged write (on the set:
every acknowledged majority write, once the member caught up).

Needs root, FUSE (/dev/fuse, fuse3) and a LazyFS binary built from
https://github.com/dsrhaslab/lazyfs (follow its README). Exit code 0: nothing
found; 1: corruption or lost acknowledged writes; 2: a prerequisite missing.
"""


@click.command(context_settings={"help_option_names": ["-h", "--help"]}, help=HELP)
@click.option("--lazyfs", "binary", envvar="RAYMX_LAZYFS", metavar="PATH",
              help="The LazyFS binary (lazyfs/build/lazyfs of a LazyFS built from "
                   "https://github.com/dsrhaslab/lazyfs); or RAYMX_LAZYFS.")
@click.option("--config", "which", type=click.Choice(["single", "set", "both"]),
              default="both", show_default=True,
              help="A single member, the 3-member set, or one after the other.")
@click.option("--cycles", default=100, show_default=True,
              help="Crash cycles per configuration.")
@click.option("--work", default="/tmp/raymx-powerloss", show_default=True,
              help="Where the mounts, LazyFS's own folders and logs go (emptied first).")
@click.option("--seed", type=int, default=None, help="Random seed (printed; default: time).")
@click.option("--rate", default=40.0, show_default=True,
              help="Writes per second per writer (about; 0: as fast as they go). Every check "
                   "rebuilds the crashed members' indexes from all documents: keep it modest.")
@click.option("--pause", nargs=2, type=float, default=(0.2, 2.0), show_default=True,
              help="Writers run a random time in this range (s) before each crash.")
def main(binary, which, cycles, work, seed, pause, rate):
    missing = missing_prerequisites(binary)
    if missing:
        say("powerloss: cannot run; missing:\n  - " + "\n  - ".join(missing))
        sys.exit(2)
    seed = int(time.time()) if seed is None else seed
    say(f"power-loss harness: seed {seed}, {cycles} cycles per configuration, LazyFS {binary}")
    if os.path.exists(work):
        unmount_under(work)
        shutil.rmtree(work)
    os.makedirs(work)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=200 * 1024**2)
    results = []
    try:
        for members in {"single": [1], "set": [3], "both": [1, 3]}[which]:
            say(f"\n-- {members} member(s)")
            results.append(run_config(ray, binary, work, members, cycles,
                                      seed + members, tuple(pause), rate))
    finally:
        ray.shutdown()
    for s in results:
        report(s)
    sys.exit(1 if any(s["corrupt"] or s["lost"] for s in results) else 0)


if __name__ == "__main__":
    main()
