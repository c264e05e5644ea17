"""What the MongoDB wire port computes itself, with the real pymongo: aggregation
output written by $out and $merge, pipeline updates, $expr and let in every
command that filters, computed projections (a member served in process)."""
import bson
import pytest
from pymongo import ReturnDocument
from pymongo.errors import OperationFailure, WriteError

from tests.test_wire import client, served  # noqa: F401 (the fixtures)


def test_out_merge_union_and_date_expressions_through_pymongo(client):
    """What data pipelines ask of aggregate: $out replaces a collection (its
    indexes kept), $merge upserts by _id in each mode, $unionWith, and
    expressions over real BSON dates."""
    import datetime
    db = client.pipe
    day = datetime.datetime(2024, 3, 5, 14, 7, 9, 123000)
    db.sales.insert_many([{"_id": i, "item": "ab"[i % 2], "qty": i,
                           "at": day + datetime.timedelta(days=i)} for i in range(6)])
    db.report.insert_one({"_id": "stale"})
    db.report.create_index("total")
    pipeline = [{"$group": {"_id": {"$dateToString": {"date": "$at", "format": "%Y-%m"}},
                            "total": {"$sum": "$qty"}, "items": {"$addToSet": "$item"}}},
                {"$set": {"n": {"$size": "$items"}, "first": {"$toDate": "2024-03-01"}}},
                {"$out": "report"}]
    assert list(db.sales.aggregate(pipeline)) == []
    assert list(db.report.find({}, {"items": 0})) == [
        {"_id": "2024-03", "total": 15, "n": 2, "first": datetime.datetime(2024, 3, 1)}]
    assert "total_1" in db.report.index_information()  # $out keeps the target's indexes
    # $merge: the default (merge matched, insert the rest)
    db.totals.insert_many([{"_id": "a", "qty": -1, "keep": True}])
    db.sales.aggregate([{"$group": {"_id": "$item", "qty": {"$sum": "$qty"}}},
                        {"$merge": "totals"}])
    assert list(db.totals.find().sort("_id")) == [{"_id": "a", "qty": 6, "keep": True},
                                                 {"_id": "b", "qty": 9}]
    # replace + discard: "a" replaced whole, nothing inserted
    db.sales.aggregate([{"$group": {"_id": {"$concat": ["$item", ""]}, "n": {"$sum": 1}}},
                        {"$set": {"_id": {"$cond": [{"$eq": ["$_id", "b"]}, "c", "$_id"]}}},
                        {"$merge": {"into": "totals", "whenMatched": "replace",
                                    "whenNotMatched": "discard"}}])
    assert list(db.totals.find().sort("_id")) == [{"_id": "a", "n": 3}, {"_id": "b", "qty": 9}]
    # keepExisting + insert; then fail on a match, which writes nothing
    db.sales.aggregate([{"$project": {"_id": {"$toString": "$qty"}}},
                        {"$unionWith": {"coll": "totals", "pipeline": [{"$project": {"_id": 1}}]}},
                        {"$merge": {"into": "totals", "whenMatched": "keepExisting"}}])
    assert db.totals.count_documents({}) == 8 and db.totals.find_one({"_id": "a"})["n"] == 3
    with pytest.raises(OperationFailure) as e:
        db.sales.aggregate([{"$project": {"_id": {"$toString": "$qty"}}},
                            {"$set": {"new": 1}},
                            {"$merge": {"into": "totals", "whenMatched": "fail"}}])
    assert e.value.code == 11000 and db.totals.count_documents({"new": 1}) == 0
    with pytest.raises(OperationFailure) as e:
        db.sales.aggregate([{"$project": {"_id": "$item"}},
                            {"$merge": {"into": "fresh", "whenNotMatched": "fail"}}])
    assert e.value.code == 13113 and "fresh" not in db.list_collection_names()
    with pytest.raises(OperationFailure) as e:
        db.sales.aggregate([{"$out": "x"}, {"$match": {}}])
    assert e.value.code == 40601
    # a $merge inside a driver transaction commits with it, or not at all
    with client.start_session() as s:
        with s.start_transaction():
            db.sales.aggregate([{"$match": {"qty": 0}}, {"$merge": "in_txn"}], session=s)
            s.abort_transaction()
    assert db.in_txn.count_documents({}) == 0


