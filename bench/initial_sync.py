"""Snapshot-based member creation against raw LMDB bulk-loading, in one run.

A one-member replica set (one secondary index) is loaded with ``N`` ~200-byte
documents (``RAYMX_BENCH_SYNC_N``, default 1,000,000). Then, timed:

1. the baseline: raw py-lmdb puts of the same documents, msgpack-packed,
   1,000 per transaction (``bench/_util.raw_batched_rate``, the baseline all
   benchmarks share), into a fresh environment;
2. ``rs.add_member(initial_sync="snapshot")`` end to end: start the member's
   actors, snapshot the primary (one read transaction), plan partitions,
   copy them between the members' actors (checksummed), bulk-load, verify
   every partition against the source's checksum, start replication at the
   snapshot's GTID, catch up and give the member its vote;
3. the same through Spark (``spark=``: Spark tasks read the partitions from
   the source's LMDB folder as of the snapshot's GTID, the target loads the
   runs), unless ``RAYMX_BENCH_SYNC_SPARK=0`` (the Spark session is started
   and warmed up before the clock starts: a user passes a running one);
4. with Spark: two far-behind members (the two just created, appliers held
   while the same ``E`` entries are written, ``RAYMX_BENCH_SYNC_REPLAY``,
   default 20,000, 0 skips it): one catches up through its applier's
   parallel replay, the other through ``spark_replay``.

Prints documents/s for each, the ratio to the baseline (target >= 0.3), the
Spark path's ratio to the Ray path (target >= 0.5; the same for the
replay), the copy's phases, and the CPU each path
used per document: every process of this run (driver, Ray, members, the
Spark JVMs and their Python workers) summed from /proc before and after,
less what the same processes use idle in as long, and the Spark processes'
share of it (what more Spark cores would run in parallel).
"""
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from _util import docs, progress, raw_batched_rate, row  # noqa: E402

N = int(os.environ.get("RAYMX_BENCH_SYNC_N", 1_000_000))
SPARK = os.environ.get("RAYMX_BENCH_SYNC_SPARK", "1") == "1"
NS = ("bench", "sync")
E = int(os.environ.get("RAYMX_BENCH_SYNC_REPLAY", 20_000))  # entries behind, 0: no replay part


def _cpu() -> tuple[float, float]:
    """CPU seconds (all, Spark's) of this process and every descendant,
    including what exited descendants left in their parents' counters."""
    import psutil
    me = psutil.Process()
    procs = [me] + me.children(recursive=True)
    java = set()
    for p in procs:
        try:
            if p.name().startswith("java") or (p.ppid() in java):
                java.add(p.pid)
        except psutil.Error:
            pass
    total = spark = 0.0
    for p in procs:
        try:
            c = p.cpu_times()
            s = c.user + c.system + c.children_user + c.children_system
        except psutil.Error:
            continue
        total += s
        if p.pid in java or any(a.pid in java for a in _parents(p)):
            spark += s
    return total, spark


def _parents(p):
    try:
        return p.parents()
    except Exception:
        return []


