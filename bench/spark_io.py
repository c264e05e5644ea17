"""DataFrame I/O throughput against the plain driver, measured in one run.

A one-member replica set, ~200-byte documents, Spark through RayDP (1
executor, 1 core) on the same 2-core machine. Baselines from this process:
the driver's ``insert_many`` (1,000 per call) and ``find`` of the whole
collection. Then, through Spark: ``write_dataframe`` append / upsert / update
(tasks write straight to the primary; every upsert and update row changes its
document, and the upsert is run again unchanged: what a retried task costs),
``read_collection`` counted (tasks read the member's files), a pushed-down
indexed filter, ``read_changes``; the time to the first row of a
1,000-document read (the fixed cost); the previous path (Ray Data snapshot
blocks -> Spark) for comparison; and ceilings measured in the same run: what
Spark does with no raymx work at all (``spark.range`` counted; ``mapInArrow``
yielding nothing; ``mapInArrow`` yielding Arrow batches already in memory, the
most a Python source can feed this Spark) and the raymx side of a read alone
in one Python process (no Spark).

Prints figures and ratios; asserts nothing. ``RAYMX_BENCH_DOCS`` sets the
count (100,000; 1,000,000 works, ~1 GB of LMDB). ``RAYMX_BENCH_OLD=0`` skips
the previous path (slow at 1,000,000).
"""
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from _util import docs, progress, row  # noqa: E402

N = int(os.environ.get("RAYMX_BENCH_DOCS", "100000"))
OLD = os.environ.get("RAYMX_BENCH_OLD", "1") != "0"
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def vs(name, value, base, unit):
    """A figure and its ratio to the baseline measured in the same run."""
    row(name, value, unit, f"ratio {value / base:.2f}")


def old_read_collection(spark, rs, ns):
    """The previous read path: snapshot actor -> Ray Data blocks -> Spark."""
    from raymx.spark_bridge import session
    from raymx.spark_bridge.datasource import CollectionDatasource, _read
    src = CollectionDatasource(rs, ns)
    try:
        ds = _read(src).materialize()
        blocks = [r for b in ds.iter_internal_ref_bundles() for r in b.block_refs]
    finally:
        src.close()
    return session.dataframe_from_blocks(spark, blocks, src.schema)


def raymx_side_only(rs, ns):
    """Plan + read + convert every partition in this process (no Spark): the
    raymx share of a Spark read."""
    from raymx.spark_bridge import convert, direct
    from raymx.spark_bridge.datasource import _member_of
    from raymx.spark_bridge.reader import SnapshotReader
    from raymx.storage import codec
    m = _member_of(rs, None)
    plan = direct.plan_read(m, "collection", ns=ns, at=None, flt=None, partitions=None,
                            rows_per_partition=100_000, sample_docs=1000, wait_for=None)
    schema = convert.infer_schema(codec.unpack(plan["sample"]))
    e = direct.local_engine(m["path"], m["limits"], m["id"])
    n = 0
    for i in range(len(plan["parts"])):
        r = SnapshotReader(e)
        for d in r.read_part(ns, plan, i, None, direct.BATCH_DOCS):
            n += convert.docs_to_table(d, schema, True).num_rows
        r.close()
    return n


