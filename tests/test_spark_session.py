"""Spark through RayDP on the test session's Ray (started once: the ``spark`` fixture)."""
import pytest

from raymx import errors


def test_spark_runs_on_ray_and_moves_data_both_ways(spark, ray_session):
    from raymx.spark_bridge import spark_session
    ray = ray_session
    assert spark_session() is spark  # reused, never a second Spark in one process
    df = spark.range(0, 1000).selectExpr("id", "id % 7 AS k", "CAST(id AS DECIMAL(20,1)) AS d")
    assert {r["k"]: r["n"] for r in df.groupBy("k").count().withColumnRenamed("count", "n")
            .collect()} == {k: len(range(k, 1000, 7)) for k in range(7)}
    # Spark -> Ray Data -> Spark: needs the Java 17 --add-opens flags (a decimal
    # column needs java.math), which users never pass themselves
    ds = ray.data.from_spark(df)
    assert ds.count() == 1000
    back = ds.to_spark(spark)
    assert back.selectExpr("sum(id) AS s").collect()[0]["s"] == sum(range(1000))


def test_spark_session_rejects_bad_settings(spark):
    from raymx.spark_bridge import spark_session
    with pytest.raises(errors.ConfigError, match="num_executors"):
        spark_session(num_executors=0)
    with pytest.raises(errors.ConfigError, match="configs"):
        spark_session(configs=["spark.x"])
