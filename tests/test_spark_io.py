"""Ray Data datasource/datasink on their own, and DataFrame I/O through real Spark
(RayDP, started once per session by the ``spark`` fixture)."""
import itertools
import time

import pytest

from raymx import errors
from raymx.storage import codec
from raymx.storage.gtid import GTID

_N = itertools.count()


@pytest.fixture(scope="module")
def rs(ray_session, tmp_path_factory):
    """One replica set for this module (a launch costs seconds); tests use their
    own collections."""
    import raymx
    s = raymx.ReplicaSet.launch(f"sparkio{next(_N)}", members=1,
                                data_dir=str(tmp_path_factory.mktemp("sparkio")))
    yield s
    s.shutdown()


@pytest.fixture
def coll(rs, request):
    c = rs.client()
    name = f"c{next(_N)}"
    yield c["io"][name], f"io.{name}"
    c.close()


def nested_docs(n, start=0):
    return [{"_id": f"k{i:05d}", "n": i, "x": i / 4, "ok": i % 2 == 0, "raw": bytes([i % 256]),
             "sub": {"name": f"n{i}", "deep": {"v": [i, i + 1]}, **({"opt": i} if i % 3 else {})},
             "tags": [f"t{i % 5}"], "items": [{"k": i}, {"k": -i}]}
            for i in range(start, start + n)]


# --- Ray Data on its own ------------------------------------------------------------
def test_datasource_reads_one_snapshot_in_key_ranges_on_the_member_node(rs, coll, ray_session):
    from raymx.spark_bridge import read_dataset
    ray = ray_session
    c, ns = coll
    docs = nested_docs(300)
    g = c.insert_many(docs).gtid
    ds, src = read_dataset(rs, ns, partitions=4)
    try:
        assert src.gtid == g and len(src.plan["parts"]) == 4
        assert src.snapshot.node_id == ray.get(rs.member(0).address.remote())["node_id"]
        c.insert_many(nested_docs(5, start=1000))  # after the snapshot: not seen
        c.delete_many({"n": {"$lt": 100}})
        rows = ds.take_all()
    finally:
        src.close()
    assert sorted(rows, key=lambda d: d["_id"]) == [
        {**d, "sub": {**d["sub"], "opt": d["sub"].get("opt")}} for d in docs]


def test_datasource_at_an_older_gtid_and_raw_msgpack(rs, coll, ray_session):
    from raymx.spark_bridge import CollectionDatasource
    ray = ray_session
    c, ns = coll
    g1 = c.insert_many([{"_id": i, "v": i} for i in range(50)]).gtid
    c.update_many({}, {"$set": {"v": -1}})
    c.delete_many({"_id": {"$gte": 25}})
    src = CollectionDatasource(rs, ns, at=g1, format="msgpack")
    try:
        assert src.gtid == g1
        rows = ray.data.read_datasource(src, ray_remote_args=src.read_args()).take_all()
    finally:
        src.close()
    docs = [codec.unpack(r["doc"]) for r in rows]
    assert docs == [{"_id": i, "v": i} for i in range(50)]  # as of g1, in key order
    from raymx.storage.keys import encode_key
    assert [r["_key"] for r in rows] == [encode_key(i) for i in range(50)]


def test_datasink_appends_and_upserts_through_the_primary(rs, coll, ray_session):
    from raymx.spark_bridge import write_dataset
    ray = ray_session
    c, ns = coll
    # a few blocks (from_items makes one per row here: 100 Ray tasks, a minute
    # on 2 cores once Spark's executor holds one of them)
    ds = ray.data.from_items([{"_id": i, "v": i, "s": {"a": str(i)}} for i in range(200)],
                             override_num_blocks=4)
    res = write_dataset(ds, rs, ns, mode="append", w=1, batch_docs=64)
    assert res.written == 200 and res.gtid is not None
    assert c.count_documents({}) == 200
    assert c.find_one({"_id": 7}) == {"_id": 7, "v": 7, "s": {"a": "7"}}
    with pytest.raises(Exception) as ei:  # appending the same _ids again
        write_dataset(ds, rs, ns, mode="append")
    assert "DuplicateKey" in repr(ei.value) or "duplicate" in str(ei.value).lower()
    up = ray.data.from_items([{"_id": i, "v": -i, "s": None} for i in range(150, 250)],
                             override_num_blocks=3)
    res2 = write_dataset(up, rs, ns, mode="upsert", w="majority")
    assert res2.written == 100 and res2.gtid > res.gtid
    write_dataset(up, rs, ns, mode="upsert")  # idempotent
    assert c.count_documents({}) == 250
    assert c.find_one({"_id": 160}) == {"_id": 160, "v": -160}  # replaced; null left out
    assert c.find_one({"_id": 10})["v"] == 10


