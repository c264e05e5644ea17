"""Trimming on a running replica set: within the cap under a writer, in small
transactions, held at the majority point, and a stopped member told too_stale."""
import threading
import time

import pytest

import raymx
from raymx import errors
from raymx.storage.gtid import GTID
from raymx.storage.limits import Limits

from tests.test_replication import wait_until

BATCH = 40
LIM = Limits(trim_interval_ms=100, trim_batch_entries=BATCH)
CAP = 256 * 1024
DOC = "p" * 1000
ROUNDS = 3 * CAP // (len(DOC) + 100)  # inserts that go round the cap three times


def oplogs(rs):
    return {m["id"]: m.get("oplog") for m in rs.status()["members"]}


def test_trimming_under_a_writer_stays_within_the_cap(ray_session, tmp_path):
    rs = raymx.ReplicaSet.launch("trim1", members=3, data_dir=str(tmp_path), limits=LIM,
                                 oplog_cap={"max_bytes": CAP})
    try:
        c = rs.client()
        coll = c["t"]["c"]
        # every member pulling before the writer starts: a member whose first
        # pull comes after the tiny cap has been passed is not held for (it has
        # no position yet) and would need a resync, not trim
        coll.insert_one({"_id": "first"}, w=3, wtimeout_ms=60_000)
        stop = threading.Event()
        lat, n = [], [0]

        def writer():
            while not stop.is_set() and n[0] < 3000:
                t0 = time.perf_counter()
                coll.insert_one({"_id": n[0], "pad": DOC})
                lat.append(time.perf_counter() - t0)
                n[0] += 1
        t = threading.Thread(target=writer)
        t.start()
        peak, t0 = 0, time.time()
        # at least 6 s and until the oplog has gone round its cap a few times
        # (a count, not a time: a loaded CI machine wrote 180 in 6 s once);
        # a minute at most
        try:
            while time.time() - t0 < 60 and (time.time() - t0 < 6 or n[0] <= ROUNDS):
                peak = max(peak, oplogs(rs)[0]["bytes"])
                time.sleep(0.2)
        finally:
            stop.set()
            t.join()
        assert n[0] > ROUNDS, n[0]  # the oplog went round its cap several times
        # while the writer runs, the primary's oplog stays within its cap plus a
        # trim batch and a couple of seconds of writes (a trim pass every
        # trim_interval_ms, held at the majority point, on a loaded machine);
        # untrimmed it would hold every write (several times the cap)
        entry = len(DOC) + 100
        per_s = n[0] / (time.time() - t0) * entry
        assert peak <= CAP + BATCH * entry + 2 * per_s, (peak, CAP, per_s)
        # every member trims to the cap once its entries are applied and
        # majority-committed (meanwhile status says what holds it)
        seen = []

        def settled():
            o = oplogs(rs)
            seen[:] = [o]
            return all(not x["over_cap"] for x in o.values()) and o
        try:
            o = wait_until(settled, timeout_s=120)
        except AssertionError:
            raise AssertionError(f"still over the cap: {seen}") from None
        for m, st in o.items():
            assert st["trimmed"] > 0 and st["first"][1] > 1, (m, st)
            assert st["max_trim_txn_entries"] <= BATCH  # small transactions only
            assert st["trim_txns"] >= st["trimmed"] / BATCH
            assert st["bytes"] <= CAP and st["window_s"] is not None and st["held_by"] is None
        assert o[0]["trim_txns"] > 3
        assert coll.count_documents({}) == n[0] + 1  # trimming never touches the data
        print(f"inserts {n[0]}, peak oplog {peak} B (cap {CAP}), max write "
              f"{max(lat) * 1000:.1f} ms, max trim txn {o[0]['max_trim_txn_ms']} ms")
    finally:
        rs.shutdown()


