"""The shard service's write path without Ray or sockets: real LMDB, injected
disk failures, a member taking over as primary."""
import threading
import time

import lmdb
import pytest

from raymx.actors.shard import ShardService
from raymx.storage import lmdb_store
from raymx.storage.engine import Engine
from raymx.storage.gtid import GTID
from raymx.storage.limits import Limits
from raymx.storage.lmdb_store import LMDBStore
from tests.port_helpers import busy_writer


@pytest.fixture
def member(tmp_path):
    made = []

    def make(**kw):
        lim = Limits(sync_interval_ms=kw.pop("sync_interval_ms", 20))
        e = Engine(LMDBStore(str(tmp_path / f"m{len(made)}"), map_bytes=1 << 28), lim)
        svc = ShardService(e, lim, **kw)
        made.append((svc, e))
        return svc, e
    yield make
    for svc, e in made:
        svc.close()
        e.store.close()


def ask(svc, req, timeout=10):
    """One request through handle(); the answer with the durable point when it came."""
    ev, out = threading.Event(), {}

    def reply(ok=None, err=None):
        out.update(ok=ok, err=err, durable=svc.group.durable)
        ev.set()
    svc.handle(req, reply, {})
    assert ev.wait(timeout), f"no answer to {req}"
    return out


@pytest.fixture
def failing_disk(monkeypatch):
    """The next ``n`` top-level write commits fail as a full disk would."""
    left = {"n": 0}
    real = lmdb_store._Txn.commit

    def commit(self):
        if self._parent is None and self._write and left["n"] > 0:
            left["n"] -= 1
            self.abort()  # as LMDB aborts a failed commit (and the log lock goes)
            raise lmdb.DiskError("injected: no space left on device")
        return real(self)
    monkeypatch.setattr(lmdb_store._Txn, "commit", commit)
    return left


def test_a_failed_commit_whose_n_entry_fails_too_is_written_before_the_next_write(
        member, failing_disk):
    """The GTID a failed commit took stays live (nothing past it becomes
    replicatable) until its n entry is written; while the disk fails, later
    writes are refused whole; once it works, the oplog is dense again."""
    svc, e = member()
    assert ask(svc, {"op": "insert", "ns": "a.b", "docs": [{"_id": 1}]})["ok"]
    failing_disk["n"] = 3  # the commit, its n entry, and the next write's first try
    r = ask(svc, {"op": "insert", "ns": "a.b", "docs": [{"_id": 2}]})
    assert "no space" in str(r["err"])
    r = ask(svc, {"op": "insert", "ns": "a.b", "docs": [{"_id": 3}]})
    assert "oplog cannot be written" in str(r["err"]) and "nothing was written" in str(r["err"])
    svc.group.sync_now()
    assert svc.gm.replicatable() <= GTID(0, 2)  # never past the unwritten 0:2
    r = ask(svc, {"op": "insert", "ns": "a.b", "docs": [{"_id": 4}]})  # the disk works again
    assert r["ok"]["gtid"] == [0, 3]
    assert e.verify_oplog() == 3
    assert [op["op"] for g, ent in e.read_oplog() for op in ent["ops"]] == ["c", "i", "n", "i"]
    assert e.find("a.b", {}) == [{"_id": 1}, {"_id": 4}]


def test_a_deposed_primary_never_writes_the_n_entries_it_held(member, failing_disk):
    """The n entry of a failed commit waits for a disk with room; if the
    member steps down first, it is dropped, never written: a secondary's
    oplog grows only by its sync source's entries (written after its
    position was confirmed, it was served to majority reads until a pull
    found it diverged: simulation seed 1235)."""
    svc, e = member()
    assert ask(svc, {"op": "insert", "ns": "a.b", "docs": [{"_id": 1}]})["ok"]
    failing_disk["n"] = 2  # the commit and its n entry
    assert "no space" in str(ask(svc, {"op": "insert", "ns": "a.b", "docs": [{"_id": 2}]})["err"])
    assert svc._unwritten == [GTID(0, 2)]
    svc.step_down()
    svc.on_writer(lambda: None).result(5)  # the writer ran items since (the step-down's too)
    assert svc._unwritten == [] and e.last()[0] == GTID(0, 1) and e.verify_oplog() == 1
    assert ask(svc, {"op": "insert", "ns": "a.b", "docs": [{"_id": 3}]})["err"].__class__.__name__ == "NotPrimary"


