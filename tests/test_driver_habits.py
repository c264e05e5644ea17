"""pymongo's first-hour habits in the native driver (issue 26 part 3), against
a real one-member set: ``client.db``, ``_id`` set on inserted dicts, the
cursor as an iterator, ``find``'s argument order, ``distinct``,
``find_one_and_*``, ``bulk_write``, ``estimated_document_count`` and
pymongo's exception names; the GTIDs stay on the results."""
import threading

import pymongo.errors
import pytest

import raymx
from raymx import errors
from raymx.client import (BulkWriteResult, Collection, Cursor, Database, DeleteMany, DeleteOne,
                          InsertOne, ReadPreference, ReplaceOne, ReturnDocument, UpdateMany,
                          UpdateOne)
from raymx.storage.gtid import GTID


@pytest.fixture(scope="module")
def rs(ray_session, tmp_path_factory):
    s = raymx.ReplicaSet.launch("habits", members=1,
                                data_dir=str(tmp_path_factory.mktemp("habits")))
    yield s
    s.shutdown()


@pytest.fixture
def client(rs):
    return rs.client()


@pytest.fixture
def coll(client, request):
    """A fresh collection per test, named after it."""
    c = client["habits"][request.node.name.replace("[", "_").replace("]", "")[:60]]
    c.drop()
    return c


def test_client_db_and_db_coll_attribute_access(client):
    db = client.shop
    assert isinstance(db, Database) and db.name == "shop"
    assert isinstance(db.orders, Collection) and db.orders.full_name == "shop.orders"
    db.orders.insert_one({"_id": 1})
    assert client["shop"]["orders"].find_one(1) == {"_id": 1}
    assert "shop" in client.list_database_names()
    with pytest.raises(AttributeError, match="client\\['_private'\\]"):
        client._private
    assert client["_private"].name == "_private"  # by item, any name
    assert client.get_database("shop").get_collection("orders").full_name == "shop.orders"
    assert not hasattr(client, "__length_hint__")


def test_insert_sets_id_on_the_callers_dicts(coll):
    d = {"name": "ann"}
    r = coll.insert_one(d)
    assert d["_id"] == r.inserted_id and isinstance(r.gtid, GTID)
    assert coll.find_one(r.inserted_id) == d
    own = {"_id": "mine", "x": 1}
    assert coll.insert_one(own).inserted_id == "mine" and own == {"_id": "mine", "x": 1}
    docs = [{"i": i} for i in range(5)] + [{"_id": "given", "i": 5}]
    r = coll.insert_many(docs)
    assert [x["_id"] for x in docs] == r.inserted_ids and docs[-1]["_id"] == "given"
    assert len(set(r.inserted_ids)) == 6
    # a large insert goes in parts: every dict still gets its id
    big = [{"n": i} for i in range(700)]
    r = coll.insert_many(big)
    assert [x["_id"] for x in big] == r.inserted_ids and len(set(r.inserted_ids)) == 700
    assert coll.find_one({"n": 699}) == big[699]
    # a refused insert sets nothing
    bad = {"v": object()}
    with pytest.raises(errors.InvalidDocument):
        coll.insert_one(bad)
    assert "_id" not in bad


def test_cursor_is_an_iterator_with_close_alive_and_with(coll):
    coll.insert_many([{"_id": i} for i in range(250)])
    c = coll.find(sort=[("_id", 1)], batch_size=40)
    assert isinstance(c, Cursor) and iter(c) is c and c.alive
    assert next(c) == {"_id": 0} and c.next() == {"_id": 1}
    assert [d["_id"] for d in c] == list(range(2, 250))  # through getMores
    assert not c.alive
    with pytest.raises(StopIteration):
        next(c)
    assert list(c) == []  # iterated once: nothing more
    with pytest.raises(errors.InvalidOperation, match="limit"):
        c.limit(3)

    c = coll.find(batch_size=10).sort("_id", -1)
    assert next(c) == {"_id": 249}
    cid = c.cursor_id
    assert cid and c.alive
    c.close()  # kills the member's cursor
    assert not c.alive and c.cursor_id == 0 and list(c) == []
    with pytest.raises(errors.InvalidOperation, match="not found"):
        c._conn.request({"op": "getMore", "cursor": cid, "batch": 10})

    with coll.find(batch_size=10) as c2:
        assert next(c2)["_id"] == 0
        cid = c2.cursor_id
    assert cid and not c2.alive
    with pytest.raises(errors.InvalidOperation, match="not found"):
        c2._conn.request({"op": "getMore", "cursor": cid, "batch": 10})

    # to_list keeps working, over getMores, after a next(); with a length, in steps
    c = coll.find({"_id": {"$gte": 100}}, batch_size=7).sort("_id")
    assert next(c) == {"_id": 100}
    assert [d["_id"] for d in c.to_list(10)] == list(range(101, 111))
    assert [d["_id"] for d in c.to_list()] == list(range(111, 250))
    # the last batch: alive while documents of it are left
    c = coll.find({"_id": {"$lt": 3}})
    assert c.alive and next(c) and c.alive and next(c) and c.alive and next(c)
    assert not c.alive