def test_trimming_is_held_at_the_majority_point_and_a_stopped_member_is_too_stale(
        ray_session, tmp_path):
    import ray
    rs = raymx.ReplicaSet.launch("trim2", members=3, data_dir=str(tmp_path), limits=LIM,
                                 oplog_cap={"max_bytes": None})
    try:
        c = rs.client(w=3, wtimeout_ms=10_000)
        coll = c["t"]["c"]
        coll.insert_many([{"_id": i, "pad": DOC} for i in range(50)])
        rs.kill_member(2)  # a stopped secondary
        prod1 = ray.get_actor("trim2/m1/producer", namespace="raymx")
        ray.get(prod1.pause.remote(True, wait=True))  # and one that does not move
        c1 = rs.client(w=1)
        for i in range(50, 400):
            c1["t"]["c"].insert_one({"_id": i, "pad": DOC})
        rs.set_oplog_cap(max_bytes=CAP)
        st = rs.trim_now()[0]
        assert st["over_cap"] and st["held_by"] is not None, st
        held = GTID(*st["first"])
        assert held <= GTID(*st["majority"]) and held.seq <= 51
        # the held state shows in the table
        assert "held by" in raymx.replset.format_status(rs.status())
        # the stalled member moves again: majority advances, trimming follows
        ray.get(prod1.pause.remote(False))
        wait_until(lambda: (lambda s: not s["over_cap"] and s["held_by"] is None and s)(
            rs.trim_now()[0]), timeout_s=30)
        # the stopped member comes back: its position is gone, it must resync
        rs.start_member(2)
        wait_until(lambda: rs.status()["members"][2]["state"] == "resync", timeout_s=30)
        m2 = rs.status()["members"][2]
        assert "trimmed" in (m2.get("error") or "") or "too_stale" in (m2.get("error") or "")
    finally:
        rs.shutdown()


def test_a_member_loading_a_snapshot_is_not_trimmed_past(ray_session, tmp_path):
    """A tiny cap and a writer: without the hold, the primary would trim past the
    snapshot's GTID while the new member starts and loads, and it would come up
    too stale. The copy holds that GTID on every member until the member pulls."""
    rs = raymx.ReplicaSet.launch("trim3", members=2, data_dir=str(tmp_path), limits=LIM,
                                 oplog_cap={"max_bytes": 32 * 1024})
    try:
        coll = rs.client()["t"]["s"]
        coll.insert_many([{"_id": f"a{i}", "pad": DOC} for i in range(200)])
        # a copy that fails lifts its hold at once (it would keep the whole oplog)
        with pytest.raises(errors.ConfigError, match="no member 9"):
            rs.add_member(initial_sync="snapshot", source=9, progress=False)
        import ray
        tr = ray.get(rs.member(0).trim_now.remote())
        assert "loading" not in (tr["held_by"] or ""), tr
        stop, n = threading.Event(), [0]

        def writer():
            while not stop.is_set():
                coll.insert_one({"_id": n[0], "pad": DOC})
                n[0] += 1
        t = threading.Thread(target=writer)
        t.start()
        try:
            time.sleep(0.5)
            try:
                mid = rs.add_member(initial_sync="snapshot", progress=False, timeout_s=60)
            except errors.RaymxError as e:  # say where the new member stands
                import ray
                prod = ray.get_actor("trim3/m2/producer", namespace="raymx")
                raise AssertionError(f"{e}; {rs.status()['members'][-1]}; "
                                     f"producer {ray.get(prod.status.remote())}") from None
            n_at = n[0]
            wait_until(lambda: n[0] > n_at + 50, timeout_s=30)
        finally:
            stop.set()
            t.join()
        st = {m["id"]: m for m in rs.status()["members"]}
        assert st[mid]["state"] == "running", st[mid]
        assert st[0]["oplog"]["trimmed"] > 0  # trimming ran all along
        # trimmed: a new member cannot replicate the whole oplog, and is not
        # left trying (it would come up too stale); "auto" takes a snapshot
        with pytest.raises(errors.ConfigError, match="cannot replicate the whole oplog"):
            rs.add_member(initial_sync="oplog", progress=False)
        assert [m["id"] for m in rs.config()["members"]] == [0, 1, mid]
        assert rs._oplog_or_snapshot("auto", None) == "snapshot"
        wait_until(lambda: rs.status_of(mid)["applied"] == rs.status_of(0)["last"], timeout_s=60)
        assert rs.client(read_preference="secondary")["t"]["s"].count_documents({}) == 200 + n[0]
        wait_until(lambda: all(not m["oplog"]["held_by"] or "loading" not in m["oplog"]["held_by"]
                               for m in rs.status()["members"]), timeout_s=30)
    finally:
        rs.shutdown()
