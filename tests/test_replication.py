"""Multi-member replica sets on real Ray actors and real LMDB."""
import os
import signal
import threading
import time

import pytest

import raymx
from raymx import errors
from raymx.client import ReadPreference
from raymx.storage.gtid import GTID


def wait_until(fn, timeout_s=30, every_s=0.1):
    deadline = time.time() + timeout_s
    while True:
        v = fn()
        if v:
            return v
        if time.time() > deadline:
            raise AssertionError(f"condition not met in {timeout_s}s")
        time.sleep(every_s)


def digests(ray, rs, ids):
    return [ray.get(rs.member(i).state_digest.remote(), timeout=30) for i in ids]


def converged(ray, rs, ids):
    ds = digests(ray, rs, ids)
    return all(d == ds[0] for d in ds) and ds


@pytest.fixture(scope="module")
def rs3(ray_session, tmp_path_factory):
    rs = raymx.ReplicaSet.launch("r3", members=3, data_dir=str(tmp_path_factory.mktemp("r3")))
    yield rs
    rs.shutdown()


def producer(ray, rs, i):
    return ray.get_actor(f"{rs.name}/m{i}/producer", namespace="raymx")


def test_concurrent_writers_converge_to_identical_oplogs_and_collections(ray_session, rs3):
    c = rs3.client()
    errs = []

    def writer(k):
        try:
            coll = c["app"][f"w{k % 2}"]
            for i in range(150):
                coll.insert_one({"_id": f"{k}-{i}", "k": k})
                if i % 10 == 0:
                    coll.update_many({"k": k}, {"$inc": {"n": 1}})
                if i % 25 == 0:
                    coll.delete_one({"_id": f"{k}-{i - 1}"})
        except Exception as e:  # pragma: no cover - reported below
            errs.append(e)

    ts = [threading.Thread(target=writer, args=(k,)) for k in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errs
    ds = wait_until(lambda: converged(ray_session, rs3, [0, 1, 2]))
    assert len(ds[0]["oplog"]) > 900
    seqs = [g[1] for g, _ in ds[0]["oplog"]]
    assert seqs == list(range(1, len(seqs) + 1))
    # every member knows the final majority point (the primary counts it, the
    # secondaries learn it from their producer, by doorbell)
    st = wait_until(lambda: (lambda s: all(m["oplog"]["majority"] == s["members"][0]["last"]
                                           for m in s["members"]) and s)(rs3.status()))
    assert st["members"][0]["majority"] == st["members"][0]["last"]
    assert [m["role"] for m in st["members"]] == ["primary", "secondary", "secondary"]
    assert all(m["state"] == "running" for m in st["members"])


def test_secondaries_refuse_writes_and_serve_reads(ray_session, rs3):
    c = rs3.client()
    r = c["rp"]["docs"].insert_one({"_id": 1, "v": "x"}, w=3, wtimeout_ms=10_000)
    sec = rs3.client(read_preference="secondary")
    coll = sec["rp"]["docs"]
    # w=3: durable in every oplog, not necessarily applied yet; read after its GTID
    assert coll.with_options(read_preference=ReadPreference("secondary", after=r.gtid)) \
        .find_one({"_id": 1}) == {"_id": 1, "v": "x"}
    wait_until(lambda: coll.find_one({"_id": 1}) == {"_id": 1, "v": "x"})
    topo = rs3._topology()
    s = [m for m in topo["members"] if m["role"] == "secondary"][0]
    conn = raymx.client.Connection(s["host"], s["port"], topo["secret"])
    with pytest.raises(errors.NotPrimary):
        conn.request({"op": "insert", "ns": "rp.docs", "docs": [{"_id": 2}]})
    conn.close()
    # read-after-GTID: a write then a read on a secondary sees it
    for i in range(20):
        g = c["rp"]["docs"].insert_one({"_id": f"ryw{i}"}).gtid
        after = coll.with_options(read_preference=ReadPreference("secondary", after=g))
        assert after.find_one({"_id": f"ryw{i}"}) is not None
    far = coll.with_options(read_preference=ReadPreference(
        "secondary", after=GTID(r.gtid.term, r.gtid.seq + 10**6), after_timeout_ms=200))
    with pytest.raises(errors.ReadConcernTimeout):
        far.find_one({})
    fresh = coll.with_options(read_preference=ReadPreference("nearest", max_staleness_s=30))
    assert fresh.count_documents({"_id": 1}) == 1


def test_majority_waits_and_times_out_with_the_gtid_when_secondaries_stop(ray_session, rs3):
    ray = ray_session
    coll = rs3.client()["wc"]["docs"]
    assert coll.insert_one({"_id": "a"}, w="majority", wtimeout_ms=10_000).gtid is not None
    for i in (1, 2):
        ray.get(producer(ray, rs3, i).pause.remote(True))
    try:
        t0 = time.time()
        with pytest.raises(errors.WriteConcernTimeout) as ei:
            coll.insert_one({"_id": "b"}, w="majority", wtimeout_ms=500)
        assert time.time() - t0 >= 0.45
        g = GTID(*ei.value.info["gtid"])
        assert coll.find_one({"_id": "b"}) == {"_id": "b"}  # committed, not undone
        with pytest.raises(errors.WriteConcernTimeout):
            coll.insert_one({"_id": "c"}, w=2, wtimeout_ms=300)
        assert coll.insert_one({"_id": "d"}, w=1).gtid > g
        assert rs3.status()["members"][1]["state"] == "paused"
    finally:
        for i in (1, 2):
            ray.get(producer(ray, rs3, i).pause.remote(False))
    assert coll.insert_one({"_id": "e"}, w=3, wtimeout_ms=10_000).gtid is not None


def test_killed_secondary_applies_every_entry_exactly_once(ray_session, tmp_path):
    ray = ray_session
    lim = raymx.Limits(apply_batch_ops=20)
    rs = raymx.ReplicaSet.launch("crash2", members=2, data_dir=str(tmp_path), limits=lim)
    try:
        c = rs.client(w=1)
        ctr = c["k"]["ctr"]
        ctr.insert_one({"_id": "n", "n": 0})
        wait_until(lambda: converged(ray, rs, [0, 1]))
        ray.get(producer(ray, rs, 1).pause.remote(True))
        for i in range(1500):
            ctr.update_one({"_id": "n"}, {"$inc": {"n": 1}})
        applier = ray.get_actor("crash2/m1/applier", namespace="raymx")
        prod = producer(ray, rs, 1)
        pids = ray.get([applier.__ray_call__.remote(lambda self: os.getpid()),
                        prod.__ray_call__.remote(lambda self: os.getpid())])
        ray.get(prod.pause.remote(False))
        # kill both in the middle of applying the backlog (not a polite shutdown)
        wait_until(lambda: ray.get(applier.status.remote())["applied_ops"] > 100, every_s=0.01)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        # Ray restarts them (max_restarts=-1, not paused any more): the producer
        # resumes at the end of its oplog, the applier at the minimum unapplied GTID
        ds = wait_until(lambda: converged(ray, rs, [0, 1]), timeout_s=60)
        sec = rs.client(read_preference="secondary")["k"]["ctr"]
        assert sec.find_one({"_id": "n"})["n"] == 1500
        assert len(ds[0]["oplog"]) == 1502  # the first primary's no-op, one insert, 1,500 updates
    finally:
        rs.shutdown()


def test_chained_and_delayed_members(ray_session, tmp_path):
    ray = ray_session
    rs = raymx.ReplicaSet.launch("chain", data_dir=str(tmp_path), members=[
        {}, {}, {"sync_source": 1}, {"delay_s": 2, "votes": 0}])
    try:
        st = wait_until(lambda: (lambda m: m[2]["sync_source"] == 1 and m)(rs.status()["members"]))
        assert st[3]["priority"] == 0 and st[1]["sync_source"] == 0
        coll = rs.client()["d"]["c"]
        g = coll.insert_one({"_id": 1}, w=3, wtimeout_ms=10_000).gtid
        wait_until(lambda: converged(ray, rs, [0, 1, 2]))
        # the delayed member has the entry in its oplog but has not applied it yet
        time.sleep(0.5)
        m3 = rs.status()["members"][3]
        assert GTID(*m3["last"]) >= g and GTID(*m3["applied"]) < g
        wait_until(lambda: GTID(*rs.status()["members"][3]["applied"]) >= g, timeout_s=10)
        # chained member's durable position reaches the primary through member 1
        assert coll.insert_one({"_id": 2}, w=4, wtimeout_ms=10_000).gtid is not None
    finally:
        rs.shutdown()
