"""One contract, two stores: LMDB and the in-memory store the simulation uses."""
import os
import stat
import threading
import time

import pytest

from raymx.storage import errors
from raymx.storage.lmdb_store import LMDBStore
from raymx.storage.store import MemoryStore


def test_put_get_delete_and_snapshot_isolation(store):
    with store.write() as t:
        t.put("docs", b"a", b"1")
        t.put("docs", b"b", b"2")
    r = store.read()
    with store.write() as t:
        t.put("docs", b"c", b"3")
        assert t.delete("docs", b"a")
        assert not t.delete("docs", b"zz")
    # the old reader still sees its snapshot
    assert [k for k, _ in r.scan("docs")] == [b"a", b"b"]
    r.abort()
    with store.read() as r2:
        assert [k for k, _ in r2.scan("docs")] == [b"b", b"c"]
        assert r2.get("docs", b"a") is None
        assert r2.get("docs", b"c") == b"3"


def test_snapshot_ids_tell_whether_a_commit_came_between(store):
    """Two transactions have the same ``snapshot_id`` exactly when no commit
    came between their begins (an optimistic transaction's commit skips
    its conflict check so)."""
    with store.write() as t:
        t.put("docs", b"a", b"1")
    r1, r2 = store.read(), store.read()
    assert r1.snapshot_id() == r2.snapshot_id()
    w = store.write()
    assert w.snapshot_id() == r1.snapshot_id()
    w.put("docs", b"b", b"2")
    w.commit()
    r3 = store.read()
    assert r3.snapshot_id() != r1.snapshot_id()
    w = store.write()
    assert w.snapshot_id() == r3.snapshot_id() != r2.snapshot_id()
    w.abort()
    for r in (r1, r2, r3):
        r.abort()


def test_scan_ranges_and_reverse(store):
    with store.write() as t:
        for i in range(10):
            t.put("oplog", bytes([i]), bytes([i]))
    with store.read() as t:
        assert [k[0] for k, _ in t.scan("oplog", bytes([3]), bytes([6]))] == [3, 4, 5]
        assert [k[0] for k, _ in t.scan("oplog", bytes([3]), bytes([6]), reverse=True)] == [5, 4, 3]
        assert [k[0] for k, _ in t.scan("oplog", None, bytes([2]), reverse=True)] == [1, 0]
        assert [k[0] for k, _ in t.scan("oplog", bytes([8]), None, reverse=True)] == [9, 8]
        assert [k[0] for k in t.scan_keys("oplog", bytes([3]), bytes([6]))] == [3, 4, 5]
        assert [k[0] for k in t.scan_keys("oplog", bytes([8]))] == [8, 9]
        assert list(t.scan_keys("oplog", bytes([10]))) == []
        assert t.first("oplog")[0] == bytes([0]) and t.last("oplog")[0] == bytes([9])
        assert t.first("unapplied") is None and t.last("unapplied") is None


def test_abort_and_exception_discard_writes(store):
    t = store.write()
    t.put("meta", b"x", b"1")
    t.abort()
    with pytest.raises(ZeroDivisionError):
        with store.write() as t:
            t.put("meta", b"x", b"1")
            1 / 0
    with store.read() as r:
        assert r.get("meta", b"x") is None


def test_nested_savepoint(store):
    with store.write() as t:
        t.put("docs", b"keep", b"1")
        n = t.nested()
        n.put("docs", b"gone", b"1")
        assert n.get("docs", b"keep") == b"1"
        n.abort()
        n = t.nested()
        n.put("docs", b"merged", b"1")
        n.delete("docs", b"keep")
        n.commit()
        assert t.get("docs", b"keep") is None
    with store.read() as r:
        assert sorted(k for k, _ in r.scan("docs")) == [b"merged"]


def test_written_names_the_keys_a_transaction_changed_itself(store):
    """``written(db)``: what a plain write checks against the documents open
    transactions hold (``ShardService._waits_for``): its own changes, its
    committed savepoints', not an aborted one's, not another db's."""
    with store.write() as t:
        t.put("docs", b"old", b"1")
    with store.write() as t:
        assert t.written("docs") == []
        t.put("docs", b"a", b"1")
        t.put("index", b"i", b"1")
        t.put_many("docs", [(b"m", b"1")])
        assert t.put_new("docs", [(b"n", b"1")])
        n = t.nested()
        n.put("docs", b"gone", b"1")
        assert sorted(set(n.written("docs"))) == [b"gone"]
        n.abort()
        n = t.nested()
        n.delete("docs", b"old")
        assert n.written("docs") == [b"old"]
        n.commit()
        assert sorted(set(t.written("docs"))) == [b"a", b"m", b"n", b"old"]
        assert t.written("index") == [b"i"]
        assert t.written("oplog") == []


def test_one_writer_at_a_time_in_submission_order(store):
    order = []
    t = store.write()

    def second():
        with store.write() as t2:
            order.append("second")
            t2.put("meta", b"k", b"2")

    th = threading.Thread(target=second)
    th.start()
    time.sleep(0.1)
    order.append("first")  # the second writer is still waiting
    t.put("meta", b"k", b"1")
    t.commit()
    th.join(5)
    assert order == ["first", "second"]
    with store.read() as r:
        assert r.get("meta", b"k") == b"2"


def test_memory_store_crash_drops_unsynced():
    s = MemoryStore()
    with s.write() as t:
        t.put("oplog", b"1", b"a")
    s.sync()
    with s.write() as t:
        t.put("oplog", b"2", b"b")
    s.crash()
    with s.read() as r:
        assert [k for k, _ in r.scan("oplog")] == [b"1"]


