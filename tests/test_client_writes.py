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


def test_transactions_run_beside_other_writes_and_the_first_committer_wins(port):
    """An open transaction holds no writer (snapshot isolation): writes of
    other connections commit meanwhile. A transaction fails with
    ``WriteConflict``, nothing of it stored, when something it wrote (a
    document, a unique key, its collection's definition) was changed by a
    commit after it began; a statement writing a document another open
    transaction wrote fails at once. Its reads see its snapshot."""
    p, svc = port
    a, b = Connection("127.0.0.1", p.port, SECRET), Connection("127.0.0.1", p.port, SECRET)

    def begin():
        return a.request({"op": "txnBegin"})["txn"]

    def ids():
        return [d["_id"] for d in b.request({"op": "find", "ns": "x.c"})["docs"]]

    # no conflict: the other write commits first, the transaction after it
    b.request({"op": "insert", "ns": "x.c", "docs": [{"_id": 2, "v": 0}]})
    t = begin()
    a.request({"op": "insert", "ns": "x.c", "docs": [{"_id": 1}], "txn": t})
    g_plain = b.request({"op": "insert", "ns": "x.c", "docs": [{"_id": 4}]})["gtid"]
    assert a.request({"op": "txnCommit", "txn": t})["gtid"][1] == g_plain[1] + 1
    # a document the transaction writes, changed by a commit since it began: it fails
    t = begin()
    b.request({"op": "update", "ns": "x.c", "filter": {"_id": 2}, "update": {"$set": {"v": 2}}})
    a.request({"op": "update", "ns": "x.c", "filter": {"_id": 2}, "update": {"$set": {"v": 1}},
               "txn": t})
    with pytest.raises(errors.WriteConflict):
        a.request({"op": "txnCommit", "txn": t})
    with pytest.raises(errors.TransactionAborted):  # it is over
        a.request({"op": "find", "ns": "x.c", "txn": t})
    assert b.request({"op": "find", "ns": "x.c", "filter": {"_id": 2}})["docs"][0]["v"] == 2
    # two open transactions writing one document: the second statement fails at once
    t1, t2 = begin(), begin()
    a.request({"op": "insert", "ns": "x.c", "docs": [{"_id": 5}], "txn": t1})
    with pytest.raises(errors.WriteConflict, match=f"transaction {t1}"):
        a.request({"op": "insert", "ns": "x.c", "docs": [{"_id": 5, "by": 2}], "txn": t2})
    a.request({"op": "txnCommit", "txn": t1})
    assert b.request({"op": "find", "ns": "x.c", "filter": {"_id": 5}})["docs"] == [{"_id": 5}]
    # a unique key another commit took meanwhile
    b.request({"op": "createIndex", "ns": "x.c", "key": [["u", 1]], "unique": True, "sparse": True})
    t = begin()
    a.request({"op": "insert", "ns": "x.c", "docs": [{"_id": 10, "u": 1}], "txn": t})
    b.request({"op": "insert", "ns": "x.c", "docs": [{"_id": 11, "u": 1}]})
    with pytest.raises(errors.WriteConflict, match="unique key"):
        a.request({"op": "txnCommit", "txn": t})
    # its collection redefined meanwhile (an index built without its documents)
    t = begin()
    a.request({"op": "insert", "ns": "x.c", "docs": [{"_id": 12, "w": 1}], "txn": t})
    b.request({"op": "createIndex", "ns": "x.c", "key": [["w", 1]]})
    with pytest.raises(errors.WriteConflict, match="collection x.c"):
        a.request({"op": "txnCommit", "txn": t})
    assert ids() == [1, 2, 4, 5, 11]
    # reads in a transaction see its snapshot, its own writes over it
    t = begin()
    a.request({"op": "update", "ns": "x.c", "filter": {"_id": 1}, "update": {"$set": {"m": 1}},
               "txn": t})
    b.request({"op": "insert", "ns": "x.c", "docs": [{"_id": 3}]})
    b.request({"op": "delete", "ns": "x.c", "filter": {"_id": 5}})
    seen = a.request({"op": "find", "ns": "x.c", "txn": t, "sort": [["_id", -1]]})["docs"]
    assert seen == [{"_id": 11, "u": 1}, {"_id": 5}, {"_id": 4}, {"_id": 2, "v": 2},
                    {"_id": 1, "m": 1}]
    assert a.request({"op": "count", "ns": "x.c", "txn": t})["value"] == 5
    a.request({"op": "txnCommit", "txn": t})  # it wrote only _id 1: no conflict
    assert ids() == [1, 2, 3, 4, 11]
    assert svc.status()["open_transactions"] == 0
    a.close()
    b.close()