def test_changes_datasource_returns_exactly_the_range(rs, coll, ray_session):
    from raymx.spark_bridge import read_changes_dataset
    c, ns = coll
    g0 = c.insert_one({"_id": "first"}).gtid
    c.insert_many([{"_id": 1, "b": b"\x00"}, {"_id": 2}])
    c.update_one({"_id": 1}, {"$set": {"x": 1}})
    c.delete_one({"_id": 2})
    c.create_index("x")
    g1 = rs.client()["io"]["other"].insert_one({"_id": 9}).gtid
    g2 = c.insert_one({"_id": "later"}).gtid
    ds, src = read_changes_dataset(rs, after=g0, until=g1, partitions=3)
    try:
        rows = ds.take_all()
    finally:
        src.close()
    assert src.until == g1 and g2 > g1
    assert [(r["op"], r["ns"], r["_id"]) for r in rows] == [
        ("i", ns, "1"), ("i", ns, "2"), ("u", ns, "1"), ("d", ns, "2"),
        ("c", ns, None), ("c", "io.other", None), ("i", "io.other", "9")]
    seqs = [(r["seq"], r["idx"]) for r in rows]
    assert seqs == sorted(seqs) and all(g0.seq < s <= g1.seq for s, _ in seqs)
    assert rows[0]["post"] == '{"_id":1,"b":{"$binary":"AA=="}}' and rows[0]["pre"] is None
    assert rows[2]["pre"] == '{"_id":1,"b":{"$binary":"AA=="}}'
    assert '"cmd":"createIndex"' in rows[4]["cmd"]
    ds, src = read_changes_dataset(rs, after=g0, until=g1, ns="io.other")
    try:
        assert [r["op"] for r in ds.take_all()] == ["c", "i"]
    finally:
        src.close()


def test_bad_input_to_datasource_and_datasink(rs, coll):
    from raymx.spark_bridge import CollectionDatasink, CollectionDatasource, read_changes_dataset
    c, ns = coll
    c.insert_many([{"_id": 1, "a": "x"}, {"_id": 2, "a": 5}])
    with pytest.raises(errors.SchemaMismatch, match="a holds both"):
        CollectionDatasource(rs, ns)
    with pytest.raises(errors.InvalidName):
        CollectionDatasource(rs, "nodot")
    with pytest.raises(errors.InvalidInput, match="format"):
        CollectionDatasource(rs, ns, format="csv")
    with pytest.raises(errors.InvalidInput, match="not a GTID"):
        CollectionDatasource(rs, ns, at="yesterday")
    with pytest.raises(errors.ConfigError, match="member"):
        CollectionDatasource(rs, ns, member=7)
    with pytest.raises(errors.InvalidInput, match="mode"):
        CollectionDatasink(rs, ns, mode="overwrite")
    with pytest.raises(errors.Diverged):
        read_changes_dataset(rs, after=GTID(99, 1))
    with pytest.raises(errors.InvalidInput, match="after is required"):
        read_changes_dataset(rs, after=None)
    with pytest.raises(errors.ReadConcernTimeout):
        from raymx.spark_bridge import open_snapshot
        # a term no election reaches in this module (GTIDs order by term first)
        open_snapshot(rs, wait_for=GTID(10**6, 10**9), wait_s=0.2)


