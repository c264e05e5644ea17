"""Query plans over the engine: the one-lookup _id read, index scans,
sorted reads in an index's order (what they examine, and that they answer
what sorting every match answers) and counts without a filter."""
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from raymx import errors
from raymx.storage.engine import Engine, Stats
from raymx.storage.store import MemoryStore

NS = "app.users"


def test_an_id_point_lookup_answers_what_the_general_plan_answers(engine):
    """``{"_id": v}`` skips compiling the filter and deriving bounds; where the
    stored _id is another type that sorts equal (1.0 for 1) or a NaN, only the
    general plan can tell, and it does."""
    from bson import ObjectId
    oid = ObjectId()
    stored = [1.0, 2, "x", b"\x00b", oid, float("nan"), True, 7.5]
    engine.insert_many(NS, [{"_id": v, "n": i} for i, v in enumerate(stored)])
    rd = engine.reader()
    for v in [1, 1.0, 2, 2.0, "x", "y", b"\x00b", oid, ObjectId(), float("nan"), 1 << 70,
              True, 7.5]:
        st = Stats()
        try:
            want = list(rd.find(NS, {"_id": {"$eq": v}}))
        except errors.RaymxError as e:
            with pytest.raises(type(e)):
                list(rd.find(NS, {"_id": v}, stats=st))
            continue
        got = list(rd.find(NS, {"_id": v}, stats=st))
        assert [d["n"] for d in got] == [d["n"] for d in want], v
        assert st.plan == "IDHACK" and st.examined == len(got)
    assert list(rd.find("app.none", {"_id": 1})) == []
    # in a write transaction, its own writes
    tx = engine.begin()
    tx.insert(NS, [{"_id": 99, "n": 99}])
    assert list(tx.find(NS, {"_id": 99})) == [{"_id": 99, "n": 99}]
    tx.abort()
    assert list(engine.reader().find(NS, {"_id": 99})) == []


def test_secondary_index_is_used_and_built_for_existing_data(engine):
    engine.insert_many(NS, [{"_id": i, "age": i % 50, "city": f"c{i % 7}"} for i in range(500)])
    with engine.begin() as tx:
        tx.create_index(NS, "age")
        tx.create_index(NS, [("city", 1), ("age", -1)])
    st = Stats()
    got = list(engine.reader().find(NS, {"age": 7}, stats=st))
    assert len(got) == 10 and st.plan == "IXSCAN age_1" and st.examined == 10
    st = Stats()
    got = list(engine.reader().find(NS, {"age": {"$gte": 48}}, stats=st))
    assert len(got) == 20 and st.examined == 20
    st = Stats()
    got = list(engine.reader().find(NS, {"city": {"$in": ["c1", "c2"]}, "age": {"$lt": 3}}, stats=st))
    assert st.plan.startswith("IXSCAN") and st.examined < 200
    assert sorted(d["_id"] for d in got) == sorted(
        i for i in range(500) if i % 7 in (1, 2) and i % 50 < 3)
    st = Stats()
    assert engine.count(NS, {"nope": 1}) == 0
    list(engine.reader().find(NS, {"nope": 1}, stats=st))
    assert st.plan == "COLLSCAN" and st.examined == 500


def test_a_count_without_a_filter_reads_only_the_keys(engine):
    engine.insert_many(NS, [{"_id": i, "a": i % 2} for i in range(300)])
    st = Stats()
    r = engine.reader()
    try:
        assert r.count(NS, {}, st) == 300 and st.plan == "RECORD_STORE_FAST_COUNT"
        assert r.count(NS, None) == 300 and r.count("db.none", {}) == 0
        assert r.count(NS, {"a": 1}) == 150
        with pytest.raises(errors.InvalidName):
            r.count("nodot", {})
    finally:
        r.t.abort()


def test_find_projection_sort_skip_limit(engine):
    engine.insert_many(NS, [{"_id": i, "a": {"b": 10 - i}, "x": i} for i in range(10)])
    got = list(engine.reader().find(NS, {"a.b": {"$gt": 3}}, projection={"a.b": 1},
                                    sort=[("a.b", 1)], skip=1, limit=2))
    assert got == [{"_id": 5, "a": {"b": 5}}, {"_id": 4, "a": {"b": 6}}]


