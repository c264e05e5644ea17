"""raymx.storage.query: filters, index bounds, projection, sort (and the key order they rely on)."""
import copy
import functools
import math
import pickle

import pytest
from hypothesis import given, settings, strategies as st

from raymx.errors import InvalidFilter
from raymx.storage.keys import encode_key, encode_keys
from raymx.storage.projection import project
from raymx.storage.query import (MISSING, Bounds, compile_filter, extract_bounds, get_path,
                                 index_keys, sort_key)

FAST = settings(max_examples=100, deadline=None)

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 63), (1 << 64) - 1),
                    st.floats(allow_nan=False), st.text(max_size=4), st.binary(max_size=4))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=2), inner, max_size=3)),
    max_leaves=6)


def match(flt, doc) -> bool:
    return compile_filter(flt)(doc)


# --- keys: the order everything here relies on ----------------------------------
_EDGE_INTS = st.sampled_from([0, 1, -1, 4095, 4096, (1 << 53) - 1, 1 << 53, -(1 << 53),
                              (1 << 64) - 1])


@FAST
@given(st.one_of(st.lists(st.one_of(st.integers(-(1 << 63), (1 << 64) - 1), _EDGE_INTS)),
                 st.lists(st.text(alphabet=st.characters(codec="utf-8") | st.just("\x00"))),
                 st.lists(scalars)))
def test_batch_keys_equal_one_by_one(vals):
    """encode_keys's batch paths (positive ints below 2**53, strings without a
    NUL) give exactly encode_key's bytes; anything else takes encode_key."""
    assert encode_keys(vals) == [encode_key(v) for v in vals]


def test_number_keys_big_ints_nan_and_int_float_equality():
    k = encode_key
    assert k(1) == k(1.0) and k(0.0) == k(-0.0)
    assert k(2 ** 60) == k(2.0 ** 60) and k(2 ** 53) == k(2.0 ** 53)
    assert k(2 ** 53) < k(2 ** 53 + 1) < k(2 ** 53 + 2)
    assert k(2 ** 63 - 1) < k(2 ** 63) < k(2 ** 64 - 1)
    assert k(-(2 ** 63)) < k(-(2 ** 63) + 1) < k(-(2 ** 53))
    assert k(float("nan")) == k(-float("nan")) < k(-math.inf) < k(-(2 ** 63))
    assert k(2 ** 64 - 1) < k(math.inf)
    for n in (4096, -1025, 10 ** 9, -(10 ** 9), 2 ** 53 - 1, -(2 ** 53 - 1)):  # int fast path
        assert k(n) == k(float(n)) and k(n - 1) < k(n) < k(n + 1)


@FAST
@given(st.lists(st.one_of(st.integers(-(1 << 63), (1 << 64) - 1),
                          st.floats(allow_nan=False)), min_size=2, max_size=6))
def test_number_keys_follow_numeric_order(xs):
    for a in xs:
        for b in xs:
            assert (encode_key(a) < encode_key(b)) == (a < b)
            assert (encode_key(a) == encode_key(b)) == (a == b)


@FAST
@given(values, values)
def test_keys_are_prefix_free(a, b):
    ka, kb = encode_key(a), encode_key(b)
    assert ka == kb or not kb.startswith(ka)  # descending sort relies on it


# --- get_path ---------------------------------------------------------------------
@pytest.mark.parametrize("path, expected", [
    ("a", {"b": [10, {"c": 1}]}), ("a.b", [10, {"c": 1}]), ("a.b.0", 10), ("a.b.1.c", 1),
    ("a.b.2", MISSING), ("a.b.x", MISSING), ("a.b.0.c", MISSING), ("z", MISSING),
    ("a.b.-1", MISSING), ("n", None), ("n.x", MISSING), ("a.b.²", MISSING),
])
def test_get_path(path, expected):
    doc = {"a": {"b": [10, {"c": 1}]}, "n": None}
    got = get_path(doc, path)
    assert got is MISSING if expected is MISSING else got == expected


