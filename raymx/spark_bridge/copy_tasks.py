"""The Spark side of a snapshot copy, and Spark jobs that show progress.

A snapshot copy through Spark (``initial_sync._copy_with_spark``) is one job
``spark.range(parts).mapInArrow(read_parts)``. Each Spark task runs on the
source member's node, opens the source's LMDB folder in its Python worker
(``direct.local_engine``: a reader; it never takes the writer lock), starts
its own read transaction, and for each of its partitions:

1. proves the partition is what it was at the snapshot's GTID G: entry G is
   still there with the same bytes (no rollback past it, no trim: the copy
   holds trimming at G), and no oplog entry after G (applied or not: a
   parallel replay writes documents before it marks them applied) touches a
   key of the partition: a document op touches its docs key and the key
   ranges of its collection's indexes; a command makes every partition
   unproven. Then the stored rows in range *are* the rows at G;
2. reads them as stored (``snapshot.read_run``: packed, never re-encoded) and
   checksums them, writes the run to a spool file on the node, and returns
   one small row ``(part, local, rows, digest, path)``.

A partition it cannot prove (writes landed in it since G), or any partition
of a task on a node without the source's folder, comes back with
``local=False`` and is read by the driver's ``SnapshotSource`` instead, from
the snapshot's own transaction. The driver then loads the runs into the
target in partition order (``load_rows``, checksummed as loaded), and
``load_finish`` compares every partition's checksum: the one the Spark task
or the source computed over the rows at G against the target's.
"""
from __future__ import annotations

import os
import threading

import pyarrow as pa

from raymx import errors
from raymx.storage import codec, snapshot
from raymx.storage.catalog import _pk
from raymx.storage.gtid import GTID, ZERO
from raymx.storage.keys import prefix_end

PART_SCHEMA = pa.schema([("part", pa.int32()), ("local", pa.bool_()), ("rows", pa.int64()),
                         ("digest", pa.string()), ("path", pa.string())])


def touched_since(e, t, gtid: GTID, entry: bytes | None):
    """Keys written after ``gtid`` in read transaction ``t`` of engine ``e``:
    ``(sorted docs keys, index key ranges)``, or None when a command was logged
    since (nothing is provably unchanged). Raises Diverged if entry ``gtid``
    is not there with the bytes ``entry`` (a rollback past it, or a trim)."""
    from raymx.storage.engine import Reader
    start = None
    if gtid != ZERO:
        got = t.get("oplog", gtid.to_bytes())
        if got != entry:
            raise errors.Diverged(
                f"the snapshot's entry {gtid} is {'gone from' if got is None else 'changed in'} "
                "the source's oplog (rolled back or trimmed): copy again")
        start = prefix_end(gtid.to_bytes())
    r = Reader(e, t)
    keys, ranges, seen = [], [], {}
    for _, v in t.scan("oplog", start):
        for op in e.entry_ops(t, codec.unpack(v, "oplog entry")):
            kind = op["op"]
            if kind == "n":
                continue
            if kind == "c":
                return None
            ns = op["ns"]
            c = seen.get(ns, False)
            if c is False:
                c = seen[ns] = r.coll(ns)
                if c is not None:
                    ranges.extend([ix.prefix, prefix_end(ix.prefix)] for ix in c.indexes.values())
            if c is None:  # written, then dropped: only a command drops
                return None
            keys.append(c.prefix + _pk((op["pre"] if kind == "d" else op["post"])["_id"]))
    keys.sort()
    return keys, ranges


def unchanged(part: snapshot.Part, touched) -> bool:
    """Whether no key ``touched_since`` names lies in ``part``'s range."""
    if touched is None:
        return False
    keys, ranges = touched
    lo, hi = part.start or b"", part.stop
    if part.db == "docs":
        from bisect import bisect_left
        i = bisect_left(keys, lo)
        return i == len(keys) or (hi is not None and keys[i] >= hi)
    return not any((hi is None or a < hi) and lo < b for a, b in ranges)


