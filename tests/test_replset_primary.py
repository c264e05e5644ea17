"""A single-member replica set: real Ray actors, real LMDB, the driver over TCP."""
import os
import time

import pytest

import raymx
from raymx import errors
from raymx.storage.gtid import GTID


def test_crud_through_the_driver(replset):
    c = replset.client()
    users = c["app"]["users"]
    r = users.insert_one({"name": "ann", "age": 31})
    assert isinstance(r.gtid, GTID) and r.gtid.term >= 1
    ids = users.insert_many([{"_id": i, "name": f"u{i}", "age": i % 40} for i in range(500)]).inserted_ids
    assert ids == list(range(500))
    assert users.create_index("age") == "age_1"
    assert users.count_documents({"age": {"$lt": 10}}) == 130
    assert users.find_one({"_id": 7}) == {"_id": 7, "name": "u7", "age": 7}
    u = users.update_many({"age": 5}, {"$inc": {"age": 100}})
    assert (u.matched_count, u.modified_count) == (13, 13) and u.gtid > r.gtid
    assert users.update_one({"_id": "new"}, {"$set": {"x": 1}}, upsert=True).upserted_id == "new"
    assert users.replace_one({"_id": "new"}, {"y": 2}).modified_count == 1
    assert users.find_one({"_id": "new"}) == {"_id": "new", "y": 2}
    assert users.replace_one({"_id": "new"}, {}).modified_count == 1  # as MongoDB: _id alone
    assert users.find_one({"_id": "new"}) == {"_id": "new"}
    assert users.delete_one({"_id": "new"}).deleted_count == 1
    assert users.delete_many({"age": {"$gte": 100}}).deleted_count == 13
    got = users.find({"age": {"$in": [1, 2]}}, projection={"name": 1}, sort=[("_id", -1)], limit=3)
    assert [d["_id"] for d in got] == [482, 481, 442]
    assert [i["name"] for i in users.list_indexes()] == ["_id_", "age_1"]
    users.drop_index("age_1")
    with pytest.raises(errors.IndexNotFound):
        users.drop_index("age_1")
    users.create_index([("age", 1), ("name", -1)])
    users.drop_index([("age", 1), ("name", -1)])  # by its key, as pymongo's
    assert [i["name"] for i in users.list_indexes()] == ["_id_"]
    with pytest.raises(errors.DuplicateKey):
        users.insert_one({"_id": 1})
    with pytest.raises(errors.InvalidDocument):
        users.insert_one({"_id": 2000, "bad": {1, 2}})
    assert c["app"].list_collection_names() == ["users"]
    c.close()


def test_the_native_driver_s_hint_chooses_the_plan(replset):
    """``find(hint=...)``, ``Cursor.hint`` and ``count_documents(hint=...)``
    as pymongo's: by name or key, the index's order; ``$natural`` backward;
    a key no index has is refused by the member."""
    co = replset.client()["hints"]["c"]
    co.insert_many([{"_id": i, "a": (3 * i) % 7} for i in range(7)])
    co.create_index([("a", -1)], name="a_desc")
    want = sorted(range(7), key=lambda i: (3 * i) % 7)  # the keys' stored (ascending) order
    assert [d["_id"] for d in co.find(hint="a_desc")] == want
    assert [d["_id"] for d in co.find().hint([("a", -1)])] == want
    assert [d["_id"] for d in co.find({"a": {"$lt": 3}}).hint({"a": -1})] == [0, 5, 3]
    assert [d["_id"] for d in co.find().hint([("$natural", -1)])] == list(range(6, -1, -1))
    assert co.count_documents({"a": {"$gte": 0}}, hint=[("a", -1)]) == 7
    with pytest.raises(errors.InvalidOperation, match="hint provided does not correspond"):
        list(co.find().hint([("a", 1)]))


def test_cursor_streams_large_results_in_batches(replset):
    coll = replset.client()["big"]["docs"]
    for k in range(5):
        coll.insert_many([{"_id": k * 2000 + i, "pad": "x" * 100} for i in range(2000)])
    seen = [d["_id"] for d in coll.find(batch_size=700)]
    assert seen == list(range(10_000))
    # an abandoned cursor is released
    it = iter(coll.find(batch_size=10))
    next(it)
    it.close()
    assert replset.status()["members"][0]["open_cursors"] == 0


def test_transactions_commit_under_one_gtid_or_leave_no_trace(replset):
    c = replset.client()
    acc = c["bank"]["acc"]
    acc.insert_many([{"_id": "a", "bal": 100}, {"_id": "b", "bal": 0}])
    with c.transaction() as tx:
        tx["bank"]["acc"].update_one({"_id": "a"}, {"$inc": {"bal": -40}})
        tx["bank"]["acc"].update_one({"_id": "b"}, {"$inc": {"bal": 40}})
        assert tx["bank"]["acc"].find_one({"_id": "b"})["bal"] == 40
    entry = [e for e in replset.oplog() if e.gtid == tx.gtid][0]
    assert [op["op"] for op in entry.ops] == ["u", "u"]
    with pytest.raises(KeyError):
        with c.transaction() as tx2:
            tx2["bank"]["acc"].update_one({"_id": "a"}, {"$inc": {"bal": -1000}})
            raise KeyError("application error")
    assert acc.find_one({"_id": "a"})["bal"] == 60
    assert list(replset.oplog())[-1].gtid == tx.gtid


