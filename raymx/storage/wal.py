"""The write-ahead log of an LMDB store: durable commits at one sequential
``fdatasync``, and a data file that survives power loss.

LMDB runs with ``MDB_NOSYNC``: a commit writes its pages and meta page into
the OS's cache and nothing reaches the disk at commit. What makes a commit
durable is its record here: every top-level write transaction appends, just
before its LMDB commit and under a lock that orders writers across the
member's processes, one record of the key/value changes it made (puts and
deletes per sub-database). ``LMDBStore.sync()`` is one ``fdatasync`` of the
log file, which covers every record appended before it, by any process. The
first record appended after a sync also has the kernel start writing it to
the device at once (``start_writeback``), so the device writes it while LMDB
commits and the sync mostly waits for the device's cache flush.

Checkpoints make the log short again. Under the same lock (no writer
anywhere in between): ``fdatasync`` of the data file, then the meta page of
that state (the newest of LMDB's two) is written to ``checkpoint`` (write a
temporary file, ``fsync``, rename, ``fsync`` the folder) with the name of a
new, empty log file; the old log is deleted. The checkpointing process keeps
a read transaction open on that state (the *pin*) until the next checkpoint,
so LMDB never reuses a page of the checkpointed tree; whatever the kernel
writes back of later commits, in any order and torn anywhere, lands on
other pages or on the two meta pages.

Recovery, by the first process to open the folder (a shared ``flock`` on
``.wal.users`` held by every process that has it open; the first takes it
exclusively): the checkpoint's meta page is written over both of LMDB's
meta pages (so the file is the checkpointed state, exactly), LMDB opens it,
the log's records are applied in order as write transactions, each ending
the first time a record is torn or fails its CRC (a prefix of the log is
what reached the disk: records are appended in commit order and a sync
covers everything before it), and a checkpoint ends it. A record of a
transaction whose process died before LMDB's commit is skipped (see
``committed``).

The pin lives in one process. It is handed on when that process closes the
store while others have it open: its last checkpoint is marked *unpinned*
and the next writer, anywhere, checkpoints (and pins) before it writes. A
process that dies holding the pin leaves LMDB's reader slot behind, but
nothing keeps it there: LMDB clears every dead process's slot whenever it
finds a mutex whose owner died (a process killed inside a write transaction
leaves the writer mutex so) and on ``reader_check``. So the pinning process
also holds a POSIX record lock on the byte of ``.wal.pin`` numbered by its
checkpoint's generation, which the kernel releases when the process dies;
every writer of another process tests that lock before it writes (under the
writers' lock) and, if nobody holds it, checkpoints and pins first. A remap
of the map (``set_mapsize``) ends this process's transactions, the pin among
them: a remap runs only under the lock, and a checkpoint follows it at once.

A transaction too large to log (more than ``UNLOGGED_OPS`` changes) is
made durable by a checkpoint at its commit instead.

The format: ``checkpoint`` = ``<4s magic, u32 version, u64 generation, u64
txnid, u32 page size, u32 meta bytes>`` + the meta page + ``u32 crc32`` of
all before it. ``wal.<generation>`` = records of ``<u32 payload bytes, u32
crc32 of the payload, u64 LMDB txnid>`` + payload, the payload a msgpack
list ``[db index, key, value or nil (a delete), ...]``, db index into
``store.DBS``. The layout of LMDB's meta page (LMDB 0.9, 64-bit) is checked
at every checkpoint against what LMDB reports.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import struct
import threading
import time
import zlib

import msgpack

from raymx.storage import errors

MiB = 1 << 20
CHECKPOINT_BYTES = 64 * MiB  # a log this long asks for a checkpoint
# The pin keeps every page freed since the checkpoint from reuse, so the data
# file grows by each commit's new pages until the next checkpoint: one is
# asked for (taken by a background thread) once it grew by this much, and is
# taken by the next writer, under the lock, at twice that, or after every
# commit while the file's end is that close to the map's end (so the pages a
# drop or delete frees are free for the next write).
CHECKPOINT_GROWTH_BYTES = 16 * MiB
CHECKPOINT_GROWTH_MAP_FRACTION = 1 / 64  # ... or by this much of the map, if less
UNLOGGED_OPS = 200_000  # a transaction with more changes is not logged: checkpointed
LOCK_WAIT_S = 0.2  # an opportunistic checkpoint or remap waits this long for the lock
# A process that pins a checkpoint another process has since superseded lets
# the pin go within this long even if it neither reads nor writes (an idle
# producer or applier on a primary): until then every page freed since its
# checkpoint stays unused, and the data file only grows.
PIN_CHECK_S = 1.0

CKPT = "checkpoint"
_CKPT_HEAD = struct.Struct("<4sIQQII")
_CKPT_MAGIC, _CKPT_VERSION = b"RMXC", 1
REC = struct.Struct("<IIIQ")  # payload bytes, crc32(gen, txnid, payload), generation, txnid
SPARE = "wal.spare"  # the log before the current one, reused as the next (see checkpoint)
# Logs are written out (zeros past their ends, synced) ahead of their appends,
# so a commit's fdatasync journals no size change (see ``_prepare_logs``).
SPARE_BYTES_MIN = 1 * MiB
# LMDB 0.9's meta page, 64-bit: a 16-byte page header, then MDB_meta
_META_PGNO, _META_MAGIC, _META_LAST_PG, _META_TXNID = 0, 16, 136, 144
_MDB_MAGIC = 0xBEEFC0DE
# the shared lock file's mapped words: checkpoint generation, unpinned flag,
# the checkpoint's last page, the log's end (where the next record goes)
_SHARED = struct.Struct("<QQQQ")
_END_AT = 24


def wal_name(gen: int) -> str:
    return f"wal.{gen}"


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_meta(data_path: str, psize: int) -> bytes:
    """The newest of the data file's two meta pages (as the file holds them now)."""
    with open(data_path, "rb") as f:
        pages = [f.read(psize), f.read(psize)]
    for p in pages:
        if len(p) != psize or struct.unpack_from("<I", p, _META_MAGIC)[0] != _MDB_MAGIC:
            raise errors.CorruptStore(f"{data_path}: not an LMDB meta page where one must be")
    return max(pages, key=meta_txnid)


