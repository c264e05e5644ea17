"""The document engine over both stores: collections, indexes, queries, updates,
atomic statements and transactions, the oplog, apply and undo."""
import copy
import enum

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from raymx import errors
from raymx.storage import codec
from raymx.storage.engine import Engine, Stats
from raymx.storage.gtid import GTID
from raymx.storage.limits import Limits
from raymx.storage.store import MemoryStore

NS = "app.users"


def state(e):
    return e.snapshot_state()


def test_insert_generates_time_ordered_ids_and_find_by_id(engine):
    r = engine.insert_many(NS, [{"name": "a"}, {"name": "b"}, {"_id": 7, "name": "c"}])
    assert r.gtid == GTID(0, 1)
    a, b, _ = r.inserted_ids
    assert isinstance(a, str) and len(a) == 24 and a < b
    st = Stats()
    rd = engine.reader()
    assert list(rd.find(NS, {"_id": 7}, stats=st)) == [{"_id": 7, "name": "c"}]
    assert st.plan == "IDHACK" and st.examined == 1


def test_update_many_is_one_gtid_with_all_ops(engine):
    engine.insert_many(NS, [{"_id": i, "n": 0} for i in range(100)])
    with engine.begin() as tx:
        r = tx.update(NS, {}, {"$inc": {"n": 1}}, multi=True)
    assert r.matched == 100 and r.modified == 100
    (g, e), = list(engine.read_oplog(after=GTID(0, 1)))
    assert g == GTID(0, 2) and len(e["ops"]) == 100
    assert all(op["op"] == "u" and op["pre"]["n"] == 0 and op["post"]["n"] == 1 for op in e["ops"])


def test_insert_many_with_duplicate_inserts_nothing(engine):
    engine.insert_many(NS, [{"_id": 3}])
    before = state(engine)
    with pytest.raises(errors.DuplicateKey):
        engine.insert_many(NS, [{"_id": 1}, {"_id": 2}, {"_id": 3}])
    assert state(engine) == before
    assert engine.last()[0] == GTID(0, 1)


def test_unique_index_violation_and_upsert(engine):
    with engine.begin() as tx:
        tx.create_index(NS, "email", unique=True)
    engine.insert_many(NS, [{"_id": 1, "email": "a@x"}])
    before = state(engine)
    with pytest.raises(errors.DuplicateKey):
        engine.insert_many(NS, [{"_id": 2, "email": "a@x"}])
    with pytest.raises(errors.DuplicateKey):
        with engine.begin() as tx:
            tx.insert(NS, [{"_id": 3, "email": "b@x"}])
            tx.update(NS, {"_id": 3}, {"$set": {"email": "a@x"}})
    assert state(engine) == before
    with engine.begin() as tx:
        r = tx.update(NS, {"email": "z@x"}, {"$set": {"n": 1}}, upsert=True)
    assert r.upserted_id is not None
    assert engine.find(NS, {"email": "z@x"})[0]["n"] == 1


def test_multi_statement_transaction_commits_atomically_or_leaves_no_trace(engine):
    engine.insert_many(NS, [{"_id": 1, "bal": 100}, {"_id": 2, "bal": 0}])
    with engine.begin() as tx:
        tx.update(NS, {"_id": 1}, {"$inc": {"bal": -30}})
        tx.update(NS, {"_id": 2}, {"$inc": {"bal": 30}})
        # reads inside see the transaction's own writes
        assert list(tx.find(NS, {"_id": 2}))[0]["bal"] == 30
    last = engine.last()[0]
    assert len(list(engine.read_oplog(after=GTID(0, 1)))[0][1]["ops"]) == 2
    before = state(engine)
    with pytest.raises(RuntimeError):
        with engine.begin() as tx:
            tx.update(NS, {"_id": 1}, {"$inc": {"bal": -30}})
            raise RuntimeError("application error")
    assert state(engine) == before and engine.last()[0] == last
    # a statement that fails inside a transaction rolls back alone
    with engine.begin() as tx:
        tx.insert(NS, [{"_id": 9}])
        with pytest.raises(errors.DuplicateKey):
            tx.insert(NS, [{"_id": 10}, {"_id": 9}])
    assert engine.count(NS, {"_id": {"$in": [9, 10]}}) == 1


def test_aborted_gtid_becomes_noop_so_seqs_stay_dense(engine):
    engine.insert_many(NS, [{"_id": 1}])
    g = engine.write_noop()
    assert g == GTID(0, 2)
    engine.insert_many(NS, [{"_id": 2}])
    ops = [e["ops"] for _, e in engine.read_oplog()]
    assert ops[1] == [{"op": "n"}]
    assert engine.verify_oplog() == 3


