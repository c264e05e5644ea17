"""raymx.wire.aggregate: pipelines as pure code (no member, no socket)."""
import datetime

import pytest

from raymx.errors import InvalidFilter
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
    whole = run([{"$match": {"_id": 2}}])[0]
    without_id = {k: v for k, v in whole.items() if k != "_id"}
    for st in ({"$project": {"_id": 0}}, {"$project": {"_id": False}}, {"$unset": "_id"}):
        assert run([{"$match": {"_id": 2}}, st]) == [without_id]  # it returned {}
    assert run([{"$match": {"_id": 2}}, {"$project": {"_id": 1}}]) == [{"_id": 2}]
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


ORDERS = [{"_id": 1, "item": "a", "tags": ["x", "y"]}, {"_id": 2, "item": "b"},
          {"_id": 3}, {"_id": 4, "item": "zzz"}]
STOCK = [{"_id": "s1", "sku": "a", "n": 5}, {"_id": "s2", "sku": "a", "n": 1},
         {"_id": "s3", "sku": "b", "n": 2}, {"_id": "s4", "n": 0},
         {"_id": "s5", "sku": ["x", "q"], "n": 9}]


def test_lookup_joins_on_equality_as_mongodb_does():
    def lookup(coll):
        assert coll == "stock"
        return iter([dict(d) for d in STOCK])
    out = aggregate.run(iter([dict(d) for d in ORDERS]), [
        {"$lookup": {"from": "stock", "localField": "item", "foreignField": "sku",
                     "as": "stock"}}], lookup)
    got = {d["_id"]: [s["_id"] for s in d["stock"]] for d in out}
    # an array on either side matches by element; a missing field matches
    # documents where it is missing or null (s4); no match is an empty array
    assert got == {1: ["s1", "s2"], 2: ["s3"], 3: ["s4"], 4: []}
    out = aggregate.run(iter([dict(d) for d in ORDERS]), [
        {"$lookup": {"from": "stock", "localField": "tags", "foreignField": "sku",
                     "as": "s", "pipeline": [{"$project": {"n": 1}}]}}], lookup)
    assert out[0]["s"] == [{"_id": "s5", "n": 9}]
    # uncorrelated: the pipeline once, its output in every document
    out = aggregate.run(iter([{"_id": 1}, {"_id": 2}]), [
        {"$lookup": {"from": "stock", "as": "big", "pipeline": [
            {"$match": {"n": {"$gte": 5}}}, {"$count": "n"}]}}], lookup)
    assert [d["big"] for d in out] == [[{"n": 2}], [{"n": 2}]]
    for bad, code in (({"from": "stock", "as": "x", "localField": "a"}, 40322),
                      ({"from": "stock", "as": "x"}, 40322),
                      ({"from": "stock", "localField": "a", "foreignField": "b"}, 40321),
                      ({"from": "stock", "as": "x", "let": {"v": 1}, "localField": "a", "foreignField": "b"}, 9),
                      ({"from": "stock", "as": "x", "pipeline": [{"$nope": 1}]}, 40324),
                      ({"from": "stock", "as": "x", "pipeline": [], "on": 1}, 9)):
        with pytest.raises(CommandError) as ei:
            aggregate.check([{"$lookup": bad}])
        assert ei.value.code == code, bad
    with pytest.raises(CommandError):  # no other collection to read here
        run([{"$lookup": {"from": "stock", "as": "x", "pipeline": []}}])


def test_sample_replace_root_sort_by_count_and_facet():
    out = run([{"$sample": {"size": 4}}])
    assert len(out) == 4 and len({d["_id"] for d in out}) == 4
    assert len(run([{"$sample": {"size": 100}}])) == len(DOCS)
    with pytest.raises(CommandError):
        run([{"$sample": {"size": -1}}])
    assert run([{"$match": {"_id": 1}}, {"$replaceRoot": {"newRoot": "$sub"}}]) == [{"v": 9}]
    assert run([{"$match": {"_id": 2}}, {"$replaceWith": {"q": "$qty"}}]) == [{"q": 2}]
    with pytest.raises(CommandError) as ei:
        run([{"$replaceRoot": {"newRoot": "$qty"}}])
    assert ei.value.code == 40228
    assert run([{"$match": {"_id": {"$lt": 5}}}, {"$sortByCount": "$item"}]) == \
        [{"_id": "a", "count": 3}, {"_id": "b", "count": 2}]
    out = run([{"$facet": {"n": [{"$count": "n"}],
                           "top": [{"$sort": {"qty": -1}}, {"$limit": 1},
                                   {"$project": {"qty": 1}}]}}])
    assert out == [{"n": [{"n": 6}], "top": [{"_id": 5, "qty": 5}]}]
    with pytest.raises(CommandError) as ei:  # refused before reading anything
        aggregate.check([{"$facet": {"x": [{"$bogus": 1}]}}])
    assert ei.value.code == 40324


def test_match_takes_expr_beside_plain_conditions():
    # qty greater than sub.v (a comparison of two fields), among "a" items
    out = run([{"$match": {"item": "a", "$expr": {"$gt": ["$qty", "$sub.v"]}}}])
    assert [d["_id"] for d in out] == []
    out = run([{"$match": {"$expr": {"$gte": [{"$multiply": ["$qty", 2]}, "$sub.v"]}}}])
    assert [d["_id"] for d in out] == [4, 5]  # 8 >= 6, 10 >= 5
    assert [d["_id"] for d in run([{"$match": {"$expr": "$qty", "item": "b"}}])] == [1, 3, 5]
    with pytest.raises(CommandError):
        run([{"$match": {"$expr": {"$nope": 1}}}])


NOW = datetime.datetime(2024, 3, 5, 14, 7, 9, 123000)  # a Tuesday, BSON's millisecond precision


def ev(expr, doc=None):
    return aggregate.evaluate(expr, doc if doc is not None else {
        "_id": 1, "a": [1, 2, 3], "s": " Hello World ", "dt": NOW, "n": 2.567, "o": {"x": 1}})