def test_a_step_down_waits_for_the_write_that_passed_its_check(member, monkeypatch):
    """A write that found the member primary commits before ``step_down``
    returns (its entry is in the oplog before the producer follows anyone,
    so a divergence is found by the first pull); the next one is refused."""
    svc, e = member()
    assert ask(svc, {"op": "insert", "ns": "a.b", "docs": [{"_id": 1}]})["ok"]
    checked, go = threading.Event(), threading.Event()
    real = ShardService._deposed

    def slow_deposed(self, tx=None):
        err = real(self, tx)
        if tx is not None and not checked.is_set():
            checked.set()
            assert go.wait(5)
        return err
    monkeypatch.setattr(ShardService, "_deposed", slow_deposed)
    out = {}
    writer = threading.Thread(target=lambda: out.update(
        ask(svc, {"op": "insert", "ns": "a.b", "docs": [{"_id": 2}]})))
    writer.start()
    assert checked.wait(5)
    stepped = threading.Event()
    threading.Thread(target=lambda: (svc.step_down(), stepped.set()), daemon=True).start()
    time.sleep(0.2)
    assert not stepped.is_set() and svc.primary  # waiting for the write in progress
    go.set()
    assert stepped.wait(5)
    assert e.last()[0] == GTID(0, 2)  # committed before the step-down returned
    writer.join(5)
    assert out["ok"]["gtid"] == [0, 2]
    assert ask(svc, {"op": "insert", "ns": "a.b", "docs": [{"_id": 3}]})["err"].__class__.__name__ == "NotPrimary"


def test_a_failed_group_commit_with_a_failed_n_entry_keeps_the_writer(member, failing_disk):
    svc, e = member()
    assert ask(svc, {"op": "insert", "ns": "a.b", "docs": [{"_id": 1}]})["ok"]
    blocker = busy_writer(svc)
    outs, evs = [], []
    for k in (2, 3):  # queued together: one group, one commit
        ev, out = threading.Event(), {}
        svc.handle({"op": "insert", "ns": "a.b", "docs": [{"_id": k}]},
                   lambda ok=None, err=None, out=out, ev=ev: (out.update(ok=ok, err=err),
                                                              ev.set()), {})
        outs.append(out)
        evs.append(ev)
    failing_disk["n"] = 2  # the group's commit and the first n entry
    blocker.set()
    assert all(ev.wait(5) for ev in evs) and all(o["err"] for o in outs)
    assert all(t.is_alive() for t in svc._threads)  # the writer (and the trimmer)
    blocker = busy_writer(svc)  # the writer thread still runs writes, after the n entries
    ev, out = threading.Event(), {}
    svc.handle({"op": "insert", "ns": "a.b", "docs": [{"_id": 4}]},
               lambda ok=None, err=None: (out.update(ok=ok, err=err), ev.set()), {})
    blocker.set()
    assert ev.wait(5) and out["ok"]["gtid"] == [0, 4]
    assert e.verify_oplog() == 4


def test_an_unchanging_durable_write_waits_for_what_it_saw(member):
    """An update that changes nothing, with j=True, is answered once the last
    commit (which it may have read) is durable, as MongoDB waits for the last
    optime; nothing committed: answered at once."""
    svc, e = member(sync_interval_ms=60_000)
    r = ask(svc, {"op": "update", "ns": "a.b", "filter": {"_id": 1}, "update": {"$set": {"x": 1}},
                  "j": True})
    assert r["ok"]["matched"] == 0
    a = ask(svc, {"op": "insert", "ns": "a.b", "docs": [{"_id": 1, "x": 1}]})
    assert a["durable"] is None or a["durable"] < GTID(*a["ok"]["gtid"])
    b = ask(svc, {"op": "update", "ns": "a.b", "filter": {"_id": 1}, "update": {"$set": {"x": 1}},
                  "j": True})
    assert b["ok"]["modified"] == 0 and b["ok"]["gtid"] is None
    assert b["durable"] >= GTID(*a["ok"]["gtid"])
    blocker = busy_writer(svc)  # the same inside a write group
    ask_async = []
    for req in ({"op": "insert", "ns": "a.b", "docs": [{"_id": 2}]},
                {"op": "update", "ns": "a.b", "filter": {"_id": 1}, "update": {"$set": {"x": 1}},
                 "j": True}):
        ev, out = threading.Event(), {}
        svc.handle(req, lambda ok=None, err=None, out=out, ev=ev: (
            out.update(ok=ok, err=err, durable=svc.group.durable), ev.set()), {})
        ask_async.append((ev, out))
    blocker.set()
    (ev1, ins), (ev2, upd) = ask_async
    assert ev1.wait(5) and ev2.wait(5)
    assert upd["ok"]["modified"] == 0 and upd["durable"] >= GTID(*ins["ok"]["gtid"])


