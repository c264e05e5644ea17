"""Disk full and LMDB map full (issue 24, part 2): the write is refused with
``DiskFull``, nothing of it is stored, what was stored is intact, reads go on,
and writes go on once there is room. Real LMDB files (small maps), a real
full file system (a size-limited tmpfs in a private mount namespace, when
``unshare`` allows one), and MemoryStore's fault switch."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import lmdb
import pytest

from raymx import errors
from raymx.storage import lmdb_env, lmdb_store
from raymx.storage.engine import Engine
from raymx.storage.gtid import GTID
from raymx.storage.lmdb_store import LMDBStore
from raymx.storage.store import MemoryStore

MiB = 1 << 20
PAD = "x" * 400
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fill(e: Engine, ns="t.c", batch=20, start=0):
    """Insert batches of documents until one is refused; (documents stored, the error)."""
    n = start
    while True:
        try:
            e.insert_many(ns, [{"_id": n + j, "k": (n + j) % 13, "pad": PAD} for j in range(batch)])
        except errors.DiskFull as err:
            return n, err
        n += batch
        assert n < 1_000_000, "never full"


def check_engine(e: Engine, ns: str, n: int, start: int = 0):
    """Every stored document is there once, its index entries match, the oplog verifies."""
    assert e.count(ns) == n
    info = e.oplog_info()  # dense and chained from its first entry (trimming moves it)
    assert e.verify_oplog() == info["last"].seq - info["first"].seq + 1 == info["entries"]
    state = e.snapshot_state()[ns]
    assert sorted(d["_id"] for d in state["docs"]) == list(range(start, start + n))
    entries = state["indexes"].get("k_1")
    if entries is not None:
        assert len(entries[1]) == n
        assert e.count(ns, {"k": 5}) == sum(1 for i in range(start, start + n) if i % 13 == 5)


def small(tmp_path, name="m", map_mib=2, max_mib=None):
    return LMDBStore(str(tmp_path / name), map_bytes=map_mib * MiB,
                     map_bytes_max=(max_mib or map_mib) * MiB)


# --- LMDB map full through the engine ------------------------------------
def test_map_full_refuses_the_statement_keeps_data_and_reads(tmp_path):
    s = small(tmp_path)
    e = Engine(s)
    with e.begin() as tx:
        tx.create_index("t.c", "k")
    e.insert_many("t.junk", [{"_id": i, "pad": PAD} for i in range(400)])
    n, err = fill(e)
    # ~1,100 fit before the write-ahead log; its checkpoint's pin now holds up
    # to 2/64 of the map (wal.CHECKPOINT_GROWTH_MAP_FRACTION) from reuse
    assert n > 900
    assert err.info["full"] == "map" and err.info["path"] == s.path
    msg = str(err)
    assert s.path in msg and "map is full" in msg and "nothing was written" in msg
    assert "Limits.map_bytes" in msg
    assert not err.retryable
    check_engine(e, "t.c", n)
    # every refused write leaves no trace, and the store stays usable (a
    # refusal lets the next write checkpoint, which frees what the pin held:
    # some of the writes after it fit, until the map is full again)
    refused = 0
    for _ in range(30):
        before = e.last()
        try:
            e.insert_many("t.c", [{"_id": n + i, "k": (n + i) % 13, "pad": PAD}
                                  for i in range(200)])
            n += 200
        except errors.DiskFull:
            refused += 1
            assert e.last() == before and s._ent.live() == 0
    assert refused >= 3
    check_engine(e, "t.c", n)
    # a transaction whose second statement does not fit: the first one stands
    with e.begin() as tx:
        tx.update("t.c", {"_id": 0}, {"$set": {"pad": "y"}})
        with pytest.raises(errors.DiskFull):
            tx.insert("t.c", [{"_id": -i, "pad": PAD * 10} for i in range(1, 200)])
    assert e.find("t.c", {"_id": 0})[0]["pad"] == "y"
    check_engine(e, "t.c", n)
    # room inside the map: drop a collection (a small oplog entry; a delete
    # would log every document's image) and trim the oplog; writes go on
    # (freed pages are reused by small values first: a value over a page
    # needs a run of contiguous free pages, LMDB's overflow pages)
    assert e.run(lambda tx: tx.drop_collection("t.junk"))[0]
    for i in range(50):
        e.insert_many("t.c", [{"_id": n + i, "k": (n + i) % 13, "pad": PAD}])
    assert e.trim_oplog(None, 1, None, 100).trimmed == 100
    for i in range(50, 150):
        e.insert_many("t.c", [{"_id": n + i, "k": (n + i) % 13, "pad": PAD}])
    check_engine(e, "t.c", n + 150)
    s.close()


def test_failed_commit_then_noop_fails_too_then_both_work_in_a_bigger_map(tmp_path):
    """The caller's recovery of a taken GTID (shard: _write_noop) against a full
    map: the commit and its n entry are refused alike, the engine's tail and
    range record do not move, and once the map is bigger the n entry goes in
    at that GTID and writes continue densely."""
    s = small(tmp_path)
    e = Engine(s)
    n, _ = fill(e)
    fails = 0  # fill the rest with n entries until even one does not fit, twice:
    while fails < 2:  # after a map full the next write checkpoints (freeing pages)
        try:
            e.write_noop()
            fails = 0
        except errors.DiskFull:
            fails += 1
    last, rng = e.last(), e.range()
    g = GTID(last[0].term, last[0].seq + 1)
    tx = e.begin(autocommit=True)
    try:
        tx.insert("t.c", [{"_id": -1, "pad": PAD}])
        tx.commit(g)
    except errors.DiskFull:
        tx.abort()
    else:
        raise AssertionError("the insert fitted in a full map")
    with pytest.raises(errors.DiskFull):
        e.write_noop(g)
    assert e.last() == last and e.range().last == rng.last and e._tail[0] == last[0]
    check_engine(e, "t.c", n)
    s.close()
    # room: the same files opened with a bigger map
    s = LMDBStore(s.path, map_bytes=8 * MiB, map_bytes_max=8 * MiB)
    e = Engine(s)
    assert s.stat()["map_bytes"] == 8 * MiB
    assert e.write_noop(g) == g
    assert e.insert_many("t.c", [{"_id": n, "k": n % 13, "pad": PAD}]).gtid == \
        GTID(g.term, g.seq + 1)
    check_engine(e, "t.c", n + 1)
    s.close()


def test_the_map_grows_at_the_next_write_after_a_refusal(tmp_path, monkeypatch):
    monkeypatch.setattr(lmdb_env, "GROW_RETRY_S", 0.05)
    s = small(tmp_path, map_mib=2, max_mib=16)
    e = Engine(s)
    r = s.read()  # an open transaction of this process: no grow while it is
    n, err = fill(e)
    assert "grows at this process's next transaction" in str(err)
    assert s._ent.grow_wanted and s.stat()["map_bytes"] == 2 * MiB
    with pytest.raises(errors.DiskFull):
        e.insert_many("t.c", [{"_id": n + i, "pad": PAD} for i in range(200)])
    assert s.stat()["map_bytes"] == 2 * MiB  # tried: r stayed open past 0.1 s
    r.abort()
    time.sleep(0.06)  # the next try comes GROW_RETRY_S after a failed one
    e.insert_many("t.c", [{"_id": n + i, "k": 0, "pad": PAD} for i in range(200)])
    assert s.stat()["map_bytes"] == 4 * MiB
    n2, sizes = n + 200, [4]
    while True:  # grown ahead, once a commit leaves the file past 3/4 of the map:
        try:     # 4 -> 8 -> 16 MiB with no write refused, then refused at the ceiling
            e.insert_many("t.c", [{"_id": n2 + j, "pad": PAD} for j in range(20)])
        except errors.DiskFull as err:
            assert "at its ceiling" in str(err)
            break
        n2 += 20
        if s._ent.map_bytes() // MiB != sizes[-1]:  # (stat() would begin a txn: grow)
            sizes.append(s._ent.map_bytes() // MiB)
    assert sizes == [4, 8, 16]
    assert e.count("t.c") == n2 and e.verify_oplog() == e.last()[0].seq
    s.close()


def test_reopen_grows_a_nearly_full_map(tmp_path):
    s = small(tmp_path, map_mib=2)
    e = Engine(s)
    n, _ = fill(e)
    used = (s.stat()["last_page"] + 1) * s.stat()["page_bytes"]
    s.close()
    assert used > 0.75 * 2 * MiB
    s = LMDBStore(s.path, map_bytes=2 * MiB)  # default ceiling: the open rule applies
    assert s.stat()["map_bytes"] == 2 * used
    e = Engine(s)
    e.insert_many("t.c", [{"_id": n + i, "k": 1, "pad": PAD} for i in range(100)])
    check_engine(e, "t.c", n + 100)
    s.close()
    s = LMDBStore(s.path, map_bytes=64 * MiB)  # well under 3/4: as asked
    assert s.stat()["map_bytes"] == 64 * MiB
    s.close()


GROWER = textwrap.dedent("""
    import sys
    from raymx.storage.engine import Engine
    from raymx.storage.lmdb_store import LMDBStore
    e = Engine(LMDBStore(sys.argv[1], map_bytes=32 << 20))
    for i in range(40):
        e.insert_many("t.c", [{"_id": 1000 + 50 * i + j, "pad": "x" * 2000} for j in range(50)])
    print(e.count("t.c"))