def test_new_term_continues_seq(engine):
    engine.insert_many(NS, [{"_id": 1}])
    engine.set_term(4)
    r = engine.insert_many(NS, [{"_id": 2}])
    assert r.gtid == GTID(4, 2)
    assert engine.range().terms == [[0, 1], [4, 2]]
    with pytest.raises(errors.StaleTerm):
        engine.set_term(3)


def test_large_transaction_spills_to_refs(store):
    e = Engine(store, Limits(spill_bytes=4096))
    docs = [{"_id": i, "pad": "x" * 200} for i in range(100)]
    r = e.insert_many(NS, docs)
    with store.read() as t:
        raw = codec.unpack(t.get("oplog", r.gtid.to_bytes()))
        assert "ref" in raw and raw["chunks"] >= 5 and "ops" not in raw
        assert len(list(t.scan("oplog.refs"))) == raw["chunks"]
    (g, ent), = list(e.read_oplog())
    assert [op["post"] for op in ent["ops"][1:]] == docs
    assert e.verify_oplog() == 1


def test_every_oplog_value_fits_one_lmdb_page_by_default(store):
    """A transaction's ops go to the oplog in values that each fit one 4 KiB
    LMDB page (4,080 bytes), whatever the transaction's size: LMDB finds a run
    of several free pages by scanning its free list, which made 1 MiB entries
    slow in a database that had freed many pages. One op larger than that is
    a chunk of its own. The entry reads back whole, in order."""
    e = Engine(store)
    docs = [{"_id": i, "pad": "x" * (150 + i % 90)} for i in range(1000)]
    big = {"_id": "big", "pad": "y" * 10_000}
    r = e.insert_many(NS, docs[:500] + [big] + docs[500:])
    small = e.insert_many(NS, [{"_id": "s1"}, {"_id": "s2"}])
    with store.read() as t:
        sizes = [len(v) for _, v in t.scan("oplog.refs")]
        entry = t.get("oplog", r.gtid.to_bytes())
        assert "ops" in codec.unpack(t.get("oplog", small.gtid.to_bytes()))  # not spilled
    assert len(entry) <= 4080 and len(sizes) >= 50
    assert sum(1 for n in sizes if n > 4080) == 1 and max(sizes) < 10_200  # the big one alone
    ent = next(x for g, x in e.read_oplog() if g == r.gtid)
    assert [op["post"] for op in ent["ops"][1:]] == docs[:500] + [big] + docs[500:]
    assert e.verify_oplog() == 2


def test_apply_to_another_store_then_undo_restores_exact_state(engine):
    src = engine
    dst = Engine(MemoryStore())
    src.insert_many(NS, [{"_id": i, "a": i, "tags": ["x"]} for i in range(20)])
    with src.begin() as tx:
        tx.create_index(NS, "a", unique=True)
    for g, e in src.read_oplog():
        dst.apply_entry(e["ops"])
    assert dst.snapshot_state() == src.snapshot_state()
    snap = copy.deepcopy(dst.snapshot_state())
    with src.begin() as tx:
        tx.update(NS, {"a": {"$lt": 5}}, {"$set": {"b": 1}, "$push": {"tags": "y"}}, multi=True)
        tx.delete(NS, {"a": {"$gte": 15}}, multi=True)
        tx.insert(NS, [{"_id": 100, "a": 100}])
        tx.create_index(NS, [("b", 1), ("a", 1)])
        tx.drop_index(NS, "a_1")
    (g, e), = list(src.read_oplog(after=src.last()[0].__class__(0, src.last()[0].seq - 1)))
    dst.apply_entry(e["ops"])
    assert dst.snapshot_state() == src.snapshot_state()
    dst.undo_entry(e["ops"])
    assert dst.snapshot_state() == snap


def test_undo_refuses_drop_collection(engine):
    engine.insert_many(NS, [{"_id": 1}])
    with engine.begin() as tx:
        tx.drop_collection(NS)
    (_, e), = list(engine.read_oplog(after=GTID(0, 1)))
    before = state(engine)
    with pytest.raises(errors.IrreversibleOp):
        engine.undo_entry(e["ops"])
    assert state(engine) == before


