"""Replication on a three-member set: lag under load and secondary catch-up, in one run.

Measures, with ~200-byte documents (same shape as bench/commit.py):

1. the primary's maximum single-document commit rate: default write concern
   (w=1, j=False), two client processes each keeping 16 single-document
   inserts in flight on its connection, for 3 s, with both secondaries
   replicating meanwhile (how far behind they end up is printed too);
2. replication lag (commit on the primary to durable on a secondary) p50/p99
   under an open-loop load at half that rate (method in ``lag_phase``), and
   the same at a light 100 writes/s for reference;
3. secondary catch-up: pause one secondary's producer, commit 100,000
   single-document transactions on the primary (pipelined on one connection),
   unpause, and time until that secondary has applied them all. Printed as
   transactions/s, as a ratio to (1), and against raw LMDB batched puts of
   the same documents (py-lmdb + msgpack, 1,000 puts per transaction).

Prints figures and ratios; asserts nothing (these machines are noisy). Each
phase also prints how busy the machine was and how much of it other programs
took, since that moves every figure here. Progress lines go to stderr. ``RAYMX_BENCH_CATCHUP_N`` overrides 100,000.
"""
import gc
import os
import random
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

# Keep the module top light: "spawn" children import it again.
from _util import docs, make_doc, progress, raw_batched_rate, row  # noqa: E402

MAX_CLIENTS = 2            # client processes for the maximum commit rate ...
MAX_WINDOW = 16            # ... each with this many inserts in flight (pipelined)
MAX_S = 3.0                # seconds of the maximum-rate measurement
LAG_S = 6.0                # seconds of paced load for the lag measurement
LAG_WARMUP_S = 0.5         # the first writes of the paced load are not counted
LIGHT_HZ = 100             # a second, light paced load: the replication path's floor
CATCHUP_N = int(os.environ.get("RAYMX_BENCH_CATCHUP_N", 100_000))
LOAD_WINDOW = 256          # pipelined requests in flight while building the backlog
NS = "bench.repl"
# Elections are not under test here. With the default heartbeat_timeout_ms
# (1,000) a busy 2-core machine can miss heartbeats during the 100,000-write
# burst and the coordinator deposes a healthy primary (seen in this benchmark's
# first runs); a longer timeout keeps the primary in place. A change of
# primary is still detected and reported.
HEARTBEAT_TIMEOUT_MS = 5000


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


# --- 1. maximum commit rate: client processes ---------------------------------
def max_rate_worker(k, topo, ns, cmd_q, res_q):
    """One client process: single-document inserts, default write concern, with
    MAX_WINDOW of them in flight on its connection (pipelined)."""
    from raymx.client import connect_member

    prim = next(m for m in topo["members"] if m["role"] == "primary")
    conn = connect_member(prim, topo["secret"])
    rnd = random.Random(k)
    i = (k + 1) * 1_000_000_000
    conn.request({"op": "insert", "ns": ns, "docs": [make_doc(i, rnd)]})  # warm up
    i += 1
    res_q.put(("ready", k))
    start_at, end_at = cmd_q.get()
    now = time.monotonic()
    if start_at > now:
        time.sleep(start_at - now)
    sem = threading.Semaphore(MAX_WINDOW)
    n = [0]

    def done(_f):
        if time.monotonic() <= end_at and _f.exception() is None:
            n[0] += 1
        sem.release()
    while time.monotonic() < end_at:
        d = make_doc(i, rnd)
        i += 1
        sem.acquire()
        conn.submit({"op": "insert", "ns": ns, "docs": [d]}).add_done_callback(done)
    for _ in range(MAX_WINDOW):
        sem.acquire()
    res_q.put(("done", n[0]))
    conn.close()


def max_commit_rate(topo, ns="bench.max"):
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    res_q = ctx.Queue()
    cmd_qs = [ctx.Queue() for _ in range(MAX_CLIENTS)]
    ps = [ctx.Process(target=max_rate_worker, args=(k, topo, ns, cmd_qs[k], res_q), daemon=True)
          for k in range(MAX_CLIENTS)]
    for p in ps:
        p.start()
    try:
        for _ in ps:
            tag, k = res_q.get(timeout=120)
            if tag != "ready":
                raise RuntimeError(f"client process {k} failed to start")
        start_at = time.monotonic() + 0.3  # synchronised start
        for q in cmd_qs:
            q.put((start_at, start_at + MAX_S))
        total = sum(res_q.get(timeout=MAX_S + 60)[1] for _ in ps)
    finally:
        for p in ps:
            p.join(10)
            if p.is_alive():
                p.terminate()
    return total / MAX_S


