"""``replace_many``: replace (or ``$set`` into) documents by ``_id`` in one
statement, the path of Spark's ``upsert`` and ``update`` writes. The engine on
both stores, then a real three-member replica set through the client."""
import copy
import re

import pytest

from raymx import errors
from raymx.storage import codec
from raymx.storage.engine import Engine
from raymx.storage.store import MemoryStore

NS = "db.r"


def run(e, fn):
    """(result, GTID) of ``fn(tx)`` as one statement."""
    res, g = e.run(fn)
    return res, g


def ops_of(e, g):
    return [op for gg, ent in e.read_oplog() if gg == g for op in ent["ops"]]


def test_rows_replace_their_documents_or_are_upserted_logged_as_u_and_i(engine):
    engine.insert_many(NS, [{"_id": i, "v": -i, "old": True} for i in range(4)])
    rows = [{"_id": 1, "v": 10}, {"_id": 7, "v": 70}, {"_id": 3, "v": -3, "old": True},
            {"_id": 2, "v": 20}]
    res, g = run(engine, lambda tx: tx.replace_many(NS, rows, upsert=True))
    assert (res.matched, res.modified, res.inserted_ids) == (3, 2, [7])
    assert engine.find(NS) == [{"_id": 0, "v": 0, "old": True}, {"_id": 1, "v": 10},
                               {"_id": 2, "v": 20}, {"_id": 3, "v": -3, "old": True},
                               {"_id": 7, "v": 70}]
    # one entry, the ops of replace_one and insert in row order (the unchanged row: none)
    assert [(op["op"], op.get("pre"), op["post"]) for op in ops_of(engine, g)] == [
        ("u", {"_id": 1, "v": -1, "old": True}, {"_id": 1, "v": 10}),
        ("i", None, {"_id": 7, "v": 70}),
        ("u", {"_id": 2, "v": -2, "old": True}, {"_id": 2, "v": 20})]
    # the u op is packed from the stored bytes as pack_image_op packs it
    a, b = codec.update_op_parts(NS)
    assert a + b"PRE" + b + b"POST" == codec.pack_image_op("u", NS, b"PRE", b"POST")
    # without upsert a row with no document is skipped
    res, _ = run(engine, lambda tx: tx.replace_many(NS, [{"_id": 9, "v": 9}, {"_id": 0}]))
    assert (res.matched, res.modified, res.inserted_ids) == (1, 1, [])
    assert engine.find(NS, {"_id": {"$in": [0, 9]}}) == [{"_id": 0}]


def test_merge_sets_the_rows_fields_and_keeps_the_others(engine):
    engine.insert_many(NS, [{"_id": f"k{i}", "a": i, "b": "keep"} for i in range(3)])
    rows = [{"_id": "k0", "a": 100, "c": [1, 2]}, {"_id": "zz", "a": 5}, {"_id": "k2", "a": 2}]
    res, g = run(engine, lambda tx: tx.replace_many(NS, rows, merge=True))
    assert (res.matched, res.modified, res.inserted_ids) == (2, 1, [])
    assert engine.find(NS) == [{"_id": "k0", "a": 100, "b": "keep", "c": [1, 2]},
                               {"_id": "k1", "a": 1, "b": "keep"},
                               {"_id": "k2", "a": 2, "b": "keep"}]
    assert [op["op"] for op in ops_of(engine, g)] == ["u"]
    # merge with upsert inserts the row as it is
    res, _ = run(engine, lambda tx: tx.replace_many(NS, rows[1:2], upsert=True, merge=True))
    assert res.inserted_ids == ["zz"] and engine.find(NS, {"_id": "zz"}) == [{"_id": "zz", "a": 5}]
    # into a collection that does not exist: nothing matched, nothing created
    res, g = run(engine, lambda tx: tx.replace_many("db.none", rows, merge=True))
    assert res.matched == 0 and g is None and "db.none" not in engine.snapshot_state()


def test_the_same_batch_again_changes_nothing_and_logs_nothing(engine):
    rows = [{"_id": i, "v": i, "s": "x" * i} for i in range(300)]
    _, g1 = run(engine, lambda tx: tx.replace_many(NS, rows, upsert=True))
    for merge in (False, True):
        state, last = engine.snapshot_state(), engine.last()[0]
        res, g2 = run(engine, lambda tx: tx.replace_many(NS, rows, upsert=True, merge=merge))
        assert g2 is None and engine.last()[0] == last and engine.snapshot_state() == state
        assert (res.matched, res.modified, res.inserted_ids) == (300, 0, [])
    assert g1 is not None


