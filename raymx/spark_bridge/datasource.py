"""Ray Data datasource and datasink for raymx (usable on their own with ``ray.data``).

Reading, and where it runs: a member's LMDB files are local to its node, so a
``MemberSnapshot`` actor is started *on that node* (hard node affinity, as the
member's own actors are pinned) and opens the member's environment read-only
in practice (one LMDB read transaction for its whole life). That one
transaction is the snapshot: the key-range partitions are computed from it and
every partition is served from it, so all partitions are mutually consistent
and the GTID is exact. Read tasks ask the actor for pages of their range (one
packed msgpack array per page, the stored bytes, never re-encoded) and decode
and build Arrow blocks themselves, in parallel; they are scheduled on the
member's node too (soft affinity: the pages travel through the node's shared
object store). The alternative, a read transaction per task, cannot be made
consistent without a common GTID (each task would have to undo the writes
since), and a data-serving method on the member's shard actor would put bulk
reads on the process that serves clients.

Writing goes through the primary's client port like any driver (write tasks
can run anywhere), with the write concern given: ``append`` inserts in
batches (one statement, one GTID per batch: a duplicate ``_id`` fails that
batch), ``upsert`` replaces by ``_id`` or inserts, pipelined, one GTID per
document (idempotent, so a retried Spark or Ray task is harmless).
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Iterable

import pyarrow as pa
import ray
from ray.data import Datasink, Datasource, ReadTask
from ray.data.block import BlockAccessor, BlockMetadata
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raymx import errors
from raymx.spark_bridge import convert
from raymx.storage import codec
from raymx.storage.engine import split_ns
from raymx.storage.gtid import GTID
from raymx.storage.limits import Limits

PAGE_BYTES = 8 << 20  # one actor call returns about this much
IDLE_S = 600.0  # a snapshot nobody reads for this long closes itself


@ray.remote(num_cpus=0, max_concurrency=2)
class MemberSnapshot:
    """One read transaction on a member's LMDB folder, on the member's node.

    Calls are serialised (an LMDB transaction is used by one thread at a
    time); a second concurrency slot lets ``close`` and ``info`` through.
    """

    def __init__(self, path: str, limits: Limits, wait_for, wait_s: float, idle_s: float):
        from raymx.spark_bridge.reader import SnapshotReader
        from raymx.storage.engine import Engine
        from raymx.storage.lmdb_store import LMDBStore
        self.core = self.store = None
        self._lock = threading.Lock()
        self._used = time.monotonic()
        self._idle_s = idle_s
        # an error here is kept and raised by info(): raised from __init__ it
        # would reach the caller only as a bare ActorDiedError message
        self._error: Exception | None = None
        try:
            if not os.path.isfile(os.path.join(path, "data.mdb")):
                # never create an empty environment where the member's should be
                raise errors.ConfigError(f"no member data at {path} on node "
                                         f"{ray.get_runtime_context().get_node_id()}")
            self.store = LMDBStore(path, map_bytes=limits.map_bytes)
            self.engine = Engine(self.store, limits)
            self.core = SnapshotReader(self.engine,
                                       None if wait_for is None else GTID(*wait_for), wait_s)
        except errors.RaymxError as e:
            self._error = e
            if self.store is not None:
                self.store.close()
            return
        threading.Thread(target=self._expire, daemon=True, name="raymx-snapshot-ttl").start()

    def _expire(self):
        while True:
            time.sleep(min(5.0, self._idle_s))
            if time.monotonic() - self._used > self._idle_s:
                self.close()  # the transaction is released even if the kill lags
                ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
                return

    def _call(self, fn, *a):
        with self._lock:
            self._used = time.monotonic()
            if self.core is None:
                raise errors.InvalidOperation("this snapshot is closed")
            return fn(*a)

    def info(self) -> dict:
        if self._error is not None:
            raise self._error
        return self._call(lambda: {"gtid": list(self.core.gtid),
                                   "node_id": ray.get_runtime_context().get_node_id(),
                                   "collections": self.core.collections()})

    def catalog(self) -> dict:
        return self._call(self.core.catalog)

    def plan(self, ns, at, partitions, rows_per_partition, sample_docs) -> dict:
        return self._call(self.core.plan, ns, None if at is None else GTID(*at), partitions,
                          rows_per_partition, sample_docs)

    def read(self, ns, lo, hi, max_bytes, keys=False):
        return self._call(self.core.read, ns, lo, hi, max_bytes, keys)

    def plan_changes(self, after, until, partitions, entries_per_partition) -> dict:
        return self._call(self.core.plan_changes, GTID(*after),
                          None if until is None else GTID(*until), partitions,
                          entries_per_partition)

    def read_changes(self, lo, hi, max_bytes):
        return self._call(self.core.read_changes, lo, hi, max_bytes)

    def close(self) -> None:
        with self._lock:
            if self.core is not None:
                self.core.close()
                self.core = None
                self.store.close()


@dataclass
class SnapshotHandle:
    """A driver-side handle on a ``MemberSnapshot``: ``gtid`` is what it has
    applied through; ``close()`` releases the read transaction."""

    actor: object
    member: int
    node_id: str
    gtid: GTID
    closed: bool = field(default=False)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                ray.get(self.actor.close.remote(), timeout=30)
            except Exception:
                pass
            ray.kill(self.actor, no_restart=True)

    def read_args(self) -> dict:
        """``ray_remote_args`` that run read tasks on the member's node when possible."""
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(self.node_id, soft=True)}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _member_of(rs, member) -> dict:
    """The chosen member's config (``path``, ``node_id``): ``None`` = the primary,
    ``"secondary"`` = a running, non-delayed secondary, or a member id."""
    cfg = rs.config()
    members = {m["id"]: m for m in cfg["members"]}
    topo = rs._topology()
    roles = {m["id"]: m.get("role") for m in topo["members"]}
    ok = {m["id"] for m in topo["members"] if m.get("state", "running") == "running"}
    if member is None or member == "primary":
        prim = [i for i, r in roles.items() if r == "primary"]
        if not prim:
            raise errors.PrimaryUnavailable("no primary to read a snapshot from")
        member = prim[0]
    elif member == "secondary":
        # never one whose data may still be rolled back or replaced (recovering,
        # resync, synchronizing)
        sec = [i for i, r in sorted(roles.items()) if r == "secondary" and i in ok
               and not members.get(i, {}).get("delay_s")]
        if not sec:
            raise errors.ConfigError("no running secondary to read a snapshot from")
        member = sec[0]
    if not isinstance(member, int) or member not in members:
        raise errors.ConfigError(f"member {member!r}: a member id, 'primary' or 'secondary' "
                                 f"(members: {sorted(members)})")
    m = dict(members[member])
    m["limits"] = cfg["limits"]
    return m