def test_durable_writes_and_restart_recovers_under_a_new_term(ray_session, tmp_path):
    d = str(tmp_path / "rs")
    rs = raymx.ReplicaSet.launch("restart1", data_dir=d, secret="kept-across-relaunches")
    c = rs.client(j=True)
    g = c["a"]["b"].insert_many([{"_id": i} for i in range(100)]).gtid
    c["a"]["b"].insert_one({"_id": "last"}, j=False)
    st = rs.status()["members"][0]
    term1 = st["term"]
    uri = rs.mongodb_uri(driver="pymongo")
    ports = rs._topology()["members"][0]
    rs.shutdown()
    rs.shutdown()  # again: nothing to do
    t0 = time.monotonic()
    with pytest.raises(errors.ConfigError, match="shut down"):
        c["a"]["b"].count_documents({})  # a client of a stopped set is told at once
    assert time.monotonic() - t0 < 10
    with pytest.raises(errors.ConfigError):
        raymx.connect("restart1")
    rs = raymx.ReplicaSet.launch("restart1", data_dir=d)  # the stored secret
    try:
        c = rs.client()
        assert c["a"]["b"].count_documents({}) == 101
        r = c["a"]["b"].insert_one({"_id": "after"})
        assert r.gtid.term == term1 + 1 and r.gtid.seq == g.seq + 3  # seq continues
        # ("last", then the new primary's no-op)
        entries = list(rs.oplog())
        assert [e.gtid.seq for e in entries] == list(range(1, len(entries) + 1))
        assert raymx.connect("restart1").status()["members"][0]["term"] == term1 + 1
        # the member took its ports again: a connection string from before the
        # relaunch (pymongo's, mongosh's; the secret the relaunch took from the
        # folder) still reaches it
        again = rs._topology()["members"][0]
        assert (again["port"], again["wire"]) == (ports["port"], ports["wire"])
        assert rs.mongodb_uri(driver="pymongo") == uri
        import pymongo
        pm = pymongo.MongoClient(uri, serverSelectionTimeoutMS=20_000)
        assert pm["a"]["b"].count_documents({}) == 102
        pm.close()
    finally:
        rs.shutdown()


def test_the_secret_is_kept_in_the_data_folder_for_relaunches(tmp_path):
    from raymx.replset import SECRET_FILE, _kept_secret
    d = str(tmp_path)
    first = _kept_secret(d, None)
    assert len(first) >= 32 and _kept_secret(d, None) == first
    assert os.stat(os.path.join(d, SECRET_FILE)).st_mode & 0o777 == 0o600
    assert _kept_secret(d, "rotated") == "rotated" and _kept_secret(d, None) == "rotated"
    for bad in ("", 5):
        with pytest.raises(errors.ConfigError, match="secret"):
            _kept_secret(d, bad)
    assert _kept_secret(d, None) == "rotated"


def test_launch_refuses_a_running_name_and_bad_specs(replset):
    with pytest.raises(errors.ConfigError):
        raymx.ReplicaSet.launch(replset.name)
    with pytest.raises(errors.ConfigError):
        raymx.ReplicaSet.launch("bad name!")


def test_a_relaunch_places_members_on_this_clusters_nodes(ray_session, tmp_path):
    """The members keep the set's configuration, node ids included; a relaunch
    on a new Ray cluster (a new session: ``./dev demo`` run twice) must not
    take node ids of the old one, or restarting a member is unschedulable.
    A stale node id is planted in the stored configuration here."""
    ray = ray_session
    rs = raymx.ReplicaSet.launch("relaunch", members=1, data_dir=str(tmp_path))
    try:
        rs.client()["a"]["b"].insert_one({"_id": 1}, w=1, j=True)
        cfg = rs.config()
        cfg = {"version": cfg["version"] + 1, "oplog_cap": cfg.get("oplog_cap"),
               "members": [dict(m, node_id="ab" * 28) for m in cfg["members"]]}
        ray.get(rs.member(0).set_config.remote(cfg))
        assert ray.get(rs.member(0).get_config.remote())["members"][0]["node_id"] == "ab" * 28
    finally:
        rs.shutdown()
    rs = raymx.ReplicaSet.launch("relaunch", members=1, data_dir=str(tmp_path))
    try:
        here = ray.get_runtime_context().get_node_id()
        # the stored (newest) configuration is the set's, on this launch's nodes
        assert rs.config()["version"] == cfg["version"]
        assert [m["node_id"] for m in rs.config()["members"]] == [here]
        rs.kill_member(0)
        rs.start_member(0)  # unschedulable on the stale node before
        rs.wait_for_primary(30)
        assert rs.client()["a"]["b"].find_one({"_id": 1}) == {"_id": 1}
    finally:
        rs.shutdown()


def test_gtid_manager_actor(ray_session):
    from raymx.actors.applier import GTIDManagerActor
    ray = ray_session
    m = GTIDManagerActor.remote(3, 10)
    a, b, c = ray.get([m.allocate.remote() for _ in range(3)])
    ray.get(m.done.remote(c))
    assert ray.get(m.min_live.remote()) == a
    rec = ray.get(m.before_sync.remote())
    ray.get(m.done.remote(a))
    assert ray.get(m.after_sync.remote(rec)) == a  # published what was recorded before the flush
    ray.kill(m)