def test_array_expressions_and_their_variables():
    assert ev({"$map": {"input": "$a", "as": "v", "in": {"$multiply": ["$$v", 10]}}}) == \
        [10, 20, 30]
    assert ev({"$map": {"input": "$a", "in": {"$add": ["$$this", "$$ROOT._id"]}}}) == [2, 3, 4]
    assert ev({"$filter": {"input": "$a", "cond": {"$gt": ["$$this", 1]}, "limit": 1}}) == [2]
    assert ev({"$reduce": {"input": "$a", "initialValue": {"sum": 0},
                           "in": {"sum": {"$add": ["$$value.sum", "$$this"]}}}}) == {"sum": 6}
    assert ev({"$let": {"vars": {"t": {"$sum": "$a"}}, "in": {"$multiply": ["$$t", 2]}}}) == 12
    assert ev({"$concatArrays": ["$a", [9]]}) == [1, 2, 3, 9]
    assert ev({"$slice": ["$a", -2]}) == [2, 3] and ev({"$slice": ["$a", 1, 1]}) == [2]
    assert (ev({"$first": "$a"}), ev({"$last": "$a"}), ev({"$max": "$a"}),
            ev({"$avg": "$a"}), ev({"$sum": [1, 2, "x"]})) == (1, 3, 3, 2, 3)
    assert ev({"$range": [0, 6, 2]}) == [0, 2, 4] and ev({"$reverseArray": "$a"}) == [3, 2, 1]
    assert ev({"$indexOfArray": ["$a", 2]}) == 1 and ev({"$isArray": "$a"}) is True
    assert sorted(ev({"$setUnion": ["$a", [3, 4]]})) == [1, 2, 3, 4]
    assert ev({"$setDifference": ["$a", [2]]}) == [1, 3]
    with pytest.raises(CommandError, match="undefined variable: nope"):
        ev("$$nope")
    with pytest.raises(CommandError):  # a variable name must start with a lower-case letter
        ev({"$map": {"input": "$a", "as": "Bad", "in": "$$Bad"}})


def test_string_math_and_conversion_expressions():
    assert ev({"$trim": {"input": "$s"}}) == "Hello World"
    assert ev({"$split": [{"$trim": {"input": "$s"}}, " "]}) == ["Hello", "World"]
    assert ev({"$substrCP": ["$s", 1, 5]}) == "Hello" and ev({"$strLenCP": "$s"}) == 13
    assert ev({"$regexMatch": {"input": "$s", "regex": "world", "options": "i"}}) is True
    assert ev({"$replaceAll": {"input": "a-b-c", "find": "-", "replacement": "+"}}) == "a+b+c"
    assert ev({"$strcasecmp": ["ABC", "abc"]}) == 0 and ev({"$indexOfCP": ["$s", "W"]}) == 7
    assert (ev({"$round": ["$n", 1]}), ev({"$trunc": ["$n", 1]}), ev({"$floor": "$n"}),
            ev({"$ceil": "$n"}), ev({"$abs": -3}), ev({"$pow": [2, 10]})) == \
        (2.6, 2.5, 2, 3, 3, 1024)
    assert ev({"$round": 2.5}) == 2.0 and ev({"$sqrt": None}) is None
    assert (ev({"$toString": 2.0}), ev({"$toString": "$n"}), ev({"$toString": True}),
            ev({"$toString": "$dt"})) == ("2", "2.567", "true", "2024-03-05T14:07:09.123Z")
    assert (ev({"$toInt": "42"}), ev({"$toInt": 4.9}), ev({"$toDouble": "1.5"}),
            ev({"$toBool": 0}), ev({"$toLong": "$dt"})) == (42, 4, 1.5, False, 1709647629123)
    assert [ev({"$type": x}) for x in ("$o", "$a", "$n", 1, 1 << 40, "$dt", "$nope", None)] == \
        ["object", "array", "double", "int", "long", "date", "missing", "null"]
    assert ev({"$convert": {"input": "abc", "to": "int", "onError": -1}}) == -1
    assert ev({"$convert": {"input": None, "to": "int", "onNull": 0}}) == 0
    with pytest.raises(CommandError) as e:
        ev({"$toInt": "abc"})
    assert e.value.code == 241  # ConversionFailure
    with pytest.raises(CommandError, match="numeric"):
        ev({"$abs": "x"})


def test_date_expressions():
    assert (ev({"$year": "$dt"}), ev({"$month": "$dt"}), ev({"$dayOfMonth": "$dt"}),
            ev({"$hour": "$dt"}), ev({"$millisecond": "$dt"}), ev({"$dayOfWeek": "$dt"}),
            ev({"$dayOfYear": "$dt"}), ev({"$isoWeek": "$dt"})) == (2024, 3, 5, 14, 123, 3, 65, 10)
    assert ev({"$hour": {"date": "$dt", "timezone": "+05:30"}}) == 19
    assert ev({"$hour": {"date": "$dt", "timezone": "America/New_York"}}) == 9
    assert ev({"$dateToString": {"date": "$dt", "format": "%Y-%m-%d %H:%M:%S.%L %j"}}) == \
        "2024-03-05 14:07:09.123 065"
    assert ev({"$dateToString": {"date": "$dt"}}) == "2024-03-05T14:07:09.123Z"
    assert ev({"$dateToString": {"date": "$nope", "onNull": "none"}}) == "none"
    assert ev({"$dateFromString": {"dateString": "2024-01-02T03:04:05Z"}}) == \
        datetime.datetime(2024, 1, 2, 3, 4, 5)
    assert ev({"$dateFromString": {"dateString": "05/03/2024", "format": "%d/%m/%Y"}}) == \
        datetime.datetime(2024, 3, 5)
    assert ev({"$dateAdd": {"startDate": datetime.datetime(2024, 1, 31), "unit": "month",
                            "amount": 1}}) == datetime.datetime(2024, 2, 29)
    assert ev({"$dateSubtract": {"startDate": "$dt", "unit": "hour", "amount": 14}}).hour == 0
    assert ev({"$dateDiff": {"startDate": "$dt", "endDate": datetime.datetime(2024, 4, 14),
                             "unit": "week"}}) == 6
    assert ev({"$dateDiff": {"startDate": "$dt", "endDate": datetime.datetime(2025, 1, 1),
                             "unit": "month"}}) == 10
    assert ev({"$dateTrunc": {"date": "$dt", "unit": "hour"}}) == datetime.datetime(2024, 3, 5,
                                                                                    14)
    assert ev({"$toDate": 0}) == datetime.datetime(1970, 1, 1)
    with pytest.raises(CommandError, match="time zone"):
        ev({"$hour": {"date": "$dt", "timezone": "Mars/Olympus"}})