# --- 2. replication lag under a paced load ------------------------------------
def lag_phase(conn, hz, duration_s, first_id):
    """Open-loop paced single-document inserts, cycling w=1, w=2, w=3.

    Method. The primary acknowledges a ``w=1`` write right after its commit,
    a ``w=2`` write once the entry is durable on the primary and on at least
    one secondary (the secondary syncs the batch, then reports its durable
    position upstream with its next pull, and the primary releases the
    waiting writes), a ``w=3`` write once both secondaries have it durably.
    The three kinds alternate in one stream sent on a fixed schedule whether
    or not earlier writes have been answered (open loop: a slow answer cannot
    slow the load down and so hide its own delay). A w=1 write sent just
    before and one sent just after a w=2 write went through the same client,
    socket, request queue and commit at (nearly) the same moment, so::

        lag(w=2 write) = latency(w=2 write)
                         - mean latency(w=1 writes sent just before and after it)

    is that write's time from commit on the primary to "durable on the
    first secondary and known to the primary". It is an upper bound on
    commit-to-durable-on-a-secondary: it also holds the trip of the position
    report back to the primary. Subtracting the neighbours' latency rather
    than a global median keeps moments of queueing on the primary (which
    delay both kinds alike) out of the lag. ``w=3`` gives the same for the
    slower of the two secondaries.

    The neighbours' latency cancels delays on the client's side only if its
    receiving thread never stops: the cyclic garbage collector is off during
    the phase, since a full collection of this process's growing bookkeeping
    (a Future per write) took 50-100 ms here and stamped some answers late
    and not their neighbours, which showed up as replication lag.

    Returns ({w: [latency ms]}, {w: [lag ms]} for w in 2, 3, rate sent, errors).
    """
    gc.collect()
    gc.disable()
    try:
        return _lag_phase(conn, hz, duration_s, first_id)
    finally:
        gc.enable()


def _lag_phase(conn, hz, duration_s, first_id):
    n = int(hz * duration_s) // 3 * 3 + 1  # ends on a w=1 write
    batch = docs(n, start=first_id)
    reqs = [{"op": "insert", "ns": NS, "docs": [d], "w": 1 + i % 3, "wtimeout_ms": 30_000}
            for i, d in enumerate(batch)]
    sent = [0.0] * n
    done = [0.0] * n
    futs = []
    clock = time.perf_counter
    t0 = clock() + 0.05
    for i, req in enumerate(reqs):
        due = t0 + i / hz
        now = clock()
        if due > now:
            time.sleep(due - now)
        sent[i] = clock()
        f = conn.submit(req)
        f.add_done_callback(lambda _f, i=i: done.__setitem__(i, clock()))
        futs.append(f)
    send_span = clock() - t0
    errors_ = 0
    for f in futs:
        try:
            f.result(60)
        except Exception:
            errors_ += 1
    ok = [bool(done[i]) and futs[i].exception() is None for i in range(n)]
    lat = {1: [], 2: [], 3: []}
    lag = {2: [], 3: []}
    for i in range(n):
        if sent[i] - t0 < LAG_WARMUP_S or not ok[i]:
            continue
        ms = (done[i] - sent[i]) * 1000
        w = 1 + i % 3
        lat[w].append(ms)
        before, after = i - i % 3, i - i % 3 + 3  # the neighbouring w=1 writes
        if w > 1 and after < n and ok[before] and ok[after]:
            base = (done[before] - sent[before] + done[after] - sent[after]) / 2 * 1000
            lag[w].append(ms - base)
    return lat, lag, (n - 1) / send_span, errors_


def drain_time(ray, rs, prim_id, secs, timeout_s=120):
    """Entries each secondary is behind the primary now, and seconds until none is."""
    last = tuple(member_status(ray, rs, prim_id)["last"])
    behind = {m: last[1] - member_status(ray, rs, m)["applied"][1] for m in secs}
    t0 = time.perf_counter()
    wait_for(lambda: all(tuple(member_status(ray, rs, m)["applied"]) >= last for m in secs),
             timeout_s, 0.02)
    return behind, time.perf_counter() - t0


# --- 3. catch-up --------------------------------------------------------------
def load_pipelined(conn, batch, window):
    """Submit single-document inserts with ``window`` in flight; returns the last GTID."""
    sem = threading.Semaphore(window)
    last = [None]
    errs = []
    lock = threading.Lock()

    def on_done(f):
        sem.release()
        try:
            g = f.result()["gtid"]
        except Exception as e:
            errs.append(e)
            return
        with lock:
            if last[0] is None or tuple(g) > tuple(last[0]):
                last[0] = g
    futs = []
    for k, d in enumerate(batch):
        sem.acquire()
        f = conn.submit({"op": "insert", "ns": NS, "docs": [d]})
        f.add_done_callback(on_done)
        futs.append(f)
        if k % 20_000 == 19_999:
            progress(f"   {k + 1:,} submitted")
    for f in futs:
        try:
            f.result(120)
        except Exception:
            pass
    if errs:
        raise RuntimeError(f"{len(errs)} inserts failed, first: {errs[0]!r}")
    return tuple(last[0])