def test_a_snapshot_nobody_reads_closes_itself(rs, coll, ray_session):
    from raymx.spark_bridge import open_snapshot
    ray = ray_session
    c, _ = coll
    g = c.insert_one({"_id": 1}).gtid
    snap = open_snapshot(rs, wait_for=g, idle_s=0.3)
    assert snap.gtid >= g
    deadline = time.monotonic() + 30
    while True:  # the read transaction is released and the actor goes away
        try:
            ray.get(snap.actor.info.remote(), timeout=10)
        except (ray.exceptions.RayActorError, errors.InvalidOperation):
            break
        assert time.monotonic() < deadline
        time.sleep(1.0)  # longer than idle_s: each info() call counts as a read
    snap.close()  # harmless afterwards


# --- Spark DataFrames ------------------------------------------------------------------
def test_write_dataframe_then_read_collection_round_trips_nested_documents(spark, rs, coll):
    from raymx.spark_bridge import read_collection, write_dataframe
    c, ns = coll
    docs = nested_docs(120)
    # the DataFrame is built by Spark from JSON, as a pipeline's would be
    import json
    jsonable = [{**d, "raw": None} for d in docs]
    src = spark.read.json(spark.sparkContext.parallelize([json.dumps(d) for d in jsonable]))
    res = write_dataframe(src, rs, ns, mode="append")
    assert res.written == 120
    df = read_collection(spark, rs, ns, at=res.gtid)
    assert df.snapshot_gtid == res.gtid
    assert df.columns[0] == "_id"
    assert df.filter("sub.deep.v[1] = 11").select("_id").collect()[0]["_id"] == "k00010"
    back = [r.asDict(recursive=True) for r in df.orderBy("_id").collect()]
    want = [{k: v for k, v in d.items() if k != "raw"} for d in docs]
    clean = [{k: v for k, v in b.items() if v is not None} for b in back]
    for b in clean:
        b["sub"] = {k: v for k, v in b["sub"].items() if v is not None}
    assert clean == want
    # and a DataFrame read from raymx goes back unchanged, binary included
    c.insert_many([{"_id": "bin", "n": -1, "x": 0.5, "ok": True, "raw": b"\x00\xff",
                    "sub": {"name": "b", "deep": {"v": [1]}}, "tags": [], "items": []}])
    df2 = read_collection(spark, rs, ns)
    name = ns.split(".")[1]
    res2 = write_dataframe(df2, rs, f"io.copy_{name}", mode="upsert")
    assert res2.written == 121
    copy = rs.client()["io"][f"copy_{name}"]
    assert copy.find_one({"_id": "bin"}) == c.find_one({"_id": "bin"})
    assert sorted(copy.find(), key=lambda d: d["_id"]) == sorted(c.find(), key=lambda d: d["_id"])


def test_read_changes_between_two_gtids_in_order(spark, rs, coll):
    from pyspark.sql import functions as F

    from raymx.spark_bridge import read_changes
    c, ns = coll
    g0 = c.insert_one({"_id": 0, "v": 0}).gtid
    want = []
    for i in range(1, 40):
        if i % 3 == 0:
            r = c.update_one({"_id": i - 1}, {"$set": {"v": i}})
            want.append(("u", str(i - 1)))
        else:
            r = c.insert_one({"_id": i, "v": i})
            want.append(("i", str(i)))
    g1 = r.gtid
    c.delete_one({"_id": 1})  # after g1: not in the range
    df = read_changes(spark, rs, after=g0, until=g1, partitions=4)
    rows = df.collect()
    assert [(r["op"], r["_id"]) for r in rows] == want
    assert [r["seq"] for r in rows] == list(range(g0.seq + 1, g1.seq + 1))
    assert df.snapshot_gtid == g1
    # images are JSON: filter on a field of the post-image
    hit = df.filter(F.get_json_object("post", "$.v") == "6").select("op", "_id").collect()
    assert [(r["op"], r["_id"]) for r in hit] == [("u", "5")]