def test_missing_is_a_picklable_singleton():
    assert pickle.loads(pickle.dumps(MISSING)) is MISSING and repr(MISSING) == "MISSING"


# --- filters ------------------------------------------------------------------------
DOC = {"_id": 1, "n": 5, "f": 2.5, "s": "abc", "t": True, "z": None, "arr": [1, 5, "x", [7]],
       "e": {"x": 1, "y": 2}, "deep": {"l": [{"k": 1}, {"k": 2}]}, "b": b"\x00\x01", "empty": []}


@pytest.mark.parametrize("flt, expected", [
    (None, True), ({}, True),
    # equality, plain and $eq; numbers compare across int and float
    ({"n": 5}, True), ({"n": 5.0}, True), ({"n": 6}, False), ({"n": {"$eq": 5}}, True),
    ({"n": "5"}, False), ({"t": 1}, False), ({"t": True}, True), ({"b": b"\x00\x01"}, True),
    ({"n": 5, "s": "abc"}, True), ({"n": 5, "s": "abd"}, False),
    # missing and null
    ({"missing": None}, True), ({"z": None}, True), ({"missing": {"$eq": None}}, True),
    ({"missing": {"$ne": None}}, False), ({"z": {"$ne": None}}, False),
    ({"n": {"$ne": None}}, True),
    ({"missing": 0}, False), ({"missing": {"$gte": None}}, True),
    ({"missing": {"$gt": None}}, False),
    ({"missing": {"$lte": None}}, True), ({"missing": {"$lt": None}}, False),
    ({"missing": {"$in": [None, 1]}}, True), ({"missing": {"$nin": [None]}}, False),
    # $ne, $in, $nin
    ({"n": {"$ne": 5}}, False), ({"n": {"$ne": 4}}, True), ({"n": {"$in": [1, 5.0]}}, True),
    ({"n": {"$in": []}}, False), ({"n": {"$nin": [1, 2]}}, True), ({"n": {"$nin": [5]}}, False),
    ({"n": {"$nin": []}}, True), ({"n": {"$in": ("x", 5)}}, True),
    # comparisons stay inside the operand's type bracket
    ({"n": {"$gt": 4}}, True), ({"n": {"$gt": 5}}, False), ({"n": {"$gte": 5}}, True),
    ({"n": {"$lt": 5.5}}, True), ({"n": {"$lte": 4.9}}, False), ({"f": {"$gt": 2, "$lt": 3}}, True),
    ({"n": {"$lt": "a"}}, False), ({"n": {"$gt": None}}, False), ({"s": {"$gt": 5}}, False),
    ({"s": {"$gt": "abb"}}, True), ({"s": {"$lt": "abc"}}, False), ({"s": {"$lte": "abc"}}, True),
    ({"t": {"$gt": False}}, True), ({"t": {"$gt": 0}}, False), ({"z": {"$lt": 1}}, False),
    ({"e": {"$gt": {"x": 0}}}, True), ({"b": {"$gte": b""}}, True), ({"n": {"$gte": b""}}, False),
    # $exists
    ({"n": {"$exists": True}}, True), ({"z": {"$exists": True}}, True),
    ({"missing": {"$exists": True}}, False), ({"missing": {"$exists": False}}, True),
    ({"e.x": {"$exists": False}}, False),
    # arrays: the whole array or any one element
    ({"arr": 5}, True), ({"arr": "x"}, True), ({"arr": 7}, False), ({"arr": [7]}, True),
    ({"arr": [1, 5, "x", [7]]}, True), ({"arr": [1, 5]}, False), ({"arr": {"$ne": 5}}, False),
    ({"arr": {"$ne": 6}}, True), ({"arr": {"$nin": [6, 5]}}, False),
    ({"arr": {"$in": [6, "x"]}}, True),
    ({"arr": {"$gt": 4}}, True), ({"arr": {"$gt": 5}}, False),
    ({"arr": {"$gt": 2, "$lt": 3}}, True),
    ({"arr": {"$lt": "y"}}, True), ({"arr": {"$gt": [1]}}, True),
    ({"arr.1": 5}, True), ({"arr.3": 7}, True), ({"arr.3.0": 7}, True), ({"arr": None}, False),
    ({"empty": []}, True), ({"empty": None}, False), ({"empty": {"$exists": True}}, True),
    ({"arr": {"$not": {"$gt": 4}}}, False), ({"arr": {"$not": {"$gt": 5}}}, True),
    # embedded documents: exact, order-sensitive equality; dotted paths
    ({"e": {"x": 1, "y": 2}}, True), ({"e": {"y": 2, "x": 1}}, False), ({"e": {"x": 1}}, False),
    ({"e": {}}, False), ({"e.x": 1}, True), ({"e.y": {"$gt": 1}}, True), ({"e.x.q": None}, True),
    ({"deep.l.1.k": 2}, True),
    # a path fans out over an array of subdocuments: any element may match;
    # $ne/$nin only if none does; null matches an element without the field
    ({"deep.l.k": 1}, True), ({"deep.l.k": 2}, True), ({"deep.l.k": 3}, False),
    ({"deep.l.k": {"$ne": 1}}, False), ({"deep.l.k": {"$ne": 3}}, True),
    ({"deep.l.k": {"$nin": [1, 7]}}, False), ({"deep.l.k": {"$gt": 1}}, True),
    ({"deep.l.k": {"$exists": True}}, True), ({"deep.l.z": {"$exists": False}}, True),
    ({"deep.l.z": None}, True), ({"deep.l.k": None}, False), ({"deep.l.k.q": 1}, False),
    ({"n": {"$exists": 1}}, True), ({"n": {"$exists": 0}}, False),
    # logical operators
    ({"$and": [{"n": 5}, {"s": "abc"}]}, True), ({"$and": [{"n": 5}, {"s": "x"}]}, False),
    ({"$or": [{"n": 4}, {"s": "abc"}]}, True), ({"$or": [{"n": 4}, {"s": "x"}]}, False),
    ({"$nor": [{"n": 4}, {"s": "x"}]}, True), ({"$nor": [{"n": 5}]}, False),
    ({"n": {"$not": {"$gt": 4}}}, False), ({"n": {"$not": {"$gt": 5}}}, True),
    ({"missing": {"$not": {"$gt": 1}}}, True), ({"n": {"$not": {"$in": [1, 2]}}}, True),
    ({"$or": [{"$and": [{"n": 5}, {"$nor": [{"t": False}]}]}], "f": {"$gte": 2.5}}, True),
])
def test_filter(flt, expected):
    assert match(flt, DOC) is expected


