"""The replication cores without Ray: feeder, producer checks, applier, write concern."""
import random

import msgpack
import pytest

from raymx import errors
from raymx.actors.core import replication as rep
from raymx.actors.core.gtid_manager import GTIDManager
from raymx.storage import codec
from raymx.storage.engine import Engine
from raymx.storage.gtid import GTID, ZERO
from raymx.storage.limits import Limits
from raymx.storage.store import MemoryStore

LIM = Limits()


def primary_with(n, store=None, spill=None):
    e = Engine(store or MemoryStore(), LIM if spill is None else Limits(spill_bytes=spill))
    e.set_term(1)
    for i in range(n):
        with e.begin() as tx:
            tx.insert("db.c", [{"_id": i, "v": i}])
            tx.update("db.k", {"_id": "ctr"}, {"$inc": {"n": 1}}, upsert=True)
    return e


def feed(e):
    f = rep.FeederCore(e, LIM)
    f.advance(e.last()[0])
    return f


def test_feeder_ships_in_order_and_secondary_converges():
    p = primary_with(50)
    f = feed(p)
    s = Engine(MemoryStore())
    while True:
        last, h = s.last()
        out = f.pull(list(last), h if last != ZERO else None, 7, 1 << 20)
        assert out["status"] == "ok"
        if not out["rows"]:
            break
        rep.write_batch(s, rep.check_batch(last, h, out["rows"], LIM))
    assert rep.min_unapplied(s) == GTID(1, 1)
    while rep.apply_batch(s, Limits(apply_batch_ops=13), 0)[0]:
        pass
    assert s.snapshot_state() == p.snapshot_state()
    assert [(g, e["h"]) for g, e in s.read_oplog()] == [(g, e["h"]) for g, e in p.read_oplog()]
    assert rep.applied_point(s) == p.last()[0]
    assert s.term == 1  # learned from the entries


@pytest.mark.parametrize("steps", [[3, 3, 3], [20], [2, 17, 1, 9], [40]])
def test_feeder_cache_stays_one_contiguous_run_ending_at_its_limit(steps):
    """Advances by less and by more than the cache holds; spilled entries carry
    their chunks; every pull, from the cache or from LMDB, ships what is stored."""
    p = primary_with(40, spill=64)  # every transaction spills (two ops of ~40 bytes)
    entries = list(p.read_oplog())
    f = rep.FeederCore(p, LIM, cache_entries=8)
    seq = 0
    with p.store.read() as t:
        stored = rep._rows(t, None, None, 1000, 1 << 62)
    assert all(chunks for _, _, chunks in stored)
    for step in steps:
        seq += step
        assert f.advance(entries[seq - 1][0])
        assert f.limit == entries[seq - 1][0]
        keys = [r[0] for r in f.cache]
        assert keys == [r[0] for r in stored[max(0, seq - 8):seq]]
        assert list(f.cache) == stored[max(0, seq - 8):seq]
        for after in range(seq):
            g = entries[after - 1][0] if after else None
            out = f.pull(None if g is None else list(g), None, 1000, 1 << 30)
            assert out["rows"] == stored[after:seq]
    assert not f.advance(entries[seq - 1][0])


def test_feeder_answers_diverged_and_too_stale():
    p = primary_with(5)
    f = feed(p)
    assert f.pull([1, 3], 12345, 10, 1 << 20)["status"] == "diverged"
    # a caller ahead of this oplog (same term, or a newer one) undoes nothing:
    # this source is behind it, not on a newer branch
    assert f.pull([1, 99], None, 10, 1 << 20) == {
        "status": "behind", "last": [1, 5], "reason": "this oplog ends at 1:5, before 1:99"}
    assert f.pull([7, 3], None, 10, 1 << 20)["status"] == "behind"
    # a caller on an older branch than this oplog's end does diverge
    p.set_term(8)
    with p.begin() as tx:
        tx.insert("db.c", [{"_id": "t8"}])
    assert p.last()[0].term == 8
    f.advance(p.last()[0])
    assert f.pull([7, 3], None, 10, 1 << 20)["status"] == "diverged"
    with p.store.write() as t:  # trim the first two entries
        for k, _ in list(t.scan("oplog"))[:2]:
            t.delete("oplog", k)
    out = f.pull([1, 1], None, 10, 1 << 20)
    assert out["status"] == "too_stale" and out["first"] == [1, 3]
    assert f.pull(None, None, 10, 1 << 20)["status"] == "too_stale"


