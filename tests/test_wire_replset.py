"""pymongo against a real 3-member set through ``rs.mongodb_uri()``: discovery,
reads from secondaries, and a failover pymongo follows by itself."""
import datetime
import threading
import time

import pymongo
import pytest
from bson import Decimal128, Timestamp
from pymongo import ReadPreference, WriteConcern
from pymongo.read_preferences import SecondaryPreferred

import raymx

from tests.test_replication import wait_until


def test_pymongo_discovers_the_set_and_follows_a_failover(ray_session, tmp_path):
    rs = raymx.ReplicaSet.launch("wire3", members=3, data_dir=str(tmp_path))
    try:
        old = rs.wait_for_primary()
        wait_until(lambda: all(m.get("wire") for m in rs._topology()["members"])
                   and len(rs._topology()["members"]) == 3, timeout_s=30)
        uri = rs.mongodb_uri()
        assert uri.startswith("mongodb://raymx:") and "replicaSet=wire3" in uri
        c = pymongo.MongoClient(uri, serverSelectionTimeoutMS=30_000,
                                heartbeatFrequencyMS=500)
        topo = rs._topology()
        wire = {m["id"]: (m["wire"][0], m["wire"][1]) for m in topo["members"]}
        assert c.admin.command("ping")["ok"] == 1.0
        wait_until(lambda: c.primary == wire[old] and len(c.secondaries) == 2, timeout_s=30)
        coll = c.get_database("app", write_concern=WriteConcern("majority", wtimeout=20_000)).w
        at = datetime.datetime(2026, 11, 25, 6, 0, 0, 123000)
        coll.insert_many([{"_id": f"seed-{i}", "n": i} for i in range(99)])
        oid = coll.insert_one({"at": at, "d": Decimal128("1.5")}).inserted_id
        # the native driver sees what pymongo wrote, and the other way round
        rs.client()["app"]["w"].insert_one({"_id": "native"})
        assert coll.find_one({"_id": "native"}) == {"_id": "native"}
        sec = coll.with_options(read_preference=ReadPreference.SECONDARY)
        wait_until(lambda: sec.count_documents({}) == 101, timeout_s=30)
        assert sec.find_one({"_id": oid}) == {"_id": oid, "at": at, "d": Decimal128("1.5")}
        # rs.status() and rs.conf() as mongosh's rs helpers read them: every
        # member by its address, its state and its last applied entry (optime,
        # optimeDate: the lag rs.printSecondaryReplicationInfo() shows)
        names = {i: f"{h}:{p}" for i, (h, p) in wire.items()}
        st = c.admin.command("replSetGetStatus")
        by = {m["_id"]: m for m in st["members"]}
        assert sorted(by) == sorted(wire) and st["set"] == "wire3" and st["myState"] == 1
        assert by[old]["stateStr"] == "PRIMARY" and by[old]["self"]
        assert {by[i]["stateStr"] for i in by if i != old} == {"SECONDARY"}
        assert all(m["name"] == names[m["_id"]] and m["health"] == 1.0 for m in by.values())
        top = by[old]["optime"]["ts"]
        assert top.time == st["term"] and top.inc >= 3  # the seeds, the oid, "native"
        assert all(m["optime"]["ts"] <= top and m["optimeDate"] <= by[old]["optimeDate"]
                   and m["raymx"]["lag"] >= 0 for m in by.values())
        assert {by[i]["syncSourceHost"] for i in by if i != old} <= set(names.values())
        conf = c.admin.command("replSetGetConfig")["config"]
        assert conf["_id"] == "wire3" and conf["version"] >= 1
        assert sorted(m["host"] for m in conf["members"]) == sorted(names.values())
        assert all(m["votes"] == 1 and m["priority"] > 0 for m in conf["members"])
        # hello's lastWrite (what drivers' maxStalenessSeconds reads: pymongo's
        # server selection fails where a member has no lastWriteDate)
        lw = c.admin.command("hello")["lastWrite"]
        assert lw["opTime"]["ts"] >= top and lw["lastWriteDate"] >= by[old]["optimeDate"]
        assert lw["majorityOpTime"]["ts"] <= lw["opTime"]["ts"]
        assert lw["majorityWriteDate"] <= lw["lastWriteDate"]
        wait_until(lambda: all(sd.last_write_date for sd in
                               c.topology_description.server_descriptions().values()),
                   timeout_s=30)
        stale = coll.with_options(read_preference=SecondaryPreferred(max_staleness=90))
        assert stale.find_one({"_id": "native"}) == {"_id": "native"}

        # the stream has a client of its own with a shorter server selection:
        # its first getMore after the failover waits that long for the dead
        # member its cursor was on (as pymongo does against MongoDB), then resumes
        sc = pymongo.MongoClient(uri, serverSelectionTimeoutMS=10_000, heartbeatFrequencyMS=500)
        stream = sc.get_database("app").w.watch([{"$match": {"operationType": "insert"}}],
                                                max_await_time_ms=300)
        stream.try_next()  # opened on the old primary
        acked, failed, stop = [], [], threading.Event()

        def write():
            i = 0
            while not stop.is_set():
                try:
                    coll.insert_one({"_id": f"w-{i}"})
                    acked.append(f"w-{i}")
                except pymongo.errors.PyMongoError as e:
                    failed.append((f"w-{i}", repr(e)))
                i += 1
        t = threading.Thread(target=write)
        t.start()
        try:
            wait_until(lambda: len(acked) > 20, timeout_s=30, every_s=0.02)
            rs.kill_member(old)
            new = wait_until(lambda: (lambda p: p is not None and p != old and p)(
                rs._topology()["primary"]), timeout_s=30, every_s=0.05)
            n = len(acked)
            wait_until(lambda: len(acked) > n + 20, timeout_s=60, every_s=0.05)
        finally:
            stop.set()
            t.join(60)
        assert c.primary == wire[new]  # pymongo found the new primary by itself
        # the dead member stays listed, by its address, as unreachable
        gone = next(m for m in c.admin.command("replSetGetStatus")["members"]
                    if m["_id"] == old)
        assert (gone["health"], gone["stateStr"], gone["name"]) == \
            (0.0, "(not reachable/healthy)", names[old])
        have = {d["_id"] for d in coll.find({}, {"_id": 1})}
        missing = [i for i in acked if i not in have]
        assert not missing, f"acknowledged majority writes lost: {missing[:5]}"
        # a failed write may or may not be there (its outcome is unknown); none twice
        # retryable writes: a write cut off by the failover is retried on the new
        # primary and applied once (its record replicated with it), so none fails
        assert not failed, failed[:3]
        assert {i for i in have if str(i).startswith("w-")} == set(acked)
        # the change stream resumes on the new primary by itself (GTID resume
        # tokens): every acknowledged insert exactly once, in order
        seen = []
        t0 = deadline = time.time()
        deadline += 60
        while not set(acked) <= set(seen):
            assert time.time() < deadline, f"{len(set(acked) - set(seen))} events missing"
            ev = stream.try_next()
            if ev is not None and str(ev["documentKey"]["_id"]).startswith("w-"):
                seen.append(ev["documentKey"]["_id"])
        stream.close()
        sc.close()
        print(f"stream caught up in {time.time() - t0:.1f} s")
        assert len(seen) == len(set(seen))
        assert seen == sorted(seen, key=lambda x: int(x[2:]))
        # a rename replicates (the catalog record moves on every member), and
        # dbHash, as replica-set checkers use it, says the members hold the same data
        coll.rename("w_renamed")
        app = c.get_database("app")
        assert app.list_collection_names() == ["w_renamed"]

        def hashes():
            return (app.command("dbHash")["md5"],
                    app.command("dbHash", read_preference=ReadPreference.SECONDARY)["md5"])
        wait_until(lambda: len(set(hashes())) == 1, timeout_s=30, every_s=0.2)
        c.close()
    finally:
        rs.shutdown()