def test_a_transaction_begin_that_timed_out_is_aborted_not_left_open(tmp_path):
    """c2's txnBegin waits behind a busy writer and times out at c2: the
    driver cancels it, so once the writer is free the member aborts that
    transaction at once instead of keeping it open (its snapshot) for its
    whole lifetime."""
    from raymx.client import Client
    lim = Limits(transaction_lifetime_ms=20_000, sync_interval_ms=20)
    with serving(tmp_path, lim) as (p, svc):
        topo = {"secret": SECRET, "members": [{"id": 0, "host": "127.0.0.1", "port": p.port,
                                               "role": "primary"}]}
        c1, c2 = Client(lambda: topo, timeout_s=10), Client(lambda: topo, timeout_s=0.5)
        try:
            blocker = busy_writer(svc)
            with pytest.raises(TimeoutError):
                with c2.transaction() as tx2:
                    tx2["a"]["b"].insert_one({"_id": "t2"})
            blocker.set()
            c1["a"]["b"].insert_one({"_id": "after"})
            wait_for(lambda: svc.status()["open_transactions"] == 0)
            with c2.transaction() as tx2:  # c2's connection serves transactions as before
                tx2["a"]["b"].insert_one({"_id": "t2"})
            assert sorted(d["_id"] for d in c1["a"]["b"].find()) == ["after", "t2"]
            assert svc.status()["open_transactions"] == 0
        finally:
            c1.close()
            c2.close()


def test_a_thread_inside_a_transaction_may_write_outside_it(port):
    """A write outside the transaction, or a second transaction, on the thread
    holding one open runs at once (nothing waits for the open one unless it
    writes a document the open one wrote); a write outside it that commits
    first makes its commit fail with ``WriteConflict``, which
    ``Client.with_transaction`` runs again."""
    p, svc = port
    c = client_of(p)
    c.timeout_s = 5
    coll = c["tt"]["c"]
    coll.insert_one({"_id": "n", "v": 0})
    with c.transaction() as tx:
        tx["tt"]["c"].insert_one({"_id": "in"})
        t0 = time.monotonic()
        coll.insert_one({"_id": "out"})
        with c.transaction() as tx2:
            tx2["tt"]["c"].insert_one({"_id": "second"})
        assert time.monotonic() - t0 < 1
        coll.update_one({"_id": "n"}, {"$inc": {"v": 10}})  # commits first
        tx["tt"]["c"].update_one({"_id": "n"}, {"$inc": {"v": 1}})
        with pytest.raises(errors.WriteConflict):
            tx.commit()
    assert sorted(d["_id"] for d in coll.find()) == ["n", "out", "second"]
    runs = []

    def bump(tx):
        runs.append(1)
        tx["tt"]["c"].find_one({"_id": "n"})  # its snapshot
        if len(runs) == 1:  # another write to it commits meanwhile
            coll.update_one({"_id": "n"}, {"$inc": {"v": 100}})
        tx["tt"]["c"].update_one({"_id": "n"}, {"$inc": {"v": 1}})
        return len(runs)
    assert c.with_transaction(bump) == 2
    assert coll.find_one({"_id": "n"})["v"] == 111
    c.close()