def test_feeder_only_ships_up_to_its_limit_and_a_live_gtid_holds_the_gate():
    p = primary_with(3)
    gm = GTIDManager(1, p.last()[0].seq + 1)
    b = gm.allocate()  # a transaction holding GTID B is still live
    rec = gm.before_sync()
    p.sync()
    rp = gm.after_sync(rec)
    assert rp == b
    f = rep.FeederCore(p, LIM)
    f.advance(GTID(rp.term, rp.seq - 1))
    rows = f.pull([0, 0], None, 100, 1 << 20)["rows"]
    assert [GTID.from_bytes(r[0]).seq for r in rows] == [1, 2, 3]
    gm.done(b)
    assert gm.after_sync(gm.before_sync()) == GTID(1, 5)


def test_spilled_entries_travel_with_their_chunks():
    p = primary_with(0, spill=2048)
    p.insert_many("db.big", [{"_id": i, "pad": "x" * 300} for i in range(40)])
    f = feed(p)
    out = f.pull(None, None, 10, 1 << 20)
    assert len(out["rows"][0][2]) > 3
    s = Engine(MemoryStore())
    rep.write_batch(s, rep.check_batch(ZERO, 0, out["rows"], LIM))
    rep.apply_batch(s, LIM, 0)
    assert s.snapshot_state() == p.snapshot_state()
    assert s.get_meta("next_spill") >= 1


def _rows(n=4):
    p = primary_with(n)
    return feed(p).pull(None, None, 100, 1 << 20)["rows"]


def _entry_with(rows, i, **changes):
    e = codec.unpack(rows[i][1])
    e.update(changes)
    return rows[:i] + [(rows[i][0], msgpack.packb(e), rows[i][2])] + rows[i + 1:]


@pytest.mark.parametrize("spoil", [
    lambda r: r[:1] + r[2:],                                            # a gap
    lambda r: _entry_with(r, 2, h=1),                                   # broken hash chain
    lambda r: r[:2] + [(r[2][0], b"\xc1\xc1garbage", [])] + r[3:],      # malformed msgpack
    lambda r: _entry_with(r, 1, ops=[{"op": "z", "ns": "db.c"}]),       # unknown op
    lambda r: _entry_with(r, 1, ops=[{"op": "i", "ns": "db.c", "post": {"no": "id"}}]),
    lambda r: r[:1] + [(b"short", r[1][1], [])] + r[2:],                 # bad key
])
def test_bad_batches_are_refused_whole_and_nothing_is_written(spoil):
    rows = _rows()
    s = Engine(MemoryStore())
    rep.write_batch(s, rep.check_batch(ZERO, 0, rows[:1], LIM))
    before = (list(s.read_oplog()), s.snapshot_state())
    last, h = s.last()
    with pytest.raises(errors.BatchRefused):
        rep.write_batch(s, rep.check_batch(last, h, spoil(rows)[1:], LIM))
    assert (list(s.read_oplog()), s.snapshot_state()) == before