def test_dataframe_bad_input_is_refused_before_writing(spark, rs, coll):
    from raymx.spark_bridge import read_collection, write_dataframe
    c, ns = coll
    df = spark.sql("SELECT 1 AS _id, map(1, 'a') AS m")
    with pytest.raises(errors.InvalidDocument, match="column m: a map needs string keys"):
        write_dataframe(df, rs, ns)
    df = spark.sql("SELECT 1 AS v")
    with pytest.raises(errors.InvalidInput, match="_id"):
        write_dataframe(df, rs, ns, mode="upsert")
    with pytest.raises(errors.InvalidInput, match="mode"):
        write_dataframe(df, rs, ns, mode="merge")
    with pytest.raises(errors.InvalidInput, match="_id"):
        write_dataframe(df, rs, ns, mode="overwrite")
    assert c.count_documents({}) == 0
    c.insert_many([{"_id": 1, "a": "x"}, {"_id": 2, "a": 5}])
    with pytest.raises(errors.SchemaMismatch, match="schema="):
        read_collection(spark, rs, ns)
    df = read_collection(spark, rs, ns, schema="_id long")  # a schema projects
    assert sorted(r["_id"] for r in df.collect()) == [1, 2]
    assert read_collection(spark, rs, "io.no_such_collection").count() == 0


def test_timestamp_date_and_decimal_columns_are_stored_natively(spark, rs, coll):
    """Issue 26: Spark timestamps, dates and decimals become datetime and
    Decimal128 values, and read back as timestamp and decimal columns."""
    import datetime

    from bson import Decimal128

    from raymx.spark_bridge import read_collection, write_dataframe
    c, ns = coll
    df = spark.sql("SELECT 1 AS _id, TIMESTAMP '2026-11-25 06:00:00.123' AS at, "
                   "DATE '2026-11-25' AS day, CAST(12.25 AS DECIMAL(10, 2)) AS price")
    write_dataframe(df, rs, ns)
    doc = c.find_one({"_id": 1})
    assert isinstance(doc["at"], datetime.datetime) and doc["day"] == datetime.datetime(
        2026, 11, 25) and doc["price"] == Decimal128("12.25")
    back = read_collection(spark, rs, ns)
    types = dict(back.dtypes)
    assert types["at"] == "timestamp" and types["price"] == "decimal(38,18)"
    assert back.collect()[0]["at"] == df.collect()[0]["at"]


def test_read_collection_at_the_majority_point(spark, rs, coll):
    """read_concern="majority" (issue 22): the DataFrame is exactly as of the
    member's majority-committed point, which holds every majority write."""
    from raymx.spark_bridge import read_collection
    c, ns = coll
    g = c.insert_many([{"_id": i, "n": i} for i in range(50)], w="majority").gtid
    df = read_collection(spark, rs, ns, read_concern="majority", schema="_id long, n long")
    assert df.snapshot_gtid >= g and df.count() == 50
    with pytest.raises(errors.ConfigError, match="give one"):
        read_collection(spark, rs, ns, at=g, read_concern="majority")
    with pytest.raises(errors.ConfigError, match="read_concern"):
        read_collection(spark, rs, ns, read_concern="linearizable")


# --- pushdown -------------------------------------------------------------------------
def test_an_indexed_filter_is_read_over_its_index_range_only(spark, rs, coll):
    from raymx.spark_bridge import read_collection
    c, ns = coll
    c.insert_many([{"_id": i, "n": i % 100, "s": f"s{i}", "tags": [i % 7, 100 + i % 3]}
                   for i in range(2000)])
    c.create_index("n")
    c.create_index("tags")

    def ids(df):
        return sorted(r["_id"] for r in df.select("_id").collect())

    df = read_collection(spark, rs, ns, filter={"n": {"$gte": 10, "$lt": 15}}, partitions=3)
    # only the 100 index entries of n in [10, 15) are examined, not the 2,000 documents
    assert df.read_plan["plan"] == "IXSCAN n_1" and df.read_plan["keys"] == 100
    assert df.read_plan["parts"] == 3
    assert ids(df) == sorted(d["_id"] for d in c.find({"n": {"$gte": 10, "$lt": 15}}))
    df = read_collection(spark, rs, ns, filter={"_id": {"$in": [3, 5, 99999]}})
    assert (df.read_plan["plan"], df.read_plan["keys"]) == ("IDHACK", 2) and ids(df) == [3, 5]
    df = read_collection(spark, rs, ns, filter={"_id": {"$gte": 1990}, "s": {"$ne": "s1995"}})
    assert (df.read_plan["plan"], df.read_plan["keys"]) == ("IXSCAN _id_", 10)
    assert ids(df) == [i for i in range(1990, 2000) if i != 1995]
    # an array field: each matching document once, though it has several entries in range
    flt = {"tags": {"$in": [3, 101]}}
    df = read_collection(spark, rs, ns, filter=flt, partitions=4)
    assert df.read_plan["plan"] == "IXSCAN tags_1"
    assert ids(df) == sorted(d["_id"] for d in c.find(flt))
    # no index on s: the whole collection is examined, the filter still applied there
    df = read_collection(spark, rs, ns, filter={"s": "s7"})
    assert (df.read_plan["plan"], df.read_plan["keys"]) == ("COLLSCAN", 2000) and ids(df) == [7]


