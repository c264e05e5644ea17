"""Point-in-time recovery by compensating entries (DESIGN section 9)."""
import random

import pytest

import raymx
from raymx import errors
from raymx.storage import codec
from raymx.storage.gtid import GTID, ZERO

from tests.test_replication import wait_until


def engine_workload(e, rnd, n, tag):
    """Random statements and multi-statement transactions straight on an engine."""
    for step in range(n):
        ns = rnd.choice(["db.a", "db.b"])
        try:
            with e.begin() as tx:
                for _ in range(rnd.choice([1, 1, 1, 3])):
                    random_statement(tx, rnd, ns, f"{tag}{step}")
        except errors.RaymxError:
            pass


def random_statement(tx, rnd, ns, tag):
    r = rnd.random()
    k = rnd.randrange(40)
    if r < 0.35:
        tx.insert(ns, [{"_id": k, "v": rnd.randrange(10), "tags": [tag, k % 3]}])
    elif r < 0.55:
        tx.update(ns, {"v": {"$lt": rnd.randrange(10)}}, {"$inc": {"n": 1}, "$set": {"t": tag}},
                  multi=True)
    elif r < 0.65:
        tx.update(ns, {"_id": k}, {"_id": k, "r": tag}, replace=True, upsert=True)
    elif r < 0.8:
        tx.delete(ns, {"v": rnd.randrange(10)}, multi=rnd.random() < 0.5)
    elif r < 0.88:
        tx.create_index(ns, rnd.choice(["v", "tags", [("v", 1), ("n", -1)]]))
    elif r < 0.93:
        c = tx.coll(ns)
        if c is not None and c.indexes:
            tx.drop_index(ns, rnd.choice(sorted(c.indexes)))
    else:
        tx.insert(f"db.new{tag}", [{"_id": 1}])


@pytest.mark.parametrize("seed", range(5))
def test_revert_returns_collections_and_indexes_exactly(engine, seed):
    rnd = random.Random(seed)
    engine.set_term(1)
    engine_workload(engine, rnd, 60, "a")
    target = engine.last()[0]
    want = engine.snapshot_state()
    engine_workload(engine, rnd, 80, "b")
    assert engine.snapshot_state() != want
    r = engine.reader()
    plan = r.revert_plan(target)
    r.t.abort()
    before = engine.last()[0]
    assert plan["entries"] == before.seq - target.seq and plan["newest"] == list(before)
    with engine.begin() as tx:
        assert tx.revert_to(target)["entries"] == plan["entries"]
    assert engine.snapshot_state() == want
    assert engine.last()[0] == GTID(1, before.seq + 1)  # one new entry, history kept
    assert engine.verify_oplog() == before.seq + 1
    # the revert itself is reversible: revert to just before it
    with engine.begin() as tx:
        tx.revert_to(before)
    assert engine.snapshot_state() != want


def test_revert_refuses_across_a_drop_and_below_the_first_entry(engine):
    engine.set_term(1)
    engine.insert_many("db.a", [{"_id": 1}])
    target = engine.last()[0]
    engine.insert_many("db.b", [{"_id": 1}])
    with engine.begin() as tx:
        tx.drop_collection("db.b")
    drop_at = engine.last()[0]
    engine.insert_many("db.a", [{"_id": 2}])
    tx = engine.begin()
    with pytest.raises(errors.IrreversibleOp) as ei:
        tx.revert_to(target)
    tx.abort()
    assert ei.value.info == {"gtid": list(drop_at), "op": "drop", "ns": "db.b"}
    assert str(drop_at) in str(ei.value)
    with engine.begin() as tx:
        tx.revert_to(drop_at)  # after the drop: fine
    assert engine.find("db.a") == [{"_id": 1}]
    engine.trim_oplog(None, 1, None, 2)
    tx = engine.begin()
    with pytest.raises(errors.OplogTrimmed) as ei:
        tx.revert_to(target)
    tx.abort()
    assert ei.value.info["oldest"] == list(GTID(1, 3))
    r = engine.reader()
    with pytest.raises(errors.InvalidOperation):
        r.revert_plan(GTID(1, 99))
    r.t.abort()


