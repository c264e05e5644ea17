"""raymx.spark_bridge: Spark (through RayDP) and Ray Data on the replica set's Ray cluster.

``spark_session()`` / ``stop_spark()`` start and stop Spark with the flags Java
17 needs. ``read_collection``, ``read_changes`` and ``write_dataframe`` move
collections and the change stream to and from DataFrames: Spark tasks read
the member's LMDB files as of one GTID and write straight to the primary
(``direct``). ``CollectionDatasource``, ``ChangesDatasource`` and
``CollectionDatasink`` do the same for ``ray.data`` (``read_dataset``,
``read_changes_dataset``, ``write_dataset``), over one consistent snapshot of
a member (``open_snapshot``). ``stream_changes`` streams the set's oplog
archive (``archive_io``). Imports are lazy so that ``import
raymx.spark_bridge`` does not start a JVM or import pyspark.
"""
from __future__ import annotations

_EXPORTS = {
    "spark_session": "session", "stop_spark": "session", "JAVA17_FLAGS": "session",
    "read_collection": "dataframe", "read_changes": "dataframe", "write_dataframe": "dataframe",
    "CollectionDatasource": "datasource", "ChangesDatasource": "datasource",
    "CollectionDatasink": "datasource", "CHANGES_SCHEMA": "datasource",
    "WriteSummary": "datasource", "open_snapshot": "datasource", "SnapshotHandle": "datasource",
    "read_dataset": "datasource", "read_changes_dataset": "datasource",
    "write_dataset": "datasource", "stream_changes": "archive_io",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'raymx.spark_bridge' has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(f"raymx.spark_bridge.{mod}"), name)
