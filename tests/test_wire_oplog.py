"""``local.oplog.rs`` through the wire port, with the real pymongo: the
oplog in MongoDB's shape, read-only; tailable cursors (oplog tailers); a
lower bound on ``ts`` starting at its entry (oplog replay). A member served
in process (``raymx/wire/oplog_view.py``)."""
import time

from bson import Timestamp
import pytest
from pymongo.errors import OperationFailure

from tests.test_wire import client, served  # noqa: F401 (the fixtures)


def test_local_oplog_rs_is_the_oplog_in_mongodbs_shape(client, monkeypatch):
    """``local.oplog.rs``, read-only, as tools read it: listed in ``local``,
    ``collStats`` capped with the oplog's cap as ``maxSize``, ``find`` in
    ``$natural`` order either way with a filter and a limit; an entry of one
    op is that op (``i``, ``u`` as a replacement, ``d``, ``c``), of several an
    ``applyOps``; a retryable write's session is its ``lsid`` and
    ``txnNumber``, not an op; any other sort is refused by name."""
    from bson import Int64, Timestamp
    co = client.olv.c
    co.insert_one({"_id": 1, "a": 1})  # creates the collection: two ops
    co.update_one({"_id": 1}, {"$set": {"a": 2}})
    co.insert_many([{"_id": 2}, {"_id": 3}])
    co.delete_one({"_id": 2})
    co.create_index("a")
    ol = client.local["oplog.rs"]
    assert client.local.list_collection_names() == ["oplog.rs"]
    st = client.local.command("collStats", "oplog.rs")
    assert st["capped"] is True and st["maxSize"] == 1 << 30 and st["count"] == 5
    assert list(ol.aggregate([{"$collStats": {"storageStats": {}}}]))[0][
        "storageStats"]["maxSize"] == 1 << 30
    last = list(ol.find().sort("$natural", -1).limit(4))
    assert [(d["op"], d["ns"]) for d in last] == [
        ("c", "olv.$cmd"), ("d", "olv.c"), ("c", "admin.$cmd"), ("u", "olv.c")]
    assert last[0]["o"] == {"createIndexes": "c", "v": 2, "name": "a_1", "key": {"a": 1},
                            "unique": False}
    assert last[1]["o"] == {"_id": 2} and type(last[1]["txnNumber"]) is Int64
    assert [x["op"] for x in last[2]["o"]["applyOps"]] == ["i", "i"]
    assert (last[3]["o"], last[3]["o2"]) == ({"_id": 1, "a": 2}, {"_id": 1})
    first = ol.find().sort("$natural", 1).limit(1).next()
    assert [(x["op"], x["ns"]) for x in first["o"]["applyOps"]] == [
        ("c", "olv.$cmd"), ("i", "olv.c")]  # the session record is not an op
    assert "lsid" in first and type(first["t"]) is Int64 and type(first["ts"]) is Timestamp
    tss = [d["ts"] for d in ol.find()]
    assert tss == sorted(tss) and len(set(tss)) == 5
    assert [d["op"] for d in ol.find({"ts": {"$gt": tss[2]}})] == ["d", "c"]
    assert [d["o"] for d in ol.find({"op": "d"}, {"o": 1, "_id": 0})] == [{"_id": 2}]
    with pytest.raises(OperationFailure, match=r"natural order only") as ei:
        ol.find().sort("ts", 1).sort("op", 1).next()
    assert ei.value.code == 2
    # counts, distinct, pipelines and $expr read the same view
    assert ol.count_documents({}) == ol.estimated_document_count() == 5
    assert ol.count_documents({"op": "c"}) == 3 and ol.distinct("op") == ["c", "d", "u"]
    assert list(ol.aggregate([{"$match": {"op": "d"}}, {"$project": {"_id": 0, "o": 1}}])) == [
        {"o": {"_id": 2}}]
    assert [d["op"] for d in ol.find({"$expr": {"$eq": ["$op", "u"]}})] == ["u"]
    # nothing writes it
    for write in (lambda: ol.insert_one({"x": 1}), lambda: ol.delete_many({}),
                  lambda: ol.update_one({}, {"$set": {"x": 1}}), lambda: ol.drop(),
                  lambda: client.admin.command("renameCollection", "olv.c",
                                               to="local.oplog.rs")):
        with pytest.raises(OperationFailure, match="is the oplog, not a collection"):
            write()
    assert ol.count_documents({}) == 5 and co.count_documents({}) == 2
    # a find's cursor holds its answer: past FIND_MAX entries it asks for a limit;
    # counts and pipelines stream
    from raymx.wire import oplog_view
    monkeypatch.setattr(oplog_view, "FIND_MAX", 2)
    with pytest.raises(OperationFailure, match="at most 2 entries"):
        list(ol.find())
    assert len(list(ol.find().limit(2))) == 2 and ol.count_documents({}) == 5
    assert len(list(ol.aggregate([{"$match": {}}]))) == 5