def test_date_trunc_bins_from_2000_and_weeks_from_start_of_week_as_mongodb():
    d = datetime.datetime(2024, 1, 31, 10, 30)  # a Wednesday
    trunc = lambda **k: ev({"$dateTrunc": {"date": d, **k}})  # noqa: E731
    assert trunc(unit="week") == datetime.datetime(2024, 1, 28)  # Sunday, the default
    assert trunc(unit="week", startOfWeek="monday") == datetime.datetime(2024, 1, 29)
    assert trunc(unit="week", startOfWeek="Mon") == datetime.datetime(2024, 1, 29)
    # bins counted from 2000-01-01 (a Saturday), for weeks from its first startOfWeek
    assert trunc(unit="week", startOfWeek="sat", binSize=2) == datetime.datetime(2024, 1, 27)
    assert trunc(unit="day", binSize=7) == datetime.datetime(2024, 1, 27)
    assert trunc(unit="hour", binSize=5) == datetime.datetime(2024, 1, 31, 6)
    assert trunc(unit="month", binSize=7) == datetime.datetime(2023, 12, 1)
    assert trunc(unit="year", binSize=10) == datetime.datetime(2020, 1, 1)
    assert trunc(unit="quarter") == datetime.datetime(2024, 1, 1)
    assert trunc(unit="week", startOfWeek=None) is None
    with pytest.raises(CommandError, match="startOfWeek"):
        trunc(unit="week", startOfWeek="someday")
    with pytest.raises(CommandError, match="binSize"):
        trunc(unit="day", binSize=0)
    diff = lambda s, e, unit, **k: ev({"$dateDiff": {  # noqa: E731
        "startDate": s, "endDate": e, "unit": unit, **k}})
    D = datetime.datetime
    assert diff(D(2023, 12, 31), D(2024, 1, 1), "year") == 1  # a boundary crossed
    assert diff(D(2024, 1, 1), D(2024, 12, 31), "year") == 0
    assert diff(D(2024, 1, 28), D(2024, 1, 29), "week") == 0  # Sunday to Monday
    assert diff(D(2024, 1, 28), D(2024, 1, 29), "week", startOfWeek="monday") == 1
    assert diff(D(2024, 3, 31), D(2024, 4, 1), "quarter") == 1
    assert diff(D(2024, 3, 31), D(2024, 2, 1), "month") == -1
    # across New York's daylight saving change (2024-03-10): days keep the
    # wall-clock hour (noon EST + 1 day = noon EDT, 16:00Z; it was 17:00Z),
    # hours are fixed lengths counted from 2000-01-01 in the zone, as MongoDB's
    ny = {"timezone": "America/New_York"}
    assert ev({"$dateAdd": {"startDate": D(2024, 3, 9, 17), "unit": "day", "amount": 1,
                            **ny}}) == D(2024, 3, 10, 16)
    assert ev({"$dateAdd": {"startDate": D(2024, 3, 9, 17), "unit": "hour", "amount": 24,
                            **ny}}) == D(2024, 3, 10, 17)
    assert ev({"$dateTrunc": {"date": D(2024, 3, 10, 12), "unit": "day", **ny}}) == \
        D(2024, 3, 10, 5)
    assert ev({"$dateTrunc": {"date": D(2024, 3, 11, 12), "unit": "day", **ny}}) == \
        D(2024, 3, 11, 4)
    assert ev({"$dateTrunc": {"date": D(2024, 3, 10, 12), "unit": "hour", "binSize": 3,
                              **ny}}) == D(2024, 3, 10, 11)


def test_one_number_expressions_keep_the_type_as_mongodb():
    from bson import Decimal128, Int64
    assert ev({"$ceil": 1.2}) == 2.0 and type(ev({"$ceil": 1.2})) is float
    assert ev({"$floor": -1.5}) == -2.0 and type(ev({"$floor": -1.5})) is float
    assert ev({"$ceil": 5}) == 5 and type(ev({"$ceil": 5})) is int
    assert ev({"$ceil": float("inf")}) == float("inf")
    assert type(ev({"$abs": Int64(-3)})) is Int64
    assert ev({"$ceil": Decimal128("1.2")}) == Decimal128("2")
    assert ev({"$floor": Decimal128("-1.5")}) == Decimal128("-2")
    assert ev({"$abs": Decimal128("-3.10")}) == Decimal128("3.10")
    assert ev({"$log10": Decimal128("1000")}) == Decimal128("3")
    assert str(ev({"$sqrt": Decimal128("2")})).startswith("1.41421356237309504880168872")
    assert type(ev({"$sin": Decimal128("0")})) is Decimal128
    assert ev({"$round": [Decimal128("2.345"), 2]}) == Decimal128("2.34")  # half to even
    assert ev({"$trunc": [Decimal128("-2.7")]}) == Decimal128("-2")
    assert ev({"$round": [Int64(15), -1]}) == 20 and type(ev({"$round": [Int64(15), -1]})) \
        is Int64
    assert ev({"$exp": 1000}) == float("inf")
    with pytest.raises(CommandError, match="domain"):
        ev({"$sqrt": Decimal128("-1")})


def test_redact_keeps_prunes_and_descends_each_level():
    doc = {"_id": 1, "level": 1, "a": {"level": 2, "x": 1},
           "b": [{"level": 1, "y": 1}, {"level": 3}, 5, [{"level": 3}, 6]], "c": {"level": 3}}
    by_level = {"$cond": [{"$lte": ["$level", 2]}, "$$DESCEND", "$$PRUNE"]}
    assert run([{"$redact": by_level}], [doc]) == [
        {"_id": 1, "level": 1, "a": {"level": 2, "x": 1}, "b": [{"level": 1, "y": 1}, 5, [6]]}]
    assert run([{"$redact": "$$KEEP"}], [doc]) == [doc]
    assert run([{"$redact": "$$PRUNE"}], [doc]) == []
    # $$ROOT is the whole document at every level
    assert run([{"$redact": {"$cond": [{"$eq": ["$$ROOT._id", 1]}, "$$KEEP", "$$PRUNE"]}}],
               [doc, {"_id": 2}]) == [doc]
    with pytest.raises(CommandError) as e:
        run([{"$redact": 1}], [doc])
    assert e.value.code == 17053
    with pytest.raises(CommandError, match="undefined variable"):
        run([{"$project": {"x": "$$KEEP"}}], [doc])


def test_now_and_cluster_time_are_fixed_for_the_whole_command():
    from bson import Timestamp
    docs = [{"_id": i} for i in range(200)]
    v = aggregate.let_of({"let": {"then": "$$NOW"}})
    out = aggregate.run(iter(docs), [{"$addFields": {"n": "$$NOW", "t": "$$CLUSTER_TIME",
                                                      "same": {"$eq": ["$$then", "$$NOW"]}}}],
                        variables=v)
    assert len({d["n"] for d in out}) == 1 and all(d["same"] for d in out)
    assert isinstance(out[0]["t"], Timestamp) and out[0]["n"].microsecond % 1000 == 0