def test_columns_converts_only_the_named_fields(spark, rs, coll):
    from raymx.spark_bridge import read_collection
    c, ns = coll
    c.insert_many(nested_docs(50))
    df = read_collection(spark, rs, ns, columns=["_id", "sub", "nowhere"],
                         filter={"n": {"$lt": 3}})
    assert df.columns == ["_id", "sub", "nowhere"]
    rows = sorted((r.asDict(recursive=True) for r in df.collect()), key=lambda r: r["_id"])
    assert [r["_id"] for r in rows] == ["k00000", "k00001", "k00002"]
    assert rows[1]["sub"] == {"name": "n1", "deep": {"v": [1, 2]}, "opt": 1}
    assert all(r["nowhere"] is None for r in rows)
    df = read_collection(spark, rs, ns, schema="_id string, n long, x double", columns=["n"])
    assert df.columns == ["n"] and sorted(r["n"] for r in df.collect()) == list(range(50))
    with pytest.raises(errors.InvalidInput, match="not in the schema"):
        read_collection(spark, rs, ns, schema="_id string", columns=["n"])


@pytest.mark.parametrize("flt, op", [({"s": {"$near": [0, 0]}}, "$near"),
                                     ({"$where": "this.a > 1"}, "$where"),
                                     ({"a": {"$geoWithin": {"b": 1}}}, "$geoWithin"),
                                     ({"$or": [{"a": 1}, {"b": {"$geoIntersects": 2}}]},
                                      "$geoIntersects")])
def test_a_filter_that_cannot_be_pushed_down_is_refused_naming_the_operator(spark, rs, coll,
                                                                            flt, op):
    from raymx.spark_bridge import read_collection
    c, ns = coll
    c.insert_one({"_id": 1, "s": "abc"})
    with pytest.raises(errors.InvalidFilter) as ei:
        read_collection(spark, rs, ns, filter=flt)
    assert op in str(ei.value)


def test_regex_size_and_elem_match_filters_are_pushed_down(spark, rs, coll):
    from raymx.spark_bridge import read_collection
    c, ns = coll
    c.insert_many([{"_id": 1, "s": "abc", "t": [1, 2]}, {"_id": 2, "s": "xyz", "t": [3]}])
    for flt in ({"s": {"$regex": "^a"}}, {"t": {"$size": 2}}, {"t": {"$elemMatch": {"$lt": 2}}},
                {"_id": {"$mod": [2, 1]}}, {"_id": {"$bitsAllSet": [0]}}):
        df = read_collection(spark, rs, ns, filter=flt, schema="_id long, s string")
        assert [r["_id"] for r in df.collect()] == [1], flt


