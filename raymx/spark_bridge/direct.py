"""DataFrame I/O with no Ray Data in between: Spark tasks read the member's
LMDB files themselves and write straight to the primary.

Reading (``read_collection``, ``read_changes``):

1. A small Ray task on the member's node opens the member's LMDB environment
   (a reader among the member's own processes; LMDB allows many) and plans
   the read in one read transaction: the GTID to read as of, that entry's
   hash-chain value, and key-range partitions, over the ``_id`` or a
   one-field index's key range when the filter bounds it
   (``SnapshotReader.plan_ranges``), with a sample to infer the schema from.
2. The driver holds trimming on that member at the GTID (``hold_trim``, for
   ``hold_s``), so the oplog entries after it, which reconstruct it, stay.
3. The DataFrame is ``spark.range(parts).mapInArrow(...)``: each Spark task
   opens the same environment in its Python worker (same node), starts its
   own read transaction, checks the planned entry is still there with the
   same hash (no rollback, no trim past it), and reads its partition *as of
   the planned GTID* (``SnapshotReader.read_part``: the documents changed since
   are read as their images then, from the oplog), applying the filter and
   yielding Arrow record batches. Stored msgpack is decoded in bulk (one C
   call per batch) straight into the rows ``pyarrow`` builds.

So every partition is exactly as of ``df.snapshot_gtid``, each Spark action
(and a retried task) reads the same rows again, and nothing is materialized
in Ray's object store. A Spark worker on another node than the member (no
``data.mdb`` at the member's path there) joins the Ray cluster and streams
its partition from a Ray task pinned to the member's node instead (the same
code, its batches through the object store: slower, never wrong).

Writing (``write_dataframe``): each Spark partition writes through a raymx
client of its own (``connect_url(rs.url())``, no Ray in the Spark worker),
converting its Arrow batches while the previous batch's statement is on the
wire. See ``write_dataframe`` for the modes.
"""
from __future__ import annotations

import os
import random
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa

from raymx import errors
from raymx.spark_bridge import convert
from raymx.storage.gtid import GTID

HOLD_S = 3600.0  # how long a planned read keeps its point in the member's oplog
BATCH_DOCS = 8192  # documents per Arrow record batch a read task yields
MODES = ("append", "upsert", "update", "overwrite")

# --- a member's environment, opened read-only in this process -------------------
_ENGINES: dict[str, object] = {}
_ENGINES_LOCK = threading.Lock()


def local_engine(path: str, limits, member_id: int):
    """A reading ``Engine`` over member ``member_id``'s LMDB folder ``path``
    on this node (opened once per process). Never creates anything: a folder
    without the member's data is an error naming it and this host."""
    try:
        st = os.stat(os.path.join(path, "data.mdb"))
    except OSError:
        raise errors.ConfigError(
            f"member {member_id}'s data ({path}) is not on this host "
            f"({socket.gethostname()})") from None
    with _ENGINES_LOCK:
        e = _ENGINES.get(path)
        if e is not None and e._file == (st.st_dev, st.st_ino):
            return e
        if e is not None:  # the folder was emptied and loaded again (a resync)
            del _ENGINES[path]
            e.store.close()
        from raymx.storage.engine import Engine
        from raymx.storage.lmdb_store import LMDBStore
        store = LMDBStore(path, map_bytes=limits.map_bytes)
        # read slots left by processes that died mid-read (a killed Spark
        # worker) would keep the member's freed pages from being reused
        store._env.reader_check()
        # Engine() would open a write transaction to initialise an empty store:
        # a reader of a running member's files must never take its writer lock
        e = Engine.__new__(Engine)
        e.store, e.limits, e._tail, e._catalog_cache = store, limits, None, {}
        e._now_ms, e._file = None, (st.st_dev, st.st_ino)
        owner = e.get_meta("member_id")
        if owner != member_id:
            store.close()
            raise errors.ConfigError(f"{path} holds member {owner}'s data, not member "
                                     f"{member_id}'s")
        _ENGINES[path] = e
        return e


