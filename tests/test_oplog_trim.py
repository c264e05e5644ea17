"""Oplog trimming in the storage layer and the pure bound: small transactions,
spilled chunks with their entries, an oplog that starts mid-chain."""
import pytest

from raymx.actors.core import replication as rep
from raymx.storage.engine import Engine
from raymx.storage.gtid import GTID, ZERO
from raymx.storage.limits import Limits
from raymx.storage.lmdb_store import LMDBStore
from raymx.storage.store import MemoryStore

LIM = Limits()


def fill(e, n, size=200, start=0):
    for i in range(start, start + n):
        with e.begin() as tx:
            tx.insert("db.c", [{"_id": i, "pad": "x" * size}])


def test_trim_by_size_in_batches_from_the_front(engine):
    engine.set_term(1)
    fill(engine, 300)
    info = engine.oplog_info()
    assert info["entries"] == 300 and info["first"] == GTID(1, 1)
    cap = info["bytes"] // 3
    r = engine.trim_oplog(None, cap, None, 50)
    assert r.trimmed == 50 and r.more and r.first == GTID(1, 51)
    while r.more:
        r = engine.trim_oplog(None, cap, None, 50)
        assert r.trimmed <= 50
    info = engine.oplog_info()
    assert info["bytes"] <= cap + 50 * 300 + 8192  # the cap plus at most one batch (and a page)
    assert info["first"] == r.first and info["last"] == GTID(1, 300)
    assert engine.range().first == r.first
    assert engine.verify_oplog() == info["entries"]  # mid-chain: the first entry is the base
    # the data is untouched; writes continue the chain
    assert engine.count("db.c") == 300
    fill(engine, 5, start=300)
    assert engine.verify_oplog() == info["entries"] + 5


def test_trim_never_passes_keep_from_nor_drops_the_last_entry(engine):
    engine.set_term(1)
    fill(engine, 40)
    r = engine.trim_oplog(GTID(1, 11), 1, None, 1000)
    assert r.held and r.trimmed == 10 and r.first == GTID(1, 11)
    r = engine.trim_oplog(None, 1, None, 1000)  # cap of 1 byte: keeps the last entry
    assert not r.held and r.first == GTID(1, 40) and engine.oplog_info()["entries"] == 1
    fill(engine, 1, start=40)
    assert engine.last()[0] == GTID(1, 41) and engine.verify_oplog() == 2


def test_trim_by_age(engine):
    now = [1_000_000]
    e = Engine(engine.store, now_ms=lambda: now[0])
    e.set_term(1)
    for i in range(10):
        now[0] += 1000
        fill(e, 1, start=i)
    # entries at 1,001,000 .. 1,010,000; keep the last 3.5 s
    r = e.trim_oplog(None, None, 3500, 100, now_ms=now[0])
    assert r.trimmed == 6 and r.first == GTID(1, 7)
    assert e.trim_oplog(None, None, None, 100).trimmed == 0  # no cap: nothing


def test_spilled_chunks_go_with_their_entry():
    e = Engine(MemoryStore(), Limits(spill_bytes=1000))
    e.set_term(1)
    with e.begin() as tx:
        tx.insert("db.big", [{"_id": i, "pad": "y" * 300} for i in range(20)])
    fill(e, 5)
    with e.store.read() as t:
        assert t.db_stat("oplog.refs")[0] > 1
    e.trim_oplog(None, 1, None, 1)
    with e.store.read() as t:
        assert t.db_stat("oplog.refs")[0] == 0
    assert e.verify_oplog() == 5


def test_trim_drops_term_boundaries_below_the_first_entry(engine):
    for term in (1, 2, 3):
        engine.set_term(term)
        fill(engine, 5, start=term * 10)
    assert [t for t, _ in engine.range().terms] == [1, 2, 3]
    engine.trim_oplog(None, 1, None, 7)
    r = engine.range()
    assert r.first == GTID(2, 8) and [t for t, _ in r.terms] == [2, 3]


