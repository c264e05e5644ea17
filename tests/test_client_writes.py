"""Writes through the client port: group commit, small writes on the port's
thread and the others on the writer thread (in order), transactions holding
the writer, and writes whose outcome is unknown."""
import socket
import threading
import time

import pytest

from raymx import errors
from raymx.client import Connection
from raymx.storage.limits import Limits
from tests.port_helpers import (SECRET, busy_writer, client_of, frame, raw_after_hello, read_frame,
                                serving, wait_for)
from tests.port_helpers import port  # noqa: F401 (the fixture)


def test_group_commit_shares_syncs_among_durable_writers(port):
    p, svc = port
    conns = [Connection("127.0.0.1", p.port, SECRET) for _ in range(8)]
    errs = []

    def client(i):
        try:
            for k in range(50):
                conns[i].request({"op": "insert", "ns": "g.c", "docs": [{"_id": f"{i}-{k}"}],
                                  "j": True})
        except Exception as e:  # pragma: no cover - reported below
            errs.append(e)

    syncs0 = svc.group.syncs
    ts = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errs
    syncs = svc.group.syncs - syncs0
    assert svc.group.durable.seq == 400
    assert syncs < 400  # durable writers shared flushes
    for c in conns:
        c.close()


def test_queued_writes_share_one_commit_and_a_failing_one_fails_alone(port):
    """Writes that queue behind a busy writer run as one LMDB transaction: one
    GTID each, in arrival order; a duplicate among them fails alone."""
    p, svc = port
    blocker = threading.Event()
    svc.on_writer(blocker.wait)
    answers = {}
    done = threading.Semaphore(0)

    def reply_for(k):
        def reply(ok=None, err=None):
            answers[k] = (ok, err)
            done.release()
        return reply
    reqs = [{"op": "insert", "ns": "q.c", "docs": [{"_id": k % 7}], "j": k % 2 == 0}
            for k in range(10)]  # _id 0..6, then 0, 1, 2 again: duplicates
    for k, r in enumerate(reqs):
        svc.handle(r, reply_for(k), {})
    groups0 = svc.write_groups
    blocker.set()
    for _ in reqs:
        assert done.acquire(timeout=10)
    assert svc.write_groups == groups0 + 1
    ok = [answers[k][0] for k in range(7)]
    assert [o["gtid"][1] for o in ok] == list(range(1, 8))  # dense, in arrival order
    assert all(isinstance(answers[k][1], errors.DuplicateKey) for k in (7, 8, 9))
    assert svc.group.durable.seq == 7  # the j=True ones were answered after the flush
    assert svc.e.verify_oplog() == 7


def test_small_writes_run_on_the_port_thread_in_order_with_queued_ones(port):
    """Small autocommit writes run on the port's thread when the writer thread
    is idle; the others go to the writer. Pipelined on one connection, every
    write still commits in the order it was sent, also while the writer is busy."""
    p, svc = port
    c = Connection("127.0.0.1", p.port, SECRET)
    many = [{"_id": f"m{k}", "n": k} for k in range(svc.limits.port_insert_docs_max + 1)]
    reqs = []
    for k in range(30):
        reqs.append({"op": "insert", "ns": "o.c", "docs": [{"_id": k, "n": k}]})
        if k % 10 == 3:  # writer-thread work between the small ones
            reqs.append({"op": "update", "ns": "o.c", "filter": {}, "update": {"$inc": {"n": 1}},
                         "multi": True})
        if k == 20:
            reqs.append({"op": "insert", "ns": "o.c", "docs": many})
    inline0 = svc.port_writes
    futs = [c.submit(r) for r in reqs]
    seqs = [f.result(10)["gtid"][1] for f in futs]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert svc.port_writes > inline0  # most of them ran on the port's thread
    # the writer is busy: small writes queue behind it, and keep their order
    blocker = busy_writer(svc)
    futs = [c.submit({"op": "insert", "ns": "o.q", "docs": [{"_id": k}]}) for k in range(20)]
    time.sleep(0.2)
    assert not any(f.done() for f in futs)
    blocker.set()
    seqs = [f.result(10)["gtid"][1] for f in futs]
    assert seqs == list(range(seqs[0], seqs[0] + 20))
    # a write queued and not yet run (the writer took it, not yet the lock):
    # what arrives meanwhile must queue behind it, never overtake it on the port
    with svc._q.mutex:
        svc._q.unfinished_tasks += 1
    inline0 = svc.port_writes
    c.request({"op": "insert", "ns": "o.q", "docs": [{"_id": "late"}]})
    assert svc.port_writes == inline0
    deadline = time.monotonic() + 5  # the writer counts it done after answering
    while svc._q.unfinished_tasks > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    with svc._q.mutex:
        svc._q.unfinished_tasks -= 1
    for k in range(50):  # back on the port (unless a trim holds the writer just then)
        c.request({"op": "insert", "ns": "o.q", "docs": [{"_id": f"later{k}"}]})
        if svc.port_writes > inline0:
            break
    assert svc.port_writes > inline0
    assert c.request({"op": "count", "ns": "o.c", "filter": {"n": {"$gte": 0}}})["value"] == 95
    assert svc.e.verify_oplog() == seqs[-1] + 2 + k
    c.close()


