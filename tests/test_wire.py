"""The MongoDB wire port with the real pymongo: a member's ShardService served
in process (real LMDB, real sockets, no Ray) through raymx.wire.WirePort."""
import socket
import struct
import time

import bson
import pymongo
import pytest
from pymongo import ReturnDocument
from pymongo.errors import (DuplicateKeyError, OperationFailure, WriteError)

from raymx.storage.limits import Limits
from raymx.wire import framing
from raymx.wire.server import WirePort
from tests.port_helpers import SECRET, serving


@pytest.fixture
def served(tmp_path):
    with serving(tmp_path, Limits(sync_interval_ms=20), make_port=lambda svc: WirePort(
            svc, SECRET, "127.0.0.1", {"member": 0, "replset": "rs"})) as ps:
        yield ps


def uri(p, secret=SECRET):
    return (f"mongodb://raymx:{secret}@127.0.0.1:{p.port}/?replicaSet=rs"
            "&authMechanism=SCRAM-SHA-256&uuidRepresentation=standard")


@pytest.fixture
def client(served):
    c = pymongo.MongoClient(uri(served[0]), serverSelectionTimeoutMS=10_000)
    yield c
    c.close()


def test_discovery_and_hello(served, client):
    p, _ = served
    assert client.admin.command("ping")["ok"] == 1.0
    h = client.admin.command("hello")
    assert h["isWritablePrimary"] and h["setName"] == "rs" and h["me"] == p.address
    assert h["hosts"] == [p.address] and h["primary"] == p.address
    assert h["maxWireVersion"] >= 17 and h["logicalSessionTimeoutMinutes"] == 30
    assert client.primary == ("127.0.0.1", p.port)
    assert client.admin.command("buildInfo")["version"].startswith("7.")


def test_wrong_password_and_no_auth(served):
    p, _ = served
    bad = pymongo.MongoClient(uri(p, "nope"), serverSelectionTimeoutMS=5000)
    with pytest.raises(OperationFailure) as ei:
        bad.admin.command("ping")
    assert ei.value.code == 18
    bad.close()
    anon = pymongo.MongoClient(f"mongodb://127.0.0.1:{p.port}/?replicaSet=rs",
                               serverSelectionTimeoutMS=5000)
    with pytest.raises(OperationFailure) as ei:
        anon.t.c.find_one()
    assert ei.value.code == 13
    assert anon.admin.command("hello")["setName"] == "rs"  # hello needs no credential
    anon.close()


def test_crud(client):
    c = client.db.things
    assert c.insert_one({"_id": 1, "a": 1}).inserted_id == 1
    c.insert_many([{"_id": i, "a": i % 3, "tags": ["x", "y"][:i % 3]} for i in range(2, 300)])
    assert c.count_documents({}) == 299 and c.estimated_document_count() == 299
    assert c.count_documents({"a": 1}) == 100
    got = list(c.find({"a": 2}, {"tags": 0}).sort("_id", -1).limit(3))
    assert got == [{"_id": 299, "a": 2}, {"_id": 296, "a": 2}, {"_id": 293, "a": 2}]
    assert len(list(c.find().batch_size(7))) == 299  # getMore
    assert list(c.find({}, skip=290, sort=[("_id", 1)]))[0]["_id"] == 291
    assert c.distinct("a") == [0, 1, 2] and c.distinct("tags") == ["x", "y"]
    r = c.update_one({"_id": 1}, {"$set": {"b": 5}})
    assert (r.matched_count, r.modified_count) == (1, 1)
    assert c.update_many({"a": 0}, {"$inc": {"b": 1}}).modified_count == 99
    r = c.update_one({"_id": 1000}, {"$set": {"b": 5}}, upsert=True)
    assert r.upserted_id == 1000
    assert c.replace_one({"_id": 1000}, {"z": 1}).modified_count == 1
    assert c.find_one({"_id": 1000}) == {"_id": 1000, "z": 1}
    assert c.delete_many({"a": 0}).deleted_count == 99
    assert c.delete_one({"_id": 1000}).deleted_count == 1
    assert c.find_one_and_update({"_id": 1}, {"$inc": {"b": 1}},
                                 return_document=ReturnDocument.AFTER)["b"] == 6
    assert c.find_one_and_delete({"_id": 2})["_id"] == 2
    assert c.find_one_and_replace({"_id": 4}, {"r": 1}, projection={"_id": 0}) == \
        {"a": 1, "tags": ["x"]}
    assert c.find_one_and_update({"_id": "new"}, {"$set": {"v": 1}}, upsert=True,
                                 return_document=ReturnDocument.AFTER) == {"_id": "new", "v": 1}


