import os

import pytest

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