# --- writes -------------------------------------------------------------------------------
def _failing_once(spark, df, after_rows: int, always: bool = False, dup: bool = False):
    """``df`` whose first partition, on its first attempt (every attempt:
    ``always``), holds after ``after_rows`` rows one more row that fails the
    write (a null ``_id``, or with ``dup`` the partition's first ``_id``
    again), so the writing task fails after part of its partition was
    written and Spark retries it (the retry has no such row)."""
    import pyarrow as pa

    from raymx.spark_bridge import session
    arrow = pa.schema([f.with_nullable(True) for f in session.arrow_schema(df.schema)])

    def fn(batches):
        from pyspark import TaskContext
        ctx = TaskContext.get()
        poison = ctx.partitionId() == 0 and (always or ctx.attemptNumber() == 0)
        sent, first = 0, None
        for b in batches:
            b = pa.RecordBatch.from_arrays(b.columns, schema=arrow)
            if first is None and b.num_rows:
                first = b.column(0)[0].as_py()
            if poison and sent <= after_rows < sent + b.num_rows:
                k = after_rows - sent
                yield b.slice(0, k)
                yield pa.RecordBatch.from_pylist([{"_id": first if dup else None}],
                                                 schema=arrow)
                b = b.slice(k)
            sent += b.num_rows
            yield b
    return df.repartition(2).mapInArrow(fn, session.spark_schema(arrow))


def test_upsert_and_update_are_harmless_when_spark_retries_a_task(spark, rs, coll):
    from raymx.spark_bridge import write_dataframe
    c, ns = coll
    g0 = c.insert_many([{"_id": i, "v": -1, "keep": i} for i in range(0, 600, 2)]).gtid
    src = spark.range(600).selectExpr("id AS _id", "id * 10 AS v", "'new' AS tag")
    res = write_dataframe(_failing_once(spark, src, 250), rs, ns, mode="upsert", w=1,
                          batch_docs=100)
    # the failed attempt's batches were written, then written again by the retry
    assert res.written == 600 and res.gtid is not None and res.missing == 0
    assert c.count_documents({}) == 600
    assert c.find_one({"_id": 4}) == {"_id": 4, "v": 40, "tag": "new"}  # replaced whole
    from raymx.spark_bridge import read_changes
    ops = {r["op"]: r["count"] for r in read_changes(spark, rs, after=g0, until=res.gtid, ns=ns)
           .groupBy("op").count().collect()}
    # the first attempt's batches were written again by the retry, and changed
    # nothing: each document has one op, an update of the 300 there, an insert else
    assert ops == {"u": 300, "i": 300}
    upd = spark.range(0, 1200, 3).selectExpr("id AS _id", "id AS w", "CAST(NULL AS LONG) AS v")
    res = write_dataframe(_failing_once(spark, upd, 120), rs, ns, mode="update", w="majority",
                          batch_docs=50)
    # _ids 600.. have no document: counted as missing, never inserted
    assert res.written == 200 and res.missing == 200 and c.count_documents({}) == 600
    assert c.find_one({"_id": 3}) == {"_id": 3, "v": 30, "tag": "new", "w": 3}  # v kept
    assert "w" not in c.find_one({"_id": 4})  # not in the update