def test_a_tailable_cursor_on_local_oplog_rs_follows_the_oplog(served, client):
    """An oplog tailer (Meteor's, a connector's): a ``TAILABLE_AWAIT`` find of
    ``local.oplog.rs`` after the last ``ts`` stays open at the end, and its
    getMore waits for the next entries and returns them in order, filtered
    and projected; a plain ``TAILABLE`` one answers at once; a limit closes
    it. A position trimmed away ends it with ``CappedPositionLost`` (pymongo
    then closes the cursor, as on MongoDB's capped roll-over). What a
    tailable cursor cannot do is refused by name."""
    import threading
    from pymongo import CursorType
    co = client.tl.c
    co.insert_many([{"_id": 1}, {"_id": 2}])
    ol = client.local["oplog.rs"]
    last = ol.find().sort("$natural", -1).limit(1).next()
    cur = ol.find({"ts": {"$gt": last["ts"]}, "ns": "tl.c"}, {"o": 1, "op": 1, "_id": 0},
                  cursor_type=CursorType.TAILABLE_AWAIT).max_await_time_ms(5_000)

    def later():
        time.sleep(0.3)
        co.insert_one({"_id": 3})
        client.tl.other.insert_one({"_id": 9})  # filtered out
        co.update_one({"_id": 3}, {"$set": {"a": 1}})
        co.delete_one({"_id": 1})
    w = threading.Thread(target=later)
    w.start()
    got = []
    while len(got) < 3 and cur.alive:
        got += list(cur)  # each pass ends at the end of what has arrived
    w.join()
    assert got == [{"op": "i", "o": {"_id": 3}}, {"op": "u", "o": {"_id": 3, "a": 1}},
                   {"op": "d", "o": {"_id": 1}}]
    assert cur.alive  # still at the end, waiting for more
    cur.close()
    # without awaitData a getMore answers at once; the cursor stays open
    plain = ol.find({"ns": "tl.c", "op": "i"}, cursor_type=CursorType.TAILABLE)
    assert [d["o"] for d in plain] == [{"_id": 3}] and plain.alive
    co.insert_one({"_id": 4})
    assert [d["o"] for d in plain] == [{"_id": 4}] and plain.alive
    # a limit: the cursor closes once it has returned that many
    lim = ol.find({"op": "i"}, cursor_type=CursorType.TAILABLE_AWAIT, limit=2)
    assert [d["o"] for d in lim] == [{"_id": 3}, {"_id": 4}] and not lim.alive
    # a position trimmed from the oplog ends the cursor, in MongoDB's words
    behind = ol.find({"op": "u"}, cursor_type=CursorType.TAILABLE)
    assert len(list(behind)) == 1
    svc = served[1]
    for _ in range(3):
        co.insert_one({})
    svc.e.trim_oplog(None, 1, None, 1_000)  # down to the last entry
    with pytest.raises(OperationFailure, match="was trimmed") as ei:
        client.local.command("getMore", behind.cursor_id, collection="oplog.rs")
    assert ei.value.code == 136
    assert list(behind) == [] and not behind.alive  # pymongo ends the cursor on that code
    # refused: a sort other than $natural: 1, a skip, a single batch, $expr, a
    # tailable cursor on any other collection, awaitData without tailable
    for bad, words in (
            (lambda: ol.find({}, cursor_type=CursorType.TAILABLE).sort("$natural", -1),
             "oldest first"),
            (lambda: ol.find({}, cursor_type=CursorType.TAILABLE, skip=1), "takes no skip"),
            (lambda: ol.find({"$expr": {"$eq": ["$op", "i"]}},
                             cursor_type=CursorType.TAILABLE), "plain filter"),
            (lambda: co.find({}, cursor_type=CursorType.TAILABLE), "only one is local.oplog.rs")):
        with pytest.raises(OperationFailure, match=words) as ei:
            list(bad())
        assert ei.value.code == 2
    with pytest.raises(OperationFailure, match="without also setting 'tailable'") as ei:
        client.local.command("find", "oplog.rs", awaitData=True)
    assert ei.value.code == 9
    assert co.count_documents({}) == 6  # the connection serves on


def test_a_tailer_resuming_at_a_ts_starts_there_not_at_the_oldest_entry(served, client,
                                                                       monkeypatch):
    """As MongoDB's oplog replay: a find (tailable or not) or a count with a
    lower bound on ``ts`` starts at its entry (a binary search of the
    oplog), so a tailer resuming after an hour of old entries reads none of
    them."""
    from pymongo import CursorType
    from raymx.wire import oplog_view
    svc, ol, co = served[1], client.local["oplog.rs"], client.tl.c
    real_now = svc.e._now_ms
    svc.e._now_ms = lambda: real_now() - 3_600_000  # an hour ago
    try:
        client.tl.old.insert_many([{"_id": i} for i in range(40)])
        for i in range(40, 60):
            client.tl.old.insert_one({"_id": i})
    finally:
        svc.e._now_ms = real_now
    co.insert_one({"_id": 1})
    at = ol.find().sort("$natural", -1).limit(1).next()["ts"]
    decoded, entry_doc = [], oplog_view.entry_doc
    monkeypatch.setattr(oplog_view, "entry_doc", lambda *a: decoded.append(1) or entry_doc(*a))
    resumed = ol.find({"ts": {"$gt": at}}, cursor_type=CursorType.TAILABLE_AWAIT)
    assert list(resumed) == [] and resumed.alive
    co.insert_one({"_id": 2})
    assert [d["o"] for d in resumed] == [{"_id": 2}]
    assert len(decoded) == 2  # the entry at `at` (filtered out) and the new one
    # so does a plain find (MongoDB applies oplog replay to every find of the
    # oplog with a lower bound on ts), and a count
    del decoded[:]
    assert [d["op"] for d in ol.find({"ts": {"$gte": at}})] == ["c", "i"]  # at, then new
    assert ol.count_documents({"ts": {"$gt": at}}) == 1 and len(decoded) == 4
    # a bound older than every entry starts at the oldest, one newer at the end
    assert len(list(ol.find({"ts": {"$gte": Timestamp(1, 0)}},
                            cursor_type=CursorType.TAILABLE))) == 23
    late = ol.find({"ts": {"$gt": Timestamp(at.time + 3600, 0)}}, cursor_type=CursorType.TAILABLE)
    assert list(late) == [] and late.alive
