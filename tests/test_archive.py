"""The oplog archive (DESIGN section 9): its pure decisions, then a running
replica set that archives before it trims, reads change streams and
``read_changes`` through the archive, and holds trimming while the archive
cannot be written."""
import json
import os
import time

import pytest

import raymx
from raymx import errors
from raymx.storage import archive as A
from raymx.storage.changes import Filter
from raymx.storage.gtid import GTID, ZERO
from raymx.storage.limits import Limits

from tests.test_replication import wait_until


# --- pure decisions -------------------------------------------------------------
def idx_with(*ranges, term=1):
    idx = A.empty_index()
    for f, la in ranges:
        idx = A.append(idx, GTID(term, f), GTID(term, la), la - f + 1,
                       A.segment_name(GTID(term, f), GTID(term, la)), term)
    return idx


def test_segment_names_sort_in_gtid_order_and_parse_back():
    a = A.segment_name(GTID(1, 9), GTID(2, 120))
    b = A.segment_name(GTID(2, 121), GTID(3, 1000))
    assert sorted([b, a]) == [a, b]
    assert A.parse_name(a) == (GTID(1, 9), GTID(2, 120))
    assert A.parse_name("_index.json") is None and A.parse_name(".tmp-x") is None
    assert not a.startswith(("_", "."))  # Spark's file sources read it


def test_trimming_keeps_everything_after_the_archive():
    assert A.trim_keep_from(A.empty_index())[0] == ZERO  # nothing archived: keep all
    keep, why = A.trim_keep_from(idx_with((1, 10), (11, 30)))
    assert keep == GTID(1, 31) and "1:30" in why
    # an entry of a later term right after it is kept too (GTID order is (term, seq))
    assert GTID(2, 31) >= keep and GTID(1, 30) < keep


def test_what_to_archive_next():
    idx = idx_with((1, 10))
    now = 100_000
    # only majority-committed entries, starting right after the index
    assert A.next_segment(idx, GTID(1, 1), GTID(1, 10), now - 5000, now, 1000, False) is None
    assert A.next_segment(idx, GTID(1, 1), GTID(2, 25), now - 5000, now, 1000, False) == (
        GTID(1, 10), 25)
    # not due yet: young, few, trimming not waiting
    assert A.next_segment(idx, GTID(1, 1), GTID(2, 25), now - 10, now, 1000, False) is None
    assert A.next_segment(idx, GTID(1, 1), GTID(2, 25), now - 10, now, 1000, True) == (
        GTID(1, 10), 25)
    # a whole segment pending is due at once, and segments are capped
    assert A.next_segment(idx, GTID(1, 1), GTID(2, 500), now, now, 1000, False, 100) == (
        GTID(1, 10), 110)
    # an empty archive starts at the first live entry; no majority: nothing
    assert A.next_segment(A.empty_index(), GTID(1, 40), GTID(1, 50), 0, now, 1000, False) == (
        None, 50)
    assert A.next_segment(A.empty_index(), GTID(1, 40), None, 0, now, 1000, False) is None
    # the oplog was trimmed past the archive (it was off): continue at the live
    # oplog, and the index records the gap
    assert A.next_segment(idx, GTID(1, 40), GTID(1, 50), 0, now, 1000, False) == (None, 50)
    assert A.append(idx, GTID(1, 40), GTID(1, 50), 11, "x", 1)["gaps"] == [[10, 40]]


def test_the_index_refuses_a_deposed_primary_and_an_overlap():
    idx = idx_with((1, 10), term=3)
    with pytest.raises(errors.ArchiveError, match="term 3"):
        A.append(idx, GTID(2, 11), GTID(2, 20), 10, "x", 2)
    with pytest.raises(errors.ArchiveError, match="already holds"):
        A.append(idx, GTID(3, 5), GTID(3, 20), 10, "x", 3)
    new = A.append(idx, GTID(4, 11), GTID(4, 20), 10, "y", 4)
    assert new["term"] == 4 and A.through(new) == GTID(4, 20)
    assert A.parse_index(A.dump_index(new)) == new
    with pytest.raises(errors.ArchiveError, match="overlaps"):
        bad = json.loads(A.dump_index(new))
        bad["segments"][1]["first"] = [4, 5]
        A.parse_index(json.dumps(bad))
    with pytest.raises(errors.ArchiveError, match="not JSON"):
        A.parse_index("{")