def test_upsert_and_update_keep_indexes_and_replicate_to_every_member(spark, ray_session,
                                                                     tmp_path):
    """On three members: a replaced field's index entries follow it, a
    repeated write changes nothing, a unique index refusing a row fails the
    job with nothing of that batch written, and the secondaries end with the
    same documents, indexes and oplog."""
    import raymx
    from raymx.spark_bridge import write_dataframe
    from tests.test_replication import converged, wait_until
    rs3 = raymx.ReplicaSet.launch(f"sparkio3x{next(_N)}", members=3,
                                  data_dir=str(tmp_path / "rs"))
    try:
        client = rs3.client(w="majority")
        c, ns = client["io"]["ix"], "io.ix"
        c.insert_many([{"_id": i, "email": f"{i}@old", "n": i, "keep": i} for i in range(400)])
        c.create_index("email", unique=True)
        c.create_index("n")
        up = spark.range(0, 600, 2).selectExpr("id AS _id", "concat(id, '@new') AS email",
                                               "-id AS n")
        res = write_dataframe(up, rs3, ns, mode="upsert", w="majority", batch_docs=64)
        assert (res.written, res.missing) == (300, 0) and res.gtid is not None
        assert c.count_documents({}) == 500 and c.find_one({"email": "8@old"}) is None
        assert c.find_one({"email": "8@new"}) == {"_id": 8, "email": "8@new", "n": -8}
        assert c.find_one({"n": -500})["_id"] == 500
        again = write_dataframe(up, rs3, ns, mode="upsert", w="majority", batch_docs=64)
        assert (again.written, again.missing, again.gtid) == (300, 0, None)  # nothing logged
        upd = spark.range(1, 700, 2).selectExpr("id AS _id", "id * 100 AS n")
        res = write_dataframe(upd, rs3, ns, mode="update", w="majority", batch_docs=64)
        assert (res.written, res.missing) == (200, 150)
        assert c.find_one({"n": 300}) == {"_id": 3, "email": "3@old", "n": 300, "keep": 3}
        assert c.find_one({"n": 3}) is None and c.count_documents({"_id": {"$gte": 600}}) == 0
        # 101 takes the email 5 holds: the job fails naming the index; nothing of
        # its batch is written (the other rows of the DataFrame, one batch)
        bad = spark.createDataFrame([(99, "99@x"), (101, "5@old"), (103, "103@x")],
                                    "_id long, email string").coalesce(1)
        with pytest.raises(Exception) as ei:
            write_dataframe(bad, rs3, ns, mode="update", w="majority")
        assert "DuplicateKey" in str(ei.value) and "email_1" in str(ei.value)
        assert c.count_documents({"email": {"$in": ["99@x", "103@x"]}}) == 0
        ds = wait_until(lambda: converged(ray_session, rs3, [0, 1, 2]))
        st = codec.unpack(ds[0]["collections"])[ns]
        assert len(st["docs"]) == 500 and len(st["indexes"]["email_1"][1]) == 500
    finally:
        rs3.shutdown()


def test_append_is_not_retry_safe_and_says_so(spark, rs, coll):
    from raymx.spark_bridge import write_dataframe
    c, ns = coll
    src = spark.range(300).selectExpr("id AS _id", "id AS v")
    with pytest.raises(Exception) as ei:
        # the first attempt fails on its 121st row (an _id it wrote already); the
        # retries fail on the rows the first attempt wrote
        write_dataframe(_failing_once(spark, src, 120, dup=True), rs, ns, mode="append",
                        w=1, batch_docs=50)
    assert "DuplicateKey" in str(ei.value) or "duplicate" in str(ei.value).lower()
    res = write_dataframe(src, rs, f"{ns}_ok", mode="append", w=1, batch_docs=64)
    assert res.written == 300


def test_overwrite_replaces_the_contents_and_keeps_the_indexes(spark, rs, coll):
    from raymx.spark_bridge import read_collection, write_dataframe
    c, ns = coll
    c.insert_many([{"_id": i, "old": True, "v": -1 - i} for i in range(1000)])
    c.create_index("v", unique=True)
    new = spark.range(100, 400).selectExpr("id AS _id", "id AS v")
    res = write_dataframe(new, rs, ns, mode="overwrite", w="majority", batch_docs=64)
    assert res.written == 300
    assert c.count_documents({}) == 300 and c.count_documents({"old": True}) == 0
    assert [ix["name"] for ix in c.list_indexes()] == ["_id_", "v_1"]
    df = read_collection(spark, rs, ns, at=res.gtid, filter={"v": {"$gte": 390}})
    assert df.read_plan["plan"] == "IXSCAN v_1" and df.count() == 10
    # a failure leaves what was written so far: the old contents are gone
    bad = _failing_once(spark, spark.range(50).selectExpr("id AS _id", "id AS v"), 10,
                        always=True)
    with pytest.raises(Exception, match="no _id"):
        write_dataframe(bad, rs, ns, mode="overwrite", w=1, batch_docs=5)
    left = sorted(d["_id"] for d in c.find())
    assert set(left) <= set(range(50)) and all(d.get("v") == d["_id"] for d in c.find())