def test_applier_crash_applies_every_entry_exactly_once():
    """Seeded: crash the secondary (unsynced work lost) between apply batches."""
    for seed in range(5):
        rnd = random.Random(seed)
        p = primary_with(200)
        f = feed(p)
        store = MemoryStore()
        s = Engine(store)
        rows = f.pull(None, None, 10_000, 1 << 30)["rows"]
        rep.write_batch(s, rep.check_batch(ZERO, 0, rows, LIM))
        store.sync()
        lim = Limits(apply_batch_ops=rnd.randrange(3, 40))
        while rep.min_unapplied(s) is not None:
            rep.apply_batch(s, lim, 0)
            if rnd.random() < 0.5:
                store.sync()
            if rnd.random() < 0.3:
                store.crash()  # what was applied but not synced is lost, with its marks
                s = Engine(store)
        assert s.find("db.k", {"_id": "ctr"})[0]["n"] == 200
        assert s.snapshot_state() == p.snapshot_state()


def test_delayed_member_holds_entries_back():
    clock = iter([1000, 2000, 3000])
    p = Engine(MemoryStore(), now_ms=lambda: next(clock))
    for i in range(3):
        p.insert_many("db.c", [{"_id": i}])
    s = Engine(MemoryStore())
    rep.write_batch(s, rep.check_batch(ZERO, 0, feed(p).pull(None, None, 100, 1 << 20)["rows"], LIM))
    assert rep.apply_batch(s, LIM, now_ms=1500, delay_ms=1000)[0] == 0
    assert rep.apply_batch(s, LIM, now_ms=2500, delay_ms=1000)[0] == 1  # only the oldest
    assert rep.apply_batch(s, LIM, now_ms=4000, delay_ms=1000)[0] == 2


def test_commands_are_applied_alone():
    p = primary_with(2)
    with p.begin() as tx:
        tx.create_index("db.c", "v")
    p.insert_many("db.c", [{"_id": 99, "v": 1}])
    s = Engine(MemoryStore())
    rep.write_batch(s, rep.check_batch(ZERO, 0, feed(p).pull(None, None, 100, 1 << 20)["rows"], LIM))
    sizes = []
    while True:
        n = rep.apply_batch(s, LIM, 0)[0]
        if not n:
            break
        sizes.append(n)
    # entry 1 holds the creates (commands), entry 2 inserts, 3 createIndex, 4 insert
    assert sizes == [1, 1, 1, 1]
    assert s.snapshot_state() == p.snapshot_state()


def test_write_concern_counting():
    g = GTID(1, 10)
    votes = {0: 1, 1: 1, 2: 1, 3: 0}
    d = {0: GTID(1, 10), 1: GTID(1, 9), 2: None, 3: GTID(1, 12)}
    assert rep.acknowledged(g, 1, d, votes)
    assert rep.acknowledged(g, 2, d, votes)            # any member counts for a number
    assert not rep.acknowledged(g, "majority", d, votes)  # only voting members count
    d[1] = GTID(1, 10)
    assert rep.acknowledged(g, "majority", d, votes)
    assert rep.majority_count([1, 1, 1, 0]) == 2 and rep.majority_count([1, 1, 1, 1, 1]) == 3


def test_majority_point():
    votes = {0: 1, 1: 1, 2: 1, 3: 0}
    d = {0: GTID(1, 10), 1: GTID(1, 7), 2: GTID(1, 4), 3: GTID(1, 12)}
    assert rep.majority_point(d, votes) == GTID(1, 7)
    d[1] = None
    assert rep.majority_point(d, votes) == GTID(1, 4)
    d[2] = None
    assert rep.majority_point(d, votes) is None


def test_a_primary_commits_only_entries_of_its_own_term():
    """Raft's figure 8 (seed 2697 of the simulation): an entry of an earlier
    term durable on a majority can still be rolled back, so a primary of term
    3 calls nothing committed until an entry of term 3 is on a majority."""
    votes = {0: 1, 1: 1, 2: 1}
    d = {0: GTID(3, 6), 1: GTID(1, 5), 2: GTID(1, 5)}
    assert rep.majority_point(d, votes) == GTID(1, 5)
    assert rep.committed(rep.majority_point(d, votes), 3) is None
    d[1] = GTID(3, 6)
    assert rep.committed(rep.majority_point(d, votes), 3) == GTID(3, 6)
    assert rep.committed(None, 3) is None


