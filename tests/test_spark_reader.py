"""The snapshot reader and the document <-> Arrow conversion, without Ray or Spark:
partitions from one read transaction, point-in-time reads, the change stream's
ranges, the type mapping and its errors."""
import random

import pyarrow as pa
import pytest

from raymx import errors
from raymx.spark_bridge import convert
from raymx.spark_bridge.reader import SnapshotReader
from raymx.storage import codec
from raymx.storage.gtid import GTID, ZERO

NS = "app.items"


def read_all(r, ns, at=None, partitions=None, page=1 << 20, rows_per_partition=100_000):
    plan = r.plan(ns, at=at, partitions=partitions, rows_per_partition=rows_per_partition)
    docs = []
    for lo, hi, _ in plan["parts"]:
        nxt = lo
        while nxt is not None:
            blob, keys, nxt = r.read(ns, nxt, hi, page, True)
            got = codec.unpack(blob)
            assert len(keys) == len(got)
            docs += got
    return plan, docs


def by_id(docs):
    return sorted(docs, key=lambda d: repr(d["_id"]))


def test_partitions_come_from_one_snapshot_and_cover_the_collection(engine):
    engine.insert_many(NS, [{"_id": i, "v": i} for i in range(1000)])
    engine.insert_many("app.other", [{"_id": 1}])
    r = SnapshotReader(engine)
    g = r.gtid
    # writes after the snapshot opened are not seen by any partition
    engine.insert_many(NS, [{"_id": 5000 + i} for i in range(10)])
    engine.run(lambda tx: tx.update(NS, {"_id": {"$lt": 500}}, {"$set": {"v": -1}}, multi=True))
    plan, docs = read_all(r, NS, partitions=7, page=2000)
    assert plan["gtid"] == list(g) and plan["count"] == 1000 and len(plan["parts"]) == 7
    assert [d["_id"] for d in docs] == list(range(1000))  # key order, no overlap, no gap
    assert all(d["v"] == d["_id"] for d in docs)
    assert len(codec.unpack(plan["sample"])) <= 1000
    assert r.collections() == ["app.items", "app.other"]
    r.close()
    engine.run(lambda tx: tx.create_index(NS, [("v", -1)]))
    r = SnapshotReader(engine)
    assert r.catalog() == {NS: {"v_-1": {"key": [["v", -1]], "unique": False}}, "app.other": {}}
    r.close()


def test_point_in_time_read_equals_the_state_then(engine):
    rnd = random.Random(6)
    states, gtids = [], []
    live = set()
    for step in range(150):
        k = rnd.randrange(40)
        if k in live and rnd.random() < 0.3:
            _, g = engine.run(lambda tx: tx.delete(NS, {"_id": k}))
            live.discard(k)
        elif k in live:
            _, g = engine.run(lambda tx: tx.update(NS, {"_id": k}, {"$set": {"n": {"s": step}}}))
        else:
            _, g = engine.run(lambda tx: tx.insert(NS, [{"_id": k, "n": {"s": step}}]))
            live.add(k)
        if step % 10 == 0:  # a multi-op entry too
            _, g = engine.run(lambda tx: tx.update(NS, {}, {"$inc": {"c": 1}}, multi=True))
        gtids.append(g)
        states.append(by_id(engine.find(NS)))
    r = SnapshotReader(engine)
    for i in rnd.sample(range(len(gtids)), 25) + [len(gtids) - 1]:
        plan, docs = read_all(r, NS, at=gtids[i], partitions=rnd.randint(1, 5),
                              page=rnd.choice([1, 200, 1 << 20]))
        assert plan["gtid"] == list(gtids[i])
        assert by_id(docs) == states[i], i
    r.close()


def test_point_in_time_before_the_collection_existed_and_across_a_drop(engine):
    g0 = engine.insert_many("app.first", [{"_id": 1}]).gtid
    engine.insert_many(NS, [{"_id": 1}])
    r = SnapshotReader(engine)
    assert read_all(r, NS, at=g0)[1] == []  # created after g0: empty then
    assert read_all(r, "app.none")[1] == []
    r.close()
    engine.run(lambda tx: tx.drop_collection(NS))
    engine.insert_many(NS, [{"_id": 2}])
    r = SnapshotReader(engine)
    with pytest.raises(errors.InvalidOperation, match="dropped"):
        r.plan(NS, at=GTID(0, 2))
    with pytest.raises(errors.Diverged):
        r.plan(NS, at=GTID(7, 2))
    with pytest.raises(errors.InvalidInput, match="after this snapshot"):
        r.plan(NS, at=GTID(0, 99))
    r.close()


