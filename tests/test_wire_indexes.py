"""The wire port's index commands and index use, with the real pymongo:
a hint naming no index, ``collMod`` of a TTL index, ``$indexStats``
(``raymx/wire/indexes.py``). A member served in process."""
from bson import Timestamp
import pytest
from pymongo.errors import OperationFailure

from tests.test_wire import client, served  # noqa: F401 (the fixtures)


def test_a_hint_naming_no_index_fails_as_in_mongodb(client):
    """find, count and aggregate with a hint that names no index of the
    collection fail (BadValue, as MongoDB's planner answers) where the hint
    was ignored; an existing index (by name or key), ``$natural`` and a
    collection that does not exist pass."""
    co = client.hints.c
    co.insert_many([{"_id": i, "a": i} for i in range(5)])
    co.create_index("a")
    assert len(list(co.find({"a": {"$gte": 1}}).hint("a_1"))) == 4
    assert len(list(co.find().hint([("a", 1)]))) == 5
    assert len(list(co.find().hint("_id_"))) == 5
    assert len(list(co.find().hint([("$natural", 1)]))) == 5
    assert co.count_documents({}, hint="a_1") == 5
    for bad in (lambda: list(co.find().hint("nope_1")), lambda: list(co.find().hint([("b", 1)])),
                lambda: co.count_documents({}, hint="nope"),
                lambda: list(co.aggregate([{"$match": {}}], hint="nope"))):
        with pytest.raises(OperationFailure, match="hint provided does not correspond") as ei:
            bad()
        assert ei.value.code == 2
    assert list(client.hints.absent.find().hint("nope")) == []
    assert co.count_documents({}) == 5  # the connection serves on


def test_a_hint_chooses_the_plan_as_in_mongodb(client):
    """A hinted find reads through that index (it was only checked): in the
    index's order, the index read whole where the filter does not bound its
    field, explain naming it; ``$natural`` reads the documents in stored
    order either way; a sparse index hinted gives what it holds, as
    MongoDB's; a count takes the hint too; a sort is done over what the
    hinted plan read."""
    co = client.hints.p
    co.insert_many([{"_id": i, "a": (7 * i) % 10, "b": i % 3} for i in range(10)]
                   + [{"_id": 10, "b": 0}])
    co.create_index("a")
    co.create_index("b", sparse=True)
    by_a = [d["_id"] for d in co.find({}).hint("a_1")]  # the missing a (null) first
    assert by_a == [10] + sorted(range(10), key=lambda i: (7 * i) % 10)
    assert [d["_id"] for d in co.find({"b": 0}).hint([("a", 1)])] == [10, 0, 3, 6, 9]
    assert [d["_id"] for d in co.find().hint([("$natural", -1)])] == list(range(10, -1, -1))
    assert [d["_id"] for d in co.find({"a": {"$gt": 5}}).hint("_id_")] == [1, 4, 7, 8]
    ex = co.find({"b": 1}).hint("a_1").explain()
    scan = ex["queryPlanner"]["winningPlan"]["inputStage"]
    assert scan["stage"] == "IXSCAN" and scan["indexName"] == "a_1"
    assert ex["executionStats"]["totalDocsExamined"] == 11  # the whole index, then the filter
    co.create_index("c", sparse=True)  # no document has c: the index holds none
    assert list(co.find().hint("c_1")) == [] and co.count_documents({}, hint="c_1") == 0
    assert co.count_documents({"b": {"$gte": 0}}, hint="a_1") == 11
    assert [d["_id"] for d in co.find().sort("_id", -1).limit(3).hint("a_1")] == [10, 9, 8]
    assert co.find_one({"_id": 3}, hint="a_1") == {"_id": 3, "a": 1, "b": 0}