def test_errors_have_mongodb_codes(client):
    c = client.db.e
    c.insert_one({"_id": 1, "u": 1})
    with pytest.raises(DuplicateKeyError) as ei:
        c.insert_one({"_id": 1})
    assert ei.value.details["keyPattern"] == {"_id": 1}
    assert ei.value.details["keyValue"] == {"_id": 1}
    c.create_index("u", unique=True)
    with pytest.raises(DuplicateKeyError) as ei:
        c.insert_one({"_id": 2, "u": 1})
    assert ei.value.details["keyPattern"] == {"u": 1}
    assert ei.value.details["keyValue"] == {"u": 1}
    # an ordered insert_many stops at the first error; what came before is stored
    with pytest.raises(pymongo.errors.BulkWriteError) as ei:
        c.insert_many([{"_id": 3, "u": 3}, {"_id": 1}, {"_id": 4, "u": 4}])
    assert ei.value.details["nInserted"] == 1 and ei.value.details["writeErrors"][0]["index"] == 1
    with pytest.raises(pymongo.errors.BulkWriteError) as ei:
        c.insert_many([{"_id": 5, "u": 5}, {"_id": 1}, {"_id": 6, "u": 6}], ordered=False)
    assert ei.value.details["nInserted"] == 2
    assert sorted(d["_id"] for d in c.find()) == [1, 3, 5, 6]
    with pytest.raises(OperationFailure) as ei:
        client.db.command("frobnicate")
    assert ei.value.code == 59 and "frobnicate" in str(ei.value)
    with pytest.raises(OperationFailure) as ei:  # one raymx does another way says which
        client.admin.command("replSetReconfig", {"_id": "rs", "members": []})
    assert ei.value.code == 59 and "rs.add_member()" in str(ei.value)
    with pytest.raises(OperationFailure) as ei:
        list(c.aggregate([{"$frob": {}}]))
    assert ei.value.code == 40324
    with pytest.raises(WriteError) as ei:
        c.update_one({"_id": 1}, {"$frob": {"a": 1}})
    assert ei.value.code == 9
    assert c.find_one({"_id": 1}) == {"_id": 1, "u": 1}  # connection still usable
    # an update that cannot apply gets MongoDB's code for why, as drivers and
    # applications test it (e.code == 66), and nothing changes
    c.insert_one({"_id": 9, "s": "text", "n": 1, "arr": [1]})
    for update, code in [({"$set": {"_id": 10}}, 66), ({"$set": {"n": 2}, "$inc": {"n": 1}}, 40),
                         ({"$inc": {"n": "x"}}, 14), ({"$inc": {"s": 1}}, 14),
                         ({"$set": {"s.x": 1}}, 28), ({"$push": {"s": 1}}, 2),
                         ({"$set": {"arr.$": 5}}, 2), ({"$rename": {"arr.x": "z"}}, 2),
                         ({"$rename": {"n": "arr.0.y"}}, 2)]:
        with pytest.raises(WriteError) as ei:
            c.update_one({"_id": 9}, update)
        assert ei.value.code == code, (update, ei.value.details)
    with pytest.raises(WriteError) as ei:
        c.replace_one({"_id": 9}, {"_id": 11, "n": 0})
    assert ei.value.code == 66
    assert c.find_one({"_id": 9}) == {"_id": 9, "s": "text", "n": 1, "arr": [1]}


def test_bad_numbers_in_commands_are_the_senders_errors(client):
    """Counts that are not whole numbers (NaN, infinity, 1.5, a string), a
    negative batch size, a list of index names holding a document, ``$mod``
    of NaN and a ``$ifNull`` of nothing: each refused with MongoDB's code,
    none an ``InternalError`` (1) as a command fuzzer found them, and nothing
    is half done (a list of index names with one unknown drops none)."""
    db = client.nums
    db.c.insert_many([{"_id": i, "a": i} for i in range(5)])
    db.c.create_index("a")
    nan, inf = float("nan"), float("inf")
    for cmd, code in (({"find": "c", "limit": inf}, 2), ({"find": "c", "skip": nan}, 2),
                      ({"find": "c", "limit": 1.5}, 2), ({"find": "c", "limit": "x"}, 14),
                      ({"find": "c", "batchSize": inf}, 2), ({"find": "c", "batchSize": -1}, 51024),
                      ({"count": "c", "skip": inf}, 2), ({"count": "c", "limit": nan}, 2),
                      ({"getMore": bson.Int64(1), "collection": "c", "batchSize": inf}, 2),
                      ({"collStats": "c", "scale": inf}, 2), ({"dbStats": 1, "scale": inf}, 2),
                      ({"createIndexes": "c", "indexes": [{"key": {"z": 1}, "name": "z",
                                                           "expireAfterSeconds": nan}]}, 2),
                      ({"dropIndexes": "c", "index": [{}]}, 14),
                      ({"dropIndexes": "c", "index": ["a_1", "nope"]}, 27),
                      ({"find": "c", "filter": {"a": {"$mod": [nan, 1]}}}, 2),
                      ({"aggregate": "c", "pipeline": [{"$project": {"r": {"$ifNull": []}}}],
                        "cursor": {}}, 1257300)):
        with pytest.raises(OperationFailure) as ei:
            db.command(cmd)
        assert ei.value.code == code, (cmd, ei.value.details)
    assert "a_1" in db.c.index_information()  # the refused list dropped nothing
    assert db.command({"find": "c", "limit": 2.0, "skip": bson.Int64(1)})["cursor"][
        "firstBatch"] == [{"_id": 1, "a": 1}, {"_id": 2, "a": 2}]