@pytest.mark.parametrize("bad, err, msg", [
    ({"_id": 1, "s": {1, 2}}, errors.InvalidDocument, "field s: type set"),
    ({"_id": 1, 5: "x"}, errors.InvalidDocument, "field 5: keys must be strings"),
    ({"_id": 1, "n": 1 << 70}, errors.InvalidDocument, "field n: integer"),
    ({"_id": 1, "n": -(1 << 64)}, errors.InvalidDocument, "field n: integer"),
    ({"_id": 1, "$x": 1}, errors.InvalidDocument, "'\\$x' may not start"),
    ({"_id": 1, "a": {"b": [1, {2: 3}]}}, errors.InvalidDocument, "field a.b.1.2: keys must"),
    ({"_id": 1, "b": bytearray(b"x")}, errors.InvalidDocument, "field b: type bytearray"),
    ({"_id": 1, "e": enum.IntEnum("E", "A").A}, errors.InvalidDocument, "field e: type E"),
    ({"_id": 1, "s": "\ud800"}, errors.InvalidDocument, "cannot be encoded"),
    ({"_id": 1, "big": "x" * 3000}, errors.DocumentTooLarge, "over the limit"),
    ("not a dict", errors.InvalidDocument, "must be a dict"),
])
def test_bad_documents_write_nothing(store, bad, err, msg):
    e = Engine(store, Limits(document_bytes_max=2048, frame_bytes_max=1 << 20))
    e.insert_many(NS, [{"_id": 0}])
    before = state(e)
    with pytest.raises(err, match=msg):
        e.insert_many(NS, [{"_id": 9}, bad])
    assert state(e) == before and e.verify_oplog() == 1


def test_dollar_inside_a_field_name_is_allowed(engine):
    engine.insert_many(NS, [{"_id": 1, "price$": 2}])
    assert engine.find(NS, {"price$": 2}) == [{"_id": 1, "price$": 2}]


def test_transaction_size_limit(store):
    e = Engine(store, Limits(transaction_bytes_max=10_000, spill_bytes=1000))
    with pytest.raises(errors.TransactionTooLarge):
        e.insert_many(NS, [{"_id": i, "p": "x" * 100} for i in range(200)])
    assert e.count(NS) == 0 and e.last()[0] == GTID(0, 0)
    for k in range(2):
        e.insert_many(NS, [{"_id": i, "p": "x" * 100} for i in range(k * 60, k * 60 + 60)])
    tx = e.begin(autocommit=True)
    with pytest.raises(errors.TransactionTooLarge, match=r"exceed 10,000 bytes \(Limits.transa"
                       r"ction_bytes_max\).*split this one \(update or delete by ranges of _id"):
        tx.delete(NS, {}, multi=True)  # the pre-images logged pass the limit: nothing deleted
    tx.abort()
    assert e.count(NS) == 120


@pytest.mark.parametrize("ns", ["nodot", "a.system.x", "a$b.c", ".c", "a.", "a.b$c", 5, "a b.c"])
def test_invalid_names(engine, ns):
    with pytest.raises(errors.InvalidName):
        engine.insert_many(ns, [{"_id": 1}])


@pytest.mark.parametrize("flt", [{"a": {"$bogus": 1}}, {"$or": "x"}, {"a": {"$in": 3}}, [1]])
def test_malformed_filters(engine, flt):
    engine.insert_many(NS, [{"_id": 1}])
    with pytest.raises(errors.InvalidFilter):
        engine.find(NS, flt)


@pytest.mark.parametrize("u", [{"$bogus": {"a": 1}}, {"$inc": {"a": "x"}}, {"$set": {"_id": 2}},
                               {"$set": {"a": 1}, "b": 2}])
def test_bad_updates_write_nothing(engine, u):
    engine.insert_many(NS, [{"_id": 1, "a": 0}])
    before = state(engine)
    with pytest.raises(errors.InvalidUpdate):
        with engine.begin() as tx:
            tx.update(NS, {"_id": 1}, u)
    assert state(engine) == before


def test_index_create_fails_on_existing_duplicates_and_drop_cleans(engine):
    engine.insert_many(NS, [{"_id": 1, "a": 1}, {"_id": 2, "a": 1}])
    before = state(engine)
    with pytest.raises(errors.DuplicateKey):
        with engine.begin() as tx:
            tx.create_index(NS, "a", unique=True)
    assert state(engine) == before
    with engine.begin() as tx:
        tx.create_index(NS, "a")
        tx.drop_index(NS, "a_1")
    with engine.store.read() as t:
        assert list(t.scan("index")) == []
    with pytest.raises(errors.IndexNotFound):
        with engine.begin() as tx:
            tx.drop_index(NS, "a_1")


