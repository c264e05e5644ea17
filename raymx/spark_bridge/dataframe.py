"""Collections and the change stream as Spark DataFrames, and DataFrames into collections.

Reading goes snapshot -> Ray Data read tasks (Arrow blocks, on the member's
node) -> Spark (``mapInArrow`` over the blocks, no pandas in between); the
snapshot is closed as soon as the blocks are materialized, so no LMDB read
transaction outlives the call. Writing goes Spark -> Ray Data
(``ray.data.from_spark``) -> ``CollectionDatasink`` -> the primary.

Schemas: ``read_collection`` as ``raymx.spark_bridge.convert`` documents (one
column per top-level field, nested documents as structs, ``_id`` first);
``read_changes`` as ``CHANGES_SCHEMA`` in ``raymx.spark_bridge.datasource``.
"""
from __future__ import annotations

import ray

from raymx import errors
from raymx.spark_bridge import session
from raymx.spark_bridge.datasource import (ChangesDatasource, CollectionDatasink,
                                           CollectionDatasource, WriteSummary, _read,
                                           majority_point)


def _blocks(ds) -> list:
    """The block refs of a materialized dataset (as ``Dataset.to_spark`` gets them)."""
    return [ref for bundle in ds.iter_internal_ref_bundles() for ref in bundle.block_refs]


def _to_spark(spark, src):
    """Materialize the source's blocks, close its snapshot, hand them to Spark."""
    try:
        ds = _read(src).materialize()
        blocks = _blocks(ds)
    finally:
        src.close()
    return session.dataframe_from_blocks(spark, blocks, src.schema)


def read_collection(spark, rs, ns: str, at=None, member=None, schema=None,
                    partitions: int | None = None, sample_docs: int = 1000,
                    read_concern: str = "local"):
    """The collection ``ns`` as a DataFrame, from one consistent snapshot.

    ``at``: the GTID to read as of (default: the newest the member has
    applied; a GTID it has not applied yet is waited for). ``member``: a member
    id, ``"primary"`` (default) or ``"secondary"``. ``schema``: a Spark
    StructType or DDL string (``"_id string, n long, a struct<b: string>"``);
    fields outside it are left out. Without it the schema is inferred from
    ``sample_docs`` documents spread over the collection and every document
    must fit it (SchemaMismatch names the field otherwise).

    ``read_concern="majority"`` reads as of the member's majority-committed
    point (never a write that can be rolled back; ``at`` then must be None).

    The returned DataFrame carries ``df.snapshot_gtid``: the GTID its data is
    exactly as of.
    """
    if read_concern not in ("local", "majority", "snapshot"):
        raise errors.ConfigError(f"read_concern {read_concern!r}: 'local', 'majority' or "
                                 "'snapshot' (a Spark read is one snapshot)")
    if read_concern != "local":
        if at is not None:
            raise errors.ConfigError("at= and read_concern='majority' each name the point to "
                                     "read as of: give one")
        at = majority_point(rs, member)
    arrow = None
    if schema is not None:
        arrow = session.arrow_schema(session.parse_schema(spark, schema))
    src = CollectionDatasource(rs, ns, at=at, member=member, schema=arrow,
                               partitions=partitions, sample_docs=sample_docs)
    df = _to_spark(spark, src)
    df.snapshot_gtid = src.gtid
    return df


def read_changes(spark, rs, after, until=None, member=None, ns=None,
                 partitions: int | None = None):
    """The ops committed in (``after``, ``until``] as a DataFrame, one row per op.

    Columns (``CHANGES_SCHEMA``): ``gtid`` ("term:seq"), ``term``, ``seq``,
    ``idx`` (position in its transaction), ``ts`` (commit time, timestamp),
    ``op`` (``i`` insert, ``u`` update, ``d`` delete, ``c`` command), ``ns``,
    ``_id`` (a string ``_id`` as is, other ``_id``s as JSON text), ``pre`` and
    ``post`` (the images as JSON text: ``F.from_json`` or
    ``F.get_json_object`` to filter on fields), ``cmd`` (a command's fields as
    JSON). No-op entries have no rows. Ordered by (``seq``, ``idx``) as read.
    ``until`` defaults to the newest GTID the member has applied;
    ``df.snapshot_gtid`` is the ``until`` used. ``ns``: only these namespaces.
    """
    src = ChangesDatasource(rs, after, until=until, member=member, ns=ns,
                            partitions=partitions)
    df = _to_spark(spark, src)
    df.snapshot_gtid = src.until
    return df


def write_dataframe(df, rs, ns: str, mode: str = "append", w="majority", j: bool = False,
                    wtimeout_ms: int | None = None, keep_nulls: bool = False,
                    batch_docs: int = 1000) -> WriteSummary:
    """Write the rows of ``df`` as documents into ``ns`` through the primary.

    ``mode="append"`` inserts (a duplicate ``_id`` fails); ``"upsert"``
    replaces the document with the row's ``_id`` or inserts it (idempotent).
    ``w``/``j``/``wtimeout_ms``: the write concern of every write. Null fields
    are left out unless ``keep_nulls``. Returns ``WriteSummary(written, gtid)``:
    ``read_collection(..., at=summary.gtid)`` sees every written document.
    Column types Spark has and documents do not (timestamp, date, decimal...)
    are refused before anything is written.
    """
    sink = CollectionDatasink(rs, ns, mode=mode, w=w, j=j, wtimeout_ms=wtimeout_ms,
                              keep_nulls=keep_nulls, batch_docs=batch_docs)
    from raymx.spark_bridge import convert
    convert.check_writable(session.arrow_schema(df.schema))
    if mode == "upsert" and "_id" not in df.columns:
        raise errors.InvalidInput("upsert needs an _id column")
    ds, release = session.dataset_from_spark(df)
    try:
        ds.write_datasink(sink)
    finally:
        release()
    return sink.result or WriteSummary()
