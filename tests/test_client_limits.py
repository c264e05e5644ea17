"""What one client may hold on a member (``Limits``; issue 24, part 3), on a
real client port (real LMDB, real sockets): connections, unauthenticated
connections per address, transactions and multi-part inserts per
connection, the nesting of filters and updates, and reads after a GTID
(parked without a reader thread, woken when the GTID is applied). Every
refusal answers the request and leaves the connection usable."""
import threading
import time

import msgpack
import pytest

from raymx import errors
from raymx.client import Connection
from raymx.storage.limits import Limits
from tests.port_helpers import (SECRET, client_of, closed, frame, raw, raw_after_hello,
                                read_frame, serving, wait_for)

BASE = dict(frame_bytes_max=1 << 20, document_bytes_max=512 << 10, sync_interval_ms=20)


def nest(n, leaf, wrap):
    for _ in range(n):
        leaf = wrap(leaf)
    return leaf


def test_connections_per_member_are_limited(tmp_path):
    with serving(tmp_path, Limits(**BASE, connections_max=3)) as (p, _):
        conns = [Connection("127.0.0.1", p.port, SECRET) for _ in range(2)]
        s = raw(p)  # the third, not authenticated yet: counts too
        with pytest.raises(errors.LimitExceeded) as ei:
            Connection("127.0.0.1", p.port, SECRET)
        assert ei.value.info["limit"] == "connections_max" and "connections_max = 3" in str(ei.value)
        r = raw(p)
        assert read_frame(r)["err"]["err"] == "LimitExceeded" and closed(r)
        # those admitted still work; one leaving makes room
        assert conns[0].request({"op": "insert", "ns": "c.c", "docs": [{"_id": 1}]})
        s.close()
        wait_for(lambda: p.admission.open == 2)
        c = Connection("127.0.0.1", p.port, SECRET)
        assert c.request({"op": "count", "ns": "c.c"})["value"] == 1
        for x in conns + [c]:
            x.close()


def test_unauthenticated_connections_per_address_are_limited(tmp_path):
    with serving(tmp_path, Limits(**BASE, unauthenticated_per_address_max=4)) as (p, _):
        silent = [raw(p) for _ in range(4)]
        r = raw(p)
        err = read_frame(r)["err"]
        assert err["err"] == "LimitExceeded" and err["info"]["limit"] == \
            "unauthenticated_per_address_max" and "127.0.0.1" in err["msg"]
        assert closed(r)
        # a connection that sends its hello no longer counts against its address
        silent[0].sendall(frame({"id": 1, "op": "hello", "secret": SECRET}))
        assert "ok" in read_frame(silent[0])
        c = Connection("127.0.0.1", p.port, SECRET)
        assert c.request({"op": "count", "ns": "u.c"})["value"] == 0
        assert p.admission.unauthenticated == {"127.0.0.1": 3}
        for s in silent:
            s.close()
        wait_for(lambda: not p.admission.unauthenticated)
        c.close()


def test_open_transactions_per_connection_are_limited(tmp_path):
    with serving(tmp_path, Limits(**BASE, transactions_per_connection_max=2)) as (p, _):
        s = raw_after_hello(p)
        s.sendall(frame({"id": 2, "op": "txnBegin"}))
        t1 = read_frame(s)["ok"]["txn"]
        s.sendall(frame({"id": 3, "op": "txnBegin"}))  # a second, open beside it
        t2 = read_frame(s)["ok"]["txn"]
        s.sendall(frame({"id": 4, "op": "txnBegin"}))  # the third: refused at once
        r = read_frame(s)
        assert r["id"] == 4 and r["err"]["err"] == "LimitExceeded"
        assert r["err"]["info"] == {"limit": "transactions_per_connection_max", "max": 2}
        s.sendall(frame({"id": 5, "op": "insert", "ns": "t.c", "docs": [{"_id": 1}], "txn": t1}))
        assert read_frame(s)["ok"]
        s.sendall(frame({"id": 6, "op": "insert", "ns": "t.c", "docs": [{"_id": 2}], "txn": t2}))
        assert read_frame(s)["ok"]
        s.sendall(frame({"id": 7, "op": "txnCommit", "txn": t1}))
        assert "ok" in read_frame(s)
        s.sendall(frame({"id": 8, "op": "txnBegin"}))  # one open now: room for another
        t3 = read_frame(s)["ok"]["txn"]
        s.sendall(frame({"id": 9, "op": "txnAbort", "txn": t2}))
        assert read_frame(s)["ok"] == {"aborted": True}
        s.sendall(frame({"id": 10, "op": "txnAbort", "txn": t3}))
        assert read_frame(s)["ok"]
        s.sendall(frame({"id": 11, "op": "count", "ns": "t.c"}))
        assert read_frame(s)["ok"]["value"] == 1


