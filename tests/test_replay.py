"""Parallel replay (explode, last image per document, segments at commands) gives
exactly the state that applying the entries one at a time gives."""
import pytest

from raymx.actors.core import replication as rep
from raymx.storage import replay
from raymx.storage.engine import Engine
from raymx.storage.gtid import GTID
from raymx.storage.limits import Limits
from raymx.storage.lmdb_store import LMDBStore
from raymx.storage.store import MemoryStore
from tests import workload

ONE = Limits(apply_batch_ops=1)  # the applier, one entry per transaction


def primary(seed, entries, **kw):
    e = Engine(MemoryStore())
    e.set_term(1)
    assert workload.run(e, seed, entries, **kw) > entries // 2
    return e


def serial(p, store=None):
    s = Engine(store or MemoryStore())
    workload.ship(p, s)
    while rep.apply_batch(s, ONE, 0)[0]:
        pass
    return s


@pytest.mark.parametrize("seed", range(12))
def test_replay_equals_one_at_a_time_on_random_workloads(seed):
    p = primary(seed, 300, command_p=0.05)
    s1 = serial(p)
    s2 = Engine(MemoryStore())
    workload.ship(p, s2)
    n, written, last = replay.replay_unapplied(s2, txn_docs_max=7)  # tiny txns: chunking too
    assert last == p.last()[0] and n == p.last()[0].seq
    assert written < sum(len(e["ops"]) for _, e in p.read_oplog())  # dedupe did something
    assert workload.state(s2) == workload.state(s1)
    assert workload.state(s2)["state"] == workload.state(p)["state"]
    assert workload.state(s2)["unapplied"] == []


def test_replay_of_a_later_range_after_serial_apply_and_on_lmdb(tmp_path):
    p = primary(99, 400, command_p=0.04)
    s1 = serial(p, LMDBStore(str(tmp_path / "s1")))
    s2 = Engine(LMDBStore(str(tmp_path / "s2")))
    workload.ship(p, s2)
    for _ in range(50):  # the first 50 entries one at a time, the rest replayed
        rep.apply_batch(s2, ONE, 0)
    assert s2.applied_point().seq == 50
    n, _, last = replay.replay_unapplied(s2, txn_docs_max=10_000, max_entries=100)
    assert n == 100 and s2.applied_point() == last
    replay.replay_unapplied(s2, txn_docs_max=10_000)
    assert workload.state(s2) == workload.state(s1)


def test_segments_split_at_commands_and_mark_entries_when_complete():
    p = Engine(MemoryStore())
    p.set_term(1)
    p.insert_many("db.a", [{"_id": 1, "v": 1}])           # 1: create + insert
    with p.begin() as tx:                                 # 2: update, index, update
        tx.update("db.a", {"_id": 1}, {"$set": {"v": 2}})
        tx.create_index("db.a", "v")
        tx.update("db.a", {"_id": 1}, {"$set": {"v": 3}})
    p.insert_many("db.a", [{"_id": 2, "v": 9}])           # 3
    with p.begin() as tx:                                 # 4: ends with a command
        tx.insert("db.a", [{"_id": 3}])
        tx.create_index("db.a", "w")
    entries = [(g, e["ops"]) for g, e in p.read_oplog()]
    changes, commands, done, first_use, *_ = replay.plan(entries)
    assert [c.op["cmd"] for c in commands] == ["create", "createIndex", "createIndex"]
    # segment 1: the insert and the first update (deduplicated to the update)
    assert [(c.segment, c.order) for c in changes] == [(1, (2, 0)), (2, (2, 2)), (2, (3, 0)),
                                                       (2, (4, 0))]
    # entry 2 is complete after segment 2 (its second update); entry 4 too, since its
    # command closes segment 2; segment 0 (before the create) completes no entry
    assert done == {1: 1, 2: 4, 3: 4}
    assert first_use == {(1, "db.a"): (1, 1), (2, "db.a"): (2, 2)}
    s = Engine(MemoryStore())
    workload.ship(p, s)
    replay.replay_unapplied(s, 100)
    assert s.find("db.a", {"v": 3}) == [{"_id": 1, "v": 3}]
    assert workload.state(s) == workload.state(p)


def test_a_replay_interrupted_between_transactions_gives_the_same_state():
    """Writes of a big segment commit in several transactions and the marks go
    with the last: replaying again after a crash in between is exact."""
    p = primary(7, 200, command_p=0.0, nss=("db.a",))
    want = workload.state(serial(p))
    s = Engine(MemoryStore())
    workload.ship(p, s)
    entries = list(replay.unapplied_entries(s))
    changes, commands, done, first_use, *_ = replay.plan(entries)
    calls = []
    real_begin = s.begin

    def failing_begin(*a, **kw):
        calls.append(1)
        if len(calls) == 4:  # the create barrier and two chunks of writes commit first
            raise RuntimeError("crash")
        return real_begin(*a, **kw)
    s.begin = failing_begin
    w = replay.SegmentWriter(s, commands, done, first_use, entries[0][0].to_bytes(), 5)
    with pytest.raises(RuntimeError):
        w.write(changes)
        w.close()
    s.begin = real_begin
    assert len(workload.state(s)["unapplied"]) == len(entries)  # nothing marked yet
    replay.replay_unapplied(s, 5)
    assert workload.state(s) == want


def test_the_applier_replays_in_parallel_only_when_far_behind():
    p = primary(3, 300, command_p=0.03)
    want = workload.state(serial(p))
    lim = Limits(replay_entries_min=50, replay_entries_max=60)
    s = Engine(MemoryStore())
    workload.ship(p, s)
    modes = []
    while True:
        n, _, _, mode = rep.apply_step(s, lim, 0)
        if not n:
            break
        modes.append(mode)
    # 60 entries per replay round while more than 50 are behind, then batches
    assert modes[0] == "replay" and modes[-1] == "batch"
    assert modes == sorted(modes, reverse=True)  # every replay before any batch
    assert workload.state(s) == want
    # a delayed member never replays (it must hold young entries back)
    s2 = Engine(MemoryStore())
    workload.ship(p, s2)
    assert rep.apply_step(s2, lim, 0, delay_ms=1)[3] == "batch"


@pytest.mark.parametrize("seed", range(4))
def test_the_row_steps_spark_runs_agree_with_the_streaming_plan(seed):
    """explode_entry -> segment_of/last_images/first_uses/done_through (what the
    Spark job computes, row by row and in any order) equals the one-pass plan."""
    import random
    p = primary(100 + seed, 200, command_p=0.06)
    entries = [(g, e["ops"]) for g, e in p.read_oplog()]
    changes, commands, done, first_use, *_ = replay.plan(entries)
    rows = [r for g, ops in entries for r in replay.explode_entry(g.seq, ops)]
    random.Random(seed).shuffle(rows)  # Spark gives no order
    cmds = sorted((r[0], r[1], r[6]) for r in rows if r[2] == "c")
    orders = [c[:2] for c in cmds]
    assert replay.last_images(rows, orders) == changes
    assert replay.first_uses(rows, orders) == first_use
    assert replay.done_through(entries[0][0].seq, entries[-1][0].seq, cmds) == done
    assert [c.order for c in commands] == orders
