"""raymx.storage.update: $operators, replacement, upsert seeds; the input is never mutated."""
import copy
import re

import pytest
from hypothesis import given, settings, strategies as st

from raymx.errors import InvalidFilter, InvalidUpdate
from raymx.storage.update import apply_update, is_operator_update, upsert_seed

D = {"_id": 1, "n": 5, "f": 1.5, "s": "x", "t": True, "l": [1, 2, 3, 2],
     "e": {"a": 1, "b": {"c": 2}},
     "docs": [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}], "tup": (1, 2)}


def up(update, doc=None):
    doc = D if doc is None else doc
    before = copy.deepcopy(doc)
    out = apply_update(doc, update)
    assert doc == before  # never mutated
    return out


def changed(update, doc=None) -> dict:
    """The fields ``update`` changed or added, and '-' for removed ones."""
    doc = D if doc is None else doc
    out = up(update, doc)
    diff = {k: v for k, v in out.items() if k not in doc or doc[k] != v}
    return {**diff, **{k: "-" for k in doc if k not in out}}


def test_one_statement_parses_a_plain_update_once_and_positional_ones_per_document():
    """A statement's documents share the steps of an update without
    positional paths (checked once); each document still gets its own
    values and errors, and positional paths are resolved per document."""
    from raymx.storage.update import Positional
    from raymx.errors import UpdateBadValue
    pos = Positional({})
    u = {"$inc": {"n": 2}, "$set": {"s.t": 1}}
    assert apply_update({"_id": 1, "n": 1}, u, positional=pos) == {"_id": 1, "n": 3,
                                                                    "s": {"t": 1}}
    assert pos.plan is not None and pos.plan[0] is u
    assert apply_update({"_id": 2}, u, positional=pos) == {"_id": 2, "n": 2, "s": {"t": 1}}
    with pytest.raises(InvalidUpdate, match="non-number"):  # this document's own error
        apply_update({"_id": 3, "n": "x"}, u, positional=pos)
    v = {"$set": {"n": 0}}  # another update with the same statement: parsed for itself
    assert apply_update({"_id": 4, "n": 1}, v, positional=pos) == {"_id": 4, "n": 0}
    pos = Positional({}, [{"e": {"$gt": 1}}])
    w = {"$inc": {"a.$[e]": 10}}
    assert apply_update({"_id": 1, "a": [1, 2]}, w, positional=pos)["a"] == [1, 12]
    assert apply_update({"_id": 2, "a": [3, 0, 5]}, w, positional=pos)["a"] == [13, 0, 15]
    assert pos.plan is None
    with pytest.raises(UpdateBadValue):
        apply_update({"_id": 3}, w, positional=pos)


def test_is_operator_update():
    assert is_operator_update({"$set": {"a": 1}}) and is_operator_update({"a": 1, "$inc": {}})
    assert not any(map(is_operator_update, [{"a": 1}, {}, [1], "$set"]))
    assert not is_operator_update({1: 2})