def test_median_and_percentile_accumulators_window_functions_and_expressions():
    docs = [{"g": i % 2, "v": i} for i in range(10)] + [{"g": 0, "v": "x"}, {"g": 1}]
    out = run([{"$group": {"_id": "$g",
                           "m": {"$median": {"input": "$v", "method": "approximate"}},
                           "p": {"$percentile": {"input": "$v", "p": [0, 0.5, 0.9, 1],
                                                 "method": "discrete"}},
                           "c": {"$percentile": {"input": "$v", "p": [0.5],
                                                 "method": "continuous"}}}},
               {"$sort": {"_id": 1}}], docs)
    # non-numbers and missing values are left out; doubles, as MongoDB's
    assert out == [{"_id": 0, "m": 4.0, "p": [0.0, 4.0, 8.0, 8.0], "c": [4.0]},
                   {"_id": 1, "m": 5.0, "p": [1.0, 5.0, 9.0, 9.0], "c": [5.0]}]
    assert run([{"$group": {"_id": None, "m": {"$median": {"input": "$nope",
                                                           "method": "approximate"}}}}],
               docs) == [{"_id": None, "m": None}]
    for bad, code in (({"input": "$v", "p": [1.5], "method": "approximate"}, 7750301),
                      ({"input": "$v", "method": "approximate"}, 7436100),
                      ({"input": "$v", "p": [0.5], "method": "exact"}, 7766600)):
        with pytest.raises(CommandError) as e:
            run([{"$group": {"_id": None, "m": {"$percentile": bad}}}], docs)
        assert e.value.code == code
    moving = run([{"$setWindowFields": {"sortBy": {"v": 1}, "output": {"m": {
        "$median": {"input": "$v", "method": "approximate"},
        "window": {"documents": [-1, 1]}}}}}, {"$limit": 3}], docs[:10])
    assert [d["m"] for d in moving] == [0.0, 1.0, 2.0]
    assert ev({"$median": {"input": [3, 1, 2, "x"], "method": "approximate"}}) == 2.0
    assert ev({"$percentile": {"input": [1, 2, 3, 4], "p": [0.25, 0.75],
                               "method": "continuous"}}) == [1.75, 3.25]


def test_set_field_unset_field_sizes_and_byte_strings():
    from bson import Binary
    assert ev({"$setField": {"field": "a.b", "input": {"a": 1}, "value": 2}}) == \
        {"a": 1, "a.b": 2}  # the name taken whole, dots too
    assert ev({"$setField": {"field": {"$literal": "$x"}, "input": {"$x": 1, "y": 2},
                             "value": "$$REMOVE"}}) == {"y": 2}
    assert ev({"$unsetField": {"field": "a", "input": {"a": 1, "b": 2}}}) == {"b": 2}
    assert ev({"$setField": {"field": "a", "input": None, "value": 1}}) is None
    with pytest.raises(CommandError, match="string constant"):
        ev({"$setField": {"field": 1, "input": {}, "value": 1}})
    with pytest.raises(CommandError, match="literal"):
        ev({"$setField": {"field": "$o", "input": {}, "value": 1}})
    assert (ev({"$binarySize": "héllo"}), ev({"$binarySize": Binary(b"abc", 0)}),
            ev({"$bsonSize": {"a": 1}}), ev({"$bsonSize": None})) == (6, 3, 12, None)
    with pytest.raises(CommandError) as e:
        ev({"$bsonSize": 1})
    assert e.value.code == 31393
    assert ev({"$indexOfBytes": ["héllo", "l"]}) == 3 and ev({"$indexOfCP": ["héllo", "l"]}) == 2
    assert ev({"$substrBytes": ["héllo", 0, 3]}) == "hé"
    for cut, code in (([0, 2], 28657), ([2, 2], 28656)):  # inside the two bytes of é
        with pytest.raises(CommandError) as e:
            ev({"$substrBytes": ["héllo", *cut]})
        assert e.value.code == code


def test_nested_projections_add_fields_into_subdocuments_and_array_literals():
    """As MongoDB: ``{x: {y: 1}}`` in ``$project`` includes x.y (it was
    evaluated as the literal 1) and ``{x: {y: 0}}`` excludes it (it was the
    literal 0); a number other than 0 includes; ``$addFields: {x: {w: 1}}``
    sets x.w and keeps x's other fields (it replaced x); a missing element of
    an array literal is null (it leaked the internal MISSING marker)."""
    docs = [{"_id": 1, "a": [1, 2], "x": {"y": 7, "z": 2}}]
    assert run([{"$project": {"x": {"y": 1}}}], docs) == [{"_id": 1, "x": {"y": 7}}]
    assert run([{"$project": {"x": {"y": 0}}}], docs) == [{"_id": 1, "a": [1, 2], "x": {"z": 2}}]
    assert run([{"$project": {"x": {"y": 1, "w": {"$add": ["$x.y", 1]}}}}], docs) == \
        [{"_id": 1, "x": {"y": 7, "w": 8}}]
    assert run([{"$project": {"x": 5, "_id": 0}}], docs) == [{"x": {"y": 7, "z": 2}}]
    with pytest.raises(InvalidFilter, match="empty sub-projection"):
        run([{"$project": {"x": {}}}], docs)
    assert run([{"$addFields": {"x": {}}}], docs)[0]["x"] == {}
    assert run([{"$addFields": {"x": {"w": 1}}}], docs)[0]["x"] == {"y": 7, "z": 2, "w": 1}
    assert run([{"$addFields": {"x": {"$literal": {"w": 1}}}}], docs)[0]["x"] == {"w": 1}
    assert run([{"$project": {"arr": ["$x.y", "$nope", 3]}}], docs) == \
        [{"_id": 1, "arr": [7, None, 3]}]


def test_server_side_javascript_is_refused_by_name():
    for pipeline in ([{"$project": {"x": {"$function": {"body": "function() {}", "args": [],
                                                        "lang": "js"}}}}],
                     [{"$group": {"_id": None, "x": {"$accumulator": {}}}}]):
        with pytest.raises(CommandError, match="JavaScript") as e:
            run(pipeline)
        assert e.value.code == 31264