def meta_txnid(page: bytes) -> int:
    return struct.unpack_from("<Q", page, _META_TXNID)[0]


def read_checkpoint(folder: str) -> tuple[int, int, int, bytes] | None:
    """(generation, txnid, page size, meta page) of the folder's checkpoint, or None."""
    path = os.path.join(folder, CKPT)
    try:
        with open(path, "rb") as f:
            b = f.read()
    except FileNotFoundError:
        return None
    if len(b) >= _CKPT_HEAD.size + 4:
        magic, version, gen, txnid, psize, n = _CKPT_HEAD.unpack_from(b)
        body = b[:_CKPT_HEAD.size + n]
        if (magic == _CKPT_MAGIC and version == _CKPT_VERSION
                and len(b) == len(body) + 4
                and zlib.crc32(body) == struct.unpack_from("<I", b, len(body))[0]):
            return gen, txnid, psize, body[_CKPT_HEAD.size:]
    # written to a temporary file, synced and renamed: never torn by a crash
    raise errors.CorruptStore(f"{path} is damaged (not a checkpoint raymx wrote): the "
                              "folder cannot be recovered to a known state")


def restore_meta(folder: str) -> int | None:
    """Recovery's first step (no process has the folder open): write the
    checkpoint's meta page over both of the data file's meta pages and sync
    it. Returns the checkpoint's generation (None: no checkpoint yet, a
    store made before the log or never opened)."""
    ck = read_checkpoint(folder)
    if ck is None:
        return None
    gen, txnid, psize, meta = ck
    data = os.path.join(folder, "data.mdb")
    try:
        fd = os.open(data, os.O_RDWR)
    except FileNotFoundError:
        raise errors.CorruptStore(f"{folder} has a checkpoint but no data.mdb: was the "
                                  "folder copied in part?") from None
    try:
        for pgno in (0, 1):
            page = bytearray(meta)
            struct.pack_into("<Q", page, _META_PGNO, pgno)
            os.pwrite(fd, bytes(page), pgno * psize)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    return gen