_SORT_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(
    [0.5, -1.5, 2.0, float("inf")]), st.text("ab", max_size=2), st.binary(max_size=1))
_SORT_VALUES = st.one_of(_SORT_SCALARS, st.lists(_SORT_SCALARS, max_size=3),
                         st.dictionaries(st.sampled_from("cd"), _SORT_SCALARS, max_size=2))


@given(st.lists(st.tuples(st.booleans(), _SORT_VALUES, _SORT_VALUES,
                          st.lists(st.dictionaries(st.just("c"), _SORT_SCALARS, max_size=1),
                                   max_size=2), st.sampled_from([None, 0, 1, [0, 1], "x"])),
                max_size=14),
       st.booleans(),
       st.sampled_from([[("a", 1)], [("a", -1)], [("a", -1), ("_id", -1)], [("a", 1), ("_id", 1)],
                        [("_id", 1)], [("_id", -1)], [("b.c", 1)], [("b.c", -1)],
                        [("a", 1), ("_id", -1)], [("s", -1)], [("a", 1), ("b.c", 1)]]),
       st.sampled_from([None, {}, {"a": {"$gt": 0}}, {"a": {"$lte": "b"}}, {"_id": {"$gte": 3}},
                        {"_id": {"$lt": 9}, "a": {"$ne": None}}, {"b.c": {"$gte": 1}},
                        {"a": {"$in": [1, "a"]}}, {"s": {"$exists": True}}, {"x": 1},
                        {"e": 1}, {"e": 0, "a": {"$gt": 0}}, {"e": {"$in": [1]}, "b.c": 1},
                        {"e": "x", "_id": {"$gt": 2}}, {"e": {"$in": [0, 1]}}]),
       st.integers(0, 3), st.integers(0, 5))
@example(rows=[(False, None, None, [{"c": 1}], None), (False, None, None, [{}, {"c": 1}], None)],
         arrays_ok=False, sort=[("b.c", 1)], flt={"b.c": {"$gte": 1}}, skip=0, limit=0)
def test_sorted_finds_read_in_index_order_as_a_sort_would_order_them(
        rows, arrays_ok, sort, flt, skip, limit):
    """A sort on _id, or on the last field of an index whose other fields
    the filter sets, where it holds no array, reads the documents in order
    from that scan (forward or backward) and stops after skip + limit, ties
    in _id order; any other sort sorts the
    matches (only the first skip + limit kept), ties in the order its plan
    read them. Both give what sorting every match gives."""
    from raymx.storage.query import compile_filter, sort_key
    e = Engine(MemoryStore())
    with e.begin() as tx:
        tx.create_index(NS, "a")
        tx.create_index(NS, "b.c")
        tx.create_index(NS, "s", sparse=True)  # not every document: never the sort's scan
        tx.create_index(NS, [("e", 1), ("a", -1)])  # a sort on a where the filter sets e
        tx.create_index(NS, [("e", 1), ("b.c", 1)])
    docs = []
    for i, (has_a, a, c, b, ev) in enumerate(rows):
        if not arrays_ok:
            a = a if not isinstance(a, list) else len(a)
            b = [x for x in b if not isinstance(x.get("c"), list)]
        d = {"_id": (i * 7) % 15}
        if has_a:
            d["a"] = a
        if b:
            d["b"] = b
        if i % 3 == 0:
            d["s"] = c if not isinstance(c, list) else None
        if ev is not None:  # MongoDB indexes no document with two arrays in one index
            d["e"] = 1 if isinstance(ev, list) and (b or isinstance(d.get("a"), list)) else ev
        docs.append(d)
    docs = list({d["_id"]: d for d in docs}.values())
    e.insert_many(NS, docs)
    m = compile_filter(flt)
    want = sorted(filter(m, sorted(docs, key=lambda d: d["_id"])), key=sort_key(sort))
    want = want[skip:skip + limit] if limit else want[skip:]
    stats = Stats()
    r = e.reader()
    try:
        got = list(r.find(NS, flt, sort=sort, skip=skip, limit=limit, stats=stats))
    finally:
        r.t.abort()
    key = sort_key(sort)
    assert [key(d) for d in got] == [key(d) for d in want], stats.plan
    if stats.in_order:  # ties in _id order
        assert [d["_id"] for d in got] == [d["_id"] for d in want], stats.plan
    elif not skip and not limit:  # ties in the order of the filter's plan
        assert sorted(d["_id"] for d in got) == sorted(d["_id"] for d in want)
    if limit and sort in ([("_id", 1)], [("_id", -1)]) and flt in (None, {}):
        assert stats.plan == "IXSCAN _id_" and stats.examined == min(len(docs), skip + limit)