@pytest.mark.parametrize("update, expected", [
    # $set: new, existing, nested (creating dicts), list elements, padding
    ({"$set": {"n": 6}}, {"n": 6}), ({"$set": {"new": {"x": [1]}}}, {"new": {"x": [1]}}),
    ({"$set": {"e.b.c": 3}}, {"e": {"a": 1, "b": {"c": 3}}}),
    ({"$set": {"p.q.r": 1}}, {"p": {"q": {"r": 1}}}),
    ({"$set": {"l.1": 9}}, {"l": [1, 9, 3, 2]}),
    ({"$set": {"l.5": 9}}, {"l": [1, 2, 3, 2, None, 9]}),
    ({"$set": {"docs.1.v": "z"}}, {"docs": [{"k": 1, "v": "a"}, {"k": 2, "v": "z"}]}),
    ({"$set": {"docs.2.v": "z"}}, {"docs": [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}, {"v": "z"}]}),
    ({"$set": {"tup.0": 7}}, {"tup": [7, 2]}), ({"$set": {"n": (1, 2)}}, {"n": [1, 2]}),
    ({"$set": {"_id": 1.0}}, {}), ({"$set": {}}, {}),
    # $unset: dict fields removed, array elements nulled, absent paths ignored
    ({"$unset": {"n": ""}}, {"n": "-"}), ({"$unset": {"e.b": 1}}, {"e": {"a": 1}}),
    ({"$unset": {"l.0": 1}}, {"l": [None, 2, 3, 2]}),
    ({"$unset": {"l.9": 1, "zz.y": 1, "s.q": 1}}, {}),
    ({"$unset": {"l.x": 1}}, {}),
    # $inc
    ({"$inc": {"n": 2}}, {"n": 7}), ({"$inc": {"n": -1.5}}, {"n": 3.5}),
    ({"$inc": {"f": 1}}, {"f": 2.5}),
    ({"$inc": {"new": 3}}, {"new": 3}),
    ({"$inc": {"e.b.z": 1}}, {"e": {"a": 1, "b": {"c": 2, "z": 1}}}),
    ({"$inc": {"l.0": 10}}, {"l": [11, 2, 3, 2]}),
    # $min / $max: the value order of encode_key, across types
    ({"$min": {"n": 3}}, {"n": 3}), ({"$min": {"n": 7}}, {}), ({"$max": {"n": 7}}, {"n": 7}),
    ({"$max": {"n": 5.0}}, {}), ({"$min": {"new": 1}}, {"new": 1}),
    ({"$max": {"n": "a"}}, {"n": "a"}),
    ({"$min": {"s": None}}, {"s": None}), ({"$max": {"e.b.c": 1}}, {}),
    # $push
    ({"$push": {"l": 4}}, {"l": [1, 2, 3, 2, 4]}),
    ({"$push": {"new.x": [1]}}, {"new": {"x": [[1]]}}),
    ({"$push": {"l": {"$each": [7, 8]}}}, {"l": [1, 2, 3, 2, 7, 8]}),
    ({"$push": {"l": {"$each": [7], "$position": 0}}}, {"l": [7, 1, 2, 3, 2]}),
    ({"$push": {"l": {"$each": [7], "$position": -1}}}, {"l": [1, 2, 3, 7, 2]}),
    ({"$push": {"l": {"$each": [7, 8], "$slice": -3}}}, {"l": [2, 7, 8]}),
    ({"$push": {"l": {"$each": [], "$slice": 2}}}, {"l": [1, 2]}),
    ({"$push": {"l": {"k": 1}}}, {"l": [1, 2, 3, 2, {"k": 1}]}),
    ({"$push": {"tup": 3}}, {"tup": [1, 2, 3]}),
    # $addToSet (equality by key: 2.0 == 2)
    ({"$addToSet": {"l": 2.0}}, {}), ({"$addToSet": {"l": 9}}, {"l": [1, 2, 3, 2, 9]}),
    ({"$addToSet": {"l": {"$each": [3, 4, 4, 5]}}}, {"l": [1, 2, 3, 2, 4, 5]}),
    ({"$addToSet": {"new": [1]}}, {"new": [[1]]}),
    # $pull: a value, an operator condition on elements, a filter on subdocuments
    ({"$pull": {"l": 2}}, {"l": [1, 3]}), ({"$pull": {"l": 2.0}}, {"l": [1, 3]}),
    ({"$pull": {"l": 7}}, {}),
    ({"$pull": {"l": {"$gte": 2}}}, {"l": [1]}), ({"$pull": {"l": {"$in": [1, 3]}}}, {"l": [2, 2]}),
    ({"$pull": {"l": {"$gt": "a"}}}, {}),
    ({"$pull": {"docs": {"k": 2}}}, {"docs": [{"k": 1, "v": "a"}]}),
    ({"$pull": {"docs": {"k": {"$lt": 5}, "v": "a"}}}, {"docs": [{"k": 2, "v": "b"}]}),
    ({"$pull": {"docs": {"$or": [{"k": 1}, {"v": "b"}]}}}, {"docs": []}),
    ({"$pull": {"docs": {"k": 1, "v": "a"}}}, {"docs": [{"k": 2, "v": "b"}]}),
    ({"$pull": {"missing": 1, "e.zz": 1}}, {}), ({"$pull": {"l": {}}}, {}),
    ({"$pull": {"l": [1]}}, {}), ({"$pull": {"tup": 1}}, {"tup": [2]}),
    # $rename
    ({"$rename": {"n": "m"}}, {"m": 5, "n": "-"}),
    ({"$rename": {"e.a": "z.y"}}, {"e": {"b": {"c": 2}}, "z": {"y": 1}}),
    ({"$rename": {"nope": "m"}}, {}), ({"$rename": {"n": "s"}}, {"s": 5, "n": "-"}),
    # several operators at once
    ({"$set": {"e.a": 0}, "$inc": {"e.b.c": 1}, "$unset": {"s": 1}, "$push": {"l": 0}},
     {"e": {"a": 0, "b": {"c": 3}}, "l": [1, 2, 3, 2, 0], "s": "-"}),
])
def test_operators(update, expected):
    assert changed(update) == expected