def _plan_on_node(path: str, limits, member_id: int, kind: str, args: dict) -> dict:
    """Plan a read in one read transaction of the member's files (a Ray task on
    its node)."""
    from raymx.spark_bridge.reader import SnapshotReader
    e = local_engine(path, limits, member_id)
    wait = args.pop("wait_for", None)
    r = SnapshotReader(e, None if wait is None else GTID(*wait), args.pop("wait_s", 30.0))
    try:
        if kind == "collection":
            return r.plan_ranges(**args)
        p = r.plan_changes(**args)
        p["hash"] = r.entry_hash(GTID(*p["until"]))
        return p
    finally:
        r.close()


_remote_plan = None


def plan_read(m: dict, kind: str, wait_s: float = 30.0, **args) -> dict:
    """``_plan_on_node`` run as a Ray task pinned to member ``m``'s node."""
    global _remote_plan
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from raymx.spark_bridge.datasource import _unwrap
    if _remote_plan is None:
        _remote_plan = ray.remote(num_cpus=0, max_retries=0)(_plan_on_node)
    ref = _remote_plan.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        m["node_id"], soft=False)).remote(m["path"], m["limits"], m["id"], kind,
                                          dict(args, wait_s=wait_s))
    return _unwrap(lambda: ray.get(ref, timeout=wait_s + 120))


_HOLDS: dict[tuple, float] = {}  # (set, member, key) -> when this process's hold expires


def hold(rs, member_id: int, gtid, hold_s: float, key: int | None = None) -> int:
    """Keep ``gtid`` and every later entry in member ``member_id``'s oplog for
    ``hold_s`` (a trim hold under a negative key no member has); returns the
    key. Holds this process placed that have expired are lifted on the way
    (the member ignores them, but would keep them listed)."""
    import time

    import ray
    key = key if key is not None else -random.randrange(1, 1 << 31)
    m = rs.member(member_id)
    now = time.monotonic()
    for k in [k for k, until in _HOLDS.items() if until < now and k[:2] == (rs.name, member_id)]:
        del _HOLDS[k]
        m.hold_trim.remote(k[2], None, 0)
    ray.get(m.hold_trim.remote(key, list(gtid), hold_s), timeout=30)
    _HOLDS[(rs.name, member_id, key)] = now + hold_s
    return key


def release(rs, member_id: int, key: int) -> None:
    """Lift the hold ``key`` (a read that failed before it returned)."""
    _HOLDS.pop((rs.name, member_id, key), None)
    try:
        rs.member(member_id).hold_trim.remote(key, None, 0)
    except Exception:
        pass  # it expires anyway


def member_for_spark(rs, member) -> dict:
    """The member's config (``datasource._member_of``) and the Ray cluster a
    Spark worker joins to read it from another node (``ray``)."""
    import ray

    from raymx.spark_bridge.datasource import _member_of
    m = _member_of(rs, member)
    ctx = ray.get_runtime_context()
    return dict(m, ray=(ctx.gcs_address, ctx.namespace))


def _parts_df(spark, n: int):
    """A DataFrame of ``n`` rows ``id`` 0..n-1, one per partition (one Spark task each)."""
    return spark.range(0, n, 1, n)


# --- reading partitions, on this host or on the member's -------------------------
def collection_part(m: dict, i: int, ns: str, plan: dict, flt, schema: pa.Schema,
                    strict: bool, batch_docs: int = BATCH_DOCS):
    """Arrow batches of partition ``i`` of a planned collection read, as of its GTID."""
    from raymx.spark_bridge.reader import SnapshotReader
    r = SnapshotReader(local_engine(m["path"], m["limits"], m["id"]))
    try:
        for docs in r.read_part(ns, plan, i, flt, batch_docs):
            # (no `yield from` over a list: a Ray streaming task sends values in)
            for b in convert.docs_to_table(docs, schema, strict).to_batches():
                yield b
    finally:
        r.close()


