"""The wire port and MongoDB's types through pymongo: datetimes, ObjectIds,
Decimal128, UUIDs (standard and legacy), binary subtypes, DBRefs."""
import bson
import pymongo
import pytest
from pymongo.errors import DuplicateKeyError, WriteError

from tests.test_wire import client, served, uri  # noqa: F401 (the fixtures)


def test_mongodb_types_through_pymongo(client):
    """datetime, ObjectId, Decimal128, UUID: stored natively, indexed, queried,
    sorted and aggregated; _ids pymongo generates are ObjectIds."""
    import datetime
    import uuid

    from bson import Decimal128, ObjectId
    c = client.db.typed
    t0 = datetime.datetime(2026, 11, 25, 6, 0, 0, 123000)
    ids = c.insert_many([{"at": t0 + datetime.timedelta(hours=i), "price": Decimal128(f"{i}.25"),
                          "u": uuid.UUID(int=i), "k": i % 2} for i in range(6)]).inserted_ids
    assert all(isinstance(i, ObjectId) for i in ids)
    doc = c.find_one({"_id": ids[2]})
    assert doc == {"_id": ids[2], "at": t0 + datetime.timedelta(hours=2),
                   "price": Decimal128("2.25"), "u": uuid.UUID(int=2), "k": 0}
    c.create_index("at")
    c.create_index("u", unique=True)
    late = c.find({"at": {"$gte": t0 + datetime.timedelta(hours=4)}}).sort("at", -1)
    assert [d["_id"] for d in late] == [ids[5], ids[4]]
    assert [d["_id"] for d in c.find().sort("_id", 1)] == sorted(ids)
    with pytest.raises(DuplicateKeyError):
        c.insert_one({"u": uuid.UUID(int=3)})
    got = list(c.aggregate([{"$group": {"_id": "$k", "first": {"$min": "$at"},
                                        "n": {"$sum": 1}}}, {"$sort": {"_id": 1}}]))
    assert got == [{"_id": 0, "first": t0, "n": 3},
                   {"_id": 1, "first": t0 + datetime.timedelta(hours=1), "n": 3}]
    assert c.find_one({"price": Decimal128("5.25")})["_id"] == ids[5]
    # MongoDB's exact comparison of a decimal with a double (its jstests'
    # double_decimal_compare): 5.01 finds the double only, NumberDecimal("5.01")
    # both decimals, with an index or without
    c = client.db.decimals
    c.insert_many([{"_id": "d", "a": 5.01}, {"_id": "n", "a": Decimal128("5.01")},
                   {"_id": "n0", "a": Decimal128("5.0100")},
                   {"_id": "big", "a": Decimal128("12345678901234567.89")},
                   {"_id": "big2", "a": Decimal128("12345678901234567.88")}])
    for _ in range(2):
        assert [d["_id"] for d in c.find({"a": 5.01})] == ["d"]
        assert sorted(d["_id"] for d in c.find({"a": Decimal128("5.01")})) == ["n", "n0"]
        assert [d["_id"] for d in c.find({"a": {"$gt": Decimal128("12345678901234567.88")}})] \
            == ["big"]
        c.create_index("a")
    c.create_index("a", name="a_u", unique=True, partialFilterExpression={"a": {"$gt": 10}})
    # objects compare field by field: the values' types, then the names, then the values
    o = client.db.objects
    o.insert_many([{"_id": 1, "o": {"a": "x"}}, {"_id": 2, "o": {"b": 1}},
                   {"_id": 3, "o": {"b": 1, "a": None}}])
    for _ in range(2):
        assert [d["_id"] for d in o.find().sort("o", 1)] == [2, 3, 1]
        assert [d["_id"] for d in o.find({"o": {"$gt": {"b": 1}}}).sort("_id", 1)] == [1, 3]
        o.create_index("o")
    # BinData by length, then subtype, then bytes; UUIDs among them
    from bson.binary import Binary
    b = client.db.bins
    b.insert_many([{"_id": 1, "b": uuid.UUID(int=1)}, {"_id": 2, "b": Binary(b"\x00\x00", 0)},
                   {"_id": 3, "b": Binary(b"\xff", 5)}, {"_id": 4, "b": Binary(b"\xff", 0)}])
    assert [d["_id"] for d in b.find().sort("b", 1)] == [4, 3, 2, 1]
    assert [d["_id"] for d in b.find({"b": {"$gte": Binary(b"\x00\x00", 0)}}).sort("_id", 1)] \
        == [1, 2]
    with pytest.raises(WriteError, match="scope"):  # a Code with a scope: not stored
        c.insert_one({"b": bson.Code("f", {"x": 1})})