def test_indexes_and_namespaces(client):
    db = client.shop
    db.create_collection("orders")
    assert db.list_collection_names() == ["orders"]
    assert "shop" in client.list_database_names()
    name = db.orders.create_index([("a", 1), ("b", -1)], unique=True)
    assert name == "a_1_b_-1"
    ixs = {i["name"]: i for i in db.orders.list_indexes()}
    assert ixs["a_1_b_-1"]["key"] == {"a": 1, "b": -1} and ixs["a_1_b_-1"]["unique"]
    db.orders.insert_many([{"_id": 1, "a": 1, "b": 1}, {"_id": 2, "a": 1, "b": 2}])
    with pytest.raises(DuplicateKeyError):
        db.orders.insert_one({"_id": 3, "a": 1, "b": 2})
    db.orders.drop_index(name)
    db.orders.insert_one({"_id": 3, "a": 1, "b": 2})
    db.orders.drop()
    assert db.list_collection_names() == []
    db.x.insert_one({"_id": 1})
    client.drop_database("shop")
    assert "shop" not in client.list_database_names()


def test_aggregate(client):
    c = client.db.sales
    c.insert_many([{"_id": i, "item": "ab"[i % 2], "qty": i, "tags": ["t%d" % (i % 3)]}
                   for i in range(10)])
    out = list(c.aggregate([
        {"$match": {"qty": {"$gte": 2}}}, {"$unwind": "$tags"},
        {"$group": {"_id": "$item", "n": {"$sum": 1}, "total": {"$sum": "$qty"},
                    "avg": {"$avg": "$qty"}, "lo": {"$min": "$qty"}, "hi": {"$max": "$qty"},
                    "first": {"$first": "$qty"}, "last": {"$last": "$qty"},
                    "all": {"$push": "$qty"}, "tags": {"$addToSet": "$tags"}}},
        {"$sort": {"_id": 1}}]))
    assert [g["_id"] for g in out] == ["a", "b"]
    a = out[0]
    assert (a["n"], a["total"], a["lo"], a["hi"], a["first"], a["last"]) == \
        (4, 20, 2, 8, 2, 8)
    assert a["avg"] == 5 and a["all"] == [2, 4, 6, 8] and sorted(a["tags"]) == ["t0", "t1", "t2"]
    assert list(c.aggregate([{"$match": {"item": "a"}}, {"$count": "n"}])) == [{"n": 5}]
    assert list(c.aggregate([{"$sort": {"qty": -1}}, {"$skip": 1}, {"$limit": 2},
                             {"$project": {"_id": 0, "q2": {"$multiply": ["$qty", 2]}}}])) == \
        [{"q2": 16}, {"q2": 14}]


def test_aggregate_answers_through_a_cursor_a_batch_at_a_time(client):
    """The output goes out a batch at a time (getMore), as MongoDB's does: in
    one answer, 48 MB of it broke the driver (ProtocolError: larger than
    maxMessageSizeBytes) and dropped the connection."""
    c = client.db.agg
    c.insert_many([{"_id": i, "pad": "p" * 300} for i in range(35)])
    db = client.db
    first = db.command("aggregate", "agg", pipeline=[{"$sort": {"_id": 1}}],
                       cursor={"batchSize": 10})["cursor"]
    assert [d["_id"] for d in first["firstBatch"]] == list(range(10)) and first["id"] != 0
    more = db.command("getMore", first["id"], collection="agg", batchSize=20)["cursor"]
    assert [d["_id"] for d in more["nextBatch"]] == list(range(10, 30)) and more["id"] != 0
    last = db.command("getMore", first["id"], collection="agg")["cursor"]
    assert [d["_id"] for d in last["nextBatch"]] == list(range(30, 35)) and last["id"] == 0
    with pytest.raises(OperationFailure) as ei:  # exhausted: gone
        db.command("getMore", first["id"], collection="agg")
    assert ei.value.code == 43
    empty = db.command("aggregate", "agg", pipeline=[], cursor={"batchSize": 0})["cursor"]
    assert empty["firstBatch"] == [] and empty["id"] != 0
    # as MongoDB: an id of no open cursor (here the exhausted one) is not found
    killed = db.command("killCursors", "agg", cursors=[empty["id"], first["id"]])
    assert killed["cursorsKilled"] == [empty["id"]], killed
    assert killed["cursorsNotFound"] == [first["id"]], killed
    cs = db.command("aggregate", "agg", pipeline=[{"$changeStream": {}}], cursor={})["cursor"]
    killed = db.command("killCursors", "agg", cursors=[cs["id"]])
    assert killed["cursorsKilled"] == [cs["id"]] and killed["cursorsNotFound"] == []
    killed = db.command("killCursors", "agg", cursors=[cs["id"]])  # a change stream's too
    assert killed["cursorsKilled"] == [] and killed["cursorsNotFound"] == [cs["id"]]
    with pytest.raises(OperationFailure) as ei:
        db.command("getMore", empty["id"], collection="agg")
    assert ei.value.code == 43
    with pytest.raises(OperationFailure) as ei:
        db.command("aggregate", "agg", pipeline=[], cursor={"batchSize": -1})
    assert ei.value.code == 2
    # 56 MB of output, through the driver's own cursor
    big = client.db.big
    for i in range(56):
        big.insert_one({"_id": i, "pad": bytes([i]) * (1 << 20)})
    assert [d["_id"] for d in big.aggregate([{"$sort": {"_id": -1}}])] == list(range(55, -1, -1))
    # one document of it all is more than a driver takes: a clear error, and
    # the connection goes on
    with pytest.raises(OperationFailure) as ei:
        list(big.aggregate([{"$group": {"_id": None, "all": {"$push": "$pad"}}}]))
    assert ei.value.code == 10334 and "maxMessageSizeBytes" in str(ei.value)
    assert big.count_documents({}) == 56


