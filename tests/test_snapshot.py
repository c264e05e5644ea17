"""Consistent snapshots, checksummed bulk-load into a new member, and an oplog
that starts at the snapshot's GTID and continues the hash chain."""
import pytest

from raymx import errors
from raymx.actors.core import replication as rep
from raymx.storage import codec, snapshot
from raymx.storage.engine import Engine
from raymx.storage.gtid import GTID
from raymx.storage.limits import Limits
from raymx.storage.lmdb_store import LMDBStore
from raymx.storage.store import MemoryStore
from tests import workload


def lmdb_engine(tmp_path, name, **kw):
    return Engine(LMDBStore(str(tmp_path / name), map_bytes=1 << 30), Limits(**kw))


def primary(tmp_path, seed=1, entries=300, **kw):
    e = lmdb_engine(tmp_path, "p", **kw)
    e.set_term(1)
    workload.run(e, seed, entries)
    return e


def catch_up(source, target):
    workload.ship(source, target)
    while rep.apply_batch(target, Limits(), 0)[0]:
        pass


def test_copy_then_replication_continues_from_the_snapshot_gtid(tmp_path):
    p = primary(tmp_path)
    with p.begin() as tx:
        tx.create_index("db.a", "v")
    t = lmdb_engine(tmp_path, "t")
    g = snapshot.copy_local(p, t, rows_per_part=7)
    assert g == p.last()[0]
    assert workload.state(t)["state"] == workload.state(p)["state"]
    assert workload.state(t)["catalog"] == workload.state(p)["catalog"]
    # the oplog starts mid-chain: one entry, the snapshot's, applied
    assert t.range().first == g and t.range().last == g and t.applied_point() == g
    assert t.last() == p.last()
    assert snapshot.initial_sync_state(t) is None
    # a feeder accepts the new member's after/after_h; the chain verifies from there
    workload.run(p, 2, 200)
    catch_up(p, t)
    assert workload.state(t)["state"] == workload.state(p)["state"]
    assert t.verify_oplog() == p.last()[0].seq - g.seq + 1
    assert t.get_meta("next_id") == p.get_meta("next_id")
    # and a member downstream of it that has nothing must resync, not start at 1
    f = rep.FeederCore(t, Limits())
    f.advance(t.last()[0])
    assert f.pull(None, None, 10, 1 << 20)["status"] == "too_stale"


def test_snapshot_is_consistent_while_writes_continue(tmp_path):
    p = primary(tmp_path)
    s = snapshot.Snapshot(p, rows_per_part=10)
    want = workload.state(p)["state"]
    workload.run(p, 3, 100)  # committed after the snapshot: must not be in it
    t = lmdb_engine(tmp_path, "t")
    info = s.info()
    snapshot.begin_load(t, info)
    assert snapshot.initial_sync_state(t)["gtid"] == info["gtid"]
    sums = {}
    for part in reversed(s.parts):  # any order: runs append or merge
        rows, sums[part.index] = s.read(part)
        snapshot.load_rows(t, part.db, rows)
    s.close()
    snapshot.finish_load(t, info, sums)
    assert workload.state(t)["state"] == want
    catch_up(p, t)
    assert workload.state(t)["state"] == workload.state(p)["state"]


def test_snapshot_of_a_secondary_is_at_its_applied_point(tmp_path):
    p = primary(tmp_path)
    sec = lmdb_engine(tmp_path, "s")
    workload.ship(p, sec)
    for _ in range(40):
        rep.apply_batch(sec, Limits(apply_batch_ops=1), 0)
    applied = sec.applied_point()
    assert applied.seq == 40 and sec.last()[0] > applied
    t = lmdb_engine(tmp_path, "t")
    assert snapshot.copy_local(sec, t) == applied
    ref = Engine(MemoryStore())  # the state after exactly 40 entries
    workload.ship(p, ref)
    for _ in range(40):
        rep.apply_batch(ref, Limits(apply_batch_ops=1), 0)
    assert workload.state(t)["state"] == workload.state(ref)["state"]
    catch_up(sec, t)  # from the secondary: chained, starting after its applied point
    catch_up(p, sec)
    assert workload.state(t)["state"] == workload.state(p)["state"]


