"""The LMDB store's write-ahead log (issue 25): a commit is durable at one
fdatasync of the log; LMDB runs without syncs and is checkpointed; the first
process to open a folder recovers it from the checkpoint and the log.

Real LMDB files and real processes. The power-loss test models a machine
that lost power after the kernel wrote back an arbitrary subset of the data
file's unsynced pages (as ``bench/faults/torn.py`` does on LazyFS, which CI
does not have): the disk as of each checkpoint is kept, and a folder is
built from it plus a random subset of the pages that changed since."""
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from raymx.storage import wal
from raymx.storage.engine import Engine
from raymx.storage.lmdb_store import LMDBStore

MiB = 1 << 20
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_child(code: str, *args, stdin: bool = False) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
                            cwd=ROOT, stdin=subprocess.PIPE if stdin else None,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


WRITER = """
import os, sys
from raymx.storage.lmdb_store import LMDBStore
path, name, n, close = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "close"
s = LMDBStore(path, map_bytes=int(sys.argv[5]) << 20 if len(sys.argv) > 5 else 8 << 20)
for i in range(n):
    with s.write() as t:
        t.put("docs", f"{name}-{i:06d}".encode(), os.urandom(300 + i % 1500))
        if i % 7 == 6:  # deletes free pages that later commits would reuse
            t.delete("docs", f"{name}-{i - 3:06d}".encode())
    s.sync()
    print("acked", i, flush=True)
if close:
    s.close()
    print("closed", flush=True)
else:
    os._exit(0)  # no close: a crash as far as the folder knows
sys.stdin.read()
"""


def acked_keys(name: str, upto: int) -> set:
    return {f"{name}-{i:06d}".encode() for i in range(upto + 1)
            if not (i + 3 < upto + 1 and (i + 3) % 7 == 6)}


def keys_of(path: str, map_bytes: int = 8 << 20) -> set:
    s = LMDBStore(path, map_bytes=map_bytes)
    try:
        with s.read() as t:
            return set(t.scan_keys("docs"))
    finally:
        s.close()


def test_synced_commits_survive_a_crash_and_are_replayed_from_the_log(tmp_path):
    path = str(tmp_path / "m")
    p = run_child(WRITER, path, "a", 300, "crash", 1024)  # a big map: no checkpoint meanwhile
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    gen = wal.read_checkpoint(path)[0]
    assert len(list(wal.records(os.path.join(path, f"wal.{gen}"), gen))) == 300  # all in the log
    assert keys_of(path) == acked_keys("a", 299)
    # recovery ended in a checkpoint: the next open has nothing to replay
    gen = wal.read_checkpoint(path)[0]
    assert sorted(n for n in os.listdir(path) if n.startswith("wal.")) == \
        sorted([f"wal.{gen}", "wal.spare"])  # the replayed log: the next one's file
    assert list(wal.records(os.path.join(path, f"wal.{gen}"), gen)) == []
    assert wal.read_checkpoint(path)[1] >= 300


def test_a_torn_log_tail_ends_recovery_at_the_last_whole_record(tmp_path):
    path = str(tmp_path / "m")
    # a big map: no checkpoint meanwhile, every commit in the log (with the
    # small default map, the background checkpoint's timing decided how many
    # were left after it: 4 of 50 once on a loaded CI machine)
    p = run_child(WRITER, path, "a", 50, "crash", 1024)
    assert p.wait(120) == 0
    gen = wal.read_checkpoint(path)[0]
    log = os.path.join(path, f"wal.{gen}")
    recs = list(wal.records(log, gen))
    assert len(recs) == 50
    with open(log, "rb") as f:  # the log's end: past it, zeros written ahead (or old records)
        data, size = f.read(), 0
    for _ in recs:
        size += wal.REC.size + wal.REC.unpack_from(data, size)[0]
    with open(log, "r+b") as f:  # the last record half written, then garbage
        f.truncate(size - 100)
        f.seek(0, 2)
        f.write(os.urandom(64))
    assert len(list(wal.records(log, gen))) == len(recs) - 1
    got = keys_of(path)
    assert got == acked_keys("a", 48)  # the torn 49th is not replayed
    s = LMDBStore(path, map_bytes=8 << 20)  # and writes go on after it
    with s.write() as t:
        t.put("docs", b"after", b"1")
    s.sync()
    s.close()
    assert b"after" in keys_of(path)