def test_find_takes_pymongos_positional_order(coll):
    coll.insert_many([{"_id": i, "v": i % 3} for i in range(10)])
    # find(filter, projection, skip, limit)
    got = coll.find({"_id": {"$gte": 1}}, {"v": 1, "_id": 0}, 2, 3, sort=[("_id", 1)])
    assert got.to_list() == [{"v": 0}, {"v": 1}, {"v": 2}]
    assert [d["_id"] for d in coll.find(None, None, 7, sort="_id")] == [7, 8, 9]
    assert coll.find_one({}, None, 4, sort=[("_id", -1)]) == {"_id": 5, "v": 2}
    assert coll.find_one({"v": 1}, {"_id": 1}, sort={"_id": -1}) == {"_id": 7}
    with pytest.raises(TypeError):
        coll.find({}, None, 0, 0, [("_id", 1)])  # sort is not positional
    with pytest.raises(TypeError, match="skip"):
        coll.find({}, None, [("_id", 1)])  # the old order: a sort where skip goes
    with pytest.raises(TypeError, match="filter"):
        coll.find([("_id", 1)])
    assert [d["_id"] for d in coll.find({}, limit=-2, sort="_id")] == [0, 1]  # pymongo's -n


def test_distinct(coll):
    coll.insert_many([
        {"_id": 1, "tag": ["a", "b"], "who": {"name": "x"}, "n": 1},
        {"_id": 2, "tag": "b", "who": {"name": "y"}, "n": 2.0},
        {"_id": 3, "tag": ["c"], "who": {"name": "x"}, "n": "1"},
        {"_id": 4, "n": None},
    ])
    assert coll.distinct("tag") == ["a", "b", "c"]  # array elements count one by one
    assert coll.distinct("who.name") == ["x", "y"]
    assert coll.distinct("tag", {"who.name": "x"}) == ["a", "b", "c"]
    assert coll.distinct("tag", {"_id": 2}) == ["b"]
    assert coll.distinct("n") == [None, 1, 2.0, "1"]  # MongoDB's order across types
    assert coll.distinct("nope") == []
    with pytest.raises(TypeError, match="key"):
        coll.distinct(["tag"])


def test_find_one_and_update_replace_delete(coll):
    coll.insert_many([{"_id": i, "n": i, "g": i % 2} for i in range(5)])
    before = coll.find_one_and_update({"g": 0}, {"$inc": {"n": 10}}, sort=[("n", -1)])
    assert before == {"_id": 4, "n": 4, "g": 0}
    after = coll.find_one_and_update({"g": 0}, {"$inc": {"n": 10}}, {"n": 1, "_id": 0},
                                     sort=[("n", -1)], return_document=ReturnDocument.AFTER)
    assert after == {"n": 24}
    assert coll.find_one_and_update({"g": 9}, {"$set": {"x": 1}}) is None
    up = coll.find_one_and_update({"_id": "new"}, {"$set": {"x": 1}}, upsert=True,
                                  return_document=ReturnDocument.AFTER)
    assert up == {"_id": "new", "x": 1}
    assert coll.find_one_and_update({"_id": "new2"}, {"$set": {"x": 1}}, upsert=True) is None
    assert coll.find_one("new2") == {"_id": "new2", "x": 1}

    old = coll.find_one_and_replace({"_id": 1}, {"r": True})
    assert old == {"_id": 1, "n": 1, "g": 1} and coll.find_one(1) == {"_id": 1, "r": True}
    new = coll.find_one_and_replace({"_id": 3}, {"r": 3}, return_document=ReturnDocument.AFTER)
    assert new == {"_id": 3, "r": 3}

    gone = coll.find_one_and_delete({"g": 0}, sort=[("n", 1)])
    assert gone == {"_id": 0, "n": 0, "g": 0} and coll.find_one(0) is None
    assert coll.find_one_and_delete({"_id": "none"}) is None

    with pytest.raises(errors.InvalidUpdate, match="find_one_and_replace"):
        coll.find_one_and_update({"_id": 2}, {"n": 1})
    with pytest.raises(errors.InvalidUpdate, match="\\$ operators"):
        coll.find_one_and_replace({"_id": 2}, {"$set": {"n": 1}})
    with pytest.raises(TypeError, match="filter"):
        coll.find_one_and_delete("x")
    with pytest.raises(TypeError, match="wtimeout"):
        coll.find_one_and_delete({}, wtimeout=5)  # pymongo's spelling is not raymx's
    assert coll.find_one(2) == {"_id": 2, "n": 2, "g": 0}