""")


def grow_elsewhere(s: LMDBStore) -> None:
    """Another process grows the map of ``s`` (10 documents in it) to 32 MiB,
    fills it past this process's 2 MiB with 2,000 more documents, and exits."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", GROWER, s.path], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == 2010


def test_another_process_grows_the_map_this_one_adopts_it(tmp_path):
    s = small(tmp_path, map_mib=2)
    e = Engine(s)
    e.insert_many("t.c", [{"_id": i} for i in range(10)])
    grow_elsewhere(s)
    assert s._ent.map_bytes() == 2 * MiB  # the file is past this process's map now
    r = s.read()  # no transaction open: adopts (MDB_MAP_RESIZED, set_mapsize(0))
    assert s.stat()["map_bytes"] == 32 * MiB
    r2 = s.read()
    r2.abort()
    r.abort()
    assert e.count("t.c") == 2010 and e.verify_oplog() == e.last()[0].seq
    s.close()


def test_a_write_after_another_process_grew_the_map_adopts_it(tmp_path):
    """The checkpoint a write takes first (the other process closed, leaving
    its last checkpoint unpinned) begins its pin in a map the other process
    grew past ours: the map is adopted and the write goes on. Before, that
    begin's MDB_MAP_RESIZED was taken for a failed log (DiskFailed: the store
    wrote no more until a restart), which is what a member's shard did once
    its applier grew a small map. Nothing is lost across a reopen."""
    s = small(tmp_path, map_mib=2)
    e = Engine(s)
    e.insert_many("t.c", [{"_id": i} for i in range(10)])
    grow_elsewhere(s)
    assert s._ent.map_bytes() == 2 * MiB  # the file is past this process's map now
    e.insert_many("t.c", [{"_id": -1 - i, "pad": PAD} for i in range(20)])
    assert s._ent.map_bytes() == 32 * MiB and s.failed is None
    assert e.count("t.c") == 2030 and e.verify_oplog() == e.last()[0].seq
    s.close()
    s = LMDBStore(s.path, map_bytes=2 * MiB)  # recovery from that checkpoint and log
    e = Engine(s)
    assert e.count("t.c") == 2030 and e.verify_oplog() == e.last()[0].seq
    s.close()