def test_unchanged_parts_are_shared_and_changed_parts_copied():
    out = up({"$set": {"e.b.c": 9}})
    assert out["docs"] is D["docs"] and out["e"] is not D["e"] and out["e"]["b"] is not D["e"]["b"]
    assert D["e"]["b"]["c"] == 2
    v = {"x": [1]}
    out = up({"$set": {"v": v}})
    v["x"].append(2)
    assert out["v"] == {"x": [1]}  # values from the update are copied in


def test_field_order_is_kept_and_new_fields_appended():
    assert list(up({"$set": {"s": 0, "zz": 1}, "$unset": {"n": 1}})) == \
        ["_id", "f", "s", "t", "l", "e", "docs", "tup", "zz"]


@pytest.mark.parametrize("update, message", [
    ([("$set", {})], "must be a dict"), ({"$set": {"a": 1}, "b": 2}, "mix"),
    ({"$foo": {"a": 1}}, r"unknown update operator \$foo"),
    ({"$set": [("a", 1)]}, r"\$set needs a dict"),
    ({"$set": {"": 1}}, "non-empty"), ({"$set": {1: 1}}, "non-empty string"),
    ({"$set": {"a..b": 1}}, "empty component"),
    ({"$set": {"a.$": 1}}, "positional"), ({"$set": {"$a": 1}}, "may not start with"),
    ({"$set": {"a": {"$b": 1}}}, r"\$set on 'a': field name '\$b'"),
    ({"$set": {"a": [{"x": {"$y": 0}}]}}, r"\$y"),
    ({"$set": {"a": {1: 2}}}, "not a string"), ({"$set": {"s.x": 1}}, r"'s' holds 'x'"),
    ({"$set": {"l.x": 1}}, r"cannot use 'x' to index an array"),
    ({"$set": {"l.100005": 1}}, "too far"),
    ({"$inc": {"n": "1"}}, r"\$inc on 'n': the increment must be a number"),
    ({"$inc": {"n": True}}, "must be a number"),
    ({"$inc": {"s": 1}}, r"\$inc on 's': the field holds a non-number"),
    ({"$inc": {"t": 1}}, "non-number"),
    ({"$inc": {"n": 1 << 64}}, "64 bits"), ({"$min": {"n": object()}}, r"\$min on 'n'"),
    ({"$push": {"s": 1}}, r"\$push on 's': the field holds a non-array"),
    ({"$push": {"l": {"$slice": 1}}}, "need \\$each"),
    ({"$push": {"l": {"$each": 1}}}, r"\$each needs a list"),
    ({"$push": {"l": {"$each": [], "$nope": 1}}}, r"unknown modifier \$nope"),
    ({"$push": {"l": {"$each": [], "$slice": "1"}}}, r"\$slice needs an integer"),
    ({"$addToSet": {"l": {"$each": [], "$slice": 1}}}, r"unknown modifier \$slice"),
    ({"$addToSet": {"e": 1}}, "non-array"),
    ({"$pull": {"s": 1}}, "non-array"), ({"$pull": {"l": {"$gt": 1, "x": 1}}}, r"\$pull on 'l'"),
    ({"$pull": {"l": {"$foo": 1}}}, r"\$pull on 'l': unknown .*\$foo"),
    ({"$rename": {"n": 5}}, "non-empty string"), ({"$rename": {"n": "n"}}, "conflicts"),
    ({"$rename": {"e": "e.x"}}, "conflicts"),
    ({"$rename": {"l.0": "z"}}, "array"), ({"$rename": {"n": "l.0"}}, "array"),
    # as MongoDB: no path through an array, on either side, also to a missing field
    ({"$rename": {"docs.k": "z"}}, "source field 'docs.k' cannot be an array element"),
    ({"$rename": {"docs.q": "z"}}, "source field 'docs.q' cannot be an array element"),
    ({"$rename": {"n": "docs.0.y"}}, "destination field 'docs.0.y' cannot be an array element"),
    # conflicting paths in one update
    ({"$set": {"a": 1}, "$inc": {"a": 1}}, r"updating 'a' \(\$inc\) conflicts with 'a' \(\$set\)"),
    ({"$set": {"a": 1, "a.b": 1}}, "conflicts"),
    ({"$set": {"e.b.c": 1}, "$unset": {"e": 1}}, "conflicts"),
    ({"$rename": {"n": "m"}, "$set": {"m.x": 1}}, "conflicts"),
    # _id is immutable
    ({"$set": {"_id": 2}}, "_id"), ({"$unset": {"_id": 1}}, "_id"), ({"$inc": {"_id": 1}}, "_id"),
    ({"$rename": {"_id": "x"}}, "_id"), ({"$set": {"_id": "1"}}, "_id"),
])
def test_update_errors(update, message):
    with pytest.raises(InvalidUpdate, match=message):
        up(update)