def test_find_one_and_update_is_atomic_under_concurrency(coll):
    """Each caller gets a distinct counter value: no write comes between a
    find and its update."""
    coll.insert_one({"_id": "ctr", "n": 0})
    seen, errs = [], []

    def take():
        try:
            for _ in range(15):
                d = coll.find_one_and_update({"_id": "ctr"}, {"$inc": {"n": 1}},
                                             return_document=ReturnDocument.AFTER, w=1)
                seen.append(d["n"])
        except Exception as e:  # reported below
            errs.append(e)
    ts = [threading.Thread(target=take) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errs
    assert sorted(seen) == list(range(1, 46))
    assert coll.find_one("ctr")["n"] == 45


def test_find_one_and_modify_and_bulk_inside_a_transaction(client, coll):
    coll.insert_many([{"_id": 1, "n": 1}, {"_id": 2, "n": 2}])
    with client.transaction() as tx:
        c = tx[coll.database_name][coll.name]
        assert c.find_one_and_update({"_id": 1}, {"$inc": {"n": 1}},
                                     return_document=ReturnDocument.AFTER) == {"_id": 1, "n": 2}
        assert c.find_one_and_delete({"_id": 2}) == {"_id": 2, "n": 2}
        r = c.bulk_write([InsertOne({"_id": 3}), UpdateOne({"_id": 1}, {"$set": {"t": 1}})])
        assert r.inserted_count == 1 and r.modified_count == 1
        assert c.distinct("_id") == [1, 3] and c.estimated_document_count() == 2
    assert isinstance(tx.gtid, GTID)
    assert coll.find().sort("_id").to_list() == [{"_id": 1, "n": 2, "t": 1}, {"_id": 3}]
    # an exception in the block: nothing of it stays
    with pytest.raises(errors.BulkWriteError):
        with client.transaction() as tx:
            c = tx[coll.database_name][coll.name]
            c.find_one_and_delete({"_id": 1})
            c.bulk_write([InsertOne({"_id": 4}), InsertOne({"_id": 3})])
    assert [d["_id"] for d in coll.find(sort="_id")] == [1, 3]


def test_bulk_write_mixed_requests(coll):
    coll.insert_many([{"_id": i, "g": i % 2} for i in range(6)])
    ins = [{"k": "a"}, {"k": "b"}]
    r = coll.bulk_write([
        InsertOne(ins[0]), InsertOne(ins[1]),
        UpdateOne({"_id": 0}, {"$set": {"u": 1}}),
        UpdateMany({"g": 1}, {"$set": {"odd": True}}),
        ReplaceOne({"_id": 2}, {"rep": 1}),
        UpdateOne({"_id": "up"}, {"$set": {"u": 2}}, upsert=True),
        DeleteOne({"_id": 4}),
        DeleteMany({"k": {"$exists": True}}),
    ], w=1, j=True)
    assert isinstance(r, BulkWriteResult)
    assert (r.inserted_count, r.matched_count, r.modified_count, r.deleted_count,
            r.upserted_count) == (2, 5, 5, 3, 1)
    assert r.upserted_ids == {5: "up"}
    assert all("_id" in d for d in ins)  # set on the InsertOne's documents
    # the two inserts ran as one statement: 7 statements, each under its GTID, in order
    assert len(r.gtids) == 7 and r.gtids == sorted(r.gtids) and r.gtid == r.gtids[-1]
    assert r.bulk_api_result["nUpserted"] == 1
    # read after the bulk's last GTID (raymx's read-after-GTID)
    after = coll.with_options(read_preference=ReadPreference("nearest", after=r.gtid))
    assert after.find_one(0) == {"_id": 0, "g": 0, "u": 1}
    assert after.find_one(2) == {"_id": 2, "rep": 1}
    assert after.count_documents({"odd": True}) == 3
    assert after.find_one(4) is None and after.count_documents({"k": {"$exists": True}}) == 0
    assert UpdateOne({"a": 1}, {"$set": {"b": 1}}) == UpdateOne({"a": 1}, {"$set": {"b": 1}})


def test_bulk_write_ordered_stops_at_the_first_refusal(coll):
    coll.insert_one({"_id": "dup"})
    reqs = [InsertOne({"_id": 1}), InsertOne({"_id": 2}), InsertOne({"_id": "dup"}),
            InsertOne({"_id": 3}), UpdateOne({"_id": 1}, {"$set": {"x": 1}})]
    with pytest.raises(errors.BulkWriteError, match="request 2 \\(DuplicateKey\\)") as ei:
        coll.bulk_write(reqs)
    d = ei.value.details
    assert [e["index"] for e in d["writeErrors"]] == [2]
    assert d["writeErrors"][0]["code"] == "DuplicateKey"
    assert d["writeErrors"][0]["op"] is reqs[2]
    assert d["nInserted"] == 2 and d["nModified"] == 0
    assert sorted(x["_id"] for x in coll.find({"_id": {"$in": [1, 2, 3]}})) == [1, 2]
    assert coll.find_one(1) == {"_id": 1}  # the update after the refusal did not run
    assert isinstance(ei.value, errors.OperationFailure)


def test_bulk_write_unordered_goes_past_refusals(coll):
    coll.insert_one({"_id": "dup"})
    reqs = [InsertOne({"_id": "dup"}), InsertOne({"_id": 1}), UpdateOne({"_id": 1}, {"$bad": 1}),
            UpdateOne({"_id": 1}, {"$set": {"x": 1}}), DeleteOne({"_id": "dup"})]
    with pytest.raises(errors.BulkWriteError) as ei:
        coll.bulk_write(reqs, ordered=False)
    d = ei.value.details
    assert [(e["index"], e["code"]) for e in d["writeErrors"]] == [(0, "DuplicateKey"),
                                                                    (2, "InvalidUpdate")]
    assert (d["nInserted"], d["nModified"], d["nRemoved"]) == (1, 1, 1)
    assert coll.find().to_list() == [{"_id": 1, "x": 1}]


def test_bulk_write_refuses_what_is_not_a_request(coll):
    with pytest.raises(TypeError, match="request 1, \\{'insertOne'.*is not a valid request"):
        coll.bulk_write([InsertOne({"_id": 1}), {"insertOne": {"document": {}}}])
    with pytest.raises(TypeError, match="must be a list"):
        coll.bulk_write(InsertOne({"_id": 1}))
    with pytest.raises(errors.InvalidOperation, match="no requests"):
        coll.bulk_write([])
    with pytest.raises(TypeError, match="InsertOne: document must be a dict"):
        InsertOne([("a", 1)])
    with pytest.raises(TypeError, match="DeleteOne: filter must be a dict"):
        DeleteOne("x")
    with pytest.raises(errors.InvalidOperation, match="collation not supported"):
        UpdateOne({}, {"$set": {"a": 1}}, collation={"locale": "fr"})
    with pytest.raises(TypeError, match="unexpected arguments"):
        coll.bulk_write([InsertOne({"_id": 1})], wtimeout=5)
    assert coll.count_documents({}) == 0  # nothing ran


def test_estimated_document_count(coll):
    assert coll.estimated_document_count() == 0
    coll.insert_many([{"i": i} for i in range(37)])
    assert coll.estimated_document_count() == 37 == coll.count_documents({})


@pytest.mark.parametrize("name", [
    "PyMongoError", "OperationFailure", "DuplicateKeyError", "NotPrimaryError", "WTimeoutError",
    "BulkWriteError", "ConnectionFailure", "AutoReconnect", "InvalidOperation",
    "ServerSelectionTimeoutError", "NetworkTimeout", "ConfigurationError"])
def test_pymongos_exception_names_exist_with_pymongos_hierarchy(name):
    """Each pymongo name is in raymx.errors, and where pymongo's class is a
    subclass of another listed name, raymx's is too (so an ``except`` of
    the parent catches it, as with pymongo)."""
    ours, theirs = getattr(errors, name), getattr(pymongo.errors, name)
    assert name in errors.__all__ and issubclass(ours, errors.RaymxError)
    for parent in ("PyMongoError", "OperationFailure", "ConnectionFailure", "AutoReconnect"):
        if issubclass(theirs, getattr(pymongo.errors, parent)):
            assert issubclass(ours, getattr(errors, parent)), (name, parent)


def test_pymongo_names_catch_what_raymx_raises(coll):
    assert errors.DuplicateKeyError is errors.DuplicateKey
    assert errors.NotPrimaryError is errors.NotPrimary
    assert errors.WTimeoutError is errors.WriteConcernTimeout
    assert errors.PyMongoError is errors.RaymxError
    coll.insert_one({"_id": 1})
    for name in ("DuplicateKeyError", "OperationFailure", "PyMongoError"):
        with pytest.raises(getattr(errors, name)):
            coll.insert_one({"_id": 1})
    with pytest.raises(errors.OperationFailure):
        coll.find({"$bad": 1}).to_list()  # InvalidFilter: a refused operation
    for cls in (errors.NotPrimary, errors.ConnectionLost, errors.PrimaryUnavailable,
                errors.RequestTimeout, errors.ShutDown):
        assert issubclass(cls, errors.AutoReconnect), cls
        assert issubclass(cls, errors.ConnectionFailure), cls
    assert issubclass(errors.RequestTimeout, TimeoutError)  # still
    for cls in (errors.PrimaryUnavailable, errors.StaleRead):  # no member fits, in time
        assert issubclass(cls, errors.ServerSelectionTimeoutError), cls
    for cls in (errors.InvalidInput, errors.WriteConcernTimeout, errors.TransactionAborted,
                errors.BulkWriteError):
        assert issubclass(cls, errors.OperationFailure), cls
    # errors still travel by their own class name
    back = errors.from_wire(errors.DuplicateKeyError("dup", ns="a.b").to_wire())
    assert type(back) is errors.DuplicateKey
    # a secondary's refusal is caught as NotPrimaryError (a write on a read-only path)
    with pytest.raises(errors.NotPrimaryError):
        raise errors.from_wire({"err": "NotPrimary", "msg": "no"})


def test_positional_updates_and_array_filters(coll):
    """The positional ``$`` (the element the filter matched), ``$[]`` and
    ``$[name]`` with ``array_filters``, as pymongo takes them: update_one,
    update_many, find_one_and_update and bulk_write."""
    coll.insert_many([{"_id": 1, "g": [80, 85, 90], "items": [{"sku": "a", "q": 1},
                                                                {"sku": "b", "q": 2}]},
                      {"_id": 2, "g": [95, 70]}])
    coll.update_one({"_id": 1, "items.sku": "b"}, {"$inc": {"items.$.q": 10}})
    assert coll.find_one({"_id": 1})["items"][1] == {"sku": "b", "q": 12}
    r = coll.update_many({}, {"$set": {"g.$[hi]": 100}}, array_filters=[{"hi": {"$gte": 90}}])
    assert (r.matched_count, r.modified_count) == (2, 2)
    assert [d["g"] for d in coll.find(sort=[("_id", 1)])] == [[80, 85, 100], [100, 70]]
    coll.bulk_write([UpdateOne({"_id": 2}, {"$inc": {"g.$[]": 1}}),
                     UpdateOne({"_id": 1}, {"$set": {"items.$[i].q": 0}},
                               array_filters=[{"i.sku": "a"}])])
    assert coll.find_one({"_id": 2})["g"] == [101, 71]
    assert coll.find_one({"_id": 1})["items"][0] == {"sku": "a", "q": 0}
    before = coll.find_one_and_update({"g": 85}, {"$set": {"g.$": 86}})
    assert before["g"] == [80, 85, 100] and coll.find_one({"_id": 1})["g"] == [80, 86, 100]
    with pytest.raises(errors.InvalidUpdate, match="positional operator did not find"):
        coll.update_one({"_id": 1}, {"$set": {"g.$": 0}})
    with pytest.raises(errors.InvalidUpdate, match="was not used"):
        coll.update_one({"_id": 1}, {"$set": {"x": 0}}, array_filters=[{"y": 1}])
    assert coll.find_one({"_id": 1})["g"] == [80, 86, 100]  # nothing written by those
