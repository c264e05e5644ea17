"""DataFrame and Ray Data I/O throughput against the plain driver, measured in one run.

A one-member replica set, ~200-byte documents. Baselines: the driver's
``insert_many`` (1,000 per call) and ``find`` of the whole collection, from
this process. Then the same documents through ``write_dataframe`` (Spark ->
Ray Data -> primary), ``read_dataset`` (snapshot -> Ray Data),
``read_collection`` (-> Spark, counted) and ``read_changes``. Prints figures
and ratios; asserts nothing. ``RAYMX_BENCH_DOCS`` sets the count (100,000).
"""
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from _util import docs, progress, row  # noqa: E402

N = int(os.environ.get("RAYMX_BENCH_DOCS", "100000"))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main():
    import ray

    import raymx
    from raymx.spark_bridge import (read_changes, read_collection, read_dataset, spark_session,
                                    stop_spark, write_dataframe)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=400 * 1024**2)
    rs = raymx.ReplicaSet.launch("benchio", members=1,
                                 data_dir=tempfile.mkdtemp(prefix="raymx-bench-io-"))
    try:
        client = rs.client(w=1)
        coll = client["bench"]["base"]
        all_docs = docs(N)
        print(f"{N:,} documents of ~200 bytes; one-member replica set; 2 CPUs")

        progress("baseline: driver insert_many, 1,000 per call")
        g0 = client["bench"]["marker"].insert_one({"_id": "start"}).gtid
        dt, _ = timed(lambda: [coll.insert_many(all_docs[i:i + 1000])
                               for i in range(0, N, 1000)])
        base_w = N / dt
        progress("baseline: driver find of the whole collection")
        dt, got = timed(lambda: sum(1 for _ in coll.find()))
        base_r = got / dt

        progress("starting Spark (not timed)")
        spark = spark_session(app_name="raymx-bench")
        # the same shape, generated inside Spark, so the timing is the write path
        df = spark.range(N).selectExpr(
            "id AS _id", "format_string('user%08d', id) AS name", "CAST(id % 100 AS LONG) AS age",
            "element_at(array('Oslo','Lima','Pune','Kyiv'), CAST(id % 4 AS INT) + 1) AS city",
            "rand(7) AS score", "repeat('x', 140) AS bio").cache()
        df.count()

        progress("write_dataframe (Spark -> Ray Data -> primary), append")
        dt, res = timed(lambda: write_dataframe(df, rs, "bench.spark", mode="append", w=1))
        spark_w = res.written / dt
        progress("write_dataframe, upsert of the same rows")
        dt, res2 = timed(lambda: write_dataframe(df, rs, "bench.spark", mode="upsert", w=1))
        spark_u = res2.written / dt

        progress("read_dataset (snapshot -> Ray Data blocks)")

        def ray_read():
            ds, src = read_dataset(rs, "bench.base")
            try:
                return ds.materialize().count()
            finally:
                src.close()
        dt, n = timed(ray_read)
        ray_r = n / dt

        progress("read_collection (-> Spark), counted")
        dt, n2 = timed(lambda: read_collection(spark, rs, "bench.base").count())
        spark_r = n2 / dt
        progress("read_collection again (Spark's Python workers already joined Ray)")
        dt, n2w = timed(lambda: read_collection(spark, rs, "bench.base").count())
        spark_rw = n2w / dt

        progress("read_changes over the baseline inserts, counted")
        dt, n3 = timed(lambda: read_changes(spark, rs, after=g0, until=res.gtid,
                                            ns="bench.base").count())
        changes_r = n3 / dt

        row("driver insert_many, 1,000/call (baseline)", base_w, "docs/s")
        row("write_dataframe append", spark_w, "docs/s", f"ratio {spark_w / base_w:.2f}")
        row("write_dataframe upsert (replace by _id, pipelined)", spark_u, "docs/s",
            f"ratio {spark_u / base_w:.2f}")
        row("driver find, whole collection (baseline)", base_r, "docs/s")
        row("read_dataset -> materialized Ray Dataset", ray_r, "docs/s",
            f"ratio {ray_r / base_r:.2f}")
        row("read_collection -> Spark count(), first call", spark_r, "docs/s",
            f"ratio {spark_r / base_r:.2f}")
        row("read_collection again (warm Spark Python workers)", spark_rw, "docs/s",
            f"ratio {spark_rw / base_r:.2f}")
        row("read_changes -> Spark count() (one op per insert)", changes_r, "ops/s",
            f"ratio {changes_r / base_r:.2f}")
        assert n == n2 == n2w == N and n3 == N + 1  # + the create command, (n, n2, n3)
        client.close()
    finally:
        try:
            stop_spark()
        finally:
            rs.shutdown()
            ray.shutdown()


if __name__ == "__main__":
    main()
