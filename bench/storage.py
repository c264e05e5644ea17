"""Storage engine throughput against raw LMDB + msgpack, measured in one run.

Prints figures and ratios; asserts nothing (these machines are noisy).
"""
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
import lmdb  # noqa: E402
import msgpack  # noqa: E402

from _util import progress, rate, row  # noqa: E402
from raymx.storage.engine import Engine  # noqa: E402
from raymx.storage.lmdb_store import LMDBStore  # noqa: E402

N_BATCH = 100_000
N_SINGLE = 20_000


def docs(n, start=0):
    rnd = random.Random(start)
    # ~200 bytes packed
    return [{"_id": start + i, "name": f"user{start + i:08d}", "age": rnd.randrange(100),
             "city": rnd.choice(["Oslo", "Lima", "Pune", "Kyiv"]), "score": rnd.random(),
             "bio": "x" * 110} for i in range(n)]


def cpu_rate(n, fn):
    """(rate per wall second, CPU microseconds per item) of ``fn`` doing ``n`` items."""
    c0 = time.process_time()
    r = rate(n, fn)
    return r, (time.process_time() - c0) / n * 1e6


def raw_env(d):
    env = lmdb.open(d, map_size=1 << 32, max_dbs=4, sync=False, metasync=False)
    return env, env.open_db(b"docs")


def main():
    base = tempfile.mkdtemp(prefix="raymx-bench-")
    all_docs = docs(N_BATCH)
    print(f"doc size ~{len(msgpack.packb(all_docs[0]))} bytes; batches of 1,000; "
          f"load average {os.getloadavg()[0]:.1f} (CPU us per item printed beside each rate)")

    progress("raw LMDB batched puts")
    env, db = raw_env(os.path.join(base, "raw1"))

    def raw_batched():
        for i in range(0, N_BATCH, 1000):
            with env.begin(write=True) as t:
                for d in all_docs[i:i + 1000]:
                    t.put(msgpack.packb(d["_id"]), msgpack.packb(d), db=db)
    raw_b, raw_b_cpu = cpu_rate(N_BATCH, raw_batched)

    progress("engine insert_many (oplog + one index)")
    e = Engine(LMDBStore(os.path.join(base, "eng1")))
    with e.begin() as tx:
        tx.create_index("b.users", "age")

    def eng_batched():
        for i in range(0, N_BATCH, 1000):
            e.insert_many("b.users", all_docs[i:i + 1000])
    eng_b, eng_b_cpu = cpu_rate(N_BATCH, eng_batched)
    row("raw LMDB+msgpack batched puts", raw_b, "docs/s", f"{raw_b_cpu:.1f} us CPU/doc")
    row("engine insert_many, 1,000/batch, oplog + 1 index", eng_b, "docs/s",
        f"{eng_b_cpu:.1f} us CPU/doc; ratio {eng_b / raw_b:.2f}, by CPU "
        f"{raw_b_cpu / eng_b_cpu:.2f} (target >= 0.5)")

    progress("single-document transactions, no sync")
    singles = docs(N_SINGLE, start=10_000_000)
    env2, db2 = raw_env(os.path.join(base, "raw2"))

    def raw_single():
        for d in singles:
            with env2.begin(write=True) as t:
                t.put(msgpack.packb(d["_id"]), msgpack.packb(d), db=db2)
    raw_s, raw_s_cpu = cpu_rate(N_SINGLE, raw_single)
    e2 = Engine(LMDBStore(os.path.join(base, "eng2")))

    def eng_single():
        for d in singles:
            e2.insert_many("b.users", [d])
    eng_s, eng_s_cpu = cpu_rate(N_SINGLE, eng_single)
    row("raw LMDB put, one txn per doc, unsynced", raw_s, "txn/s", f"{raw_s_cpu:.1f} us CPU/txn")
    row("engine single-doc transaction, unsynced", eng_s, "txn/s",
        f"{eng_s_cpu:.1f} us CPU/txn; ratio {eng_s / raw_s:.2f}, by CPU "
        f"{raw_s_cpu / eng_s_cpu:.2f} (target >= 0.3)")

    progress("find by indexed field vs full scan")
    r = e.reader()
    q = 1000
    ix = rate(q, lambda: [list(r.find("b.users", {"age": a % 100, "city": "Oslo"}))
                         for a in range(q)])
    scan = rate(5, lambda: [list(r.find("b.users", {"city": "nope"})) for _ in range(5)])
    row("find by indexed field (~1,000 examined, ~250 returned)", ix, "queries/s")
    row("find needing a full scan of 100,000 docs", scan, "queries/s",
        f"index speed-up {ix / scan:.0f}x")
    r.t.abort()


if __name__ == "__main__":
    main()
