"""The wire port's sessions (raymx/wire/sessions.py) through pymongo: snapshot
reads, transactions, retryable writes."""
import time

import bson
import pymongo
import pytest
from pymongo.errors import OperationFailure

from tests.port_helpers import busy_writer
from tests.test_wire import client, served  # noqa: F401 (the fixtures)


def test_a_snapshot_session_reads_one_snapshot(client):
    """pymongo's snapshot sessions: the first read answers its point
    (``atClusterTime``), and the session's later reads read there, whatever
    was written since."""
    c = client.db.get_collection("snap", write_concern=pymongo.WriteConcern("majority"))
    c.insert_many([{"_id": 1}, {"_id": 2}])
    with client.start_session(snapshot=True) as s:
        assert [d["_id"] for d in c.find({}, session=s)] == [1, 2]
        at = s._snapshot_time
        assert isinstance(at, bson.Timestamp)
        c.insert_one({"_id": 3})
        c.delete_one({"_id": 1})
        assert sorted(d["_id"] for d in c.find({}, session=s)) == [1, 2]  # the same snapshot
        assert [d["_id"] for d in c.aggregate([{"$sort": {"_id": -1}}], session=s)] == [2, 1]
        assert c.count_documents({}, session=s) == 2
    assert [d["_id"] for d in c.find({})] == [2, 3]
    with pytest.raises(OperationFailure, match="atClusterTime"):
        client.db.command("find", "snap", readConcern={"level": "majority", "atClusterTime": at})


def test_transaction(client):
    c = client.db.t
    with client.start_session() as s:
        with s.start_transaction():
            c.insert_one({"_id": "a"}, session=s)
            c.update_one({"_id": "a"}, {"$set": {"v": 1}}, session=s)
            assert c.find_one({"_id": "a"}, session=s) == {"_id": "a", "v": 1}
            assert c.find_one({"_id": "a"}) is None  # not visible outside before commit
    assert c.find_one({"_id": "a"}) == {"_id": "a", "v": 1}
    with client.start_session() as s:
        s.start_transaction()
        c.insert_one({"_id": "b"}, session=s)
        s.abort_transaction()
    assert c.find_one({"_id": "b"}) is None


def test_a_transaction_creates_collections_and_indexes_and_refuses_other_commands(client):
    """As MongoDB 4.4+: create and createIndexes run inside the transaction
    (visible at its commit, gone at its abort); a command a transaction may
    not hold (listCollections, drop...) is refused with
    OperationNotSupportedInTransaction and aborts it. Before, such a command
    ran outside the transaction (a create committed at once, an abort kept
    it) and the transaction was never begun or left for dead."""
    db = client.txddl
    db.keep.insert_one({"_id": 1})
    with client.start_session() as s:
        s.start_transaction()
        db.create_collection("made", session=s, check_exists=False)
        db.made.insert_one({"_id": 1}, session=s)
        out = db.command("createIndexes", "made", indexes=[
            {"key": {"u": 1}, "name": "u_1", "unique": True}], session=s)
        assert out["numIndexesAfter"] == out["numIndexesBefore"] + 1
        assert "made" not in db.list_collection_names()  # not before the commit
        s.commit_transaction()
    assert db.made.find_one() == {"_id": 1} and "u_1" in db.made.index_information()
    with client.start_session() as s:
        s.start_transaction()
        db.command("create", "gone", session=s)
        s.abort_transaction()
    assert "gone" not in db.list_collection_names()
    for refused in (lambda s: db.list_collection_names(session=s),
                    lambda s: db.drop_collection("keep", session=s)):
        with client.start_session() as s:
            s.start_transaction()
            db.keep.insert_one({"_id": 2}, session=s)
            with pytest.raises(OperationFailure) as ei:
                refused(s)
            assert ei.value.code == 263
            with pytest.raises(OperationFailure) as ei:  # the transaction was aborted
                s.commit_transaction()
            assert ei.value.code == 251
    assert list(db.keep.find()) == [{"_id": 1}]


def test_retryable_write_is_applied_once(client):
    """A retried write (same lsid and txnNumber) gets the first answer back,
    nothing applied twice; an older txnNumber is refused."""
    db = client.db
    # pymongo's own retryable writes take this path
    db.r.insert_one({"_id": 2})
    db.r.find_one_and_update({"_id": 2}, {"$set": {"x": 1}})
    with client.start_session() as s:
        cmd = {"insert": "r", "documents": [{"_id": 1, "v": 1}], "txnNumber": bson.Int64(50)}
        first = db.command(dict(cmd), session=s)
        again = db.command(dict(cmd), session=s)
        assert first["n"] == again["n"] == 1
        upd = {"update": "r", "updates": [{"q": {"_id": 1}, "u": {"$inc": {"v": 1}}}],
               "txnNumber": bson.Int64(60)}
        assert db.command(dict(upd), session=s)["nModified"] == 1
        assert db.command(dict(upd), session=s)["nModified"] == 1
        assert db.r.find_one({"_id": 1}) == {"_id": 1, "v": 2}
        with pytest.raises(OperationFailure) as ei:
            db.command(dict(cmd, txnNumber=bson.Int64(40)), session=s)
        assert ei.value.code == 225
        # several statements: one member transaction with the record
        many = {"insert": "r", "documents": [{"_id": 10}, {"_id": 11}],
                "txnNumber": bson.Int64(70)}
        assert db.command(dict(many), session=s)["n"] == db.command(dict(many), session=s)["n"]
        assert db.r.count_documents({"_id": {"$gte": 10}}) == 2
        s._server_session.mark_dirty()  # its numbers were forged: pymongo must not reuse it
    assert db.r.count_documents({}) == 4


def test_a_retry_racing_its_first_attempt_is_applied_once(served, client):
    """A driver that gives up on an attempt (a socket timeout) sends the same
    write again (same lsid and txnNumber) while the first is still queued for
    the writer: both read no record, both reach the member. The member checks
    the record in the write's own transaction, so the second is not applied
    again and is answered from the record. Before, the counter went up twice
    (the nemesis' bank check found it: 434 increments for 433 acknowledged)."""
    import threading
    _, svc = served
    db = client.db
    db.race.insert_one({"_id": 1, "v": 0})
    with client.start_session() as s:
        upd = {"update": "race", "updates": [{"q": {"_id": 1}, "u": {"$inc": {"v": 1}}}],
               "txnNumber": bson.Int64(7)}
        blocker = busy_writer(svc)  # both attempts wait for the writer
        outs, errs = [], []

        def attempt():
            try:
                outs.append(db.command(dict(upd), session=s))
            except Exception as e:  # noqa: BLE001 - reported below
                errs.append(e)
        threads = [threading.Thread(target=attempt) for _ in range(2)]
        for t in threads:
            t.start()
        time.sleep(0.5)  # both sent and queued behind the held writer
        blocker.set()
        for t in threads:
            t.join(10)
        s._server_session.mark_dirty()  # its numbers were forged: pymongo must not reuse it
    assert not errs, errs
    assert [o["nModified"] for o in outs] == [1, 1]
    assert db.race.find_one({"_id": 1}) == {"_id": 1, "v": 1}