def test_lookup_sample_facet_through_pymongo(client):
    db = client.shop
    db.orders.insert_many([{"_id": 1, "sku": "a", "qty": 2}, {"_id": 2, "sku": "b", "qty": 1},
                           {"_id": 3, "sku": "c", "qty": 5}])
    db.items.insert_many([{"_id": "a", "price": 3}, {"_id": "b", "price": 10}])
    out = list(db.orders.aggregate([
        {"$lookup": {"from": "items", "localField": "sku", "foreignField": "_id",
                     "as": "item"}},
        {"$unwind": "$item"},
        {"$project": {"total": {"$multiply": ["$qty", "$item.price"]}}},
        {"$sort": {"_id": 1}}]))
    assert out == [{"_id": 1, "total": 6}, {"_id": 2, "total": 10}]
    assert len(list(db.orders.aggregate([{"$sample": {"size": 2}}]))) == 2
    (f,) = db.orders.aggregate([{"$facet": {"n": [{"$count": "n"}],
                                            "by": [{"$sortByCount": "$sku"}]}}])
    assert f["n"] == [{"n": 3}] and len(f["by"]) == 3
    with pytest.raises(OperationFailure) as ei:
        list(db.orders.aggregate([{"$lookup": {"from": "items", "as": "x"}}]))
    assert ei.value.code == 40322


def test_documents_stage_as_mongodb(client):
    """``$documents`` (MongoDB 5.1): a database's aggregate over documents of
    its own, and the foreign side of a ``$unionWith`` or ``$lookup`` with no
    collection; the same refusals as MongoDB's (jstests/aggregation/sources/
    documents.js)."""
    db = client.docs
    assert list(db.aggregate([{"$documents": [{"a1": 1}, {"a1": 2}]}])) == [{"a1": 1}, {"a1": 2}]
    made = db.aggregate([{"$documents": {"$map": {"input": {"$range": [0, 100]},
                                                  "in": {"x": "$$this"}}}}])
    assert list(made) == [{"x": i} for i in range(100)]
    db.coll.insert_one({"a": 1})
    db.names.insert_many([{"_id": i, "id_name": i} for i in range(10)])
    union = db.coll.aggregate([{"$unionWith": {"pipeline": [{"$documents": [{"xx": 1}, {"xx": 2}]}]}},
                               {"$group": {"_id": "$xx"}}, {"$sort": {"_id": 1}}])
    assert list(union) == [{"_id": None}, {"_id": 1}, {"_id": 2}]
    consts = [{"$documents": [{"xx": 1}, {"xx": 2}]}]
    for spec in ({"let": {"v": "$id_name"},
                  "pipeline": consts + [{"$match": {"$expr": {"$eq": ["$$v", "$xx"]}}}]},
                 {"localField": "id_name", "foreignField": "xx", "pipeline": consts}):
        got = db.names.aggregate([{"$lookup": dict(spec, **{"as": "m"})},
                                  {"$match": {"m": {"$ne": []}}}, {"$sort": {"_id": 1}}])
        assert list(got) == [{"_id": 1, "id_name": 1, "m": [{"xx": 1}]},
                             {"_id": 2, "id_name": 2, "m": [{"xx": 2}]}]
    db.aggregate([{"$documents": [{"_id": 1, "q": 1}]}, {"$out": "written"}])
    assert list(db.written.find()) == [{"_id": 1, "q": 1}]
    for where, pipeline, code in (
            (db.coll, [{"$documents": [{"a": 1}]}], 73),
            (db.coll, [{"$match": {}}, {"$documents": [{"a": 1}]}], 40602),
            (db, [{"$match": {}}, {"$documents": [{"a": 1}]}], 73),
            (db.coll, [{"$unionWith": {"pipeline": [{"$match": {}}]}}], 9),
            (db.coll, [{"$lookup": {"as": "x", "pipeline": [{"$match": {}}]}}], 9),
            (db, [{"$documents": [{"a": 1}, 2]}], 40228),
            (db, [{"$documents": "s"}], 5858203)):
        with pytest.raises(OperationFailure) as ei:
            list(where.aggregate(pipeline))
        assert ei.value.code == code, pipeline
    assert db.coll.count_documents({}) == 1  # the connection still serves