def test_an_idle_transaction_is_aborted_and_never_holds_up_writes(tmp_path):
    """An open transaction holds no writer: writes outside it run at once.
    One that sends no statement for ``transaction_idle_ms`` is aborted: its
    next statement and its commit say it is not open, nothing of it stored."""
    with serving(tmp_path, Limits(**BASE, transaction_idle_ms=300)) as (p, _):
        c = Connection("127.0.0.1", p.port, SECRET)
        t = c.request({"op": "txnBegin"})["txn"]
        c.request({"op": "insert", "ns": "i.c", "docs": [{"_id": 1}], "txn": t})
        t0 = time.monotonic()
        assert c.request({"op": "insert", "ns": "i.c", "docs": [{"_id": 2}]})
        assert time.monotonic() - t0 < 0.25  # it did not wait for the transaction
        time.sleep(0.4)
        with pytest.raises(errors.TransactionAborted, match="not open"):
            c.request({"op": "insert", "ns": "i.c", "docs": [{"_id": 3}], "txn": t})
        with pytest.raises(errors.TransactionAborted):
            c.request({"op": "txnCommit", "txn": t})
        assert c.request({"op": "find", "ns": "i.c"})["docs"] == [{"_id": 2}]
        c.close()


def test_pending_multi_part_inserts_per_connection_are_limited(tmp_path):
    def part(rid, ids, more):
        return frame({"id": rid, "op": "insert", "ns": "p.c", "more": more,
                      "packed": [msgpack.packb({"_id": i}) for i in ids]})

    with serving(tmp_path, Limits(**BASE, inserts_pending_per_connection_max=1)) as (p, _):
        s = raw_after_hello(p)
        s.sendall(part(2, [1, 2], True))   # held, unanswered
        s.sendall(part(3, [10], True))     # a second insert in parts: refused now
        r = read_frame(s)
        assert r["id"] == 3 and r["err"]["err"] == "LimitExceeded"
        assert r["err"]["info"]["limit"] == "inserts_pending_per_connection_max"
        s.sendall(part(3, [11], True))     # its later parts are dropped, unanswered,
        s.sendall(part(3, [12], False))    # never run as an insert of their own
        s.sendall(part(2, [3], False))     # the first one completes
        r = read_frame(s)
        assert r["id"] == 2 and r["ok"]["inserted_ids"] == [1, 2, 3]
        s.sendall(frame({"id": 4, "op": "find", "ns": "p.c"}))
        assert [d["_id"] for d in read_frame(s)["ok"]["docs"]] == [1, 2, 3]
        s.sendall(part(5, [20], True))     # room again
        s.sendall(part(5, [21], False))
        assert read_frame(s)["ok"]["inserted_ids"] == [20, 21]