def test_a_member_becoming_primary_syncs_only_when_something_is_new(member):
    """A secondary that wrote entries (as its producer does) becomes primary:
    its syncer then rests while nothing is committed, and it closes at once."""
    svc, e = member(primary=False, votes={0: 1, 1: 1, 2: 1}, sync_interval_ms=100)
    for i in range(5):
        e.insert_many("a.b", [{"_id": i}])
    e.set_term(1)
    svc.become_primary(1)
    assert svc.group.durable == svc.group.committed == e.last()[0]
    syncs = svc.group.syncs
    t0 = time.process_time()
    time.sleep(0.5)
    assert svc.group.syncs == syncs
    assert time.process_time() - t0 < 0.25  # the syncer waits, it does not spin
    r = ask(svc, {"op": "insert", "ns": "a.b", "docs": [{"_id": "new"}], "j": True})
    assert r["ok"]["gtid"] == [1, 6] and r["durable"] >= GTID(1, 6)
    t0 = time.monotonic()
    svc.close()
    assert time.monotonic() - t0 < 2 and not svc.group._t.is_alive()


def test_a_failed_sync_stops_the_member_and_is_never_retried(member):
    """Issue 20 (fsyncgate): a failed fsync is final. The durable write it
    covered is not acknowledged, the shell's on_fatal runs once (it ends the
    process), later writes are refused, and no later sync is allowed to
    'succeed' over pages the kernel may have dropped."""
    from raymx import errors
    fatal = []
    svc, e = member(on_fatal=fatal.append)
    assert ask(svc, {"op": "insert", "ns": "a.b", "docs": [{"_id": 1}], "j": True})["ok"]
    wal = e.store._ent.wal  # a sync is one fdatasync of the write-ahead log

    class FailingOnce:
        calls = 0
        real = wal.sync

        @staticmethod
        def sync():
            FailingOnce.calls += 1
            if FailingOnce.calls == 1:
                raise OSError(5, "injected: Input/output error (EIO)")
            return FailingOnce.real()
    wal.sync = FailingOnce.sync
    try:
        r = ask(svc, {"op": "insert", "ns": "a.b", "docs": [{"_id": 2}], "j": True})
        assert isinstance(r["err"], errors.DiskFailed) and "EIO" in str(r["err"])
        assert len(fatal) == 1 and isinstance(fatal[0], errors.DiskFailed)
        r = ask(svc, {"op": "insert", "ns": "a.b", "docs": [{"_id": 3}]})
        assert isinstance(r["err"], errors.DiskFailed)
        with pytest.raises(errors.DiskFailed, match="earlier sync failed"):
            e.store.sync()  # the disk "works" again: still no sync
        assert FailingOnce.calls == 1
        assert svc.group.durable == GTID(0, 1) and len(fatal) == 1
    finally:
        del wal.sync


def test_a_linearizable_read_whose_no_op_cannot_be_written_in_time_says_so(member):
    """A linearizable read writes a no-op to confirm its primacy; when the
    writer cannot take it in time (held by a long write or a stuck disk) the
    read is answered ReadConcernTimeout, not an internal error (seen under
    the nemesis), and the member serves the next read once the writer is free."""
    svc, e = member(primary=True, votes={0: 1})
    e.set_term(1)
    svc.become_primary(1)
    assert ask(svc, {"op": "insert", "ns": "a.b", "docs": [{"_id": 1}]})["err"] is None
    blocker = busy_writer(svc)
    try:
        r = ask(svc, {"op": "find", "ns": "a.b", "filter": {"_id": 1},
                      "readConcern": "linearizable", "read_timeout_ms": 200})
        assert type(r["err"]).__name__ == "ReadConcernTimeout", r
        assert "no-op" in str(r["err"])
    finally:
        blocker.set()
    r = ask(svc, {"op": "find", "ns": "a.b", "filter": {"_id": 1},
                  "readConcern": "linearizable", "read_timeout_ms": 5000})
    assert r["err"] is None and r["ok"]["docs"] == [{"_id": 1}], r