def test_coll_stats_db_stats_and_server_status(client):
    db = client.st
    db.c.insert_many([{"_id": i, "k": i % 3, "pad": "x" * 100} for i in range(50)])
    db.c.create_index("k")
    db.d.insert_one({"_id": 1})
    cs = db.command("collStats", "c")
    assert cs["ns"] == "st.c" and cs["count"] == 50 and cs["nindexes"] == 2
    assert 100 * 50 < cs["size"] < 200 * 50 and cs["avgObjSize"] == cs["size"] // 50
    assert set(cs["indexSizes"]) == {"_id_", "k_1"} and cs["totalIndexSize"] > 0
    assert db.command("collStats", "c", scale=1024)["size"] == cs["size"] // 1024
    (agg,) = db.c.aggregate([{"$collStats": {"storageStats": {}, "count": {}}}])
    assert agg["count"] == 50 and agg["storageStats"]["size"] == cs["size"]
    with pytest.raises(OperationFailure) as ei:
        db.command("collStats", "nope")
    assert ei.value.code == 26
    with pytest.raises(OperationFailure) as ei:
        list(db.c.aggregate([{"$match": {}}, {"$collStats": {}}]))
    assert ei.value.code == 40602
    ds = db.command("dbStats")
    assert (ds["db"], ds["collections"], ds["objects"], ds["indexes"]) == ("st", 2, 51, 3)
    assert ds["dataSize"] > cs["size"] and ds["fsTotalSize"] > 0
    ss = client.admin.command("serverStatus")
    assert ss["process"] == "raymx" and ss["repl"]["isWritablePrimary"]
    assert ss["connections"]["current"] >= 1 and ss["uptime"] >= 0


def test_positional_updates_and_array_filters_through_pymongo(client):
    c = client.db.pos
    c.insert_many([{"_id": 1, "g": [80, 85, 90], "items": [{"sku": "a", "q": 1},
                                                            {"sku": "b", "q": 2}]},
                   {"_id": 2, "g": [95, 70]}])
    assert c.update_one({"items.sku": "b"}, {"$inc": {"items.$.q": 10}}).modified_count == 1
    assert c.find_one({"_id": 1})["items"][1]["q"] == 12
    r = c.update_many({}, {"$set": {"g.$[hi]": 100}}, array_filters=[{"hi": {"$gte": 90}}])
    assert r.modified_count == 2
    c.bulk_write([pymongo.UpdateOne({"_id": 2}, {"$inc": {"g.$[]": 1}}),
                  pymongo.UpdateOne({"_id": 1}, {"$set": {"items.$[i].q": 0}},
                                    array_filters=[{"i.sku": "a"}])])
    assert [d["g"] for d in c.find().sort("_id")] == [[80, 85, 100], [101, 71]]
    after = c.find_one_and_update({"_id": 1}, {"$set": {"items.$[i].q": 5}},
                                  array_filters=[{"i.q": 0}], return_document=ReturnDocument.AFTER)
    assert after["items"] == [{"sku": "a", "q": 5}, {"sku": "b", "q": 12}]
    with pytest.raises(WriteError) as ei:
        c.update_one({"_id": 1}, {"$set": {"g.$": 0}})
    assert "positional operator did not find" in str(ei.value)
    # a document without the array, or with something else there: BadValue, as MongoDB
    c.insert_one({"_id": 3, "g": "text"})
    for field, what in (("items", "path 'items' must exist in the document"),
                        ("g", "cannot apply array updates to non-array element g")):
        with pytest.raises(WriteError, match=what) as ei:
            c.update_many({}, {"$set": {f"{field}.$[e]": 0}}, array_filters=[{"e": 1}])
        assert ei.value.code == 2


def test_ttl_index_through_pymongo(served, client):
    import datetime
    _, svc = served
    c = client.db.sessions
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    c.insert_many([{"_id": "old", "at": now - datetime.timedelta(hours=2)},
                   {"_id": "new", "at": now}])
    assert c.create_index("at", expireAfterSeconds=3600) == "at_1"
    assert c.index_information()["at_1"]["expireAfterSeconds"] == 3600
    with pytest.raises(OperationFailure):
        c.create_index([("a", 1), ("b", 1)], expireAfterSeconds=5)  # one field only
    svc.expire_once()  # (every Limits.ttl_interval_ms on the trimmer's thread)
    assert [d["_id"] for d in c.find()] == ["new"]


def test_expr_in_find_and_match_through_pymongo(client):
    c = client.db.expr
    c.insert_many([{"_id": i, "spent": i * 10, "budget": 45, "k": i % 2} for i in range(10)])
    over = {"$expr": {"$gt": ["$spent", "$budget"]}}
    assert [d["_id"] for d in c.find(over)] == [5, 6, 7, 8, 9]
    assert [d for d in c.find(dict(over, k=1), {"spent": 1}).sort("_id", -1).skip(1).limit(2)] \
        == [{"_id": 7, "spent": 70}, {"_id": 5, "spent": 50}]
    assert c.count_documents({}) == 10 and len(list(c.find(over, batch_size=2))) == 5
    assert [d["_id"] for d in c.aggregate([{"$match": over}, {"$match": {"k": 0}}])] == [6, 8]