def test_deep_filters_and_updates_are_invalid_not_internal_errors(tmp_path):
    with serving(tmp_path, Limits(**BASE)) as (p, _):
        c = client_of(p)
        coll = c["n"]["c"]
        deep_doc = nest(99, 1, lambda x: {"b": x})  # a document may nest 100 levels
        coll.insert_one({"_id": 1, "a": 1, "d": deep_doc})
        deep = {
            "$and": nest(300, {"a": 1}, lambda x: {"$and": [x]}),
            "$or": nest(300, {"a": 1}, lambda x: {"$or": [x]}),
            "$not": {"a": nest(300, {"$eq": 1}, lambda x: {"$not": x})},
            "$in": {"a": {"$in": [nest(300, 1, lambda x: [x])]}},
        }
        for name, flt in deep.items():
            with pytest.raises(errors.InvalidFilter, match="nesting_depth_max"):
                coll.find_one(flt)
            with pytest.raises(errors.InvalidFilter, match="nesting_depth_max"):
                coll.delete_many(flt)
        for upd in ({"$set": {"e": nest(300, 1, lambda x: {"b": x})}},
                    {"$push": {"l": {"$each": [nest(300, 1, lambda x: [x])]}}},
                    {"$pull": {"a": nest(300, {"x": 1}, lambda x: {"$and": [x]})}}):
            with pytest.raises(errors.InvalidUpdate, match="nesting_depth_max"):
                coll.update_one({"_id": 1}, upd)
        # the deepest legal document is still matched and updated; nothing was lost
        assert coll.find_one({"d": deep_doc})["_id"] == 1
        assert coll.update_one({"_id": 1}, {"$set": {"e": deep_doc}}).modified_count == 1
        assert coll.count_documents({}) == 1
        with pytest.raises(errors.ConfigError):
            Limits(nesting_depth_max=201)
        c.close()


def test_reads_after_a_gtid_wait_without_holding_readers(tmp_path):
    """More reads wait for an unwritten GTID than the member has reader
    threads, and other reads are still answered at once; the waits end when
    the GTID is applied (woken, not polled), or at their timeout, which is
    capped; one connection may park a limited number."""
    lim = Limits(**BASE, after_timeout_ms_max=5000, after_waits_per_connection_max=20)
    with serving(tmp_path, lim) as (p, svc):
        c = Connection("127.0.0.1", p.port, SECRET)
        c.request({"op": "insert", "ns": "a.c", "docs": [{"_id": 0}]})
        last, _ = svc.e.last()
        nxt = [last.term, last.seq + 1]
        waits = [c.submit({"op": "find", "ns": "a.c", "after": nxt, "after_timeout_ms": 5000})
                 for _ in range(20)]  # 5 times the reader pool
        wait_for(lambda: svc.after_waits.waiting == 20)
        with pytest.raises(errors.LimitExceeded, match="after_waits_per_connection_max"):
            c.request({"op": "find", "ns": "a.c", "after": nxt})
        t0 = time.monotonic()
        assert c.request({"op": "count", "ns": "a.c"})["value"] == 1  # a reader is free
        assert time.monotonic() - t0 < 1.0
        woke = svc.after_waits.wakeups
        time.sleep(0.3)
        assert svc.after_waits.wakeups - woke <= 2  # a safety poll at most, no 2 ms polling
        assert not any(f.done() for f in waits)
        c.request({"op": "insert", "ns": "a.c", "docs": [{"_id": 1}]})  # applies nxt
        for f in waits:
            assert len(f.result(5)["docs"]) == 2
        assert svc.after_waits.waiting == 0 and svc.after_waits.released == 20
        # the timeout: capped, and a wait past it is answered with ReadConcernTimeout
        with pytest.raises(errors.LimitExceeded, match="after_timeout_ms_max = 5000"):
            c.request({"op": "find", "ns": "a.c", "after": nxt, "after_timeout_ms": 5001})
        far = [nxt[0], nxt[1] + 100]
        t0 = time.monotonic()
        with pytest.raises(errors.ReadConcernTimeout):
            c.request({"op": "find", "ns": "a.c", "after": far, "after_timeout_ms": 300})
        assert 0.25 < time.monotonic() - t0 < 3
        with pytest.raises(errors.InvalidOperation, match="GTID"):
            c.request({"op": "find", "ns": "a.c", "after": "x"})
        assert c.request({"op": "count", "ns": "a.c"})["value"] == 2  # still usable
        # the blocking form (used in process) is woken the same way
        th = threading.Thread(target=lambda: (time.sleep(0.2), c.request(
            {"op": "insert", "ns": "a.c", "docs": [{"_id": 2}]})))
        th.start()
        svc.wait_applied(svc.e.last()[0]._replace(seq=svc.e.last()[0].seq + 1), 5000)
        th.join()
        c.close()