def test_updates_with_a_pipeline(client):
    """update_one / update_many / upserts whose update is an aggregation
    pipeline, computed from each document's own fields, atomically."""
    import uuid
    c = client.t.pipe_upd
    c.insert_many([{"_id": i, "first": f"F{i}", "last": "L", "qty": i, "tags": ["a"]}
                   for i in range(4)])
    r = c.update_one({"_id": 1}, [{"$set": {"name": {"$concat": ["$first", " ", "$last"]},
                                            "qty": {"$multiply": ["$qty", 10]}}},
                                  {"$unset": "first"}])
    assert (r.matched_count, r.modified_count) == (1, 1)
    assert c.find_one({"_id": 1}) == {"_id": 1, "last": "L", "qty": 10, "tags": ["a"],
                                      "name": "F1 L"}
    r = c.update_many({"qty": {"$lt": 4}}, [{"$set": {"tags": {"$concatArrays": [
        "$tags", [{"$toString": "$qty"}]]}}}])
    assert (r.matched_count, r.modified_count) == (3, 3)
    assert c.find_one({"_id": 3})["tags"] == ["a", "3"]
    r = c.update_one({"_id": 9, "kind": "new"}, [{"$set": {"k2": {"$toUpper": "$kind"}}}],
                     upsert=True)
    assert r.upserted_id == 9 and c.find_one({"_id": 9}) == {"_id": 9, "kind": "new",
                                                             "k2": "NEW"}
    r = c.update_one({"_id": 9}, [{"$set": {"k2": "NEW"}}])  # nothing changes
    assert (r.matched_count, r.modified_count) == (1, 0)
    with pytest.raises(WriteError) as e:
        c.update_one({"_id": 2}, [{"$set": {"_id": 20}}])
    assert e.value.code == 66 and c.find_one({"_id": 2})["qty"] == 2
    with pytest.raises(WriteError) as e:
        c.update_one({"_id": 2}, [{"$group": {"_id": 1}}])
    assert e.value.code == 40324
    # a retry of the same retryable write (same lsid and txnNumber) is answered
    # from its record, not applied twice
    lsid = {"id": bson.Binary(uuid.uuid4().bytes, 4)}
    cmd = {"update": "pipe_upd", "updates": [{"q": {"_id": 3}, "u": [
        {"$set": {"qty": {"$add": ["$qty", 1]}}}]}], "lsid": lsid, "txnNumber": bson.Int64(7)}
    first = client.t.command(dict(cmd))
    again = client.t.command(dict(cmd))
    assert first["nModified"] == again["nModified"] == 1 and c.find_one({"_id": 3})["qty"] == 4


def test_find_one_and_update_with_a_pipeline(client):
    c = client.t.fam_pipe
    c.insert_one({"_id": 1, "n": 2, "hist": []})
    after = c.find_one_and_update({"_id": 1}, [{"$set": {"n": {"$add": ["$n", 1]},
                                                         "hist": {"$concatArrays": [
                                                             "$hist", ["$n"]]}}}],
                                  return_document=ReturnDocument.AFTER)
    assert after == {"_id": 1, "n": 3, "hist": [2]}
    before = c.find_one_and_update({"_id": 1}, [{"$unset": "hist"}])
    assert before["hist"] == [2] and c.find_one({"_id": 1}) == {"_id": 1, "n": 3}
    up = c.find_one_and_update({"_id": 2, "k": "x"}, [{"$set": {"K": {"$toUpper": "$k"}}}],
                               upsert=True, return_document=ReturnDocument.AFTER)
    assert up == {"_id": 2, "k": "x", "K": "X"}
    with pytest.raises(OperationFailure) as e:
        c.find_one_and_update({"_id": 1}, [{"$set": {"_id": 5}}])
    assert e.value.code == 66 and c.find_one({"_id": 1}) == {"_id": 1, "n": 3}