def test_an_unrecorded_segment_is_adopted_not_written_again():
    names = [A.segment_name(GTID(1, 11), GTID(1, 20)), A.segment_name(GTID(1, 11), GTID(1, 30)),
             A.segment_name(GTID(1, 1), GTID(1, 10)), "_index.json"]
    assert A.adoptable(names, 11) == (GTID(1, 11), GTID(1, 30), names[1])
    assert A.adoptable(names, 31) is None


def test_segments_a_reader_needs_and_history_lost():
    idx = idx_with((5, 10), (11, 30))
    assert [s["first"][1] for s in A.segments_after(idx, (1, 4))] == [5, 11]
    assert [s["first"][1] for s in A.segments_after(idx, (1, 12))] == [11]
    assert [s["first"][1] for s in A.segments_after(idx, (1, 12, 0))] == [11]
    assert A.segments_after(idx, (1, 30)) == []  # the live oplog has the rest
    with pytest.raises(errors.OplogTrimmed, match="starts at 1:5"):
        A.segments_after(idx, (1, 3))


def test_rows_back_into_events_with_a_split_entry():
    rows = [{"term": 1, "seq": s, "idx": i, "ts": 5_000_000, "op": "i", "ns": "d.c",
             "_id": str(s), "pre": None, "post": json.dumps({"_id": s, "b": {"$binary": "AAE="}}),
             "cmd": None} for s in (5, 6) for i in (0, 1)]
    rows.append({"term": 1, "seq": 7, "idx": 0, "ts": 6_000_000, "op": "c", "ns": "d.c",
                 "_id": None, "pre": None, "post": None,
                 "cmd": json.dumps({"cmd": "createIndex", "name": "b_1",
                                    "spec": {"key": [["b", 1]]}})})
    ev, resume, done = A.row_events(rows, (1, 5, 0), None, Filter(), 2, GTID(1, 8))
    assert [e["token"] for e in ev] == [[1, 5, 1], [1, 6, 0]] and not done
    assert resume == [1, 6, 0] and ev[0]["post"]["b"] == b"\x00\x01" and ev[0]["ts"] == 5000
    ev, resume, done = A.row_events(rows, tuple(resume), None, Filter(), 10, GTID(1, 8))
    assert [e["op"] for e in ev] == ["insert", "createIndex"] and done and resume == [1, 8]
    assert ev[1]["index"] == {"name": "b_1", "key": [["b", 1]]}
    # a slice of a segment: after its last row, op by op
    ev, resume, done = A.row_events(rows[:3], (1, 4), None, Filter(), 10, GTID(1, 8), more=True)
    assert len(ev) == 3 and resume == [1, 6, 0] and not done
    ev, resume, done = A.row_events(rows[3:], tuple(resume), None, Filter(), 10, GTID(1, 8))
    assert [e["token"] for e in ev] == [[1, 6, 1], [1, 7, 0]] and done and resume == [1, 8]
    # a gate inside the segment stops there
    ev, resume, done = A.row_events(rows, (1, 4), GTID(1, 5), Filter(), 10, GTID(1, 8))
    assert len(ev) == 2 and resume == [1, 5] and done