def test_logs_are_written_ahead_so_appends_never_grow_a_file(tmp_path):
    """After a checkpoint the current log and the spare hold zeros past their
    records (a commit's fdatasync then journals no new size); the records
    before the zeros are read back, and a reopened folder has them all."""
    path = str(tmp_path / "m")
    s = LMDBStore(path, map_bytes=1 << 30)  # no checkpoint of its own during the test
    w = s._ent.wal
    with s.write() as t:
        t.put("docs", b"before", b"1")
    assert w.checkpoint()
    gen = w.gen
    log, spare = os.path.join(path, wal.wal_name(gen)), os.path.join(path, wal.SPARE)
    sizes = (os.path.getsize(log), os.path.getsize(spare))
    assert min(sizes) >= wal.SPARE_BYTES_MIN
    for i in range(200):
        with s.write() as t:
            t.put("docs", b"k%03d" % i, os.urandom(300))
    s.sync()
    assert w.gen == gen
    assert (os.path.getsize(log), os.path.getsize(spare)) == sizes  # no append grew a file
    assert len(list(wal.records(log, gen))) == 200  # the zeros after them end the log
    s.close()
    assert keys_of(path) == {b"before"} | {b"k%03d" % i for i in range(200)}


def _dirty_pages(fd: int) -> int | None:
    """Pages of ``fd`` dirty in the page cache and not yet being written
    (Linux's ``cachestat``, 6.5 and later), or None where it is missing."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    rng = (ctypes.c_uint64 * 2)(0, 0)  # offset 0, length 0: the whole file
    st = (ctypes.c_uint64 * 5)()  # cache, dirty, writeback, evicted, recently evicted
    if libc.syscall(451, fd, ctypes.byref(rng), ctypes.byref(st), 0) != 0:
        return None
    return st[1]


def test_an_append_starts_its_records_write_back_before_the_sync(tmp_path):
    """The first append after a sync has the kernel start writing its record
    to the device at once (sync_file_range), so the device writes it while
    LMDB commits and the sync that follows waits once, not twice. Seen from the page cache: a
    record's pages are no longer dirty right after its commit, before any
    sync; a page written without the call stays dirty (the kernel writes it
    back 30 s later unless synced). Only the first record after a sync is
    written so: records no sync follows (j=False) wait for the next sync."""
    probe = os.open(str(tmp_path / "probe"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.pwrite(probe, b"x" * 8192, 0)
        if _dirty_pages(probe) is None:
            pytest.skip("no cachestat on this kernel (Linux 6.5+): the page cache cannot be read")
        assert _dirty_pages(probe) == 2  # a plain write leaves its pages dirty
        wal.start_writeback(probe, 100, 5000)  # unaligned: both pages of the range
        assert _dirty_pages(probe) == 0
    finally:
        os.close(probe)
    s = LMDBStore(str(tmp_path / "m"), map_bytes=1 << 30)
    try:
        w = s._ent.wal
        for i in range(20):
            with s.write() as t:
                t.put("docs", b"k%02d" % i, os.urandom(300))
            assert _dirty_pages(w.fd) == 0, f"commit {i} left its record's pages dirty"
            s.sync()  # as a durable write does (a page still being written when the
            # next record lands in it stays dirty until the sync: the kernel does not
            # start a second write of a page under write-back)
        for i in range(20, 24):  # no sync between them (j=False writes): only the
            with s.write() as t:  # first record after a sync is written at once
                t.put("docs", b"k%02d" % i, os.urandom(300))
            assert (_dirty_pages(w.fd) == 0) == (i == 20), f"commit {i}"
        s.sync()
        assert _dirty_pages(w.fd) == 0
        with s.write() as t:
            t.put("docs", b"k24", b"after the sync")
        assert _dirty_pages(w.fd) == 0
    finally:
        s.close()
    assert keys_of(str(tmp_path / "m")) == {b"k%02d" % i for i in range(25)}


def test_two_processes_writing_one_folder_then_killed_lose_nothing_acknowledged(tmp_path):
    """The member's processes share a folder: commits from both are ordered
    in one log, checkpoints by either (a small map forces many) keep the
    other's records, and a SIGKILL of both loses nothing acknowledged."""
    import threading
    path = str(tmp_path / "m")
    LMDBStore(path, map_bytes=8 << 20).close()
    ps = {name: run_child(WRITER, path, name, 100_000, "crash") for name in ("a", "b")}
    acked = {name: -1 for name in ps}

    def read(name, p):
        for line in p.stdout:  # a kill may cut the last line short
            if line.startswith("acked") and line.endswith("\n"):
                acked[name] = int(line.split()[1])
    readers = [threading.Thread(target=read, args=kv) for kv in ps.items()]
    for r in readers:
        r.start()
    deadline = time.monotonic() + 90
    while min(acked.values()) < 400 and time.monotonic() < deadline:
        time.sleep(0.05)
    for p in ps.values():
        p.kill()
    for p, r in zip(ps.values(), readers):
        p.wait()
        r.join()
    assert min(acked.values()) >= 400, (acked, [p.stderr.read()[-2000:] for p in ps.values()])
    got = keys_of(path)
    for name, upto in acked.items():
        missing = acked_keys(name, upto) - got
        # the commit after the last acknowledged one may be in the log (it was
        # committed, its sync not yet answered): it may have deleted a key
        if (upto + 1) % 7 == 6:
            missing.discard(f"{name}-{upto - 2:06d}".encode())
        assert not missing, sorted(missing)[:5]
    assert wal.read_checkpoint(path)[0] > 3  # checkpoints ran while both wrote


