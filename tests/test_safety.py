"""Issue 19's fault scenarios on real replica sets (real Ray actors, real LMDB):
each failed on the code before the fix."""
import threading
import time

import pytest

import raymx
from raymx import errors
from raymx.client import ReadPreference

from tests.test_replication import wait_until


def _producer(ray, rs, i):
    return ray.get_actor(f"{rs.name}/m{i}/producer", namespace="raymx")


def _pause(ray, rs, ids, paused=True):
    if paused:
        _following(rs, ids)
    ray.get([_producer(ray, rs, i).pause.remote(paused, wait=paused) for i in ids])


def _following(rs, ids):
    """Every member of ``ids`` pulls from someone, and the coordinator has
    heard so: its heartbeat view then sends no more ``follow``, which would
    undo a pause (a follow tells the producer to pull). A suite run on a
    loaded machine paused a set right after its launch, a late follow
    resumed a secondary, and it took the writes meant to diverge."""
    wait_until(lambda: all(m["sync_source"] is not None for m in rs.status()["members"]
                           if m["id"] in ids), timeout_s=60)
    time.sleep(0.5)  # a few heartbeat rounds (100 ms each) past it


def _new_primary(rs, old, timeout_s=30):
    return wait_until(lambda: (lambda p: p is not None and p != old and p)(
        rs._topology()["primary"]), timeout_s=timeout_s, every_s=0.05)


def _old_primary_with_writes_only_it_has(ray, rs, write):
    """The primary takes ``write(coll)`` while both secondaries are paused and is
    killed; a new primary is elected and takes a majority write. Returns (old
    primary, new primary, the two others, the collection "d.c")."""
    old = rs.wait_for_primary()
    coll = rs.client(w=1)["d"]["c"]
    coll.insert_one({"_id": "base"}, w="majority")
    others = [i for i in range(3) if i != old]
    _pause(ray, rs, others)
    held = {m["id"]: m["last"] for m in rs.status()["members"] if m["id"] in others}
    write(coll)
    now = {m["id"]: m["last"] for m in rs.status()["members"] if m["id"] in others}
    assert now == held, (f"a paused secondary took writes meant to diverge ({held} -> {now}): "
                         "its pause was undone, so this scenario was not set up")
    rs.kill_member(old)
    _pause(ray, rs, others, False)
    new = _new_primary(rs, old)
    # a new client: ray.kill returns before the old primary's process is gone, so
    # the first client's open connection to it may still take a write and then
    # lose it (an unknown outcome, correctly reported, but not this test's point)
    coll = rs.client()["d"]["c"]
    coll.insert_one({"_id": "after"}, w="majority")
    return old, new, others, coll


_SEEN = ("id", "state", "role", "term", "last", "applied", "sync_source", "rollbacks",
         "last_rollback", "restarted")


def _state(rs, mid):
    return next(m for m in rs.status()["members"] if m["id"] == mid)["state"]


@pytest.fixture
def five(ray_session, tmp_path):
    rs = raymx.ReplicaSet.launch(f"five{time.monotonic_ns() % 10**6}", members=5,
                                 data_dir=str(tmp_path))
    assert rs.wait_for_primary() == 0
    yield rs
    rs.shutdown()


def _write_30_while_3_and_4_lag(ray, rs):
    coll = rs.client(w="majority", wtimeout_ms=10_000)["s"]["c"]
    coll.insert_one({"_id": "before"})  # every member holds this one
    wait_until(lambda: all(m["lag"] == 0 for m in rs.status()["members"]))
    _pause(ray, rs, [3, 4])
    acked = [(i, coll.insert_one({"_id": i}).gtid) for i in range(30)]
    return coll, acked