def test_a_collation_other_than_simple_is_refused_not_ignored(client):
    c = client.db.coll8n
    c.insert_many([{"_id": 1, "s": "a"}, {"_id": 2, "s": "A"}])
    fr = {"locale": "fr", "strength": 2}
    for call in (lambda: list(c.find({"s": "a"}, collation=fr)),
                 lambda: c.count_documents({}, collation=fr),
                 lambda: list(c.aggregate([], collation=fr)),
                 lambda: c.update_one({"s": "a"}, {"$set": {"t": 1}}, collation=fr),
                 lambda: c.delete_many({"s": "a"}, collation=fr)):
        with pytest.raises(OperationFailure, match="collation .* is not supported"):
            call()
    assert [d["_id"] for d in c.find({"s": "a"}, collation={"locale": "simple"})] == [1]
    assert c.count_documents({}) == 2  # nothing written or deleted


def test_secondary_refuses_writes_with_not_writable_primary(served):
    p, svc = served
    svc.step_down()
    s = socket.create_connection(("127.0.0.1", p.port), timeout=5)
    try:
        def cmd(doc):
            s.sendall(framing.build_msg(1, 0, doc))
            hdr = s.recv(16, socket.MSG_WAITALL)
            n = struct.unpack("<i", hdr[:4])[0]
            body = s.recv(n - 16, socket.MSG_WAITALL)
            return framing.parse_msg(body)[1]
        assert cmd({"insert": "c", "documents": [{"_id": 1}], "$db": "d"})["code"] == 13
    finally:
        s.close()
    c = pymongo.MongoClient(uri(p), directConnection=True, serverSelectionTimeoutMS=5000)
    try:
        h = c.admin.command("hello")
        assert not h["isWritablePrimary"] and h["secondary"]
        with pytest.raises(pymongo.errors.NotPrimaryError) as ei:
            c.d.c.insert_one({"_id": 1})
        assert ei.value.details["code"] == 10107
    finally:
        c.close()


def test_bad_messages_get_error_documents(served):
    p, _ = served
    s = socket.create_connection(("127.0.0.1", p.port), timeout=5)
    try:
        def ask(raw):
            s.sendall(raw)
            hdr = s.recv(16, socket.MSG_WAITALL)
            n = struct.unpack("<i", hdr[:4])[0]
            return framing.parse_msg(s.recv(n - 16, socket.MSG_WAITALL))[1]
        # a body that is not BSON: an error document, the connection stays
        body = struct.pack("<i", 0) + b"\x00" + b"\x07\x00\x00\x00junk"
        r = ask(framing.HEADER.pack(16 + len(body), 5, 0, framing.OP_MSG) + body)
        assert r["ok"] == 0 and r["code"] == 9
        r = ask(framing.build_msg(6, 0, {"hello": 1, "$db": "admin"}))
        assert r["ok"] == 1 and r["setName"] == "rs"
        r = ask(framing.build_msg(7, 0, {"ping": 1, "$db": "admin"}))
        assert r["code"] == 13  # nothing but hello and authentication before it
        # the legacy OP_QUERY isMaster drivers send first
        q = bson.encode({"isMaster": 1})
        body = struct.pack("<i", 0) + b"admin.$cmd\x00" + struct.pack("<ii", 0, -1) + q
        s.sendall(framing.HEADER.pack(16 + len(body), 8, 0, framing.OP_QUERY) + body)
        hdr = s.recv(16, socket.MSG_WAITALL)
        length, _, rto, op = framing.HEADER.unpack(hdr)
        rest = s.recv(length - 16, socket.MSG_WAITALL)
        assert op == framing.OP_REPLY and rto == 8
        assert bson.decode(rest[20:])["ismaster"] is True
    finally:
        s.close()


def test_unsatisfiable_write_concern_and_unacknowledged_writes(client):
    """w=2 on a one-member set cannot be met: as MongoDB, the write stays and
    its writeConcernError is 100 UnsatisfiableWriteConcern at once (pymongo
    raises WriteConcernError, not WTimeoutError: nothing timed out); w=0 is
    not answered, yet runs."""
    from pymongo import WriteConcern
    from pymongo.errors import WriteConcernError, WTimeoutError
    c = client.db.wc
    t0 = time.monotonic()
    with pytest.raises(WriteConcernError) as ei:
        c.with_options(write_concern=WriteConcern(w=2, wtimeout=30_000)).insert_one({"_id": 1})
    assert time.monotonic() - t0 < 10  # not after the wtimeout
    assert ei.value.code == 100 and not isinstance(ei.value, WTimeoutError)
    assert "errInfo" not in ei.value.details
    assert c.find_one({"_id": 1}) == {"_id": 1}
    c.with_options(write_concern=WriteConcern(w=0)).insert_one({"_id": 2})
    deadline = time.time() + 10
    while c.find_one({"_id": 2}) is None:
        assert time.time() < deadline
        time.sleep(0.02)


