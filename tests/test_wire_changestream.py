"""Change streams on the MongoDB wire port with the real pymongo
(``raymx/wire/changestream.py``): events in MongoDB's shape, resuming after
a token or at an operation time, replace events, big documents a batch at a
time. A member served in process, as in tests/test_wire.py."""
import bson
import pytest
from pymongo.errors import OperationFailure

from raymx.storage import codec
from tests.test_wire import client, served  # noqa: F401 (the fixtures)


def test_a_change_stream_of_big_documents_moves_on_a_batch_at_a_time(served, client):
    """Events come at most ``cursor_batch_bytes`` an answer. Before, one answer
    held every event a scan found: 60 inserts of 1 MiB went past the
    driver's limit (the wire port) and the frame limit (the member's own
    ``watch``), and a stream that resumed got the same answer: stuck."""
    _, svc = served
    c = client.db.bigcs
    with c.watch(max_await_time_ms=200) as s:
        for i in range(60):
            c.insert_one({"_id": i, "pad": bytes([i]) * (1 << 20)})
        ids = [s.next()["documentKey"]["_id"] for _ in range(60)]
    assert ids == list(range(60))
    # the member's own change stream (the native driver's watch)
    token, got, answers = [0, 0], [], 0
    while len(got) < 60:
        out = svc.watch({"after": token, "namespaces": ["db.bigcs"], "readConcern": "local"})
        assert len(codec.pack(out)) <= svc.limits.frame_bytes_max
        got += [ev["_id"] for ev in out["events"] if ev["op"] == "insert"]
        token, answers = out["resume"], answers + 1
    assert got == list(range(60)) and answers > 10


def test_change_stream_and_resume(client):
    """watch(): MongoDB-shaped events; a new stream resumes after a token."""
    c = client.db.cs
    with c.watch(max_await_time_ms=200) as s:
        c.insert_one({"_id": 1, "a": 1})
        c.update_one({"_id": 1}, {"$set": {"a": 2}, "$unset": {"nope": 1}})
        c.delete_one({"_id": 1})
        client.db.other.insert_one({"_id": "elsewhere"})  # another collection: not seen
        evs = [s.next() for _ in range(3)]
    assert [e["operationType"] for e in evs] == ["insert", "update", "delete"]
    assert evs[0]["fullDocument"] == {"_id": 1, "a": 1} and evs[0]["ns"] == {"db": "db",
                                                                          "coll": "cs"}
    assert evs[1]["updateDescription"]["updatedFields"] == {"a": 2}
    assert evs[2]["documentKey"] == {"_id": 1}
    c.insert_one({"_id": 2})
    with c.watch(resume_after=evs[1]["_id"], full_document="updateLookup",
                 max_await_time_ms=200) as s:
        nxt = [s.next() for _ in range(2)]
    assert [(e["operationType"], e["documentKey"]["_id"]) for e in nxt] == \
        [("delete", 1), ("insert", 2)]
    # updateDescription names what changed as MongoDB's delta updates do: a
    # subdocument's field by its dotted path, appended elements by index, an
    # array cut short in truncatedArrays; a new value or type whole
    c.insert_one({"_id": 3, "a": {"b": 1, "c": 2}, "tags": ["x"], "q": [1, 2, 3], "n": 1})
    with c.watch(max_await_time_ms=200) as s:
        c.update_one({"_id": 3}, {"$set": {"a.b": 5, "n": 1.5}, "$unset": {"a.c": 1},
                                  "$push": {"tags": "y"}, "$pop": {"q": 1}})
        c.update_one({"_id": 3}, {"$set": {"a": {"z": 0}, "tags": ["y", "x"]}})
        ud = [s.next()["updateDescription"] for _ in range(2)]
    assert ud[0] == {"updatedFields": {"a.b": 5, "n": 1.5, "tags.1": "y"},
                     "removedFields": ["a.c"], "truncatedArrays": [{"field": "q", "newSize": 2}]}
    assert ud[1] == {"updatedFields": {"a.z": 0, "tags": ["y", "x"]}, "removedFields": ["a.b"],
                     "truncatedArrays": []}
    with client.db.watch([{"$match": {"operationType": "insert"}}],
                         max_await_time_ms=200) as s:
        client.db.cs.delete_one({"_id": 2})
        client.db.other.insert_one({"_id": "x"})
        e = s.next()
    assert (e["ns"]["coll"], e["documentKey"]) == ("other", {"_id": "x"})