def test_a_closing_process_hands_the_pin_to_the_next_writer(tmp_path):
    path = str(tmp_path / "m")
    s = LMDBStore(path, map_bytes=8 << 20)  # first opener: recovers and pins
    w = s._ent.wal
    assert w.pin is not None
    p = run_child(WRITER, path, "a", 20, "close")
    out, err = p.communicate(timeout=120)
    assert "closed" in out, err
    gen, unpinned, _, _ = w._shared_state()
    assert unpinned  # the other process's last checkpoint: nobody pins it
    assert w.pin is None or w.pin_gen < gen  # ours is superseded (and let go within a second)
    with s.write() as t:
        t.put("docs", b"x", b"1")
    assert w.pin is not None and w.pin_gen == w._shared_state()[0]
    assert not w._shared_state()[1]
    s.close()


PINNER = """
import os, sys, time
from raymx.storage.lmdb_store import LMDBStore
s = LMDBStore(sys.argv[1], map_bytes=1 << 30)
for i in range(0, 3000, 100):
    with s.write() as t:
        for k in range(i, i + 100):
            t.put("docs", f"a-{k:06d}".encode(), os.urandom(400))
s._ent.wal.checkpoint()  # this process checkpoints a large tree and pins it
print("pinned", s._ent.wal.pin is not None, flush=True)
sys.stdin.readline()
with s.write() as t:  # killed in here: holding LMDB's writer mutex
    t.put("docs", b"a-dying", b"x")
    print("in-write", flush=True)
    time.sleep(600)
"""

