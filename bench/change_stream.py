"""Change streams and oplog trimming on a three-member set, in one run.

1. Write throughput with trimming off against trimming on: the primary's
   maximum single-document commit rate (the method of bench/replication.py:
   two client processes, 16 inserts in flight each, 3 s), measured in rounds
   that alternate trimming off (no cap) and on (a cap far below what one round
   writes, so every member trims all along; the previous round's growth is
   trimmed before the round starts), on the same replica set.
   Printed per round, and the ratio of the medians (target >= 0.9).
2. Commit-to-delivery delay of majority-committed change events, p50/p99,
   under an open-loop paced load of single-document inserts (w=1) at half the
   trimming-off maximum (the half-load of bench/replication.py), and at a
   light 100 writes/s for reference. Two consumers run in a separate process
   (so they do not share the writer's interpreter): one streaming from the
   primary, one from a secondary. Delay = the consumer's wall clock when the
   event arrives minus the entry's commit timestamp (``ts``, ms, the primary's
   wall clock: same machine), so it includes waiting for the majority.

Prints figures and ratios; asserts nothing. Progress lines go to stderr.
"""
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from _util import docs, progress, row  # noqa: E402
from replication import (HEARTBEAT_TIMEOUT_MS, CpuShare, max_commit_rate,  # noqa: E402
                         pct)

ROUNDS = int(os.environ.get("RAYMX_BENCH_TRIM_ROUNDS", 5))
LAG_S = 6.0
LIGHT_HZ = 100
NS = "bench.cs"
CAP_BYTES = 1 << 20       # trimming on: far below one round's writes (~2 MB and up)


def consumer(topo, member, q, stop_at, ns):
    """Stream majority-committed events of ``ns`` from one member; report delays."""
    from raymx.client import connect_member
    m = next(x for x in topo["members"] if x["id"] == member)
    conn = connect_member(m, topo["secret"])
    tok = None
    delays = []
    q.put(("ready", member))
    while time.time() < stop_at:
        r = conn.request({"op": "watch", "after": tok, "namespaces": [ns], "wait_ms": 200}, 30)
        now = time.time() * 1000
        delays += [now - e["ts"] for e in r["events"]]
        tok = r["resume"]
    conn.close()
    q.put(("done", member, delays))


def paced(conn, hz, duration_s, first_id):
    n = int(hz * duration_s)
    batch = docs(n, start=first_id)
    futs = []
    t0 = time.perf_counter() + 0.05
    for i, d in enumerate(batch):
        due = t0 + i / hz
        now = time.perf_counter()
        if due > now:
            time.sleep(due - now)
        futs.append(conn.submit({"op": "insert", "ns": NS, "docs": [d]}))
    span = time.perf_counter() - t0
    errs = 0
    for f in futs:
        try:
            f.result(60)
        except Exception:
            errs += 1
    return n / span, errs


def delivery_phase(topo, conn, hz, secs, first_id):
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    prim = next(m["id"] for m in topo["members"] if m["role"] == "primary")
    members = [prim, secs[0]]
    stop_at = time.time() + LAG_S + 8
    ps = [ctx.Process(target=consumer, args=(topo, m, q, stop_at, NS), daemon=True)
          for m in members]
    for p in ps:
        p.start()
    for _ in ps:
        q.get(timeout=120)
    time.sleep(0.5)  # streams open: they start at the current majority point
    cpu = CpuShare()
    sent_hz, errs = paced(conn, hz, LAG_S, first_id)
    usage = cpu.stop(hz * LAG_S, "write")
    out = {}
    for _ in ps:
        msg = q.get(timeout=120)
        out[msg[1]] = msg[2]
    for p in ps:
        p.join(10)
    skip = int(hz * 0.5)  # the first half second is warm-up
    return {"hz": hz, "sent": sent_hz, "errors": errs, "cpu": usage,
            "primary": out[prim][skip:], "secondary": out[secs[0]][skip:],
            "n": {"primary": len(out[prim]), "secondary": len(out[secs[0]])},
            "want": int(hz * LAG_S)}