def test_expr_and_let_in_updates_deletes_finds_and_find_and_modify(client):
    """Filters with $expr (comparing a document's own fields) and commands'
    let variables, in every command that filters: the port tests the $expr,
    the member writes exactly the documents it selected, in one transaction."""
    c = client.t.exprs
    c.insert_many([{"_id": i, "a": i, "b": 10 - i, "tag": "t"} for i in range(10)])
    r = c.update_many({"$expr": {"$gt": ["$a", "$b"]}, "tag": "t"}, {"$set": {"big": True}})
    assert (r.matched_count, r.modified_count) == (4, 4)
    assert sorted(x["_id"] for x in c.find({"big": True})) == [6, 7, 8, 9]
    r = c.update_one({"$expr": {"$eq": ["$a", "$$want"]}}, {"$inc": {"a": 100}},
                     let={"want": 3})
    assert r.modified_count == 1 and c.find_one({"_id": 3})["a"] == 103
    r = c.update_one({"$expr": {"$eq": ["$a", -1]}, "tag": "new"}, {"$set": {"n": 1}},
                     upsert=True)
    assert c.find_one({"_id": r.upserted_id}) == {"_id": r.upserted_id, "tag": "new", "n": 1}
    assert c.delete_many({"$expr": {"$lt": ["$a", "$b"]}}).deleted_count == 4  # 0, 1, 2, 4
    assert list(c.find({"$expr": {"$eq": ["$a", "$$v"]}}, let={"v": 5})) == [
        {"_id": 5, "a": 5, "b": 5, "tag": "t"}]
    doc = c.find_one_and_update({"$expr": {"$gte": ["$a", 8]}}, {"$set": {"hit": 1}},
                                sort=[("_id", -1)], return_document=ReturnDocument.AFTER)
    assert doc["_id"] == 9 and doc["hit"] == 1
    assert c.find_one_and_delete({"$expr": {"$eq": ["$a", 1000]}}) is None
    out = list(c.aggregate([{"$match": {"$expr": {"$eq": ["$a", "$$x"]}}}], let={"x": 6}))
    assert [x["_id"] for x in out] == [6]
    with pytest.raises(OperationFailure, match="text index"):
        list(c.find({"$text": {"$search": "x"}}))
    with pytest.raises(OperationFailure, match="JavaScript"):
        list(c.find({"$where": "this.a > 1"}))


def test_projections_slice_elem_match_and_computed_fields(client):
    c = client.t.projected
    c.insert_one({"_id": 1, "first": "Ada", "last": "L", "a": [1, 2, 3, 4, 5],
                  "grades": [{"s": 50}, {"s": 90}, {"s": 95}], "sub": {"xs": [7, 8, 9]}})
    assert c.find_one({}, {"a": {"$slice": 2}})["a"] == [1, 2]
    assert c.find_one({}, {"a": {"$slice": -2}, "first": 1}) == {"_id": 1, "first": "Ada",
                                                                  "a": [4, 5]}
    assert c.find_one({}, {"a": {"$slice": [1, 2]}, "_id": 0})["a"] == [2, 3]
    assert c.find_one({}, {"sub.xs": {"$slice": 1}})["sub"] == {"xs": [7]}
    assert c.find_one({}, {"grades": {"$elemMatch": {"s": {"$gt": 80}}}}) == {
        "_id": 1, "grades": [{"s": 90}]}
    assert c.find_one({}, {"name": {"$concat": ["$first", " ", "$last"]}, "_id": 0}) == {
        "name": "Ada L"}
    assert c.find_one({}, {"a": 1})["a"] == [1, 2, 3, 4, 5]  # stored whole
    with pytest.raises(OperationFailure, match="slice"):
        c.find_one({}, {"a": {"$slice": [1, 0]}})


def test_graph_lookup_through_pymongo(client):
    db = client.graph
    db.parts.insert_many([{"_id": "car", "in": None}, {"_id": "engine", "in": "car"},
                          {"_id": "piston", "in": "engine"}, {"_id": "wheel", "in": "car"}])
    out = db.parts.aggregate([
        {"$match": {"_id": "car"}},
        {"$graphLookup": {"from": "parts", "startWith": "$_id", "connectFromField": "_id",
                          "connectToField": "in", "as": "all", "depthField": "level"}},
        {"$project": {"all": {"$sortArray": {"input": "$all", "sortBy": {"_id": 1}}}}}])
    assert [(x["_id"], x["level"]) for x in next(out)["all"]] == \
        [("engine", 0), ("piston", 1), ("wheel", 0)]
    with pytest.raises(OperationFailure, match="connectToField") as ei:
        db.parts.aggregate([{"$graphLookup": {"from": "parts", "startWith": 1, "as": "x",
                                              "connectFromField": "_id"}}])
    assert ei.value.code == 40105