def test_errors_carry_operator_and_field():
    with pytest.raises(InvalidUpdate) as e:
        up({"$inc": {"s": 1}})
    assert e.value.info == {"operator": "$inc", "field": "s"}
    with pytest.raises(InvalidUpdate) as e:
        up({"$bogus": {}})
    assert e.value.info == {"operator": "$bogus"}


def test_id_of_a_nested_id_and_of_a_document_without_one():
    doc = {"_id": {"a": 1}, "x": 1}
    with pytest.raises(InvalidUpdate, match="_id"):
        up({"$set": {"_id.a": 2}}, doc)
    assert up({"$set": {"_id.a": 1.0}}, doc)["_id"] is doc["_id"]  # equal: kept as it was
    assert type(up({"$set": {"_id": 1.0}})["_id"]) is int
    assert up({"$set": {"_id": 9, "x": 2}}, {"x": 1}) == {"x": 2, "_id": 9}


# --- replacement ------------------------------------------------------------------
def test_replacement_keeps_id_first():
    assert list(up({"b": 1, "a": [2]}).items()) == [("_id", 1), ("b", 1), ("a", [2])]
    assert list(up({"b": 1, "_id": 1.0})) == ["_id", "b"] and up({"b": 1, "_id": 1.0})["_id"] == 1
    assert list(up({"b": 1, "_id": 3}, {"x": 1})) == ["_id", "b"]  # no _id yet: the replacement's
    assert up({"b": 1}, {}) == {"b": 1}
    assert up({}) == {"_id": 1} and up({}, {"x": 1}) == {}  # MongoDB's update {}: _id alone
    r = {"a": {"b": [1]}}
    out = up(r)
    r["a"]["b"].append(2)
    assert out["a"] == {"b": [1]}


@pytest.mark.parametrize("repl, message", [
    ({"_id": 2, "a": 1}, "may not change _id"), ({"a": {"$b": 1}}, r"'\$b' may not start"),
    ({"a": [{"$b": 1}]}, r"\$b"), ({"a": {1: 1}}, "not a string"),
])
def test_replacement_errors(repl, message):
    with pytest.raises(InvalidUpdate, match=message):
        up(repl)


# --- upsert seed -------------------------------------------------------------------
@pytest.mark.parametrize("flt, seed", [
    (None, {}), ({}, {}), ({"a": 1, "b": {"$eq": "x"}}, {"a": 1, "b": "x"}),
    ({"a.b.c": 1, "a.d": 2}, {"a": {"b": {"c": 1}, "d": 2}}),
    ({"e": {"x": [1]}}, {"e": {"x": [1]}}),
    ({"_id": 5, "$and": [{"x": 1}, {"$and": [{"y.z": None}]}]},
     {"_id": 5, "x": 1, "y": {"z": None}}),
    ({"a": {"$gt": 1}, "b": {"$in": [1, 2]}, "$or": [{"c": 1}, {"c": 2}],
      "$nor": [{"d": 1}], "f": {"$ne": 1}, "g": {"$all": [1, 2]}}, {}),
    # what MongoDB reads as equalities (its jstests' upsert cases): an $in or an
    # $all of one value, an $or of one clause
    ({"b": {"$in": [1]}, "$or": [{"c": {"$eq": 1}}], "g": {"$all": [[1, 2]]}},
     {"b": 1, "c": 1, "g": [1, 2]}),
    ({"$and": [{"$or": [{"x": 1}]}]}, {"x": 1}),
    ({"b": {"$in": [re.compile("x")]}, "g": {"$all": [{"$elemMatch": {"k": 1}}]}}, {}),
    ({"a": {"$eq": 1, "$gt": 0}}, {"a": 1}), ({"a": 1, "$and": [{"a": 1.0}]}, {"a": 1}),
    ({"a": [1, 2]}, {"a": [1, 2]}), ({"l.0": 5}, {"l": {"0": 5}}),
])
def test_upsert_seed(flt, seed):
    assert upsert_seed(flt) == seed


