"""Spark over the oplog archive (DESIGN section 9): ``read_changes`` before the
live oplog, and ``stream_changes``, a Structured Streaming query over the
archive folder.

The archive is a folder of Parquet segments in the ``read_changes`` columns
(``CHANGES_SCHEMA``), written by the primary in GTID order, each at most
``lag_s`` (``ReplicaSet.set_archive``) after its entries are
majority-committed; its index and temporary files start with ``_`` and
``.``, which Spark's file sources skip. So the folder itself is a Parquet
stream source, and it covers the live tail: every majority-committed op
reaches it within ``lag_s``. No second source (and no merge of two) is
needed.

Spark 3.5 (what RayDP allows here) has no Python streaming source API;
``stream_changes`` uses Spark's own file source, whose offsets (the files of
each micro-batch) are in the query's checkpoint, with ``foreachBatch``.
"""
from __future__ import annotations

from raymx import errors
from raymx.spark_bridge import convert
from raymx.storage import archive as A
from raymx.storage.changes import parse_token
from raymx.storage.gtid import GTID


def _location(rs) -> dict:
    loc = rs.archive_location()
    if loc is None:
        raise errors.InvalidInput(f"replica set {rs.name!r} has no oplog archive: set one with "
                                  "rs.set_archive(folder or pyarrow.fs URI)")
    return loc


def spark_path(uri: str) -> str:
    """The archive folder as Spark names it (a local folder: ``file://``)."""
    return uri if "://" in uri else "file://" + uri


# --- read_changes before the live oplog -----------------------------------------
def archive_index(uri: str) -> dict:
    from raymx.actors.archiving import open_fs, read_index
    fs, base = open_fs(uri)
    return read_index(fs, base)


def _segment_part(uri: str, seg: dict, after: tuple, until_seq: int | None, ns):
    """Arrow batches of one segment's rows after ``after`` (a token) up to ``until_seq``."""
    import pyarrow.compute as pc

    from raymx.actors.archiving import open_fs, read_segment
    fs, base = open_fs(uri)
    tb = read_segment(fs, base, seg)
    seq, idx = tb.column("seq"), tb.column("idx")
    keep = pc.greater(seq, after[1])
    if len(after) == 3:
        keep = pc.or_(keep, pc.and_(pc.equal(seq, after[1]), pc.greater(idx, after[2])))
    if until_seq is not None:
        keep = pc.and_(keep, pc.less_equal(seq, until_seq))
    if ns is not None:
        keep = pc.and_(keep, pc.is_in(tb.column("ns"), value_set=__import__("pyarrow").array(
            sorted(ns))))
    tb = tb.filter(keep).cast(convert.CHANGES_SCHEMA)
    for b in tb.to_batches():
        yield b


def archived_changes(spark, rs, after, until: GTID | None, ns):
    """The rows after ``after`` (a token) up to ``until`` that the archive holds,
    as a DataFrame ordered by (seq, idx) (one Spark task per segment, in
    order), and the newest entry it covers (the live oplog goes on from
    there). Raises ``OplogTrimmed`` if the archive does not hold the entry
    after ``after`` either."""
    from raymx.spark_bridge import session
    uri = _location(rs)["uri"]
    idx = archive_index(uri)
    token = parse_token(list(after))
    segs = A.segments_after(idx, token)
    if until is not None:
        segs = [s for s in segs if s["first"][1] <= until.seq]
    through = A.through(idx)
    if until is not None and until.seq < through.seq:
        through = until
    until_seq = None if until is None else until.seq

    def run(batches):
        for b in batches:
            for i in b.column(0).to_pylist():
                yield from _segment_part(uri, segs[i], token, until_seq, ns)
    df = spark.range(0, max(1, len(segs)), 1, max(1, len(segs)))
    if not segs:
        df = df.limit(0)
    return df.mapInArrow(run, session.spark_schema(convert.CHANGES_SCHEMA)), through


# --- Structured Streaming ------------------------------------------------------------
def stream_changes(spark, rs, after=None, checkpoint: str | None = None, process=None,
                   ns=None, trigger_s: float = 1.0, query_name: str | None = None):
    """The set's changes as a Spark Structured Streaming source: the oplog
    archive's folder (``ReplicaSet.set_archive``) read by Spark's Parquet
    file source, one row per op in the ``read_changes`` columns.

    ``after``: a GTID or resume token (``[term, seq]`` / ``[term, seq,
    op]``); only later ops (None: everything the archive holds). An
    ``after`` older than what the archive holds raises ``OplogTrimmed``. ``ns``: only
    these namespaces. Latency: an op reaches the stream at most the archive's
    ``lag_s`` after it is majority-committed, plus ``trigger_s``. Only
    majority-committed ops are in it (never one that is rolled back).

    Without ``process``: returns the streaming DataFrame; write it with your
    own ``writeStream`` and checkpoint (order each micro-batch by ``seq``,
    ``idx``: within a batch Spark reads several files in any order).

    With ``process(df, batch_id)``: starts the query and returns its
    ``StreamingQuery``: ``foreachBatch`` hands ``process`` each micro-batch
    ordered by (``seq``, ``idx``), micro-batches in GTID order, with the
    query's ``checkpoint`` folder (required). Delivery: Spark records each
    batch's files in the checkpoint before it runs and marks it done after
    ``process`` returns; after a crash the unfinished batch runs again with
    the same ``batch_id`` and the same rows. So every op reaches ``process``
    at least once and in order, and exactly once into a sink that is
    idempotent per ``batch_id`` or per (``seq``, ``idx``) (an upsert, a
    MERGE, or a write keyed by ``batch_id``); a sink that only appends may
    see the batch that was running at the crash twice.
    """
    from pyspark.sql import functions as F

    from raymx.spark_bridge import session
    loc = _location(rs)
    if process is not None and not checkpoint:
        raise errors.InvalidInput("stream_changes with process= needs checkpoint= (a folder "
                                  "Spark keeps the query's progress in)")
    if trigger_s is not None and (isinstance(trigger_s, bool) or not isinstance(
            trigger_s, (int, float)) or trigger_s <= 0):
        raise errors.InvalidInput(f"trigger_s must be a positive number, got {trigger_s!r}")
    if isinstance(ns, str):
        ns = [ns]
    token = None
    if after is not None:
        try:
            token = parse_token(list(GTID.parse(after)) if isinstance(after, str) else after)
        except ValueError as e:
            raise errors.InvalidInput(f"after: {e}") from None
    if token is not None:  # history the archive no longer (or never) had: say so
        idx = archive_index(loc["uri"])
        if idx["segments"]:
            A.segments_after(idx, token)  # raises OplogTrimmed
    df = (spark.readStream.schema(session.spark_schema(convert.CHANGES_SCHEMA))
          .parquet(spark_path(loc["uri"])))
    if token is not None:
        cond = F.col("seq") > token[1]
        if len(token) == 3:
            cond = cond | ((F.col("seq") == token[1]) & (F.col("idx") > token[2]))
        df = df.where(cond)
    if ns:
        df = df.where(F.col("ns").isin(list(ns)))
    if process is None:
        return df

    def batch(bdf, batch_id):
        process(bdf.orderBy("seq", "idx"), batch_id)
    w = (df.writeStream.foreachBatch(batch).option("checkpointLocation", checkpoint)
         .trigger(processingTime=f"{trigger_s} seconds"))
    if query_name:
        w = w.queryName(query_name)
    return w.start()
