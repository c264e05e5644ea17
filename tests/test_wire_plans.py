"""How reads are planned through the MongoDB wire port, with the real
pymongo: explain's plans (an index scan in the sort's order, no SORT stage,
what is examined), an aggregate's $match and $sort pushed down to the
member, count_documents counted by the member and distinct read off an
index (a member served in process)."""

import pytest
from pymongo.errors import OperationFailure

from tests.test_wire import client, served  # noqa: F401 (the fixtures)


def test_count_documents_is_counted_by_the_member(client):
    """pymongo's ``count_documents`` pipeline ($match, maybe $skip and
    $limit, {$group: {_id: 1, n: {$sum: 1}}}) is answered by the member's
    count, the same numbers as the pipeline run in the port; in a
    transaction too; any other $group still runs in the port."""
    from raymx.wire.aggregate import count_shape
    c = client.t.counted
    assert c.count_documents({}) == 0  # no collection: zero, as MongoDB
    c.insert_many([{"_id": i, "a": i % 3} for i in range(50)])
    assert c.count_documents({}) == 50 and c.count_documents({"a": 1}) == 17
    assert c.count_documents({}, skip=45) == 5 and c.count_documents({}, skip=60) == 0
    assert c.count_documents({"a": {"$gte": 1}}, skip=3, limit=10) == 10
    assert c.count_documents({}, limit=7) == 7
    assert list(c.aggregate([{"$group": {"_id": "x", "k": {"$sum": 1}}}])) == [
        {"_id": "x", "k": 50}]
    assert list(c.aggregate([{"$match": {"a": 9}},
                             {"$group": {"_id": 1, "n": {"$sum": 1}}}])) == []
    assert list(c.aggregate([{"$group": {"_id": None, "n": {"$sum": 2}}}])) == [
        {"_id": None, "n": 100}]
    assert list(c.aggregate([{"$group": {"_id": "$a", "n": {"$sum": 1}}}, {"$sort": {"_id": 1}}])) \
        == [{"_id": 0, "n": 17}, {"_id": 1, "n": 17}, {"_id": 2, "n": 16}]
    assert count_shape([{"$group": {"_id": 1, "n": {"$sum": 1}}}]) == (0, 0, 1, "n")
    assert count_shape([{"$skip": 2}, {"$limit": 3}, {"$group": {"_id": 1, "n": {"$sum": 1}}}]) \
        == (2, 3, 1, "n")
    for other in ([{"$group": {"_id": "$a", "n": {"$sum": 1}}}],
                  [{"$group": {"_id": 1, "n": {"$sum": True}}}],
                  [{"$limit": 0}, {"$group": {"_id": 1, "n": {"$sum": 1}}}],
                  [{"$group": {"_id": 1, "n": {"$sum": 1}}}, {"$project": {"n": 1}}]):
        assert count_shape(other) is None
    with pytest.raises(OperationFailure) as e:  # a bad stage still says what is wrong
        list(c.aggregate([{"$limit": 0}, {"$group": {"_id": 1, "n": {"$sum": 1}}}]))
    assert e.value.code == 15958
    with client.start_session() as s:  # a transaction counts its own writes
        with s.start_transaction():
            c.insert_one({"_id": 100, "a": 1}, session=s)
            assert c.count_documents({}, session=s) == 51
            assert c.count_documents({"a": 1}, session=s) == 18
            s.abort_transaction()
    assert c.count_documents({}) == 50


def test_distinct_is_answered_by_the_member_off_an_index(client):
    """pymongo's ``distinct`` is the member's: with a one-field index on the
    key and no filter, one document per value (explain: DISTINCT_SCAN under
    PROJECTION_COVERED, as MongoDB's), with a filter over its matches, in a
    transaction with its own writes; arrays count each element."""
    c = client.t.distinct
    c.insert_many([{"_id": i, "k": i % 4, "t": ["x", "y"] if i % 2 else "z"}
                   for i in range(400)] + [{"_id": 400, "k": None}, {"_id": 401}])
    c.create_index("k")
    assert c.distinct("k") == [None, 0, 1, 2, 3]
    assert c.distinct("k", {"_id": {"$lt": 2}}) == [0, 1]
    assert c.distinct("t") == ["x", "y", "z"] and c.distinct("nope") == []
    # an $expr is the port's, for distinct and count as for find (the member refused it)
    assert c.distinct("k", {"$expr": {"$lt": ["$_id", 3]}}) == [0, 1, 2]
    assert c.count_documents({"$expr": {"$gte": ["$_id", 398]}}) == 4
    assert client.t.command("count", "distinct", query={"$expr": {"$eq": ["$k", 1]}})["n"] == 100
    ex = client.t.command("explain", {"distinct": "distinct", "key": "k"})
    plan = ex["queryPlanner"]["winningPlan"]
    assert plan["stage"] == "PROJECTION_COVERED"
    assert plan["inputStage"]["stage"] == "DISTINCT_SCAN"
    assert plan["inputStage"]["indexName"] == "k_1"
    assert ex["executionStats"]["totalDocsExamined"] == 5  # one per value, not 402
    assert ex["executionStats"]["nReturned"] == 5
    with client.start_session() as s:
        with s.start_transaction():
            c.insert_one({"_id": 500, "k": 9}, session=s)
            assert c.distinct("k", session=s) == [None, 0, 1, 2, 3, 9]
            s.abort_transaction()
    assert c.distinct("k") == [None, 0, 1, 2, 3]