def test_an_idle_cursor_is_closed_so_the_map_can_grow(tmp_path, monkeypatch):
    """A shard's idle cursor holds an LMDB snapshot for up to
    cursor_idle_ms (10 minutes), and a map is remapped only with none of the
    process's transactions open: the remap closes idle cursors (the store's
    release hook) instead of refusing every write meanwhile (before, writes
    were refused from the map's end on). The cursor's next getMore says it
    was closed."""
    from raymx.actors.shard import ShardService
    from raymx.storage.limits import Limits
    from tests.test_shard_service import ask
    monkeypatch.setattr(lmdb_env, "GROW_RETRY_S", 0.05)
    lim = Limits(sync_interval_ms=20)
    s = small(tmp_path, map_mib=2, max_mib=64)
    e = Engine(s, lim)
    svc = ShardService(e, lim)
    try:
        assert ask(svc, {"op": "insert", "ns": "t.c",
                         "docs": [{"_id": -1 - i} for i in range(50)]})["ok"]
        first = ask(svc, {"op": "find", "ns": "t.c", "filter": {}, "batch": 5})["ok"]
        assert len(first["docs"]) == 5 and first["cursor"]
        n = 0
        while s._ent.map_bytes() < 4 * MiB:  # grown ahead of its end: no write refused
            r = ask(svc, {"op": "insert", "ns": "t.c",
                          "docs": [{"_id": n + j, "pad": PAD} for j in range(50)]})
            assert r["err"] is None, f"the idle cursor held the map: {r['err']}"
            n += 50
        r = ask(svc, {"op": "getMore", "cursor": first["cursor"]})
        assert "closed when the store's map grew" in str(r["err"])
        assert ask(svc, {"op": "count", "ns": "t.c"})["ok"]["value"] == n + 50
    finally:
        svc.close()
        s.close()