REWRITER = """
import os, sys
from raymx.storage.lmdb_store import LMDBStore
s = LMDBStore(sys.argv[1], map_bytes=1 << 30)
for i in range(3000):  # frees the checkpointed tree's pages; new pages would reuse them
    with s.write() as t:
        if i % 2 == 0:
            t.delete("docs", f"a-{i:06d}".encode())
        t.put("docs", f"b-{i:06d}".encode(), os.urandom(400))
    s.sync()
    print("acked", i, flush=True)
os._exit(0)  # a crash: no close
"""


def test_a_pin_holder_killed_inside_a_write_leaves_no_checkpoint_unprotected(tmp_path):
    """The process that pins the checkpoint dies inside a write transaction.
    LMDB's next writer then finds its writer mutex's owner dead and clears
    every dead process's reader slot, the pin among them; from then on
    commits could reuse the checkpointed tree's pages, and a crash would
    recover onto a tree that is no longer there (seen under the nemesis as
    a member whose restart failed with MDB_PAGE_NOTFOUND). The next writer
    must checkpoint and pin before it writes."""
    path = str(tmp_path / "m")
    a = run_child(PINNER, path, stdin=True)
    line = a.stdout.readline()
    assert line == "pinned True\n", (line, a.stderr.read()[-2000:] if not line else "")
    held = LMDBStore(path, map_bytes=1 << 30)  # keeps the folder open: no recovery in between
    gen_a = held._ent.wal._shared_state()[0]
    a.stdin.write("go\n")
    a.stdin.flush()
    assert a.stdout.readline() == "in-write\n"
    a.kill()
    a.wait()
    b = run_child(REWRITER, path)
    out, err = b.communicate(timeout=300)
    assert out.splitlines()[-1:] == ["acked 2999"], err[-2000:]
    assert held._ent.wal._shared_state()[0] > gen_a  # b checkpointed before it wrote
    held.close()
    got = keys_of(path, 1 << 30)  # the first opener again: recovers from the checkpoint and the log
    want = ({f"a-{i:06d}".encode() for i in range(1, 3000, 2)}
            | {f"b-{i:06d}".encode() for i in range(3000)})
    assert got == want, (len(got), len(want), sorted(got ^ want)[:5])


HOLDER = """
import sys
from raymx.storage.lmdb_store import LMDBStore
s = LMDBStore(sys.argv[1], map_bytes=1 << 30)  # the first opener: checkpoints and pins
print("open", flush=True)
sys.stdin.readline()
"""

DIES_BEFORE_COMMIT = """
import os, signal, sys
from raymx.storage import wal
from raymx.storage.lmdb_store import LMDBStore
append = wal.Wal.append
def dying_append(self, txnid, changes):  # a SIGKILL between the log's append and LMDB's commit
    n = append(self, txnid, changes)
    if b"a-phantom" in changes:
        os.kill(os.getpid(), signal.SIGKILL)
    return n
wal.Wal.append = dying_append
s = LMDBStore(sys.argv[1], map_bytes=1 << 30)
for i in range(20):
    with s.write() as t:
        t.put("docs", f"a-{i:06d}".encode(), b"a")
s.sync()
with s.write() as t:
    t.put("docs", b"a-phantom", b"never committed")
    t.put("docs", b"a-000003", b"never committed")
"""


@contextlib.contextmanager
def folder_held(path: str):
    """Another process keeps the folder open (the first opener: it recovers,
    checkpoints and pins) for the block, so no recovery runs within it; it
    is killed at the end."""
    h = run_child(HOLDER, path, stdin=True)
    try:
        assert h.stdout.readline() == "open\n", h.stderr.read()[-2000:]
        yield h
    finally:
        h.kill()
        h.wait()