def test_coll_mod_sets_an_index_s_ttl_as_mongodb_s(served, client):
    """``collMod`` with ``index: {keyPattern | name, expireAfterSeconds}``
    makes an index a TTL index or changes its expiry (the answer names the
    old and new expiry), and the TTL monitor then deletes by it; the change
    is logged as the index dropped and built again, so every member and a
    rollback handle it. Validators, views and hidden indexes are refused by
    name; a missing collection or index has MongoDB's codes."""
    import datetime
    svc = served[1]
    co = client.cm.c
    old, new = datetime.datetime(2020, 1, 1), datetime.datetime.now(datetime.timezone.utc)
    co.insert_many([{"_id": i, "at": old if i % 2 else new, "b": i} for i in range(6)])
    co.create_index("at")
    co.create_index("b", unique=True)
    assert client.cm.command("collMod", "c", index={"keyPattern": {"at": 1},
                                                    "expireAfterSeconds": 3600}) \
        == {"expireAfterSeconds_new": 3600, "ok": 1.0, "operationTime": ANY_TIME}
    out = client.cm.command("collMod", "c", index={"name": "at_1", "expireAfterSeconds": 60})
    assert (out["expireAfterSeconds_old"], out["expireAfterSeconds_new"]) == (3600, 60)
    same = client.cm.command("collMod", "c", index={"name": "at_1", "expireAfterSeconds": 60})
    assert "expireAfterSeconds_new" not in same  # nothing changed, nothing logged
    ixs = {x["name"]: x for x in co.list_indexes()}
    assert ixs["at_1"]["expireAfterSeconds"] == 60 and ixs["b_1"]["unique"] is True
    assert co.find_one({"at": old, "_id": 1})["b"] == 1  # the rebuilt index serves
    svc.expire_once()  # the TTL monitor's pass
    assert sorted(d["_id"] for d in co.find()) == [0, 2, 4]
    mods = [e["o"]["applyOps"] for e in client.local["oplog.rs"].find(
        {"o.applyOps.o.dropIndexes": "c"})]
    assert [[(next(iter(x["o"])), x["o"].get("expireAfterSeconds")) for x in m] for m in mods] \
        == [[("dropIndexes", None), ("createIndexes", 3600)],
            [("dropIndexes", None), ("createIndexes", 60)]]
    assert client.cm.command("collMod", "c", changeStreamPreAndPostImages={"enabled": True})
    client.cm.create_collection("imaged", changeStreamPreAndPostImages={"enabled": True})
    assert "imaged" in client.cm.list_collection_names()  # at create too: always on here
    with pytest.raises(OperationFailure, match="must be {enabled: <bool>}"):
        client.cm.create_collection("imaged2", changeStreamPreAndPostImages=True)
    for kw, code, words in (({"validator": {"b": 1}}, 2, "validators are not served"),
                            ({"index": {"name": "b_1", "hidden": True}}, 2, "hidden indexes"),
                            ({"index": {"name": "nope", "expireAfterSeconds": 5}}, 27,
                             "cannot find index"),
                            ({"index": {"name": "b_1", "expireAfterSeconds": -1}}, 2,
                             "whole number of seconds"),
                            ({"colour": "blue"}, 40415, "unknown option")):
        with pytest.raises(OperationFailure, match=words) as ei:
            client.cm.command("collMod", "c", **kw)
        assert ei.value.code == code
    with pytest.raises(OperationFailure) as ei:
        client.cm.command("collMod", "absent")
    assert ei.value.code == 26
    assert co.count_documents({}) == 3  # the connection serves on


class _AnyTime:
    def __eq__(self, other):
        return isinstance(other, Timestamp)


ANY_TIME = _AnyTime()


