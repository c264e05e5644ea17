"""raymx: a replicated, transactional document store on Ray, LMDB and Spark.

The public API is ``raymx.ReplicaSet``, ``raymx.connect`` and ``raymx.errors``.
Heavy imports (ray) happen lazily so that ``raymx.storage`` and
``raymx.errors`` stay importable without them.
"""
from __future__ import annotations

from raymx import errors  # noqa: F401  (light: no ray)

__all__ = ["ReplicaSet", "connect", "connect_url", "errors", "GTID", "WriteConcern",
           "ReadPreference", "ReadConcern", "Limits", "ReturnDocument", "InsertOne", "UpdateOne",
           "UpdateMany", "ReplaceOne", "DeleteOne", "DeleteMany"]

_FROM_CLIENT = ("WriteConcern", "ReadPreference", "ReadConcern", "connect_url", "ReturnDocument",
                "InsertOne", "UpdateOne", "UpdateMany", "ReplaceOne", "DeleteOne", "DeleteMany")


def __getattr__(name):
    if name in ("ReplicaSet", "connect"):
        from raymx import replset
        return getattr(replset, name)
    if name in _FROM_CLIENT:
        from raymx import client
        return getattr(client, name)
    if name == "Limits":
        from raymx.storage.limits import Limits
        return Limits
    if name == "GTID":
        from raymx.storage.gtid import GTID
        return GTID
    raise AttributeError(f"module 'raymx' has no attribute {name!r}")
