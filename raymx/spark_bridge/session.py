"""Spark on the replica set's Ray cluster, through RayDP (the only raydp/pyspark import).

``spark_session()`` starts Spark once per driver process (RayDP allows one
Spark context per process) or returns the running one; ``stop_spark()`` stops
it. The Java 17 flags and the interpreter settings below are what
``../shared/notes/raydp-jdk17.md`` verified; users never pass them.
"""
from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger("raymx.spark")

# Ray's Java serializer (RayDP app master, executors, and the Spark <-> Ray
# Data conversions) reflects into JDK internals; Java 17 refuses unless each
# package is opened. Without java.math/java.text a decimal column kills the
# app master with a misleading "objects_valid" crash, so the list is complete
# on purpose.
_OPENS = ("java.lang", "java.lang.invoke", "java.lang.reflect", "java.io", "java.net",
          "java.nio", "java.util", "java.util.concurrent", "java.util.concurrent.atomic",
          "java.math", "java.text", "java.time", "java.util.regex", "java.security",
          "jdk.internal.ref", "jdk.internal.misc", "sun.nio.ch", "sun.nio.cs",
          "sun.security.action", "sun.util.calendar")
JAVA17_FLAGS = (["-XX:+IgnoreUnrecognizedVMOptions"]
                + [f"--add-opens=java.base/{p}=ALL-UNNAMED" for p in _OPENS]
                + ["--add-opens=java.sql/java.sql=ALL-UNNAMED"])
# The three JVMs RayDP starts: the app master (and the gateway), the driver, executors.
_JAVA_OPTION_KEYS = ("spark.ray.raydp_app_master.extraJavaOptions",
                     "spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions")

_lock = threading.RLock()
_session = None  # the SparkSession this module started


def _defaults(num_executors: int, executor_cores: int) -> dict:
    """Small-machine defaults; every key can be overridden through ``configs``."""
    slots = max(1, num_executors * executor_cores)
    return {
        # 200 shuffle partitions (Spark's default) is ~200 tiny tasks per shuffle
        # on a 2-core machine; a few per executor core is plenty
        "spark.sql.shuffle.partitions": str(2 * slots),
        "spark.default.parallelism": str(2 * slots),
        "spark.ui.enabled": "false",
        # the app master only coordinates: it must not hold one of few CPUs
        "spark.ray.raydp_spark_master.actor.resource.CPU": "0",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
    }


def _ensure_ray():
    import ray
    if not ray.is_initialized():
        from ray.job_config import JobConfig

        from raymx.replset import NAMESPACE
        # the same flags for Java workers Ray itself starts (harmless when unused)
        ray.init(namespace=NAMESPACE, log_to_driver=False,
                 job_config=JobConfig(jvm_options=list(JAVA17_FLAGS)))
    return ray


def active_session():
    """The running RayDP Spark session of this process, or None."""
    try:
        import raydp.context as ctx
    except ImportError:  # no spark extra: no session can be running
        return None
    g = ctx._global_spark_context
    return None if g is None else g._spark_session