def test_rows_repeating_an_id_apply_in_their_order(engine):
    engine.insert_many(NS, [{"_id": 1, "a": 0, "b": 0}])
    rows = [{"_id": 1, "a": 1}, {"_id": 2, "a": 2}, {"_id": 1, "b": 5}, {"_id": 1, "c": 6}]
    res, g = run(engine, lambda tx: tx.replace_many(NS, rows, upsert=True, merge=True))
    assert engine.find(NS) == [{"_id": 1, "a": 1, "b": 5, "c": 6}, {"_id": 2, "a": 2}]
    assert (res.matched, res.modified, res.inserted_ids) == (3, 3, [2])
    run(engine, lambda tx: tx.replace_many(NS, rows, upsert=True))
    assert engine.find(NS) == [{"_id": 1, "c": 6}, {"_id": 2, "a": 2}]


def test_indexes_follow_the_replaced_fields_and_a_unique_violation_writes_nothing(engine):
    engine.insert_many(NS, [{"_id": i, "u": i, "t": [f"t{i}"], "n": i % 2} for i in range(6)])
    with engine.begin() as tx:
        tx.create_index(NS, "u", unique=True)
        tx.create_index(NS, "t")  # multikey
        tx.create_index(NS, "n")  # plain
    # rows 0 and 1 swap their unique values in one batch; 2 moves to a new one
    rows = [{"_id": 0, "u": 1, "t": ["a", "b"], "n": 5}, {"_id": 1, "u": 0, "n": 5},
            {"_id": 2, "u": 20, "t": ["a"]}, {"_id": 10, "u": 10, "n": 5}]
    run(engine, lambda tx: tx.replace_many(NS, rows, upsert=True))
    assert [d["_id"] for d in engine.find(NS, {"u": {"$gte": 0}}, sort=[("u", 1)])] == [
        1, 0, 3, 4, 5, 10, 2]
    assert [d["_id"] for d in engine.find(NS, {"t": "a"})] == [0, 2]
    assert engine.find(NS, {"t": "t0"}) == [] and engine.find(NS, {"u": 2}) == []
    assert [d["_id"] for d in engine.find(NS, {"n": 5})] == [0, 1, 10]
    # every index entry is the one a fresh build over the documents makes
    fresh = Engine(MemoryStore())
    fresh.insert_many(NS, engine.find(NS))
    with fresh.begin() as tx:
        tx.create_index(NS, "u", unique=True)
        tx.create_index(NS, "t")
        tx.create_index(NS, "n")
    assert fresh.snapshot_state()[NS]["indexes"] == engine.snapshot_state()[NS]["indexes"]
    before, last = engine.snapshot_state(), engine.last()[0]
    for bad, merge in (([{"_id": 3, "u": 30}, {"_id": 4, "u": 5}], False),  # held outside
                       ([{"_id": 3, "u": 31}, {"_id": 77, "u": 31}], False),  # by two rows
                       ([{"_id": 3, "u": 32}, {"_id": 4, "u": 5}], True)):
        with pytest.raises(errors.DuplicateKey, match="unique index u_1") as ei:
            run(engine, lambda tx: tx.replace_many(NS, bad, upsert=True, merge=merge))
        assert ei.value.info["index"] == "u_1"
        assert engine.snapshot_state() == before and engine.last()[0] == last


def test_a_row_without_id_or_that_is_no_document_is_refused_before_anything_is_written(engine):
    engine.insert_many(NS, [{"_id": 1, "v": 1}])
    before = engine.snapshot_state()
    for rows, msg in (([{"_id": 1, "v": 2}, {"v": 3}], "document 1 of the batch has no _id"),
                      ([{"_id": None, "v": 3}], "document 0 of the batch has no _id"),
                      ([{"_id": 1}, "x"], "list of documents"),
                      ({"_id": 1}, "list of documents"),
                      ([{"_id": [1, 2]}], "_id cannot be an array"),
                      ([{"_id": re.compile("x")}], "_id cannot be a regular expression"),
                      ([{"_id": 1, "$set": {"v": 1}}], r"\$")):
        for merge in (False, True):
            with pytest.raises(errors.InvalidDocument, match=msg):
                run(engine, lambda tx: tx.replace_many(NS, rows, upsert=True, merge=merge))
            assert engine.snapshot_state() == before


