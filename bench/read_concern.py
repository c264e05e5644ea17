"""Read concerns on a 3-member primary under half-load writes (issue 22).

``find_one`` by ``_id`` and a 1,000-document ``find`` at "local", "majority"
and "linearizable", in one run; each printed with its ratio to "local" (the
baseline measured in the same run). Target: "majority" at least 0.8 of local.
A writer thread runs meanwhile at half the rate one writer reached alone, so
the majority point trails the newest entry as it does in production.

Prints figures; asserts nothing. ``python bench/read_concern.py [seconds per level]``.
"""
import os
import random
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import ray  # noqa: E402

import raymx  # noqa: E402
from _util import docs, progress, row  # noqa: E402

N_DOCS = 10_000


def timed(fn, seconds: float) -> float:
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    return n / (time.perf_counter() - t0)


def main(seconds: float = 3.0) -> None:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    rs = raymx.ReplicaSet.launch("rcbench", members=3, data_dir=tempfile.mkdtemp())
    try:
        client = rs.client()
        coll = client["b"]["r"]
        progress(f"loading {N_DOCS:,} documents")
        for i in range(0, N_DOCS, 1000):
            coll.insert_many(docs(1000, i), w="majority")
        w = rs.client()["b"]["w"]
        k = [0]

        def one_write():
            k[0] += 1
            w.insert_one({"_id": k[0], "v": k[0]})
        full = timed(one_write, 1.0)
        progress(f"one writer alone: {full:,.0f} writes/s; reads run under {full / 2:,.0f}/s")
        stop = threading.Event()

        def writer():
            gap = 2.0 / full
            while not stop.is_set():
                t0 = time.perf_counter()
                one_write()
                time.sleep(max(0.0, gap - (time.perf_counter() - t0)))
        t = threading.Thread(target=writer, daemon=True)
        t.start()
        rnd = random.Random(7)
        print(f"read concern, {seconds:g} s per figure, under {full / 2:,.0f} writes/s "
              f"(3 members, this machine)")
        try:
            for what, op in (
                    ("find_one by _id", lambda c: c.find_one({"_id": rnd.randrange(N_DOCS)})),
                    ("find of 1,000 documents", lambda c: c.find(
                        {"_id": {"$gte": 5000}}, limit=1000, batch_size=1000).to_list())):
                base = None
                for level in ("local", "majority", "linearizable"):
                    c = coll.with_options(read_concern=level)
                    r = timed(lambda: op(c), seconds)
                    base = base or r
                    row(f"{what}, {level}", r, "reads/s",
                        f"{r / base:.2f}x local" + ("  (target >= 0.8)" if level == "majority"
                                                    else ""))
        finally:
            stop.set()
            t.join(10)
    finally:
        rs.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 3.0)