def test_change_ranges_are_exact_and_ordered(engine):
    gs = [engine.insert_many(NS, [{"_id": i}, {"_id": 1000 + i}]).gtid for i in range(30)]
    r = SnapshotReader(engine)
    plan = r.plan_changes(gs[4], gs[20], partitions=4)
    got = []
    for lo, hi, _ in plan["parts"]:
        nxt = lo
        while nxt is not None:
            entries, nxt = r.read_changes(nxt, hi, 10)
            got += entries
    assert [GTID.from_bytes(k) for k, _, _ in got] == gs[5:21]
    assert plan["count"] == 16
    with pytest.raises(errors.InvalidInput, match="before"):
        r.plan_changes(gs[5], gs[4])
    with pytest.raises(errors.Diverged):
        r.plan_changes(GTID(3, 4))
    assert r.plan_changes(ZERO)["count"] == r.gtid.seq
    r.close()


def test_snapshot_waits_for_a_gtid_then_times_out(engine):
    engine.insert_many(NS, [{"_id": 1}])
    with pytest.raises(errors.ReadConcernTimeout):
        SnapshotReader(engine, wait_for=GTID(0, 5), wait_s=0.05)


# --- conversion -------------------------------------------------------------------
def test_inferred_schema_round_trips_nested_documents():
    docs = [{"_id": "a", "n": 1, "f": 1.5, "s": "x", "b": b"\x00\x01", "ok": True,
             "sub": {"x": 1, "deep": {"y": [1, 2]}}, "tags": ["p", "q"],
             "items": [{"k": 1}, {"k": 2, "extra": "z"}]},
            {"_id": "b", "n": 2, "f": 3, "sub": {"x": 2, "z": None}, "tags": []}]
    schema = convert.infer_schema(docs)
    assert schema.names[0] == "_id"
    assert schema.field("f").type == pa.float64() and schema.field("n").type == pa.int64()
    t = convert.docs_to_table(docs, schema)
    back = convert.table_to_docs(t)
    assert back[0] == docs[0]
    # nested and absent fields survive (null and missing are one thing)
    assert back[0]["sub"] == {"x": 1, "deep": {"y": [1, 2]}}
    assert back[0]["items"] == [{"k": 1}, {"k": 2, "extra": "z"}]
    assert back[1] == {"_id": "b", "n": 2, "f": 3.0, "sub": {"x": 2}, "tags": []}
    assert convert.table_to_docs(t, keep_nulls=True)[1]["ok"] is None


def test_conflicting_and_unrepresentable_values_are_named():
    with pytest.raises(errors.SchemaMismatch, match="field .*a.* holds both string and integer"):
        convert.infer_schema([{"_id": 1, "a": "x"}, {"_id": 2, "a": 5}])
    with pytest.raises(errors.SchemaMismatch, match="2\\*\\*63"):
        convert.infer_schema([{"_id": 1, "a": 1 << 63}])
    schema = convert.infer_schema([{"_id": 1, "a": 1}])
    with pytest.raises(errors.SchemaMismatch, match="field b is not in the schema"):
        convert.docs_to_table([{"_id": 2, "a": 1, "b": 2}], schema)
    with pytest.raises(errors.SchemaMismatch, match="field a = 'x'"):
        convert.docs_to_table([{"_id": 2, "a": "x"}], schema)
    # an explicit schema projects instead
    assert convert.docs_to_table([{"_id": 2, "a": 1, "b": 2}], schema, strict=False).num_rows == 1


def test_unsupported_column_types_are_refused_by_name():
    import datetime
    import decimal

    from bson import Decimal128
    # timestamps and decimals are stored natively (issue 26), nested too
    t = pa.table({"_id": [1], "when": pa.array([datetime.datetime(2020, 1, 1)])})
    assert convert.table_to_docs(t) == [{"_id": 1, "when": datetime.datetime(2020, 1, 1)}]
    t = pa.table({"_id": [1], "s": pa.array([{"d": decimal.Decimal("1.5")}])})
    assert convert.table_to_docs(t) == [{"_id": 1, "s": {"d": Decimal128("1.5")}}]
    t = pa.table({"_id": [1], "i": pa.array([datetime.timedelta(1)])})
    with pytest.raises(errors.InvalidDocument, match="column i .*duration.*cast"):
        convert.table_to_docs(t)
    t = pa.table({"_id": [1], "m": pa.array([[("a", 1)]], pa.map_(pa.string(), pa.int64()))})
    assert convert.table_to_docs(t) == [{"_id": 1, "m": {"a": 1}}]