def test_open_cursors_are_limited_per_connection_and_per_member(tmp_path):
    """Each open cursor holds an LMDB read snapshot (LMDB's reader table is
    finite and shared with writes): a connection may hold a few, the member a
    budget, past which its least recently used cursor is closed."""
    lim = Limits(**BASE, cursors_per_connection_max=3, cursors_max=4)
    with serving(tmp_path, lim) as (p, svc):
        a, b = (Connection("127.0.0.1", p.port, SECRET) for _ in range(2))
        a.request({"op": "insert", "ns": "k.c", "docs": [{"_id": i} for i in range(10)]})
        first = [a.request({"op": "find", "ns": "k.c", "batch": 2})["cursor"] for _ in range(3)]
        with pytest.raises(errors.LimitExceeded, match="cursors_per_connection_max = 3"):
            a.request({"op": "find", "ns": "k.c", "batch": 2})
        assert len(a.request({"op": "find", "ns": "k.c", "batch": 20})["docs"]) == 10  # one batch
        a.request({"op": "getMore", "cursor": first[0], "batch": 2})  # first[1] is now the oldest
        b.request({"op": "find", "ns": "k.c", "batch": 2})
        b.request({"op": "find", "ns": "k.c", "batch": 2})  # the fifth: over the member's 4
        assert svc.status()["open_cursors"] == 4
        with pytest.raises(errors.InvalidOperation, match="not found"):
            a.request({"op": "getMore", "cursor": first[1]})
        # the connection's count follows: a new cursor fits again
        assert a.request({"op": "find", "ns": "k.c", "batch": 2})["cursor"]
        a.request({"op": "killCursors", "cursors": [first[0], first[2]]})
        assert svc.status()["open_cursors"] == 3
        a.close()
        b.close()


def test_a_secondary_wakes_parked_reads_when_its_applier_applies(ray_session, tmp_path):
    """On a running set: reads after a GTID park on a secondary, and its
    applier's doorbell (a process of its own) wakes them once it applies it."""
    import raymx
    rs = raymx.ReplicaSet.launch("parked", members=2, data_dir=str(tmp_path),
                                 placement="pack")
    try:
        prim = rs.client()["p"]["c"]
        g = prim.insert_one({"_id": 0}, w=2, wtimeout_ms=30_000).gtid
        topo = rs._topology()
        sec = [m for m in topo["members"] if m["role"] == "secondary"][0]
        conn = Connection(sec["host"], sec["port"], topo["secret"])

        def readable():  # its sync source has confirmed it (recovering until then)
            try:
                return conn.request({"op": "count", "ns": "p.c"})["value"] == 1
            except errors.NotPrimaryOrSecondary:
                return False
        wait_for(readable, 30)
        nxt = [g.term, g.seq + 1]
        waits = [conn.submit({"op": "find", "ns": "p.c", "after": nxt,
                              "after_timeout_ms": 30_000}) for _ in range(12)]
        wait_for(lambda: rs.status_of(sec["id"])["after_waits"]["waiting"] == 12, 30)
        assert conn.request({"op": "count", "ns": "p.c"})["value"] == 1  # readers are free
        prim.insert_one({"_id": 1})
        for f in waits:
            assert len(f.result(30)["docs"]) == 2
        aw = rs.status_of(sec["id"])["after_waits"]
        assert aw["released"] == 12 and aw["waiting"] == 0 and aw["expired"] == 0
        assert aw["kicks"] >= 1  # rung by the applier (the safety poll kicks nothing)
        conn.close()
    finally:
        rs.shutdown()