def test_switch_objects_and_group_accumulators():
    assert ev({"$switch": {"branches": [{"case": {"$gt": ["$n", 3]}, "then": "big"}],
                           "default": "small"}}) == "small"
    with pytest.raises(CommandError, match="no default"):
        ev({"$switch": {"branches": [{"case": False, "then": 1}]}})
    assert ev({"$mergeObjects": ["$o", {"y": 2}, None]}) == {"x": 1, "y": 2}
    assert ev({"$objectToArray": "$o"}) == [{"k": "x", "v": 1}]
    assert ev({"$arrayToObject": [[["a", 1]], ]}) == {"a": 1}
    assert ev({"$getField": "o"}) == {"x": 1}
    out = run([{"$group": {"_id": "$item", "m": {"$mergeObjects": "$sub"},
                           "sd": {"$stdDevPop": "$qty"}, "ss": {"$stdDevSamp": "$qty"}}},
               {"$sort": {"_id": 1}}])
    assert out[0]["_id"] == "a" and out[0]["m"] == {"v": 6}
    assert round(out[0]["sd"], 4) == 1.633 and round(out[0]["ss"], 4) == 2.0


def test_out_and_merge_are_checked_and_must_end_the_pipeline():
    aggregate.check([{"$match": {}}, {"$out": "t"}])
    aggregate.check([{"$merge": {"into": {"db": "o", "coll": "t"}, "whenMatched": "replace"}}])
    for bad, code in [([{"$out": "t"}, {"$match": {}}], 40601),
                      ([{"$facet": {"a": [{"$out": "t"}]}}], 40601),
                      ([{"$out": "system.x"}], 17385),
                      ([{"$out": {"db": "admin", "coll": "x"}}], 17385),
                      ([{"$merge": {"into": "t", "on": "k"}}], 51183),
                      ([{"$merge": {"into": "t", "whenMatched": [{"$set": {"a": 1}}]}}], 2),
                      ([{"$merge": {"into": "t", "whenNotMatched": "nope"}}], 51191),
                      ([{"$merge": {"into": "t", "let": {}}}], 40415),
                      ([{"$unionWith": 5}], 40590)]:
        with pytest.raises(CommandError) as e:
            aggregate.check(bad)
        assert e.value.code == code, bad
    assert aggregate.output_spec("$merge", "t", "d") == ("d.t", "merge", "insert")


def test_union_with_appends_another_collection_through_its_pipeline():
    other = [{"_id": "o1", "qty": 100}, {"_id": "o2", "qty": 200}]
    out = aggregate.run(iter([{"_id": 1, "qty": 1}]),
                        [{"$unionWith": {"coll": "other", "pipeline": [{"$match": {"qty": 200}}]}},
                         {"$project": {"qty": 1}}],
                        lambda coll: iter(other) if coll == "other" else iter([]))
    assert out == [{"_id": 1, "qty": 1}, {"_id": "o2", "qty": 200}]


def test_lookup_with_let_runs_its_pipeline_with_each_document_s_variables():
    orders = [{"_id": 1, "item": "a", "qty": 5}, {"_id": 2, "item": "b", "qty": 1}]
    stock = [{"_id": "s1", "item": "a", "have": 3}, {"_id": "s2", "item": "a", "have": 9},
             {"_id": "s3", "item": "b", "have": 4}]
    out = aggregate.run(iter(orders), [{"$lookup": {
        "from": "stock", "let": {"it": "$item", "need": "$qty"},
        "pipeline": [{"$match": {"$expr": {"$and": [{"$eq": ["$item", "$$it"]},
                                                     {"$gte": ["$have", "$$need"]}]}}},
                     {"$project": {"_id": 1, "short": {"$subtract": ["$have", "$$need"]}}}],
        "as": "ok"}}], lambda coll: iter(stock))
    assert [d["ok"] for d in out] == [[{"_id": "s2", "short": 4}], [{"_id": "s3", "short": 3}]]
    with pytest.raises(CommandError):
        aggregate.check([{"$lookup": {"from": "s", "let": {"Bad": 1}, "pipeline": [],
                                      "as": "x"}}])


def test_bucket_and_bucket_auto():
    docs = [{"_id": i, "price": p} for i, p in enumerate([5, 15, 25, 35, 45, 300, None])]
    out = aggregate.run(iter(docs), [{"$bucket": {
        "groupBy": "$price", "boundaries": [0, 20, 50], "default": "other",
        "output": {"n": {"$sum": 1}, "ids": {"$push": "$_id"}}}}])
    assert out == [{"_id": 0, "n": 2, "ids": [0, 1]}, {"_id": 20, "n": 3, "ids": [2, 3, 4]},
                   {"_id": "other", "n": 2, "ids": [5, 6]}]
    with pytest.raises(CommandError) as e:
        aggregate.run(iter(docs), [{"$bucket": {"groupBy": "$price", "boundaries": [0, 20]}}])
    assert e.value.code == 40066  # no default for 25...
    with pytest.raises(CommandError):
        aggregate.run(iter(docs), [{"$bucket": {"groupBy": "$price", "boundaries": [5, 1]}}])
    out = aggregate.run(iter(docs[:6]), [{"$bucketAuto": {"groupBy": "$price", "buckets": 3}}])
    assert out == [{"_id": {"min": 5, "max": 25}, "count": 2},
                   {"_id": {"min": 25, "max": 45}, "count": 2},
                   {"_id": {"min": 45, "max": 300}, "count": 2}]