def test_removing_two_voters_while_the_rest_lag_loses_no_majority_write(ray_session, five):
    """Scenario 1 exactly: 30 majority writes held by 0, 1 and 2; 3 and 4 lag;
    remove 1 and 2; kill the primary. The removals are refused (the remaining
    voters do not hold the writes), and nothing acknowledged is lost."""
    ray, rs = ray_session, five
    coll, acked = _write_30_while_3_and_4_lag(ray, rs)
    t0 = time.monotonic()
    with pytest.raises(errors.ConfigError, match=r"new configuration.*only \[0, 2\] hold"):
        rs.remove_member(1, timeout_s=1.0)
    assert time.monotonic() - t0 >= 1.0
    with pytest.raises(errors.ConfigError):
        rs.remove_member(2, timeout_s=1.0)
    assert [m["id"] for m in rs.config()["members"]] == [0, 1, 2, 3, 4]
    # asking for both at once in one list is refused at once
    with pytest.raises(errors.ConfigError, match="at most one voter"):
        rs._change(5, members=[m for m in rs.config()["members"] if m["id"] not in (1, 2)])
    rs.kill_member(0)
    _pause(ray, rs, [3, 4], False)
    _new_primary(rs, 0)
    have = {d["_id"] for d in rs.client()["s"]["c"].find({})}
    assert not [i for i, _ in acked if i not in have], "acknowledged majority writes lost"


def test_two_removals_wait_for_the_lagging_members_then_lose_nothing(ray_session, five):
    """The same set, but the lagging members catch up while the removals wait:
    they complete one after the other, and the new majority holds every write."""
    ray, rs = ray_session, five
    coll, acked = _write_30_while_3_and_4_lag(ray, rs)
    done, errs = [], []

    def remove(mid):
        try:
            rs.remove_member(mid, timeout_s=60)
            done.append(mid)
        except Exception as e:  # pragma: no cover - reported below
            errs.append(e)
    ts = [threading.Thread(target=remove, args=(i,)) for i in (1, 2)]
    for t in ts:
        t.start()
    time.sleep(1.0)
    assert not done and not errs  # both wait: 3 and 4 do not hold the writes yet
    assert len(rs.config()["members"]) == 5
    _pause(ray, rs, [3, 4], False)
    for t in ts:
        t.join(90)
    assert not errs and sorted(done) == [1, 2]
    cfg = rs.config()
    assert [m["id"] for m in cfg["members"]] == [0, 3, 4]
    rs.kill_member(0)
    new = _new_primary(rs, 0)
    assert new in (3, 4)
    have = {d["_id"] for d in rs.client()["s"]["c"].find({})}
    assert not [i for i, _ in acked if i not in have], "acknowledged majority writes lost"


def test_a_member_that_needs_a_resync_serves_no_reads_and_still_votes(ray_session, tmp_path):
    """Scenarios 2 and 3: the old primary returns with 200 diverged writes, more
    than rollback_ops_max, so it needs a resync. It must not serve them to
    secondary reads; and with the primary killed it still votes, so the third
    member is elected."""
    ray = ray_session
    limits = raymx.Limits(rollback_ops_max=50)
    rs = raymx.ReplicaSet.launch("resync3", members=3, data_dir=str(tmp_path), limits=limits)
    try:
        def diverge(coll):
            coll.insert_many([{"_id": f"x{i}", "diverged": True} for i in range(200)])
            for i in range(200, 210):  # and some entries of their own
                coll.insert_one({"_id": f"x{i}", "diverged": True})
        old, new, others, coll = _old_primary_with_writes_only_it_has(ray, rs, diverge)
        rs.start_member(old)
        try:  # within a second of its start here; 15-25 s to start on a loaded machine
            wait_until(lambda: _state(rs, old) == "resync", timeout_s=120)
        except AssertionError:  # (one clean-clone run, 2026-11-29: not in 60 s) what it was
            raise AssertionError(f"member {old} never needed a resync: "
                                 f"{[{k: m.get(k) for k in _SEEN} for m in rs.status()['members']]}"
                                 ) from None
        healthy = next(i for i in others if i != new)
        # scenario 2: the healthy secondary down, secondary reads must not reach
        # the member in resync (before: 200 of 200 reads returned its writes)
        rs.kill_member(healthy)
        wait_until(lambda: _state(rs, healthy) == "down" and all(
            m["id"] != healthy for m in rs._topology()["members"]))
        sec = rs.client(read_preference="secondary", timeout_s=2)["d"]["c"]
        with pytest.raises((errors.NotPrimaryOrSecondary, errors.StaleRead)):
            sec.count_documents({"diverged": True})
        m = next(x for x in rs._topology()["members"] if x["id"] == old)
        from raymx.client import connect_member
        conn = connect_member(m, rs._topology()["secret"])
        with pytest.raises(errors.NotPrimaryOrSecondary, match="resync"):
            conn.request({"op": "count", "ns": "d.c", "filter": {}}, 10)
        conn.close()
        near = rs.client(read_preference=ReadPreference("nearest"), timeout_s=10)["d"]["c"]
        for _ in range(20):  # the primary answers, never the member in resync
            assert near.count_documents({"diverged": True}) == 0
        # scenario 3: the healthy member back, the primary killed: it is elected
        # with the vote of the member in resync (before: no primary at all)
        rs.start_member(healthy)
        wait_until(lambda: _state(rs, healthy) in ("running", "paused"), timeout_s=60)
        rs.kill_member(new)
        assert _new_primary(rs, new, timeout_s=20) == healthy
        assert coll.find_one({"_id": "after"}) is not None
        assert coll.count_documents({"diverged": True}) == 0
    finally:
        rs.shutdown()


