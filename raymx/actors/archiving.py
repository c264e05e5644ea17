"""The oplog archive's shell (DESIGN section 9): the files. What to archive and
what trimming may drop are decided in ``raymx.storage.archive`` (pure).

The primary writes the segments (majority-committed entries only, so every
member's copy of them is the same), on its trimmer thread, before trimming;
every member reads the shared index to know how far trimming may go, and
change streams read through it when a resume token is older than the live
oplog. The location is a local folder or any ``pyarrow.fs`` URI.
"""
from __future__ import annotations

import logging
import os
import time
import uuid

from raymx.storage import archive as A
from raymx.storage import codec, errors
from raymx.storage.gtid import GTID
from raymx.storage.keys import prefix_end

log = logging.getLogger("raymx.archive")

LAG_S_DEFAULT = 1.0


def open_fs(uri: str):
    """(pyarrow filesystem, base path) of an archive location."""
    import pyarrow.fs as pafs
    if "://" in uri:
        fs, path = pafs.FileSystem.from_uri(uri)
    else:
        fs, path = pafs.LocalFileSystem(), os.path.abspath(uri)
    return fs, path.rstrip("/")


def read_index(fs, base: str, cached: tuple | None = None) -> dict:
    """The archive's index; ``cached``: ``(stamp, index)`` of an earlier read,
    returned as is while the file's size and mtime are the same (every member
    looks every round; it changes once a segment)."""
    return read_index_stamped(fs, base, cached)[1]


def read_index_stamped(fs, base: str, cached: tuple | None = None) -> tuple:
    import pyarrow.fs as pafs
    info = fs.get_file_info(f"{base}/{A.INDEX}")
    if info.type == pafs.FileType.NotFound:
        return None, A.empty_index()
    stamp = (info.size, info.mtime_ns)
    if cached is not None and cached[0] == stamp:
        return cached
    with fs.open_input_stream(f"{base}/{A.INDEX}") as f:
        return stamp, A.parse_index(f.read())


def read_segment(fs, base: str, seg: dict):
    """A segment's rows as an Arrow table (in (seq, idx) order). A segment
    written before a column existed (``replace``, stop 41; ``lsid`` and
    ``txn_number``, stop 45) gets it, all null."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from raymx.spark_bridge.convert import CHANGES_SCHEMA
    tb = pq.read_table(f"{base}/{seg['file']}", filesystem=fs)
    for f in CHANGES_SCHEMA:
        if f.name not in tb.column_names:
            tb = tb.append_column(f, pa.nulls(tb.num_rows, f.type))
    return tb.select(CHANGES_SCHEMA.names)  # in the schema's order


NICE = 10  # the worker's niceness: writes first


def _worker_init(parent: int) -> None:
    """In the worker process: lower priority; exit when the member's process is gone."""
    import threading
    try:
        os.nice(NICE)
    except OSError:
        pass

    def watch():
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(0)
    threading.Thread(target=watch, daemon=True).start()


def write_segment(engine, uri: str, tmp: str, after: GTID | None, until_seq: int):
    """Write the entries after ``after`` up to ``until_seq`` as a Parquet file
    at ``tmp``; returns (first, last, rows, CPU seconds of this process)."""
    import pyarrow.parquet as pq
    cpu = time.process_time()
    fs, _ = open_fs(uri)
    f, la, table = Archive._rows_of(engine, after, until_seq)
    pq.write_table(table, tmp, filesystem=fs, compression="zstd")
    return f, la, table.num_rows, time.process_time() - cpu


def segment_from_files(path: str, limits, member_id: int, uri: str, tmp: str,
                       after: GTID | None, until_seq: int):
    """``write_segment`` in the worker process, over the member's LMDB files."""
    from raymx.spark_bridge.direct import local_engine
    return write_segment(local_engine(path, limits, member_id), uri, tmp, after, until_seq)