def test_index_stats_counts_the_queries_each_index_served(client):
    """``$indexStats`` (Compass's index usage, an operator's unused-index
    check): each index of the collection with the finds, counts, updates
    and deletes whose plan used it since the member opened its store."""
    co = client.ixs.c
    co.insert_many([{"_id": i, "a": i % 5, "b": i} for i in range(50)])
    co.create_index("a")
    co.create_index("b")

    def ops():
        return {x["name"]: x["accesses"]["ops"] for x in co.aggregate([{"$indexStats": {}}])}
    base = ops()
    assert set(base) == {"_id_", "a_1", "b_1"} and base["b_1"] == 0
    list(co.find({"a": 2}))
    co.count_documents({"a": {"$gt": 2}})
    co.update_many({"a": 1}, {"$set": {"x": 1}})
    co.find_one({"_id": 7})
    list(co.find({"x": 1}))  # a collection scan: no index
    now = ops()
    assert (now["a_1"] - base["a_1"], now["b_1"], now["_id_"] - base["_id_"]) == (3, 0, 1)
    doc = next(co.aggregate([{"$indexStats": {}}, {"$match": {"name": "a_1"}}]))
    assert doc["key"] == {"a": 1} and doc["spec"]["name"] == "a_1" and doc["host"]
    assert doc["accesses"]["since"].year >= 2026
    with pytest.raises(OperationFailure) as ei:
        list(co.aggregate([{"$match": {}}, {"$indexStats": {}}]))
    assert ei.value.code == 40602
    assert list(client.ixs.absent.aggregate([{"$indexStats": {}}])) == []


def test_parallel_arrays_in_a_compound_index_fail_as_in_mongodb(client):
    """pymongo gets code 171 (CannotIndexParallelArrays) for an insert, an
    update and an index build that would index two arrays of one compound
    index; nothing is written and the connection serves on."""
    from pymongo.errors import WriteError
    co = client.par.c
    co.create_index([("a", 1), ("b", 1)])
    co.insert_one({"_id": 1, "a": [1, 2], "b": 1})
    with pytest.raises(WriteError) as ei:
        co.insert_one({"_id": 2, "a": [1], "b": [2]})
    assert ei.value.code == 171 and "cannot index parallel arrays [a] [b]" in str(ei.value)
    with pytest.raises(WriteError) as ei:
        co.update_one({"_id": 1}, {"$set": {"b": [3]}})
    assert ei.value.code == 171
    assert list(co.find({}, sort=[("_id", 1)])) == [{"_id": 1, "a": [1, 2], "b": 1}]
    client.par.d.insert_one({"_id": 1, "x": [1], "y": [2]})
    with pytest.raises(OperationFailure) as ei:
        client.par.d.create_index([("x", 1), ("y", 1)])
    assert ei.value.code == 171
    assert [i["name"] for i in client.par.d.list_indexes()] == ["_id_"]


def test_partitions_bounded_by_min_key_and_max_key_cover_the_collection(client):
    """MongoDB's Spark connector reads a collection in partitions bounded by
    MinKey and MaxKey at its ends ({_id: {$gte: MinKey, $lt: b1}}, ...,
    {_id: {$gte: bn, $lte: MaxKey}}): every document is read once, over the
    _id, over a secondary index and with a hint, as against MongoDB."""
    from bson import MaxKey, MinKey, ObjectId
    co = client.parts.c
    oids = sorted(ObjectId() for _ in range(30))
    co.insert_many([{"_id": o, "n": i} for i, o in enumerate(oids)])
    co.create_index("n")
    for field, cuts in (("_id", [oids[10], oids[20]]), ("n", [10, 20])):
        bounds = [MinKey()] + cuts + [MaxKey()]
        seen = []
        for i, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            last = i == len(bounds) - 2
            flt = {field: {"$gte": lo, "$lte" if last else "$lt": hi}}
            seen += [d["_id"] for d in co.find(flt)]
            assert co.count_documents(flt) == len(list(co.find(flt).hint([(field, 1)])))
        assert sorted(seen) == oids
    co.insert_many([{"n": None}, {"n": "t"}, {}])  # MinKey and MaxKey hold every type
    assert co.count_documents({"n": {"$gt": MinKey(), "$lt": MaxKey()}}) == 33
    assert co.count_documents({"n": {"$gte": MinKey(), "$lt": 10}}) == 10  # a bracket beside
    assert co.count_documents({"n": {"$lte": MinKey()}}) == 0
