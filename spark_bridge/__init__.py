"""raymx.spark_bridge: Spark (through RayDP) and Ray Data on the replica set's Ray cluster.

``spark_session()`` / ``stop_spark()`` start and stop Spark with the flags Java
17 needs. Imports are lazy so that ``import raymx.spark_bridge`` does not
start a JVM or import pyspark.
"""
from __future__ import annotations

_EXPORTS = {
    "spark_session": "session", "stop_spark": "session", "JAVA17_FLAGS": "session",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'raymx.spark_bridge' has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(f"raymx.spark_bridge.{mod}"), name)