def test_revert_to_zero_undoes_everything(engine):
    engine.set_term(1)
    engine.insert_many("db.a", [{"_id": 1}])
    with engine.begin() as tx:
        tx.create_index("db.a", "x")
    with engine.begin() as tx:
        tx.revert_to(ZERO)
    assert engine.snapshot_state() == {}


def client_workload(c, rnd, n, tag):
    """The same kinds of statements through the driver, transactions included."""
    for step in range(n):
        ns = rnd.choice(["a", "b"])
        try:
            if rnd.random() < 0.2:
                with c.transaction() as tx:
                    for _ in range(3):
                        client_statement(tx["rv"], rnd, ns, f"{tag}{step}")
            else:
                client_statement(c["rv"], rnd, ns, f"{tag}{step}")
        except errors.RaymxError:
            pass


def client_statement(db, rnd, ns, tag):
    coll = db[ns]
    r = rnd.random()
    k = rnd.randrange(40)
    if r < 0.35:
        coll.insert_one({"_id": k, "v": rnd.randrange(10), "tags": [tag, k % 3]})
    elif r < 0.55:
        coll.update_many({"v": {"$lt": rnd.randrange(10)}}, {"$inc": {"n": 1}, "$set": {"t": tag}})
    elif r < 0.65:
        coll.replace_one({"_id": k}, {"_id": k, "r": tag}, upsert=True)
    elif r < 0.8:
        coll.delete_many({"v": rnd.randrange(10)})
    elif r < 0.88 and db._txn is None:
        coll.create_index(rnd.choice(["v", "tags", [("v", 1), ("n", -1)]]))
    elif r < 0.93 and db._txn is None:
        names = [i["name"] for i in coll.list_indexes() if i["name"] != "_id_"]
        if names:
            coll.drop_index(rnd.choice(names))
    else:
        db[f"new{tag}"].insert_one({"_id": 1})


def collections(ray, rs, i):
    return codec.unpack(ray.get(rs.member(i).state_digest.remote(), timeout=30)["collections"])


def test_revert_on_a_three_member_set_every_member_returns_to_the_target(ray_session, tmp_path):
    ray = ray_session
    rs = raymx.ReplicaSet.launch("rv3", members=3, data_dir=str(tmp_path))
    try:
        c = rs.client(w="majority", wtimeout_ms=20_000)
        rnd = random.Random(7)
        client_workload(c, rnd, 120, "a")
        target = c["rv"]["a"].insert_one({"_id": "mark"}).gtid
        want = collections(ray, rs, 0)
        client_workload(c, rnd, 150, "b")
        assert collections(ray, rs, 0) != want
        plan = rs.revert_to(target, dry_run=True)
        assert plan["entries"] > 50 and set(plan["namespaces"]) >= {"rv.a", "rv.b"}
        assert collections(ray, rs, 0) != want  # a dry run changes nothing
        out = rs.revert_to(target)
        assert out["entries"] == plan["entries"] and out["gtid"] is not None
        for i in range(3):
            wait_until(lambda: collections(ray, rs, i) == want, timeout_s=30)
        # the history stays: the compensating entry is one more GTID
        e = list(rs.oplog(after=out["gtid"]))
        assert e == []
        # a drop after the target: refused, naming the entry
        g = c["rv"]["gone"].insert_one({"_id": 1}).gtid
        c["rv"]["gone"].drop()
        with pytest.raises(errors.IrreversibleOp) as ei:
            rs.revert_to(g)
        assert ei.value.info["op"] == "drop" and ei.value.info["ns"] == "rv.gone"
        assert GTID(*ei.value.info["gtid"]) > g
    finally:
        rs.shutdown()