def test_filter_on_big_ints_and_nested_arrays():
    assert match({"a": 2.0 ** 60}, {"a": 2 ** 60})
    assert not match({"a": 2 ** 60 + 1}, {"a": 2.0 ** 60})
    assert not match({"a": 7}, {"a": [[7]]}) and match({"a": [7]}, {"a": [[7]]})  # one level only
    assert match({"a": {"$gt": 1}}, {"a": (0, 2)})  # tuples are arrays too
    assert not match({"a": 1}, 5) and match({"a": None}, 5)


NAN_DOCS = {"nan": float("nan"), "num": 4, "ninf": -math.inf, "inf": math.inf, "str": "x",
            "arr": [float("nan"), 7]}


@pytest.mark.parametrize("cond, expected", [
    ({"$gt": math.nan}, set()), ({"$lt": math.nan}, set()),
    ({"$gte": math.nan}, {"nan", "arr"}), ({"$lte": math.nan}, {"nan", "arr"}),
    ({"$lt": 5}, {"num", "ninf"}), ({"$lte": math.inf}, {"num", "ninf", "inf", "arr"}),
    ({"$gte": -math.inf}, {"num", "ninf", "inf", "arr"}), ({"$gt": 5}, {"inf", "arr"}),
    ({"$eq": math.nan}, {"nan", "arr"}), ({"$ne": math.nan}, {"num", "ninf", "inf", "str"}),
])
def test_nan_compares_false_with_every_other_number(cond, expected):
    """As MongoDB's matcher (jstests/core/query/nan.js): NaN sorts below -inf,
    but no range of numbers holds it, and a range bounded by NaN holds NaN
    only (a pandas or Spark NaN must not match {"$lt": 5})."""
    assert {k for k, v in NAN_DOCS.items() if match({"a": cond}, {"a": v})} == expected