def read_parts(m: dict, gtid: list, entry: bytes | None, parts: list, spool: str, idx: list):
    """Partitions ``idx`` of the snapshot, read in one read transaction of the
    source's folder on this host (``m``: the source's config). Yields one
    ``PART_SCHEMA`` batch per partition."""
    from raymx.spark_bridge.direct import local_engine
    try:
        e = local_engine(m["path"], m["limits"], m["id"])
    except errors.ConfigError:  # a Spark worker on another node: the source reads them
        for i in idx:
            yield _row(i, False, 0, "", "")
        return
    with e.store.read() as t:
        touched = touched_since(e, t, GTID(*gtid), entry)
        for i in idx:
            p = snapshot.Part.of(parts[i])
            path = part_path(spool, i)
            if not unchanged(p, touched):
                with open(path + ".unproven", "wb"):
                    pass
                yield _row(i, False, 0, "", "")
                continue
            run, (n, digest) = snapshot.read_run(t, p)
            with open(path + ".tmp", "wb") as f:
                f.write(run)
            os.replace(path + ".tmp", path)  # a retried task writes the same bytes again
            yield _row(i, True, n, digest, path)


def part_path(spool: str, i: int) -> str:
    return os.path.join(spool, f"part-{i:06d}")


def ready(spool: str, i: int) -> list[str]:
    """What the Spark tasks have spooled for partitions ``i``, ``i+1``, ...
    (stopping at the first not done): ``"run"`` (a file to load) or
    ``"unproven"`` (to read from the snapshot). A Ray task on the node."""
    names = set(os.listdir(spool))
    out = []
    while True:
        n = os.path.basename(part_path(spool, i + len(out)))
        if n in names:
            out.append("run")
        elif n + ".unproven" in names:
            out.append("unproven")
        else:
            return out


def _row(i, local, n, digest, path) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{"part": i, "local": local, "rows": n, "digest": digest,
                                        "path": path}], schema=PART_SCHEMA)


def copy_dataframe(spark, m: dict, info: dict, spool: str, slices: int):
    """The copy's DataFrame: ``slices`` Spark tasks, each reading a contiguous
    run of partitions (``read_parts``)."""
    from raymx.spark_bridge import session
    parts, n = info["parts"], len(info["parts"])
    gtid, entry = info["gtid"], info["entry"]
    m = {k: m[k] for k in ("path", "limits", "id")}

    def run(batches):
        for b in batches:
            for s in b.column(0).to_pylist():
                idx = list(range(s * n // slices, (s + 1) * n // slices))
                yield from read_parts(m, gtid, entry, parts, spool, idx)
    return spark.range(0, slices, 1, slices).mapInArrow(run, session.spark_schema(PART_SCHEMA))


def take_file(path: str) -> bytes:
    """A spooled run's bytes; the file is removed (a Ray task on its node)."""
    with open(path, "rb") as f:
        b = f.read()
    os.unlink(path)
    return b


class Job:
    """``action()`` (a Spark action) run in a thread of the driver, in a Spark
    job group of its own (``sc``), so ``cancel()`` stops its tasks only."""

    def __init__(self, action, sc=None, label: str = "raymx"):
        import uuid
        self._out: dict = {}
        self._sc, self.group = sc, f"raymx-{uuid.uuid4().hex[:12]}"
        self._th = threading.Thread(target=self._go, args=(action, label),
                                    name="raymx-spark-job", daemon=True)
        self._th.start()

    def _go(self, action, label):
        try:
            if self._sc is not None:  # per thread (pyspark pins Python threads to JVM ones)
                self._sc.setJobGroup(self.group, label, interruptOnCancel=True)
            self._out["v"] = action()
        except BaseException as e:  # re-raised in the caller's thread
            self._out["e"] = e

    def cancel(self, wait_s: float = 30.0) -> None:
        """Stop the job's tasks (the caller failed meanwhile) and wait for it."""
        if self._sc is not None and self.alive():
            try:
                self._sc.cancelJobGroup(self.group)
            except Exception:
                pass
        self._th.join(wait_s)

    def alive(self) -> bool:
        return self._th.is_alive()

    def wait(self, s: float) -> None:
        self._th.join(s)

    def result(self):
        self._th.join()
        if "e" in self._out:
            raise self._out["e"]
        return self._out["v"]


def run_job(action, bar, counter, every_s: float = 0.2, sc=None):
    """``action()`` (a Spark action) while ``bar`` follows ``counter`` (an
    accumulator the tasks add to; the driver sees a task's additions when it
    ends); returns what the action returned. Interrupted (Ctrl-C), its Spark
    job is cancelled."""
    job = Job(action, sc, bar.label)
    try:
        while job.alive():
            job.wait(every_s)
            bar.done = counter.value
            bar.update(0)
    except BaseException:
        job.cancel()
        raise
    return job.result()
