"""Change streams on real members: resume tokens, high-water marks, failover, trimming."""
import random
import threading
import time

import pytest

import raymx
from raymx import errors
from raymx.storage.gtid import GTID

from tests.test_replication import wait_until


def drain(stream, n, timeout_s=20):
    out = []
    deadline = time.time() + timeout_s
    while len(out) < n:
        assert time.time() < deadline, f"only {len(out)} of {n} events"
        ev = stream.try_next()
        if ev is not None:
            out.append(ev)
    return out


def test_watch_collection_database_and_resume(replset):
    c = replset.client()
    s_all = c.watch()
    s_coll = c["app"]["users"].watch(ops=["insert", "update", "delete"])
    s_db = c["app"].watch()
    users = c["app"]["users"]
    users.insert_one({"_id": 1, "n": "ann"})
    users.update_one({"_id": 1}, {"$set": {"n": "bob"}})
    c["other"]["x"].insert_one({"_id": 5})
    with c.transaction() as tx:
        tx["app"]["users"].insert_one({"_id": 2})
        tx["app"]["logs"].insert_one({"_id": "l"})
    users.delete_one({"_id": 1})
    evs = drain(s_coll, 4)
    assert [(e["op"], e["_id"]) for e in evs] == [("insert", 1), ("update", 1), ("insert", 2),
                                                  ("delete", 1)]
    assert evs[1]["pre"] == {"_id": 1, "n": "ann"} and evs[1]["post"] == {"_id": 1, "n": "bob"}
    assert evs[0]["gtid"] < evs[1]["gtid"] and isinstance(evs[0]["gtid"], GTID)
    assert evs[2]["gtid"] == tx.gtid
    assert {e["ns"] for e in drain(s_db, 7)} == {"app.users", "app.logs"}
    every = drain(s_all, 9)
    assert [e["op"] for e in every].count("create") == 3 and every[-1]["op"] == "delete"
    # resume in the middle of the transaction: exactly what follows
    mid = next(e for e in every if e["ns"] == "app.users" and e["_id"] == 2)
    again = c.watch(after=mid["token"])
    assert [(e["ns"], e["op"]) for e in drain(again, 3)] == [
        ("app.logs", "create"), ("app.logs", "insert"), ("app.users", "delete")]
    # a quiet (filtered) stream's token moves with the majority point: a restart
    # from it neither re-reads nor misses
    quiet = c["app"]["nobody"].watch()
    tok0 = quiet.resume_token
    last = c["other"]["x"].insert_one({"_id": 6}).gtid
    wait_until(lambda: quiet.try_next() is None and GTID(*quiet.resume_token[:2]) >= last,
               timeout_s=10)
    assert quiet.resume_token > tok0
    g = c["app"]["nobody"].insert_one({"_id": "here"}).gtid
    ev = drain(c["app"]["nobody"].watch(after=quiet.resume_token, ops=["insert"]), 1)[0]
    assert ev["_id"] == "here" and ev["gtid"] == g
    with pytest.raises(errors.InvalidOperation):
        c.watch(ops=["bogus"])


def test_consumer_killed_and_restarted_sees_every_event_once_across_failover(
        ray_session, tmp_path):
    rs = raymx.ReplicaSet.launch("cs3", members=3, data_dir=str(tmp_path))
    try:
        old = rs.wait_for_primary()
        wc = rs.client(w="majority", wtimeout_ms=15_000, timeout_s=60)
        acked, stop_w = [], threading.Event()

        def writer(k):
            i = 0
            while not stop_w.is_set():
                try:
                    wc["cs"]["w"].insert_one({"_id": f"{k}-{i}"})
                    acked.append(f"{k}-{i}")
                except errors.RaymxError:
                    pass  # outcome unknown across the failover: may or may not exist
                i += 1

        seen, saved, restarts = [], [[0, 0]], [0]
        stop_c = threading.Event()
        rnd = random.Random(3)

        def consumer():
            while not stop_c.is_set():
                cl = rs.client(timeout_s=60)  # a new process would have a new client
                st = cl["cs"]["w"].watch(after=saved[0], ops=["insert"], wait_ms=200)
                budget = rnd.randrange(5, 60)
                try:
                    while budget and not stop_c.is_set():
                        ev = st.try_next()
                        if ev is not None:
                            budget -= 1
                            seen.append((tuple(ev["gtid"]), ev["_id"]))
                        saved[0] = st.resume_token  # stored together with the effect
                finally:
                    cl.close()  # killed: its connection and stream are gone
                restarts[0] += 1
        ws = [threading.Thread(target=writer, args=(k,)) for k in range(2)]
        ct = threading.Thread(target=consumer)
        for t in ws + [ct]:
            t.start()
        try:
            wait_until(lambda: len(seen) > 60, timeout_s=60, every_s=0.05)
            rs.kill_member(old)
            wait_until(lambda: (lambda p: p is not None and p != old)(rs._topology()["primary"]),
                       timeout_s=30, every_s=0.05)
            n = len(acked)
            wait_until(lambda: len(acked) > n + 60, timeout_s=60, every_s=0.05)
        finally:
            stop_w.set()
            for t in ws:
                t.join(60)
        try:
            want = set(acked)
            wait_until(lambda: want <= {i for _, i in seen}, timeout_s=60, every_s=0.1)
        finally:
            stop_c.set()
            ct.join(60)
        ids = [i for _, i in seen]
        assert len(ids) == len(set(ids)), "an event was delivered twice"
        assert restarts[0] > 3
        # exactly the inserts of the surviving history, in GTID order, up to the token
        final = [(tuple(e.gtid), op["post"]["_id"]) for e in rs.oplog() for op in e.ops
                 if op["op"] == "i" and op["ns"] == "cs.w"
                 and list(e.gtid) <= list(saved[0][:2])]
        assert seen == final
        # a token whose entries were trimmed: a specific error naming the oldest GTID
        rs.set_oplog_cap(max_bytes=1, force=True)
        st = rs.trim_now()
        first = next(m for m in st if "first" in m and m["first"][1] > 2)["first"]
        s = rs.client().watch(after=[1, 1])
        with pytest.raises(errors.OplogTrimmed) as ei:
            s.try_next()
        assert ei.value.info["oldest"][1] >= 2 and "oldest entry available" in str(ei.value)
        assert first is not None
    finally:
        rs.shutdown()