def test_upsert_seed_copies_and_then_applies():
    flt = {"a": {"b": [1]}}
    seed = upsert_seed(flt)
    seed["a"]["b"].append(2)
    assert flt == {"a": {"b": [1]}}
    assert apply_update(upsert_seed({"k": 1}), {"$inc": {"n": 1}, "$set": {"k2": 2}}) == \
        {"k": 1, "n": 1, "k2": 2}
    assert apply_update(upsert_seed({"_id": 3}), {"x": 1}) == {"_id": 3, "x": 1}
    with pytest.raises(InvalidUpdate, match="_id"):
        apply_update(upsert_seed({"_id": 3}), {"_id": 4})


@pytest.mark.parametrize("flt, exc, message", [
    ({"a": 1, "$and": [{"a": 2}]}, InvalidUpdate, "'a' conflicts"),
    ({"a": 1, "a.b": 2}, InvalidUpdate, "conflicts"),
    ({"a.b": 1, "a": 2}, InvalidUpdate, "conflicts"),
    ({"a": {"b": {"$c": 1}}}, InvalidUpdate, r"\$c"),
    ({"a": {"$bad": 1}}, InvalidFilter, r"\$bad"), ("x", InvalidFilter, "dict"),
])
def test_upsert_seed_errors(flt, exc, message):
    with pytest.raises(exc, match=message):
        upsert_seed(flt)


# --- properties ----------------------------------------------------------------------
ints = st.integers(-(1 << 62), 1 << 62)
values = st.recursive(
    st.one_of(st.none(), st.booleans(), ints, st.text(max_size=3)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from("abc"), inner, max_size=3)),
    max_leaves=8)
docs = st.dictionaries(st.sampled_from(["_id", "a", "b", "c"]), values, max_size=4)
paths = st.sampled_from(["a", "b", "a.b", "a.0", "b.c.a", "c.1", "a.x.y"])
ops = st.sampled_from(["$set", "$unset", "$inc", "$min", "$max", "$push", "$addToSet", "$pull",
                       "$rename"])


@settings(max_examples=200, deadline=None)
@given(docs, st.lists(st.tuples(ops, paths, st.one_of(values, ints)), min_size=1, max_size=4))
def test_never_mutates_the_input(doc, steps):
    update: dict = {}
    for op, path, arg in steps:
        update.setdefault(op, {})[path] = path.replace("a", "c") if op == "$rename" else arg
    before = copy.deepcopy(doc)
    try:
        out = apply_update(doc, update)
    except InvalidUpdate:
        out = None
    assert repr(doc) == repr(before)
    if out is not None:
        assert out is not doc and (out.get("_id") == doc.get("_id") or "_id" not in doc)


@settings(max_examples=100, deadline=None)
@given(docs, st.sampled_from(["a", "b.c", "n"]), ints)
def test_inc_then_negative_inc_restores(doc, path, n):
    try:
        once = apply_update(doc, {"$inc": {path: n}})
    except InvalidUpdate:
        return  # a non-number or non-container on the path
    back = apply_update(once, {"$inc": {path: -n}})
    assert back == apply_update(doc, {"$inc": {path: 0}})


