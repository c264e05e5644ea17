import os

import pytest

# Import hypothesis's lazily loaded modules now, before any test starts
# threads: CPython 3.11.7 can fail pytest's import-time AST rewriting with
# "AST constructor recursion depth mismatch" when that happens while other
# threads run (seen here).
import hypothesis.internal.conjecture.providers  # noqa: F401,E402
from hypothesis import settings  # noqa: E402

# no per-example time limit: the suite shares two cores with Ray's processes,
# and an example that took 485 ms against the default 200 failed a CI run.
# Speed is the benchmarks' business, never a test's.
settings.register_profile("raymx", deadline=None)
settings.load_profile("raymx")

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@pytest.fixture(params=["lmdb", "memory"])
def store(request, tmp_path):
    """Each contract test runs against both stores."""
    from raymx.storage.lmdb_store import LMDBStore
    from raymx.storage.store import MemoryStore
    s = LMDBStore(str(tmp_path / "db"), map_bytes=1 << 30) if request.param == "lmdb" \
        else MemoryStore()
    yield s
    s.close()


@pytest.fixture
def engine(store):
    from raymx.storage.engine import Engine
    return Engine(store)


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance for the whole session (never a stray cluster)."""
    import ray
    ray.init(address="local", num_cpus=2, include_dashboard=False,
             object_store_memory=200 * 1024**2, log_to_driver=False,
             # metrics reach the node's Prometheus endpoint within a second
             _system_config={"metrics_report_interval_ms": 1000})
    yield ray
    ray.shutdown()


_RS_COUNTER = [0]


@pytest.fixture
def replset(ray_session, tmp_path):
    """A fresh single-member replica set per test, shut down afterwards."""
    import raymx
    _RS_COUNTER[0] += 1
    rs = raymx.ReplicaSet.launch(f"t{_RS_COUNTER[0]}", members=1, data_dir=str(tmp_path / "rs"))
    yield rs
    rs.shutdown()


@pytest.fixture(scope="session")
def spark(ray_session):
    """One Spark (through RayDP, on the session's Ray) for the whole test session.

    Starting it costs ~20-30 s here, so it is started once, on first use, and
    stopped at the end of the session (before Ray shuts down).
    """
    from raymx.spark_bridge import spark_session, stop_spark
    s = spark_session(app_name="raymx-tests")
    yield s
    stop_spark()