def test_a_sort_on_an_indexed_field_reads_only_what_it_returns(engine):
    """``find().sort(field, -1).limit(n)`` over an index (the newest n, as
    applications ask) reads n documents, not the collection, on LMDB too;
    an array at that field makes it sort every match instead, still right."""
    engine.insert_many(NS, [{"_id": i, "ts": i % 100, "k": i % 2} for i in range(1000)])
    with engine.begin() as tx:
        tx.create_index(NS, "ts")

    def newest(flt, n, sort=(("ts", -1),)):
        st = Stats()
        r = engine.reader()
        try:
            return [(d["ts"], d["_id"]) for d in r.find(NS, flt, sort=list(sort), limit=n,
                                                        stats=st)], st
        finally:
            r.t.abort()
    got, st = newest(None, 3)
    assert got == [(99, 99), (99, 199), (99, 299)]  # ties in _id order, as a sort leaves them
    assert st.plan == "IXSCAN ts_1" and st.examined == 10  # the run of ts 99, then stop
    got, st = newest({"ts": {"$lt": 50}, "k": 1}, 2, (("ts", -1), ("_id", -1)))
    assert got == [(49, 949), (49, 849)] and st.examined == 2
    got, st = newest({}, 2, (("_id", -1),))
    assert got == [(99, 999), (98, 998)] and st.examined == 2
    with engine.begin() as tx:  # the newest of one kind: the filter sets the first field
        tx.create_index(NS, [("k", 1), ("ts", -1)])
    got, st = newest({"k": 0}, 3)
    assert got == [(98, 98), (98, 198), (98, 298)]
    assert st.plan == "IXSCAN k_1_ts_-1" and st.examined == 10
    got, st = newest({"k": 1, "ts": {"$lte": 51}}, 2, (("ts", 1), ("_id", 1)))
    assert got == [(1, 1), (1, 101)] and st.examined == 2
    got, st = newest({"k": {"$in": [0, 1]}}, 2)  # two values: read them all, then sort
    assert got == [(99, 99), (99, 199)] and st.examined == 1000
    engine.insert_many(NS, [{"_id": 5000, "ts": [7, 500]}])
    got, st = newest(None, 2)
    assert got == [([7, 500], 5000), (99, 99)] and st.plan == "COLLSCAN"
    assert st.examined == 1001


def _plain_and_indexed(docs: list, *keys) -> tuple[Engine, Engine]:
    """Two engines holding ``docs``: one with no index, one with ``keys``'."""
    plain, indexed = Engine(MemoryStore()), Engine(MemoryStore())
    for e in (plain, indexed):
        if docs:
            e.insert_many(NS, docs)
    with indexed.begin() as tx:
        for key in keys:
            tx.create_index(NS, key)
    return plain, indexed


def _one_array_docs(rows) -> list[dict]:
    """Documents of fields a, b, c from ``rows`` ("missing": no field), with
    at most one array each (an index holds no document with two)."""
    docs = []
    for i, vals in enumerate(rows):
        d, arrays = {"_id": i}, 0
        for f, v in zip("abc", vals):
            if isinstance(v, list):
                arrays += 1
                v = v if arrays == 1 else (v[0] if v else None)
            if v != "missing":
                d[f] = v
        docs.append(d)
    return docs


_DISTINCT_VALUES = st.one_of(
    st.none(), st.integers(-2, 2), st.sampled_from([1.0, 0.5, -0.0, float("nan")]),
    st.text("ab", max_size=2), st.sampled_from(["missing"]),
    st.dictionaries(st.sampled_from("cd"), st.integers(0, 1), max_size=2),
    st.lists(st.integers(0, 2), max_size=2))


