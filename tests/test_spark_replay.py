"""Parallel replay and snapshot copies with Spark (through RayDP) doing the work."""
import time

import pytest

import raymx
from raymx.spark_bridge import spark_replay
from raymx.storage import codec, replay
from raymx.storage.engine import Engine
from raymx.storage.limits import Limits
from raymx.storage.store import MemoryStore
from tests import workload
from tests.test_initial_sync import Writer, assert_converged
from tests.test_replay import primary, serial
from tests.test_replication import wait_until


@pytest.mark.parametrize("seed", [11, 12])
@pytest.mark.parametrize("cuts", [1, 4])
def test_ranges_planned_apart_and_merged_equal_one_at_a_time_apply(seed, cuts):
    # what the Spark tasks (plan_range per GTID range) and the merge on the
    # member's node compute: the state of applying the entries one at a time,
    # and row for row the single-process plan
    p = primary(seed, 300, command_p=0.05)
    want = workload.state(serial(p))
    s = Engine(MemoryStore())
    workload.ship(p, s)
    entries = list(replay.unapplied_entries(s))
    n = len(entries)
    outs = [spark_replay.plan_range(entries[k * n // cuts:(k + 1) * n // cuts])
            for k in range(cuts)]
    rows = [{"cmds": codec.pack(c), "first_use": codec.pack(
        [[sg, ns, list(o)] for (sg, ns), o in fu.items()])} for _, c, fu, _ in outs]
    commands, cmds, first_use, offsets = spark_replay.combine(rows)
    merged = spark_replay.merge_tables([o[0] for o in outs], offsets).to_pylist()
    assert sum(o[3] for o in outs) == n
    done = replay.done_through(entries[0][0].seq, entries[-1][0].seq, cmds)
    w = replay.SegmentWriter(s, commands, done, first_use, entries[0][0].to_bytes(), 50)
    w.write([replay.Change(r["seg"], r["ns"], r["pk"], (r["seq"], r["i"]),
                           None if r["kind"] == "d" else r["post"]) for r in merged])
    w.close()
    assert workload.state(s) == want
    changes, plan_cmds, _, plan_first_use, *_ = replay.plan(entries)
    assert [(r["seg"], r["ns"], r["pk"], (r["seq"], r["i"])) for r in merged] == \
        [(c.segment, c.ns, c.pk, c.order) for c in changes]
    assert [c.order for c in commands] == [c.order for c in plan_cmds]
    assert first_use == plan_first_use


def test_far_behind_member_replays_with_spark_then_tails(spark, ray_session, tmp_path):
    rs = raymx.ReplicaSet.launch("sprep", members=2, data_dir=str(tmp_path))
    try:
        c = rs.client()
        coll = c["app"]["k"]
        coll.create_index("v")
        applier = ray_session.get_actor("sprep/m1/applier", namespace="raymx")
        ray_session.get(applier.pause.remote(True))
        for i in range(0, 600, 50):
            coll.insert_many([{"_id": j, "v": j % 7} for j in range(i, i + 50)])
            coll.update_many({"v": i % 7}, {"$inc": {"n": 1}})
            coll.delete_many({"_id": {"$lt": i // 3}})
        coll.create_index("n")
        coll.insert_one({"_id": "after-index", "n": 5})
        last = GTID_of(rs, 0)
        wait_until(lambda: GTID_of(rs, 1, "last") >= last)  # written, not applied
        assert rs.status_of(1)["applied"][1] < last[1]
        out = spark_replay.spark_replay(spark, rs, 1, entries_per_read=10)
        assert out["entries"] >= 30 and out["last"] == last
        w = Writer(rs, "t")  # normal tailing resumes
        time.sleep(1)
        w.finish()
        assert_converged(ray_session, rs, 1)
    finally:
        rs.shutdown()


def GTID_of(rs, m, what="last"):
    from raymx.storage.gtid import GTID
    return GTID(*rs.status_of(m)[what])


def test_snapshot_member_creation_as_a_spark_job(spark, ray_session, tmp_path):
    # a low replay threshold: what is committed during the copy is a Spark replay too
    rs = raymx.ReplicaSet.launch("spsnap", members=1, data_dir=str(tmp_path),
                                 limits=Limits(replay_entries_min=20))
    try:
        c = rs.client()
        c["app"]["users"].create_index("age")
        c["app"]["users"].insert_many([{"_id": j, "age": j % 50, "doc": {"a": [j, "x"]}}
                                       for j in range(2000)])
        w = Writer(rs, "s")
        try:
            mid = rs.add_member(initial_sync="snapshot", spark=spark, progress=False)
        finally:
            w.finish()
        assert assert_converged(ray_session, rs, mid)[1] > 1
        st = {m["id"]: m for m in rs.status()["members"]}
        assert st[mid]["state"] == "running" and st[mid]["votes"] == 1
        w = Writer(rs, "r")
        try:
            time.sleep(0.3)
            out = rs.resync_member(mid, spark=spark, progress=False)
        finally:
            w.finish()
        assert out["via"] == "spark"
        assert out["replay"] is not None and out["replay"]["entries"] >= 20, out
        assert assert_converged(ray_session, rs, mid)[1] > 1
        # nothing written meanwhile: every partition was read by a Spark task
        # from the source's own files (none from the snapshot's process)
        out = rs.resync_member(mid, spark=spark, progress=False)
        assert out["phases"]["unproven_parts"] == 0 and out["parts"] >= 2, out
        assert assert_converged(ray_session, rs, mid)[1] > 1
    finally:
        rs.shutdown()