def test_a_plain_write_waits_for_the_transaction_holding_its_document(tmp_path):
    """As in MongoDB, a write outside transactions to a document an open
    transaction wrote waits until that transaction ends (commit, abort or
    expiry), then runs on what it left; writes to other documents, alone or
    in the same group commit, go ahead at once."""
    lim = Limits(sync_interval_ms=20, transaction_idle_ms=1500)
    with serving(tmp_path, lim) as (p, svc):
        a, b = Connection("127.0.0.1", p.port, SECRET), Connection("127.0.0.1", p.port, SECRET)
        b.request({"op": "insert", "ns": "w.c", "docs": [{"_id": i, "n": 0} for i in range(4)]})

        def n_of(i):
            return b.request({"op": "find", "ns": "w.c", "filter": {"_id": i}})["docs"][0]["n"]

        def plain_inc(i, by, out):
            c = Connection("127.0.0.1", p.port, SECRET)
            try:
                out.append(c.request({"op": "update", "ns": "w.c", "filter": {"_id": i},
                                      "update": {"$inc": {"n": by}}})["modified"])
            except Exception as e:  # pragma: no cover - asserted below
                out.append(e)
            finally:
                c.close()

        def waiting(i, by):
            out: list = []
            th = threading.Thread(target=plain_inc, args=(i, by, out), daemon=True)
            th.start()
            time.sleep(0.3)
            assert th.is_alive() and not out, "the write did not wait for the transaction"
            return th, out

        for end in ("txnCommit", "txnAbort"):
            t = a.request({"op": "txnBegin"})["txn"]
            a.request({"op": "update", "ns": "w.c", "filter": {"_id": 0},
                       "update": {"$inc": {"n": 1}}, "txn": t})
            th, out = waiting(0, 10)
            assert svc.status()["writes_waiting_for_transactions"] == 1
            b.request({"op": "update", "ns": "w.c", "filter": {"_id": 1},
                       "update": {"$inc": {"n": 1}}})  # another document: at once
            a.request({"op": end, "txn": t})
            th.join(5)
            assert out == [1]
        assert (n_of(0), n_of(1)) == (21, 2)  # 1 (committed) + 10 + 10; the abort's 1 is gone
        # in one group commit (queued behind a busy writer): only the held one waits
        t = a.request({"op": "txnBegin"})["txn"]
        a.request({"op": "update", "ns": "w.c", "filter": {"_id": 2},
                   "update": {"$inc": {"n": 1}}, "txn": t})
        blocker = busy_writer(svc)
        outs = [[] for _ in range(3)]
        ths = [threading.Thread(target=plain_inc, args=(i, 5, outs[k]), daemon=True)
               for k, i in enumerate((1, 2, 3))]
        for th in ths:
            th.start()
        wait_for(lambda: svc._q.qsize() == 3)
        blocker.set()
        ths[0].join(5)
        ths[2].join(5)
        assert outs[0] == outs[2] == [1] and ths[1].is_alive() and not outs[1]
        a.request({"op": "txnCommit", "txn": t})
        ths[1].join(5)
        assert outs[1] == [1] and [n_of(i) for i in (1, 2, 3)] == [7, 6, 5]
        # a transaction left idle: the write runs once it expires (transaction_idle_ms)
        t = a.request({"op": "txnBegin"})["txn"]
        a.request({"op": "update", "ns": "w.c", "filter": {"_id": 3},
                   "update": {"$inc": {"n": 1}}, "txn": t})
        t0 = time.monotonic()
        th, out = waiting(3, 100)
        th.join(10)
        assert out == [1] and 1.0 < time.monotonic() - t0 < 5
        with pytest.raises(errors.TransactionAborted):
            a.request({"op": "txnCommit", "txn": t})
        assert n_of(3) == 105
        st = svc.status()
        assert st["writes_waiting_for_transactions"] == 0 and st["open_transactions"] == 0
        assert st["transactions_expired"] == 1
        a.close()
        b.close()
