"""Cursors through the client port: getMore, killCursors, idle expiry, a
client that leaves, and batches cut to fit a frame."""
import threading
import time

import pytest

from raymx import errors
from raymx.client import Connection
from raymx.storage.limits import Limits
from tests.port_helpers import (SECRET, busy_writer, client_of, frame, raw_after_hello, serving,
                                wait_for)
from tests.port_helpers import port  # noqa: F401 (the fixture)


def test_a_find_still_running_when_its_client_leaves_keeps_no_cursor(port):
    """The find waits (read after a GTID not yet written) while its connection
    closes; when it runs, its cursor is closed at once (it holds an LMDB
    snapshot, and nobody can ask for more)."""
    p, svc = port
    c = Connection("127.0.0.1", p.port, SECRET)
    c.request({"op": "insert", "ns": "k.c", "docs": [{"_id": i} for i in range(50)]})
    last, _ = svc.e.last()
    s = raw_after_hello(p)
    s.sendall(frame({"id": 2, "op": "find", "ns": "k.c", "batch": 1,
                     "after": [last.term, last.seq + 1], "after_timeout_ms": 5000}))
    time.sleep(0.2)
    s.close()
    wait_for(lambda: p.connections == 1)
    c.request({"op": "insert", "ns": "k.c", "docs": [{"_id": 99}]})  # the find runs now
    time.sleep(0.3)
    assert svc.status()["open_cursors"] == 0
    # a live client's cursors: open while it reads, forgotten when exhausted
    out = c.request({"op": "find", "ns": "k.c", "batch": 20})
    assert out["cursor"] and svc.status()["open_cursors"] == 1
    while out["cursor"]:
        cid = out["cursor"]
        out = c.request({"op": "getMore", "cursor": cid, "batch": 20})
    assert svc.status()["open_cursors"] == 0
    c.close()


def test_idle_cursors_expire(tmp_path):
    lim = Limits(cursor_idle_ms=300, sync_interval_ms=20)
    with serving(tmp_path, lim) as (p, svc):
        c = Connection("127.0.0.1", p.port, SECRET)
        c.request({"op": "insert", "ns": "i.c", "docs": [{"_id": i} for i in range(100)]})
        idle = c.request({"op": "find", "ns": "i.c", "batch": 2})["cursor"]
        busy = c.request({"op": "find", "ns": "i.c", "batch": 2})["cursor"]
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:  # one is used, the other left alone
            assert len(c.request({"op": "getMore", "cursor": busy, "batch": 1})["docs"]) == 1
            time.sleep(0.1)
        c.request({"op": "find", "ns": "i.c", "batch": 2})  # a cursor opens: the sweep runs
        with pytest.raises(errors.InvalidOperation, match="not found"):
            c.request({"op": "getMore", "cursor": idle})
        assert c.request({"op": "getMore", "cursor": busy, "batch": 1})["docs"]
        assert svc.status()["open_cursors"] == 2
        c.close()


def test_a_cursor_killed_during_its_get_more_is_closed_when_that_ends(port):
    """killCursors (or the client leaving) while a getMore holds the cursor:
    the cursor is closed when the getMore ends, not put back until idle expiry."""
    p, svc = port
    c = Connection("127.0.0.1", p.port, SECRET)
    c.request({"op": "insert", "ns": "gk.c", "docs": [{"_id": i} for i in range(20)]})
    cid = c.request({"op": "find", "ns": "gk.c", "batch": 2})["cursor"]
    cur, inside, go = svc._cursors[cid], threading.Event(), threading.Event()
    rest = cur.it

    def slow():
        inside.set()
        go.wait(5)
        yield from rest
    cur.it = slow()
    f = c.submit({"op": "getMore", "cursor": cid, "batch": 2})
    assert inside.wait(5)
    assert c.request({"op": "killCursors", "cursors": [cid, 12345]}, timeout_s=5) == {
        "killed": [cid], "notFound": [12345]}  # a busy cursor is killed too
    go.set()
    out = f.result(5)
    assert len(out["docs"]) == 2 and out["cursor"] == 0  # its batch, and no more
    assert svc.status()["open_cursors"] == 0
    with pytest.raises(errors.InvalidOperation, match="not found"):
        c.request({"op": "getMore", "cursor": cid}, timeout_s=5)
    c.close()


def test_large_documents_come_back_in_batches_that_fit_a_frame(port):
    """Batches are cut by the documents' encoded size, so whatever was stored
    can be read (here 40 documents of 200 KB through a 1 MiB frame limit); a
    find in a transaction that cannot fit one answer says so and the
    connection stays."""
    p, svc = port
    c = client_of(p)
    coll = c["big"]["c"]
    for k in range(0, 40, 4):  # 800 KB per insert (a frame of this port holds 1 MiB)
        coll.insert_many([{"_id": i, "s": "x" * 200_000} for i in range(k, k + 4)])
    got = [d["_id"] for d in coll.find()]
    assert got == list(range(40))
    assert [d["_id"] for d in coll.find(batch_size=3)] == list(range(40))
    with c.transaction() as tx:
        with pytest.raises(errors.InvalidOperation, match="inside a transaction"):
            list(tx["big"]["c"].find())
        assert len(list(tx["big"]["c"].find({"_id": {"$lt": 3}}))) == 3
    assert coll.count_documents({}) == 40
    c.close()