def changes_part(m: dict, i: int, plan: dict, ns_filter):
    """Arrow batches (``CHANGES_SCHEMA``) of partition ``i`` of a planned change read."""
    from raymx.spark_bridge.reader import SnapshotReader
    lo, hi, _ = plan["parts"][i]
    r = SnapshotReader(local_engine(m["path"], m["limits"], m["id"]))
    try:
        r.check_point(GTID(*plan["until"]), plan["hash"])
        for entries in r.iter_changes(lo, hi):
            for b in convert.changes_rows(entries, ns_filter).to_batches():
                yield b
    finally:
        r.close()


_remote_parts: dict = {}


def part_batches(m: dict, fn, *args, local: bool | None = None):
    """``fn(m, *args)``'s batches: read here when this host has the member's
    files (``local=None``: when its ``data.mdb`` is here), else by a Ray task
    on the member's node streaming them back (the Spark worker joins the Ray
    cluster ``m["ray"]`` names for that, once)."""
    if local is None:
        local = os.path.isfile(os.path.join(m["path"], "data.mdb"))
    if local:
        yield from fn(m, *args)
        return
    import logging

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from raymx.spark_bridge.datasource import _unwrap
    if not ray.is_initialized():
        address, namespace = m["ray"]
        ray.init(address=address, namespace=namespace, logging_level=logging.WARNING,
                 log_to_driver=False)
    remote = _remote_parts.get(fn.__name__)
    if remote is None:
        remote = _remote_parts[fn.__name__] = ray.remote(num_cpus=0, max_retries=0)(fn)
    gen = remote.options(num_returns="streaming", scheduling_strategy=(
        NodeAffinitySchedulingStrategy(m["node_id"], soft=False))).remote(m, *args)
    for ref in gen:
        yield _unwrap(lambda: ray.get(ref))


def _mapped(spark, m: dict, n: int, schema: pa.Schema, fn, *args):
    """``spark.range(n).mapInArrow``: task ``i`` yields ``part_batches(m, fn, i, *args)``."""
    from raymx.spark_bridge import session

    def run(batches):
        for b in batches:
            for i in b.column(0).to_pylist():
                yield from part_batches(m, fn, i, *args)
    return _parts_df(spark, n).mapInArrow(run, session.spark_schema(schema))


def collection_dataframe(spark, m: dict, ns: str, plan: dict, flt, schema: pa.Schema,
                         strict: bool):
    """The DataFrame whose Spark tasks read the partitions of ``plan``."""
    plan = {k: v for k, v in plan.items() if k != "sample"}
    return _mapped(spark, m, len(plan["parts"]), schema, collection_part, ns, plan, flt,
                   schema, strict)


def changes_dataframe(spark, m: dict, plan: dict, ns_filter):
    """The DataFrame whose Spark tasks read the GTID ranges of ``plan``."""
    return _mapped(spark, m, len(plan["parts"]), convert.CHANGES_SCHEMA, changes_part,
                   plan, ns_filter)


# --- writing -------------------------------------------------------------------------
_CLIENTS: dict[str, object] = {}


def _client(url: str):
    """One client per replica set URL in this process (Spark reuses its Python
    workers across tasks); it follows the primary through elections."""
    c = _CLIENTS.get(url)
    if c is None:
        import raymx
        c = _CLIENTS[url] = raymx.connect_url(url)
    return c


_RETRY = (errors.NotPrimary, errors.PrimaryUnavailable, errors.ConnectionLost)


