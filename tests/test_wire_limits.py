"""The limits a wire command runs under, as MongoDB's: ``maxTimeMS`` and
``killOp``, on the member's reads and on what the port computes itself."""
import threading
import time

import pytest
from pymongo.errors import OperationFailure

from tests.test_wire import client, served  # noqa: F401 (the fixtures)


def test_max_time_ms_is_served_as_mongodb_s(client):
    """``maxTimeMS`` bounds a find, an aggregate (``count_documents``) and a
    distinct as in MongoDB: past it, ``MaxTimeMSExpired`` (50), which
    pymongo raises as ``ExecutionTimeout``; within it the answer is whole."""
    from pymongo.errors import ExecutionTimeout
    co = client.mt.c
    co.insert_many([{"_id": i, "v": i % 7} for i in range(30_000)])
    slow = {"v": {"$gt": 100}}
    for run in (lambda: list(co.find(slow).max_time_ms(1)),
                lambda: co.count_documents(slow, maxTimeMS=1),
                lambda: co.distinct("v", slow, maxTimeMS=1),
                lambda: list(co.aggregate([{"$match": slow}], maxTimeMS=1))):
        with pytest.raises(ExecutionTimeout) as ei:
            run()
        assert ei.value.code == 50
    assert co.count_documents(slow, maxTimeMS=60_000) == 0
    assert len(list(co.find({}).max_time_ms(60_000))) == 30_000
    with pytest.raises(OperationFailure, match="maxTimeMS must be"):
        client.mt.command("find", "c", maxTimeMS=-5)


_CORRELATED = [{"$lookup": {"from": "c", "let": {"v": "$v"}, "as": "same", "pipeline": [
    {"$match": {"$expr": {"$eq": ["$v", "$$v"]}}}, {"$count": "n"}]}}]


def test_max_time_ms_bounds_the_pipeline_stages_the_port_runs(client):
    """The stages the port computes (here a correlated ``$lookup``: every
    document against every other, minutes of work) stop once ``maxTimeMS``,
    counted from the command's start, has passed: ``MaxTimeMSExpired`` (50),
    and the connection serves on. Before, only the member's reads counted."""
    from pymongo.errors import ExecutionTimeout
    co = client.mtp.c
    co.insert_many([{"_id": i, "v": i % 50} for i in range(3_000)])
    t0 = time.monotonic()
    with pytest.raises(ExecutionTimeout) as ei:
        list(co.aggregate(_CORRELATED, maxTimeMS=300))
    assert ei.value.code == 50
    assert time.monotonic() - t0 < 30  # stopped, not run to its end
    got = list(co.aggregate([{"$match": {"_id": {"$lt": 40}}}] + _CORRELATED,
                            maxTimeMS=60_000))  # within its limit: the whole answer
    assert [d["same"] for d in got] == [[{"n": 60}]] * 40
    with pytest.raises(ExecutionTimeout):  # a find the port computes ($expr)
        list(co.find({"$expr": {"$gt": [{"$size": {"$range": [0, "$v", 1]}}, 1_000]}})
             .max_time_ms(1).batch_size(10_000))
    assert co.count_documents({}) == 3_000


def _kill_while_running(client, run, name: str, ns: str):
    """``run()`` on a thread (one of the client's sockets); its command
    (``name`` on ``ns``) found in ``currentOp`` from another socket and
    killed. Returns the OperationFailure ``run`` raised, or None."""
    got = {}

    def go():
        try:
            run()
        except OperationFailure as e:
            got["err"] = e
    t = threading.Thread(target=go)
    t.start()
    deadline, op = time.monotonic() + 10, None
    while op is None and time.monotonic() < deadline:
        op = next((x["opid"] for x in client.admin.command("currentOp")["inprog"]
                   if x["command"].get(name) and x["ns"] == ns), None)
    assert op is not None, f"{name} on {ns} never showed in currentOp"
    assert client.admin.command("killOp", op=op)["info"] == "attempting to kill op"
    t.join(60)
    return got.get("err")


def test_kill_op_stops_a_pipeline_the_port_runs(client):
    """``killOp`` reaches an aggregate's own stages too: ``Interrupted``
    (11601) at the next document between two stages."""
    co = client.kop.c
    co.insert_many([{"_id": i, "v": i % 50} for i in range(3_000)])
    err = _kill_while_running(client, lambda: list(co.aggregate(_CORRELATED)), "aggregate",
                              "kop.c")
    assert err is not None and err.code == 11601, err
    assert co.count_documents({}) == 3_000


_SLOW = {"s": {"$regex": "(a+)+b"}}  # about 3 ms a document: seconds in all


def test_kill_op_stops_a_read_of_a_transaction(client):
    """A read inside a driver's transaction runs in that transaction's state
    on the member (its statements may come on any connection): ``killOp`` of
    the command reaches it too, with ``Interrupted`` (11601), and the
    session's next command is not interrupted by that mark."""
    co = client.kot.c
    co.insert_many([{"_id": i, "s": "a" * 16 + "c"} for i in range(3_000)])
    with client.start_session() as s:
        s.start_transaction()
        assert co.find_one({"_id": 1}, session=s)["_id"] == 1
        err = _kill_while_running(client, lambda: co.count_documents(_SLOW, session=s),
                                  "aggregate", "kot.c")
        assert err is not None and err.code == 11601, err
    with client.start_session() as s, s.start_transaction():  # a new one reads on
        assert co.count_documents({"_id": {"$lt": 10}}, session=s) == 10


def test_kill_op_stops_a_running_read_as_mongodb_s(client):
    """``db.killOp(opid)`` with an ``opid`` from ``currentOp``: the find that
    connection is running stops with ``Interrupted`` (11601) at its next
    look (every 256 documents examined), and the connection serves on."""
    co = client.ko.c
    co.insert_many([{"_id": i, "s": "a" * 16 + "c"} for i in range(3_000)])
    err = _kill_while_running(client, lambda: list(co.find(_SLOW)), "find", "ko.c")
    assert err is not None and err.code == 11601, err
    assert co.count_documents({}) == 3_000  # the connection serves on
    with pytest.raises(OperationFailure) as ei:
        client.admin.command("killOp", op="x")
    assert ei.value.code == 2


def test_a_client_limit_is_a_mongodb_error_not_an_internal_one(client):
    """One connection holding more open cursors than the member allows
    (``Limits.cursors_per_connection_max``) gets ``OperationFailed`` (96)
    naming the limit (it was ``InternalError``, 1, which reads as a server
    bug); its cursors and the connection go on serving."""
    co = client.lim.c
    co.insert_many([{"_id": i} for i in range(5)])
    cursors = []
    with pytest.raises(OperationFailure) as ei:
        for _ in range(200):
            cur = co.find().batch_size(1)
            next(cur)
            cursors.append(cur)
    assert ei.value.code == 96 and "cursors_per_connection_max" in str(ei.value)
    assert 0 < len(cursors) < 200
    assert [d["_id"] for d in cursors[0]] == [1, 2, 3, 4]  # the rest of the first one
    for cur in cursors:
        cur.close()
    assert co.count_documents({}) == 5