def test_query_and_update_operators_through_pymongo(client):
    import re
    c = client.db.ops
    c.insert_many([{"_id": 1, "name": "Ann", "tags": ["a", "b"], "p": 2},
                   {"_id": 2, "name": "bob", "tags": ["b"], "p": 3}])
    assert [d["_id"] for d in c.find({"name": re.compile("^a", re.I)})] == [1]
    assert [d["_id"] for d in c.find({"name": {"$regex": "B", "$options": "i"}})] == [2]
    assert [d["_id"] for d in c.find({"tags": {"$size": 2}})] == [1]
    assert [d["_id"] for d in c.find({"tags": {"$all": ["b"]}, "p": {"$type": "int"}})] == [1, 2]
    c.update_one({"_id": 2}, {"$mul": {"p": 10}, "$pop": {"tags": 1}})
    assert c.find_one({"_id": 2}) == {"_id": 2, "name": "bob", "tags": [], "p": 30}
    c.update_one({"_id": 3}, {"$set": {"v": 1}, "$setOnInsert": {"new": True}}, upsert=True)
    c.update_one({"_id": 3}, {"$set": {"v": 2}, "$setOnInsert": {"new": False}}, upsert=True)
    assert c.find_one({"_id": 3}) == {"_id": 3, "v": 2, "new": True}


BAD_COMMANDS = [
    {"find": 5}, {"find": "c", "limit": "x"}, {"find": "c", "filter": 5},
    {"find": "c", "filter": {"a": {"$frob": 1}}}, {"find": "c", "sort": {"a": "up"}},
    {"insert": "c", "documents": [{"$a": 1}]},
    {"update": "c", "updates": [{"q": {}, "u": 5}]}, {"delete": "c", "deletes": [{"q": 5}]},
    {"delete": "c", "deletes": [{"q": {}, "limit": "x"}]}, {"getMore": "x", "collection": "c"},
    {"getMore": bson.Int64(12345), "collection": "c"}, {"aggregate": "c", "pipeline": 5},
    {"aggregate": "c", "pipeline": [{"$group": 5}]}, {"aggregate": "c", "pipeline": [5]},
    {"createIndexes": "c", "indexes": [{"key": 5}]}, {"createIndexes": "c", "indexes": 5},
    {"count": "c", "query": 5}, {"distinct": "c", "key": 5}, {"findAndModify": "c"},
    {"dropIndexes": "c", "index": 5}, {"killCursors": "c", "cursors": 5},
    {"insert": "c", "documents": [{}], "writeConcern": {"w": "nope"}},
    {"insert": "c", "documents": [{}], "writeConcern": 5},
    {"listCollections": 1, "filter": 5}, {"create": "c", "capped": True},
    {"commitTransaction": 1}, {"aggregate": "c", "pipeline": [{"$changeStream": 5}]},
]


@pytest.mark.parametrize("cmd", BAD_COMMANDS, ids=[next(iter(c)) + str(i)
                                                   for i, c in enumerate(BAD_COMMANDS)])
def test_bad_commands_get_mongodb_errors_and_the_connection_stays(client, cmd):
    """Bad input: an error document with a MongoDB code (never InternalError,
    never a dropped connection). (Shapes pymongo cannot even encode, such as
    documents: 5, are covered by test_bad_messages_get_error_documents.)"""
    from pymongo.errors import PyMongoError
    try:
        out = client.db.command(dict(cmd))
    except OperationFailure as e:
        assert e.code not in (None, 1), e.details
    except PyMongoError as e:  # a write error the driver raises as such
        assert getattr(e, "code", None) not in (None, 1), e
    else:
        assert "writeErrors" in out and out["writeErrors"][0]["code"] != 1, out
    assert client.db.command("ping")["ok"] == 1.0


def test_small_writes_and_point_reads_run_on_the_wire_ports_own_thread(served, client):
    """pymongo's insert_one, update_one by _id and find_one by _id are run on
    the wire port's loop (ShardService._drain, submit_read), as on the client
    port: no pool thread waits on them; a scan still runs on the reader pool
    and answers the same."""
    _, svc = served
    coll = client.get_database("o", write_concern=pymongo.WriteConcern(w=1, j=True)).c
    writes0, reads0 = svc.port_writes, svc.port_reads
    for k in range(30):
        coll.insert_one({"_id": k, "v": k})
    coll.update_one({"_id": 3}, {"$set": {"v": -3}})
    assert svc.port_writes >= writes0 + 25  # (a trim holding the writer may send one away)
    assert [coll.find_one({"_id": k})["v"] for k in (2, 3)] == [2, -3]
    assert svc.port_reads >= reads0 + 2
    assert sorted(d["_id"] for d in coll.find({"v": {"$gte": 20}})) == list(range(20, 30))
    assert coll.count_documents({}) == 30