def test_only_point_writes_run_on_the_port_thread(port):
    """An update or delete by _id runs on the port's thread; one whose filter
    may scan (no _id equality) goes to the writer thread, so it never holds
    the port."""
    p, svc = port
    c = Connection("127.0.0.1", p.port, SECRET)
    c.request({"op": "insert", "ns": "u.c", "docs": [{"_id": k, "n": k} for k in range(100)]})
    before = svc.port_writes
    for flt in ({"n": 3}, {"_id": {"$gt": 5}}, {}):
        c.request({"op": "update", "ns": "u.c", "filter": flt, "update": {"$inc": {"n": 1}}})
        c.request({"op": "delete", "ns": "u.c", "filter": flt})
    assert svc.port_writes == before
    # the writer answers before it marks its queue done: let it finish, so the
    # point writes find it idle (the condition for running on the port thread)
    deadline = time.monotonic() + 10
    while svc._q.unfinished_tasks and time.monotonic() < deadline:
        time.sleep(0.001)
    c.request({"op": "update", "ns": "u.c", "filter": {"_id": 50}, "update": {"$set": {"n": 0}}})
    c.request({"op": "delete", "ns": "u.c", "filter": {"_id": 51}})
    assert svc.port_writes >= before + 1  # (a trim holding the writer may send one away)
    c.close()


def test_a_write_after_a_small_one_in_the_same_read_runs_once(port):
    """A small write and one that must go to the writer thread (a multi update,
    a transaction) arriving in one read: each runs once and is answered once."""
    p, svc = port
    c = Connection("127.0.0.1", p.port, SECRET)
    c.request({"op": "insert", "ns": "d.c", "docs": [{"_id": "ctr", "n": 0}]})
    s = raw_after_hello(p)
    s.sendall(frame({"id": 10, "op": "insert", "ns": "d.c", "docs": [{"_id": 1}]})
              + frame({"id": 11, "op": "update", "ns": "d.c", "filter": {"_id": "ctr"},
                       "multi": True, "update": {"$inc": {"n": 1}}})
              + frame({"id": 12, "op": "insert", "ns": "d.c", "docs": [{"_id": 2}]})
              + frame({"id": 13, "op": "txnBegin"}))
    answers = [read_frame(s) for _ in range(4)]
    assert sorted(a["id"] for a in answers) == [10, 11, 12, 13]
    assert all("ok" in a for a in answers), answers
    txn = next(a["ok"]["txn"] for a in answers if a["id"] == 13)
    s.sendall(frame({"id": 14, "op": "txnAbort", "txn": txn}))
    assert read_frame(s) == {"id": 14, "ok": {"aborted": True}}
    s.settimeout(0.3)  # and nothing more: no second answer to any of them
    with pytest.raises(socket.timeout):
        s.recv(1)
    assert c.request({"op": "find", "ns": "d.c", "filter": {"_id": "ctr"}})["docs"] == [
        {"_id": "ctr", "n": 1}]
    s.close()
    c.close()


def test_a_failure_after_a_group_commit_answers_that_write_and_keeps_the_writer(port, monkeypatch):
    """A bug while acknowledging one write of a group (here: injected) answers
    that write with an internal error; the rest are answered and the writer
    thread lives on."""
    p, svc = port
    c = Connection("127.0.0.1", p.port, SECRET)
    ack = svc._acknowledge

    def flaky(g, res, req, reply):
        if req.get("docs") == [{"_id": "bad"}]:
            raise RuntimeError("injected")
        return ack(g, res, req, reply)
    monkeypatch.setattr(svc, "_acknowledge", flaky)
    blocker = busy_writer(svc)
    futs = [c.submit({"op": "insert", "ns": "f.c", "docs": [{"_id": k}]})
            for k in (1, "bad", 2)]
    blocker.set()
    with pytest.raises(errors.RaymxError, match="injected"):
        futs[1].result(5)
    assert futs[0].result(5)["inserted_ids"] == [1] and futs[2].result(5)["inserted_ids"] == [2]
    assert all(t.is_alive() for t in svc._threads)  # the writer (and the trimmer)
    blocker = busy_writer(svc)  # the writer thread still runs writes
    f = c.submit({"op": "insert", "ns": "f.c", "docs": [{"_id": 3}]})
    blocker.set()
    assert f.result(5)["inserted_ids"] == [3]
    c.close()