def test_replacements_survive_the_archive_and_old_segments_read_as_updates(tmp_path):
    """Rows carry the op's replace flag (``replace``); a segment written before
    that column existed reads with it null: its updates stay updates."""
    import pyarrow.parquet as pq

    from raymx.spark_bridge import convert
    pre, post = {"_id": 1, "a": 1}, {"_id": 1, "b": 2}
    entries = [(GTID(1, 5).to_bytes(), 5_000, [
        {"op": "u", "ns": "d.c", "pre": pre, "post": post, "r": True},
        {"op": "u", "ns": "d.c", "pre": post, "post": pre},
        {"op": "c", "ns": "d.c", "cmd": "create"}])]
    tb = convert.changes_rows(entries)
    assert tb.column("replace").to_pylist() == [True, None, None]
    pq.write_table(tb, tmp_path / "new.parquet")
    pq.write_table(tb.drop_columns(["replace"]), tmp_path / "old.parquet")
    for name, kinds in (("new", ["replace", "update"]), ("old", ["update", "update"])):
        ev = _events_read_back(tmp_path / f"{name}.parquet", GTID(1, 5))
        assert [e["op"] for e in ev[:2]] == kinds and ev[0]["post"] == post


def _events_read_back(path, last: GTID) -> list:
    """The events of the segment file ``path`` as a stream reads them (its
    table as ``read_segment`` gives it, in ``CHANGES_SCHEMA``)."""
    from raymx.actors.archiving import read_segment
    from raymx.spark_bridge import convert
    got = read_segment(None, str(path.parent), {"file": path.name})
    assert got.schema == convert.CHANGES_SCHEMA
    rows = got.drop_columns(["ts"]).to_pylist()
    for r in rows:
        r["ts"] = 5_000_000
    return A.row_events(rows, (1, 4), None, Filter(), 10, last)[0]


def test_a_transactions_archived_changes_carry_its_session(tmp_path):
    """Rows of a driver transaction's entry carry its ``lsid`` and
    ``txn_number`` (from its committed session record, as the live stream
    finds them), and its archived events name the session as live ones do;
    other rows, and a segment written before those columns, carry none."""
    import pyarrow.parquet as pq

    from raymx.spark_bridge import convert
    lsid = bytes(range(16))
    rec = {"_id": lsid, "n": 7, "committed": True}
    entries = [(GTID(1, 5).to_bytes(), 5_000, [
        {"op": "i", "ns": "d.c", "post": {"_id": 1}},
        {"op": "i", "ns": "config.transactions", "post": rec}]),
        (GTID(1, 6).to_bytes(), 6_000, [{"op": "i", "ns": "d.c", "post": {"_id": 2}}])]
    tb = convert.changes_rows(entries)
    assert tb.column("lsid").to_pylist() == [lsid, lsid, None]
    assert tb.column("txn_number").to_pylist() == [7, 7, None]
    pq.write_table(tb, tmp_path / "new.parquet")
    pq.write_table(tb.drop_columns(["lsid", "txn_number"]), tmp_path / "old.parquet")
    for name, session in (("new", [lsid, 7]), ("old", None)):
        ev = _events_read_back(tmp_path / f"{name}.parquet", GTID(1, 6))
        assert [e["_id"] for e in ev] == [1, 2]  # the session record is no event
        assert ev[0].get("session") == session and "session" not in ev[1]


# --- a running replica set ------------------------------------------------------
LIM = Limits(trim_interval_ms=100, trim_batch_entries=200)


def _archive_files(path):
    return sorted(n for n in os.listdir(path) if n.startswith("seg-"))


