"""A seeded random workload on an Engine (primary): inserts, updates, deletes,
multi-document transactions and commands. Shared by the replay and snapshot tests."""
from __future__ import annotations

import random

from raymx import errors
from raymx.actors.core import replication as rep
from raymx.storage.engine import Engine
from raymx.storage.limits import Limits

NSS = ("db.a", "db.b", "db.c")


def _statement(tx, rnd: random.Random, nss) -> None:
    ns = rnd.choice(nss)
    r = rnd.random()
    k = rnd.randrange(40)
    if r < 0.30:
        docs = [{"_id": rnd.randrange(40), "v": rnd.randrange(10), "g": rnd.randrange(4),
                 "tags": [rnd.randrange(3) for _ in range(rnd.randrange(3))],
                 "nested": {"x": rnd.random(), "s": "y" * rnd.randrange(20)}}
                for _ in range(rnd.randrange(1, 4))]
        tx.insert(ns, docs)
    elif r < 0.50:
        tx.update(ns, {"_id": k}, {"$set": {"v": rnd.randrange(10)}, "$inc": {"n": 1}},
                  upsert=rnd.random() < 0.3)
    elif r < 0.60:
        tx.update(ns, {"g": rnd.randrange(4)}, {"$inc": {"v": 1}}, multi=True)
    elif r < 0.68:
        tx.update(ns, {"_id": k}, {"_id": k, "replaced": True, "v": rnd.randrange(10)},
                  replace=True, upsert=True)
    elif r < 0.82:
        tx.delete(ns, {"_id": k})
    else:
        tx.delete(ns, {"v": rnd.randrange(10)}, multi=rnd.random() < 0.5)


def _command(tx, rnd: random.Random, nss) -> None:
    ns = rnd.choice(nss)
    r = rnd.random()
    if r < 0.4:
        tx.create_index(ns, rnd.choice(["v", "g", "tags", [("g", 1), ("v", -1)]]))
    elif r < 0.6:
        c = tx.coll(ns)
        names = [n for n in (c.indexes if c else {}) if n != "_id_"]
        if names:
            tx.drop_index(ns, rnd.choice(sorted(names)))
        else:
            tx.create_collection(ns)
    elif r < 0.8:
        tx.create_collection(rnd.choice(nss + ("db.extra",)))
    else:
        tx.drop_collection(ns)


def run(e: Engine, seed: int, entries: int, command_p: float = 0.03, txn_p: float = 0.15,
        nss=NSS) -> int:
    """Commit about ``entries`` entries on ``e``; returns how many committed."""
    rnd = random.Random(seed)
    n = 0
    for _ in range(entries):
        tx = e.begin()
        try:
            if rnd.random() < command_p:
                _command(tx, rnd, nss)
            else:
                for _ in range(rnd.randrange(2, 5) if rnd.random() < txn_p else 1):
                    try:
                        _statement(tx, rnd, nss)
                    except errors.DuplicateKey:
                        pass  # the statement is undone alone (a savepoint)
            if tx.commit() is not None:
                n += 1
        except errors.RaymxError:
            tx.abort()
    return n


def ship(primary: Engine, secondary: Engine, limits: Limits = Limits()) -> None:
    """Copy the primary's oplog after the secondary's end, unapplied, as a producer does."""
    f = rep.FeederCore(primary, limits)
    f.advance(primary.last()[0])
    while True:
        last, h = secondary.last()
        out = f.pull(list(last), h if last.seq else None, 10**9, 1 << 40)
        assert out["status"] == "ok", out
        if not out["rows"]:
            return
        rep.write_batch(secondary, rep.check_batch(last, h, out["rows"], limits))


def state(e: Engine) -> dict:
    """Collections, indexes, catalog ids and counters: what must be identical."""
    with e.store.read() as t:
        catalog = list(t.scan("catalog"))
        meta = {k: t.get("meta", k) for k in (b"next_id",)}
        unapplied = [k for k, _ in t.scan("unapplied")]
    return {"state": e.snapshot_state(), "catalog": catalog, "meta": meta,
            "unapplied": unapplied}