def test_a_causally_consistent_session_reads_its_writes_on_a_secondary(ray_session, tmp_path):
    """Every answer carries an operationTime (the member's applied GTID as a
    Timestamp); a causally consistent session sends it back as
    afterClusterTime, and a secondary that has not applied it waits: the
    session reads its own write there, as against MongoDB."""
    import ray
    rs = raymx.ReplicaSet.launch("causal", members=2, data_dir=str(tmp_path))
    try:
        p = rs.wait_for_primary()
        wait_until(lambda: all(m.get("wire") for m in rs._topology()["members"])
                   and len(rs._topology()["members"]) == 2, timeout_s=30)
        c = pymongo.MongoClient(rs.mongodb_uri(), serverSelectionTimeoutMS=30_000,
                                heartbeatFrequencyMS=500)
        wait_until(lambda: c.primary is not None and len(c.secondaries) == 1, timeout_s=30)
        coll = c.app.c
        sec = coll.with_options(read_preference=ReadPreference.SECONDARY)
        coll.insert_one({"_id": "before"})
        wait_until(lambda: sec.find_one({"_id": "before"}) is not None, timeout_s=30)
        prod = ray.get_actor(f"causal/m{1 - p}/producer", namespace="raymx")
        ray.get(prod.pause.remote(True))
        try:
            # a write with no write concern waits for a majority (both members),
            # MongoDB's implicit default since 5.0: not acknowledged while the
            # secondary's producer is paused
            done = threading.Event()
            t = threading.Thread(target=lambda: (coll.insert_one({"_id": "majority"}),
                                                 done.set()))
            t.start()
            assert not done.wait(1.5)
            # the native driver's default is the same (rs.client, connect_url);
            # w=1 is answered at the primary's commit
            ncl, ucl = rs.client(wtimeout_ms=500), raymx.connect_url(rs.url())
            with pytest.raises(raymx.errors.WriteConcernTimeout):
                ncl["app"]["c"].insert_one({"_id": "native"})
            assert ucl.write_concern == raymx.WriteConcern("majority")
            assert ncl["app"]["c"].insert_one({"_id": "native-w1"}, w=1).gtid is not None
            ncl.close(), ucl.close()
            assert c.admin.command("getDefaultRWConcern")["defaultWriteConcern"] == {
                "w": "majority", "wtimeout": 0}
            ray.get(prod.pause.remote(False))
            assert done.wait(30)
            t.join()
            ray.get(prod.pause.remote(True))
            w1 = coll.with_options(write_concern=WriteConcern(w=1))
            with c.start_session(causal_consistency=True) as s:
                w1.insert_one({"_id": "mine"}, session=s)
                assert isinstance(s.operation_time, Timestamp)
                assert sec.find_one({"_id": "mine"}) is None  # the secondary lags
                threading.Timer(1.0, lambda: ray.get(prod.pause.remote(False))).start()
                assert sec.find_one({"_id": "mine"}, session=s) == {"_id": "mine"}
        finally:
            ray.get(prod.pause.remote(False))
        # rs.stepDown(), as fault injectors and operators send it: the secondary
        # takes over with everything acknowledged, and pymongo follows
        old_addr = c.primary
        with pytest.raises(pymongo.errors.NotPrimaryError, match="not primary so can't"):
            c.admin.command("replSetStepDown", 10, read_preference=ReadPreference.SECONDARY)
        with pytest.raises(pymongo.errors.OperationFailure) as e:
            c.admin.command("replSetStepDown", 5, secondaryCatchUpPeriodSecs=9)
        assert e.value.code == 2
        with pytest.raises(pymongo.errors.OperationFailure) as e:
            c.app.command("replSetStepDown", 10)
        assert e.value.code == 13
        assert rs.wait_for_primary() == p  # the refusals changed nothing
        c.admin.command("replSetStepDown", 10)
        wait_until(lambda: rs._topology()["primary"] == 1 - p, timeout_s=30)
        wait_until(lambda: c.primary not in (None, old_addr), timeout_s=30)
        assert coll.insert_one({"_id": "after"}).inserted_id == "after"
        assert {d["_id"] for d in coll.find()} >= {"before", "majority", "mine", "after"}
        c.close()
    finally:
        rs.shutdown()