def test_a_time_is_found_past_segments_of_no_ops_only(tmp_path):
    """A segment of a new term's no-op entries only has no rows, so no commit
    times: finding where a time starts in the archive (a wire change stream's
    ``startAtOperationTime``) passes over it instead of failing (it raised a
    TypeError, an InternalError to pymongo), and an archive that starts at
    seq 1 with one is no lost history."""
    import pyarrow.parquet as pq

    from raymx.actors.archiving import Archive
    from raymx.spark_bridge import convert
    noop = [{"op": "n"}]
    ins = lambda i: [{"op": "i", "ns": "d.c", "post": {"_id": i}}]  # noqa: E731
    runs = [[(1, 1000, noop)], [(2, 2000, ins(1)), (3, 3000, ins(2))], [(4, 4000, noop)],
            [(5, 5000, ins(3))]]
    idx = A.empty_index()
    for run in runs:
        first, last = GTID(1, run[0][0]), GTID(1, run[-1][0])
        tb = convert.changes_rows([(GTID(1, s).to_bytes(), ms, ops) for s, ms, ops in run])
        name = A.segment_name(first, last)
        pq.write_table(tb, tmp_path / name)
        idx = A.append(idx, first, last, tb.num_rows, name, 1)
    assert [s["rows"] for s in idx["segments"]] == [0, 2, 0, 1]
    (tmp_path / A.INDEX).write_bytes(A.dump_index(idx))
    arch = Archive({"uri": str(tmp_path)})
    assert [arch.at(ms) for ms in (500, 2000, 2500, 3500, 5000)] == \
        [GTID(1, 2), GTID(1, 2), GTID(1, 3), GTID(1, 5), GTID(1, 5)]
    assert arch.at(6000) is None


def test_a_replica_set_archives_before_it_trims_and_streams_read_through(
        ray_session, tmp_path):
    arch = tmp_path / "archive"
    rs = raymx.ReplicaSet.launch("arch1", members=3, data_dir=str(tmp_path / "rs"), limits=LIM,
                                 oplog_cap={"max_bytes": None})
    try:
        rs.set_archive(str(arch), lag_s=0.2)
        c = rs.client(w="majority")
        coll = c["a"]["c"]
        before_s = int(time.time())  # a wall-clock time before the first write
        start = coll.insert_one({"_id": "first"}).gtid
        for i in range(30):  # 3,000 ops: a stream reads a segment a slice at a time
            coll.insert_many([{"_id": i * 100 + k, "pad": "x" * 200} for k in range(100)])
        last = coll.insert_one({"_id": "last"}).gtid
        rs.set_oplog_cap(max_bytes=64 * 1024)   # small: most entries go
        wait_until(lambda: all((m["oplog"]["first"] or [0, 0])[1] > start.seq + 5
                               for m in rs.status()["members"]), timeout_s=30)
        st = rs.status()
        for m in st["members"]:  # nobody trimmed past what the archive holds
            ar = m["oplog"]["archive"]
            assert ar["error"] is None and ar["through"][1] >= m["oplog"]["first"][1] - 1
        assert _archive_files(arch) and "oplog archive" in raymx.replset.format_status(st)
        idx = A.parse_index((arch / A.INDEX).read_bytes())
        assert A.oldest(idx).seq <= start.seq and A.through(idx).seq >= last.seq
        # a stream from before the live oplog reads the archive, then the live
        # oplog, seamlessly: every op once, in order
        with coll.watch(after=[0, 0], ops=["insert"]) as s:
            seen = []
            coll.insert_one({"_id": "tail"})
            deadline = time.time() + 30
            while (not seen or seen[-1] != "tail") and time.time() < deadline:
                ev = s.try_next()
                if ev is not None:
                    seen.append(ev["_id"])
        assert seen == ["first"] + list(range(3000)) + ["last", "tail"]
        # a stream from a wall-clock time older than the live oplog (as
        # MongoDB's connectors start one) starts in the archive too
        import bson
        import pymongo
        pc = pymongo.MongoClient(rs.mongodb_uri(), serverSelectionTimeoutMS=30_000)
        with pc.a.c.watch(start_at_operation_time=bson.Timestamp(before_s, 0),
                          max_await_time_ms=500) as st:
            got = [st.next()["documentKey"]["_id"] for _ in range(3)]
        assert got == ["first", 0, 1]
        pc.close()
        # the archive survives a member restart of the primary too (its config)
        assert rs.archive_location()["uri"] == str(arch)
    finally:
        rs.shutdown()