def main():
    t_start = time.perf_counter()
    base = tempfile.mkdtemp(prefix="raymx-bench-cs-")
    print(f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}; data in {base}")
    import ray

    import raymx
    from raymx.client import connect_member
    progress("ray.init")
    ray.init(address="local", num_cpus=2, include_dashboard=False,
             object_store_memory=100 * 1024**2, log_to_driver=False)
    progress("launch a three-member replica set (trimming off)")
    rs = raymx.ReplicaSet.launch(
        "benchcs", members=3, data_dir=os.path.join(base, "rs"),
        limits=raymx.Limits(heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS, trim_interval_ms=200),
        oplog_cap={"max_bytes": None})
    res = {"off": [], "on": []}
    try:
        topo = rs._topology()
        prim = next(m for m in topo["members"] if m["role"] == "primary")
        secs = sorted(m["id"] for m in topo["members"] if m["role"] == "secondary")
        conn = connect_member(prim, topo["secret"])
        for i in range(200):
            conn.request({"op": "insert", "ns": NS, "docs": [{"_id": f"warm{i}"}], "w": 3})

        # 1. throughput, trimming off / on in alternating rounds
        for r in range(ROUNDS):
            for mode in ("off", "on"):
                if mode == "on":
                    # trim the previous round's growth first: measure steady trimming
                    rs.set_oplog_cap(max_bytes=CAP_BYTES)
                    rs.trim_now()
                else:
                    rs.set_oplog_cap(max_bytes=None)
                time.sleep(0.5)
                progress(f"round {r + 1}/{ROUNDS}: max commit rate, trimming {mode}")
                ms0 = sum(m["oplog"]["trim_ms"] for m in rs.status()["members"])
                cpu = CpuShare()
                t0 = time.perf_counter()
                rate = max_commit_rate(topo, ns=f"bench.max{r}{mode}")
                span = time.perf_counter() - t0
                ol = [m["oplog"] for m in rs.status()["members"]]
                # the writers' time spent in trim transactions, all members together
                trim_ms = sum(o["trim_ms"] for o in ol) - ms0
                res[mode].append((rate, cpu.stop(), ol, trim_ms / 1000 / span))
        rs.set_oplog_cap(max_bytes=CAP_BYTES)  # trimming stays on for the delay phase

        # 2. commit-to-delivery of majority events at half the trimming-off maximum
        half = statistics.median(x[0] for x in res["off"]) / 2
        for k, hz in enumerate((half, LIGHT_HZ)):
            progress(f"change-stream delivery under {hz:,.0f} writes/s for {LAG_S:.0f} s "
                     "(consumers on the primary and a secondary)")
            res["half" if not k else "light"] = delivery_phase(topo, conn, hz, secs,
                                                               (k + 1) * 10_000_000)
        conn.close()
    finally:
        progress("shutdown")
        rs.shutdown()
        ray.shutdown()
    report(res)
    print(f"total run time {time.perf_counter() - t_start:.0f} s")


def report(res):
    print()
    for mode in ("off", "on"):
        for i, (rate, cpu, ol, share) in enumerate(res[mode]):
            row(f"max commit rate, trimming {mode}, round {i + 1}", rate, "writes/s", cpu)
            if mode == "on":
                print("    oplogs after the round (bytes / trimmed entries / held by): " + "; ".join(
                    f"{o['bytes']:,} / {o['trimmed']:,} / {o['held_by'] or '-'}" for o in ol)
                    + f"\n    trim transactions: {share * 100:.2f}% of the round's wall time "
                    "(all members' writers together)")
    off = statistics.median(x[0] for x in res["off"])
    on = statistics.median(x[0] for x in res["on"])
    spread = max(x[0] for x in res["off"]) / min(x[0] for x in res["off"])
    print(f"  ratio trimming on / off (medians of {len(res['on'])} rounds): {on / off:.2f}"
          f"   (target >= 0.90; trimming-off rounds alone vary {spread:.2f}x)")
    share = statistics.median(x[3] for x in res["on"])
    print(f"  time in trim transactions, median round: {share * 100:.2f}% of wall time: "
          f"the cost of trimming itself, separate from round-to-round noise")
    for key, what in (("half", "half the trimming-off max"), ("light", "light load")):
        d = res[key]
        print(f"\nchange-stream delivery, {what}: {d['hz']:,.0f} writes/s asked, "
              f"{d['sent']:,.0f} sent, {d['errors']} errors {d['cpu']}")
        for who in ("primary", "secondary"):
            xs, n = d[who], d["n"][who]  # delays timed past the first half second (warm-up)
            print(f"  consumer on the {who:<9}: {n:,} events delivered of {d['want']:,} "
                  f"written ({len(xs):,} timed), "
                  f"commit-to-delivery p50 {pct(xs, 0.5):6.1f} ms, p99 {pct(xs, 0.99):6.1f} ms, "
                  f"max {max(xs) if xs else float('nan'):6.1f} ms")


if __name__ == "__main__":
    main()