def test_two_sets_never_run_over_one_data_dir(ray_session, tmp_path):
    """Issue 20, a fix known now: each member's process holds a lock in its
    folder, and the folder remembers its set's name."""
    rs = raymx.ReplicaSet.launch("owner", members=1, data_dir=str(tmp_path))
    try:
        rs.client()["a"]["b"].insert_one({"_id": 1}, w=1, j=True)
        with pytest.raises(errors.ConfigError, match="in use by replica set 'owner'"):
            raymx.ReplicaSet.launch("intruder", members=1, data_dir=str(tmp_path))
        assert rs.client()["a"]["b"].find_one({"_id": 1}) == {"_id": 1}  # untouched
    finally:
        rs.shutdown()
    with pytest.raises(errors.ConfigError, match="belongs to replica set 'owner'"):
        raymx.ReplicaSet.launch("intruder", members=1, data_dir=str(tmp_path))
    rs = raymx.ReplicaSet.launch("owner", members=1, data_dir=str(tmp_path))  # its own: fine
    try:
        assert rs.client()["a"]["b"].count_documents({}) == 1
    finally:
        rs.shutdown()


def _hold_member_lock(path, rs, started, release):
    from raymx.actors.process import lock_member
    f = lock_member(path, rs, 0, "")
    started.set()
    release.wait(30)
    f.close()


def test_a_folder_held_by_another_set_is_refused_at_once_by_its_own_set_waited_for(tmp_path):
    """The folder lock's holder (another live process): another set's is
    refused at once (no restart of ours frees it); this set's own (an old
    process going away) is waited for, and the lock is had once it is gone."""
    import multiprocessing
    from raymx.actors.process import lock_member
    ctx = multiprocessing.get_context("spawn")
    started, release = ctx.Event(), ctx.Event()
    path = str(tmp_path / "m0")
    p = ctx.Process(target=_hold_member_lock, args=(path, "owner", started, release))
    p.start()
    try:
        assert started.wait(30)
        t0 = time.monotonic()
        with pytest.raises(errors.ConfigError, match="in use by replica set 'owner' member 0"):
            lock_member(path, "intruder", 0, "", wait_s=5.0)
        assert time.monotonic() - t0 < 3.0  # not after the 5 s wait
        t0 = time.monotonic()
        with pytest.raises(errors.ConfigError, match="in use by replica set 'owner'"):
            lock_member(path, "owner", 0, "", wait_s=0.5)
        assert time.monotonic() - t0 >= 0.5  # its own set: waited for
        threading.Timer(0.3, release.set).start()
        f = lock_member(path, "owner", 0, "", wait_s=10.0)  # had once the holder is gone
        f.close()
    finally:
        release.set()
        p.join(30)


