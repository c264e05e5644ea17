"""raymx.wire.aggregate: pipelines as pure code (no member, no socket)."""
import datetime

import pytest

from raymx.wire import aggregate
from raymx.wire.errors import CommandError

DOCS = [{"_id": i, "item": "ab"[i % 2], "qty": i, "tags": ["x", "y"][:i % 3],
         "sub": {"v": 10 - i}} for i in range(6)]


def run(pipeline, docs=DOCS):
    return aggregate.run(iter([dict(d) for d in docs]), pipeline)


def test_match_sort_skip_limit_count():
    assert [d["_id"] for d in run([{"$match": {"qty": {"$gt": 1}}}, {"$sort": {"qty": -1}},
                                   {"$skip": 1}, {"$limit": 2}])] == [4, 3]
    assert run([{"$match": {"item": "a"}}, {"$count": "n"}]) == [{"n": 3}]
    assert run([{"$match": {"item": "zzz"}}, {"$count": "n"}]) == []
    # two $match stages each keep their own filter
    assert [d["_id"] for d in run([{"$match": {"qty": {"$gt": 1}}},
                                   {"$match": {"qty": {"$lt": 4}}}])] == [2, 3]


def test_project_add_fields_unset():
    assert run([{"$match": {"_id": 1}}, {"$project": {"qty": 1}}]) == [{"_id": 1, "qty": 1}]
    assert run([{"$match": {"_id": 1}}, {"$project": {"_id": 0, "v": "$sub.v",
                                                      "two": {"$multiply": ["$qty", 2]}}}]) == \
        [{"v": 9, "two": 2}]
    assert run([{"$match": {"_id": 1}}, {"$project": {"tags": 0, "sub": 0}}]) == \
        [{"_id": 1, "item": "b", "qty": 1}]
    out = run([{"$match": {"_id": 2}}, {"$addFields": {"label": {"$concat": ["$item", "!"]},
                                                        "sub.w": 1}}])
    assert out[0]["label"] == "a!" and out[0]["sub"] == {"v": 8, "w": 1}
    assert run([{"$match": {"_id": 2}}, {"$unset": ["tags", "sub"]}]) == \
        [{"_id": 2, "item": "a", "qty": 2}]
    with pytest.raises(CommandError):
        run([{"$project": {"a": 0, "b": "$qty"}}])


def test_unwind():
    out = run([{"$unwind": "$tags"}])
    assert [(d["_id"], d["tags"]) for d in out] == [(1, "x"), (2, "x"), (2, "y"), (4, "x"),
                                                    (5, "x"), (5, "y")]
    out = run([{"$unwind": {"path": "$tags", "preserveNullAndEmptyArrays": True,
                            "includeArrayIndex": "i"}}])
    assert len(out) == 8 and out[0] == {"_id": 0, "item": "a", "qty": 0, "sub": {"v": 10},
                                        "i": None}


def test_group_accumulators():
    out = run([{"$group": {"_id": "$item", "n": {"$sum": 1}, "total": {"$sum": "$qty"},
                           "avg": {"$avg": "$qty"}, "lo": {"$min": "$qty"},
                           "hi": {"$max": "$qty"}, "first": {"$first": "$qty"},
                           "last": {"$last": "$qty"}, "all": {"$push": "$qty"},
                           "tags": {"$addToSet": "$item"}, "c": {"$count": {}}}},
               {"$sort": {"_id": 1}}])
    assert out[0] == {"_id": "a", "n": 3, "total": 6, "avg": 2.0, "lo": 0, "hi": 4,
                      "first": 0, "last": 4, "all": [0, 2, 4], "tags": ["a"], "c": 3}
    assert run([{"$group": {"_id": None, "n": {"$sum": "$qty"}}}]) == [{"_id": None, "n": 15}]
    # min and max in the cross-type order (numbers < strings < dates)
    mixed = [{"v": 3}, {"v": "s"}, {"v": datetime.datetime(2020, 1, 1)}, {"v": None}, {}]
    assert run([{"$group": {"_id": 1, "lo": {"$min": "$v"}, "hi": {"$max": "$v"}}}],
               mixed) == [{"_id": 1, "lo": 3, "hi": datetime.datetime(2020, 1, 1)}]
    # group keys can be documents
    out = run([{"$group": {"_id": {"i": "$item", "big": {"$gte": ["$qty", 3]}},
                           "n": {"$sum": 1}}}, {"$sort": {"_id": 1}}])
    assert [(d["_id"], d["n"]) for d in out][:2] == [({"i": "a", "big": False}, 2),
                                                     ({"i": "a", "big": True}, 1)]


def test_expressions():
    d = {"a": 6, "b": 4, "s": "Hi", "arr": [1, 2, 3], "n": None}
    ev = aggregate.evaluate
    assert ev({"$add": ["$a", "$b", 1]}, d) == 11 and ev({"$subtract": ["$a", "$b"]}, d) == 2
    assert ev({"$divide": ["$a", "$b"]}, d) == 1.5 and ev({"$mod": ["$a", "$b"]}, d) == 2
    assert ev({"$toUpper": "$s"}, d) == "HI" and ev({"$size": "$arr"}, d) == 3
    assert ev({"$cond": [{"$gt": ["$a", 5]}, "big", "small"]}, d) == "big"
    assert ev({"$cond": {"if": {"$lt": ["$a", 5]}, "then": 1, "else": 0}}, d) == 0
    assert ev({"$ifNull": ["$n", "$missing", "dflt"]}, d) == "dflt"
    assert ev({"$in": [2, "$arr"]}, d) and ev({"$arrayElemAt": ["$arr", -1]}, d) == 3
    assert ev({"$and": [True, {"$not": [False]}]}, d) and ev({"$literal": "$a"}, d) == "$a"
    assert ev({"$add": ["$a", "$missing"]}, d) is None
    with pytest.raises(CommandError):
        ev({"$divide": ["$a", 0]}, d)
    with pytest.raises(CommandError, match="Unrecognized expression"):
        ev({"$frob": 1}, d)


def test_bad_pipelines_are_refused_before_reading():
    for bad in ([{"$frob": {}}], [{"$match": {}, "$sort": {"a": 1}}], ["x"]):
        with pytest.raises(CommandError):
            aggregate.check(bad)
    with pytest.raises(CommandError):
        run([{"$limit": -1}])
    with pytest.raises(CommandError):
        run([{"$group": {"n": {"$sum": 1}}}])
