"""The oplog archive's effect on write throughput, measured in one run.

Two replica sets side by side on the same Ray instance, the same shape
(``RAYMX_BENCH_MEMBERS``, 3 by default: the archive writes only
majority-committed entries, so the majority point must move as in a real
set), one archiving (``set_archive``, ``lag_s`` 1 s: a Parquet segment of
the new entries at most every second, on the primary's trimmer thread) and
one not. The same driver writes ``insert_many`` batches of 1,000 ~200-byte
documents (w=1) into them in alternating rounds, so the machine's load
drifts over both alike; each round's rate, the median per set, and the
ratio archive on / off (target >= 0.9). Then the archive's own cost: CPU
milliseconds per 1,000 ops archived, bytes per op on disk, and that it holds
every entry written. Prints figures; asserts nothing. ``RAYMX_BENCH_SECONDS``
(a round's length, 8), ``RAYMX_BENCH_ROUNDS`` (3).
"""
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from _util import docs, progress, row  # noqa: E402

N = 20_000  # distinct documents (written again and again under new _ids)
SECONDS = float(os.environ.get("RAYMX_BENCH_SECONDS", "8"))
ROUNDS = int(os.environ.get("RAYMX_BENCH_ROUNDS", "3"))
MEMBERS = int(os.environ.get("RAYMX_BENCH_MEMBERS", "3"))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def write_round(rs, start, all_docs, seconds) -> tuple[float, int]:
    """Write batches for ``seconds``; (docs/s, next _id)."""
    coll = rs.client()["b"]["w"]
    batches = [all_docs[i:i + 1000] for i in range(0, len(all_docs), 1000)]
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        b = batches[(n // 1000) % len(batches)]
        coll.insert_many([dict(d, _id=start + n + k) for k, d in enumerate(b)])
        n += len(b)
    return n / (time.perf_counter() - t0), start + n


def main():
    import ray

    import raymx
    from raymx.storage import archive as A
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    tmp = tempfile.mkdtemp(prefix="raymx-bench-archive-")
    folder = os.path.join(tmp, "archive")
    sets = {}
    try:
        for name in ("off", "on"):
            sets[name] = raymx.ReplicaSet.launch(f"barch-{name}", members=MEMBERS,
                                                 data_dir=os.path.join(tmp, name),
                                                 placement="pack")
        sets["on"].set_archive(folder, lag_s=1.0)
        payload = docs(N)
        nxt = {"off": 0, "on": 0}
        rates = {"off": [], "on": []}
        lags = []  # entries written but not archived yet, right after each "on" round
        on = sets["on"]
        prim = on.wait_for_primary()
        for r in range(ROUNDS):
            for name in (("off", "on") if r % 2 == 0 else ("on", "off")):
                progress(f"round {r + 1}/{ROUNDS}: archive {name}")
                x, nxt[name] = write_round(sets[name], nxt[name], payload, SECONDS)
                rates[name].append(x)
                if name == "on":
                    st = on.status_of(prim)
                    t = st["oplog"]["archive"]["through"]
                    lags.append(st["last"][1] - (t[1] if t else 0))
        print(f"insert_many 1,000 x ~200 B, w=1, {MEMBERS} members, {ROUNDS} rounds of "
              f"{SECONDS:.0f} s a set")
        for name in ("off", "on"):
            row(f"archive {name}: rounds " + ", ".join(f"{x:,.0f}" for x in rates[name]),
                statistics.median(rates[name]), "docs/s", "median")
        off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
        row("archive on / off", on / off * 100, "%", "target >= 90 %")
        # the archive catches up (at most lag_s after the last write) and holds all
        rs = sets["on"]
        last = rs.client()["b"]["w"].insert_one({"_id": "end"}, w="majority").gtid
        t0 = time.time()
        deadline = time.time() + 60
        while time.time() < deadline:
            ar = rs.status_of(rs.wait_for_primary())["oplog"]["archive"]
            if ar["through"] and ar["through"][1] >= last.seq:
                break
            time.sleep(0.2)
        caught_up = time.time() - t0
        w = ar["written"]
        row("archive: entries not yet archived after each round (1,000 ops each)",
            max(lags), "entries", f"{lags}; all archived {caught_up:.1f}s after the last "
            "write (it yields to writes)")
        with open(os.path.join(folder, A.INDEX), "rb") as f:
            idx = A.parse_index(f.read())
        total = sum(x["rows"] for x in idx["segments"])
        size = sum(os.path.getsize(os.path.join(folder, x["file"])) for x in idx["segments"])
        row("archive: ops archived", total, "ops",
            f"{len(idx['segments'])} segments, through {ar['through']} (last write "
            f"{list(last)}); writer terms {sorted({x['term'] for x in idx['segments']})}")
        cpu_op = w["cpu_ms"] / max(w["rows"], 1) * 1000  # us per op
        row("archive: CPU per op (its worker process)", cpu_op * 1000, "ns",
            f"{w['cpu_ms'] / 1000:.1f} s CPU, {w['ms'] / 1000:.1f} s wall, for the "
            f"{w['rows']:,} ops this primary archived: at most {1e6 / cpu_op:,.0f} ops/s "
            "per core")
        row("writes: CPU per doc, every process (archive off, busiest round)",
            2 * 1e9 / max(rates["off"]), "ns", "2 cores / that round's rate: an upper bound")
        row("archive: bytes on disk per op", size / max(total, 1), "B", "zstd Parquet")
    finally:
        for rs in sets.values():
            rs.shutdown()
        ray.shutdown()
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