def test_txn_full_is_transaction_too_large(tmp_path):
    """LMDB's MDB_TXN_FULL (too many dirty pages for one transaction) is about
    the transaction's size, not free space: TransactionTooLarge. (Reaching it
    for real takes ~512 MiB of dirty pages in one transaction.)"""
    s = small(tmp_path)
    e = lmdb_store._refusal(s, lmdb.TxnFullError("mdb_put: MDB_TXN_FULL"), "put")
    assert isinstance(e, errors.TransactionTooLarge) and "nothing was written" in str(e)
    other = lmdb.BadValsizeError("x")
    assert lmdb_store._refusal(s, other, "put") is other  # not a question of room
    s.close()


def test_disk_full_crosses_the_wire():
    e = errors.DiskFull("no room", path="/p", full="map", map_bytes=1)
    assert "DiskFull" in errors.__all__
    back = errors.from_wire(e.to_wire())
    assert type(back) is errors.DiskFull and back.info["full"] == "map"


# --- MemoryStore's fault switch ---------------------------------------------
def test_memory_store_full_switch():
    s = MemoryStore("mem")
    e = Engine(s)
    e.insert_many("t.c", [{"_id": i, "pad": PAD} for i in range(10)])
    last = e.last()
    s.full = True
    for op in (lambda t: t.put("docs", b"k", b"v"), lambda t: t.delete("docs", b"k"),
               lambda t: t.put_many("docs", [(b"k", b"v")]),
               lambda t: t.put_sorted("docs", [(b"k", b"v")]),
               lambda t: t.put_new("docs", [(b"k", b"v")]),
               lambda t: t.putter("docs")(b"k", b"v"), lambda t: t.commit()):
        t = s.write()
        with pytest.raises(errors.DiskFull, match="mem: the disk is full"):
            op(t)
        t.abort()
    with pytest.raises(errors.DiskFull):
        e.insert_many("t.c", [{"_id": 99}])
    # a statement that ran before the disk filled is refused at commit, and so
    # is the n entry its caller writes for the GTID it took
    s.full = False
    tx = e.begin(autocommit=True)
    tx.insert("t.c", [{"_id": 100}])
    s.full = True
    g = GTID(last[0].term, last[0].seq + 1)
    with pytest.raises(errors.DiskFull):
        tx.commit(g)
    with pytest.raises(errors.DiskFull):
        e.write_noop(g)
    assert e.last() == last and e.count("t.c") == 10  # reads go on
    s.full = False
    assert e.write_noop(g) == g
    e.insert_many("t.c", [{"_id": 100}])
    assert e.count("t.c") == 11 and e.verify_oplog() == g.seq + 1


