"""Failover: kill the primary's processes while clients write; time to the first
w="majority" write on the new primary, and majority writes lost (must be 0).

Prints figures; asserts nothing. ``python bench/failover.py [trials per way of killing]``
(default 10 + 10 = 20 trials).
"""
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import ray  # noqa: E402

import raymx  # noqa: E402
from _util import progress  # noqa: E402


def member_pids(rs, m):
    hs = [ray.get_actor(f"{rs.name}/m{m}" + (f"/{r}" if r else ""), namespace="raymx")
          for r in ("", "producer", "applier")]
    return ray.get([h.__ray_call__.remote(lambda self: os.getpid()) for h in hs])


def main(trials: int = 20) -> None:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    rs = raymx.ReplicaSet.launch("fobench", members=3, data_dir=tempfile.mkdtemp())
    client = rs.client(w="majority", wtimeout_ms=10_000, timeout_s=60)
    coll = client["b"]["w"]
    acked, lock = [], threading.Lock()
    stop = threading.Event()
    first_after = {}

    def writer(k):
        i = 0
        while not stop.is_set():
            i += 1
            try:
                r = coll.insert_one({"_id": f"{k}-{i}"})
            except raymx.errors.RaymxError:
                continue  # refused or outcome unknown: not acknowledged
            now = time.time()
            with lock:
                acked.append(f"{k}-{i}")
                # the first majority write of the new primary (a higher term): the
                # old one may still acknowledge a write or two while it dies
                if "kill" in first_after and "t" not in first_after and \
                        r.gtid.term > first_after["term"]:
                    first_after["t"] = now

    ts = [threading.Thread(target=writer, args=(k,), daemon=True) for k in range(3)]
    for t in ts:
        t.start()
    times = {"actor killed (ray.kill, no restart)": [],
             "processes SIGKILLed (Ray restarts them)": []}
    try:
        for trial in range(2 * trials):
            sig = trial % 2 == 1
            old = rs.wait_for_primary()
            pids = member_pids(rs, old) if sig else None
            time.sleep(0.3)
            term = rs.status()["term"]
            with lock:
                first_after.clear()
                first_after["term"] = term
                first_after["kill"] = time.time()
            if sig:
                for pid in pids:
                    os.kill(pid, 9)
            else:
                rs.kill_member(old)
            while "t" not in first_after:
                time.sleep(0.005)
            # the first acknowledged majority write after the kill came from the new primary
            took = first_after["t"] - first_after["kill"]
            times[list(times)[int(sig)]].append(took)
            progress(f"trial {trial + 1}/{2 * trials}: member {old} "
                     f"{'SIGKILLed' if sig else 'killed'}, first majority write after "
                     f"{took * 1000:.0f} ms")
            if not sig:
                rs.start_member(old)
            deadline = time.time() + 60
            while time.time() < deadline:
                st = rs.status()["members"]
                # back in the set and caught up to within a moment of writes
                if all(m["state"] == "running" and m.get("lag") is not None
                       and m["lag"] < 200 for m in st):
                    break
                time.sleep(0.1)
    finally:
        stop.set()
        for t in ts:
            t.join(60)
    have = {d["_id"] for d in rs.client()["b"]["w"].find({})}
    lost = [x for x in acked if x not in have]
    print("failover, 3 members, 3 writers with w=majority; kill -> first majority write on "
          "the new primary (target median < 500 ms both ways; MongoDB's default election timeout "
          "alone is 10,000 ms):")
    for how, ts_ in times.items():
        ts_.sort()
        p95 = ts_[min(len(ts_) - 1, int(round(0.95 * (len(ts_) - 1))))]
        print(f"  {how:<42} {len(ts_)} trials: median {statistics.median(ts_) * 1000:.0f} ms,"
              f" p95 {p95 * 1000:.0f} ms, max {ts_[-1] * 1000:.0f} ms")
    print(f"  acknowledged majority writes: {len(acked)}, lost: {len(lost)} (must be 0)")
    rs.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)  # trials per way of killing