def test_rollback_undoes_divergent_entries_and_rejoins():
    p = primary_with(10)
    old = Engine(MemoryStore())
    rows = feed(p).pull(None, None, 100, 1 << 20)["rows"]
    rep.write_batch(old, rep.check_batch(ZERO, 0, rows, LIM), applied=False)
    while rep.apply_batch(old, LIM, 0)[0]:
        pass
    # old primary diverges: it writes under its term what never reached anyone
    old.set_term(1)
    common = old.last()[0]
    with old.begin() as tx:
        tx.insert("db.c", [{"_id": "lost"}])
        tx.update("db.c", {"_id": 3}, {"$set": {"v": "changed"}})
    old.insert_many("db.c", [{"_id": "lost2"}])
    # meanwhile the new primary writes under term 2
    p.set_term(2)
    p.insert_many("db.c", [{"_id": "new"}])
    f = feed(p)
    last, h = old.last()
    assert f.pull(list(last), h, 10, 1 << 20)["status"] == "diverged"
    assert rep.match_common(p, rep.own_hashes(old, None, 100)) == common
    recs = []
    n = rep.rollback_to(old, common, 1000, recs.extend)
    assert n == 2 and {r["op"] for r in recs} == {"i", "u"}
    assert [r["post"]["_id"] for r in recs if r["op"] == "i"] == ["lost2", "lost"]
    last, h = old.last()
    out = f.pull(list(last), h, 10, 1 << 20)
    rep.write_batch(old, rep.check_batch(last, h, out["rows"], LIM))
    while rep.apply_batch(old, LIM, 0)[0]:
        pass
    assert old.snapshot_state() == p.snapshot_state()


def test_rollback_refuses_irreversible_and_too_long():
    e = primary_with(3)
    common = e.last()[0]
    with e.begin() as tx:
        tx.drop_collection("db.c")
    before = e.snapshot_state()
    with pytest.raises(errors.IrreversibleOp):
        rep.rollback_to(e, common, 1000, lambda r: None)
    assert e.snapshot_state() == before and e.last()[0] > common
    e2 = primary_with(30)
    with pytest.raises(errors.IrreversibleOp):
        rep.rollback_to(e2, GTID(1, 2), 10, lambda r: None)


def test_feeder_lingers_on_news_of_the_majority_alone():
    """A pull whose own report moves the majority point waits for new entries
    (one answer carries both) and answers with the point alone only after
    ``majority_linger_ms``; new entries end the wait at once."""
    import threading
    import time

    from raymx.actors.feeder import FeederService
    p = primary_with(3)
    f = FeederService(p, Limits(majority_linger_ms=2000), 0, lambda durable, heard: None,
                      votes={0: 1, 1: 1, 2: 1})
    f.set_primary(True)
    last, h = p.last()

    def pull(member, majority=None):
        t0 = time.monotonic()
        out = f.pull(list(last), h, 100, 1 << 20, 30_000, member, list(last), list(last),
                     None, p.term, majority)
        return out, time.monotonic() - t0

    out, waited = pull(1)  # member 1 holds every entry: the majority moves to ``last``
    assert out["status"] == "ok" and out["rows"] == [] and out["majority"] == list(last)
    assert 2.0 <= waited < 20

    def write_later():
        time.sleep(0.1)
        p.insert_many("db.c", [{"_id": "new"}])
        f.on_limit(p.last()[0])
    threading.Thread(target=write_later).start()
    out, waited = pull(2)  # a majority it has not heard of, and then a new entry
    assert [GTID.from_bytes(r[0]) for r in out["rows"]] == [p.last()[0]]
    assert out["majority"] == list(last) and waited < 1.5