def test_set_window_fields_running_totals_moving_averages_ranks_and_shift():
    docs = [{"_id": i, "g": "ab"[i % 2], "v": v} for i, v in enumerate([3, 1, 4, 1, 5, 9, 2])]
    out = aggregate.run(iter(docs), [{"$setWindowFields": {
        "partitionBy": "$g", "sortBy": {"_id": 1},
        "output": {"run": {"$sum": "$v", "window": {"documents": ["unbounded", "current"]}},
                   "avg2": {"$avg": "$v", "window": {"documents": [-1, 0]}},
                   "tot": {"$sum": "$v"},
                   "num": {"$documentNumber": {}},
                   "prev": {"$shift": {"output": "$v", "by": -1, "default": None}}}}},
        {"$sort": {"_id": 1}}])
    a = [d for d in out if d["g"] == "a"]  # v: 3, 4, 5, 2
    assert [d["run"] for d in a] == [3, 7, 12, 14] and [d["tot"] for d in a] == [14] * 4
    assert [d["avg2"] for d in a] == [3, 3.5, 4.5, 3.5] and [d["num"] for d in a] == [1, 2, 3, 4]
    assert [d["prev"] for d in a] == [None, 3, 4, 5]
    ranked = aggregate.run(iter(docs), [{"$setWindowFields": {
        "sortBy": {"v": -1}, "output": {"r": {"$rank": {}}, "d": {"$denseRank": {}}}}}])
    assert [(d["v"], d["r"], d["d"]) for d in ranked] == [
        (9, 1, 1), (5, 2, 2), (4, 3, 3), (3, 4, 4), (2, 5, 5), (1, 6, 6), (1, 6, 6)]
    ranged = aggregate.run(iter(docs), [{"$setWindowFields": {
        "sortBy": {"v": 1}, "output": {"near": {"$count": {}, "window": {"range": [-1, 1]}}}}}])
    assert [(d["v"], d["near"]) for d in ranged] == [
        (1, 3), (1, 3), (2, 4), (3, 3), (4, 3), (5, 2), (9, 1)]
    with pytest.raises(CommandError):
        aggregate.run(iter(docs), [{"$setWindowFields": {"output": {"r": {"$rank": {}}}}}])


def test_range_windows_over_dates_with_a_unit_and_current_as_a_position():
    """A rolling window in time (``range`` with ``unit``, as MongoDB 5's) was
    refused as a bad window. The bounds are the current date moved as
    ``$dateAdd`` moves it (a month is a calendar month); "current" is the
    current document's position, not its value, so a tie after it is not
    in its window; a range needs one ascending sort field of numbers, or of
    dates with a unit, and each refusal names what is wrong."""
    import datetime
    day = datetime.timedelta(days=1)
    t0 = datetime.datetime(2026, 1, 30)
    docs = [{"_id": i, "t": t0 + k * day, "v": v} for i, (k, v) in enumerate(
        [(0, 1), (1, 2), (1, 4), (3, 8), (31, 16), (59, 32)])]
    out = aggregate.run(iter(docs), [{"$setWindowFields": {"sortBy": {"t": 1}, "output": {
        "week": {"$sum": "$v", "window": {"range": [-2, 0], "unit": "day"}},
        "upto": {"$sum": "$v", "window": {"range": [-1, "current"], "unit": "day"}},
        "month": {"$sum": "$v", "window": {"range": [-1, 0], "unit": "month"}},
        "hours": {"$count": {}, "window": {"range": [-48, 48], "unit": "hour"}}}}}])
    assert [d["week"] for d in out] == [1, 7, 7, 14, 16, 32]
    assert [d["upto"] for d in out] == [1, 3, 7, 8, 16, 32]  # the tie at _id 2: not in _id 1's
    # a month back from Mar 2 is Feb 2 (its 8 in), from Mar 30 Feb 28 (only 16 and 32)
    assert [d["month"] for d in out] == [1, 7, 7, 15, 24, 48]
    assert [d["hours"] for d in out] == [3, 4, 4, 3, 1, 1]  # Feb 2 is 48 h after Jan 31
    nums = [{"_id": i, "x": x} for i, x in enumerate([1, 2, 2, 3])]
    out = aggregate.run(iter(nums), [{"$setWindowFields": {"sortBy": {"x": 1}, "output": {
        "c": {"$count": {}, "window": {"range": ["current", 1]}}}}}])
    assert [d["c"] for d in out] == [3, 3, 2, 1]
    for window, sort, code, words in (
            ({"range": [-1, 0]}, {"t": 1}, 5429414, "be a number, but it was datetime "
                                                    r"\(a range over dates needs a unit\)"),
            ({"range": [-1, 0], "unit": "day"}, {"v": 1}, 5429513, "be a date, but it was int"),
            ({"range": [-1, 0], "unit": "fortnight"}, {"t": 1}, 9, "unknown time unit"),
            ({"range": [-1, 0], "unit": "day"}, {"t": -1}, 5339901, "ascending"),
            ({"range": [-1, 0]}, {"t": 1, "v": 1}, 5339902, "exactly one field"),
            ({"documents": [-1, 0], "unit": "day"}, {"t": 1}, 5371600, "a window is"),
            ({"range": [-1]}, {"t": 1}, 5371601, "must be \\[lower, upper\\]")):
        with pytest.raises(CommandError, match=words) as ei:
            aggregate.run(iter(docs), [{"$setWindowFields": {"sortBy": sort, "output": {
                "s": {"$sum": "$v", "window": window}}}}])
        assert ei.value.code == code, (window, ei.value)


def test_window_accumulators_fed_as_the_window_grows_equal_each_window_s_own():
    """A window whose lower end stays (a running total, the whole partition)
    feeds one accumulator as it grows instead of a new one per document
    (4,000 documents took 6.6 s, 100,000 would have taken about an hour):
    every accumulator over every kind of window still gives what that
    document's own window gives, here against each window summed afresh."""
    import random
    from raymx.wire import grouping
    rnd = random.Random(7)
    ends = ["unbounded", "current", -3, -1, 0, 1, 2]
    for trial in range(60):
        n = rnd.randrange(0, 30)
        docs = [{"_id": i, "k": rnd.randrange(8), "v": rnd.choice([1, 2.5, None, "s", -4, 7])}
                for i in range(n)]
        op = rnd.choice(["$sum", "$avg", "$min", "$max", "$push", "$first", "$last",
                         "$addToSet", "$count"])
        kind = rnd.choice(["documents", "range", None])
        lo, hi = sorted((rnd.choice(ends), rnd.choice(ends)), key=lambda e: (
            -1e9 if e == "unbounded" else 0 if e == "current" else e))
        if lo == "unbounded" and hi == "unbounded" or kind is None:
            lo, hi = "unbounded", "unbounded"
        window = {} if kind is None else {"window": {kind: [lo, hi]}}
        arg = {} if op == "$count" else "$v"
        out = aggregate.run(iter(docs), [{"$setWindowFields": {"sortBy": {"k": 1}, "output": {
            "w": {op: arg, **window}}}}])
        part = sorted(docs, key=lambda d: (d["k"], d["_id"]))
        assert [d["_id"] for d in out] == [d["_id"] for d in part]
        keys = [d["k"] for d in part]
        bounds = grouping._window(window.get("window"), n, keys, False)
        for i, d in enumerate(out):
            a, b = bounds(i)
            acc = grouping._Acc(op)
            for x in part[a:b]:
                acc.add(1 if op == "$count" else x["v"])
            assert d["w"] == acc.result(), (trial, op, window, i)