def test_replace_and_delete(engine):
    engine.insert_many(NS, [{"_id": 1, "a": 1, "b": 2}])
    with engine.begin() as tx:
        tx.update(NS, {"_id": 1}, {"x": 1}, replace=True)
    assert engine.find(NS) == [{"_id": 1, "x": 1}]
    with engine.begin() as tx:
        assert tx.delete(NS, {"x": 1}).deleted == 1
    assert engine.count(NS) == 0


def test_multikey_index_finds_array_elements(engine):
    engine.insert_many(NS, [{"_id": 1, "tags": ["a", "b"]}, {"_id": 2, "tags": "a"},
                            {"_id": 3, "tags": ["c"]}, {"_id": 4, "n": [1, 20]}])
    with engine.begin() as tx:
        tx.create_index(NS, "tags")
        tx.create_index(NS, "n")
    st = Stats()
    assert sorted(d["_id"] for d in engine.reader().find(NS, {"tags": "a"}, stats=st)) == [1, 2]
    assert st.plan == "IXSCAN tags_1"
    assert [d["_id"] for d in engine.find(NS, {"n": {"$gt": 5, "$lt": 10}})] == [4]
    with engine.begin() as tx:
        tx.update(NS, {"_id": 1}, {"$pull": {"tags": "a"}})
    assert sorted(d["_id"] for d in engine.find(NS, {"tags": "a"})) == [2]
    with pytest.raises(errors.InvalidDocument):
        engine.insert_many(NS, [{"_id": [1, 2]}])


def _indexed(store) -> Engine:
    e = Engine(store)
    with e.begin() as tx:
        tx.create_index(NS, "age")                        # plain: written in one put per batch
        tx.create_index(NS, "email", unique=True)         # checked document by document
        tx.create_index(NS, [("city", 1), ("age", -1)])   # compound
        tx.create_index(NS, "a.b")                        # dotted path
    return e


_batch_doc = st.fixed_dictionaries(
    {"age": st.one_of(st.integers(0, 3), st.lists(st.integers(0, 3), max_size=2), st.none())},
    optional={"_id": st.integers(0, 6), "email": st.sampled_from(["x", "y", "z"]),
              "city": st.sampled_from(["Oslo", "Lima"]),
              "a": st.fixed_dictionaries({"b": st.integers(0, 2)}),
              # refused (past 64 bits, a non-string key) or allowed (a nested "$x")
              "odd": st.sampled_from([2**70, {1: 2}, {"$x": 1}])})


@given(st.lists(_batch_doc, max_size=8))
def test_insert_many_of_a_batch_equals_inserting_its_documents_one_by_one(docs):
    """The batched insert path (one put per plain index, one pack pass) stores
    exactly what document-by-document statements in one transaction store,
    and refuses what they refuse, with nothing left behind."""
    batch, single = _indexed(MemoryStore()), _indexed(MemoryStore())
    for e in (batch, single):
        e.insert_many(NS, [{"_id": 100, "email": "x", "age": 1}])
    ids = [f"id{i}" for i in range(len(docs))]  # generated ids differ: fix them
    docs = [d if "_id" in d else {"_id": i, **d} for d, i in zip(docs, ids)]
    errs = []
    before = state(batch)
    try:
        batch.insert_many(NS, copy.deepcopy(docs))
    except errors.RaymxError as e:
        errs.append(type(e))
        assert state(batch) == before
    try:
        with single.begin() as tx:
            for d in copy.deepcopy(docs):
                tx.insert(NS, [d])
    except errors.RaymxError as e:
        errs.append(type(e))
    # both refuse or neither; which check fires first may differ (the batch
    # packs every document before it writes any index entry)
    assert len(errs) in (0, 2)
    assert state(batch) == state(single)
    # documents received packed (the driver's form) are refused or stored alike
    try:
        rows = [msgpack.packb(d) for d in docs]
    except OverflowError:
        return  # the driver cannot pack it: refused before it is sent
    received = _indexed(MemoryStore())
    received.insert_many(NS, [{"_id": 100, "email": "x", "age": 1}])
    try:
        received.insert_many(NS, codec.unpack_documents(rows, 1 << 20))
        assert not errs
    except errors.RaymxError:
        assert errs
    assert state(received) == state(single)