def test_nan_ranges_are_the_same_through_an_index(engine):
    engine.insert_many("d.c", [{"_id": k, "a": v} for k, v in NAN_DOCS.items()])
    conds = [{"$gt": math.nan}, {"$gte": math.nan}, {"$lt": 5}, {"$lte": math.inf},
             {"$gte": -math.inf}]
    scan = [{d["_id"] for d in engine.find("d.c", {"a": c})} for c in conds]
    tx = engine.begin()
    tx.create_index("d.c", [["a", 1]])
    tx.commit()
    assert [{d["_id"] for d in engine.find("d.c", {"a": c})} for c in conds] == scan
    assert [engine.count("d.c", {"a": c}) for c in conds] == list(map(len, scan))
    assert scan[2] == {"num", "ninf"}


@pytest.mark.parametrize("flt, message", [
    ([("a", 1)], "must be a dict"), ("a", "must be a dict"),
    ({1: 2}, "field name 1 is not a string"), ({"a..b": 1}, "empty component"), ({"": 1}, "empty"),
    ({"a": {"$foo": 1}}, r"unknown operator \$foo on 'a'"), ({"a": {"$size": -1}}, r"\$size"),
    ({"$where": "x"}, r"\$where"),
    ({"$and": []}, "non-empty list"), ({"$or": {"a": 1}}, "non-empty list"),
    ({"$nor": [1]}, "dicts"),
    ({"$and": [{"a": {"$bad": 1}}]}, r"\$bad"), ({"a": {"$in": 5}}, r"\$in on 'a' needs a list"),
    ({"a": {"$nin": "ab"}}, r"\$nin .* needs a list"), ({"a": {"$exists": "yes"}}, "true or false"),
    ({"a": {"$not": 5}}, r"\$not"), ({"a": {"$not": {}}}, r"\$not"),
    ({"a": {"$not": {"b": 1}}}, r"\$not"),
    ({"a": {"$gt": 1, "b": 2}}, "mixes"), ({"a": {"$or": [{"b": 1}]}}, "top level"),
    ({"a": {1: 2}}, "not a string"), ({"a": object()}, "cannot be stored"),
    ({"a": {"$in": [1, object()]}}, r"\$in on 'a'"), ({"a": {"$gt": 1 << 70}}, "64 bits"),
])
def test_filter_errors(flt, message):
    with pytest.raises(InvalidFilter, match=message):
        compile_filter(flt)


def test_unknown_operator_is_named_in_info():
    with pytest.raises(InvalidFilter) as e:
        compile_filter({"a": {"$near": [0, 0]}})
    assert e.value.info["operator"] == "$near"


