"""Query operators $regex $size $all $elemMatch $type and update operators
$mul $pop $setOnInsert (issue 26), on the engine."""
import datetime
import re

import pytest
from bson import ObjectId

from raymx import errors
from raymx.storage.query import compile_filter
from raymx.storage.update import apply_update

NS = "db.ops"
DOCS = [{"_id": 1, "name": "Ann", "tags": ["a", "b"], "n": 1,
         "items": [{"sku": "x", "q": 5}, {"sku": "y", "q": 1}]},
        {"_id": 2, "name": "bob", "tags": ["b"], "n": 2.5, "items": [{"sku": "x", "q": 1}]},
        {"_id": 3, "name": "Cy", "tags": [], "n": "three", "at": datetime.datetime(2020, 1, 1),
         "o": ObjectId()}]


def ids(flt):
    m = compile_filter(flt)
    return [d["_id"] for d in DOCS if m(d)]


def test_regex():
    assert ids({"name": {"$regex": "^a", "$options": "i"}}) == [1]
    assert ids({"name": re.compile("^[AB]")}) == [1]
    assert ids({"tags": {"$regex": "b"}}) == [1, 2]
    with pytest.raises(errors.InvalidFilter):
        compile_filter({"name": {"$regex": "("}})
    with pytest.raises(errors.InvalidFilter):
        compile_filter({"name": {"$options": "i"}})


def test_size_all_elem_match_type():
    assert ids({"tags": {"$size": 1}}) == [2] and ids({"tags": {"$size": 0}}) == [3]
    assert ids({"tags": {"$all": ["a", "b"]}}) == [1] and ids({"tags": {"$all": []}}) == []
    assert ids({"items": {"$elemMatch": {"sku": "x", "q": {"$gt": 2}}}}) == [1]
    assert ids({"tags": {"$elemMatch": {"$gte": "b"}}}) == [1, 2]
    assert ids({"n": {"$type": "number"}}) == [1, 2] and ids({"n": {"$type": "string"}}) == [3]
    assert ids({"n": {"$type": ["int", 2]}}) == [1, 3]
    assert ids({"at": {"$type": "date"}}) == [3] and ids({"o": {"$type": "objectId"}}) == [3]
    assert ids({"tags": {"$type": "array"}}) == [1, 2, 3]
    with pytest.raises(errors.InvalidFilter):
        compile_filter({"n": {"$type": "nope"}})


def test_indexed_regex_is_a_scan_not_a_wrong_bound(engine):
    engine.insert_many(NS, DOCS)
    with engine.begin() as tx:
        tx.create_index(NS, "name")
    assert [d["_id"] for d in engine.find(NS, {"name": re.compile("^b")})] == [2]
    assert [d["_id"] for d in engine.find(NS, {"name": {"$regex": "y$"}})] == [3]


def test_mul_pop_set_on_insert(engine):
    assert apply_update({"_id": 1, "p": 3}, {"$mul": {"p": 2, "q": 5}}) == \
        {"_id": 1, "p": 6, "q": 0}
    assert apply_update({"_id": 1, "a": [1, 2, 3]}, {"$pop": {"a": 1}}) == {"_id": 1, "a": [1, 2]}
    assert apply_update({"_id": 1, "a": [1, 2, 3]}, {"$pop": {"a": -1}}) == {"_id": 1, "a": [2, 3]}
    with pytest.raises(errors.InvalidUpdate):
        apply_update({"_id": 1, "a": [1]}, {"$pop": {"a": 2}})
    upd = {"$set": {"v": 1}, "$setOnInsert": {"created": True}}
    tx = engine.begin(autocommit=True)
    r = tx.update(NS, {"_id": 9}, upd, upsert=True)
    tx.commit()
    assert r.upserted_id == 9
    assert engine.find(NS, {"_id": 9}) == [{"_id": 9, "v": 1, "created": True}]
    tx = engine.begin(autocommit=True)
    tx.update(NS, {"_id": 9}, {"$set": {"v": 2}, "$setOnInsert": {"created": False}},
              upsert=True)
    tx.commit()
    assert engine.find(NS, {"_id": 9}) == [{"_id": 9, "v": 2, "created": True}]
