"""Collections and the change stream as Spark DataFrames, and DataFrames into collections.

Reading plans the read on the member's node and hands Spark a DataFrame whose
tasks read their own key-range partitions straight from the member's LMDB
files as of one GTID (``raymx.spark_bridge.direct``); writing runs one Spark
job whose tasks write straight to the primary. No Ray Data in between (the
Ray Data datasource and datasink in ``raymx.spark_bridge.datasource`` stay
for ``ray.data`` users).

Schemas: ``read_collection`` as ``raymx.spark_bridge.convert`` documents (one
column per top-level field, nested documents as structs, ``_id`` first);
``read_changes`` as ``convert.CHANGES_SCHEMA``.
"""
from __future__ import annotations

import pyarrow as pa

from raymx import errors
from raymx.spark_bridge import convert, direct, session
from raymx.spark_bridge.datasource import WriteSummary, majority_point
from raymx.storage import codec
from raymx.storage.engine import split_ns
from raymx.storage.gtid import GTID


def _gtid_arg(g, what: str):
    try:
        return None if g is None else GTID.parse(g)
    except ValueError as e:
        raise errors.InvalidInput(f"{what}: {e}") from None


def _hold_s(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise errors.InvalidInput(f"hold_s must be a positive number of seconds, got {v!r}")


def _positive(v, what: str):
    if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
        raise errors.InvalidInput(f"{what} must be a positive integer, got {v!r}")


def read_collection(spark, rs, ns: str, at=None, member=None, schema=None,
                    partitions: int | None = None, sample_docs: int = 1000,
                    read_concern: str = "local", filter: dict | None = None,
                    columns: list[str] | None = None, hold_s: float = direct.HOLD_S,
                    rows_per_partition: int = 1_000_000):
    """The collection ``ns`` as a DataFrame, exactly as of one GTID.

    ``at``: the GTID to read as of (default: the newest the member has
    applied; a GTID it has not applied yet is waited for). ``member``: a member
    id, ``"primary"`` (default) or ``"secondary"``. ``read_concern="majority"``
    reads as of the member's majority-committed point (never a write that can
    be rolled back; ``at`` then must be None).

    ``filter``: a raymx filter document, applied where the data is read (only
    matching documents reach Spark). When it bounds ``_id`` or a field with a
    one-field index (equality, ``$in``, ``$gt``/``$gte``/``$lt``/``$lte`` at
    the top level or in a top-level ``$and``), the partitions cover only that
    index's matching key range. An operator raymx filters do not have
    (``$where``, ``$near``, ``$text``...) raises ``InvalidFilter`` naming
    it: a filter is never silently ignored. ``df.read_plan`` tells what the
    read does: ``plan`` ("COLLSCAN", "IDHACK", "IXSCAN <index>"), ``keys``
    (the entries it examines) and ``parts``.

    ``columns``: only these top-level fields become columns (the others are
    never converted). ``schema``: a Spark StructType or DDL string
    (``"_id string, n long, a struct<b: string>"``); fields outside it are left
    out. Without either, the schema is inferred from ``sample_docs`` documents
    spread over the range read, and every document must fit it
    (SchemaMismatch names the field otherwise).

    ``partitions``: how many Spark tasks read (default: one per
    ``rows_per_partition`` documents, at least Spark's default parallelism;
    each task costs a fixed ~0.1-0.3 s here, so few large partitions suit a
    small executor).

    ``df.snapshot_gtid`` is the GTID the data is exactly as of: every partition,
    every Spark action on the DataFrame and every retried task reads the
    collection as of it. The DataFrame is lazy: Spark tasks read the member's
    files when an action runs (a worker on another node streams its
    partition from a Ray task on the member's node).
    The member keeps the oplog entries after ``snapshot_gtid`` (which
    reconstruct it) for ``hold_s`` seconds; an action after that may fail
    with TooStale if they were trimmed (``cache()`` the DataFrame to keep the
    rows longer). A rollback of the member past that GTID fails the read
    (Diverged) rather than returning another history.
    """
    if read_concern not in ("local", "majority", "snapshot"):
        raise errors.ConfigError(f"read_concern {read_concern!r}: 'local', 'majority' or "
                                 "'snapshot' (a Spark read is one snapshot)")
    split_ns(ns)
    at = _gtid_arg(at, "at")
    _positive(partitions, "partitions")
    _positive(rows_per_partition, "rows_per_partition")
    _hold_s(hold_s)
    if filter is not None and not isinstance(filter, dict):
        raise errors.InvalidFilter(f"filter must be a filter document (a dict), got "
                                   f"{type(filter).__name__}")
    if columns is not None and (isinstance(columns, str) or not all(
            isinstance(c, str) and c for c in columns)):
        raise errors.InvalidInput("columns must be a list of top-level field names")
    from raymx.storage import query
    query.compile_filter(filter)  # InvalidFilter, naming the operator, before any work
    if read_concern != "local":
        if at is not None:
            raise errors.ConfigError("at= and read_concern='majority' each name the point to "
                                     "read as of: give one")
        at = majority_point(rs, member)
    m = direct.member_for_spark(rs, member)
    key = None if at is None else direct.hold(rs, m["id"], at, hold_s)
    try:
        plan = direct.plan_read(m, "collection", ns=ns, at=None if at is None else list(at),
                                flt=filter, partitions=partitions,
                                rows_per_partition=rows_per_partition, sample_docs=sample_docs,
                                min_partitions=spark.sparkContext.defaultParallelism,
                                wait_for=None if at is None else list(at))
    except BaseException:
        if key is not None:
            direct.release(rs, m["id"], key)
        raise
    g = GTID(*plan["gtid"])
    direct.hold(rs, m["id"], g, hold_s, key)
    arrow, strict = None, False
    if schema is not None:
        arrow = session.arrow_schema(session.parse_schema(spark, schema))
    if columns is not None:
        if arrow is not None:
            missing = [c for c in columns if c not in arrow.names]
            if missing:
                raise errors.InvalidInput(f"columns {missing} are not in the schema")
            arrow = pa.schema([arrow.field(c) for c in columns])
        else:
            sample = [{c: d[c] for c in columns if c in d}
                      for d in codec.unpack(plan["sample"], "sample")]
            inferred = convert.infer_schema(sample)
            arrow = pa.schema(
                [inferred.field(c) if c in inferred.names else (c, "string") for c in columns])
    if arrow is None:
        sample = codec.unpack(plan["sample"], "sample")
        arrow, strict = convert.infer_schema(sample), True
        # the sample misses a field another document has: caught at read time
        # (strict), naming it; here, at least the sample must fit
        convert.docs_to_table(sample, arrow)
    df = direct.collection_dataframe(spark, m, ns, plan, filter, arrow, strict)
    df.snapshot_gtid = g
    df.read_plan = {"plan": plan["plan"], "keys": plan["keys"], "parts": len(plan["parts"]),
                    "member": m["id"]}
    return df


def read_changes(spark, rs, after, until=None, member=None, ns=None,
                 partitions: int | None = None, entries_per_partition: int = 50_000,
                 hold_s: float = direct.HOLD_S):
    """The ops committed in (``after``, ``until``] as a DataFrame, one row per op.

    Columns (``CHANGES_SCHEMA``): ``gtid`` ("term:seq"), ``term``, ``seq``,
    ``idx`` (position in its transaction), ``ts`` (commit time, timestamp),
    ``op`` (``i`` insert, ``u`` update, ``d`` delete, ``c`` command), ``ns``,
    ``_id`` (a string ``_id`` as is, other ``_id``s as JSON text), ``pre`` and
    ``post`` (the images as JSON text: ``F.from_json`` or
    ``F.get_json_object`` to filter on fields), ``cmd`` (a command's fields as
    JSON). No-op entries have no rows. Ordered by (``seq``, ``idx``) within
    and across partitions. ``until`` defaults to the newest GTID the member
    has applied; ``df.snapshot_gtid`` is the ``until`` used. ``ns``: only
    these namespaces. Spark tasks read the oplog from the member's files;
    the member keeps the entries after ``after`` for ``hold_s`` seconds. An
    ``after`` older than the live oplog is read from the set's oplog archive
    (``ReplicaSet.set_archive``) while it holds it: the archive's segments
    first (a task each), then the live oplog from where the archive ends.
    """
    if after is None:
        raise errors.InvalidInput("after is required: a GTID ('term:seq'; '0:0' for the "
                                  "beginning)")
    after, until = _gtid_arg(after, "after"), _gtid_arg(until, "until")
    if until is not None and until.seq < after.seq:
        raise errors.InvalidInput(f"until {until} is before after {after}")
    _positive(partitions, "partitions")
    _hold_s(hold_s)
    if isinstance(ns, str):
        ns = [ns]
    for n in ns or ():
        split_ns(n)
    m = direct.member_for_spark(rs, member)
    old_after = after  # the caller's (after moves to the archive's end)
    nsf = None if ns is None else frozenset(ns)
    old = None  # the archive's part (after is older than the live oplog)
    for _ in range(5):
        key = direct.hold(rs, m["id"], after, hold_s)
        try:
            plan = direct.plan_read(m, "changes", after=list(after),
                                    until=None if until is None else list(until),
                                    partitions=partitions,
                                    entries_per_partition=entries_per_partition,
                                    wait_for=None if until is None else list(until))
            break
        except errors.TooStale:
            direct.release(rs, m["id"], key)
            if rs.archive_location() is None:
                raise
            # older than the live oplog: the archive has it (DESIGN 9); the live
            # oplog goes on after what the archive holds (trimming never passes
            # that; it may have moved on meanwhile: then again)
            from raymx.spark_bridge import archive_io
            old, through = archive_io.archived_changes(spark, rs, old_after or after, until,
                                                       nsf)
            if until is not None and through.seq >= until.seq:
                old.snapshot_gtid = until
                return old
            after = through
        except BaseException:
            direct.release(rs, m["id"], key)
            raise
    else:
        raise errors.TooStale(f"the live oplog kept moving past the archive's end ({after}): "
                              "try again")
    df = direct.changes_dataframe(spark, m, plan, nsf)
    if old is not None:
        df = old.union(df)  # partitions in order: the archive's, then the live oplog's
    df.snapshot_gtid = GTID(*plan["until"])
    return df


def write_dataframe(df, rs, ns: str, mode: str = "append", w="majority", j: bool = False,
                    wtimeout_ms: int | None = None, keep_nulls: bool = False,
                    batch_docs: int = 1000) -> WriteSummary:
    """Write the rows of ``df`` as documents into ``ns``: one Spark job, each
    task writing its partition straight to the primary (a raymx client in the
    executor's Python worker), ``batch_docs`` rows per statement, the next
    batch converted while the previous one is on the wire.

    Modes:

    - ``"append"``: ``insert_many`` (one GTID per batch). NOT safe to retry:
      if Spark retries a task that had written some batches, the retry
      inserts them again (a row with an ``_id`` fails with DuplicateKey and
      fails the job; rows without ``_id`` get new generated ids, so are
      written twice). Use ``upsert`` when rows carry ``_id`` and tasks may fail.
    - ``"upsert"``: each row replaces the document with its ``_id``, or is
      inserted. Idempotent: a retried task rewrites the same documents.
    - ``"update"``: ``$set`` of the row's columns into the document with its
      ``_id`` (fields not in the DataFrame are kept; null columns are left
      out unless ``keep_nulls``, so they do not unset anything). A row whose
      ``_id`` has no document writes nothing: it is counted in
      ``WriteSummary.missing`` (never inserted). Idempotent.
    - ``"overwrite"``: the collection is dropped, its secondary indexes are
      created again on the empty collection, then the rows are written as in
      ``upsert``. Meanwhile a reader sees the collection empty (or absent)
      right after the drop, then growing batch by batch (each batch atomic)
      until the job ends: there is no moment where old and new contents mix,
      but there are moments where the new contents are partial. A failure
      leaves the rows written so far (the old contents are gone); running the
      write again completes it. A DataFrame read lazily from ``ns`` itself
      cannot be overwritten into it (the drop ends the history it reads:
      ``cache()`` and count it first, or write elsewhere).

    ``upsert``, ``update`` and ``overwrite`` need an ``_id`` column (a row
    with a null ``_id`` fails the job); a DataFrame holding one ``_id`` twice
    leaves the last row written (within a batch, the rows apply in order).
    Each batch of those modes is one ``Collection.replace_many`` statement
    (one GTID, the write concern given here): a replaced or updated document
    is logged as a ``u`` op (change event ``update``, with its images before
    and after), an upserted one as an ``i`` op; a row equal to its stored
    document changes nothing and logs nothing (so a retried task adds no
    ops). A unique index refusing a row fails the job; that row's batch
    wrote nothing (earlier batches stay, as for any failure).

    ``w``/``j``/``wtimeout_ms``: the write concern of every statement. Null
    fields are left out unless ``keep_nulls``. Returns
    ``WriteSummary(written, gtid, missing)``: ``read_collection(...,
    at=summary.gtid)`` sees every written document. Column types Spark has
    and documents do not (timestamp, date, decimal...) are refused before
    anything is written.
    """
    split_ns(ns)
    if mode not in direct.MODES:
        raise errors.InvalidInput(f"mode {mode!r}: one of {', '.join(direct.MODES)}")
    from raymx.client import WriteConcern
    WriteConcern(w, j, wtimeout_ms)  # validates
    _positive(batch_docs, "batch_docs")
    convert.check_writable(session.arrow_schema(df.schema))
    if mode != "append" and "_id" not in df.columns:
        raise errors.InvalidInput(f"mode {mode!r} writes documents by _id: the DataFrame "
                                  "needs an _id column")
    wc = {"w": w, "j": j, **({} if wtimeout_ms is None else {"wtimeout_ms": wtimeout_ms})}
    if mode == "overwrite":
        direct.clear_collection(rs, ns, wc)
    rows = direct.write_partitions(df, rs.url(), ns, "upsert" if mode == "overwrite" else mode,
                                   wc, keep_nulls, batch_docs)
    s = WriteSummary()
    for r in rows:
        s.written += r["written"]
        s.missing += r["missing"]
        if r["term"] is not None:
            g = GTID(r["term"], r["seq"])
            s.gtid = g if s.gtid is None or g > s.gtid else s.gtid
    return s