# --- a real full file system ------------------------------------------------
ENOSPC_RUN = textwrap.dedent("""
    import json, os, subprocess, sys
    mnt = sys.argv[1]
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", mnt], check=True)
    from raymx import errors
    from raymx.storage.engine import Engine
    from raymx.storage.lmdb_store import LMDBStore
    with open(os.path.join(mnt, "ballast"), "wb") as f:  # room to give back later
        f.write(b"b" * (1 << 20))
    s = LMDBStore(os.path.join(mnt, "m"), map_bytes=256 << 20)
    e = Engine(s)
    out = {"errors": []}
    n = 0
    while len(out["errors"]) < 3:  # refused; then smaller writes, refused too
        try:
            size = 20 if not out["errors"] else 1
            e.insert_many("t.c", [{"_id": n + j, "pad": "x" * 400} for j in range(size)])
            n += size
        except errors.DiskFull as err:
            out["errors"].append([str(err), err.info["full"], type(err.__cause__).__name__])
    out["n"], out["count"] = n, e.count("t.c")
    out["verify"], out["last"] = e.verify_oplog(), e.last()[0].seq
    out["ids_ok"] = sorted(d["_id"] for d in e.find("t.c")) == list(range(n))
    e.sync()  # the member syncs on; a full disk is not a failed sync
    import time
    wal = s._ent.wal
    wal.ask_checkpoint()  # the background thread's checkpoint finds no room for its file
    time.sleep(2.5)
    out["checkpoint_failed"] = wal.failed
    wal.checkpoint_first = True  # as after a map-full refusal: a write checkpoints first
    try:
        e.insert_many("t.c", [{"_id": -1, "pad": "x"}])
        out["write_after_checkpoint"] = "written"
    except Exception as err:
        out["write_after_checkpoint"] = type(err).__name__
    os.remove(os.path.join(mnt, "ballast"))
    e.insert_many("t.c", [{"_id": n + j, "pad": "x" * 400} for j in range(20)])
    e.sync()
    out["after"] = e.count("t.c")
    out["verify_after"], out["last_after"] = e.verify_oplog(), e.last()[0].seq
    s.close()
    e = Engine(LMDBStore(os.path.join(mnt, "m"), map_bytes=256 << 20))  # reopens whole
    out["reopened"] = [e.count("t.c"), e.verify_oplog(), e.last()[0].seq]
    print(json.dumps(out))
""")