def test_insert_many_batch_paths_over_both_stores(store):
    """Multikey values in a plain index send a batch down the per-document path;
    documents without an _id get one; a bad document names itself."""
    e = _indexed(store)
    e.insert_many(NS, [{"age": 1, "email": "p"}, {"_id": 2, "age": [1, 2], "a": {"b": 1},
                                                  "email": "r"},
                       {"_id": 3, "age": 2, "city": "Oslo", "email": "s"}])
    gen = e.find(NS, {"email": "p"})[0]["_id"]
    assert isinstance(gen, str) and len(gen) == 24
    st_ = Stats()
    assert {d["_id"] for d in e.reader().find(NS, {"age": 1}, stats=st_)} == {gen, 2}
    assert st_.plan == "IXSCAN age_1"
    assert e.count(NS, {"age": 2}) == 2
    assert [d["_id"] for d in e.find(NS, {"city": "Oslo", "age": 2})] == [3]
    before = state(e)
    with pytest.raises(errors.InvalidDocument, match="'\\$x'"):
        e.insert_many(NS, [{"_id": 4, "age": 1}, {"_id": 5, "$x": 1},
                           {"_id": 6, "email": "t"}])
    with pytest.raises(errors.InvalidDocument, match="must be a dict, got list"):
        e.insert_many(NS, [{"_id": 4}, [("_id", 5)]])
    with pytest.raises(errors.DuplicateKey, match="email"):
        e.insert_many(NS, [{"_id": 7, "email": "q"}, {"_id": 8, "email": "q"}])
    assert state(e) == before


_ix_value = st.one_of(st.none(), st.integers(0, 3), st.lists(st.integers(0, 3), max_size=3),
                      st.lists(st.integers(0, 3), max_size=3).map(tuple))


@given(st.lists(st.fixed_dictionaries({}, optional={"t": _ix_value, "u": _ix_value}).filter(
                    # an array at both is refused (parallel arrays: the index (t, u))
                    lambda d: not all(type(d.get(f)) in (list, tuple) for f in "tu")),
                min_size=1, max_size=8),
       st.lists(st.tuples(st.integers(0, 7), _ix_value), max_size=4),
       st.sets(st.integers(0, 7), max_size=3))
def test_indexes_kept_up_to_date_equal_indexes_built_afterwards(docs, sets, deletes):
    """Whatever the values (arrays as lists or tuples, missing, null), the
    entries that inserts, updates and deletes maintain are exactly those a
    fresh build over the final documents writes: a tuple is an array too."""
    keys = ["t", [("t", 1), ("u", -1)], "u"]
    kept = Engine(MemoryStore())
    with kept.begin() as tx:
        for k in keys:
            tx.create_index(NS, k)
    docs = [{"_id": i, **d} for i, d in enumerate(docs)]
    kept.insert_many(NS, docs[:3])
    for d in docs[3:]:
        kept.insert_many(NS, [d])
    for i, v in sets:
        try:
            kept.run(lambda tx: tx.update(NS, {"_id": i}, {"$set": {"t": v}}))
        except errors.CannotIndexParallelArrays:  # u holds an array: refused, nothing kept
            assert isinstance(v, (list, tuple)) and isinstance(kept.find(NS, {"_id": i})[0]["u"],
                                                                (list, tuple))
    for i in deletes:
        kept.run(lambda tx: tx.delete(NS, {"_id": i}))
    built = Engine(MemoryStore())
    built.insert_many(NS, kept.find(NS))
    with built.begin() as tx:
        for k in keys:
            tx.create_index(NS, k)
    assert state(kept) == state(built)
    for x in range(4):  # and the index finds every document holding x
        assert sorted(d["_id"] for d in kept.find(NS, {"t": x})) == sorted(
            d["_id"] for d in kept.find(NS) if x == d.get("t") or (
                isinstance(d.get("t"), list) and x in d["t"]))


@given(st.text(min_size=1, max_size=200),
       st.dictionaries(st.text(max_size=10), st.one_of(st.none(), st.integers(-2**63, 2**63 - 1),
                                                       st.text(), st.binary(), st.floats(allow_nan=False)),
                       max_size=6))
def test_insert_op_prefix_builds_the_same_bytes_as_pack_image_op(ns, doc):
    b = codec.pack(doc)
    assert codec.insert_op_prefix(ns) + b == codec.pack_image_op("i", ns, None, b)
    assert codec.unpack(codec.insert_op_prefix(ns) + b) == {"op": "i", "ns": ns, "post": doc}