def test_a_record_whose_process_died_before_the_commit_is_not_replayed(tmp_path):
    """One of a member's processes is killed after appending its record and
    before LMDB's commit; another writes on the state without that
    transaction, under the same LMDB txnid. Recovery must skip the dead
    record: replayed, it would bring back a transaction that never happened,
    mixed with what was committed after it."""
    path = str(tmp_path / "m")
    with folder_held(path):
        a = run_child(DIES_BEFORE_COMMIT, path)
        a.communicate(timeout=120)
        assert a.returncode == -signal.SIGKILL
        b = run_child(WRITER, path, "b", 200, "crash", 1024)
        out, err = b.communicate(timeout=120)
        assert out.splitlines()[-1:] == ["acked 199"], err[-2000:]
        gen = wal.read_checkpoint(path)[0]
        txnids = [t for t, _ in wal.records(os.path.join(path, f"wal.{gen}"), gen)]
        assert len(txnids) == 20 + 1 + 200 and txnids[21] == txnids[20]  # b reused its txnid
    s = LMDBStore(path, map_bytes=1 << 30)  # the first opener: recovers
    try:
        with s.read() as t:
            assert t.get("docs", b"a-phantom") is None
            assert t.get("docs", b"a-000003") == b"a"
            keys = set(t.scan_keys("docs"))
    finally:
        s.close()
    assert acked_keys("b", 199) <= keys
    assert len([k for k in keys if k.startswith(b"a-")]) == 20


DIES_IN_CHECKPOINT = """
import os, signal, sys
from raymx.storage import wal
from raymx.storage.lmdb_store import LMDBStore
s = LMDBStore(sys.argv[1], map_bytes=1 << 30)
for i in range(50):
    with s.write() as t:
        t.put("docs", f"a-{i:06d}".encode(), b"a")
s.sync()
# killed after the new checkpoint is in place, before the others learn its generation
wal._fsync_dir = lambda path: os.kill(os.getpid(), signal.SIGKILL)
s._ent.wal.checkpoint()
"""


def test_a_checkpointer_killed_before_announcing_its_checkpoint_loses_nothing(tmp_path):
    """A process dies between writing a checkpoint and announcing its
    generation: the member's other processes go on appending to the log they
    know, which is not the new checkpoint's. Recovery must replay what they
    appended after the checkpoint, not drop it."""
    path = str(tmp_path / "m")
    with folder_held(path):
        gen0 = wal.read_checkpoint(path)[0]
        a = run_child(DIES_IN_CHECKPOINT, path)
        a.communicate(timeout=120)
        assert a.returncode == -signal.SIGKILL
        assert wal.read_checkpoint(path)[0] == gen0 + 1  # written, never announced
        b = run_child(WRITER, path, "b", 200, "crash", 1024)
        out, err = b.communicate(timeout=120)
        assert out.splitlines()[-1:] == ["acked 199"], err[-2000:]
    keys = keys_of(path, 1 << 30)  # the first opener: recovers
    assert acked_keys("b", 199) <= keys
    assert {f"a-{i:06d}".encode() for i in range(50)} <= keys


def test_an_idle_process_lets_a_superseded_pin_go(tmp_path):
    """A process that took a checkpoint and then neither reads nor writes (a
    primary's producer or applier) must not keep pinning it once another
    process checkpointed: its read transaction would keep every page freed
    since from reuse, and the data file would grow without end (seen on a
    set's new primary: 180 MiB against its peers' 125)."""
    path = str(tmp_path / "m")
    s = LMDBStore(path, map_bytes=64 << 20)  # the first opener: checkpoints and pins
    w = s._ent.wal
    try:
        old = w.pin_gen
        assert w.pin is not None
        b = run_child(WRITER, path, "b", 2000, "crash", 64)  # checkpoints every MiB of growth
        out, err = b.communicate(timeout=300)
        assert out.splitlines()[-1:] == ["acked 1999"], err[-2000:]
        assert w._shared_state()[0] > old
        deadline = time.monotonic() + 3 * wal.PIN_CHECK_S + 2
        while w.pin is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert w.pin is None  # let go without a read or a write here
        assert str(os.getpid()) not in s._env.readers()
    finally:
        s.close()