def records(path: str, gen: int):
    """(txnid, changes) of each whole record of log ``gen``, in order, up to
    the first torn or damaged one (the end of what reached the disk) or one
    of an older generation (a reused file's old content)."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return
    with f:
        while True:
            head = f.read(REC.size)
            if len(head) < REC.size:
                return
            n, crc, g, txnid = REC.unpack(head)
            if n == 0 or g != gen & 0xFFFFFFFF:
                return
            payload = f.read(n)
            if len(payload) < n or zlib.crc32(payload, zlib.crc32(head[8:])) != crc:
                return
            yield txnid, msgpack.unpackb(payload, raw=False, use_list=True)


def committed(recs):
    """The records of ``recs`` (``records``' pairs) whose transactions
    committed. A process that dies between appending its record and LMDB's
    commit (a SIGKILL of one of the member's processes) leaves a record of a
    transaction that never happened, and the next writer, in another process
    or a restarted one, commits on the state without it, under the same LMDB
    txnid. LMDB's txnids rise by one per commit in the log's order, so a
    record followed by one with the same or a lower txnid never committed;
    the log's last record is replayed (a crash right after its commit, or
    before it: either way a state that was whole)."""
    prev = None
    for rec in recs:
        if prev is not None and rec[0] > prev[0]:
            yield prev
        prev = rec
    if prev is not None:
        yield prev


def encode(gen: int, txnid: int, changes: list) -> bytes:
    payload = msgpack.packb(changes, use_bin_type=True)
    tail = struct.pack("<IQ", gen & 0xFFFFFFFF, txnid)
    return struct.pack("<II", len(payload), zlib.crc32(payload, zlib.crc32(tail))) + tail + payload


def _libc_sync_file_range():
    """libc's ``sync_file_range`` (Linux), or None where there is none."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _libc_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, at: int, n: int) -> None:
    """Have the kernel start writing bytes ``at``..``at + n`` of ``fd`` to the
    device now, without waiting (``sync_file_range(SYNC_FILE_RANGE_WRITE)``
    over their pages): the device writes a record while the LMDB commit after
    its append runs, and the sync that follows only waits for that write and
    flushes the device's cache, one I/O wait where it had two (measured:
    ARCHITECTURE.md, "The log's record written while LMDB commits").
    Durability does not rest on it: the sync covers the record whatever this
    did, and a write-back error is reported by that ``fdatasync`` (the
    file's error sequence), so a failure here is ignored. Without the call
    (not Linux) the sync writes the record itself."""
    if _SYNC_FILE_RANGE is not None:
        start = at & ~(mmap.PAGESIZE - 1)
        _SYNC_FILE_RANGE(fd, start, at + n - start, _SYNC_FILE_RANGE_WRITE)


class Wal:
    """The log of one folder in this process (shared by its store objects).

    ``lock()``/``unlock()`` order writers across processes: a thread lock, then
    an exclusive ``flock`` on ``.wal.lock``. Its first page is mapped shared;
    it holds the current checkpoint's generation and whether it is unpinned,
    so a writer learns of another process's checkpoint without a system call."""

    def __init__(self, folder: str):
        self.folder = folder
        self._tlock = threading.Lock()
        self._fdlock = threading.Lock()  # fd and pin changes
        self._owner: int | None = None
        self._lfd = os.open(os.path.join(folder, ".wal.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        if os.fstat(self._lfd).st_size < mmap.PAGESIZE:
            os.ftruncate(self._lfd, mmap.PAGESIZE)
        self._shared = mmap.mmap(self._lfd, mmap.PAGESIZE)
        self._ufd = os.open(os.path.join(folder, ".wal.users"), os.O_RDWR | os.O_CREAT, 0o600)
        # byte <generation> locked by the process pinning that checkpoint (see above)
        self._pfd = os.open(os.path.join(folder, ".wal.pin"), os.O_RDWR | os.O_CREAT, 0o600)
        self.env = None  # set by the store once LMDB is open
        self.gen = -1  # the generation of self.fd
        self.fd: int | None = None
        self._old_fd: int | None = None  # closed at the next switch (a sync may use it)
        self.pin = None  # LMDB read transaction on the checkpointed state
        self.pin_gen = -1
        self.logged = 0  # bytes this process appended to the current log
        self.synced_since_append = True  # see append
        self.want_checkpoint = False
        self._commits, self._check_every = 0, 1
        self.checkpoint_first = False  # the map was full: checkpoint before a write
        self._wake = threading.Event()
        self._bg: threading.Thread | None = None
        self._closing = False
        self.failed: str | None = None

    def attach(self, env, begin_pin, grow_ahead) -> None:
        """``begin_pin``: the store's begin of a pin (a read transaction on the
        state just checkpointed), which adopts a map another process grew;
        ``grow_ahead(used bytes, map bytes)``: told what LMDB's info says
        after a commit (``after_commit``)."""
        self.env, self._psize = env, env.stat()["psize"]
        self._begin_pin, self._grow_ahead = begin_pin, grow_ahead

    # ---- the folder's users: first opener recovers
    def enter(self) -> bool:
        """Take the users lock: exclusively (True: no other process has the
        folder open; recover) or else shared, once any recovery is done."""
        try:
            fcntl.flock(self._ufd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            fcntl.flock(self._ufd, fcntl.LOCK_SH)
            return False

    def entered(self) -> None:
        fcntl.flock(self._ufd, fcntl.LOCK_SH)  # from exclusive: recovery done

    # ---- the writers' lock
    def lock(self, timeout: float | None = None) -> bool:
        me = threading.get_ident()
        if timeout is None:
            self._tlock.acquire()
        else:
            if self._owner == me or not self._tlock.acquire(timeout=timeout):
                return False
        try:
            if timeout is None:
                fcntl.flock(self._lfd, fcntl.LOCK_EX)
            else:
                deadline = time.monotonic() + timeout
                while True:
                    try:
                        fcntl.flock(self._lfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() >= deadline:
                            self._tlock.release()
                            return False
                        time.sleep(0.001)
        except BaseException:
            self._tlock.release()
            raise
        self._owner = me
        return True

    def unlock(self) -> None:
        self._owner = None
        fcntl.flock(self._lfd, fcntl.LOCK_UN)
        self._tlock.release()

    def held(self) -> bool:
        return self._owner == threading.get_ident()

    def _shared_state(self) -> tuple[int, int, int, int]:
        return _SHARED.unpack_from(self._shared, 0)

    def before_write(self) -> None:
        """With the lock held, before a write transaction begins: follow a
        checkpoint another process took; take one if the last is unpinned
        or the map was full."""
        gen, unpinned, _, _ = _SHARED.unpack_from(self._shared, 0)
        if unpinned or self.checkpoint_first or not self._pinned(gen):
            self.checkpoint_locked()
        elif gen != self.gen:
            self._switch(gen)

    def _pinned(self, gen: int) -> bool:
        """Is checkpoint ``gen`` pinned by a live process? (Lock held.) Its
        pinning process holds the byte lock until it lets the pin go or dies."""
        if self.pin is not None and self.pin_gen == gen:
            return True  # this process's own (record locks never conflict within one)
        try:
            fcntl.lockf(self._pfd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, gen)
        except OSError:  # EAGAIN or EACCES: held
            return True
        fcntl.lockf(self._pfd, fcntl.LOCK_UN, 1, gen)
        return False

    def after_commit(self) -> None:
        """With the lock held, after a commit: ask for a checkpoint, or take
        one now, as the data file grew since the last (see the limits)."""
        self._commits += 1
        if self._commits % self._check_every and not self.want_checkpoint:
            return  # LMDB's info every 8th commit in a large map: the limits are far apart
        info = self.env.info()
        self._check_every = 8 if info["map_size"] >= 1 << 30 else 1
        self._grow_ahead((info["last_pgno"] + 1) * self._psize, info["map_size"])
        soft = min(CHECKPOINT_GROWTH_BYTES,
                   int(info["map_size"] * CHECKPOINT_GROWTH_MAP_FRACTION)) // self._psize
        grown = info["last_pgno"] - _SHARED.unpack_from(self._shared, 0)[2]
        room = info["map_size"] // self._psize - info["last_pgno"]
        if grown > 2 * soft or room < 2 * soft:  # near the map's end: free what is freed now
            try:
                self.checkpoint_locked()
            except OSError as e:  # no room for the checkpoint's file now: the commit
                if not no_room(e):  # stands (it is in the log); the background thread
                    raise           # tries again
                self.ask_checkpoint()
        elif grown > soft or self.want_checkpoint:
            self.ask_checkpoint()

    def ask_checkpoint(self) -> None:
        """Have the background thread take a checkpoint soon."""
        self.want_checkpoint = True
        self._background()
        self._wake.set()

    def _background(self) -> None:
        if self._bg is None:
            self._bg = threading.Thread(target=self._checkpointer, daemon=True,
                                        name=f"raymx-checkpoint {self.folder}")
            self._bg.start()

    def _checkpointer(self) -> None:
        """Takes the checkpoints asked for, and lets a superseded pin go."""
        while True:
            self._wake.wait(PIN_CHECK_S)
            self._wake.clear()
            if self._closing or self.failed is not None:
                return
            if self.want_checkpoint:
                try:
                    self.checkpoint()
                except Exception as e:
                    # a map another process grew, not adopted yet, or no room for the
                    # checkpoint's file: nothing changed, asked again at the next wake
                    if isinstance(e, errors.DiskFull) or no_room(e):
                        continue
                    self.failed = f"checkpoint: {type(e).__name__}: {e}"
                    return  # the next sync or write meets it too
            elif self.pin is not None:
                self.drop_stale_pin()

    def _switch(self, gen: int, pin=False) -> None:
        """Append to log ``gen`` from now on. A pin of an older checkpoint is
        dropped (another process pins the current one), or replaced by
        ``pin`` (this process's new checkpoint)."""
        with self._fdlock:
            if gen != self.gen or self.fd is None:
                fd = os.open(os.path.join(self.folder, wal_name(gen)),
                             os.O_WRONLY | os.O_CREAT, 0o600)
                if self._old_fd is not None:
                    os.close(self._old_fd)
                self._old_fd, self.fd, self.gen, self.logged = self.fd, fd, gen, 0
            if pin is not False or (self.pin is not None and self.pin_gen != gen):
                if self.pin is not None:
                    try:
                        self.pin.abort()
                    except Exception:
                        pass  # ended by a remap already
                    fcntl.lockf(self._pfd, fcntl.LOCK_UN, 1, self.pin_gen)
                if pin not in (False, None):
                    fcntl.lockf(self._pfd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, gen)
                    self._background()  # lets it go once another checkpoint supersedes it
                self.pin, self.pin_gen = (None if pin is False else pin), gen

    # ---- appends and syncs
    def append(self, txnid: int, changes: list) -> int:
        """With the lock held, before the LMDB commit: append the record;
        returns its bytes.

        The first record after a sync (by this process) starts its write at
        once (``start_writeback``): where syncs follow appends (durable
        writes, one group and its sync after another) that is every record;
        where they do not (``j=False`` writes, synced by the syncer every
        interval) it is one record an interval, as writing each record at
        once cost those writes 10-20% (the call's 26-31 us, and a device
        write per commit)."""
        rec = encode(self.gen, txnid, changes)
        at = struct.unpack_from("<Q", self._shared, _END_AT)[0]
        try:
            n = os.pwrite(self.fd, rec, at)  # over a reused log's old records: no
        except OSError:                      # size change for fdatasync to journal
            self._void(at)
            raise
        if n != len(rec):
            self._void(at)
            raise OSError(28, "short write to the log (is the disk full?)")
        struct.pack_into("<Q", self._shared, _END_AT, at + n)
        if self.synced_since_append:
            self.synced_since_append = False
            start_writeback(self.fd, at, n)
        self.logged += n
        if at + n >= CHECKPOINT_BYTES:
            self.want_checkpoint = True  # after_commit asks the thread
        return n

    def _void(self, at: int) -> None:
        """No record at ``at``: recovery ends there (a zero length)."""
        try:
            os.pwrite(self.fd, bytes(REC.size), at)
        except OSError:
            pass  # nothing was written there either

    def drop_stale_pin(self) -> None:
        """A process that pins an older checkpoint than the current one (it took
        that one and has not written since) lets its pages go."""
        gen = self._shared_state()[0]
        if self.pin is not None and self.pin_gen != gen:
            self._switch(gen)

    def remapped(self) -> None:
        """A remap (lock held) ended this process's transactions: a pin of the
        current checkpoint is renewed by a checkpoint now, before any write."""
        if self.pin is not None:
            if self.pin_gen == self._shared_state()[0]:
                self.checkpoint_locked()
            else:
                self._switch(self._shared_state()[0])

    def unappend(self, nbytes: int) -> None:
        """The LMDB commit after ``append`` failed: drop the record (lock held)."""
        at = struct.unpack_from("<Q", self._shared, _END_AT)[0] - nbytes
        os.pwrite(self.fd, bytes(REC.size), at)
        struct.pack_into("<Q", self._shared, _END_AT, at)
        self.logged -= nbytes

    def sync(self) -> None:
        """fdatasync the current log: every record appended before it, by any
        process, is durable (an older log's records are in the checkpoint
        that ended it)."""
        if self.failed is not None:
            raise errors.DiskFailed(f"{self.folder}: {self.failed}")
        gen = self._shared_state()[0]
        if gen != self.gen or self.fd is None:
            self._switch(gen)
        os.fdatasync(self.fd)
        self.synced_since_append = True

    # ---- checkpoints
    def checkpoint(self) -> bool:
        """Take a checkpoint if the lock can be had soon (False: not now)."""
        if self.env is None:
            return False
        self.env.sync(True)  # most pages, before holding writers back
        if not self.lock(timeout=LOCK_WAIT_S):
            return False
        prepared = []
        try:
            ended = self._shared_state()[3]  # the length of the log this one ends
            self.checkpoint_locked()
            prepared = self._prepare_logs(ended)
        finally:
            self.unlock()
        self._sync_prepared(prepared)
        return True

    def _prepare_logs(self, ended: int) -> list[int]:
        """Lock held, right after a checkpoint: the current log and the spare
        (the log after next) are written out with zeros past their ends, to
        twice ``ended`` (the length of the log just ended; at least
        ``SPARE_BYTES_MIN``, at most ``CHECKPOINT_BYTES``), so appends land in
        written blocks: an append past a file's end makes its fdatasync
        journal the new size too (measured: 78% of appends did, one client,
        and such a sync took 50-60 us more). Recovery reads a zero length as
        the log's end. Returns the descriptors to sync once the lock is let
        go (the zeros are only in the page cache until then)."""
        want = min(CHECKPOINT_BYTES, max(SPARE_BYTES_MIN, 2 * ended))
        fds = []
        for name in (wal_name(self.gen), SPARE):
            try:
                fd = os.open(os.path.join(self.folder, name), os.O_WRONLY | os.O_CREAT, 0o600)
            except OSError:
                continue
            try:
                at = os.fstat(fd).st_size
                zeros = bytes(min(max(want - at, 0), MiB))
                while at < want:
                    at += os.pwrite(fd, zeros[:want - at], at)
            except OSError:  # no room: that log grows as it goes, as it would anyway
                pass
            fds.append(fd)
        return fds

    @staticmethod
    def _sync_prepared(fds: list[int]) -> None:
        try:
            for fd in fds:
                os.fdatasync(fd)
        finally:
            for fd in fds:
                os.close(fd)

    def checkpoint_locked(self, pin: bool = True) -> None:
        """Lock held, no write transaction open in any process."""
        env = self.env
        env.sync(True)
        psize = self._psize
        meta = _read_meta(os.path.join(self.folder, "data.mdb"), psize)
        txnid = env.info()["last_txnid"]
        if meta_txnid(meta) != txnid:
            raise errors.CorruptStore(
                f"{self.folder}: LMDB's meta page says txnid {meta_txnid(meta)}, LMDB "
                f"{txnid}: this LMDB's meta layout is not the one raymx's log knows")
        new_pin = self._begin_pin() if pin else None
        if new_pin is not None and new_pin.id() != txnid:
            new_pin.abort()
            raise errors.CorruptStore(f"{self.folder}: a commit ran during a checkpoint")
        gen = max(self._shared_state()[0], self.gen) + 1
        new_log = os.path.join(self.folder, wal_name(gen))
        try:
            try:  # the log before the current one (its checkpoint is superseded) is reused:
                os.rename(os.path.join(self.folder, SPARE), new_log)  # its blocks are written
            except FileNotFoundError:
                os.close(os.open(new_log, os.O_WRONLY | os.O_CREAT, 0o600))
            body = _CKPT_HEAD.pack(_CKPT_MAGIC, _CKPT_VERSION, gen, txnid, psize,
                                   len(meta)) + meta
            tmp = os.path.join(self.folder, CKPT + ".tmp")
            with open(tmp, "wb") as f:
                f.write(body + struct.pack("<I", zlib.crc32(body)))
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, os.path.join(self.folder, CKPT))
            _fsync_dir(self.folder)
        except BaseException:  # (no room for the file: taken again later) the new
            if new_pin is not None:  # pin goes; the checkpoint before stands
                new_pin.abort()
            raise
        _SHARED.pack_into(self._shared, 0, gen, 0 if pin else 1,
                          struct.unpack_from("<Q", meta, _META_LAST_PG)[0], 0)
        self._switch(gen, pin=new_pin)
        self.want_checkpoint = self.checkpoint_first = False
        try:  # the log this checkpoint supersedes: the next one, later
            os.rename(os.path.join(self.folder, wal_name(gen - 1)),
                      os.path.join(self.folder, SPARE))
        except FileNotFoundError:
            pass
        for name in os.listdir(self.folder):
            if name.startswith("wal.") and name not in (wal_name(gen), SPARE):
                try:
                    os.unlink(os.path.join(self.folder, name))
                except FileNotFoundError:
                    pass
        env.reader_check()  # a dead process's pin of an older checkpoint

    def recover(self, dbs: tuple, gen: int | None, log=None) -> int:
        """First opener: apply the log after the checkpoint, then checkpoint.
        Returns the number of transactions replayed."""
        env = self.env
        pin = env.begin(write=False, buffers=False)  # the checkpointed state stays intact
        base = env.info()["last_txnid"]  # the checkpoint's
        _SHARED.pack_into(self._shared, 0, gen or 0, 0, 0, 0)  # nobody else has it open
        n = 0
        try:
            if gen is not None:
                for _txnid, changes in committed(self._after_checkpoint(gen, base)):
                    with env.begin(write=True) as t:
                        apply(t, dbs, changes)
                    n += 1
            self.lock()
            try:
                self.checkpoint_locked()
                prepared = self._prepare_logs(0)
            finally:
                self.unlock()
            self._sync_prepared(prepared)
        finally:
            pin.abort()
        if n and log is not None:
            log(n)
        return n

    def _after_checkpoint(self, gen: int, base: int):
        """The records to replay onto checkpoint ``gen`` (LMDB txnid
        ``base``): log ``gen``'s, after those of log ``gen - 1`` past ``base``.
        A checkpointing process that died after writing the checkpoint and
        before announcing its generation (the shared page) left the others
        appending to log ``gen - 1``, the current one as far as they knew;
        otherwise that log holds nothing past ``base``, or was recycled."""
        for txnid, changes in records(os.path.join(self.folder, wal_name(gen - 1)), gen - 1):
            if txnid > base:
                yield txnid, changes
        yield from records(os.path.join(self.folder, wal_name(gen)), gen)

    def close(self) -> None:
        """Last store object of the folder in this process closes: checkpoint
        (unpinned, the pin goes with this process) if it wrote or pins."""
        self._closing = True
        self._wake.set()
        if self._bg is not None:
            self._bg.join(timeout=30)  # a checkpoint under way ends before LMDB closes
        try:
            if self.env is not None and self.failed is None and (
                    self.logged or self.pin is not None) and self.lock(timeout=5.0):
                try:
                    self.checkpoint_locked(pin=False)
                finally:
                    self.unlock()
        finally:
            if self.pin is not None:
                try:
                    self.pin.abort()
                except Exception:
                    pass
                self.pin = None
            for fd in (self.fd, self._old_fd):
                if fd is not None:
                    os.close(fd)
            self.fd = self._old_fd = None
            self._shared.close()
            os.close(self._lfd)
            os.close(self._ufd)
            os.close(self._pfd)  # and with it this process's pin lock


def no_room(e: BaseException) -> bool:
    """An OSError that says the file system is full (or the quota used)."""
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


def apply(t, dbs: tuple, changes: list) -> None:
    """Redo one record's changes in the LMDB write transaction ``t``."""
    for i in range(0, len(changes), 3):
        d, k, v = dbs[changes[i]], changes[i + 1], changes[i + 2]
        if v is None:
            t.delete(k, db=d)
        else:
            t.put(k, v, db=d)