def test_fill_and_the_gap_filling_window_functions_as_mongodb():
    """$fill (MongoDB 5.3) and $locf/$linearFill: a null or missing value is
    filled per partition in sortBy order; linear interpolation along the
    sort field (numbers or dates), gaps at the ends left null; a value fill
    needs no order and keeps the documents' own."""
    import datetime
    t0 = datetime.datetime(2026, 1, 1)
    docs = [{"_id": 1, "g": "a", "t": 1, "v": 10, "s": "x"}, {"_id": 2, "g": "a", "t": 2},
            {"_id": 3, "g": "a", "t": 4, "v": None}, {"_id": 4, "g": "a", "t": 5, "v": 40},
            {"_id": 5, "g": "b", "t": 1}, {"_id": 6, "g": "b", "t": 3, "v": 6, "s": "y"},
            {"_id": 7, "g": "b", "t": 4}]
    out = aggregate.run(iter(reversed(docs)), [{"$set": {"lin": "$v"}}, {"$fill": {
        "partitionByFields": ["g"], "sortBy": {"t": 1},
        "output": {"lin": {"method": "linear"}, "s": {"method": "locf"},
                   "z": {"value": {"$multiply": ["$t", 100]}}}}}, {"$sort": {"_id": 1}}])
    assert [d["lin"] for d in out] == [10, 17.5, 32.5, 40, None, 6, None]  # along t
    assert [d["s"] for d in out] == ["x", "x", "x", "x", None, "y", "y"]
    assert [d["z"] for d in out] == [100, 200, 400, 500, 100, 300, 400]
    kept = aggregate.run(iter(docs), [{"$fill": {"output": {"v": {"value": 0}}}}])
    assert [d["_id"] for d in kept] == [1, 2, 3, 4, 5, 6, 7]  # no sortBy: the order kept
    assert [d["v"] for d in kept] == [10, 0, 0, 40, 0, 6, 0]
    dated = aggregate.run(iter([{"at": t0, "v": 0}, {"at": t0 + datetime.timedelta(hours=1)},
                                {"at": t0 + datetime.timedelta(hours=4), "v": 8}]), [
        {"$setWindowFields": {"sortBy": {"at": 1}, "output": {
            "v": {"$linearFill": "$v"}, "last": {"$locf": "$v"}}}}])
    assert [(d["v"], d["last"]) for d in dated] == [(0, 0), (2.0, 0), (8, 8)]
    for bad, code in (
            ({"$fill": {"output": {"v": {"method": "spline"}}, "sortBy": {"t": 1}}}, 6050202),
            ({"$fill": {"output": {"v": {"method": "locf"}}}}, 6050205),
            ({"$fill": {"output": {"v": {"value": 1, "method": "locf"}}}}, 6050203),
            ({"$fill": {"output": {}}}, 40415),
            ({"$fill": {"output": {"v": {"value": 1}}, "partitionBy": "$g",
                        "partitionByFields": ["g"]}}, 6050204),
            ({"$setWindowFields": {"sortBy": {"g": 1}, "output": {"v": {"$linearFill": "$v"}}}},
             14),  # a string sort field
            ({"$setWindowFields": {"sortBy": {"t": 1, "g": 1}, "output": {
                "v": {"$linearFill": "$v"}}}}, 605001),
            ({"$setWindowFields": {"sortBy": {"t": 1}, "output": {
                "v": {"$locf": "$v", "window": {"documents": [-1, 0]}}}}}, 5371601)):
        with pytest.raises(CommandError) as ei:
            aggregate.run(iter(docs), [bad])
        assert ei.value.code == code, bad
    with pytest.raises(CommandError, match="no repeated values") as ei:  # t 1 twice
        aggregate.run(iter(docs), [{"$fill": {"sortBy": {"t": 1}, "output": {
            "v": {"method": "linear"}}}}])


def test_densify_fills_the_grid_per_partition_as_mongodb():
    """$densify (MongoDB 5.1): a document of the field alone (with the
    partition's fields) for each grid value no document has, over the full
    range, each partition's own, or explicit [lower, upper); documents kept
    as they are; dates step by calendar units."""
    import datetime
    docs = [{"_id": 1, "g": "a", "t": 1}, {"_id": 2, "g": "a", "t": 4},
            {"_id": 3, "g": "b", "t": 2}, {"_id": 4, "g": "b", "t": 2.5}, {"_id": 5, "g": "b"}]

    def run(bounds, **kw):
        return [(d.get("g"), d.get("t"), d.get("_id")) for d in aggregate.run(iter(docs), [
            {"$densify": {"field": "t", "range": {"step": 1, "bounds": bounds}, **kw}}])]
    assert run("full", partitionByFields=["g"]) == [
        ("a", 1, 1), ("a", 2, None), ("a", 3, None), ("a", 4, 2),
        ("b", 1, None), ("b", 2, 3), ("b", 2.5, 4), ("b", 3, None), ("b", 4, None),
        ("b", None, 5)]  # no number in t: passed through
    assert run("partition", partitionByFields=["g"]) == [
        ("a", 1, 1), ("a", 2, None), ("a", 3, None), ("a", 4, 2),
        ("b", 2, 3), ("b", 2.5, 4), ("b", None, 5)]
    assert run([0, 3], partitionByFields=["g"]) == [  # upper bound excluded; 4 kept
        ("a", 0, None), ("a", 1, 1), ("a", 2, None), ("a", 4, 2),
        ("b", 0, None), ("b", 1, None), ("b", 2, 3), ("b", 2.5, 4), ("b", None, 5)]
    assert [t for _, t, _ in run("full")] == [1, 2, 2.5, 3, 4, None]
    new = aggregate.run(iter(docs[:2]), [{"$densify": {"field": "t", "partitionByFields": ["g"],
                                                       "range": {"step": 1, "bounds": "full"}}}])
    assert new[1] == {"g": "a", "t": 2}  # the field and the partition's, nothing else
    months = aggregate.run(iter([{"at": datetime.datetime(2026, 1, 31)},
                                 {"at": datetime.datetime(2026, 5, 1)}]),
                           [{"$densify": {"field": "at", "range": {
                               "step": 1, "unit": "month", "bounds": "full"}}}])
    assert [d["at"].date().isoformat() for d in months] == [
        "2026-01-31", "2026-02-28", "2026-03-31", "2026-04-30", "2026-05-01"]
    for bad, code in (({"field": "t"}, 40415), ({"field": "$t", "range": {
            "step": 1, "bounds": "full"}}, 5733001), ({"field": "t", "range": {
                "step": 0, "bounds": "full"}}, 5733005), ({"field": "t", "range": {
                    "step": 1, "bounds": [3, 1]}}, 5733007), ({"field": "t", "range": {
                        "step": 1.5, "unit": "day", "bounds": "full"}}, 5733006),
            ({"field": "t", "range": {"step": 1, "unit": "day", "bounds": "full"}}, 5733201)):
        with pytest.raises(CommandError) as ei:
            aggregate.run(iter(docs), [{"$densify": bad}])
        assert ei.value.code == code, bad