def majority_point(rs, member=None) -> GTID:
    """The majority-committed point member ``member`` (default: the primary)
    knows, to read as of (read concern "majority")."""
    m = _member_of(rs, member)
    st = ray.get(rs.member(m["id"]).status.remote(), timeout=30)
    g = st.get("majority_known")
    return GTID(0, 0) if g is None else GTID(*g)


def open_snapshot(rs, member=None, wait_for=None, wait_s: float = 30.0,
                  idle_s: float = IDLE_S) -> SnapshotHandle:
    """Open one consistent read snapshot of a member (default: the primary) on
    its node; with ``wait_for``, once the member has applied that GTID."""
    m = _member_of(rs, member)
    wf = None if wait_for is None else list(GTID.parse(wait_for))
    actor = MemberSnapshot.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(m["node_id"], soft=False)
    ).remote(m["path"], m["limits"], wf, wait_s, idle_s)
    try:
        info = _unwrap(lambda: ray.get(actor.info.remote(), timeout=wait_s + 60))
    except BaseException:
        ray.kill(actor, no_restart=True)
        raise
    return SnapshotHandle(actor, m["id"], info["node_id"], GTID(*info["gtid"]))


def _unwrap(fn):
    """Run a Ray call and re-raise a raymx error as itself (not wrapped)."""
    try:
        return fn()
    except ray.exceptions.RayTaskError as e:
        cause = getattr(e, "cause", None)
        if isinstance(cause, errors.RaymxError):
            raise cause from None
        raise