def test_enospc_on_a_full_tmpfs(tmp_path):
    """ENOSPC for real: a 6 MiB tmpfs mounted in a private user and mount
    namespace (``unshare -Urm``: no root needed where unprivileged user
    namespaces are allowed); skipped where that cannot be made."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1)")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    probe = subprocess.run([unshare, "-Urm", "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs",
                            str(mnt)], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a user namespace: {probe.stderr!r}")
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([unshare, "-Urm", sys.executable, "-c", ENOSPC_RUN, str(mnt)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for msg, full, cause in out["errors"]:
        assert full == "disk" and "the disk is full" in msg and "nothing was written" in msg
        assert str(mnt / "m") in msg
    # a refusal comes from LMDB's commit, a short write (EIO: lmdb.Error) or
    # ENOSPC (lmdb.DiskError), or from the write-ahead log's append (OSError
    # ENOSPC), whichever first finds no room
    causes = [c for _, _, c in out["errors"]]
    assert set(causes) <= {"Error", "DiskError", "OSError"}
    assert out["n"] > 1000 and out["count"] == out["n"] and out["ids_ok"]
    # no room for a checkpoint's file: the background thread tries again later and
    # a write that needs one first is refused (before: the log failed, for good)
    assert out["checkpoint_failed"] is None and out["write_after_checkpoint"] == "DiskFull"
    assert out["verify"] == out["last"]
    assert out["after"] == out["n"] + 20 and out["verify_after"] == out["last_after"]
    assert out["reopened"] == [out["after"], out["last_after"], out["last_after"]]


def test_grows_under_concurrent_short_readers(tmp_path):
    """Readers on other threads begin and end transactions all the time; the
    map grows only in a moment when none is open (a remap under an open one
    would crash the process), and every read sees whole documents."""
    import threading
    s = small(tmp_path, map_mib=1, max_mib=64)
    e = Engine(s)
    e.insert_many("t.c", [{"_id": -1, "pad": PAD}])
    stop, seen, bad = threading.Event(), [], []

    def reader():
        while not stop.is_set():
            try:
                docs = e.find("t.c", {"_id": {"$lt": 5}})
                seen.append(len(docs))
                if any(d["pad"] != PAD for d in docs):
                    bad.append(docs)
            except Exception as err:  # noqa: BLE001 - reported below
                bad.append(repr(err))
            time.sleep(0.0002)  # let the writer run too (the GIL)
    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    n, sizes, refused = 0, [1], 0
    try:
        while sizes[-1] < 4 and n < 200_000:
            try:
                e.insert_many("t.c", [{"_id": n + j, "pad": PAD} for j in range(50)])
                n += 50
            except errors.DiskFull:  # the readers kept the grow out past the map's end
                refused += 1
            if s._ent.map_bytes() // MiB != sizes[-1]:
                sizes.append(s._ent.map_bytes() // MiB)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert not bad and seen
    assert sizes == [1, 2, 4] and refused <= 2, (sizes, refused)
    assert e.count("t.c") == n + 1 and e.verify_oplog() == e.last()[0].seq
    s.close()


def test_adopting_waits_for_this_process_open_transaction(tmp_path, monkeypatch):
    """A map grown by another process past ours is adopted only with none of
    this process's transactions open: until then a begin raises
    DiskFull (one try a GROW_RETRY_S waits RESIZE_WAIT_S), and the
    open transaction keeps reading its snapshot."""
    monkeypatch.setattr(lmdb_env, "GROW_RETRY_S", 0.05)
    s = small(tmp_path, map_mib=2)
    e = Engine(s)
    e.insert_many("t.c", [{"_id": i} for i in range(10)])
    old = s.read()
    grow_elsewhere(s)
    with pytest.raises(errors.DiskFull, match="cannot take the new size"):
        s.read()
    assert len(list(old.scan("docs"))) == 10  # its snapshot, inside the old map
    old.abort()
    time.sleep(0.06)
    assert e.count("t.c") == 2010 and s._ent.map_bytes() == 32 * MiB
    assert s._ent.live() == 0
    s.close()


def test_the_applier_outlives_a_refused_write(tmp_path, monkeypatch):
    """A secondary's applier records its applied point about once a second; a
    full map or disk refusing that write (DiskFull) must not end its thread
    (seen under the nemesis: the applier's thread died and the member never
    caught up again). Runs the applier's own loop, without Ray."""
    from raymx.actors.applier import Applier
    from raymx.actors.core import replication as rep
    from raymx.storage.limits import Limits
    real, calls = rep.write_repl_info, []

    def refused_twice(e, g):
        calls.append(g)
        if len(calls) <= 2:
            raise errors.DiskFull("the LMDB map is full (injected)", full="map")
        return real(e, g)
    monkeypatch.setattr(rep, "write_repl_info", refused_twice)
    a = Applier.__ray_metadata__.modified_class("rs", 0, str(tmp_path / "m0"), Limits())
    try:
        deadline = time.monotonic() + 10
        while len(calls) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(calls) >= 3 and a._t.is_alive()
    finally:
        a.shutdown()