def test_mid_chain_oplog_after_restart_feeder_and_producer(tmp_path):
    """An oplog that starts mid-chain (trimmed, or a snapshot member's): the
    range rebuilt at start-up, verify_oplog and the feeder take its first
    entry as the base; a member seeded mid-chain replicates on from it."""
    path = str(tmp_path / "a")
    e = Engine(LMDBStore(path, map_bytes=1 << 28), LIM)
    e.set_term(1)
    fill(e, 100)
    while e.trim_oplog(GTID(1, 51), 1, None, 20).more:
        pass
    e.store.close()
    e = Engine(LMDBStore(path, map_bytes=1 << 28), LIM)  # start-up: range from the oplog
    r = e.range()
    assert r.first == GTID(1, 51) and r.last == GTID(1, 100) and e.verify_oplog() == 50
    f = rep.FeederCore(e, LIM)
    f.advance(e.last()[0])
    h60 = dict(e.read_oplog(GTID(1, 59), 1))[GTID(1, 60)]["h"]
    out = f.pull([1, 60], h60, 1000, 1 << 20)
    assert out["status"] == "ok" and len(out["rows"]) == 40
    assert f.pull([1, 10], None, 10, 1 << 20) == {"status": "too_stale", "first": [1, 51]}
    assert f.pull(None, None, 10, 1 << 20)["status"] == "too_stale"
    # a member whose oplog starts mid-chain (seeded with the source's stored bytes)
    s = Engine(MemoryStore(), LIM)
    with e.store.read() as t, s.store.write() as w:
        for k, v in t.scan("oplog", GTID(1, 51).to_bytes(), GTID(1, 61).to_bytes()):
            w.put("oplog", k, v)
    s._tail = None
    assert s.verify_oplog() == 10 and s.range().first == GTID(1, 51)
    last, h = s.last()
    rows = f.pull(list(last), h, 1000, 1 << 20)["rows"]
    rep.write_batch(s, rep.check_batch(last, h, rows, LIM), applied=True)
    assert s.verify_oplog() == 50 and s.last()[0] == GTID(1, 100)
    e.store.close()


def test_trim_bound_pure():
    maj = GTID(1, 50)
    hb = {1: 1000, 2: 0}
    durable = {0: GTID(1, 90), 1: GTID(1, 40), 2: GTID(1, 10)}
    # member 2 was not heard from (stopped): not waited for; member 1 runs behind
    g, why = rep.trim_bound(maj, GTID(1, 90), durable, hb, 1200, 600, 0)
    assert g == GTID(1, 40) and why == "member 1 at 1:40"
    g, why = rep.trim_bound(maj, GTID(1, 90), {}, {}, 1200, 600, 0)
    assert g == maj and "majority" in why
    g, why = rep.trim_bound(None, GTID(1, 90), {}, {}, 1200, 600, 0)
    assert g == ZERO  # majority unknown: keep everything
    # forced: only the applier holds it (an unapplied entry is never dropped)
    g, why = rep.trim_bound(maj, GTID(1, 30), durable, hb, 1200, 600, 0, force=True)
    assert g == GTID(1, 30) and "applier" in why
    # a member loading a snapshot taken at 1:20 holds it until it pulls from there
    # (a resynced member's old position, 1:10, does not count) or the hold expires
    holds = {2: (GTID(1, 20), 5000)}
    g, why = rep.trim_bound(maj, GTID(1, 90), durable, hb, 1200, 600, 0, holds=holds)
    assert g == GTID(1, 20) and why == "member 2 loading a snapshot at 1:20"
    g, why = rep.trim_bound(maj, GTID(1, 90), {**durable, 2: GTID(1, 25)}, hb, 1200, 600,
                            0, holds=holds)
    assert g == GTID(1, 40)  # it pulled: released
    g, why = rep.trim_bound(maj, GTID(1, 90), durable, hb, 6000, 600, 0, holds=holds)
    assert g == maj  # expired (and member 1 not heard from lately)
    g, why = rep.trim_bound(maj, GTID(1, 90), durable, hb, 1200, 600, 0, force=True, holds=holds)
    assert g == GTID(1, 90)  # forced: only the applier


@pytest.mark.parametrize("n", [3])
def test_feeder_majority_from_validated_positions(n):
    p = Engine(MemoryStore(), LIM)
    p.set_term(1)
    fill(p, 10)
    f = rep.FeederCore(p, LIM)
    f.advance(p.last()[0])
    f.votes = {i: 1 for i in range(n)}
    assert f.committed_point(0, True) is None  # nobody proved a position yet
    f.validated[1] = GTID(1, 6)
    assert f.committed_point(0, True) == GTID(1, 6)
    f.validated[2] = GTID(1, 99)  # not on this branch: ignored
    assert f.committed_point(0, True) == GTID(1, 6)
    assert f.committed_point(0, False) is None  # a secondary vouches only for what it learned
    f.upstream_majority = GTID(1, 3)
    assert f.committed_point(0, False) == GTID(1, 3) and f.committed_point(0, True) == GTID(1, 6)