def main():
    import pyarrow as pa
    import ray

    import raymx
    from raymx.spark_bridge import (read_changes, read_collection, spark_session, stop_spark,
                                    write_dataframe)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=400 * 1024**2)
    rs = raymx.ReplicaSet.launch("benchio", members=1,
                                 data_dir=tempfile.mkdtemp(prefix="raymx-bench-io-"))
    try:
        client = rs.client(w=1)
        coll = client["bench"]["base"]
        all_docs = docs(N)
        print(f"{N:,} documents of ~200 bytes; one-member replica set; 2 CPUs; "
              "Spark: 1 executor x 1 core")

        progress("baseline: driver insert_many, 1,000 per call")
        g0 = client["bench"]["marker"].insert_one({"_id": "start"}).gtid
        dt, _ = timed(lambda: [coll.insert_many(all_docs[i:i + 1000])
                               for i in range(0, N, 1000)])
        base_w = N / dt
        g_ins = client["bench"]["marker"].insert_one({"_id": "end"}).gtid
        del all_docs
        progress("baseline: driver find of the whole collection")
        dt, got = timed(lambda: sum(1 for _ in coll.find()))
        base_r = got / dt
        coll.create_index("age")
        client["bench"]["small"].insert_many(docs(1000))

        progress("starting Spark (not timed)")
        spark = spark_session(app_name="raymx-bench")
        sc = spark.sparkContext

        progress("ceilings: Spark with no raymx work")
        spark.range(1000).count()  # warm the JVM
        dt, _ = timed(lambda: spark.range(0, N, 1, 4).count())
        ceil_range = N / dt
        schema = pa.schema([("_id", pa.int64()), ("name", pa.string()), ("age", pa.int64()),
                            ("city", pa.string()), ("score", pa.float64()),
                            ("bio", pa.string())])
        batch = pa.RecordBatch.from_pylist(
            [{"_id": i, "name": f"user{i:08d}", "age": i % 100, "city": "Oslo",
              "score": 0.5, "bio": "x" * 140} for i in range(8192)], schema=schema)
        # as many Spark tasks as read_collection plans by default
        parts = max(sc.defaultParallelism, -(-N // 1_000_000))

        def empty(batches):
            for _ in batches:
                pass
            return iter(())

        def feed(batches):
            for b in batches:
                for i in b.column(0).to_pylist():
                    per = N // parts + (1 if i < N % parts else 0)
                    while per > 0:
                        yield batch.slice(0, min(per, batch.num_rows))
                        per -= batch.num_rows
        from raymx.spark_bridge import session
        st = session.spark_schema(schema)
        spark.range(0, parts, 1, parts).mapInArrow(feed, st).count()  # warm workers
        dt, _ = timed(lambda: spark.range(0, parts, 1, parts).mapInArrow(empty, st).count())
        ceil_empty = dt
        dt, n_feed = timed(lambda: spark.range(0, parts, 1, parts).mapInArrow(feed, st).count())
        ceil_feed = n_feed / dt

        progress("raymx side of a read alone (plan, read, convert; no Spark)")
        dt, n_side = timed(lambda: raymx_side_only(rs, "bench.base"))
        side_r = n_side / dt

        progress("first row of a 1,000-document read (cold, then warm)")
        dt_first_cold, _ = timed(lambda: read_collection(spark, rs, "bench.small")
                                 .limit(1).collect())
        dt_first, _ = timed(lambda: read_collection(spark, rs, "bench.small").limit(1).collect())

        progress("read_collection -> Spark count()")
        dt, n2 = timed(lambda: read_collection(spark, rs, "bench.base").count())
        spark_r = n2 / dt
        progress("read_collection with a pushed-down indexed filter (age < 10: 10%)")
        dt_f, (n_f, plan_f) = timed(lambda: (lambda d: (d.count(), d.read_plan))(
            read_collection(spark, rs, "bench.base", filter={"age": {"$lt": 10}})))
        progress("read_collection, the same filter applied by Spark instead")
        dt_sf, n_sf = timed(lambda: read_collection(spark, rs, "bench.base")
                            .filter("age < 10").count())

        progress("read_changes over the baseline inserts, counted")
        dt, n3 = timed(lambda: read_changes(spark, rs, after=g0, until=g_ins,
                                            ns="bench.base").count())
        changes_r = n3 / dt

        # the same shape, generated inside Spark, so the timing is the write path
        # contiguous _id ranges per partition, ascending like the baseline's
        # inserts (interleaved _ids would measure the B-tree's random inserts instead)
        df = spark.range(0, N, 1, parts).selectExpr(
            "id AS _id", "format_string('user%08d', id) AS name", "CAST(id % 100 AS LONG) AS age",
            "element_at(array('Oslo','Lima','Pune','Kyiv'), CAST(id % 4 AS INT) + 1) AS city",
            "rand(7) AS score", "repeat('x', 140) AS bio")
        df = df.cache()
        df.count()
        progress("ceiling: the cached DataFrame into a Python mapInArrow that only counts")

        def just_count(batches):
            n = sum(b.num_rows for b in batches)
            yield pa.RecordBatch.from_pydict({"n": [n]})
        from pyspark.sql.types import LongType, StructField, StructType
        df.mapInArrow(just_count, StructType([StructField("n", LongType())])).collect()
        dt, got = timed(lambda: sum(r["n"] for r in df.mapInArrow(just_count, StructType(
            [StructField("n", LongType())])).collect()))
        ceil_out = got / dt
        # every upsert and update row changes its document (a row equal to the
        # stored document changes nothing: measured apart, as a retried task)
        df_up = df.selectExpr("_id", "name", "age", "city", "score + 1 AS score", "bio").cache()
        df_upd = df.selectExpr("_id", "age + 1 AS age", "concat(city, '!') AS city").cache()
        df_up.count(), df_upd.count()
        progress("write_dataframe append")
        dt, res = timed(lambda: write_dataframe(df, rs, "bench.spark", mode="append", w=1))
        spark_w = res.written / dt
        progress("write_dataframe upsert, every row changes its document")
        dt, res2 = timed(lambda: write_dataframe(df_up, rs, "bench.spark", mode="upsert", w=1))
        spark_u = res2.written / dt
        progress("write_dataframe upsert of the same rows again (a retry: nothing changes)")
        dt, res2b = timed(lambda: write_dataframe(df_up, rs, "bench.spark", mode="upsert", w=1))
        spark_u_same = res2b.written / dt
        progress("write_dataframe update ($set of two columns, both changed)")
        dt, res3 = timed(lambda: write_dataframe(df_upd, rs, "bench.spark", mode="update", w=1))
        spark_upd = res3.written / dt

        old_r = None
        if OLD:
            progress("previous path: snapshot actor -> Ray Data blocks -> Spark count()")
            dt, n_old = timed(lambda: old_read_collection(spark, rs, "bench.base").count())
            old_r = n_old / dt

        row("driver insert_many, 1,000/call (baseline)", base_w, "docs/s")
        vs("write_dataframe append", spark_w, base_w, "docs/s")
        vs("write_dataframe upsert (replace by _id)", spark_u, base_w, "docs/s")
        vs("  upsert again, rows unchanged (a retried task)", spark_u_same, base_w, "docs/s")
        vs("write_dataframe update ($set by _id)", spark_upd, base_w, "docs/s")
        vs("  ceiling: DataFrame -> Python mapInArrow, counted", ceil_out, base_w, "rows/s")
        row("driver find, whole collection (baseline)", base_r, "docs/s")
        vs("read_collection -> Spark count()", spark_r, base_r, "docs/s")
        if old_r is not None:
            vs("  previous path (Ray Data blocks -> Spark)", old_r, base_r, "docs/s")
        vs("  raymx side alone (plan+read+convert, 1 process)", side_r, base_r, "docs/s")
        vs("  ceiling: mapInArrow of in-memory batches", ceil_feed, base_r, "rows/s")
        vs("  ceiling: spark.range(N).count()", ceil_range, base_r, "rows/s")
        row("  ceiling: mapInArrow yielding nothing", ceil_empty * 1000, "ms")
        row(f"read_collection filter age<10 ({plan_f['plan']}, {plan_f['keys']:,} keys)",
            n_f / dt_f, "matching docs/s", f"{dt_f:.2f} s")
        row("  same filter in Spark over a full read", n_sf / dt_sf, "matching docs/s",
            f"{dt_sf:.2f} s, pushdown {dt_sf / dt_f:.1f}x faster")
        vs("read_changes -> Spark count() (one op per insert)", changes_r, base_r, "ops/s")
        row("first row of a 1,000-doc read (warm)", dt_first * 1000, "ms",
            f"cold {dt_first_cold * 1000:,.0f} ms")
        print(f"checks: read {n2:,}, filter {n_f:,}={n_sf:,}, changes {n3:,}, written "
              f"{res.written:,}/{res2.written:,}/{res3.written:,}, "
              f"feed {n_feed:,}, side {n_side:,}")
        client.close()
    finally:
        try:
            stop_spark()
        finally:
            rs.shutdown()
            ray.shutdown()


if __name__ == "__main__":
    main()