def test_decimal128_and_date_arithmetic_as_mongodb(client):
    """$sum/$avg count Decimal128 values (they were skipped: a wrong total
    without an error) and a Decimal128 makes the result one; $add and
    $subtract take dates; an int past 64 bits becomes a double."""
    import datetime

    from bson import Decimal128
    c = client.nums.c
    day = datetime.datetime(2024, 1, 1)
    c.insert_many([{"_id": 1, "a": 5, "d": day}, {"_id": 2, "a": 2.5},
                   {"_id": 3, "a": Decimal128("1.1")}, {"_id": 4, "a": "x"},
                   {"_id": 5, "a": 2 ** 62}])
    g = list(c.aggregate([{"$match": {"_id": {"$lt": 5}}},
                          {"$group": {"_id": None, "s": {"$sum": "$a"}, "n": {"$avg": "$a"}}}]))
    assert g[0]["s"] == Decimal128("8.6") and str(g[0]["n"].to_decimal())[:6] == "2.8666"
    p = list(c.aggregate([{"$match": {"_id": 3}}, {"$project": {
        "add": {"$add": ["$a", 1]}, "mul": {"$multiply": ["$a", 2]},
        "sub": {"$subtract": ["$a", 0.1]}, "div": {"$divide": ["$a", 2]},
        "sum": {"$sum": [1, "$a", "s"]}}}]))[0]
    assert (p["add"], p["mul"], p["sub"], p["div"], p["sum"]) == (
        Decimal128("2.1"), Decimal128("2.2"), Decimal128("1.0"), Decimal128("0.55"),
        Decimal128("2.1"))
    p = list(c.aggregate([{"$match": {"_id": 1}}, {"$project": {
        "next": {"$add": ["$d", 86_400_000]}, "before": {"$subtract": ["$d", 1000]},
        "ms": {"$subtract": [datetime.datetime(2024, 1, 2), "$d"]},
        "mod": {"$mod": [-7, 3]}}}]))[0]
    assert p["next"] == datetime.datetime(2024, 1, 2) and p["ms"] == 86_400_000
    assert p["before"] == day - datetime.timedelta(seconds=1) and p["mod"] == -1
    big = list(c.aggregate([{"$match": {"_id": 5}},
                            {"$project": {"x": {"$multiply": ["$a", 4]}}}]))[0]["x"]
    assert isinstance(big, float) and big == 2.0 ** 64


def test_date_parts_trig_bits_zip_cmp_and_regex_find_all(client):
    """The expressions MongoDB 7 has that raymx answered with 'Unrecognized
    expression': $dateToParts/$dateFromParts (parts overflow into the next,
    as MongoDB's), trigonometry, bitwise, $zip, $cmp, $regexFindAll."""
    import datetime
    import math
    c = client.more_exprs.c
    d = datetime.datetime(2024, 3, 15, 10, 30, 5, 123000)
    c.insert_one({"_id": 1, "d": d, "a": [1, 2, 3], "b": ["x", "y"], "s": "a1b22"})

    def p(e):
        return next(c.aggregate([{"$project": {"_id": 0, "r": e}}]))["r"]
    assert p({"$dateToParts": {"date": "$d"}}) == {
        "year": 2024, "month": 3, "day": 15, "hour": 10, "minute": 30, "second": 5,
        "millisecond": 123}
    assert p({"$dateToParts": {"date": "$d", "timezone": "Asia/Tokyo", "iso8601": True}}) \
        == {"isoWeekYear": 2024, "isoWeek": 11, "isoDayOfWeek": 5, "hour": 19, "minute": 30,
            "second": 5, "millisecond": 123}
    assert p({"$dateFromParts": {"year": 2024, "month": 14, "day": 1, "hour": 25}}) == \
        datetime.datetime(2025, 2, 2, 1)
    assert p({"$dateFromParts": {"year": 2024, "month": 3, "day": 15, "hour": 19,
                                 "timezone": "+09:00"}}) == datetime.datetime(2024, 3, 15, 10)
    assert p({"$dateFromParts": {"isoWeekYear": 2024, "isoWeek": 11, "isoDayOfWeek": 5}}) == \
        datetime.datetime(2024, 3, 15)
    assert [p({"$cmp": [1, 2]}), p({"$cmp": ["b", "a"]}), p({"$cmp": [1, 1.0]})] == [-1, 1, 0]
    assert p({"$zip": {"inputs": ["$a", "$b"]}}) == [[1, "x"], [2, "y"]]
    assert p({"$zip": {"inputs": ["$a", "$b"], "useLongestLength": True,
                       "defaults": [0, "z"]}})[-1] == [3, "z"]
    assert [p({"$bitAnd": [12, 10]}), p({"$bitOr": [12, 10]}), p({"$bitXor": [12, 10]}),
            p({"$bitNot": 12})] == [8, 14, 6, -13]
    assert [m["match"] for m in p({"$regexFindAll": {"input": "$s", "regex": "[a-z]\\d+"}})] \
        == ["a1", "b22"]
    assert p({"$atan2": [1, 1]}) == math.pi / 4 and p({"$cos": 0}) == 1.0
    with pytest.raises(OperationFailure, match="domain"):
        p({"$asin": 2})