def test_a_linearizable_read_holds_no_snapshot_while_its_primacy_is_confirmed(member):
    """A linearizable read answers after a majority confirms its primary (a
    no-op write), which may take seconds under faults. Its LMDB snapshot is
    let go before that wait: held, it kept a remap of a growing map out for
    as long (the nemesis's small-map runs refused writes for it)."""
    svc, e = member(primary=True, votes={0: 1})
    e.set_term(1)
    svc.become_primary(1)
    assert ask(svc, {"op": "insert", "ns": "a.b", "docs": [{"_id": 1}]})["err"] is None
    confirming, real = threading.Event(), svc.confirm_primary
    svc.confirm_primary = lambda *a, **k: (confirming.set(), real(*a, **k))[1]
    blocker = busy_writer(svc)  # the no-op waits behind it
    out = {}
    t = threading.Thread(target=lambda: out.update(ask(svc, {
        "op": "find", "ns": "a.b", "filter": {"_id": 1}, "readConcern": "linearizable",
        "read_timeout_ms": 3000})))
    try:
        t.start()
        assert confirming.wait(5)
        time.sleep(0.2)
        assert not out, "answered before its no-op was written"
        assert e.store._ent.live() == 0, "a snapshot stays open while the read waits"
    finally:
        blocker.set()
        t.join(10)
    assert out["err"] is None and out["ok"]["docs"] == [{"_id": 1}], out


def test_the_n_entry_of_a_failed_write_becomes_durable_with_no_write_after_it(
        member, failing_disk):
    """While every later write fails (a full disk), the n entry that took a
    failed write's GTID must still be synced, so it ships: before, nothing
    told the group commit about it, and the primary held an entry no other
    member could get."""
    svc, e = member()
    assert ask(svc, {"op": "insert", "ns": "a.b", "docs": [{"_id": 1}]})["ok"]
    failing_disk["n"] = 1  # the commit; its n entry is written
    assert "no space" in str(ask(svc, {"op": "insert", "ns": "a.b", "docs": [{"_id": 2}]})["err"])
    g, ent = list(e.read_oplog())[-1]
    assert g == GTID(0, 2) and [op["op"] for op in ent["ops"]] == ["n"]  # (0:1: create, insert)
    deadline = time.monotonic() + 5
    while svc.group.durable != g:
        assert time.monotonic() < deadline, f"the n entry never became durable: {svc.group.durable}"
        time.sleep(0.01)


def test_ttl_indexes_delete_expired_documents_through_the_write_path(member, monkeypatch):
    import datetime

    from raymx.actors import trimming
    from raymx.storage.types import millis
    monkeypatch.setattr(trimming, "TTL_BATCH", 2)  # batches of two: the loop runs
    svc, e = member()
    now = datetime.datetime(2026, 11, 27, 12, 0)
    hour = datetime.timedelta(hours=1)
    docs = [{"_id": 1, "at": now - 2 * hour}, {"_id": 2, "at": now},
            {"_id": 3, "at": "not a date"}, {"_id": 4}, {"_id": 5, "at": [now - 3 * hour, now]},
            {"_id": 6, "at": now - 5 * hour}, {"_id": 7, "at": 12}]
    assert ask(svc, {"op": "insert", "ns": "a.t", "docs": docs})["ok"]
    r = ask(svc, {"op": "createIndex", "ns": "a.t", "key": [["at", 1]], "expire_after_s": 3600})
    assert r["ok"]["value"] == "at_1"
    bad = ask(svc, {"op": "createIndex", "ns": "a.t", "key": [["b", 1]], "expire_after_s": -1})
    assert "expireAfterSeconds" in str(bad["err"])
    assert e.reader().coll("a.t").indexes["at_1"].spec() == {
        "key": [["at", 1]], "unique": False, "expireAfterSeconds": 3600}
    last = e.last()[0]
    assert svc.expire_once(now_ms=millis(now)) == 3
    assert [d["_id"] for d in e.find("a.t", {})] == [2, 3, 4, 7]
    # plain deletes with GTIDs, as a client's: replicated and streamed
    deleted = [op["pre"]["_id"] for g, ent in e.read_oplog() if g > last for op in ent["ops"]]
    assert sorted(deleted) == [1, 5, 6]
    assert svc.status()["ttl"] == {"deleted": 3, "passes": 1, "last_error": None}
    svc.primary = False  # a secondary's copy waits for the primary's deletes
    assert ask(svc, {"op": "insert", "ns": "a.t", "docs": [{"_id": 8}]})["err"] is not None
    assert svc.expire_once(now_ms=millis(now + 10 * hour)) == 0