# --- reading a collection -----------------------------------------------------
class CollectionDatasource(Datasource):
    """A collection of one member's snapshot, in key-range partitions.

    ``format="arrow"`` (default): one column per top-level field (``_id``
    first), types as ``raymx.spark_bridge.convert`` documents, from ``schema``
    (a ``pyarrow.Schema``: fields outside it are left out) or inferred from
    ``sample_docs`` documents spread over the collection (a document that does
    not fit raises SchemaMismatch). ``format="msgpack"``: columns ``_key``
    (the order-preserving ``_id`` key) and ``doc`` (the stored msgpack bytes),
    for copies that must not re-encode. ``at``: read the collection as of that
    GTID (default: the snapshot's). ``self.gtid`` is the GTID read at.

    The snapshot stays open until ``close()`` (or ``idle_s`` without reads).
    Run it with ``ray.data.read_datasource(src, ray_remote_args=src.read_args())``
    to keep read tasks on the member's node (``raymx.spark_bridge.read_dataset``
    does that).
    """

    def __init__(self, rs, ns: str, at=None, member=None, schema: pa.Schema | None = None,
                 format: str = "arrow", partitions: int | None = None,
                 rows_per_partition: int = 100_000, sample_docs: int = 1000,
                 snapshot: SnapshotHandle | None = None, page_bytes: int = PAGE_BYTES):
        split_ns(ns)
        if format not in ("arrow", "msgpack"):
            raise errors.InvalidInput(f"format {format!r}: 'arrow' or 'msgpack'")
        if schema is not None and not isinstance(schema, pa.Schema):
            raise errors.InvalidInput(f"schema must be a pyarrow.Schema, got "
                                      f"{type(schema).__name__}")
        if partitions is not None and (not isinstance(partitions, int) or partitions < 1):
            raise errors.InvalidInput(f"partitions must be a positive integer, got {partitions!r}")
        try:
            at = None if at is None else GTID.parse(at)
        except ValueError as e:
            raise errors.InvalidInput(str(e)) from None
        self.ns, self.format, self.page_bytes = ns, format, page_bytes
        self._own = snapshot is None
        self.snapshot = snapshot or open_snapshot(rs, member, wait_for=at)
        try:
            self.plan = _unwrap(lambda: ray.get(self.snapshot.actor.plan.remote(
                ns, None if at is None else list(at), partitions, rows_per_partition,
                sample_docs)))
            self.gtid = GTID(*self.plan["gtid"])
            sample = codec.unpack(self.plan["sample"], "sample")
            self._avg = max(64, len(self.plan["sample"]) // max(1, len(sample)))
            if format == "msgpack":
                self.schema = pa.schema([("_key", pa.binary()), ("doc", pa.binary())])
                self._strict = True
            else:
                self._strict = schema is None
                self.schema = schema if schema is not None else convert.infer_schema(sample)
                if schema is None:
                    # the sample misses a field another document has: caught at read
                    # time (strict), naming it; here, at least the sample must fit
                    convert.docs_to_table(sample, self.schema)
        except BaseException:
            if self._own:
                self.snapshot.close()
            raise

    def read_args(self) -> dict:
        return self.snapshot.read_args()

    def close(self) -> None:
        self.snapshot.close()

    def get_name(self) -> str:
        return "raymx.collection"

    def estimate_inmemory_data_size(self) -> int | None:
        return self.plan["count"] * self._avg

    def get_read_tasks(self, parallelism: int, per_task_row_limit=None, data_context=None
                       ) -> list[ReadTask]:
        actor, ns, page, schema = self.snapshot.actor, self.ns, self.page_bytes, self.schema
        raw, strict = self.format == "msgpack", self._strict

        def reader(lo: bytes, hi: bytes):
            def read_fn() -> Iterable[pa.Table]:
                nxt = lo
                while nxt is not None:
                    blob, keys, nxt = ray.get(actor.read.remote(ns, nxt, hi, page, raw))
                    if raw:
                        docs = codec.split_array(blob)
                        yield pa.table({"_key": pa.array(keys, pa.binary()),
                                        "doc": pa.array(docs, pa.binary())}, schema=schema)
                    else:
                        docs = codec.unpack(blob, "documents")
                        yield convert.docs_to_table(docs, schema, strict=strict)
            return read_fn

        return [ReadTask(reader(lo, hi),
                         BlockMetadata(num_rows=rows, size_bytes=rows * self._avg,
                                       input_files=None, exec_stats=None),
                         schema=self.schema, per_task_row_limit=per_task_row_limit)
                for lo, hi, rows in self.plan["parts"]]


# --- reading the change stream -----------------------------------------------
CHANGES_SCHEMA, changes_rows = convert.CHANGES_SCHEMA, convert.changes_rows


class ChangesDatasource(Datasource):
    """The ops committed in (``after``, ``until``] on one member, one row per
    op (``CHANGES_SCHEMA``), in GTID order within and across partitions
    (partition i holds earlier GTIDs than partition i+1). ``until`` defaults
    to the snapshot's GTID; a later ``until`` waits until the member has
    applied it. ``ns``: only ops on these namespaces (a string or a list).
    ``self.after`` / ``self.until`` are the bounds read."""

    def __init__(self, rs, after, until=None, member=None, ns=None,
                 partitions: int | None = None, entries_per_partition: int = 50_000,
                 snapshot: SnapshotHandle | None = None, page_bytes: int = PAGE_BYTES):
        if after is None:
            raise errors.InvalidInput("after is required: a GTID ('term:seq'; '0:0' for the "
                                      "beginning)")
        try:
            after = GTID.parse(after)
            until = None if until is None else GTID.parse(until)
        except ValueError as e:
            raise errors.InvalidInput(str(e)) from None
        if until is not None and until.seq < after.seq:
            raise errors.InvalidInput(f"until {until} is before after {after}")
        if isinstance(ns, str):
            ns = [ns]
        if ns is not None:
            for n in ns:
                split_ns(n)
        self.ns_filter = None if ns is None else frozenset(ns)
        self.page_bytes = page_bytes
        self._own = snapshot is None
        self.snapshot = snapshot or open_snapshot(rs, member, wait_for=until)
        try:
            self.plan = _unwrap(lambda: ray.get(self.snapshot.actor.plan_changes.remote(
                list(after), None if until is None else list(until), partitions,
                entries_per_partition)))
        except BaseException:
            if self._own:
                self.snapshot.close()
            raise
        self.after, self.until = GTID(*self.plan["after"]), GTID(*self.plan["until"])
        self.schema = CHANGES_SCHEMA

    def read_args(self) -> dict:
        return self.snapshot.read_args()

    def close(self) -> None:
        self.snapshot.close()

    def get_name(self) -> str:
        return "raymx.changes"

    def estimate_inmemory_data_size(self) -> int | None:
        return self.plan["count"] * 512

    def get_read_tasks(self, parallelism: int, per_task_row_limit=None, data_context=None
                       ) -> list[ReadTask]:
        actor, page, flt = self.snapshot.actor, self.page_bytes, self.ns_filter

        def reader(lo: bytes, hi: bytes):
            def read_fn() -> Iterable[pa.Table]:
                nxt = lo
                while nxt is not None:
                    entries, nxt = ray.get(actor.read_changes.remote(nxt, hi, page))
                    yield changes_rows(entries, flt)
            return read_fn

        return [ReadTask(reader(lo, hi),
                         BlockMetadata(num_rows=None, size_bytes=n * 512, input_files=None,
                                       exec_stats=None),
                         schema=CHANGES_SCHEMA, per_task_row_limit=per_task_row_limit)
                for lo, hi, n in self.plan["parts"]]


# --- writing -----------------------------------------------------------------------
@dataclass
class WriteSummary:
    """What a write did: documents written, the newest GTID among its writes
    (read at or after it to see them all), and rows an ``update`` found no
    document for (``missing``, nothing written for them)."""

    written: int = 0
    gtid: GTID | None = None
    missing: int = 0


class CollectionDatasink(Datasink):
    """Writes rows as documents into ``ns`` through the primary.

    ``mode="append"``: insert, ``batch_docs`` documents per statement (one
    GTID each; a duplicate ``_id`` fails the batch and the write). ``"upsert"``:
    replace the document with the row's ``_id`` or insert it (rows need
    ``_id``). ``w``/``j``/``wtimeout_ms``: the write concern of every write
    (default ``w="majority"``). Null fields are left out of the documents
    unless ``keep_nulls``. ``self.result`` is a ``WriteSummary`` afterwards.
    """

    def __init__(self, rs, ns: str, mode: str = "append", w="majority", j: bool = False,
                 wtimeout_ms: int | None = None, keep_nulls: bool = False,
                 batch_docs: int = 1000, window: int = 64):
        split_ns(ns)
        if mode not in ("append", "upsert"):
            raise errors.InvalidInput(f"mode {mode!r}: 'append' or 'upsert'")
        from raymx.client import WriteConcern
        WriteConcern(w, j, wtimeout_ms)  # validates
        if not isinstance(batch_docs, int) or batch_docs < 1:
            raise errors.InvalidInput(f"batch_docs must be a positive integer, got {batch_docs!r}")
        self.rs_name = rs if isinstance(rs, str) else rs.name
        self.ns, self.mode, self.keep_nulls = ns, mode, keep_nulls
        self.wc = {"w": w, "j": j, **({} if wtimeout_ms is None else
                                      {"wtimeout_ms": wtimeout_ms})}
        self.batch_docs, self.window = batch_docs, window
        self.result: WriteSummary | None = None

    def get_name(self) -> str:
        return "raymx.collection"

    def on_write_start(self, schema=None) -> None:
        if schema is not None:
            s = getattr(schema, "base_schema", schema)
            if isinstance(s, pa.Schema):
                convert.check_writable(s)
                if self.mode == "upsert" and "_id" not in s.names:
                    raise errors.InvalidInput("upsert needs an _id column")

    def write(self, blocks: Iterable, ctx) -> dict:
        import raymx
        client = raymx.connect(self.rs_name).client(**self.wc)
        coll = client[self.ns.split(".", 1)[0]][self.ns.split(".", 1)[1]]
        written, newest = 0, None
        try:
            for block in blocks:
                table = BlockAccessor.for_block(block).to_arrow()
                if self.mode == "upsert" and "_id" not in table.schema.names:
                    raise errors.InvalidInput("upsert needs an _id column")
                docs = convert.table_to_docs(table, self.keep_nulls)
                for i in range(0, len(docs), self.batch_docs):
                    chunk = docs[i:i + self.batch_docs]
                    g = (_insert(coll, chunk) if self.mode == "append"
                         else _upsert(client, self.ns, chunk, self.wc, self.window))
                    written += len(chunk)
                    if g is not None and (newest is None or g > newest):
                        newest = g
        finally:
            client.close()
        return {"written": written, "gtid": None if newest is None else list(newest)}

    def on_write_complete(self, write_result) -> None:
        s = WriteSummary()
        for r in write_result.write_returns:
            s.written += r["written"]
            if r["gtid"] is not None and (s.gtid is None or GTID(*r["gtid"]) > s.gtid):
                s.gtid = GTID(*r["gtid"])
        self.result = s


def _insert(coll, docs: list[dict]) -> GTID | None:
    return coll.insert_many(docs).gtid


def _upsert(client, ns: str, docs: list[dict], wc: dict, window: int) -> GTID | None:
    """Replace-or-insert by ``_id``, pipelined ``window`` requests deep on the
    primary's connection; a refused request (election) retries the rest
    through the client, which follows the new primary (replacing is idempotent)."""
    for d in docs:
        if d.get("_id") is None:
            raise errors.InvalidDocument("upsert: a row has no _id (null or missing)")
    newest = None
    pending = list(docs)
    while pending:
        try:
            conn = client._primary_conn()
            futs = []
            done = 0
            for d in pending:
                futs.append(conn.submit({"op": "update", "ns": ns, "filter": {"_id": d["_id"]},
                                         "update": d, "multi": False, "upsert": True,
                                         "replace": True, **wc}))
                if len(futs) >= window:
                    newest = _newest(newest, futs.pop(0).result(client.timeout_s))
                    done += 1
            for f in futs:
                newest = _newest(newest, f.result(client.timeout_s))
                done += 1
            pending = []
        except (errors.NotPrimary, errors.PrimaryUnavailable, errors.ConnectionLost):
            # the rest again, one by one through the client (it follows the primary)
            for d in pending:
                r = client[ns.split(".", 1)[0]][ns.split(".", 1)[1]].replace_one(
                    {"_id": d["_id"]}, d, upsert=True, **wc)
                newest = _newest(newest, r.gtid)
            pending = []
    return newest


def _newest(cur, res):
    g = res.get("gtid") if isinstance(res, dict) else res
    if g is None:
        return cur
    g = GTID.parse(g)
    return g if cur is None or g > cur else cur


# --- ray.data entry points ---------------------------------------------------------
def _read(src):
    import warnings
    with warnings.catch_warnings():
        # ray_remote_args is the only way to pass a (soft) node-affinity strategy
        # in Ray 2.60; its deprecation targets 2.64
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*")
        return ray.data.read_datasource(src, ray_remote_args=src.read_args())


def read_dataset(rs, ns: str, at=None, member=None, **kw):
    """``(ray.data.Dataset, CollectionDatasource)``: a collection as of ``at`` (or
    the snapshot's GTID, ``source.gtid``), read tasks on the member's node.
    Close the source (``source.close()``) once the dataset is consumed."""
    src = CollectionDatasource(rs, ns, at=at, member=member, **kw)
    return _read(src), src


def read_changes_dataset(rs, after, until=None, member=None, ns=None, **kw):
    """``(ray.data.Dataset, ChangesDatasource)`` of the ops in (after, until]."""
    src = ChangesDatasource(rs, after, until=until, member=member, ns=ns, **kw)
    return _read(src), src


def write_dataset(ds, rs, ns: str, mode: str = "append", **kw) -> WriteSummary:
    """Write a ``ray.data.Dataset`` into ``ns`` (see ``CollectionDatasink``)."""
    sink = CollectionDatasink(rs, ns, mode=mode, **kw)
    ds.write_datasink(sink)
    return sink.result or WriteSummary()