def test_its_oplog_entries_replay_on_another_store_and_undo_exactly(engine):
    src, dst = engine, Engine(MemoryStore())
    src.insert_many(NS, [{"_id": i, "u": i, "tags": ["x"]} for i in range(50)])
    with src.begin() as tx:
        tx.create_index(NS, "u", unique=True)
        tx.create_index(NS, "tags")
    for _, e in src.read_oplog():
        dst.apply_entry(e["ops"])
    snap = copy.deepcopy(dst.snapshot_state())
    rows = [{"_id": i, "u": 1000 + i, "tags": ["y", str(i)]} for i in range(0, 80, 3)]
    _, g = run(src, lambda tx: tx.replace_many(NS, rows, upsert=True))
    _, g2 = run(src, lambda tx: tx.replace_many(
        NS, [{"_id": i, "tags": []} for i in range(0, 90, 7)], merge=True))
    for gg in (g, g2):
        (_, e), = [x for x in src.read_oplog() if x[0] == gg]
        dst.apply_entry(e["ops"])
    assert dst.snapshot_state() == src.snapshot_state()
    for gg in (g2, g):
        (_, e), = [x for x in src.read_oplog() if x[0] == gg]
        dst.undo_entry(e["ops"])
    assert dst.snapshot_state() == snap


# --- a real replica set, through the client ----------------------------------------------
def test_replace_many_on_a_three_member_set_replicates_documents_and_indexes(
        ray_session, tmp_path):
    import raymx
    from tests.test_replication import converged, wait_until
    rs = raymx.ReplicaSet.launch("rmany", members=3, data_dir=str(tmp_path / "rs"))
    try:
        c = rs.client(w="majority")
        coll = c["app"]["docs"]
        coll.insert_many([{"_id": i, "email": f"{i}@old", "n": i, "keep": i} for i in range(600)])
        coll.create_index("email", unique=True)
        coll.create_index("n")
        # more than one part on the wire (INSERT_PART_DOCS), one statement, one GTID
        rows = [{"_id": i, "email": f"{i}@new", "n": -i} for i in range(0, 900, 2)]
        r = coll.replace_many(rows, upsert=True)
        assert (r.matched_count, r.modified_count) == (300, 300)
        assert r.upserted_ids == list(range(600, 900, 2)) and r.gtid is not None
        again = coll.replace_many(rows, upsert=True, w=1)
        assert (again.matched_count, again.modified_count, again.upserted_ids,
                again.gtid) == (450, 0, [], None)
        m = coll.replace_many([{"_id": i, "n": 7} for i in range(0, 1000, 3)], merge=True)
        assert m.matched_count == len([i for i in range(0, 1000, 3) if i < 600 or (i < 900 and i % 2 == 0)])
        assert coll.find_one({"_id": 3}) == {"_id": 3, "email": "3@old", "n": 7, "keep": 3}
        assert coll.find_one({"_id": 6}) == {"_id": 6, "email": "6@new", "n": 7}
        assert coll.find_one({"email": "4@old"}) is None
        assert coll.find_one({"email": "4@new"})["_id"] == 4
        # refused whole: a unique value another document holds, a row without _id
        with pytest.raises(errors.DuplicateKey, match="email_1"):
            coll.replace_many([{"_id": 1, "email": "zz"}, {"_id": 5, "email": "3@old"}])
        with pytest.raises(errors.InvalidDocument, match="no _id"):
            coll.replace_many([{"_id": 1, "email": "zz"}, {"email": "yy"}], upsert=True)
        assert coll.count_documents({"email": "zz"}) == 0
        assert coll.find_one({"_id": 1})["email"] == "1@old"
        # the secondaries end with the same documents, indexes and oplog
        ds = wait_until(lambda: converged(ray_session, rs, [0, 1, 2]))
        st = codec.unpack(ds[0]["collections"])["app.docs"]
        assert len(st["docs"]) == 750 and set(st["indexes"]) == {"email_1", "n_1"}
        assert len(st["indexes"]["email_1"][1]) == 750
        c.close()
    finally:
        rs.shutdown()


def test_replace_many_inside_a_client_transaction(replset):
    c = replset.client()
    coll = c["app"]["t"]
    coll.insert_many([{"_id": i, "v": 0} for i in range(10)])
    with c.transaction() as tx:
        t = tx.collection("app.t")
        r = t.replace_many([{"_id": i, "v": 1} for i in range(5, 15)], upsert=True)
        t.insert_many([{"_id": 100}])
    assert (r.matched_count, r.modified_count, len(r.upserted_ids)) == (5, 5, 5)
    assert tx.gtid is not None and coll.count_documents({"v": 1}) == 10
    c.close()