def test_a_write_that_times_out_says_its_outcome_is_unknown(port):
    p, svc = port
    c = client_of(p)
    c.timeout_s = 0.5
    blocker = busy_writer(svc)
    with pytest.raises(errors.RequestTimeout) as ei:
        c["to"]["c"].insert_one({"_id": 1})
    assert isinstance(ei.value, TimeoutError) and ei.value.info["outcome"] == "unknown"
    assert "may still be applied" in str(ei.value)
    blocker.set()
    wait_for(lambda: c["to"]["c"].count_documents({}) == 1)  # it was: the caller was told so
    c.close()


def test_a_transaction_holds_back_small_writes_of_other_connections(port):
    """An open transaction holds the writer: an autocommit write from another
    connection waits for its commit (never runs on the port thread meanwhile)."""
    p, svc = port
    a, b = Connection("127.0.0.1", p.port, SECRET), Connection("127.0.0.1", p.port, SECRET)
    txn = a.request({"op": "txnBegin"})["txn"]
    a.request({"op": "insert", "ns": "x.c", "docs": [{"_id": 1}], "txn": txn})
    f = b.submit({"op": "insert", "ns": "x.c", "docs": [{"_id": 2}]})
    time.sleep(0.2)
    assert not f.done()
    g_txn = a.request({"op": "txnCommit", "txn": txn})["gtid"]
    assert f.result(10)["gtid"][1] == g_txn[1] + 1
    a.close()
    b.close()


def test_a_transaction_begin_that_timed_out_is_aborted_not_left_holding_the_writer(tmp_path):
    """c2's txnBegin waits behind c1's transaction and times out at c2: the
    driver cancels it, so when c1 commits the member aborts that transaction
    at once instead of holding the writer for its whole lifetime."""
    from raymx.client import Client
    lim = Limits(transaction_lifetime_ms=20_000, sync_interval_ms=20)
    with serving(tmp_path, lim) as (p, svc):
        topo = {"secret": SECRET, "members": [{"id": 0, "host": "127.0.0.1", "port": p.port,
                                               "role": "primary"}]}
        c1, c2 = Client(lambda: topo, timeout_s=10), Client(lambda: topo, timeout_s=0.5)
        try:
            tx1 = c1.transaction().__enter__()
            tx1["a"]["b"].insert_one({"_id": "t1"})
            with pytest.raises(TimeoutError):
                with c2.transaction() as tx2:
                    tx2["a"]["b"].insert_one({"_id": "t2"})
            tx1.commit()
            t0 = time.monotonic()
            c1["a"]["b"].insert_one({"_id": "after"})
            assert time.monotonic() - t0 < 3  # not the 20 s lifetime of an orphan
            assert [d["_id"] for d in c1["a"]["b"].find()] == ["after", "t1"]
            with c2.transaction() as tx2:  # c2's connection serves transactions as before
                tx2["a"]["b"].insert_one({"_id": "t2"})
            assert c1["a"]["b"].count_documents({}) == 3
        finally:
            c1.close()
            c2.close()


def test_a_thread_inside_a_transaction_cannot_wait_for_itself(port):
    """A write outside the transaction, or a second transaction, on the thread
    holding one open would wait for it until the timeout: refused at once."""
    p, svc = port
    c = client_of(p)
    c.timeout_s = 5
    coll = c["tt"]["c"]
    other = []
    with c.transaction() as tx:
        tx["tt"]["c"].insert_one({"_id": "in"})
        t0 = time.monotonic()
        with pytest.raises(errors.InvalidOperation, match="transaction open"):
            coll.insert_one({"_id": "out"})
        with pytest.raises(errors.InvalidOperation, match="transaction open"):
            with c.transaction():
                pass
        assert time.monotonic() - t0 < 1
        t = threading.Thread(target=lambda: other.append(coll.insert_one({"_id": "other"})))
        t.start()  # another thread's write waits for the transaction, as documented
        time.sleep(0.2)
        assert not other
    t.join(5)
    assert other and sorted(d["_id"] for d in coll.find()) == ["in", "other"]
    coll.insert_one({"_id": "after"})
    c.close()