def test_lmdb_dir_is_owner_only_and_reopens(tmp_path):
    p = tmp_path / "member"
    s = LMDBStore(str(p), map_bytes=1 << 28)
    with s.write() as t:
        t.put("meta", b"a", b"b")
    s.sync()
    s.close()
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o700
    s = LMDBStore(str(p), map_bytes=1 << 28)
    with s.read() as r:
        assert r.get("meta", b"a") == b"b"
    # a second store object on the same path shares the environment
    s2 = LMDBStore(str(p), map_bytes=1 << 28)
    with s2.read() as r:
        assert r.get("meta", b"a") == b"b"
    s2.close()
    s.close()


def test_unknown_subdatabase_is_refused(store):
    with pytest.raises(KeyError):
        with store.read() as r:
            r.get("nope", b"x")


def test_put_sorted_appends_runs_and_refuses_disorder(store):
    with store.write() as t:
        assert t.put_sorted("docs", [(bytes([i]), b"v%d" % i) for i in range(0, 10, 2)]) == 5
        assert t.put_sorted("docs", [(bytes([20 + i]), b"w") for i in range(3)]) == 3
        # a run inside existing keys is put one by one (not appended)
        assert t.put_sorted("docs", [(bytes([1]), b"x"), (bytes([3]), b"y")]) == 2
    with store.read() as t:
        assert [k[0] for k, _ in t.scan("docs")] == [0, 1, 2, 3, 4, 6, 8, 20, 21, 22]
        assert t.get("docs", bytes([1])) == b"x"
    with pytest.raises(ValueError):
        with store.write() as t:
            t.put_sorted("docs", [(bytes([40]), b""), (bytes([30]), b"")])
    with store.read() as t:  # the refused run left nothing behind
        assert t.get("docs", bytes([40])) is None


def test_put_many_overwrites_in_any_order(store):
    with store.write() as t:
        t.put("docs", bytes([5]), b"old")
        t.put_many("docs", [(bytes([7]), b"a"), (bytes([5]), b"new"), (bytes([1]), b"b")])
        t.put_many("docs", [])
    with store.read() as t:
        assert [(k[0], v) for k, v in t.scan("docs")] == [(1, b"b"), (5, b"new"), (7, b"a")]


def test_put_new_writes_every_row_or_none(store):
    with store.write() as t:
        assert t.put_new("docs", [(bytes([i]), b"a%d" % i) for i in (1, 2, 3)])  # appended
        assert t.put_new("docs", [(bytes([9]), b"b"), (bytes([0]), b"c")])  # out of order
        assert t.put_new("docs", [])
        # a key already stored, or one repeated in the rows: nothing is written
        assert not t.put_new("docs", [(bytes([10]), b"x"), (bytes([2]), b"x")])
        assert not t.put_new("docs", [(bytes([11]), b"y"), (bytes([11]), b"z")])
        assert not t.put_new("docs", [(bytes([12]), b"y"), (bytes([13]), b"z"), (bytes([12]), b"w")])
    with store.read() as t:
        assert [(k[0], v) for k, v in t.scan("docs")] == [
            (0, b"c"), (1, b"a1"), (2, b"a2"), (3, b"a3"), (9, b"b")]


@pytest.fixture(params=["lmdb", "memory"])
def full_store(request, tmp_path):
    """(store, fill, make_room): ``fill`` commits rows until a write is refused
    with DiskFull (LMDB: a 1 MiB map that does not grow; memory: after 20
    transactions its fault switch is set) and returns the rows committed."""
    opened = []
    if request.param == "lmdb":
        s = LMDBStore(str(tmp_path / "db"), map_bytes=1 << 20, map_bytes_max=1 << 20)

        def make_room():  # a bigger map (in a map full to its last page even a
            s.close()     # delete is refused: copy-on-write needs pages first)
            opened.append(LMDBStore(s.path, map_bytes=4 << 20))
            return opened[-1]
    else:
        s = MemoryStore("mem")

        def make_room():
            s.full = False
            return s

    def fill():
        rows, i = [], 0
        while True:
            if request.param == "memory" and i == 20:
                s.full = True
            batch = [(b"%08d" % (i * 50 + j), b"v" * 100) for j in range(50)]
            t = s.write()
            try:
                for k, v in batch:
                    t.put("docs", k, v)
                t.commit()
            except errors.DiskFull as e:
                t.abort()
                return rows, e
            rows += [k for k, _ in batch]
            i += 1
    yield s, fill, make_room
    for x in [s] + opened:
        x.close()


def test_a_write_without_room_is_refused_whole_and_the_store_stays_usable(full_store):
    s, fill, make_room = full_store
    rows, err = fill()
    assert rows and err.info["full"] in ("map", "disk") and s.path in str(err)
    assert "nothing was written" in str(err)
    with s.read() as r:  # reads go on: every committed row, none of the refused one
        assert [k for k, _ in r.scan("docs")] == rows
    for call in (lambda t: t.put_many("docs", [(b"z%d" % i, b"v" * 3000) for i in range(400)]),
                 lambda t: t.put_new("docs", [(b"y%d" % i, b"v" * 3000) for i in range(400)]),
                 lambda t: t.put_sorted("docs", [(b"x%04d" % i, b"v" * 3000) for i in range(400)])):
        with pytest.raises(errors.DiskFull):
            with s.write() as t:
                call(t)
    s = make_room()
    with s.write() as t:  # room again: writes go on
        t.put("docs", b"new", b"v")
    with s.read() as r:
        assert [k for k, _ in r.scan("docs")] == rows + [b"new"]
