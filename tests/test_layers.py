"""Layering: raymx.storage is the bottom layer and imports nothing above it.

Every module under raymx/storage is read with ``ast`` (not imported), so an
import inside a function or an ``if TYPE_CHECKING:`` block counts too. The
errors all layers raise live in ``raymx.storage.errors``; ``raymx.errors``
re-exports them as the same objects.
"""
from __future__ import annotations

import ast
import pathlib
import pickle

import pytest

import raymx
import raymx.errors
import raymx.storage.errors

STORAGE = pathlib.Path(raymx.__file__).parent / "storage"


def _imported_modules(src: str, module: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``src``, the source of
    ``module``: ``from a import b`` names ``a.b`` (b may be a module), relative
    imports are resolved, and ``importlib.import_module("...")`` and
    ``__import__("...")`` with a literal name count too."""
    package = module.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - (node.level - 1)])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module
            out.append((node.lineno, base))
            out += [(node.lineno, f"{base}.{a.name}") for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                out.append((node.lineno, node.args[0].value))
    return out


def _outside_storage(name: str) -> bool:
    return (name == "raymx" or name.startswith("raymx.")) and not (
        name == "raymx.storage" or name.startswith("raymx.storage."))


def _violations(src: str, module: str) -> list[str]:
    return [f"{module}:{line} imports {name}" for line, name in _imported_modules(src, module)
            if _outside_storage(name)]


@pytest.mark.parametrize("src, bad", [
    ("from raymx import errors", True),
    ("from raymx.errors import InvalidDocument", True),
    ("import raymx.errors", True),
    ("import raymx", True),
    ("def f():\n    from raymx.actors import shard", True),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from raymx.client import X", True),
    ("from .. import errors", True),
    ("from ..replset import ReplicaSet", True),
    ("import importlib\nimportlib.import_module('raymx.replset')", True),
    ("from raymx.storage import errors", False),
    ("from raymx.storage.errors import InvalidDocument", False),
    ("from . import codec", False),
    ("from .gtid import GTID", False),
    ("import raymx.storage.codec", False),
    ("import lmdb\nimport msgpack", False),
])
def test_the_checker_tells_an_import_from_above(src, bad):
    assert bool(_violations(src, "raymx.storage.some_module")) is bad


def test_storage_imports_nothing_from_the_package_above_it():
    files = sorted(STORAGE.rglob("*.py"))
    assert {"engine.py", "errors.py", "codec.py"} <= {f.name for f in files}
    bad = []
    for f in files:
        # raymx.storage.x; an __init__ keeps its suffix, so that relative
        # imports in it resolve against its own package
        module = ".".join(f.relative_to(STORAGE.parent.parent).with_suffix("").parts)
        bad += _violations(f.read_text(), module)
    assert not bad, "raymx.storage must import only from raymx.storage:\n" + "\n".join(bad)


def test_raymx_errors_reexports_the_storage_errors():
    low, high = raymx.storage.errors, raymx.errors
    classes = {n for n, v in vars(low).items()
               if isinstance(v, type) and issubclass(v, low.RaymxError)}
    assert classes and "RaymxError" in classes and "OplogTrimmed" in classes
    assert set(low.__all__) == classes | {"from_wire"}  # every public name, nothing else
    assert list(high.__all__) == list(low.__all__)
    for n in low.__all__:
        assert getattr(high, n) is getattr(low, n), n
    assert raymx.errors is high and raymx.errors.__all__ == high.__all__


def test_errors_pickle_and_travel_as_the_same_class():
    e = raymx.errors.OplogTrimmed("trimmed", oldest=[1, 5])
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(e, proto))
        assert type(back) is raymx.storage.errors.OplogTrimmed
        assert (back.msg, back.info, str(back)) == ("trimmed", {"oldest": [1, 5]}, "trimmed")
    # a pickle that names the class by its public module (as every pickle
    # made before the classes moved does) loads the same class
    assert pickle.loads(b"craymx.errors\nDuplicateKey\n.") is raymx.storage.errors.DuplicateKey
    back = raymx.errors.from_wire(raymx.storage.errors.NotPrimary("no", term=3).to_wire())
    assert type(back) is raymx.errors.NotPrimary and back.info == {"term": 3}
    assert type(raymx.errors.from_wire({"err": "Nope", "msg": "x"})) is raymx.errors.RaymxError


def test_engine_still_exports_what_its_importers_use():
    """engine.py was split into catalog, reader, transaction and engine; the
    names code outside raymx.storage imports from raymx.storage.engine stay
    there, as the same objects as in their new modules."""
    from raymx.storage import catalog, engine, reader, transaction
    used = {"Engine", "Reader", "Transaction", "WriteResult", "split_ns", "RANGE_KEY",
            "RangeRecord", "entry_chunks", "_applied_in", "Stats"}
    assert used <= set(engine.__all__)
    for n in engine.__all__:
        homes = [m for m in (catalog, reader, transaction, engine) if n in vars(m)]
        assert homes and all(vars(m)[n] is getattr(engine, n) for m in homes), n


def test_client_still_exports_what_its_importers_use():
    """raymx/client.py became the package raymx.client; every name it had
    (bar the private ones) is still importable from raymx.client, as the same
    object as in its new module, and raymx's lazy names come from there."""
    import raymx.client as client
    from raymx.client import (bulk, change_stream, collection, connection, cursor, options,
                              results, url)
    from raymx.client import client as client_module
    used = {"Client", "ClientTransaction", "Database", "Collection", "Cursor", "ChangeStream",
            "Connection", "connect_member", "parse_url", "URLTopology", "connect_url",
            "WriteConcern", "ReadPreference", "ReadConcern", "InsertOneResult",
            "InsertManyResult", "UpdateResult", "DeleteResult", "INSERT_PART_DOCS",
            "INSERT_PART_BYTES"}
    # pymongo's habits (issue 26): bulk_write's requests, its result, ReturnDocument
    used |= {"BulkWriteResult", "ReturnDocument", "InsertOne", "UpdateOne", "UpdateMany",
             "ReplaceOne", "DeleteOne", "DeleteMany"}
    used |= {"ReplaceManyResult"}  # Collection.replace_many (Spark's upsert and update)
    assert used == set(client.__all__)
    homes = (bulk, change_stream, client_module, collection, connection, cursor, options,
             results, url)
    for n in client.__all__:
        found = [m for m in homes if n in vars(m)]
        assert found and all(vars(m)[n] is getattr(client, n) for m in found), n
    for n in ("WriteConcern", "ReadPreference", "ReadConcern", "connect_url", "ReturnDocument",
              "InsertOne", "UpdateOne", "UpdateMany", "ReplaceOne", "DeleteOne", "DeleteMany"):
        assert getattr(raymx, n) is getattr(client, n), n