def test_mongosh_start_up_commands_getlog_and_rs_status(served):
    """mongosh asks for ``getLog: "startupWarnings"`` at start-up and users
    type ``rs.status()`` (``replSetGetStatus``): both answered as MongoDB 7."""
    p, svc = served
    host, port_ = p.address.rsplit(":", 1)
    svc.topology_source = lambda: {"members": [{"id": 0, "wire": [host, int(port_)],
                                                "role": "primary", "state": "running"}],
                                   "primary": 0}
    c = pymongo.MongoClient(uri(p), serverSelectionTimeoutMS=10_000)
    try:
        log = c.admin.command("getLog", "startupWarnings")
        assert isinstance(log.pop("operationTime"), bson.Timestamp)  # every answer has one
        assert log == {"totalLinesWritten": 0, "log": [], "ok": 1.0}
        assert c.admin.command("getLog", "*")["names"] == ["global", "startupWarnings"]
        with pytest.raises(OperationFailure, match="No log named 'nope'") as ei:
            c.admin.command("getLog", "nope")
        assert ei.value.code == 96
        with pytest.raises(OperationFailure) as ei:
            c.admin.command("getLog", 5)
        assert ei.value.code == 14
        st = c.admin.command("replSetGetStatus")
        assert st["set"] == "rs" and st["myState"] == 1 and st["term"] >= 0
        assert st["members"] == [{"_id": 0, "name": p.address, "health": 1.0, "state": 1,
                                  "stateStr": "PRIMARY", "self": True}]
        # atlasVersion is not a MongoDB 7 server command either: mongosh expects 59
        with pytest.raises(OperationFailure) as ei:
            c.admin.command("atlasVersion")
        assert ei.value.code == 59 and "atlasVersion" in str(ei.value)
    finally:
        c.close()


def test_mongodb_uri_for_every_driver_and_for_pymongo_uuids():
    from raymx.wire import mongodb_uri
    topo = {"secret": "s/x", "members": [{"wire": ["h", 1]}, {"wire": ["h", 2]},
                                         {"wire": ["h", 3], "hidden": True}]}
    anyone = mongodb_uri("rs0", topo)  # the Node.js driver (mongosh's) takes it too
    assert anyone == ("mongodb://raymx:s%2Fx@h:1,h:2/?replicaSet=rs0&authSource=admin"
                      "&authMechanism=SCRAM-SHA-256")
    assert mongodb_uri("rs0", topo, driver="pymongo") == anyone + "&uuidRepresentation=standard"
    with pytest.raises(ValueError, match="driver 'java'"):
        mongodb_uri("rs0", topo, driver="java")


def test_gridfs_files_through_pymongo(client):
    """pymongo's GridFS and GridFSBucket over the wire port: chunked files
    written, read whole and from an offset, versioned by name, renamed and
    deleted with their chunks; the indexes they create; a missing file is
    gridfs' NoFile and the connection stays usable."""
    import io
    import os

    import gridfs
    from gridfs.errors import NoFile
    db = client.files
    fs = gridfs.GridFS(db)
    data = os.urandom(700_000)  # three 255 KiB chunks
    first = fs.put(data, filename="a.bin", metadata={"k": 1})
    second = fs.put(b"second", filename="a.bin")
    assert fs.get(first).read() == data
    assert fs.get_last_version("a.bin").read() == b"second"
    assert fs.get_version("a.bin", 0).length == 700_000
    assert fs.list() == ["a.bin"] and fs.find_one({"metadata.k": 1})._id == first
    assert db.fs.chunks.count_documents({"files_id": first}) == 3
    assert "files_id_1_n_1" in db.fs.chunks.index_information()
    assert "filename_1_uploadDate_1" in db.fs.files.index_information()
    fs.delete(second)
    assert fs.get_last_version("a.bin")._id == first and not fs.exists(second)
    assert db.fs.chunks.count_documents({"files_id": second}) == 0

    b = gridfs.GridFSBucket(db, bucket_name="bk", chunk_size_bytes=1000)
    text = b"hello world" * 500
    fid = b.upload_from_stream("x.txt", io.BytesIO(text), metadata={"t": "x"})
    out = io.BytesIO()
    b.download_to_stream(fid, out)
    assert out.getvalue() == text
    g = b.open_download_stream(fid)
    g.seek(4990)  # inside the fifth chunk, across into the sixth
    assert g.read(20) == text[4990:5010]
    with b.open_upload_stream("y.txt") as s:
        for i in range(50):
            s.write(b"%05d" % i * 100)
    assert b.open_download_stream_by_name("y.txt").read()[-5:] == b"00049"
    b.rename(fid, "z.txt")
    assert [f.filename for f in b.find({}, sort=[("filename", 1)])] == ["y.txt", "z.txt"]
    b.delete(s._id)
    assert db.bk.chunks.count_documents({"files_id": s._id}) == 0
    with pytest.raises(NoFile):
        b.delete(s._id)
    with pytest.raises(NoFile):
        b.open_download_stream("nope")
    b.upload_from_stream_with_id("myid", "w.txt", b"abc")
    assert b.open_download_stream("myid").read() == b"abc"