# --- index bounds -------------------------------------------------------------------
@pytest.mark.parametrize("flt, expected", [
    (None, {}), ({}, {}),
    ({"a": 5}, {"a": Bounds([5], None, None)}),
    ({"a": {"$eq": "x"}}, {"a": Bounds(["x"], None, None)}),
    ({"a": None}, {"a": Bounds([None], None, None)}),
    ({"a": {"$in": [3, "b", 1, 3.0]}}, {"a": Bounds([1, 3, "b"], None, None)}),
    ({"a": {"$gt": 1}}, {"a": Bounds(None, (1, False), None)}),
    ({"a": {"$lte": 9}}, {"a": Bounds(None, None, (9, True))}),
    ({"a": {"$gte": 1, "$lt": 9}}, {"a": Bounds(None, (1, True), None)}),  # multikey: one side
    ({"a": {"$gt": 1, "$gte": 1, "$gte": 0}}, {"a": Bounds(None, (1, False), None)}),
    ({"a": {"$gte": 2}, "$and": [{"a": {"$gt": 2}}, {"a": {"$gt": 1}}]},
     {"a": Bounds(None, (2, False), None)}),
    ({"a": {"$gt": 1, "$in": [4, 5]}}, {"a": Bounds([4, 5], None, None)}),  # points win
    ({"a": {"$in": [1, 2, 3]}, "$and": [{"a": 2}]}, {"a": Bounds([2], None, None)}), # fewest points
    ({"a.b": 1, "c": {"$lt": "q"}},
     {"a.b": Bounds([1], None, None), "c": Bounds(None, None, ("q", False))}),
    # skipped: not necessary, or a list/dict operand
    ({"$or": [{"a": 1}, {"b": 2}]}, {}), ({"$nor": [{"a": 1}]}, {}),
    ({"a": {"$not": {"$eq": 1}}}, {}),
    ({"a": {"$ne": 1, "$nin": [2], "$exists": True}}, {}), ({"a": [1, 2]}, {}),
    ({"a": {"b": 1}}, {}),
    ({"a": {"$in": [1, [2]]}}, {}), ({"a": {"$gt": [1]}}, {}), ({"a": {"$eq": {"x": 1}}}, {}),
    ({"a": {"$in": [1, {"x": 1}]}, "$and": [{"a": {"$gt": 0}}]},
     {"a": Bounds(None, (0, False), None)}),
])
def test_extract_bounds(flt, expected):
    assert extract_bounds(flt) == expected


def test_extract_bounds_both_sides_when_no_arrays():
    flt = {"a": {"$gt": 1, "$lte": 9}, "b": {"$gt": 1, "$lt": 9}, "$and": [{"a": {"$lt": 8}}]}
    assert extract_bounds(flt, multikey=False) == {"a": Bounds(None, (1, False), (8, False)),
                                                   "b": Bounds(None, (1, False), (9, False))}
    assert extract_bounds(flt, multikey={"b"}) == {"a": Bounds(None, (1, False), (8, False)),
                                                   "b": Bounds(None, (1, False), None)}
    assert extract_bounds({"a": {"$lt": 3, "$lte": 3}}, multikey=False)["a"].high == (3, False)


def test_extract_bounds_validates():
    with pytest.raises(InvalidFilter, match=r"\$bad"):
        extract_bounds({"a": {"$bad": 1}})


def test_index_keys():
    assert index_keys({}, "a") == [encode_key(None)]
    assert index_keys({"a": 3}, "a") == [encode_key(3)]
    assert index_keys({"a": [2, 1, 2]}, "a") == sorted(map(encode_key, [1, 2, [2, 1, 2]]))


POOL = st.sampled_from([None, 1, 2, 2.5, "a", True])
conds = st.one_of(
    POOL, st.lists(POOL, max_size=2),
    st.dictionaries(st.sampled_from(["$eq", "$ne", "$gt", "$gte", "$lt", "$lte"]), POOL,
                    min_size=1, max_size=2),
    st.builds(lambda op, xs: {op: xs}, st.sampled_from(["$in", "$nin"]),
              st.lists(POOL, max_size=3)),
    st.builds(lambda b: {"$exists": b}, st.booleans()))
simple = st.dictionaries(st.sampled_from(["a", "b", "c.d"]), conds, min_size=1, max_size=2)
members = st.lists(simple, min_size=1, max_size=2)
filters = st.one_of(simple, st.builds(lambda f, xs: {**f, "$and": xs}, simple, members),
                    st.builds(lambda f, xs: {**f, "$or": xs}, simple, members))