def member_pids(ray, rs, topo) -> dict:
    """{pid: "m1 shard (primary)"} for every member actor, for the CPU breakdown."""
    out = {}
    for m in topo["members"]:
        tag = "P" if m["role"] == "primary" else "S"
        for role in ("", "producer", "applier"):
            try:
                h = ray.get_actor(f"{rs.name}/m{m['id']}" + (f"/{role}" if role else ""),
                                  namespace="raymx")
                out[ray.get(h.pid.remote(), timeout=30)] = f"m{m['id']}{tag} {role or 'shard'}"
            except Exception:
                pass
    return out


def member_status(ray, rs, i):
    return ray.get(rs.member(i).status.remote(), timeout=30)


def wait_for(fn, timeout_s, every_s=0.01):
    deadline = time.monotonic() + timeout_s
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            return None
        time.sleep(every_s)




# --- noise: CPU used by processes outside this benchmark -----------------------
class CpuShare:
    """Machine CPU time (``/proc/stat``) against that of this process and its
    descendants (the Ray head, the members' actors, the client processes):
    how busy the machine was while a phase ran and how much of it other
    programs took. With ``labels`` ({pid: name}) it also breaks this
    benchmark's CPU down per named process (the members' actors). Linux only;
    quietly absent elsewhere."""

    labels: dict = {}

    def __init__(self):
        self.t0 = time.monotonic()
        self.a = self._sample()

    @staticmethod
    def _sample():
        try:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:9]]
            busy = sum(v) - v[3] - v[4]
            ppid, used = {}, {}
            for p in os.listdir("/proc"):
                if not p.isdigit():
                    continue
                try:
                    with open(f"/proc/{p}/stat") as f:
                        rest = f.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                ppid[int(p)] = int(rest[1])
                # utime + stime, plus that of its children that have ended
                used[int(p)] = sum(int(x) for x in rest[11:15])
            mine, todo = set(), [os.getpid()]
            while todo:
                x = todo.pop()
                mine.add(x)
                todo += [c for c, pp in ppid.items() if pp == x and c not in mine]
            return busy, {p: used[p] for p in mine}
        except OSError:
            return None

    def stop(self, per=None, unit="") -> str:
        """A summary; with ``per`` (a count), also this benchmark's CPU ms per unit,
        and per labelled process."""
        b = self._sample()
        if self.a is None or b is None:
            return ""
        hz = os.sysconf("SC_CLK_TCK")
        dt = time.monotonic() - self.t0
        busy = (b[0] - self.a[0]) / hz
        ours = sum(c - self.a[1].get(p, 0) for p, c in b[1].items()) / hz
        n = os.cpu_count() or 1
        extra = f", {ours * 1000 / per:.2f} ms of its CPU per {unit}" if per else ""
        out = (f"[CPU busy {busy / dt / n:.0%} of {n} cores, this benchmark "
               f"{ours / dt / n:.0%}{extra}, other programs "
               f"{max(0.0, busy - ours) / dt / n:.0%}; load average "
               f"{os.getloadavg()[0]:.1f}]")
        if per and self.labels:
            parts, named = [], 0.0
            for pid, name in sorted(self.labels.items(), key=lambda x: x[1]):
                c = (b[1].get(pid, 0) - self.a[1].get(pid, 0)) / hz
                named += c
                parts.append(f"{name} {c * 1e6 / per:.0f}")
            parts.append(f"rest {(ours - named) * 1e6 / max(per, 1):.0f}")
            out += f"\n    us of CPU per {unit}: " + ", ".join(parts)
        return out