def test_a_spilled_entry_at_the_snapshot_point_travels_with_its_chunks(tmp_path):
    p = primary(tmp_path, entries=20, spill_bytes=2000)
    p.insert_many("db.big", [{"_id": i, "s": "z" * 100} for i in range(100)])
    with p.store.read() as t:
        assert "ref" in codec.unpack(t.last("oplog")[1])
    t = lmdb_engine(tmp_path, "t")
    snapshot.copy_local(p, t)
    workload.run(p, 4, 50)
    catch_up(p, t)
    assert t.verify_oplog() > 1
    assert workload.state(t)["state"] == workload.state(p)["state"]


def test_a_corrupted_copy_is_caught_by_the_partition_checksums(tmp_path):
    p = primary(tmp_path)
    t = lmdb_engine(tmp_path, "t")
    with snapshot.Snapshot(p, rows_per_part=20) as s:
        info = s.info()
        snapshot.begin_load(t, info)
        sums = {}
        for part in s.parts:
            rows, sums[part.index] = s.read(part)
            if part.index == 1:
                rows = codec.unpack_rows(rows)[:-1]  # a lost row
            snapshot.load_rows(t, part.db, rows)
    with pytest.raises(errors.CorruptEntry, match="partition 1"):
        snapshot.finish_load(t, info, sums)
    assert snapshot.initial_sync_state(t) is not None  # still marked: not a member yet
    assert t.last()[0].seq == 0


@pytest.mark.parametrize("damage", ["none", "lost row", "changed value"])
def test_runs_checksummed_as_loaded_match_the_source_or_are_refused(tmp_path, damage):
    """The Ray path: each partition arrives as one run and is checksummed as
    loaded (no read-back); a run that is not the source's is refused."""
    p = primary(tmp_path)
    t = lmdb_engine(tmp_path, "t")
    with snapshot.Snapshot(p, rows_per_part=20) as s:
        info = s.info()
        snapshot.begin_load(t, info)
        sums, loaded = {}, {}
        for part in s.parts:
            run, sums[part.index] = s.read(part)
            if part.index == 1 and damage != "none":
                rows = codec.unpack_rows(run)
                rows = rows[:-1] if damage == "lost row" else \
                    [(k, v + b"\x00") if i == 0 else (k, v) for i, (k, v) in enumerate(rows)]
                run = codec.pack_rows(rows)
            loaded[part.index] = snapshot.load_run(t, part.db, run)
    if damage == "none":
        snapshot.finish_load(t, info, sums, loaded)
        assert workload.state(t)["state"] == workload.state(p)["state"]
        return
    with pytest.raises(errors.CorruptEntry, match="partition 1"):
        snapshot.finish_load(t, info, sums, loaded)
    assert snapshot.initial_sync_state(t) is not None


def test_load_refuses_a_folder_with_data_and_unsorted_runs(tmp_path):
    p = primary(tmp_path, entries=30)
    with snapshot.Snapshot(p, 1000) as s:
        info = s.info()
    with pytest.raises(errors.InvalidOperation, match="empty member folder"):
        snapshot.begin_load(p, info)
    t = lmdb_engine(tmp_path, "t")
    snapshot.begin_load(t, info)
    with pytest.raises(ValueError):
        snapshot.load_rows(t, "docs", [(b"\x00\x00\x00\x09b", b"\x80"), (b"\x00\x00\x00\x09a",
                                                                         b"\x80")])
    with pytest.raises(errors.InvalidOperation):
        snapshot.load_rows(t, "oplog", [])


def test_rollback_never_reaches_before_the_first_entry_of_a_snapshot_member(tmp_path):
    p = primary(tmp_path, entries=50)
    t = lmdb_engine(tmp_path, "t")
    g = snapshot.copy_local(p, t)
    workload.run(p, 5, 20)
    catch_up(p, t)
    assert rep.rollback_to(t, GTID(g.term, g.seq + 3), 10**6, lambda r: None) > 0
    with pytest.raises(errors.IrreversibleOp, match="needs a resync"):
        rep.rollback_to(t, GTID(g.term, g.seq - 1), 10**6, lambda r: None)