class Archive:
    """One member's view of the set's archive: it writes segments while the
    member is primary, and everyone reads the index."""

    def __init__(self, cfg: dict, limits=None, member_id: int = 0):
        self.cfg = dict(cfg)
        self.limits, self.member_id = limits, member_id
        self._executor = None
        self._stamped = None  # (size and mtime, index) of the last index read
        self.uri = cfg["uri"]
        self.lag_ms = int(float(cfg.get("lag_s", LAG_S_DEFAULT)) * 1000)
        self.fs = self.base = None
        self.idx: dict | None = None   # the last index read (None: never read)
        self.error: str | None = None
        # ms: wall time of the writes; cpu_ms: the CPU the conversions took
        self.written = {"segments": 0, "rows": 0, "entries": 0, "ms": 0.0, "cpu_ms": 0.0,
                        "adopted": 0}
        self._rows: dict[str, list] = {}  # segment file -> rows (the last few read)
        # look for a segment an earlier writer left unrecorded: at the start and
        # after an error (listing the folder every round would cost as it grows)
        self._suspect = True

    # --- writing (the primary) and the trim bound (everyone) -----------------
    def step(self, engine, primary: bool, term: int, majority: GTID | None, now_ms: int,
             want_trim: bool) -> None:
        """One round on the trimmer thread: read the index; on the primary,
        archive what is due. Errors are kept for status, not raised: trimming
        then stays at what the index last said (nothing lost)."""
        try:
            if self.fs is None:
                self.fs, self.base = open_fs(self.uri)
            if self._suspect:  # at the start and after an error (the folder went?)
                self.fs.create_dir(self.base, recursive=True)
            self.idx = self._read_index()
            while primary and self._write_one(engine, term, majority, now_ms, want_trim):
                pass
            self.error = None
        except Exception as e:
            self._suspect = True
            msg = f"{type(e).__name__}: {e}"
            if msg != self.error:
                log.warning("the oplog archive at %s: %s", self.uri, msg)
            self.error = msg

    def _write_one(self, engine, term, majority, now_ms, want_trim) -> bool:
        info = engine.oplog_info()
        first = info["first"]
        idx = self.idx
        t = A.through(idx)
        pending_ts = None
        if first is not None and majority is not None:
            pending_ts = self._entry_ts(engine, None if t is None or t.seq + 1 < first.seq
                                        else t)
        plan = A.next_segment(idx, first, majority, pending_ts, now_ms, self.lag_ms, want_trim)
        if plan is None:
            return False
        after, until_seq = plan
        t0 = time.perf_counter()
        adopt, cpu = None, 0.0
        if self._suspect:
            import pyarrow.fs as pafs
            names = [i.base_name for i in self.fs.get_file_info(pafs.FileSelector(self.base))]
            adopt = A.adoptable(names, first.seq if after is None else after.seq + 1)
        if adopt is not None:
            f, la, name = adopt
            import pyarrow.parquet as pq
            rows = pq.read_metadata(f"{self.base}/{name}", filesystem=self.fs).num_rows
        else:
            tmp = f"{self.base}/{A.TMP_PREFIX}{uuid.uuid4().hex}"
            path = getattr(engine.store, "path", None)
            if path is None:  # an in-memory store (the simulation): here
                f, la, rows, cpu = write_segment(engine, self.uri, tmp, after, until_seq)
            else:  # the conversion's CPU goes to a process of its own
                f, la, rows, cpu = self._pool().submit(
                    segment_from_files, path, self.limits, self.member_id, self.uri, tmp,
                    after, until_seq).result()
            name = A.segment_name(f, la)
        # re-read the index right before recording: someone may have archived
        # meanwhile (a newer primary: the fence refuses us)
        cur = self._read_index()
        new = A.append(cur, f, la, rows, name, term)
        if adopt is None:
            self.fs.move(tmp, f"{self.base}/{name}")
        self._write_index(new)
        self.idx = new
        self._stamped = None
        self._suspect = False
        w = self.written
        w["segments"] += 1
        w["adopted"] += adopt is not None
        w["rows"] += rows
        w["entries"] += la.seq - f.seq + 1
        w["ms"] += (time.perf_counter() - t0) * 1000
        w["cpu_ms"] += cpu * 1000
        return True

    def _read_index(self) -> dict:
        self._stamped = read_index_stamped(self.fs, self.base, self._stamped)
        return self._stamped[1]

    def _write_index(self, idx: dict) -> None:
        tmp = f"{self.base}/{A.TMP_PREFIX}index-{uuid.uuid4().hex}"
        with self.fs.open_output_stream(tmp) as f:
            f.write(A.dump_index(idx))
        self.fs.move(tmp, f"{self.base}/{A.INDEX}")

    def _pool(self):
        """One worker process (spawned, niced): it reads the member's LMDB files
        (read-only, as Spark tasks do) and writes the segment's Parquet file,
        so the primary's own process pays neither the conversion nor the
        compression; niced, it yields to writes when CPU is short (the archive
        then lags, and trimming waits for it)."""
        if self._executor is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor
            self._executor = ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init,
                initargs=(os.getpid(),))
        return self._executor

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    @staticmethod
    def _entry_ts(engine, after: GTID | None) -> int | None:
        """The commit time of the first entry after ``after`` (None: the first)."""
        with engine.store.read() as t:
            for _, v in t.scan("oplog", None if after is None else prefix_end(after.to_bytes())):
                return codec.entry_ts(v)
        return None

    @staticmethod
    def _rows_of(engine, after: GTID | None, until_seq: int):
        """(first, last, Arrow rows) of the entries after ``after`` up to
        ``until_seq``, or fewer: ending after the entry that reaches
        ``SEGMENT_OPS_MAX`` ops."""
        from raymx.spark_bridge import convert
        entries, n = [], 0
        with engine.store.read() as t:
            start = None if after is None else prefix_end(after.to_bytes())
            for k, v in t.scan("oplog", start):
                g = GTID.from_bytes(k)
                if g.seq > until_seq or n >= A.SEGMENT_OPS_MAX:
                    break
                e = codec.unpack(v, "oplog entry")
                ops = engine.entry_ops(t, e)
                entries.append((k, e["ts"], ops))
                n += len(ops)
        if not entries:
            raise errors.ArchiveError(f"no oplog entries after {after} to archive")
        f, la = GTID.from_bytes(entries[0][0]), GTID.from_bytes(entries[-1][0])
        if la.seq > until_seq or la.seq - f.seq + 1 != len(entries) or (
                after is not None and f.seq != after.seq + 1):
            raise errors.ArchiveError(f"the oplog holds {f}..{la}, not the entries after "
                                      f"{after} up to seq {until_seq}")
        return f, la, convert.changes_rows(entries)

    def keep_from(self) -> tuple[GTID, str]:
        """What trimming must keep for the archive (and why, for status)."""
        keep, why = A.trim_keep_from(self.idx)
        if self.error:
            why += f" (the archive at {self.uri} cannot be written: {self.error})"
        return keep, why

    def status(self) -> dict:
        idx = self.idx or A.empty_index()
        t, o = A.through(idx), A.oldest(idx)
        return {"uri": self.uri, "lag_s": self.lag_ms / 1000,
                "oldest": None if o is None else list(o),
                "through": None if t is None else list(t),
                "segments": len(idx["segments"]), "gaps": idx["gaps"], "error": self.error,
                "written": dict(self.written, ms=round(self.written["ms"], 1),
                                cpu_ms=round(self.written["cpu_ms"], 1))}

    # --- reading through it (change streams) ---------------------------------
    def scan(self, token: tuple, gate: GTID | None, flt, n_max: int,
             segments_max: int = 4) -> dict:
        """Change events after ``token`` from the archive (as
        ``raymx.storage.changes.scan``); raises ``OplogTrimmed`` if the archive
        does not hold the entry after it either."""
        self._open(f"resume token {list(token)}")
        segs = A.segments_after(self.idx, token)
        events: list[dict] = []
        resume = list(token)
        chunk = max(n_max, 1024)
        for s in segs[:segments_max]:
            if gate is not None and s["first"][1] > gate.seq:
                break
            tb = self._segment_table(s)
            pos = _first_after(tb, resume)
            while True:  # Python rows for a slice at a time (a segment is big)
                sl = tb.slice(pos, chunk)
                pos += chunk
                more = pos < tb.num_rows
                ev, resume, done = A.row_events(_pyrows(sl), tuple(resume), gate, flt,
                                                n_max - len(events), GTID(*s["last"]), more)
                events += ev
                if done or len(events) >= n_max:
                    break
            if not done:
                break
        return {"events": events, "resume": resume}

    def _open(self, what: str) -> None:
        """Read the index if not yet (the trimmer's first round): now.
        ``OplogTrimmed`` naming ``what`` if the archive cannot be read."""
        if self.idx is None:
            try:
                fs, base = open_fs(self.uri)
                self.idx = read_index(fs, base)
                self.fs, self.base = fs, base
            except Exception as e:
                self.error = self.error or f"{type(e).__name__}: {e}"
        if self.fs is None or self.idx is None:
            raise errors.OplogTrimmed(
                f"{what} is older than the oplog, and the archive at {self.uri} cannot be "
                f"read ({self.error or 'not opened yet'})", oldest=None)

    def at(self, ms: int, seq: int | None = None) -> GTID | None:
        """The first archived entry committed at or after ``ms``, as
        ``Engine.oplog_at`` finds one in the live oplog (a binary search, by
        segment, then within one; ``ts`` taken as ordered; with ``seq``, the
        entry of that seq if committed in that second). None if every
        archived entry is older; ``OplogTrimmed`` if the archive starts
        after ``ms`` with history before it lost."""
        import pyarrow.compute as pc
        self._open(f"the time {ms} ms")
        # a segment of no-op entries only (a new term's) has no rows, no times
        segs = [s for s in self.idx["segments"] if s["rows"]]

        def ts_us(seg):
            return self._segment_table(seg).column("ts").cast("int64")
        if not segs or pc.max(ts_us(segs[-1])).as_py() < ms * 1000:
            return None
        lo, hi = 0, len(segs) - 1  # the first segment whose last entry is not older
        while lo < hi:
            mid = (lo + hi) // 2
            if pc.max(ts_us(segs[mid])).as_py() < ms * 1000:
                lo = mid + 1
            else:
                hi = mid
        tb, col = self._segment_table(segs[lo]), ts_us(segs[lo])
        first = self.idx["segments"][0]["first"]
        if lo == 0 and col[0].as_py() >= ms * 1000 and first[1] > 1:
            raise errors.OplogTrimmed(
                f"the archive's oldest entry {GTID(*first)} is newer than the time "
                "asked for, and the entries before it were trimmed", oldest=list(first))
        seqs = tb.column("seq")
        if seq is not None:
            i = pc.index(seqs, seq).as_py()
            if i >= 0 and col[i].as_py() // 1_000_000 == ms // 1000:
                return GTID(tb.column("term")[i].as_py(), seq)
        i = pc.index(pc.greater_equal(col, ms * 1000), True).as_py()
        return GTID(tb.column("term")[i].as_py(), seqs[i].as_py())

    def _segment_table(self, seg: dict):
        """A segment's Arrow table (the last three read kept: a stream reads
        one segment over many batches)."""
        tb = self._rows.get(seg["file"])
        if tb is None:
            tb = read_segment(self.fs, self.base, seg)
            if len(self._rows) >= 3:
                self._rows.pop(next(iter(self._rows)))
            self._rows[seg["file"]] = tb
        return tb


def _first_after(tb, token) -> int:
    """The first row of ``tb`` after ``token`` (its row count if none)."""
    import pyarrow.compute as pc
    seq = tb.column("seq")
    mask = pc.greater(seq, token[1])
    if len(token) == 3:
        mask = pc.or_(mask, pc.and_(pc.equal(seq, token[1]),
                                    pc.greater(tb.column("idx"), token[2])))
    i = pc.index(mask, True).as_py()
    return tb.num_rows if i < 0 else i


def _pyrows(tb) -> list:
    """Rows as dicts, ``ts`` as microseconds."""
    rows = tb.drop_columns(["ts"]).to_pylist()
    for r, x in zip(rows, tb.column("ts").cast("int64").to_pylist()):
        r["ts"] = x
    return rows