def test_explain_says_how_a_read_reads(client):
    c = client.t.explained
    c.insert_many([{"_id": i, "a": i % 10, "b": i} for i in range(100)])
    c.create_index("a")
    ex = c.find({"a": 3}).explain()
    ip = ex["queryPlanner"]["winningPlan"]["inputStage"]
    assert ip["stage"] == "IXSCAN" and ip["indexName"] == "a_1" and ip["keyPattern"] == {"a": 1}
    st = ex["executionStats"]
    assert st["nReturned"] == 10 and st["totalDocsExamined"] == 10
    ex = c.find({"b": {"$gte": 90}}).sort("b", -1).limit(3).explain()
    w = ex["queryPlanner"]["winningPlan"]
    assert w["stage"] == "LIMIT" and w["inputStage"]["stage"] == "SORT"
    assert w["inputStage"]["inputStage"]["stage"] == "COLLSCAN"
    assert ex["executionStats"]["nReturned"] == 3
    assert ex["executionStats"]["totalDocsExamined"] == 100
    assert c.find({"_id": 5}).explain()["queryPlanner"]["winningPlan"]["stage"] == "IDHACK"
    # a sort an index holds in order: read backward from it, no SORT stage, and
    # only the first run of equal keys is examined (its ties go in _id order)
    ex = c.find({"a": {"$lte": 4}}).sort("a", -1).limit(3).explain()
    w = ex["queryPlanner"]["winningPlan"]
    assert w["stage"] == "LIMIT" and w["inputStage"]["stage"] == "FETCH"
    assert w["inputStage"]["inputStage"]["indexName"] == "a_1"
    assert w["inputStage"]["inputStage"]["direction"] == "backward"
    assert ex["executionStats"]["totalDocsExamined"] == 10
    assert [d["_id"] for d in c.find({"a": {"$lte": 4}}).sort("a", -1).limit(3)] == [4, 14, 24]
    assert [d["_id"] for d in c.find().sort("$natural", -1).limit(2)] == [99, 98]
    # an aggregate's leading $match and $sort go to the member the same way
    pipe = [{"$match": {"a": {"$lte": 4}}}, {"$sort": {"a": -1}}, {"$skip": 1}, {"$limit": 2}]
    ex = client.t.command("aggregate", "explained", pipeline=pipe, explain=True)
    w = ex["queryPlanner"]["winningPlan"]
    assert w["stage"] == "LIMIT" and w["limitAmount"] == 3
    assert w["inputStage"]["inputStage"]["direction"] == "backward"
    assert ex["executionStats"]["totalDocsExamined"] == 10
    assert [d["_id"] for d in c.aggregate(pipe)] == [14, 24]
    pipe = [{"$sort": {"b": 1}}, {"$limit": 2}, {"$project": {"b": 1}}]  # b: no index
    assert list(c.aggregate(pipe)) == [{"_id": 0, "b": 0}, {"_id": 1, "b": 1}]
    ex = client.t.command("aggregate", "explained", pipeline=pipe, explain=True)
    assert ex["queryPlanner"]["winningPlan"]["inputStage"]["stage"] == "SORT"
    for bad, code in (([{"$sort": {}}], 15973), ([{"$sort": [["b", 1]]}], 15973),
                      ([{"$sort": {"b": 1}}, {"$limit": 0}], 15958)):
        with pytest.raises(OperationFailure) as e:
            list(c.aggregate(bad))
        assert e.value.code == code  # a bad $sort (or limit) is named, pushed down or not
    ex = client.t.command("explain", {"count": "explained", "query": {"a": 1}})
    assert ex["executionStats"]["nReturned"] == 10
    ex = client.t.command("aggregate", "explained", pipeline=[{"$match": {"a": 2}},
                                                              {"$count": "n"}], explain=True)
    assert ex["queryPlanner"]["winningPlan"]["inputStage"]["indexName"] == "a_1"
    with pytest.raises(OperationFailure):
        client.t.command("explain", {"insert": "explained", "documents": [{}]})
    assert c.count_documents({}) == 100