def replace_batch(client, ns: str, docs: list[dict], wc: dict, merge: bool
                  ) -> tuple[GTID | None, int, int]:
    """Replace (``merge``: ``$set`` the rows' fields into) the documents with
    the rows' ``_id``s, upserting the missing ones unless ``merge``: ONE
    statement (``Collection.replace_many``, one GTID, or none when every row
    equals its stored document). Idempotent. Returns (GTID, rows written: found
    or inserted, rows with no document)."""
    import time
    db, coll = ns.split(".", 1)
    c = client[db][coll]
    deadline = time.monotonic() + client.timeout_s
    while True:
        try:
            r = c.replace_many(docs, upsert=not merge, merge=merge, **wc)
            written = r.matched_count + len(r.upserted_ids)
            return r.gtid, written, len(docs) - written
        except _RETRY:  # a retry of a statement that did commit changes nothing
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)  # the client finds the new primary on the next call


def _writer(url: str, ns: str, mode: str, wc: dict, keep_nulls: bool, batch_docs: int,
            counter=None):
    db, coll = ns.split(".", 1)

    def write(chunk):
        client = _client(url)
        if mode == "append":
            return client[db][coll].insert_many(chunk, **wc).gtid, len(chunk), 0
        return replace_batch(client, ns, chunk, wc, merge=(mode == "update"))

    def run(batches):
        written = missing = 0
        newest = None
        pool = ThreadPoolExecutor(1, thread_name_prefix="raymx-write")
        fut = None
        try:
            for b in batches:
                docs = convert.table_to_docs(pa.Table.from_batches([b]), keep_nulls)
                for i in range(0, len(docs), batch_docs):
                    nxt = pool.submit(write, docs[i:i + batch_docs])
                    if fut is not None:  # one statement on the wire while the next converts
                        g, n, miss = fut.result()
                        written, missing = written + n, missing + miss
                        if counter is not None:
                            counter.add(n)
                        newest = g if newest is None or (g is not None and g > newest) else newest
                    fut = nxt
            if fut is not None:
                g, n, miss = fut.result()
                written, missing = written + n, missing + miss
                if counter is not None:
                    counter.add(n)
                newest = g if newest is None or (g is not None and g > newest) else newest
        finally:
            pool.shutdown(wait=True)
        yield pa.RecordBatch.from_pydict({
            "written": [written], "missing": [missing],
            "term": [None if newest is None else newest.term],
            "seq": [None if newest is None else newest.seq]},
            schema=WRITE_RESULT_SCHEMA)
    return run


WRITE_RESULT_SCHEMA = pa.schema([("written", pa.int64()), ("missing", pa.int64()),
                                 ("term", pa.int64()), ("seq", pa.int64())])


def clear_collection(rs, ns: str, wc: dict) -> list[dict]:
    """Drop ``ns`` and create its secondary indexes again on the empty
    collection (``overwrite``); returns their specs."""
    db, coll = ns.split(".", 1)
    client = rs.client(**wc)
    try:
        c = client[db][coll]
        specs = [ix for ix in c.list_indexes() if ix["name"] != "_id_"]
        c.drop()
        for ix in specs:
            c.create_index(ix["key"], unique=ix["unique"], name=ix["name"],
                           expire_after_seconds=ix.get("expireAfterSeconds"))
        return specs
    finally:
        client.close()


def write_partitions(df, url: str, ns: str, mode: str, wc: dict, keep_nulls: bool,
                     batch_docs: int, progress: bool = True) -> list:
    """Run the write as one Spark job; the per-partition results (successful
    task attempts only). Progress: documents written, as tasks end
    (``raymx.progress``: a bar on a terminal, a line every few seconds else)."""
    from raymx.progress import Progress
    from raymx.spark_bridge import session
    from raymx.spark_bridge.copy_tasks import run_job
    counter = df.sparkSession.sparkContext.accumulator(0)
    fn = _writer(url, ns, mode, wc, keep_nulls, batch_docs, counter)
    job = df.mapInArrow(fn, session.spark_schema(WRITE_RESULT_SCHEMA)).collect
    with Progress(f"Spark write to {ns} ({mode})", None, progress, unit="docs") as bar:
        return run_job(job, bar, counter, sc=df.sparkSession.sparkContext)