def test_graph_lookup_walks_a_hierarchy_breadth_first_as_mongodb_does():
    # MongoDB's own example: the chain of reports (Dev -> Eliot -> Ron -> Andrew)
    emp = [{"_id": 1, "name": "Dev"}, {"_id": 2, "name": "Eliot", "reportsTo": "Dev"},
           {"_id": 3, "name": "Ron", "reportsTo": "Eliot"},
           {"_id": 4, "name": "Andrew", "reportsTo": "Eliot"},
           {"_id": 5, "name": "Asya", "reportsTo": "Ron"},
           {"_id": 6, "name": "Dan", "reportsTo": "Andrew", "gone": True}]

    def lookup(coll):
        assert coll == "employees"
        return iter([dict(d) for d in emp])

    def chain(spec, who):
        stage = {"$graphLookup": dict({"from": "employees", "startWith": "$reportsTo",
                                       "connectFromField": "reportsTo",
                                       "connectToField": "name", "as": "up"}, **spec)}
        aggregate.check([stage])
        out = aggregate.run(iter([d for d in emp if d["name"] == who]), [stage], lookup)
        return sorted((x["name"], x.get("depth")) for x in out[0]["up"])
    assert chain({}, "Dan") == [("Andrew", None), ("Dev", None), ("Eliot", None)]
    assert chain({"depthField": "depth"}, "Asya") == [("Dev", 2), ("Eliot", 1), ("Ron", 0)]
    assert chain({"maxDepth": 0}, "Asya") == [("Ron", None)]
    assert chain({}, "Dev") == []  # no startWith value: nothing found
    # downwards, from an array of start values, each document once, restricted
    down = {"$graphLookup": {"from": "employees", "startWith": ["$name"],
                             "connectFromField": "name", "connectToField": "reportsTo",
                             "as": "team", "restrictSearchWithMatch": {"gone": {"$ne": True}}}}
    out = aggregate.run(iter([dict(emp[1])]), [down], lookup)
    assert sorted(x["name"] for x in out[0]["team"]) == ["Andrew", "Asya", "Ron"]
    cyc = [{"_id": "a", "next": "b"}, {"_id": "b", "next": "a"}]  # a cycle ends
    out = aggregate.run(iter([{"_id": 0, "start": "a"}]), [{"$graphLookup": {
        "from": "c", "startWith": "$start", "connectFromField": "next",
        "connectToField": "_id", "as": "ring", "depthField": "d"}}], lambda c: iter(cyc))
    assert sorted((x["_id"], x["d"]) for x in out[0]["ring"]) == [("a", 0), ("b", 1)]
    for bad in ({"from": "e", "as": "x", "connectFromField": "a", "connectToField": "b"},
                {"from": "e", "as": "x", "startWith": 1, "connectFromField": "a"},
                {"from": "e", "as": "x", "startWith": 1, "connectFromField": "a",
                 "connectToField": "b", "maxDepth": -1},
                {"from": "e", "as": "x", "startWith": 1, "connectFromField": "a",
                 "connectToField": "b", "bogus": 1}):
        with pytest.raises(CommandError):
            aggregate.check([{"$graphLookup": bad}])


def test_sort_array_sorts_values_or_documents_by_fields():
    doc = {"_id": 1, "v": [3, "a", 1, None, 2.5], "d": [{"n": 2, "k": "x"}, {"n": 1},
                                                         {"n": 2, "k": "a"}]}
    out = aggregate.run(iter([doc]), [{"$project": {
        "up": {"$sortArray": {"input": "$v", "sortBy": 1}},
        "down": {"$sortArray": {"input": "$v", "sortBy": -1}},
        "docs": {"$sortArray": {"input": "$d", "sortBy": {"n": -1, "k": 1}}},
        "none": {"$sortArray": {"input": "$nope", "sortBy": 1}}}}])[0]
    assert out["up"] == [None, 1, 2.5, 3, "a"] and out["down"] == ["a", 3, 2.5, 1, None]
    assert out["docs"] == [{"n": 2, "k": "a"}, {"n": 2, "k": "x"}, {"n": 1}]
    assert out["none"] is None
    for bad in ({"input": "$v", "sortBy": 2}, {"input": "$v"}, {"input": 5, "sortBy": 1}):
        with pytest.raises(CommandError):
            aggregate.run(iter([doc]), [{"$project": {"x": {"$sortArray": bad}}}])


def test_a_range_too_large_to_build_is_refused_not_built():
    """``$range: [0, 2**62]`` once held the port's thread building a list
    until memory ran out (a one-expression denial of service); past
    ``RANGE_MAX`` values it is refused at once, as MongoDB's 64 MiB bound."""
    from raymx.wire import expressions
    n = expressions.RANGE_MAX
    assert run([{"$match": {"_id": 0}}, {"$project": {"_id": 0, "n": {"$size": {
        "$range": [0, n]}}}}]) == [{"n": n}]
    with pytest.raises(CommandError) as ei:
        run([{"$project": {"r": {"$range": [0, 2**62]}}}])
    assert ei.value.code == 146


def test_pow_of_a_huge_exponent_is_a_double_not_a_computation():
    """``$pow: [7, 2**62]`` once computed the exact integer (held the thread
    for good); past a long the result is a double, as MongoDB's, and a double
    past its range is infinite."""
    def pow_(a, b):
        return run([{"$match": {"_id": 0}}, {"$project": {"_id": 0, "r": {"$pow": [a, b]}}}])[0]["r"]
    assert pow_(2, 62) == 2**62 and isinstance(pow_(2, 62), int)
    assert pow_(2, 63) == 2.0**63 and isinstance(pow_(2, 63), float)
    assert pow_(7, 2**62) == float("inf") and pow_(-3, 2**62 + 1) == float("-inf")
    assert pow_(1.5, 2**62) == float("inf") and pow_(-1, 2**62) == 1