def test_write_group_commits_statements_as_separate_entries_in_one_transaction(engine):
    """The writer's group: each statement its own GTID; a failing one leaves no
    trace while the others commit; nothing is visible before the group commits."""
    engine.insert_many(NS, [{"_id": 0}])
    base = engine.last()[0].seq
    grp = engine.begin_group()
    out = []
    for i, docs in enumerate([[{"_id": 1}], [{"_id": 0}], [{"_id": 2}, {"_id": 3}]]):
        tx = grp.statement()
        try:
            tx.insert(NS, docs)
        except errors.DuplicateKey:
            tx.abort()
            out.append(None)
            continue
        out.append(tx.commit(GTID(0, base + 1 + len([o for o in out if o]))))
    grp.noop(GTID(0, base + 3))  # a GTID taken by a statement whose commit failed
    assert engine.count(NS, {}) == 1  # nothing visible yet
    grp.commit()
    assert out == [GTID(0, base + 1), None, GTID(0, base + 2)]
    assert sorted(d["_id"] for d in engine.find(NS, {})) == [0, 1, 2, 3]
    ops = {g.seq: e["ops"] for g, e in engine.read_oplog()}
    assert [o["op"] for o in ops[base + 2]] == ["i", "i"] and ops[base + 3] == [{"op": "n"}]
    assert engine.verify_oplog() == base + 3
    assert engine.insert_many(NS, [{"_id": 4}]).gtid == GTID(0, base + 4)  # tail cache right
    assert engine.verify_oplog() == base + 4


def test_write_group_abort_leaves_nothing_and_the_chain_continues(engine):
    engine.insert_many(NS, [{"_id": 0}])
    before = state(engine)
    grp = engine.begin_group()
    for i in (1, 2):
        tx = grp.statement()
        tx.insert(NS, [{"_id": i}])
        tx.commit(GTID(0, 1 + i))
    grp.abort()
    assert state(engine) == before and engine.last()[0] == GTID(0, 1)
    with pytest.raises(errors.TransactionAborted):
        grp.statement()
    assert engine.insert_many(NS, [{"_id": 9}]).gtid == GTID(0, 2)
    assert engine.verify_oplog() == 2


def test_a_path_fans_out_over_arrays_of_subdocuments_with_and_without_an_index(engine):
    """``items.sku`` looks into every element (MongoDB); an index on it holds
    each element's key, so indexed and scanned answers agree, and a delete by
    such a path removes only the documents that match."""
    docs = [{"_id": 1, "items": [{"sku": "a"}, {"sku": "b"}]}, {"_id": 2, "items": [{"sku": "c"}]},
            {"_id": 3, "items": [{"sku": "b"}, {"n": 1}]}, {"_id": 4, "items": []}, {"_id": 5}]
    engine.insert_many(NS, copy.deepcopy(docs))
    cases = [({"items.sku": "b"}, [1, 3]), ({"items.sku": {"$ne": "b"}}, [2, 4, 5]),
             ({"items.sku": {"$in": ["a", "c"]}}, [1, 2]), ({"items.sku": None}, [3, 4, 5]),
             ({"items.sku": {"$gt": "a"}}, [1, 2, 3]), ({"items.sku": {"$exists": True}}, [1, 2, 3])]

    def ids(flt, st=None):
        return sorted(d["_id"] for d in engine.reader().find(NS, flt, stats=st or Stats()))
    for flt, want in cases:
        assert ids(flt) == want, flt
    with engine.begin() as tx:
        tx.create_index(NS, "items.sku")
    for flt, want in cases:
        assert ids(flt) == want, flt
    st = Stats()
    assert ids({"items.sku": "b"}, st) == [1, 3] and st.plan == "IXSCAN items.sku_1"
    assert [d["items"] for d in engine.reader().find(NS, {"_id": 3}, projection={"items.sku": 1})] \
        == [[{"sku": "b"}, {}]]
    with engine.begin() as tx:
        assert tx.delete(NS, {"items.sku": None}, multi=True).deleted == 3
    assert ids({}) == [1, 2] and ids({"items.sku": "b"}) == [1]