# --- one GTID under concurrent writes --------------------------------------------------
def test_every_partition_and_every_action_reads_one_gtid_under_concurrent_writes(
        spark, replset):
    """Transfers between documents keep the total at 100,000 in every committed
    state; a read whose partitions came from different states would see
    another total. The oplog is trimmed meanwhile, to the read's hold."""
    import threading

    import ray

    from raymx.spark_bridge import read_collection
    rs = replset
    c = rs.client()
    coll = c["bank"]["acct"]
    coll.insert_many([{"_id": f"a{i:04d}", "bal": 100} for i in range(1000)])
    stop = threading.Event()

    def transfer():
        import random
        rnd = random.Random(1)
        while not stop.is_set():
            a, b = (f"a{i:04d}" for i in rnd.sample(range(1000), 2))
            with c.transaction() as tx:
                t = tx["bank"]["acct"]
                t.update_one({"_id": a}, {"$inc": {"bal": -1}})
                t.update_one({"_id": b}, {"$inc": {"bal": 1}})
            if rnd.random() < 0.05:
                coll.insert_one({"_id": f"z{rnd.random()}", "bal": 0})
    th = threading.Thread(target=transfer, daemon=True)
    th.start()
    try:
        time.sleep(0.5)
        df = read_collection(spark, rs, "bank.acct", partitions=4, schema="_id string, bal long")
        first = sorted((r["_id"], r["bal"]) for r in df.collect())
        time.sleep(0.5)
        # the oplog is cut to its minimum: trimming stops at the read's GTID
        ray.get(rs.member(0).set_oplog_cap.remote({"max_bytes": 1}))
        st = ray.get(rs.member(0).trim_now.remote())
        assert st["held_by"] and str(df.snapshot_gtid) in st["held_by"]
        again = sorted((r["_id"], r["bal"]) for r in df.collect())
        g = df.snapshot_gtid
        at = read_collection(spark, rs, "bank.acct", at=g, partitions=3,
                             schema="_id string, bal long")
        third = sorted((r["_id"], r["bal"]) for r in at.collect())
    finally:
        stop.set()
        th.join()
    assert sum(b for _, b in first) == 100_000
    assert again == first == third and at.snapshot_gtid == g


def test_read_arguments_and_the_members_files_are_checked(spark, rs, coll):
    from raymx.spark_bridge import direct, read_changes, read_collection
    c, ns = coll
    g = c.insert_one({"_id": 1}).gtid
    with pytest.raises(errors.InvalidFilter, match="dict"):
        read_collection(spark, rs, ns, filter=[("a", 1)])
    with pytest.raises(errors.InvalidInput, match="columns"):
        read_collection(spark, rs, ns, columns="a")
    with pytest.raises(errors.InvalidInput, match="hold_s"):
        read_collection(spark, rs, ns, hold_s=0)
    with pytest.raises(errors.InvalidInput, match="partitions"):
        read_changes(spark, rs, after=g, partitions=0)
    # a Spark worker never reads another folder than the member's own
    m = rs.config()["members"][0]
    with pytest.raises(errors.ConfigError, match="not on this host"):
        direct.local_engine(m["path"] + "-elsewhere", rs.config()["limits"], m["id"])
    with pytest.raises(errors.ConfigError, match=f"holds member {m['id']}'s data"):
        direct.local_engine(m["path"], rs.config()["limits"], m["id"] + 7)


def test_a_worker_without_the_members_files_reads_through_a_task_on_its_node(rs, coll):
    """A Spark worker on another node than the member streams its partition
    from a Ray task pinned to the member's node: the same batches."""
    import pyarrow as pa

    from raymx.spark_bridge import convert, direct
    c, ns = coll
    c.insert_many(nested_docs(300))
    m = direct.member_for_spark(rs, None)
    plan = direct.plan_read(m, "collection", ns=ns, at=None, flt={"n": {"$gte": 100}},
                            partitions=2, rows_per_partition=1000, sample_docs=1000,
                            wait_for=None)
    schema = convert.infer_schema(codec.unpack(plan["sample"]))
    rows = 0
    for i in range(2):
        args = (i, ns, plan, {"n": {"$gte": 100}}, schema, True)
        here = pa.Table.from_batches(list(direct.part_batches(m, direct.collection_part, *args,
                                                              local=True)), schema)
        there = pa.Table.from_batches(list(direct.part_batches(
            m, direct.collection_part, *args, local=False)), schema)
        assert there.equals(here)
        rows += there.num_rows
    assert rows == 200