def test_an_archive_that_cannot_be_written_holds_trimming_and_shows_in_status(
        ray_session, tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder")
    rs = raymx.ReplicaSet.launch("arch2", members=1, data_dir=str(tmp_path / "rs"), limits=LIM,
                                 oplog_cap={"max_bytes": 32 * 1024,
                                            "archive": str(blocker / "archive")})
    try:
        coll = rs.client(w="majority")["a"]["c"]
        first = coll.insert_one({"_id": "first"}).gtid
        for i in range(20):
            coll.insert_many([{"_id": i * 10 + k, "pad": "x" * 200} for k in range(10)])
        rs.trim_now()
        time.sleep(0.5)
        st = rs.status()
        ol = st["members"][0]["oplog"]
        assert ol["archive"]["error"] and ol["first"][1] <= first.seq  # nothing trimmed
        assert ol["over_cap"] and "archive" in ol["held_by"]
        text = raymx.replset.format_status(st)
        assert "cannot be written" in text and "nothing is lost" in text
        # fixed: the archive catches up, then trimming goes on
        blocker.unlink()
        wait_until(lambda: (rs.status()["members"][0]["oplog"]["first"] or [0, 0])[1]
                   > first.seq, timeout_s=30)
        ol = rs.status()["members"][0]["oplog"]
        assert ol["archive"]["error"] is None
        idx = A.parse_index((blocker / "archive" / A.INDEX).read_bytes())
        assert A.oldest(idx).seq <= first.seq
        with coll.watch(after=[0, 0], ops=["insert"]) as s:
            assert next(iter(s))["_id"] == "first"
        with pytest.raises(errors.ConfigError, match="lag_s"):
            rs.set_archive(str(tmp_path / "x"), lag_s=-1)
    finally:
        rs.shutdown()


def test_raymx_archive_sets_shows_and_stops_it(replset, tmp_path):
    from click.testing import CliRunner

    from raymx.cli import main
    r = CliRunner().invoke(main, ["archive", replset.name])
    assert r.exit_code == 0 and "no oplog archive" in r.output
    g = replset.client(w="majority")["a"]["b"].insert_one({"_id": 1}).gtid
    r = CliRunner().invoke(main, ["archive", replset.name, str(tmp_path / "a"), "--lag-s", "0.1"])
    assert r.exit_code == 0 and str(tmp_path / "a") in r.output, r.output
    wait_until(lambda: f"{g.term}:{g.seq} in 1 segments" in CliRunner().invoke(
        main, ["archive", replset.name]).output, timeout_s=30)
    r = CliRunner().invoke(main, ["archive", replset.name, "--off"])
    assert r.exit_code == 0 and "no oplog archive" in r.output
    r = CliRunner().invoke(main, ["archive", replset.name, "nosuchfs://x/y"])
    assert r.exit_code == 1 and "pyarrow.fs" in r.output


def test_history_trimmed_before_the_archive_began_is_reported_lost(ray_session, tmp_path):
    from raymx.spark_bridge.archive_io import stream_changes
    rs = raymx.ReplicaSet.launch("arch3", members=1, data_dir=str(tmp_path / "rs"), limits=LIM,
                                 oplog_cap={"max_bytes": 32 * 1024})
    try:
        coll = rs.client(w="majority")["a"]["c"]
        for i in range(20):
            coll.insert_many([{"_id": i * 10 + k, "pad": "x" * 200} for k in range(10)])
        wait_until(lambda: rs.trim_now()[0]["first"][1] > 5, timeout_s=30)
        rs.set_archive(str(tmp_path / "a"), lag_s=0.1)
        g = coll.insert_one({"_id": "after"}).gtid
        wait_until(lambda: (rs.status()["members"][0]["oplog"]["archive"]["through"]
                            or [0, 0])[1] >= g.seq, timeout_s=30)
        with pytest.raises(errors.OplogTrimmed, match="older than the oplog and its archive"):
            with coll.watch(after=[1, 1]) as s:
                s.try_next()
        with pytest.raises(errors.OplogTrimmed, match="which starts at"):
            stream_changes(None, rs, after=[1, 1])
        with pytest.raises(errors.InvalidInput, match="no oplog archive"):
            rs.set_archive(None)
            stream_changes(None, rs, after=[1, 1])
    finally:
        rs.shutdown()