@given(st.lists(st.tuples(_DISTINCT_VALUES, _DISTINCT_VALUES), max_size=16), st.booleans())
def test_distinct_read_off_an_index_equals_distinct_over_every_document(rows, sub):
    """With a one-field index on the key that holds no array, distinct reads
    one document per value (the index's DISTINCT_SCAN) instead of every
    document; its values, their order and which of equal values (1, 1.0)
    answers are what the documents give, null only when a document holds
    it (not for the documents without the field)."""
    key = "s.c" if sub else "a"
    docs = []
    for i, (a, c) in enumerate(rows):
        d = {"_id": i}
        if a != "missing":
            d["a"] = a
        if c != "missing":
            d["s"] = {"c": c}
        docs.append(d)
    plain, indexed = _plain_and_indexed(docs, key)
    want = plain.reader().distinct(NS, key)
    st_ = Stats()
    r = indexed.reader()
    got = r.distinct(NS, key, None, st_)
    assert repr(got) == repr(want)  # the same values of the same types (NaN == NaN by repr)
    has_array = any(isinstance(query_value, list) for a, c in rows
                    for query_value in ([a] if not sub else [c]))
    if not has_array:
        assert st_.plan == f"DISTINCT_SCAN {key}_1"
        assert st_.examined <= len(docs)
    assert repr(r.distinct(NS, key, {"_id": {"$gte": 0}})) == repr(want)  # a filter


def test_distinct_reads_one_document_per_value_and_refuses_a_too_large_answer(tmp_path):
    from raymx.storage.limits import Limits
    from raymx.storage.lmdb_store import LMDBStore
    e = Engine(LMDBStore(str(tmp_path / "m")), Limits(document_bytes_max=64 * 1024,
                                                      frame_bytes_max=1 << 20))
    e.insert_many(NS, [{"_id": i, "k": i % 5, "u": str(i) * 40} for i in range(3000)])
    with e.begin() as tx:
        tx.create_index(NS, "k")
    st_ = Stats()
    assert e.reader().distinct(NS, "k", None, st_) == [0, 1, 2, 3, 4]
    assert st_.plan == "DISTINCT_SCAN k_1" and st_.examined == 5
    st_ = Stats()
    assert e.reader().distinct(NS, "k", {"k": {"$gt": 2}}, st_) == [3, 4]
    assert st_.examined == 1200  # a filter: the matching documents, through its plan
    with pytest.raises(errors.InvalidOperation, match="distinct too big.*\\$group"):
        e.reader().distinct(NS, "u")
    with pytest.raises(errors.InvalidFilter, match="non-empty string"):
        e.reader().distinct(NS, "")


_CMP_VALUES = st.one_of(st.none(), st.integers(-2, 2), st.sampled_from([0.5, 1.0, -0.0]),
                        st.text("ab", max_size=2))
_CMP_FIELD = st.one_of(_CMP_VALUES, st.just("missing"), st.lists(_CMP_VALUES, max_size=2))


def _cmp_condition():
    return st.one_of(
        _CMP_VALUES, st.fixed_dictionaries({"$in": st.lists(_CMP_VALUES, max_size=3)}),
        st.builds(lambda op, v: {op: v}, st.sampled_from(["$gt", "$gte", "$lt", "$lte"]),
                  _CMP_VALUES),
        st.builds(lambda lo, hi: {"$gte": lo, "$lt": hi}, st.integers(-2, 2), st.integers(-2, 3)),
        st.fixed_dictionaries({"$exists": st.booleans()}), st.fixed_dictionaries(
            {"$ne": _CMP_VALUES}))


@given(st.lists(st.tuples(_CMP_FIELD, _CMP_FIELD, _CMP_FIELD), max_size=14),
       st.dictionaries(st.sampled_from(["a", "b", "c"]), _cmp_condition(), max_size=3),
       st.sampled_from([[("a", 1), ("b", 1), ("c", 1)], [("b", -1), ("a", 1)],
                        [("a", 1), ("c", -1)], [("a", 1)], [("c", 1)]]))
def test_a_compound_index_narrows_by_each_field_the_filter_bounds(rows, flt, key):
    """A filter that sets a compound index's leading fields to points (one,
    or an $in) and bounds the next by a range reads only those key ranges
    (it read every entry of the first field's value), a range with both ends
    keeps both where no array is under it (it kept the low end alone), and
    finds what a collection scan finds: arrays, missing fields and numbers
    of each type included."""
    plain, indexed = _plain_and_indexed(_one_array_docs(rows), key)
    want = sorted(d["_id"] for d in plain.find(NS, flt))
    st_ = Stats()
    got = sorted(d["_id"] for d in indexed.reader().find(NS, flt, stats=st_))
    assert got == want, (flt, st_.plan)