def test_json_and_id_text():
    assert convert.to_json({"_id": 1, "b": b"\x01", "s": "é"}) == \
        '{"_id":1,"b":{"$binary":"AQ=="},"s":"é"}'
    assert convert.id_text("abc") == "abc" and convert.id_text(5) == "5"
    assert convert.id_text({"a": 1}) == '{"a":1}' and convert.to_json(None) is None


# --- planned reads: each partition from its own transaction ----------------------------
@pytest.mark.parametrize("flt, plan", [
    (None, "COLLSCAN"), ({"n": 7}, "IXSCAN n_1"), ({"n": {"$gte": 10, "$lt": 20}}, "IXSCAN n_1"),
    ({"_id": {"$in": [3, 4, 5000]}}, "IDHACK"), ({"_id": {"$gte": 890}}, "IXSCAN _id_"),
    ({"arr": {"$gte": 500}}, "IXSCAN arr_1"), ({"arr": {"$in": [5, 1005, 6]}}, "IXSCAN arr_1"),
    ({"n": {"$in": [1, 2]}, "arr": {"$lt": 100}}, "IXSCAN n_1"), ({"s": "x"}, "COLLSCAN")])
def test_planned_partitions_read_from_later_transactions_equal_the_point(engine, flt, plan):
    """Partitions planned in one transaction and read from others, opened
    after more writes, hold exactly the documents matching the filter as of
    the planned GTID: once each, through the index's range when it has one."""
    engine.insert_many(NS, [{"_id": i, "n": i % 100, "arr": [i, i + 1000]} for i in range(1000)])
    engine.run(lambda tx: tx.create_index(NS, "n"))
    engine.run(lambda tx: tx.create_index(NS, "arr"))
    r = SnapshotReader(engine)
    g = r.gtid
    r.close()
    engine.run(lambda tx: tx.update(NS, {"_id": {"$lt": 50}}, {"$set": {"n": -5}}, multi=True))
    engine.run(lambda tx: tx.delete(NS, {"_id": {"$gte": 900}}, multi=True))
    engine.insert_many(NS, [{"_id": 5000 + i, "n": 7, "arr": [1]} for i in range(10)])
    for at in (g, None):
        want = sorted(engine.reader().at(at).find(NS, flt), key=lambda d: d["_id"])
        for parts in (1, 3, 7):
            p0 = SnapshotReader(engine)
            p = p0.plan_ranges(NS, at=at, flt=flt, partitions=parts)
            p0.close()
            assert p["plan"] == plan
            got = []
            for i in range(len(p["parts"])):
                ri = SnapshotReader(engine)
                for chunk in ri.read_part(NS, p, i, flt, batch_docs=7):
                    got += chunk
                ri.close()
            assert sorted(got, key=lambda d: d["_id"]) == want, (at, parts)
            assert len(got) == len(want)
        if plan == "IXSCAN n_1" and at is None and flt == {"n": 7}:
            # the index entries for n = 7 (107..807 and the 10 new), not the collection
            assert p["keys"] == 8 + 10


def test_a_planned_read_refuses_a_changed_history(engine):
    engine.insert_many(NS, [{"_id": i} for i in range(10)])
    r = SnapshotReader(engine)
    p = r.plan_ranges(NS)
    r.close()
    bad = dict(p, hash=p["hash"] + 1)  # as if the entry were another (a rollback)
    r = SnapshotReader(engine)
    with pytest.raises(errors.Diverged, match="read again"):
        list(r.read_part(NS, bad, 0))
    assert sum(len(c) for c in r.read_part(NS, p, 0)) == 10
    r.close()
    with pytest.raises(errors.InvalidFilter, match=r"\$near"):
        SnapshotReader(engine).plan_ranges(NS, flt={"a": {"$near": [0, 0]}})