class CPU:
    """CPU used by this run's processes over a timed block, less the idle rate."""
    idle = (0.0, 0.0)  # CPU seconds per second when nothing runs

    @classmethod
    def measure_idle(cls, seconds=3.0):
        a, t0 = _cpu(), time.perf_counter()
        time.sleep(seconds)
        b, dt = _cpu(), time.perf_counter() - t0
        cls.idle = ((b[0] - a[0]) / dt, (b[1] - a[1]) / dt)

    def __enter__(self):
        self.a, self.t0 = _cpu(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        b = _cpu()
        self.seconds = time.perf_counter() - self.t0
        self.total = b[0] - self.a[0] - self.idle[0] * self.seconds
        self.spark = b[1] - self.a[1] - self.idle[1] * self.seconds


COPIES = []  # what each copy_snapshot returned (its phases)


def _record_copies():
    from raymx.spark_bridge import initial_sync as isync
    orig = isync.copy_snapshot

    def copy_snapshot(*a, **k):
        out = orig(*a, **k)
        COPIES.append(out)
        return out
    isync.copy_snapshot = copy_snapshot


def _phases(total_s: float) -> str:
    out = COPIES[-1]
    ph = {k: v for k, v in out["phases"].items()}
    txt = ", ".join(f"{k} {v:.1f} s" if isinstance(v, float) else f"{k} {v}"
                    for k, v in ph.items())
    return f"copy {out['seconds']:.1f} s ({txt}); start, catch-up, join {total_s - out['seconds']:.1f} s"


def main():
    import ray

    import raymx
    from raymx.storage.limits import Limits
    base = tempfile.mkdtemp(prefix="raymx-bench-sync-")
    progress(f"generating {N:,} documents")
    all_docs = docs(N)
    progress("baseline: raw LMDB batched puts of the same documents")
    raw = raw_batched_rate(os.path.join(base, "raw"), all_docs)

    _record_copies()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=1 << 30)
    # elections are not under test: a busy machine must not depose the primary
    rs = raymx.ReplicaSet.launch("syncbench", members=1, data_dir=os.path.join(base, "rs"),
                                 limits=Limits(heartbeat_timeout_ms=10_000))
    try:
        coll = rs.client(timeout_s=600)[NS[0]][NS[1]]
        coll.create_index("age")
        t0 = time.perf_counter()
        for i in range(0, N, 1000):
            coll.insert_many(all_docs[i:i + 1000])
            if i % 100_000 == 0:
                progress(f"loading the primary: {i:,}/{N:,}")
        load_rate = N / (time.perf_counter() - t0)
        del all_docs

        spark = None
        if SPARK:
            from raymx.spark_bridge import spark_session
            progress("starting Spark")
            spark = spark_session()
            spark.range(0, 2, 1, 2).mapInArrow(lambda bs: bs, "id long").count()  # warm
        CPU.measure_idle()
        progress("add_member(initial_sync='snapshot'), Ray path")
        with CPU() as ray_cpu:
            mid = rs.add_member(initial_sync="snapshot", progress=False)
        dt = ray_cpu.seconds
        st = {m["id"]: m for m in rs.status()["members"]}
        ok = st[mid]["state"] == "running" and st[mid]["applied"] == st[0]["last"]
        print(f"{N:,} documents (~200 bytes, one secondary index); "
              f"doc+index rows copied and checksummed")
        row("raw LMDB batched puts (baseline)", raw, "docs/s")
        row("primary load through the client (insert_many 1,000)", load_rate, "docs/s")
        ray_rate = N / dt
        row("snapshot member creation, end to end (Ray)", ray_rate, "docs/s",
            f"{dt:.1f} s, ratio {N / dt / raw:.2f} (target >= 0.3), caught up: {ok}")
        row("  CPU per document (all processes, idle rate subtracted)",
            ray_cpu.total / N * 1e6, "us", f"(idle {CPU.idle[0]:.2f} CPU-s/s)")
        print(f"    {_phases(dt)}")

        if spark is not None:
            progress("add_member(initial_sync='snapshot', spark=...), Spark path")
            with CPU() as sp_cpu:
                mid2 = rs.add_member(initial_sync="snapshot", spark=spark, progress=False)
            dt = sp_cpu.seconds
            st = {m["id"]: m for m in rs.status()["members"]}
            ok = st[mid2]["state"] == "running" and st[mid2]["applied"] == st[0]["last"]
            row("snapshot member creation, end to end (Spark job)", N / dt, "docs/s",
                f"{dt:.1f} s, ratio to raw {N / dt / raw:.2f}, to the Ray path "
                f"{N / dt / ray_rate:.2f} (target >= 0.5), caught up: {ok}")
            row("  CPU per document (all processes, idle rate subtracted)",
                sp_cpu.total / N * 1e6, "us",
                f"of which Spark's JVM + Python workers {sp_cpu.spark / N * 1e6:.2f} us")
            print(f"    {_phases(dt)}")
            if E:
                replay_bench(rs, spark, coll, [mid, mid2])
    finally:
        rs.shutdown()
        if SPARK:
            from raymx.spark_bridge import stop_spark
            stop_spark()
        ray.shutdown()


def replay_bench(rs, spark, coll, members):
    """Two far-behind members (appliers held while the same ``E`` entries are
    written): one catches up through its applier's parallel replay (no
    Spark), the other through ``spark_replay``."""
    import random

    from raymx.spark_bridge import spark_replay
    from raymx.spark_bridge.initial_sync import hold_applier
    progress(f"replay: writing {E:,} entries (10 ops each) behind two held members")
    for m in members:
        hold_applier(rs, m, True)
    rnd = random.Random(3)
    next_id = 10 ** 9
    for j in range(E):
        if j % 2:
            ids = [rnd.randrange(N) for _ in range(10)]
            coll.update_many({"_id": {"$in": ids}}, {"$set": {"score": rnd.random()}})
        else:
            coll.insert_many([{"_id": next_id + k, "age": k, "bio": "y" * 140}
                              for k in range(10)])
            next_id += 10
    last = rs.status_of(0)["last"]
    while any(rs.status_of(m)["last"] != last for m in members):
        time.sleep(0.1)

    def wait_applied(m):
        while rs.status_of(m)["applied"] != last:
            time.sleep(0.02)
    progress("replay without Spark (the applier's parallel replay)")
    with CPU() as a:
        hold_applier(rs, members[0], False)
        wait_applied(members[0])
    progress("replay as a Spark job (spark_replay)")
    with CPU() as b:
        out = spark_replay.spark_replay(spark, rs, members[1], progress=False)
        wait_applied(members[1])
    print(f"far-behind member: {E:,} entries (half insert_many of 10 new documents, half "
          "update_many of 10 by _id)")
    row("replay without Spark (applier, parallel replay)", E / a.seconds, "entries/s",
        f"{a.seconds:.1f} s, CPU {a.total / E * 1e6:.0f} us/entry")
    row("replay as a Spark job (spark_replay)", E / b.seconds, "entries/s",
        f"{b.seconds:.1f} s, ratio {a.seconds / b.seconds:.2f} (target >= 0.5), CPU "
        f"{b.total / E * 1e6:.0f} us/entry of which Spark {b.spark / E * 1e6:.0f}; "
        f"phases {', '.join(f'{k} {v:.1f} s' for k, v in out.get('phases', {}).items())}")


if __name__ == "__main__":
    main()