def test_a_restarted_old_primary_never_serves_what_it_rolls_back(ray_session, tmp_path):
    """Issue 22's second dirty read (53-67 reads per run): the killed primary's
    processes come back with writes only it had; until it has rolled them back
    and a sync source confirmed its position, it refuses every read."""
    ray = ray_session
    rs = raymx.ReplicaSet.launch("rbread", members=3, data_dir=str(tmp_path))
    try:
        def diverge(coll):
            for i in range(20):
                coll.insert_one({"_id": f"x{i}", "diverged": True})  # w=1
        old, new, _, coll = _old_primary_with_writes_only_it_has(ray, rs, diverge)
        from raymx.client import connect_member
        answers, refusals, stop = [], [], threading.Event()

        def reader():
            conn = None
            while not stop.is_set():
                try:
                    if conn is None or conn.closed:
                        topo = rs._topology()
                        m = next((x for x in topo["members"] if x["id"] == old), None)
                        if m is None:
                            time.sleep(0.01)
                            continue
                        conn = connect_member(m, topo["secret"])
                    answers.append(conn.request(
                        {"op": "count", "ns": "d.c", "filter": {"diverged": True}}, 5)["value"])
                except errors.NotPrimaryOrSecondary:
                    refusals.append(1)
                except (errors.RaymxError, OSError):
                    conn = None
                time.sleep(0.002)
        t = threading.Thread(target=reader)
        t.start()
        try:
            rs.start_member(old)
            wait_until(lambda: answers and answers[-1] == 0 and len(answers) > 20, timeout_s=60)
        finally:
            stop.set()
            t.join(30)
        assert all(a == 0 for a in answers), f"served rolled-back writes: {sorted(set(answers))}"
        assert refusals, "the restarted member never refused a read while recovering"
        assert new != old
    finally:
        rs.shutdown()


def test_a_member_restarted_by_ray_counts_majorities_over_its_configuration(ray_session,
                                                                            tmp_path):
    """nemesis seed 403 (the restart_with_creation_votes bug): Ray restarts a
    killed member process with the arguments it was created with. The
    member launched alone (votes {0: 1}) and grown to 3 must not count a
    majority of one when it is primary again after a restart: with both
    secondaries paused, a w="majority" write times out instead of being
    acknowledged by the primary alone (a write a failover would lose).
    A member added later, restarted, says it votes (not "joining")."""
    import os
    import signal
    ray = ray_session
    rs = raymx.ReplicaSet.launch("growvotes", members=1, data_dir=str(tmp_path))
    try:
        assert rs.wait_for_primary() == 0
        for _ in range(2):
            rs.add_member(progress=False)
        wait_until(lambda: [m.get("votes") for m in rs.status()["members"]] == [1, 1, 1]
                   and not any(m.get("joining") for m in rs.status()["members"]),
                   timeout_s=60)
        coll = rs.client()["d"]["c"]
        coll.insert_one({"_id": "before"}, w="majority")

        def restart(mid):
            m = next(x for x in rs.status()["members"] if x["id"] == mid)
            os.kill(m["pid"], signal.SIGKILL)  # the shard process; Ray starts it again
            wait_until(lambda: (lambda x: x.get("pid") not in (None, m["pid"])
                                and x["state"] == "running")(
                next(x for x in rs.status()["members"] if x["id"] == mid)), timeout_s=90)
        restart(1)
        m1 = next(x for x in rs.status()["members"] if x["id"] == 1)
        assert m1["restarted"] and m1["votes"] == 1 and m1["joining"] is None, m1
        restart(0)
        for _ in range(5):  # the most advanced takes over, the lowest id on a tie: m0
            if rs.wait_for_primary(60) == 0:
                break
            rs.step_down()
        assert rs.wait_for_primary() == 0
        assert next(x for x in rs.status()["members"] if x["id"] == 0)["restarted"]
        coll = rs.client()["d"]["c"]
        coll.insert_one({"_id": "after restart"}, w="majority")
        _pause(ray, rs, [1, 2])
        try:
            with pytest.raises(errors.WriteConcernTimeout):
                coll.insert_one({"_id": "alone"}, w="majority", wtimeout_ms=1500)
        finally:
            _pause(ray, rs, [1, 2], False)
        coll.insert_one({"_id": "resumed"}, w="majority")
    finally:
        rs.shutdown()