def main():
    import msgpack

    t_start = time.perf_counter()
    base = tempfile.mkdtemp(prefix="raymx-bench-repl-")
    catchup_docs = docs(CATCHUP_N, start=50_000_000)
    print(f"doc size ~{len(msgpack.packb(catchup_docs[0]))} bytes; {os.cpu_count()} CPUs; "
          f"load average {os.getloadavg()[0]:.1f}; data in {base}")

    # The raw reference first, before Ray starts.
    progress(f"raw LMDB batched puts of the {CATCHUP_N:,} catch-up documents")
    cpu = CpuShare()
    raw_b = raw_batched_rate(os.path.join(base, "raw-batch"), catchup_docs)
    raw_cpu = cpu.stop()

    import ray

    import raymx
    from raymx.client import connect_member

    progress("ray.init")
    ray.init(address="local", num_cpus=2, include_dashboard=False,
             object_store_memory=100 * 1024**2, log_to_driver=False)
    progress("launch a three-member replica set")
    rs = raymx.ReplicaSet.launch("benchrepl", members=3, data_dir=os.path.join(base, "rs"),
                                 limits=raymx.Limits(heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS))
    res = {}
    try:
        topo = rs._topology()
        prim = next(m for m in topo["members"] if m["role"] == "primary")
        secs = sorted(m["id"] for m in topo["members"] if m["role"] == "secondary")
        laggard, other = secs[-1], secs[0]  # the laggard's producer is paused in part 3
        term0 = topo.get("term")
        CpuShare.labels = member_pids(ray, rs, topo)
        conn = connect_member(prim, topo["secret"])
        for i in range(200):  # warm up the connection and the w=3 path
            conn.request({"op": "insert", "ns": NS, "docs": [{"_id": f"warm{i}"}], "w": 3,
                          "wtimeout_ms": 30_000})

        # 1. the primary's maximum commit rate
        progress(f"max single-doc commit rate: {MAX_CLIENTS} client processes x "
                 f"{MAX_WINDOW} in flight, {MAX_S:.0f} s")
        cpu = CpuShare()
        max_r = max_commit_rate(topo)
        res["max"] = (max_r, cpu.stop(max_r * MAX_S, "write"))
        res["max_drain"] = drain_time(ray, rs, prim["id"], secs)

        # 2. lag at half of it
        hz = res["max"][0] / 2
        progress(f"lag under a paced load: {hz:,.0f} writes/s for {LAG_S:.0f} s "
                 "(w=1, w=2, w=3 in turn)")
        for k, rate_hz in enumerate((hz, LIGHT_HZ)):
            if k:
                progress(f"lag under a light paced load: {rate_hz:,.0f} writes/s for "
                         f"{LAG_S:.0f} s")
            cpu = CpuShare()
            lat, lag, sent_hz, lag_err = lag_phase(conn, rate_hz, LAG_S,
                                                   first_id=10_000_000 * (k + 1))
            res["lag" if not k else "light"] = (rate_hz, sent_hz, lat, lag, lag_err,
                                                cpu.stop(rate_hz * LAG_S, "write"))
            drain_time(ray, rs, prim["id"], secs)

        # 3. catch-up
        try:
            res["catchup"] = catch_up(ray, rs, conn, prim, laggard, other, catchup_docs)
        except Exception as e:  # e.g. the primary changed: report what we have
            res["catchup_error"] = f"{type(e).__name__}: {e}"
            progress(f"catch-up failed: {res['catchup_error']}")
        conn.close()
        topo = rs._topology()
        res["term"] = (term0, topo.get("term"), prim["id"], topo.get("primary"))
    finally:
        progress("shutdown")
        rs.shutdown()
        ray.shutdown()
    report(res, raw_b, raw_cpu)
    print(f"total run time {time.perf_counter() - t_start:.0f} s")


