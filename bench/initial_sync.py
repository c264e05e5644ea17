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
3. the same through Spark (``spark=``: partitions out through a Ray Data
   datasource, range-partitioned and sorted by Spark, loaded run by run), if
   ``RAYMX_BENCH_SYNC_SPARK=1`` (off by default: Spark start-up alone takes
   ~20 s here and the Spark path moves every row through Arrow twice).

Prints documents/s for each and the ratio to the baseline (target >= 0.3).
"""
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from _util import docs, progress, raw_batched_rate, row  # noqa: E402

N = int(os.environ.get("RAYMX_BENCH_SYNC_N", 1_000_000))
SPARK = os.environ.get("RAYMX_BENCH_SYNC_SPARK") == "1"
NS = ("bench", "sync")


def main():
    import ray

    import raymx
    from raymx.storage.limits import Limits
    base = tempfile.mkdtemp(prefix="raymx-bench-sync-")
    progress(f"generating {N:,} documents")
    all_docs = docs(N)
    progress("baseline: raw LMDB batched puts of the same documents")
    raw = raw_batched_rate(os.path.join(base, "raw"), all_docs)

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

        progress("add_member(initial_sync='snapshot'), Ray path")
        t0 = time.perf_counter()
        mid = rs.add_member(initial_sync="snapshot")
        dt = time.perf_counter() - t0
        st = {m["id"]: m for m in rs.status()["members"]}
        ok = st[mid]["state"] == "running" and st[mid]["applied"] == st[0]["last"]
        print(f"{N:,} documents (~200 bytes, one secondary index); "
              f"doc+index rows copied and checksummed")
        row("raw LMDB batched puts (baseline)", raw, "docs/s")
        row("primary load through the client (insert_many 1,000)", load_rate, "docs/s")
        row("snapshot member creation, end to end (Ray)", N / dt, "docs/s",
            f"{dt:.1f} s, ratio {N / dt / raw:.2f} (target >= 0.3), caught up: {ok}")

        if SPARK:
            from raymx.spark_bridge import spark_session
            progress("starting Spark")
            spark = spark_session()
            progress("add_member(initial_sync='snapshot', spark=...), Spark path")
            t0 = time.perf_counter()
            mid2 = rs.add_member(initial_sync="snapshot", spark=spark)
            dt = time.perf_counter() - t0
            st = {m["id"]: m for m in rs.status()["members"]}
            row("snapshot member creation, end to end (Spark job)", N / dt, "docs/s",
                f"{dt:.1f} s, ratio {N / dt / raw:.2f}, state {st[mid2]['state']}")
    finally:
        rs.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