def test_n_accumulators_top_and_bottom(client):
    """$firstN $lastN $maxN $minN (accumulators, window functions and array
    expressions) and $top $bottom $topN $bottomN, as MongoDB 5.2+ answers."""
    c = client.nacc.c
    c.insert_many([{"_id": i, "g": i % 2, "s": (i * 7) % 10, "name": f"n{i}"} for i in range(8)]
                  + [{"_id": 9, "g": 0, "name": "nos"}])
    g = list(c.aggregate([{"$sort": {"_id": 1}}, {"$group": {
        "_id": "$g", "f": {"$firstN": {"input": "$s", "n": 2}},
        "l": {"$lastN": {"input": "$s", "n": 2}}, "mx": {"$maxN": {"input": "$s", "n": 2}},
        "mn": {"$minN": {"input": "$s", "n": 2}},
        "top": {"$top": {"sortBy": {"s": -1}, "output": "$name"}},
        "topN": {"$topN": {"sortBy": {"s": -1, "_id": 1}, "output": ["$name", "$s"], "n": 2}},
        "bot": {"$bottomN": {"sortBy": {"s": -1}, "output": "$name", "n": 2}}}},
        {"$sort": {"_id": 1}}]))
    assert g[0] == {"_id": 0, "f": [0, 4], "l": [2, None], "mx": [8, 4], "mn": [0, 2],
                    "top": "n4", "topN": [["n4", 8], ["n2", 4]], "bot": ["n0", "nos"]}
    assert g[1]["bot"] == ["n5", "n3"] and g[1]["mx"] == [9, 7]
    e = next(c.aggregate([{"$match": {"_id": 0}}, {"$project": {
        "_id": 0, "l": {"$lastN": {"input": [3, 1, 2], "n": 2}},
        "mx": {"$maxN": {"input": [3, None, 1, 2], "n": 2}},
        "mn": {"$minN": {"input": [3, 1, 2], "n": 5}}}}]))
    assert e == {"l": [1, 2], "mx": [3, 2], "mn": [1, 2, 3]}
    w = list(c.aggregate([{"$match": {"g": 0}}, {"$setWindowFields": {
        "sortBy": {"_id": 1}, "output": {"best": {"$maxN": {"input": "$s", "n": 2},
                                                  "window": {"documents": ["unbounded",
                                                                           "current"]}}}}}]))
    assert [x["best"] for x in w[:3]] == [[0], [4, 0], [8, 4]]
    with pytest.raises(OperationFailure, match="positive integer"):
        list(c.aggregate([{"$group": {"_id": None, "f": {"$firstN": {"input": "$s", "n": 0}}}}]))