def test_point_reads_run_on_the_port_thread_and_others_on_the_readers(port):
    """A find of the one document its filter names by _id (readConcern local)
    runs on the port's thread: the right document, or none, with its
    projection and the rest of its filter, also while the writer is busy. A
    find that may scan, waits for a GTID, or reads at the majority point goes
    to the reader pool and answers the same."""
    p, svc = port
    c = Connection("127.0.0.1", p.port, SECRET)
    ids = list(range(20)) + [f"s{k}" for k in range(5)] + [2.5, b"\x01b"]
    c.request({"op": "insert", "ns": "pt.c", "docs": [{"_id": i, "n": k} for k, i in enumerate(ids)]})

    def find(flt, **kw):
        return c.request({"op": "find", "ns": "pt.c", "filter": flt, "limit": 1, **kw})
    before = svc.port_reads
    blocker = busy_writer(svc)  # a point read never waits for the writer
    try:
        for k, i in enumerate(ids):
            assert find({"_id": i}) == {"cursor": 0, "docs": [{"_id": i, "n": k}]}
        assert find({"_id": 999}) == {"cursor": 0, "docs": []}
        assert find({"_id": 3, "n": 4})["docs"] == []  # the rest of the filter applies
        assert find({"_id": 3}, projection={"n": 0})["docs"] == [{"_id": 3}]
        assert find({"_id": "s1"}, readConcern="local")["docs"] == [{"_id": "s1", "n": 21}]
    finally:
        blocker.set()
    assert svc.port_reads == before + len(ids) + 4
    with pytest.raises(errors.InvalidInput):  # a bad request is answered, the port serves on
        find({"_id": 1}, skip=-1)
    last, _ = svc.e.last()
    before = svc.port_reads
    for flt, kw in (({"_id": {"$gt": 17}}, {}), ({"n": 3}, {}),
                    ({"_id": 3}, {"readConcern": "majority"}),
                    ({"_id": 3}, {"after": [last.term, last.seq]}),
                    ({"_id": [1, 2]}, {})):
        out = find(flt, **kw)
        assert out["cursor"] == 0 and len(out["docs"]) <= 1, (flt, kw)
    assert find({"_id": {"$gt": 17}})["docs"] == [{"_id": 18, "n": 18}]
    assert svc.port_reads == before  # none of those ran on the port
    c.close()


def test_find_one_is_one_request_that_answers_as_find_limit_one(port):
    """``find_one`` sends one find with a limit of one (no Cursor): the same
    document as ``find(...).limit(1)`` for every kind of filter, no cursor
    left open on the member, and its options still go through ``find``."""
    p, svc = port
    cl = client_of(p)
    coll = cl["fo"]["c"]
    coll.insert_many([{"_id": i, "n": i % 3} for i in range(30)])
    for flt in (None, {}, 7, {"_id": 7}, {"_id": 999}, {"n": 2}, {"_id": {"$gt": 25}}):
        want = next(iter(coll.find(flt if isinstance(flt, (dict, type(None))) else {"_id": flt})
                         .limit(1)), None)
        assert coll.find_one(flt) == want, flt
    assert coll.find_one({"n": 1}, {"n": 0}) == {"_id": 1}  # a projection: through find
    assert coll.find_one({"n": 1}, sort=[("_id", -1)]) == {"_id": 28, "n": 1}
    with pytest.raises(errors.InvalidFilter):
        coll.find_one({"_id": {"$nope": 1}})
    assert coll.find_one(3) == {"_id": 3, "n": 0}  # the connection serves on
    assert svc.status()["open_cursors"] == 0
    cl.close()


def test_max_time_ms_bounds_a_read_s_batches_as_mongodb_s_maxtimems(port):
    """``max_time_ms`` (MongoDB's ``maxTimeMS``): a find or count that runs
    past it fails with ``ExecutionTimeout`` (its cursor closed, nothing
    stored touched) and the connection serves on; the time counts every
    batch of a cursor, not the client's pauses between them; a read waiting
    for a GTID waits no longer than it."""
    p, svc = port
    cl = client_of(p)
    co = cl["t"]["big"]
    co.insert_many([{"_id": i, "v": i % 7} for i in range(30_000)])
    slow = {"v": {"$gt": 100}}  # matches nothing: the whole collection is examined
    with pytest.raises(errors.ExecutionTimeout, match="exceeded time limit"):
        list(co.find(slow, max_time_ms=1))
    with pytest.raises(errors.ExecutionTimeout):
        co.count_documents(slow, max_time_ms=1)
    wait_for(lambda: svc.status()["open_cursors"] == 0)
    assert co.count_documents(slow, max_time_ms=60_000) == 0  # time enough
    # a cursor read in small batches with pauses between them: the pauses are free
    cur = co.find({}, batch_size=5_000).max_time_ms(2_000)
    got = [next(cur)]
    time.sleep(2.5)
    got += list(cur)
    assert len(got) == 30_000
    # refused: a negative limit
    with pytest.raises(TypeError, match="max_time_ms"):
        co.find({}).max_time_ms(-1)
    with pytest.raises(errors.InvalidOperation, match="max_time_ms"):
        cl._read_call(co.read_preference, {"op": "count", "ns": "t.big", "filter": {},
                                           "max_time_ms": "soon"})
    # a read after a GTID not written yet waits max_time_ms, not the default 10 s
    last, _ = svc.e.last()
    t0 = time.monotonic()
    with pytest.raises(errors.ReadConcernTimeout):
        cl._read_call(co.read_preference, {"op": "find", "ns": "t.big", "filter": {"_id": 1},
                                           "after": [last.term, last.seq + 5],
                                           "max_time_ms": 300})
    assert time.monotonic() - t0 < 5
    assert co.find_one({"_id": 7}) == {"_id": 7, "v": 0}
    cl.close()