# Every filter is checked against a fixed universe of documents, so many of them match.
_VS = [MISSING, None, 1, 2, 2.5, "a", True, [], [1, "a"], [2.5, None], [True, 2, 1]]
UNIVERSE = [{k: v for k, v in (("a", x), ("b", y), ("c", {"d": _VS[(i + j) % len(_VS)]}))
             if v is not MISSING} for i, x in enumerate(_VS) for j, y in enumerate(_VS)]


def _satisfies(key: bytes, b: Bounds) -> bool:
    if b.points is not None:
        return key in {encode_key(p) for p in b.points}
    if b.low is not None:
        lk = encode_key(b.low[0])
        if key < lk or (key == lk and not b.low[1]):
            return False
    if b.high is not None:
        hk = encode_key(b.high[0])
        if key > hk or (key == hk and not b.high[1]):
            return False
    return True


@settings(max_examples=200, deadline=None)
@given(filters)
def test_extract_bounds_is_conservative(flt):
    m = compile_filter(flt)
    mk, whole = extract_bounds(flt), extract_bounds(flt, multikey=False)
    for d in filter(m, UNIVERSE):
        for p, b in mk.items():
            assert any(_satisfies(k, b) for k in index_keys(d, p)), (p, b, d)
        for p, b in whole.items():
            v = get_path(d, p)
            if not isinstance(v, list):  # an index of whole values is exact without arrays
                assert _satisfies(encode_key(None if v is MISSING else v), b), (p, b, d)


# --- projection -----------------------------------------------------------------------
P = {"_id": 7, "a": {"b": 1, "c": {"d": 2, "e": 3}}, "x": [1, {"y": 2}], "s": "t"}


@pytest.mark.parametrize("projection, expected", [
    (None, P), ({}, P), ([], P),
    ({"s": 1}, {"_id": 7, "s": "t"}), ({"s": True, "a": 1}, {"_id": 7, "a": P["a"], "s": "t"}),
    (["s", "x"], {"_id": 7, "x": [1, {"y": 2}], "s": "t"}), ({"s": 1, "_id": 0}, {"s": "t"}),
    ({"_id": 1}, {"_id": 7}), ({"_id": 0}, {k: v for k, v in P.items() if k != "_id"}),
    ({"a.c.d": 1}, {"_id": 7, "a": {"c": {"d": 2}}}),
    ({"a.zz": 1, "s": 1}, {"_id": 7, "a": {}, "s": "t"}),
    ({"s.q": 1}, {"_id": 7}), ({"nope": 1}, {"_id": 7}),
    # over an array, each subdocument's part (MongoDB drops other elements)
    ({"x.y": 1}, {"_id": 7, "x": [{"y": 2}]}), ({"x.y": 1.0}, {"_id": 7, "x": [{"y": 2}]}),
    ({"s": 0}, {"_id": 7, "a": P["a"], "x": P["x"]}),
    ({"s": False, "_id": 0}, {"a": P["a"], "x": P["x"]}),
    ({"a.c.e": 0, "x": 0, "s": 0}, {"_id": 7, "a": {"b": 1, "c": {"d": 2}}}),
    ({"a.b": 0, "_id": 1, "x": 0, "s": 0}, {"_id": 7, "a": {"c": {"d": 2, "e": 3}}}),
    ({"s.q": 0, "nope": 0, "x.y": 0, "a": 0}, {"_id": 7, "x": [1, {}], "s": "t"}),
    ({"_id.k": 1}, {}),
])
def test_project(projection, expected):
    assert project(P, projection) == expected


def test_project_keeps_document_order_and_returns_a_new_dict():
    doc = {"_id": 1, "b": 2, "a": 1}
    assert list(project(doc, {"a": 1, "b": 1})) == ["_id", "b", "a"]
    out = project(doc, None)
    out["c"] = 1
    assert "c" not in doc