def test_a_majority_read_after_a_gtid_waits_until_the_majority_point_holds_it(member):
    """A causally consistent session's majority read (``after``) reads the
    majority snapshot this member knows, which must hold the session's own
    write: it waits for the majority point, not only for the write to be
    applied (before, it answered at once, without the write)."""
    from raymx import errors
    svc, e = member()
    svc.set_votes({0: 1, 1: 1, 2: 1})  # two more voters: a majority needs one of them
    g = GTID(*ask(svc, {"op": "insert", "ns": "a.m", "docs": [{"_id": 1}]})["ok"]["gtid"])
    read = {"op": "find", "ns": "a.m", "filter": {}, "readConcern": "majority",
            "after": list(g), "after_timeout_ms": 300}
    assert isinstance(ask(svc, read)["err"], errors.ReadConcernTimeout)
    threading.Timer(0.3, lambda: svc.set_positions({1: g})).start()  # member 1 holds it
    assert ask(svc, dict(read, after_timeout_ms=5000))["ok"]["docs"] == [{"_id": 1}]
    # a local read after g needs g applied only
    assert ask(svc, dict(read, readConcern="local"))["ok"]["docs"] == [{"_id": 1}]


def test_a_cursor_s_batches_are_cut_by_the_documents_stored_sizes(tmp_path):
    """An unsorted find's batches are sized by each document's stored bytes
    (re-packing every document to size it took about a quarter of a large
    read's time); a sorted one's, whose documents a sort holds back, are
    packed again. Either way each batch fits ``cursor_batch_bytes`` as the
    documents are sent (projected ones are smaller), and the cursor gives
    every document once, in order."""
    import datetime
    from raymx.actors.reads import _Cursor
    from raymx.storage import codec
    from raymx.storage.catalog import Stats
    lim = Limits(cursor_batch_bytes=64 * 1024)
    e = Engine(LMDBStore(str(tmp_path / "m"), map_bytes=1 << 28), lim)
    svc = ShardService(e, lim)
    try:
        at = datetime.datetime(2026, 1, 1)
        e.insert_many("b.c", [{"_id": i, "at": at, "n": i * 0.5, "s": "x" * (i * 97 % 5000)}
                              for i in range(400)])
        for sort, proj, sized in ((None, None, True), ([["_id", -1]], None, False),
                                  (None, {"s": 1}, True)):
            r, st = e.reader(), Stats()
            c = _Cursor(1, r, r.find("b.c", {}, proj, sort, 0, 0, st), None, st)
            seen, batches = [], 0
            while True:
                out = svc._batch_checked(c, 0)
                sizes = [len(codec.pack(d)) for d in out["docs"]]
                assert len(sizes) == 1 or sum(sizes) <= svc._batch_bytes()
                seen += [d["_id"] for d in out["docs"]]
                batches += 1
                if not out["cursor"]:
                    break
            r.t.abort()
            assert seen == (list(range(399, -1, -1)) if sort else list(range(400)))
            assert st.sized is sized and batches >= (8 if proj is None else 1)
    finally:
        svc.close()


def test_write_concern_waits_wake_no_thread_and_end_at_their_deadline(member):
    """A write waiting for ``w`` no longer wakes the waiters' thread (a
    futex wake and a Python thread per write, once): a later position decides
    it on the reporting thread, one that already holds now on the caller's,
    and only a deadline before the thread's next wake-up wakes it."""
    from raymx import errors
    svc, e = member()
    svc.set_votes({0: 1, 1: 1, 2: 1})
    g = GTID(*ask(svc, {"op": "insert", "ns": "a.w", "docs": [{"_id": 1}]})["ok"]["gtid"])
    svc.wc.update(0, g)
    time.sleep(0.1)  # the waiters' thread sleeps now, toward its 1 s tick
    got = []

    def answer(what):
        got.append((what, threading.current_thread(), time.monotonic()))
    t0 = time.monotonic()
    svc.wc.wait(g, "majority", 150, lambda: answer("ok"), answer)
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
    (what, thread, at), = got
    assert isinstance(what, errors.WriteConcernTimeout) and thread.name == "raymx-wc"
    assert 0.14 <= at - t0 < 0.9, at - t0  # its own deadline, not the thread's next tick
    got.clear()
    svc.wc.wait(g, 2, None, lambda: answer("ok"), answer)
    assert got == []  # waits: a later position decides it, on the thread that reports it
    svc.set_positions({1: g})
    assert [(w, t) for w, t, _ in got] == [("ok", threading.current_thread())]
    got.clear()
    svc.wc.wait(g, "majority", None, lambda: answer("ok"), answer)  # already holds
    assert [(w, t) for w, t, _ in got] == [("ok", threading.current_thread())]