def test_positional_operators_resolve_against_the_document_before_the_update():
    d = {"_id": 1, "g": [80, 85, 90], "items": [{"sku": "a", "q": 1}, {"sku": "b", "q": 2}],
         "m": [[1, 2], [3, 4]]}
    before = copy.deepcopy(d)
    assert apply_update(d, {"$set": {"g.$": 82}}, flt={"g": 85})["g"] == [80, 82, 90]
    assert apply_update(d, {"$set": {"items.$.q": 9}},
                        flt={"$and": [{"_id": 1}, {"items.sku": "b"}]})["items"][1]["q"] == 9
    assert apply_update(d, {"$inc": {"g.$": 1}}, flt={"g": {"$gt": 81}})["g"] == [80, 86, 90]
    assert apply_update(d, {"$inc": {"g.$[]": 1}})["g"] == [81, 86, 91]
    assert apply_update(d, {"$set": {"g.$[x]": 0}},
                        array_filters=[{"x": {"$gte": 85}}])["g"] == [80, 0, 0]
    assert apply_update(d, {"$set": {"items.$[i].q": 7}}, array_filters=[
        {"i.sku": "a", "i.q": 1}])["items"] == [{"sku": "a", "q": 7}, {"sku": "b", "q": 2}]
    assert apply_update(d, {"$set": {"m.$[].$[v]": 0}},
                        array_filters=[{"v": {"$gt": 2}}])["m"] == [[1, 2], [0, 0]]
    assert apply_update(d, {"$set": {"g.$[x]": 0}},  # no element matches: nothing changes
                        array_filters=[{"x": 1000}]) == d
    assert d == before  # never mutated
    for update, flt, af, msg in (
            ({"$set": {"g.$": 0}}, {"_id": 1}, None, "did not find the match"),
            ({"$set": {"g.$": 0}}, {"g": 1000}, None, "did not find the match"),
            ({"$set": {"g.$[x]": 0}}, None, None, "no array filter found for identifier 'x'"),
            ({"$set": {"a": 0}}, None, [{"x": 1}], "'x' was not used"),
            ({"$set": {"g.$[x]": 0}}, None, [{"x": 1}, {"x": 2}], "two array filters"),
            ({"$set": {"g.$[x]": 0}}, None, [{"x": 1, "y": 2}], "one identifier"),
            ({"$set": {"g.$[X]": 0}}, None, None, "not a positional operator"),
            ({"$set": {"items.0.sku.$[]": 0}}, None, None, "cannot apply array updates to "
                                                          "non-array element items.0.sku: 'a'"),
            ({"$set": {"s.$[]": 0}}, None, None, "path 's' must exist in the document"),
            ({"$rename": {"g.$": "h"}}, {"g": 85}, None, "positional operators are not allowed"),
            ({"$set": {"g.$[]": 0, "g.1": 5}}, None, None, "conflicts")):
        with pytest.raises(InvalidUpdate, match=msg):
            apply_update(d, update, flt=flt, array_filters=af)


def test_current_date_push_sort_pull_all_bit_and_decimal_arithmetic():
    import datetime

    from bson import Decimal128
    before = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    out = apply_update({"_id": 1}, {"$currentDate": {"at": True, "b.at": {"$type": "date"}}})
    assert out["at"] == out["b"]["at"] and out["at"].microsecond % 1000 == 0
    assert before - datetime.timedelta(seconds=1) <= out["at"] <= datetime.datetime.now(
        datetime.timezone.utc).replace(tzinfo=None)
    import time

    from bson import Timestamp
    out = apply_update({"_id": 1}, {"$currentDate": {"t": {"$type": "timestamp"}, "u": {
        "$type": "timestamp"}, "f": False}})
    assert isinstance(out["t"], Timestamp) and abs(out["t"].time - time.time()) < 5
    assert out["t"] < out["u"] and isinstance(out["f"], datetime.datetime)
    with pytest.raises(InvalidUpdate, match="timestamp"):
        apply_update({"_id": 1}, {"$currentDate": {"t": {"$type": "long"}}})
    d = {"_id": 1, "a": [3, 1, 2], "s": [{"k": 2}, {"k": 1}], "b": 5,
         "m": Decimal128("1.10")}
    assert apply_update(d, {"$push": {"a": {"$each": [9, 0], "$sort": 1, "$slice": 3}}})["a"] \
        == [0, 1, 2]
    assert apply_update(d, {"$push": {"a": {"$each": [], "$sort": -1}}})["a"] == [3, 2, 1]
    assert apply_update(d, {"$push": {"s": {"$each": [{"k": 0}], "$sort": {"k": 1}}}})["s"] \
        == [{"k": 0}, {"k": 1}, {"k": 2}]
    assert apply_update(d, {"$pullAll": {"a": [1, 3, 7]}})["a"] == [2]
    assert apply_update(d, {"$bit": {"b": {"and": 4, "or": 2}}})["b"] == 6
    assert apply_update(d, {"$inc": {"m": Decimal128("0.05")}})["m"] == Decimal128("1.15")
    assert apply_update(d, {"$inc": {"m": 1}})["m"] == Decimal128("2.10")
    assert apply_update(d, {"$mul": {"b": Decimal128("0.5")}})["b"] == Decimal128("2.5")
    assert d["a"] == [3, 1, 2] and d["m"] == Decimal128("1.10")  # the input is not changed
    for bad in ({"$push": {"a": {"$each": [1], "$sort": 0}}}, {"$pullAll": {"a": 1}},
                {"$bit": {"b": {"nand": 1}}}, {"$bit": {"a": {"and": 1}}}):
        with pytest.raises(InvalidUpdate):
            apply_update(d, bad)