@pytest.mark.parametrize("projection, message", [
    ({"a": 1, "b": 0}, "mix"), ({"a": 2}, "must be 0, 1"), ({"a": "yes"}, "must be 0, 1"),
    ({"a": 1, "a.b": 1}, "collides"), ({"a.b": 0, "a": 0}, "collides"), ("a", "dict or a list"),
    ({1: 1}, "not a string"), (["a", "a..b"], "empty component"), ({"a": None}, "must be 0, 1"),
])
def test_project_errors(projection, message):
    with pytest.raises(InvalidFilter, match=message):
        project({}, projection)


@FAST
@given(st.dictionaries(st.sampled_from(["_id", "a", "b", "c"]), values, max_size=4),
       st.lists(st.sampled_from(["a", "b", "a.x", "c.0", "b.y.z"]), max_size=3, unique=True),
       st.booleans())
def test_project_never_mutates(doc, paths, include):
    before = copy.deepcopy(doc)
    try:
        out = project(doc, {p: include for p in paths})
    except InvalidFilter:
        return
    assert repr(doc) == repr(before) and out is not doc


# --- sort -------------------------------------------------------------------------------
def _ids(ds, spec):
    return [d["_id"] for d in sorted(ds, key=sort_key(spec))]


SD = [{"_id": 1, "a": 2, "b": "x"}, {"_id": 2, "a": 1, "b": "y"}, {"_id": 3, "b": "x"},
      {"_id": 4, "a": "s", "b": "z"}, {"_id": 5, "a": 1.5, "b": "x"},
      {"_id": 6, "a": None, "b": "w"}]


@pytest.mark.parametrize("spec, expected", [
    ("a", [3, 6, 2, 5, 1, 4]), ([("a", 1)], [3, 6, 2, 5, 1, 4]), ({"a": -1}, [4, 1, 5, 2, 3, 6]),
    ([("b", 1), ("a", -1)], [6, 1, 5, 3, 2, 4]), ([["b", -1], ["_id", 1]], [4, 2, 1, 3, 5, 6]),
    (["b", ("_id", -1)], [6, 5, 3, 1, 2, 4]), ([], [1, 2, 3, 4, 5, 6]),
    ({"c.d": 1}, [1, 2, 3, 4, 5, 6]),
])
def test_sort_key(spec, expected):
    assert _ids(SD, spec) == expected


@pytest.mark.parametrize("spec, message", [
    ([("a", 2)], "1 or -1"), ([("a", True)], "1 or -1"), ({"a": "asc"}, "1 or -1"),
    ([("a",)], "not"),
    (5, "list"), ([("a", 1, 2)], "not"), ([(1, 1)], "not a string"), ("a..b", "empty"),
    ([("a", 1.0)], "1 or -1"),
])
def test_sort_key_errors(spec, message):
    with pytest.raises(InvalidFilter, match=message):
        sort_key(spec)


def _cmp(a, b) -> int:
    return (a > b) - (a < b)


@FAST
@given(st.lists(st.fixed_dictionaries({}, optional={"a": values, "b": values}), max_size=8),
       st.sampled_from([1, -1]), st.sampled_from([1, -1]))
def test_sort_agrees_with_key_order(ds, da, db):
    """Values sort in key order; an array by its smallest element ascending and
    its largest descending, an empty one below everything (MongoDB's rule)."""
    out = sorted(ds, key=sort_key([("a", da), ("b", db)]))

    def k(d, p, direction):
        v = d.get(p)
        if not isinstance(v, list):
            return encode_key(v)
        ks = [encode_key(x) for x in v]
        return (min(ks) if direction == 1 else max(ks)) if ks else None

    def cmp(x, y, p, direction):
        a, b = k(x, p, direction), k(y, p, direction)
        if a is None or b is None:  # an empty array: the smallest value
            return ((b is None) - (a is None)) * direction
        return _cmp(a, b) * direction

    for x, y in zip(out, out[1:]):
        c = cmp(x, y, "a", da) or cmp(x, y, "b", db)
        assert c <= 0
    ref = sorted(ds, key=functools.cmp_to_key(lambda x, y: cmp(x, y, "a", da) or cmp(x, y, "b", db)))
    assert [repr(d) for d in out] == [repr(d) for d in ref]  # both sorts are stable