def test_a_time_range_of_one_user_reads_only_its_entries(engine):
    engine.insert_many(NS, [{"_id": i, "user": i % 10, "ts": i} for i in range(2000)])
    with engine.begin() as tx:
        tx.create_index(NS, [("user", 1), ("ts", 1)])
        tx.create_index(NS, "user")
    st_ = Stats()
    got = list(engine.reader().find(NS, {"user": 3, "ts": {"$gte": 1000, "$lt": 1100}},
                                    stats=st_))
    assert [d["_id"] for d in got] == list(range(1003, 1100, 10))
    assert st_.plan == "IXSCAN user_1_ts_1" and st_.examined == 10  # not the user's 200
    st_ = Stats()
    got = list(engine.reader().find(NS, {"user": {"$in": [1, 2]}, "ts": {"$lt": 40}},
                                    stats=st_))
    assert sorted(d["_id"] for d in got) == [1, 2, 11, 12, 21, 22, 31, 32]
    assert st_.examined == 8
    assert list(engine.reader().find(NS, {"user": {"$in": []}, "ts": 5})) == []
    with engine.begin() as tx:
        tx.create_index(NS, "ts")
    st_ = Stats()  # a one-field index: both ends of the range, no array under them
    assert len(list(engine.reader().find(NS, {"ts": {"$gt": 10, "$lte": 20}}, stats=st_))) == 10
    assert st_.examined == 10
    engine.insert_many(NS, [{"_id": "arr", "user": 3, "ts": [1005, 5000]}])
    st_ = Stats()  # an array under the range: its low end only, as for any array
    got = list(engine.reader().find(NS, {"user": 3, "ts": {"$gte": 1000, "$lt": 1100}},
                                    stats=st_))
    assert len(got) == 11 and st_.examined == 101  # the 100 scalars from 1000 on, the array


@given(st.lists(st.tuples(_CMP_FIELD, _CMP_FIELD, _CMP_FIELD), max_size=14),
       st.lists(st.dictionaries(st.sampled_from(["a", "b", "c", "_id"]), _cmp_condition(),
                                min_size=1, max_size=2), min_size=2, max_size=3),
       st.dictionaries(st.sampled_from(["c"]), _cmp_condition(), max_size=1))
def test_an_or_of_indexed_clauses_reads_each_clause_s_plan(rows, clauses, rest):
    """A top-level $or whose every clause an index (or _id) serves reads each
    clause's plan, each document once (MongoDB's OR stage; it scanned the
    collection), and finds what a collection scan finds."""
    flt = {"$or": clauses, **rest}
    plain, indexed = _plain_and_indexed(_one_array_docs(rows), "a", [("b", 1), ("a", -1)])
    want = sorted(d["_id"] for d in plain.find(NS, flt))
    got = [d["_id"] for d in indexed.find(NS, flt)]
    assert sorted(got) == want and len(set(got)) == len(got), flt


def test_an_or_reads_only_what_its_clauses_plans_read(engine):
    engine.insert_many(NS, [{"_id": i, "a": i % 100, "b": i % 7} for i in range(1400)])
    with engine.begin() as tx:
        tx.create_index(NS, "a")
        tx.create_index(NS, "b")
    st_ = Stats()
    got = list(engine.reader().find(NS, {"$or": [{"a": 5}, {"b": 3, "a": {"$lt": 10}},
                                                  {"_id": {"$in": [0, 5]}}]}, stats=st_))
    want = {i for i in range(1400) if i % 100 == 5 or (i % 7 == 3 and i % 100 < 10)} | {0}
    assert {d["_id"] for d in got} == want and len(got) == len(want)
    assert st_.plan == "OR" and st_.examined < 14 + 200 + 2 + 5  # not the 1,400 documents
    st_ = Stats()  # a clause no index serves: one collection scan
    assert len(list(engine.reader().find(NS, {"$or": [{"a": 5}, {"c": 1}]}, stats=st_))) == 14
    assert st_.plan == "COLLSCAN"