def test_rename_collection_moves_documents_and_indexes_replicates_and_undoes(engine):
    """A rename moves the catalog record only (documents and indexes keep
    their keys); it is logged, applied on another store to the same state,
    undone by renaming back, and its target is refused or dropped first."""
    dst = Engine(MemoryStore())
    engine.insert_many(NS, [{"_id": i, "a": i % 3} for i in range(10)])
    with engine.begin() as tx:
        tx.create_index(NS, "a")
    engine.insert_many("app.other", [{"_id": "o"}])
    for _, e in engine.read_oplog():
        dst.apply_entry(e["ops"])
    before = copy.deepcopy(state(engine))
    last = engine.last()[0]
    with engine.begin() as tx:
        assert tx.rename_collection(NS, "app.people") is True
    assert engine.find(NS) == [] and engine.count("app.people") == 10
    assert [d["_id"] for d in engine.find("app.people", {"a": 1})] == [1, 4, 7]  # via the index
    (_, e), = list(engine.read_oplog(after=last))
    assert e["ops"] == [{"op": "c", "ns": NS, "cmd": "rename", "to": "app.people"}]
    dst.apply_entry(e["ops"])
    assert dst.snapshot_state() == state(engine)
    dst.undo_entry(e["ops"])
    assert dst.snapshot_state() == before
    with pytest.raises(errors.CollectionExists, match="target namespace app.other exists"):
        with engine.begin() as tx:
            tx.rename_collection("app.people", "app.other")
    with pytest.raises(errors.CollectionNotFound):
        with engine.begin() as tx:
            tx.rename_collection("app.nope", "app.x")
    last = engine.last()[0]
    with engine.begin() as tx:  # dropTarget: the target's drop is logged first
        tx.rename_collection("app.people", "app.other", drop_target=True)
    (_, e), = list(engine.read_oplog(after=last))
    assert [op["cmd"] for op in e["ops"]] == ["drop", "rename"]
    assert engine.count("app.other") == 10 and engine.find("app.other", {"_id": "o"}) == []
    with pytest.raises(errors.IrreversibleOp):  # the dropped target's documents are gone
        engine.undo_entry(e["ops"])


def test_a_read_as_of_before_a_rename_is_refused_or_finds_no_collection(engine):
    from raymx.storage.changes import event
    engine.insert_many(NS, [{"_id": 1}])
    at = engine.last()[0]
    with engine.begin() as tx:
        tx.rename_collection(NS, "app.new")
    g, e = list(engine.read_oplog(after=at))[0]
    assert event(g, e["ts"], 0, e["ops"][0])["to"] == "app.new"
    with engine.store.read() as t:
        r = engine.reader().__class__(engine, t)
        assert r.overrides("app.new", at, engine.last()[0]) is None  # it did not exist then
        with pytest.raises(errors.InvalidOperation, match="renamed"):
            r.overrides(NS, at, engine.last()[0])


def test_sparse_and_partial_indexes_hold_only_their_documents_and_enforce_uniqueness(engine):
    """A unique sparse index allows any number of documents without the field;
    a unique partial one constrains only the documents its filter matches.
    Queries never read through them (they do not hold every document), so
    every answer is the full collection's; replay and undo carry the options."""
    ns = "app.members"
    engine.insert_many(ns, [{"_id": 1, "email": "a@x"}, {"_id": 2}, {"_id": 3},
                            {"_id": 4, "email": None}])
    with engine.begin() as tx:
        tx.create_index(ns, "email", unique=True, sparse=True)
        tx.create_index(ns, "code", unique=True, name="code_active",
                        partial={"active": True})
    engine.insert_many(ns, [{"_id": 5}])  # no email: not in the sparse index
    with pytest.raises(errors.DuplicateKey):
        engine.insert_many(ns, [{"_id": 6, "email": "a@x"}])
    with pytest.raises(errors.DuplicateKey):  # a null is a value: sparse indexes it
        engine.insert_many(ns, [{"_id": 6, "email": None}])
    engine.insert_many(ns, [{"_id": 7, "code": "k", "active": True},
                            {"_id": 8, "code": "k", "active": False}])
    with pytest.raises(errors.DuplicateKey):
        engine.insert_many(ns, [{"_id": 9, "code": "k", "active": True}])
    with pytest.raises(errors.DuplicateKey):  # updating into the filter is checked too
        with engine.begin() as tx:
            tx.update(ns, {"_id": 8}, {"$set": {"active": True}})
    st = Stats()
    assert [d["_id"] for d in engine.find(ns, {"email": None}, stats=st)] == [2, 3, 4, 5, 7, 8]
    assert not st.plan.startswith("IXSCAN email")
    ixs = engine.reader().coll(ns).indexes
    assert ixs["email_1"].spec()["sparse"] is True
    assert ixs["code_active"].spec()["partialFilterExpression"] == {"active": True}
    stats = engine.reader().coll_stats(ns)["indexes"]
    assert stats["email_1"][0] == 2 and stats["code_active"][0] == 1
    dst = Engine(MemoryStore())
    for _, e in engine.read_oplog():
        dst.apply_entry(e["ops"])
    assert dst.snapshot_state() == engine.snapshot_state()
    with pytest.raises(errors.InvalidFilter):
        with engine.begin() as tx:
            tx.create_index(ns, "z", partial={"z": {"$nope": 1}})
    with pytest.raises(errors.InvalidOperation, match="different spec"):
        with engine.begin() as tx:
            tx.create_index(ns, "email", unique=True)  # same name, not sparse