def spark_session(rs=None, app_name: str = "raymx", num_executors: int = 1,
                  executor_cores: int = 1, executor_memory: str = "1GB",
                  configs: dict | None = None):
    """Start Spark through RayDP on the Ray cluster this driver is attached to
    (the replica set's: ``rs`` only documents which one), or return the running
    session (arguments are then ignored: one Spark per process).

    Defaults suit a small machine: 1 executor, 1 core, 1 GB. ``configs`` adds or
    overrides Spark settings; extra Java options are appended to the required
    Java 17 flags, never replacing them.
    """
    global _session
    from raymx import errors
    for k, v in (("num_executors", num_executors), ("executor_cores", executor_cores)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise errors.ConfigError(f"{k} must be a positive integer, got {v!r}")
    if configs is not None and (not isinstance(configs, dict)
                                or not all(isinstance(k, str) for k in configs)):
        raise errors.ConfigError("configs must be a dict of Spark setting names to values")
    with _lock:
        ray = _ensure_ray()
        running = active_session()
        if running is not None:
            return running
        try:
            import raydp
        except ImportError:
            raise errors.ConfigError("Spark needs the spark extra: pip install 'raymx[spark]' "
                                     "(RayDP and PySpark; Java 17 too)") from None
        # Spark's Python workers (UDFs, Ray Dataset -> Spark) must run this
        # interpreter, the one that has pyspark and raymx
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        conf = _defaults(num_executors, executor_cores)
        for k, v in (configs or {}).items():
            conf[k] = str(v)
        flags = " ".join(JAVA17_FLAGS)
        for k in _JAVA_OPTION_KEYS:
            extra = (configs or {}).get(k)
            conf[k] = flags if not extra else f"{flags} {extra}"
        log.info("starting Spark (%d x %d cores, %s) on Ray %s", num_executors, executor_cores,
                 executor_memory, ray.get_runtime_context().gcs_address)
        _session = raydp.init_spark(app_name, num_executors, executor_cores, executor_memory,
                                    configs=conf)
        return _session


def stop_spark() -> None:
    """Stop the Spark session started through RayDP (executors, app master, JVM).

    Safe to call when nothing runs. Ray and the replica sets keep running.
    """
    global _session
    with _lock:
        import raydp
        try:
            raydp.stop_spark()
        finally:
            _session = None


def parse_schema(spark, schema):
    """A Spark ``StructType`` from a StructType or a DDL string ("a long, b string")."""
    from pyspark.sql.types import StructType
    if isinstance(schema, StructType):
        return schema
    if isinstance(schema, str):
        from pyspark.sql.types import _parse_datatype_string
        t = _parse_datatype_string(schema)
        if not isinstance(t, StructType):
            from raymx import errors
            raise errors.InvalidInput(f"schema {schema!r} is not a struct of fields")
        return t
    from raymx import errors
    raise errors.InvalidInput(f"schema must be a Spark StructType or a DDL string, "
                              f"got {type(schema).__name__}")


def arrow_schema(schema):
    """The Arrow schema for a Spark StructType (what read tasks must produce)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    return to_arrow_schema(schema)


def spark_schema(schema):
    """The Spark StructType for an Arrow schema."""
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StructField, StructType
    return StructType([StructField(f.name, from_arrow_type(f.type), nullable=f.nullable)
                       for f in schema])


def dataframe_from_blocks(spark, blocks: list, schema):
    """A Spark DataFrame over Arrow blocks in Ray's object store (``blocks``:
    ObjectRefs of ``pyarrow.Table``s in ``schema``).

    RayDP's ``Dataset.to_spark`` goes through pandas, which turns an int64
    column with nulls into float64 (integers above 2**53 silently change) and
    costs a copy; this hands the Arrow batches to Spark as they are
    (``mapInArrow``), keeping RayDP's trick for locality and ownership: the
    refs are parked in the Spark master actor, and each Spark task fetches its
    blocks from Ray.
    """
    import uuid

    import ray
    from pyspark.sql import DataFrame
    from raydp.spark.dataset import get_locations
    from raydp.spark.ray_cluster_master import RAYDP_SPARK_MASTER_SUFFIX
    st = spark_schema(schema)
    if not blocks:
        return spark.createDataFrame([], st)
    holder_name = spark.sparkContext.appName + RAYDP_SPARK_MASTER_SUFFIX
    holder = ray.get_actor(holder_name)
    df_id = uuid.uuid4()
    ray.get(holder.add_objects.remote(df_id, blocks))
    jvm = spark.sparkContext._jvm
    jdf = jvm.org.apache.spark.sql.raydp.ObjectStoreReader.createRayObjectRefDF(
        spark._jsparkSession, get_locations(blocks))
    address = ray.get(holder.get_ray_address.remote())
    namespace = ray.get_runtime_context().namespace

    def fetch(batches):
        # runs in Spark's Python workers: they join the Ray cluster as drivers
        import ray as _ray
        if not _ray.is_initialized():
            _ray.init(address=address, namespace=namespace, logging_level=logging.WARN,
                      log_to_driver=False)
        h = _ray.get_actor(holder_name)
        for b in batches:
            for idx in b.column("idx").to_pylist():
                table = _ray.get(_ray.get(h.get_object.remote(df_id, idx)))
                yield from table.to_batches()

    return DataFrame(jdf, spark).mapInArrow(fetch, st)


def dataset_from_spark(df):
    """``(ray.data.Dataset, release)``: the DataFrame's rows as Arrow blocks in
    Ray (RayDP's recoverable conversion: Spark caches the Arrow batches and Ray
    tasks fetch them); call ``release()`` once the dataset is consumed."""
    import ray
    from raydp.spark.dataset import release_spark_recoverable
    return ray.data.from_spark(df), lambda: release_spark_recoverable(df)