def test_projection_slice_and_elem_match_as_mongodb():
    d = {"_id": 1, "a": [1, 2, 3, 4, 5], "g": [{"s": 50}, {"s": 90}, {"s": 95}], "x": "y",
         "n": 3}
    assert project(d, {"a": {"$slice": 2}}) == {**d, "a": [1, 2]}  # every other field kept
    assert project(d, {"a": {"$slice": -2}, "x": 1}) == {"_id": 1, "a": [4, 5], "x": "y"}
    assert project(d, {"a": {"$slice": [-3, 2]}})["a"] == [3, 4]
    assert project(d, {"n": {"$slice": 1}})["n"] == 3  # not an array: as it is
    assert project(d, {"g": {"$elemMatch": {"s": {"$gte": 90}}}}) == {"_id": 1, "g": [{"s": 90}]}
    assert project(d, {"g": {"$elemMatch": {"s": 1}}, "x": 1}) == {"_id": 1, "x": "y"}
    assert d["a"] == [1, 2, 3, 4, 5]
    for bad in ({"a": {"$slice": "2"}}, {"a": {"$slice": [1, -1]}}, {"a": {"$meta": "x"}},
                {"g.s": {"$elemMatch": {}}}):
        with pytest.raises(InvalidFilter):
            project(d, bad)


def test_mod_bits_not_regex_in_regex_all_elem_match_and_comment():
    import re as re_
    from raymx.storage.query import compile_filter as cf
    docs = [{"_id": i, "n": i, "s": f"Name{i}", "sub": [{"a": i}], "f": i + 0.5}
            for i in range(12)]

    def ids(flt):
        m = cf(flt)
        return [d["_id"] for d in docs if m(d)]
    assert ids({"n": {"$mod": [5, 0]}}) == [0, 5, 10]
    assert ids({"f": {"$mod": [4, 1]}}) == [1, 5, 9]  # 1.5 truncates to 1
    assert ids({"n": {"$mod": [-3, -0]}}) == [0, 3, 6, 9]
    assert ids({"n": {"$bitsAllSet": [0, 1]}}) == [3, 7, 11]
    assert ids({"n": {"$bitsAnySet": 8}}) == [8, 9, 10, 11]
    assert ids({"n": {"$bitsAllClear": 7}}) == [0, 8]
    assert ids({"n": {"$bitsAnyClear": 3, "$lt": 4}}) == [0, 1, 2]
    assert ids({"s": {"$not": re_.compile("^Name1")}}) == [0, 2, 3, 4, 5, 6, 7, 8, 9]
    assert ids({"s": {"$in": [re_.compile("1$"), "Name2"]}}) == [1, 2, 11]
    assert ids({"s": {"$nin": [re_.compile("^Name1")]}}) == [0, 2, 3, 4, 5, 6, 7, 8, 9]
    assert ids({"sub": {"$all": [{"$elemMatch": {"a": {"$gt": 9}}}]}}) == [10, 11]
    # patterns in $all: each must match, as {s: /re/} would (they matched nothing)
    assert ids({"s": {"$all": [re_.compile("^Name"), re_.compile("1$")]}}) == [1, 11]
    assert ids({"s": {"$all": [re_.compile("^Name1"), "Name10"]}}) == [10]
    tagged = [{"_id": 1, "t": ["abc", "xyz"]}, {"_id": 2, "t": ["abc"]}]
    both = cf({"t": {"$all": [re_.compile("^a"), re_.compile("z$")]}})
    assert [d["_id"] for d in tagged if both(d)] == [1]
    assert ids({"n": 3, "$comment": "why this query"}) == [3]
    for bad in ({"n": {"$mod": [0, 1]}}, {"n": {"$mod": [2]}}, {"n": {"$bitsAllSet": -1}},
                {"n": {"$bitsAnySet": [64]}}):
        with pytest.raises(InvalidFilter):
            cf(bad)