@pytest.mark.parametrize("seed", range(4))
def test_power_loss_with_torn_write_back_recovers_every_synced_commit(tmp_path, seed,
                                                                      monkeypatch):
    """Whatever subset of the data file's unsynced pages reached the disk,
    the folder recovers to exactly what was synced."""
    rnd = random.Random(seed)
    path = str(tmp_path / "m")
    disk = {}  # the data file as of the last checkpoint (what its syncs put on disk)
    real = wal.Wal.checkpoint_locked

    def checkpoint_locked(self, pin=True):
        real(self, pin)
        with open(os.path.join(self.folder, "data.mdb"), "rb") as f:
            disk["data"] = f.read()
    monkeypatch.setattr(wal.Wal, "checkpoint_locked", checkpoint_locked)
    e = Engine(LMDBStore(path, map_bytes=16 * MiB))
    with e.begin() as tx:
        tx.create_index("t.c", "k")
    e.sync()
    w = e.store._ent.wal

    def commit(i):
        with e.begin() as tx:
            tx.insert("t.c", [{"_id": i, "k": i % 13, "pad": "x" * rnd.choice((10, 300, 5000))}])
            if i % 4 == 3:
                tx.update("t.c", {"_id": i - 2}, {"$set": {"pad": "y" * rnd.randint(0, 3000)}})
            if i % 9 == 8:
                tx.delete("t.c", {"_id": i - 5})
        e.sync()
    n = rnd.randint(300, 900)
    for i in range(n):
        commit(i)
        if i == 150:
            w.checkpoint()
    # the last commits reach the disk only through the log: a checkpoint, then
    # no other (a background one could end the run with nothing unsynced), and
    # few enough (68-88 pages changed) that the data file's growth stays under
    # twice the checkpoint growth of this 16 MiB map, where a writer checkpoints
    w.checkpoint()
    monkeypatch.setattr(wal.Wal, "ask_checkpoint", lambda self: None)
    for i in range(n, n + 6):
        commit(i)
    want = {d["_id"]: d for d in e.find("t.c", {})}
    assert w.pin is not None and w.pin_gen == w._shared_state()[0]
    # the power goes: build what the disk holds in another folder (with the
    # log's lock held, so the background thread takes no checkpoint meanwhile)
    lost = str(tmp_path / "lost")
    os.makedirs(lost)
    w.lock()
    try:
        for name in os.listdir(path):
            if name == "checkpoint" or name.startswith("wal."):
                shutil.copy(os.path.join(path, name), lost)
        with open(os.path.join(path, "data.mdb"), "rb") as f:
            now = f.read()
        old = disk["data"]
    finally:
        w.unlock()
    psize = 4096
    changed = [n for n in range(len(now) // psize)
               if now[n * psize:(n + 1) * psize] != old[n * psize:(n + 1) * psize]]
    assert len(changed) > 10
    strategy = ("meta-only", "data-only", "half", "tenth")[seed % 4]
    back = {n for n in changed if (n < 2 if strategy == "meta-only" else n >= 2
                                   if strategy == "data-only" else
                                   rnd.random() < (0.5 if strategy == "half" else 0.1))}
    torn = bytearray(old)
    for n in back:
        page = now[n * psize:(n + 1) * psize]
        torn[n * psize:n * psize + len(page)] = page  # past the old end: the file grows
    with open(os.path.join(lost, "data.mdb"), "wb") as f:
        f.write(torn)
    monkeypatch.undo()
    e2 = Engine(LMDBStore(lost, map_bytes=16 * MiB))
    got = {d["_id"]: d for d in e2.find("t.c", {})}
    assert got == want
    assert e2.verify_oplog() > 0
    assert e2.count("t.c", {"k": 5}) == sum(1 for d in want.values() if d["k"] == 5)
    e2.store.close()
    e.store.close()