def test_fill_through_pymongo(client):
    """$fill and $linearFill/$locf through pymongo: sensor readings with gaps
    filled per sensor, in time order; a bad method is MongoDB's error."""
    import datetime
    t0 = datetime.datetime(2026, 3, 1)
    c = client.fill.readings
    c.insert_many([{"sensor": s, "at": t0 + datetime.timedelta(minutes=m), "temp": temp}
                   for s, m, temp in (("a", 0, 20), ("a", 1, None), ("a", 3, 24), ("b", 0, 5),
                                      ("b", 2, None))])
    c.insert_one({"sensor": "a", "at": t0 + datetime.timedelta(minutes=2)})  # temp missing
    got = list(c.aggregate([
        {"$fill": {"partitionBy": "$sensor", "sortBy": {"at": 1},
                   "output": {"temp": {"method": "linear"}, "unit": {"value": "C"}}}},
        {"$setWindowFields": {"partitionBy": "$sensor", "sortBy": {"at": 1},
                              "output": {"held": {"$locf": "$temp"}}}},
        {"$sort": {"sensor": 1, "at": 1}}, {"$project": {"_id": 0, "at": 0}}]))
    assert got == [{"sensor": "a", "temp": 20, "unit": "C", "held": 20},
                   {"sensor": "a", "temp": 21.333333333333332, "unit": "C",
                    "held": 21.333333333333332},
                   {"sensor": "a", "temp": 22.666666666666668, "unit": "C",
                    "held": 22.666666666666668},
                   {"sensor": "a", "temp": 24, "unit": "C", "held": 24},
                   {"sensor": "b", "temp": 5, "unit": "C", "held": 5},
                   {"sensor": "b", "temp": None, "unit": "C", "held": 5}]
    with pytest.raises(OperationFailure, match="method must be 'locf' or 'linear'") as ei:
        list(c.aggregate([{"$fill": {"sortBy": {"at": 1}, "output": {"temp": {"method": "x"}}}}]))
    assert ei.value.code == 6050202


def test_densify_then_fill_through_pymongo(client):
    """The pair MongoDB documents together: hourly readings densified to
    every hour, then the gaps filled by the last value."""
    import datetime
    t0 = datetime.datetime(2026, 3, 1)
    c = client.fill.hourly
    c.insert_many([{"at": t0, "v": 1}, {"at": t0 + datetime.timedelta(hours=3), "v": 4}])
    got = list(c.aggregate([
        {"$densify": {"field": "at", "range": {"step": 1, "unit": "hour", "bounds": "full"}}},
        {"$fill": {"sortBy": {"at": 1}, "output": {"v": {"method": "locf"}}}},
        {"$project": {"_id": 0}}]))
    assert got == [{"at": t0 + datetime.timedelta(hours=h), "v": v}
                   for h, v in ((0, 1), (1, 1), (2, 1), (3, 4))]


def test_current_date_timestamps_now_once_per_command_and_redact_through_pymongo(client):
    """A ``$currentDate`` Timestamp is stored as BSON's Timestamp; ``$$NOW``
    holds one value for a whole update pipeline over many documents; ``$redact``
    drops the subdocuments the reader may not see."""
    c = client.computed.stamps
    c.insert_many([{"_id": i, "doc": {"public": True, "x": i,
                                      "secret": {"public": False, "pin": 1234}}}
                   for i in range(150)])
    c.update_one({"_id": 0}, {"$currentDate": {"ts": {"$type": "timestamp"}, "at": True}})
    got = c.find_one({"_id": 0})
    assert isinstance(got["ts"], bson.Timestamp) and got["ts"].time > 1_700_000_000
    assert got["at"].year >= 2024
    c.update_many({}, [{"$set": {"seen": "$$NOW"}}])
    assert len(c.distinct("seen")) == 1
    out = list(c.aggregate([
        {"$match": {"_id": {"$lt": 2}}},
        {"$redact": {"$cond": [{"$eq": [{"$ifNull": ["$public", True]}, True]}, "$$DESCEND",
                               "$$PRUNE"]}},
        {"$project": {"doc": 1}}]))
    assert out == [{"_id": i, "doc": {"public": True, "x": i}} for i in range(2)]
    with pytest.raises(WriteError, match="timestamp"):
        c.update_one({"_id": 0}, {"$currentDate": {"ts": {"$type": "long"}}})


def test_nested_projections_in_find_and_find_and_modify(client):
    c = client.computed.nested
    c.insert_one({"_id": 1, "x": {"y": 7, "z": 2}, "n": 5})
    assert c.find_one({}, {"x": {"y": 1}}) == {"_id": 1, "x": {"y": 7}}
    assert c.find_one({}, {"x": {"y": 0}, "n": 0}) == {"_id": 1, "x": {"z": 2}}
    assert c.find_one_and_update({"_id": 1}, {"$set": {"q": 1}}, projection={"x": {"z": 1}},
                                 return_document=ReturnDocument.AFTER) == \
        {"_id": 1, "x": {"z": 2}}
    with pytest.raises(OperationFailure, match="empty sub-projection"):
        c.find_one({}, {"x": {}})