def test_change_stream_starts_at_an_operation_time(client):
    """startAtOperationTime with an operationTime raymx answered (a GTID as
    Timestamp(term, seq)) starts at that entry, included; a wall-clock time
    (seconds as MongoDB's connectors send) starts at the first entry
    committed in or after that second, an event's clusterTime at its own
    entry; a second resume option is refused."""
    import time
    c = client.db.sat
    with client.start_session() as s:
        c.insert_one({"_id": "before"}, session=s)
        c.insert_one({"_id": "at"}, session=s)
        at = s.operation_time
    c.insert_one({"_id": "after"})
    with c.watch(start_at_operation_time=at, max_await_time_ms=200) as st:
        got = [st.next()["documentKey"]["_id"] for _ in range(2)]
        resumed = st.resume_token
    assert got == ["at", "after"]
    c.insert_one({"_id": "later"})
    with c.watch(resume_after=resumed, max_await_time_ms=200) as st:
        assert st.next()["documentKey"]["_id"] == "later"
    with c.watch(start_at_operation_time=bson.Timestamp(int(time.time()) + 5, 0),
                 max_await_time_ms=200) as st:  # in the future: nothing yet
        assert st.try_next() is None
    time.sleep(1.1)
    cut = int(time.time())
    c.insert_one({"_id": "clock"})
    with c.watch(start_at_operation_time=bson.Timestamp(cut, 1), max_await_time_ms=200) as st:
        ev = st.next()
        assert ev["documentKey"]["_id"] == "clock"
        again = ev["clusterTime"]  # an event's clusterTime starts a stream too
    with c.watch(start_at_operation_time=again, max_await_time_ms=200) as st:
        assert st.next()["documentKey"]["_id"] == "clock"
    # an event's clusterTime is Timestamp(second, seq), its entry's ts in
    # local.oplog.rs: it starts a stream at that very entry, not at the
    # first of its second
    assert again == client.local["oplog.rs"].find({"o._id": "clock"}).next()["ts"]
    for i in range(5):
        c.insert_one({"_id": f"one{i}"})
        c.insert_one({"_id": f"two{i}"})
        with c.watch(start_at_operation_time=bson.Timestamp(cut, 0),
                     max_await_time_ms=200) as st:  # "clock", then each pair so far
            one, two = [st.next() for _ in range(3 + 2 * i)][-2:]
        if one["clusterTime"].time == two["clusterTime"].time:  # in one second: a real test
            break
    assert two["clusterTime"].inc == one["clusterTime"].inc + 1
    with c.watch(start_at_operation_time=two["clusterTime"], max_await_time_ms=200) as st:
        assert st.next()["documentKey"]["_id"] == two["documentKey"]["_id"]
    with c.watch(start_at_operation_time=bson.Timestamp(1_000_000_000, 0),
                 max_await_time_ms=200) as st:  # before the set: from its first entry
        assert st.next()["documentKey"]["_id"] == "before"
    with pytest.raises(OperationFailure) as ei:  # pymongo sends one; a raw command both
        client.db.command("aggregate", "sat", cursor={}, pipeline=[{"$changeStream": {
            "startAtOperationTime": at, "resumeAfter": resumed}}])
    assert ei.value.code == 40674


def test_change_stream_replace_events(client):
    """replace_one and find_one_and_replace come as ``replace`` events with the
    new document, as MongoDB's; an update pipeline stays an ``update``."""
    c = client.db.csr
    c.insert_one({"_id": 1, "a": 1, "b": 1})
    with c.watch(max_await_time_ms=200, full_document_before_change="whenAvailable") as s:
        c.replace_one({"_id": 1}, {"a": 2})
        c.find_one_and_replace({"_id": 1}, {"c": 3})
        c.update_one({"_id": 1}, [{"$set": {"d": 4}}])
        c.update_one({"_id": 1}, {"$set": {"e": 5}})
        evs = [s.next() for _ in range(4)]
    assert [e["operationType"] for e in evs] == ["replace", "replace", "update", "update"]
    assert evs[0]["fullDocument"] == {"_id": 1, "a": 2}
    assert evs[0]["fullDocumentBeforeChange"] == {"_id": 1, "a": 1, "b": 1}
    assert evs[0]["documentKey"] == {"_id": 1} and "updateDescription" not in evs[0]
    assert evs[1]["fullDocument"] == {"_id": 1, "c": 3}
    assert evs[2]["updateDescription"]["updatedFields"] == {"d": 4}
    with c.watch([{"$match": {"operationType": "replace"}}], resume_after=evs[0]["_id"],
                 max_await_time_ms=200) as s:
        assert s.next()["fullDocument"] == {"_id": 1, "c": 3}
