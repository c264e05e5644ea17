"""Parallel replay against one-at-a-time apply of the same oplog range, in one run.

A primary (LMDB, one secondary index) commits ``N`` single-document entries
(``RAYMX_BENCH_REPLAY_N``, default 500,000) over 50,000 documents: 40% inserts
of new ~200-byte documents, 45% updates, 15% deletes, and a createIndex
command in the middle. Two fresh secondaries receive the same entries,
unapplied, the way the producer writes them. Then, timed:

1. one at a time: the applier applying each entry in its own LMDB transaction
   (``apply_batch`` with ``apply_batch_ops=1``), the way a member that is not
   far behind applies;
2. parallel replay (``raymx.storage.replay``): explode the ops, keep the last
   image per document, segment at the command, write in large key-ordered
   transactions, marking the range applied.

Both secondaries must end identical (checked). Prints entries/s for each and
the speedup. Asserts nothing else (these machines are noisy).
"""
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

from _util import make_doc, progress, row  # noqa: E402

from raymx.actors.core import replication as rep  # noqa: E402
from raymx.storage import replay  # noqa: E402
from raymx.storage.engine import Engine  # noqa: E402
from raymx.storage.limits import Limits  # noqa: E402
from raymx.storage.lmdb_store import LMDBStore  # noqa: E402

N = int(os.environ.get("RAYMX_BENCH_REPLAY_N", 500_000))
DOCS = 50_000
NS = "bench.replay"


def build_primary(path):
    e = Engine(LMDBStore(path))
    e.set_term(1)
    rnd = random.Random(7)
    live, next_id = [], 0
    with e.begin() as tx:
        tx.create_index(NS, "age")
    for i in range(N - 1):
        if i == N // 2:
            with e.begin() as tx:
                tx.create_index(NS, "city")
            continue
        r = rnd.random()
        with e.begin() as tx:
            if r < 0.4 or len(live) < 100:
                if next_id < DOCS or not live:
                    tx.insert(NS, [make_doc(next_id, rnd)])
                    live.append(next_id)
                    next_id += 1
                else:
                    k = live[rnd.randrange(len(live))]
                    tx.update(NS, {"_id": k}, {"$set": {"score": rnd.random()}})
            elif r < 0.85:
                k = live[rnd.randrange(len(live))]
                tx.update(NS, {"_id": k}, {"$set": {"age": rnd.randrange(100),
                                                     "score": rnd.random()}})
            else:
                j = rnd.randrange(len(live))
                live[j], live[-1] = live[-1], live[j]
                tx.delete(NS, {"_id": live.pop()})
                if rnd.random() < 0.9:  # keep the set growing
                    tx.insert(NS, [make_doc(next_id, rnd)])
                    live.append(next_id)
                    next_id += 1
        if i % 50_000 == 0:
            progress(f"primary: {i:,}/{N:,} entries")
    return e


def ship(p, s):
    lim = Limits()
    f = rep.FeederCore(p, lim)
    f.advance(p.last()[0])
    while True:
        last, h = s.last()
        out = f.pull(list(last), h if last.seq else None, 5000, 64 << 20)
        if not out["rows"]:
            return
        rep.write_batch(s, rep.check_batch(last, h, out["rows"], lim))


def main():
    base = tempfile.mkdtemp(prefix="raymx-bench-replay-")
    progress(f"building a primary with {N:,} entries")
    p = build_primary(os.path.join(base, "p"))
    n = p.last()[0].seq
    s1 = Engine(LMDBStore(os.path.join(base, "s1")))
    s2 = Engine(LMDBStore(os.path.join(base, "s2")))
    progress("shipping the range to two secondaries, unapplied")
    ship(p, s1)
    ship(p, s2)
    ops = sum(len(e["ops"]) for _, e in p.read_oplog())
    print(f"range: {n:,} entries, {ops:,} ops, {DOCS:,} documents at most, one command inside")

    progress("one entry at a time (the applier, one transaction per entry)")
    one = Limits(apply_batch_ops=1)
    t0 = time.perf_counter()
    done = 0
    while True:
        k = rep.apply_batch(s1, one, 0)[0]
        if not k:
            break
        done += k
        if done % 100_000 == 0:
            progress(f"serial: {done:,}/{n:,}")
    serial_s = time.perf_counter() - t0

    progress("parallel replay (explode, last image per document, segments at commands)")
    t0 = time.perf_counter()
    entries, written, last = replay.replay_unapplied(s2, Limits().replay_txn_docs_max)
    replay_s = time.perf_counter() - t0
    assert entries == n and last == p.last()[0]

    progress("checking both secondaries are identical")
    same = s1.snapshot_state() == s2.snapshot_state() == p.snapshot_state()
    row("one-at-a-time apply (1 entry per LMDB txn)", n / serial_s, "entries/s",
        f"{serial_s:.1f} s")
    row("parallel replay (last image per document)", n / replay_s, "entries/s",
        f"{replay_s:.1f} s, {written:,} documents written")
    print(f"speedup: {serial_s / replay_s:.1f}x   identical state: {same}")


if __name__ == "__main__":
    main()