def test_a_subtype_4_binary_that_is_no_uuid_is_stored_as_it_is(served):
    """Binary subtype 4 of other than 16 bytes is no UUID: MongoDB stores it as
    it is, and so does raymx (it used to refuse the whole message as invalid
    BSON); a real UUID in the same message still becomes one."""
    import uuid

    from bson.binary import UUID_SUBTYPE, Binary
    odd = Binary(b"\x00\x01", UUID_SUBTYPE)
    real = Binary.from_uuid(uuid.UUID(int=99))
    with pymongo.MongoClient(uri(served[0]).replace("&uuidRepresentation=standard", ""),
                             serverSelectionTimeoutMS=10_000) as cl:
        c = cl.db.odd
        c.insert_many([{"_id": "odd", "b": odd, "u": real}, {"_id": "odd2", "b": [odd]}])
        c.insert_one({"_id": "one", "b": odd})  # the body section, not a sequence
        assert c.find_one({"_id": "odd"}) == {"_id": "odd", "b": odd, "u": real}
        assert c.find_one({"u": real})["_id"] == "odd"
        assert [d["_id"] for d in c.find({"b": odd}).sort("_id", 1)] == ["odd", "odd2", "one"]
    with pymongo.MongoClient(uri(served[0]), serverSelectionTimeoutMS=10_000) as std:
        assert std.db.odd.find_one({"_id": "odd"}, {"u": 1}) == {"_id": "odd", "u": uuid.UUID(int=99)}


def test_dbrefs_round_trip_and_are_found_through_pymongo(client):
    from bson.dbref import DBRef
    c = client.db.refs
    refs = [DBRef("users", 7), DBRef("users", 8, "app", note="x")]
    c.insert_many([{"_id": i, "owner": r} for i, r in enumerate(refs)])
    assert [d["owner"] for d in c.find().sort("_id", 1)] == refs
    assert [d["_id"] for d in c.find({"owner": refs[1]})] == [1]
    assert [d["_id"] for d in c.find({"owner.$id": 7})] == [0]
    c.update_one({"_id": 0}, {"$set": {"owner": DBRef("users", 9)}})
    assert c.find_one({"owner": DBRef("users", 9)})["_id"] == 0


def test_binary_subtypes_and_legacy_uuids_round_trip_through_pymongo(served, client):
    """A pymongo with ``uuidRepresentation=pythonLegacy`` (as older
    applications run) sends UUIDs as binary subtype 3: stored as such and
    read back as the same UUIDs; any other subtype keeps its subtype."""
    import uuid
    from bson.binary import Binary
    legacy = pymongo.MongoClient(uri(served[0]).replace("standard", "pythonLegacy"),
                                 serverSelectionTimeoutMS=10_000)
    try:
        u = uuid.uuid4()
        legacy.db.bins.insert_one({"_id": u, "md5": Binary(b"\x01" * 16, 5),
                                   "mine": Binary(b"x", 0x80)})
        got = legacy.db.bins.find_one({"_id": u})
        assert got == {"_id": u, "md5": Binary(b"\x01" * 16, 5), "mine": Binary(b"x", 0x80)}
        raw = client.db.bins.find_one({})  # a standard client sees the stored subtype 3
        assert raw["_id"] == Binary(u.bytes, 3) and raw["md5"].subtype == 5
        assert client.db.bins.count_documents({"mine": Binary(b"x", 0x80)}) == 1
        assert client.db.bins.count_documents({"mine": b"x"}) == 0
    finally:
        legacy.close()
