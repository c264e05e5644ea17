"""Snapshot-based member creation, resync and hot-copy join on real Ray actors and LMDB."""
import threading
import time

import pytest

import raymx
from raymx import errors
from raymx.storage.gtid import GTID
from tests.test_replication import wait_until


@pytest.fixture(scope="module")
def rs2(ray_session, tmp_path_factory):
    rs = raymx.ReplicaSet.launch("snap", members=2, data_dir=str(tmp_path_factory.mktemp("s")))
    c = rs.client()
    c["app"]["users"].create_index("age")
    for i in range(0, 3000, 500):
        c["app"]["users"].insert_many([{"_id": j, "age": j % 90, "name": f"u{j}",
                                        "tags": ["a", j % 3], "nested": {"k": j}}
                                       for j in range(i, i + 500)])
    yield rs
    rs.shutdown()


class Writer:
    """Keeps committing inserts, updates and deletes until stopped."""

    def __init__(self, rs, prefix):
        self.prefix = prefix
        self.c = rs.client()
        self.stop = threading.Event()
        self.n = 0
        self.errors = []
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        coll = self.c["app"]["users"]
        i = 0
        try:
            while not self.stop.is_set():
                i += 1
                coll.insert_one({"_id": f"{self.prefix}{i}", "age": i % 90})
                coll.update_one({"_id": i % 3000}, {"$inc": {"n": 1}, "$set": {"age": i % 70}})
                if i % 7 == 0:
                    coll.delete_one({"_id": f"{self.prefix}{i - 3}"})
                self.n = i
        except Exception as e:  # reported by the test
            self.errors.append(e)

    def finish(self):
        self.stop.set()
        self.t.join(30)
        assert not self.errors


def member_state(ray, rs, mid):
    return ray.get(rs.member(mid).state_digest.remote(), timeout=60)


def assert_converged(ray, rs, mid):
    prim = rs._primary_id()

    def same():
        a, b = member_state(ray, rs, prim), member_state(ray, rs, mid)
        return a["collections"] == b["collections"] and (a, b)
    a, b = wait_until(same, timeout_s=60, every_s=0.3)
    # the new member's oplog is the primary's tail from the snapshot GTID on
    first = b["oplog"][0][0]
    tail = [x for x in a["oplog"] if x[0] >= first]
    assert b["oplog"] == tail and len(tail) >= 1
    return first


def test_snapshot_member_converges_while_a_writer_keeps_committing(ray_session, rs2):
    w = Writer(rs2, "a")
    seen = []
    watching = threading.Event()

    def watch():  # what rs.status() shows while the sync runs
        while not watching.is_set():
            for m in rs2.status()["members"]:
                if m["id"] == 2:
                    seen.append((m["state"], m.get("votes"), m.get("initial_sync")))
            time.sleep(0.05)
    wt = threading.Thread(target=watch, daemon=True)
    wt.start()
    try:
        time.sleep(0.5)
        mid = rs2.add_member(initial_sync="snapshot", progress=False)
        n_during = w.n
        time.sleep(0.5)
    finally:
        watching.set()
        wt.join(10)
        w.finish()
    assert mid == 2 and w.n > n_during > 0
    assert any(s == "synchronizing" and v == 0 for s, v, _ in seen)
    assert any(p and p["rows"] > 0 for _, _, p in seen)  # progress was shown
    first = assert_converged(ray_session, rs2, mid)
    assert first[1] > 1  # started from a snapshot, not from the first entry
    st = {m["id"]: m for m in rs2.status()["members"]}
    assert st[2]["state"] == "running" and st[2]["votes"] == 1
    # the set now has 3 voters: a majority write needs the new member too
    rs2.kill_member(1)
    try:
        r = rs2.client()["app"]["users"].insert_one({"_id": "maj"}, w="majority",
                                                   wtimeout_ms=20_000)
        assert r.gtid is not None
    finally:
        rs2.start_member(1)
    assert_converged(ray_session, rs2, 1)


def test_resync_and_hot_copy_join(ray_session, rs2, tmp_path):
    # member 1 has applied the fixture's writes (this test may run alone)
    wait_until(lambda: rs2.status_of(1)["applied"][1] >= 6, timeout_s=60)
    w = Writer(rs2, "b")
    try:
        dest = tmp_path / "bk"
        g = rs2.backup(1, str(dest))
        assert g.seq > 0
        out = rs2.resync_member(1, progress=False)
        assert out["rows"] > 3000 and out["gtid"] >= g
        mid = rs2.add_member(initial_sync="backup", backup=str(dest), votes=0, priority=0)
    finally:
        w.finish()
    assert assert_converged(ray_session, rs2, 1)[1] > 1
    assert assert_converged(ray_session, rs2, mid)[1] == 1  # the copy kept its whole oplog
    st = {m["id"]: m for m in rs2.status()["members"]}
    assert st[1]["votes"] == 1 and st[1]["state"] == "running"
    with pytest.raises(errors.ConfigError, match="primary"):
        rs2.resync_member(rs2._primary_id())


def test_the_member_joins_without_the_driver_after_the_copy(ray_session, rs2):
    """add_member(wait=False) returns once the snapshot is loaded: catching up
    and taking its votes is the coordinator's work, not the driver's."""
    w = Writer(rs2, "c")
    try:
        mid = rs2.add_member(initial_sync="snapshot", progress=False, wait=False)
        m = next(x for x in rs2.config()["members"] if x["id"] == mid)
        assert m["votes"] == 0 and m["priority"] == 0 and m["joining"]["votes"] == 1
        wait_until(lambda: all(
            x["id"] != mid or (x["votes"] == 1 and "joining" not in x)
            for x in rs2.config()["members"]), timeout_s=60, every_s=0.1)
    finally:
        w.finish()
    assert assert_converged(ray_session, rs2, mid)[1] > 1
    st = {m["id"]: m for m in rs2.status()["members"]}
    assert st[mid]["state"] == "running" and st[mid]["votes"] == 1
    rs2.remove_member(mid)


def test_status_table_shows_initial_sync_progress():
    from raymx.replset import format_status
    out = format_status({"set": "x", "members": [
        {"id": 2, "role": "secondary", "state": "synchronizing",
         "initial_sync": {"phase": "copy", "rows": 200, "rows_done": 50},
         "joining": {"votes": 1, "priority": 1}}]})
    assert "synchronizing (copy 25%)" in out
    assert "member 2 is joining: it gets 1 vote(s) and priority 1 once it has caught up" in out