def catch_up(ray, rs, conn, prim, laggard, other, catchup_docs):
    """Pause ``laggard``'s producer, build the backlog, unpause, time the catch-up."""
    progress(f"catch-up: pause m{laggard}'s producer, commit {CATCHUP_N:,} txns")
    prod = ray.get_actor(f"{rs.name}/m{laggard}/producer", namespace="raymx")
    applier = ray.get_actor(f"{rs.name}/m{laggard}/applier", namespace="raymx")
    ray.get(prod.pause.remote(True, wait=True))  # returns once no batch is in flight
    before = member_status(ray, rs, laggard)
    b_last, b_applied = tuple(before["last"]), tuple(before["applied"])
    cpu = CpuShare()
    t0 = time.perf_counter()
    target = load_pipelined(conn, catchup_docs, LOAD_WINDOW)
    load = (CATCHUP_N / (time.perf_counter() - t0), cpu.stop(CATCHUP_N, "write"))
    backlog = target[1] - b_applied[1]
    # Nothing else replicates while the laggard catches up: the other secondary
    # has everything and the primary has synced it (so the feeder may ship it all).
    progress(f"backlog {backlog:,} entries; wait until m{other} has them all")
    wait_for(lambda: tuple(member_status(ray, rs, other)["applied"]) >= target, 300, 0.05)
    wait_for(lambda: tuple(member_status(ray, rs, prim["id"])["durable"]) >= target, 60, 0.05)
    a0 = ray.get(applier.status.remote())["applied_entries"]

    progress(f"unpause m{laggard}'s producer; time until it has applied {target}")
    cpu = CpuShare()
    t0 = time.perf_counter()
    ray.get(prod.pause.remote(False))
    t_written = t_applied = None
    next_note = t0 + 5
    while True:
        s = member_status(ray, rs, laggard)  # ~1 ms of the shard actor's time per poll
        now = time.perf_counter()
        if t_written is None and tuple(s["last"]) >= target:
            t_written = now - t0
        if tuple(s["applied"]) >= target:
            t_applied = now - t0
            break
        if now >= next_note:
            next_note += 5
            progress(f"   {now - t0:.0f} s: written {s['last'][1] - b_last[1]:,}, "
                     f"applied {s['applied'][1] - b_applied[1]:,} of {backlog:,}")
        if now - t0 > 600:
            raise TimeoutError(f"m{laggard} had not applied {target} after 600 s")
        time.sleep(0.01)
    cu_cpu = cpu.stop(target[1] - b_applied[1], "entry")
    applied_n = ray.get(applier.status.remote())["applied_entries"] - a0
    return {"backlog": backlog, "unwritten": target[1] - b_last[1], "t_written": t_written,
            "t_applied": t_applied, "applied_n": applied_n, "load": load, "cpu": cu_cpu}


def report(res, raw_b, raw_cpu):
    print()
    max_r, max_cpu = res["max"]
    row(f"primary max single-doc commit rate, w=1 ({MAX_CLIENTS} procs x {MAX_WINDOW})",
        max_r, "txn/s", max_cpu)

    behind, drain_s = res["max_drain"]
    print(f"  secondaries behind right after it: "
          + ", ".join(f"m{m} {n:,} entries" for m, n in behind.items())
          + f"; all applied {drain_s:.1f} s later")
    for key, what in (("lag", "half the max"), ("light", "light load")):
        hz, sent_hz, lat, lag, lag_err, lag_cpu = res[key]
        print()
        print(f"replication lag, paced load of {hz:,.0f} writes/s ({what}; sent at "
              f"{sent_hz:,.0f}/s; {lag_err} errors; first {LAG_WARMUP_S} s not counted)")
        print(f"  {lag_cpu}")
        print("  client latency, ms      p50      p99      max        n")
        for w in (1, 2, 3):
            xs = lat[w]
            print(f"  w={w}               {pct(xs, .5):8.2f} {pct(xs, .99):8.2f} "
                  f"{max(xs, default=float('nan')):8.2f} {len(xs):8,}")
        for w, who in ((2, "first secondary"), (3, "both secondaries")):
            p50, p99 = pct(lag[w], .5), pct(lag[w], .99)
            tgt = ""
            if w == 2 and key == "lag":
                tgt = f"  target p99 < 50 ms: {'met' if p99 < 50 else 'NOT met'}"
            print(f"  commit -> durable on {who:<17} p50 {p50:7.2f} ms  p99 {p99:7.2f} ms{tgt}")

    print()
    c = res.get("catchup")
    if c is None:
        print(f"secondary catch-up: not measured ({res.get('catchup_error')})")
    else:
        cu = c["backlog"] / c["t_applied"]
        load_r, load_cpu = c["load"]
        print(f"secondary catch-up: {c['backlog']:,} single-doc transactions behind "
              f"({c['unwritten']:,} of them not in its oplog yet)")
        row("primary commits while building it (1 conn, pipelined)", load_r, "txn/s",
            load_cpu)
        row("producer: pulled, checked, written, synced", c["unwritten"] / c["t_written"],
            "txn/s", f"all written after {c['t_written']:.1f} s")
        row("catch-up: unpause -> all applied", cu, "txn/s",
            f"{c['t_applied']:.1f} s; applier applied {c['applied_n']:,}")
        print(f"  {c['cpu']}")
        print(f"  ratio catch-up : primary max single-doc commit rate {cu / max_r:10.2f}"
              "   (target >= 2)")
        row("raw LMDB+msgpack batched puts, same docs, 1,000/txn", raw_b, "docs/s", raw_cpu)
        print(f"  ratio catch-up : raw LMDB batched puts              {cu / raw_b:10.3f}")
    t0_, t1_, p0_, p1_ = res["term"]
    if (t0_, p0_) != (t1_, p1_):
        print(f"NOTE: the primary changed during the run (term {t0_} -> {t1_}, "
              f"member {p0_} -> {p1_}); figures after that are suspect")


if __name__ == "__main__":
    main()
