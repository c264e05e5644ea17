"""Small helpers shared by the benchmarks: timing and a progress line."""
import random
import sys
import time


def make_doc(i, rnd):
    """A ~200-byte document (packed), the shape the commit and replication benches use."""
    return {"_id": i, "name": f"user{i:08d}", "age": rnd.randrange(100),
            "city": rnd.choice(["Oslo", "Lima", "Pune", "Kyiv"]), "score": rnd.random(),
            "bio": "x" * 140}


def docs(n, start=0):
    rnd = random.Random(start)
    return [make_doc(start + i, rnd) for i in range(n)]


def rate(n, fn, label=""):
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    return n / dt


def progress(msg):
    print(f"  .. {msg}", file=sys.stderr, flush=True)


def row(name, value, unit="", extra=""):
    print(f"{name:<58} {value:>12,.0f} {unit:<8} {extra}", flush=True)


def raw_batched_loop(path, all_docs):
    """The baseline: raw py-lmdb puts of msgpack-packed docs, 1,000 per txn, no
    sync. Returns the loop to time and its environment (close it after)."""
    import lmdb
    import msgpack
    env = lmdb.open(path, map_size=1 << 32, max_dbs=4, sync=False, metasync=False)
    db = env.open_db(b"docs")

    def go():
        for i in range(0, len(all_docs), 1000):
            with env.begin(write=True) as t:
                for d in all_docs[i:i + 1000]:
                    t.put(msgpack.packb(d["_id"]), msgpack.packb(d), db=db)
    return go, env


def raw_batched_rate(path, all_docs):
    go, env = raw_batched_loop(path, all_docs)
    r = rate(len(all_docs), go)
    env.close()
    return r
