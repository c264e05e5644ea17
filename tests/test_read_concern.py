"""Read concerns on real replica sets (issue 22): local, majority, linearizable."""
import time

import pytest

import raymx
from raymx import errors
from raymx.client import connect_member

from tests.test_replication import wait_until
from tests.test_safety import _new_primary, _pause


def test_majority_reads_never_see_writes_that_are_rolled_back(ray_session, tmp_path):
    """An isolated primary takes w=1 writes: a local read there sees them, a
    majority read does not; after failover they are rolled back."""
    ray = ray_session
    rs = raymx.ReplicaSet.launch("rcm", members=3, data_dir=str(tmp_path))
    try:
        old = rs.wait_for_primary()
        coll = rs.client(w=1)["d"]["c"]
        coll.insert_many([{"_id": i, "v": 0} for i in range(10)], w="majority")
        coll.create_index("v", w="majority")
        others = [i for i in range(3) if i != old]
        local = coll.watch(read_concern="local", wait_ms=300)
        majority = coll.watch(wait_ms=300)  # read concern "majority" by default
        _pause(ray, rs, others)
        coll.insert_one({"_id": "lost", "v": 1})
        coll.update_one({"_id": 3}, {"$set": {"v": 1}})
        coll.delete_one({"_id": 4})
        maj = coll.with_options(read_concern="majority")
        assert coll.count_documents({}) == 10 and coll.find_one({"_id": "lost"})
        assert coll.count_documents({"v": 1}) == 2
        # as of the majority point: the insert, update and delete are not there
        assert maj.count_documents({}) == 10 and maj.find_one({"_id": "lost"}) is None
        assert maj.find_one({"_id": 4}) == {"_id": 4, "v": 0}
        assert maj.count_documents({"v": 1}) == 0  # through the index on v too
        assert sorted(d["_id"] for d in maj.find({"v": 0})) == list(range(10))
        assert coll.find_one({"_id": 3}, read_concern="majority") == {"_id": 3, "v": 0}
        assert [d["_id"] for d in coll.find({}, sort=[("_id", 1)], limit=3,
                                            read_concern="majority")] == [0, 1, 2]
        # a change stream at "local" delivers the insert; one at "majority" never does
        ev = local.try_next() or local.try_next()
        assert ev is not None and ev["op"] == "insert" and ev["_id"] == "lost"
        assert majority.try_next() is None and majority.try_next() is None
        local.close()
        majority.close()
        with pytest.raises(errors.InvalidOperation, match="change stream"):
            coll.watch(read_concern="snapshot")
        rs.kill_member(old)
        _pause(ray, rs, others, False)
        _new_primary(rs, old)
        assert coll.find_one({"_id": "lost"}) is None  # rolled back: never seen by majority
        assert rs.client(read_concern="majority")["d"]["c"].count_documents({}) == 10
        # a majority write is visible to a majority read at once, also on a secondary
        g = coll.insert_one({"_id": "after"}, w="majority").gtid
        assert maj.find_one({"_id": "after"}) == {"_id": "after"}
        sec = rs.client(read_preference=raymx.ReadPreference("secondary", after=g),
                        read_concern="majority")["d"]["c"]
        wait_until(lambda: sec.find_one({"_id": "after"}) is not None, timeout_s=20)
    finally:
        rs.shutdown()


def test_linearizable_reads_need_a_primary_that_a_majority_confirms(ray_session, tmp_path):
    ray = ray_session
    rs = raymx.ReplicaSet.launch("rcl", members=3, data_dir=str(tmp_path))
    try:
        prim = rs.wait_for_primary()
        coll = rs.client(timeout_s=3)["d"]["c"]
        coll.insert_one({"_id": 1, "v": "a"}, w="majority")
        lin = coll.with_options(read_concern="linearizable")
        assert lin.find_one({"_id": 1}) == {"_id": 1, "v": "a"}
        assert lin.count_documents({}) == 1
        coll.insert_one({"_id": 2})  # w=1: a linearizable read waits until it is committed
        assert lin.find_one({"_id": 2}) == {"_id": 2}
        with pytest.raises(errors.InvalidOperation, match="primary only"):
            rs.client(read_preference="secondary", read_concern="linearizable")["d"]["c"] \
                .find_one({"_id": 1})
        sec = next(m for m in rs._topology()["members"] if m["id"] != prim)
        conn = connect_member(sec, rs._topology()["secret"])

        def serves_reads():  # a member just launched serves none until its source confirms it
            try:
                return conn.request({"op": "count", "ns": "d.c", "filter": {}}, 10) is not None
            except errors.NotPrimaryOrSecondary:
                return False
        wait_until(serves_reads, timeout_s=30, every_s=0.1)
        with pytest.raises(errors.NotPrimary):
            conn.request({"op": "count", "ns": "d.c", "filter": {},
                          "readConcern": "linearizable"}, 10)
        conn.close()
        # the primary cannot reach a majority any more: it never answers
        _pause(ray, rs, [i for i in range(3) if i != prim])
        t0 = time.monotonic()
        with pytest.raises((errors.ReadConcernTimeout, errors.RequestTimeout)):
            lin.find_one({"_id": 1})
        assert time.monotonic() - t0 < 10
        assert coll.find_one({"_id": 1}) == {"_id": 1, "v": "a"}  # local still answers
        with pytest.raises(errors.ConfigError, match="read concern"):
            rs.client(read_concern="eventual")
        with pytest.raises(errors.InvalidOperation, match="change stream"):
            rs.client().watch(read_concern="linearizable")
    finally:
        rs.shutdown()


def test_a_linearizable_read_on_a_deposed_primary_fails(ray_session, tmp_path):
    """A newer term begins on the other members (as an election's fencing makes
    it) while the old primary does not know yet: a local read there still
    answers, a linearizable read never does."""
    rs = raymx.ReplicaSet.launch("rcd", members=3, data_dir=str(tmp_path))
    try:
        prim = rs.wait_for_primary()
        coll = rs.client()["d"]["c"]
        coll.insert_one({"_id": 1}, w="majority")
        topo = rs._topology()
        term = rs.status()["term"]
        m = next(x for x in topo["members"] if x["id"] == prim)
        ray_session.get([rs.member(i).heartbeat.remote(term + 1)
                         for i in range(3) if i != prim])  # they record the new term
        conn = connect_member(m, topo["secret"])
        try:
            with pytest.raises((errors.NotPrimary, errors.ReadConcernTimeout)):
                conn.request({"op": "find", "ns": "d.c", "filter": {"_id": 1},
                              "readConcern": "linearizable", "read_timeout_ms": 3000}, 10)
        finally:
            conn.close()
        # the set recovers by itself: a primary of a newer term takes writes again
        wait_until(lambda: rs.status()["term"] > term and rs._topology()["primary"]
                   is not None, timeout_s=30)
        assert coll.insert_one({"_id": 2}, w="majority").gtid.term > term
    finally:
        rs.shutdown()