def test_validate_finds_a_unique_index_holding_a_key_twice(engine):
    ns = "app.uniq"
    engine.insert_many(ns, [{"_id": 1, "e": "a"}, {"_id": 2, "e": "b"}])
    with engine.begin() as tx:
        tx.create_index(ns, "e", unique=True)
    assert engine.reader().validate(ns)["valid"]
    from raymx.storage.keys import encode_key
    c = engine.reader().coll(ns)
    with engine.store.write() as t:  # a second "a", written below the engine
        t.put("docs", c.prefix + encode_key(3), codec.pack({"_id": 3, "e": "a"}))
    v = engine.reader().validate(ns)
    assert not v["valid"] and any("unique" in e for e in v["errors"])


def test_oplog_at_finds_the_first_entry_of_a_time_across_terms():
    """``Engine.oplog_at(ms)`` (a change stream from a wall-clock time): the
    first entry committed at or after ``ms``, by a binary search over seqs
    across terms; None past the last; OplogTrimmed if the oldest kept entry
    is newer and history before it was trimmed."""
    clock = [0]
    e = Engine(MemoryStore(), now_ms=lambda: clock[0])
    assert e.oplog_at(0) is None
    seq = 0
    for term, times in ((1, [1000, 2000, 2000, 3000]), (2, [4000, 5000]), (5, [6000])):
        for ms in times:
            seq += 1
            clock[0] = ms
            e.write_noop(GTID(term, seq))
    for ms, want in ((0, GTID(1, 1)), (1000, GTID(1, 1)), (1500, GTID(1, 2)),
                     (2000, GTID(1, 2)), (2001, GTID(1, 4)), (3500, GTID(2, 5)),
                     (4500, GTID(2, 6)), (6000, GTID(5, 7)), (6001, None)):
        assert e.oplog_at(ms) == want, ms
    e.trim_oplog(None, None, 5000, 2, now_ms=10_000)  # entries 1 and 2 go (too old)
    assert e.oplog_at(2001) == GTID(1, 4)
    with pytest.raises(errors.OplogTrimmed):
        e.oplog_at(1500)


def test_a_compound_index_refuses_parallel_arrays_as_mongodb(engine):
    """A document with arrays at two fields of one compound index, neither
    inside the other, is refused (CannotIndexParallelArrays) by insert, update
    and index build, and nothing is written; one array, or two fields through
    the same array, are indexed. Replay (apply_op) decides nothing: a store
    that holds such a document from before replays as it was."""
    engine.insert_many(NS, [{"_id": 1, "a": [1, 2], "b": 3}])
    with engine.begin() as tx:
        tx.create_index(NS, [("a", 1), ("b", 1)])
        tx.create_index(NS, [("s.x", 1), ("s.y", 1)])  # one array reached by both
    before = state(engine)
    with pytest.raises(errors.CannotIndexParallelArrays, match=r"parallel arrays \[a\] \[b\]"):
        engine.insert_many(NS, [{"_id": 3, "a": 0}, {"_id": 2, "a": [1], "b": [2]}])
    with pytest.raises(errors.CannotIndexParallelArrays):
        with engine.begin() as tx:
            tx.update(NS, {"_id": 1}, {"$set": {"b": [4, 5]}})
    assert state(engine) == before
    engine.insert_many(NS, [{"_id": 4, "s": [{"x": 1, "y": 2}, {"x": 3, "y": 4}], "a": 1},
                            {"_id": 5, "a": [[1, 2]], "b": 2}])
    assert [d["_id"] for d in engine.find(NS, {"s.x": 3, "s.y": 4})] == [4]
    assert [d["_id"] for d in engine.find(NS, {"a": 2, "b": 3})] == [1]
    # an index built over a document with parallel arrays is refused, nothing kept
    engine.insert_many(NS, [{"_id": 6, "p": [1], "q": [2]}])
    before = state(engine)
    with pytest.raises(errors.CannotIndexParallelArrays, match=r"\[p\] \[q\]"):
        with engine.begin() as tx:
            tx.create_index(NS, [("p", 1), ("q", 1)])
    assert state(engine) == before
    # replaying an entry that holds such a document (logged before the check)
    # keeps its cross product of keys: replay never refuses what was decided
    ops = [{"op": "i", "ns": NS, "post": {"_id": 7, "a": [1, 2], "b": [3, 4]}}]
    engine.apply_entry(ops)
    assert [d["_id"] for d in engine.find(NS, {"a": 2, "b": 4})] == [7]