def test_a_hot_copy_joins_from_its_repl_info_point(tmp_path):
    p = primary(tmp_path, entries=200)
    sec = lmdb_engine(tmp_path, "s")
    workload.ship(p, sec)
    for _ in range(30):
        rep.apply_batch(sec, Limits(apply_batch_ops=1), 0)
    rep.write_repl_info(sec, None)  # replInfo says 31 is the first unapplied
    for _ in range(20):  # applied after replInfo was written: the copy re-applies them
        rep.apply_batch(sec, Limits(apply_batch_ops=1), 0)
    sec.put_meta("member_id", 1)
    g = snapshot.backup(sec, str(tmp_path / "backup"))
    assert g.seq == 50
    with pytest.raises(errors.InvalidOperation, match="not empty"):
        snapshot.backup(sec, str(tmp_path / "backup"))
    c = lmdb_engine(tmp_path, "backup")
    assert snapshot.adopt_copy(c).seq == 31
    assert c.get_meta("member_id") is None and c.applied_point().seq == 30
    workload.run(p, 6, 50)
    catch_up(p, c)  # skips the GTIDs it has, re-applies 31.. from their images
    assert workload.state(c)["state"] == workload.state(p)["state"]
    assert c.verify_oplog() == p.last()[0].seq


def test_spark_tasks_read_as_of_the_snapshot_only_what_they_prove_unchanged(tmp_path):
    # a Spark copy task reads a partition from its own, later transaction: it
    # may only if no entry after the snapshot's GTID touches the partition's
    # keys (copy_tasks.touched_since/unchanged); then its rows are exactly
    # the snapshot's (same checksum)
    from raymx.spark_bridge import copy_tasks
    p = lmdb_engine(tmp_path, "p")
    p.set_term(1)
    with p.begin() as tx:
        tx.create_index("db.a", "v")
    with p.begin() as tx:
        tx.insert("db.a", [{"_id": i, "v": i % 5} for i in range(100)])
    with p.begin() as tx:
        tx.insert("db.b", [{"_id": i} for i in range(100)])
    snap = snapshot.Snapshot(p, rows_per_part=10)
    info = snap.info()
    want = {x.index: snap.read(x)[1] for x in snap.parts}
    with p.begin() as tx:  # after the snapshot: one document of db.a changes
        tx.update("db.a", {"_id": 95}, {"$set": {"v": 7}})
    g = GTID(*info["gtid"])
    with p.store.read() as t:
        touched = copy_tasks.touched_since(p, t, g, info["entry"])
        proven = [x for x in snap.parts if copy_tasks.unchanged(x, touched)]
        for x in proven:
            assert snapshot.read_run(t, x)[1] == want[x.index]
        unproven = {x.index for x in snap.parts} - {x.index for x in proven}
        # db.a's docs partition holding _id 95 and every partition of db.a's index
        assert [x.db for x in snap.parts if x.index in unproven].count("docs") == 1
        assert all(x.index in unproven for x in snap.parts if x.db == "index")
        assert len(proven) == 19
        changed = [x for x in snap.parts if x.index in unproven
                   and snapshot.read_run(t, x)[1] != want[x.index]]
        assert changed  # reading those as stored would have copied the wrong rows
        with pytest.raises(errors.Diverged):  # the entry at G is not the planned one
            copy_tasks.touched_since(p, t, g, b"other bytes")
    with p.begin() as tx:  # a command since the snapshot (an implicit create): nothing
        tx.insert("db.c", [{"_id": "new"}])  # is proven
    with p.store.read() as t:
        touched = copy_tasks.touched_since(p, t, g, info["entry"])
        assert touched is None
        assert not any(copy_tasks.unchanged(x, touched) for x in snap.parts)
    snap.close()
