"""MongoDB's value types stored natively (raymx.storage.types): datetime,
ObjectId, Decimal128, UUID, Int64, Timestamp, Regex, MinKey, MaxKey and Code round-trip, are indexed, queried and sorted in
MongoDB's cross-type order, and survive the oplog (replay on another engine)."""
import datetime
import json
import re
import uuid

import pytest
from bson import Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp

from raymx import errors
from raymx.storage import codec
from raymx.storage.engine import Engine, Stats
from raymx.storage.keys import encode_key
from raymx.storage.store import MemoryStore

NS = "db.t"
T0 = datetime.datetime(2026, 11, 25, 6, 0, 0, 123000)


def test_each_type_round_trips_through_the_codec():
    doc = {"at": T0, "oid": ObjectId(), "dec": Decimal128("12.3456789012345678901234"),
           "u": uuid.uuid4(), "nested": [{"at": T0}], "aware": T0.replace(
               tzinfo=datetime.timezone(datetime.timedelta(hours=2)))}
    back = codec.unpack(codec.pack_document(doc, 1 << 20))
    assert back["oid"] == doc["oid"] and back["dec"] == doc["dec"] and back["u"] == doc["u"]
    assert back["at"] == T0 and back["nested"] == [{"at": T0}]
    assert back["aware"] == T0 - datetime.timedelta(hours=2)  # stored as UTC, read naive UTC
    # millisecond precision, as MongoDB
    assert codec.unpack(codec.pack_document({"t": T0.replace(microsecond=123456)}, 1 << 20)) \
        == {"t": T0}


def test_unknown_types_are_still_refused_by_name():
    with pytest.raises(errors.InvalidDocument, match="field x: type complex"):
        codec.pack_document({"x": 1j}, 1 << 20)


def test_a_dbref_is_stored_as_its_map_queried_and_indexed(engine):
    """pymongo decodes ``{"$ref", "$id"}`` maps into DBRefs (ODMs store
    references so): stored as that map, found by the DBRef or by its
    ``$id``, with or without an index."""
    from bson.dbref import DBRef
    ref, other = DBRef("users", ObjectId()), DBRef("users", 8, "app", note="x")
    engine.insert_many(NS, [{"_id": 1, "owner": ref}, {"_id": 2, "owner": other},
                            {"_id": 3, "owners": [ref]}])
    assert engine.find(NS, {"_id": 2})[0]["owner"] == {"$ref": "users", "$id": 8,
                                                       "$db": "app", "note": "x"}
    for indexed in (False, True):
        if indexed:
            with engine.begin() as tx:
                tx.create_index(NS, "owner")
        assert [d["_id"] for d in engine.find(NS, {"owner": ref})] == [1]
        assert [d["_id"] for d in engine.find(NS, {"owner": {"$in": [other]}})] == [2]
        assert [d["_id"] for d in engine.find(NS, {"owner.$id": 8})] == [2]
        assert [d["_id"] for d in engine.find(NS, {"owners": ref})] == [3]
    with pytest.raises(errors.InvalidDocument, match=r"field owner.\$id: type complex"):
        codec.pack_document({"owner": DBRef("users", 1j)}, 1 << 20)


def test_binary_subtypes_keep_their_subtype_and_are_found(engine):
    """A Binary of a subtype other than 0 and 4 is stored with it (msgpack
    alone would store its bytes and drop the subtype); subtype 0 is bytes
    and 4 of 16 bytes a UUID, as pymongo reads them."""
    from bson.binary import Binary
    vals = [Binary(b"\x00ab", 5), Binary(b"0123456789abcdef", 3), Binary(b"x", 0x80),
            Binary(b"raw", 0), Binary(uuid.UUID(int=7).bytes, 4)]
    back = codec.unpack(codec.pack_document({"v": vals}, 1 << 20))["v"]
    assert [type(x) for x in back] == [Binary, Binary, Binary, bytes, uuid.UUID]
    assert [(x.subtype, bytes(x)) for x in back[:3]] == [(x.subtype, bytes(x)) for x in vals[:3]]
    assert back[3:] == [b"raw", uuid.UUID(int=7)]
    engine.insert_many(NS, [{"_id": i, "b": v} for i, v in enumerate(vals)])
    for indexed in (False, True):
        if indexed:
            with engine.begin() as tx:
                tx.create_index(NS, "b")
        assert [d["_id"] for d in engine.find(NS, {"b": Binary(b"\x00ab", 5)})] == [0]
        assert engine.find(NS, {"b": b"\x00ab"}) == []  # another subtype: another value
        assert [d["_id"] for d in engine.find(NS, {"b": Binary(b"raw", 0)})] == [3]
        assert [d["_id"] for d in engine.find(NS, {"b": uuid.UUID(int=7)})] == [4]
    assert [d["_id"] for d in engine.find(NS, {"b": {"$type": "binData"}})] == [0, 1, 2, 3, 4]
    # tuples, named tuples (a GTID) and subclasses pack to the same bytes as
    # before the packer checked types exactly
    import collections
    import enum

    import msgpack

    from raymx.storage.gtid import GTID

    class Level(enum.IntEnum):
        HIGH = 3
    mixed = {"g": GTID(1, 2), "t": (1, [2, (3,)]), "e": Level.HIGH,
             "o": collections.OrderedDict(a=1.5), "s": [GTID(4, 5)]}
    assert codec.pack(mixed) == msgpack.packb(mixed, use_bin_type=True)


def test_cross_type_order_is_mongodbs():
    from bson.binary import Binary
    ordered = [MinKey(), None, -1, Decimal128("0.5"), Int64(2), 3, "a", {"a": 1}, [1], b"\x00",
               b"\xff", Binary(b"\xff", 3), Binary(b"\x00", 5), uuid.UUID(int=0),
               ObjectId(b"\x00" * 12), False, True, datetime.datetime(1960, 1, 1), T0,
               Timestamp(1, 5), Timestamp(2, 0), Regex("a", "i"), Regex("b"), Code("a"),
               Code("b"), MaxKey()]
    keys = [encode_key(v) for v in ordered]
    assert keys == sorted(keys)
    assert encode_key(Decimal128("2")) == encode_key(2) == encode_key(2.0) == encode_key(Int64(2))
    assert encode_key(Decimal128("2.50")) == encode_key(Decimal128("2.5")) == encode_key(2.5)
    assert encode_key(Regex("a", "i")) == encode_key(Regex("a", re.I)) != encode_key(Regex("a"))


def test_the_other_bson_types_are_stored_queried_and_replayed(engine):
    """Int64 keeps its width (a long stays a long through $inc and $bit, and
    a plain int makes one when it meets a long); Timestamp, Regex (a compiled
    pattern is stored as one), MinKey, MaxKey and Code round-trip, match by
    value, by range within their bracket and by ``$type``, and survive the
    oplog. A Code with a scope and an Int64 past 64 bits are refused."""
    docs = [{"_id": 1, "v": Int64(5)}, {"_id": 2, "v": 5}, {"_id": 3, "v": Timestamp(7, 1)},
            {"_id": 4, "v": re.compile("^x", re.I)}, {"_id": 5, "v": MinKey()},
            {"_id": 6, "v": MaxKey()}, {"_id": 7, "v": Code("return 1")}]
    engine.insert_many(NS, docs)
    back = {d["_id"]: d["v"] for d in engine.find(NS, {})}
    assert type(back[1]) is Int64 and type(back[2]) is int and back[3] == Timestamp(7, 1)
    assert back[4] == Regex("^x", re.I | re.U) and type(back[7]) is Code
    assert [d["_id"] for d in engine.find(NS, {"v": 5})] == [1, 2]
    assert [d["_id"] for d in engine.find(NS, {"v": {"$type": "long"}})] == [1]
    assert [d["_id"] for d in engine.find(NS, {"v": {"$lt": Timestamp(8, 0)}})] == [3]
    assert [d["_id"] for d in engine.find(NS, {"v": {"$type": ["minKey", "maxKey"]}})] == [5, 6]
    assert [d["_id"] for d in engine.find(NS, {"v": Code("return 1")})] == [7]
    assert [d["_id"] for d in engine.find(NS, sort=[["v", -1], ["_id", 1]])] == [
        6, 7, 4, 3, 1, 2, 5]
    tx = engine.begin(autocommit=True)
    tx.update(NS, {"_id": 1}, {"$inc": {"v": 1}})
    tx.update(NS, {"_id": 2}, {"$inc": {"v": Int64(1)}, "$bit": {"b": {"or": Int64(2)}}})
    tx.commit()
    got = {d["_id"]: d for d in engine.find(NS, {"_id": {"$in": [1, 2]}})}
    assert [(x, type(x)) for x in (got[1]["v"], got[2]["v"], got[2]["b"])] == [
        (6, Int64), (6, Int64), (2, Int64)]
    other = Engine(MemoryStore())
    for _, e in engine.read_oplog():
        other.apply_entry(e["ops"])
    assert other.find(NS, {}) == engine.find(NS, {})
    assert [type(d["v"]) for d in other.find(NS, {})] == [type(d["v"]) for d in
                                                          engine.find(NS, {})]
    # a regex in a filter finds strings, and the same regex stored (MongoDB's rule)
    engine.insert_many(NS, [{"_id": 8, "v": "Xylophone"}])
    assert [d["_id"] for d in engine.find(NS, {"v": re.compile("^x", re.I)})] == [4, 8]
    assert [d["_id"] for d in engine.find(NS, {"v": {"$regex": "^x"}})] == []
    with pytest.raises(errors.InvalidDocument, match="scope"):
        engine.insert_many(NS, [{"c": Code("f", {"x": 1})}])
    with pytest.raises(errors.InvalidDocument, match="64 bits"):
        engine.insert_many(NS, [{"c": Int64(1 << 63)}])
    # a long's $inc or $mul past 64 signed bits: MongoDB's refusal, nothing changed
    engine.insert_many(NS, [{"_id": 9, "v": Int64((1 << 63) - 1)}])
    for upd in ({"$inc": {"v": 1}}, {"$mul": {"v": 2}}):
        tx = engine.begin(autocommit=True)
        with pytest.raises(errors.UpdateOverflow, match=r"Failed to apply \$(inc|mul) operations "
                           r"to current value \(\(NumberLong\)9223372036854775807\) for "
                           r"document \{_id: 9\}"):
            tx.update(NS, {"_id": 9}, upd)
        tx.abort()
    assert engine.find(NS, {"_id": 9}) == [{"_id": 9, "v": (1 << 63) - 1}]


def test_min_key_and_max_key_bound_every_type(engine):
    """A comparison with MinKey or MaxKey spans every type, as MongoDB's
    matcher: {"$gte": MinKey} and {"$lte": MaxKey} hold any value (a missing
    one too), {"$gt": MinKey} all but MinKey, {"$lte": MinKey} only MinKey; a
    bracketed bound beside one keeps its bracket. Answered the same over the
    _id, over an index and over a scan: partitions bounded so (as MongoDB's
    Spark connector asks for them) cover the collection once."""
    vals = [1, "s", None, [], [1, "x"], MinKey(), MaxKey(), float("nan"), {"k": 1},
            ObjectId(b"\x01" * 12), datetime.datetime(2020, 1, 1)]
    docs = [{"_id": i, "v": v, "w": v} for i, v in enumerate(vals)] + [{"_id": 99}]
    engine.insert_many(NS, docs)
    with engine.begin() as tx:
        tx.create_index(NS, "w")
    everything = [d["_id"] for d in docs]
    for path in ("v", "w"):  # a scan, an index
        def ids(cond):
            return sorted(d["_id"] for d in engine.find(NS, {path: cond}))
        assert ids({"$gte": MinKey()}) == ids({"$lte": MaxKey()}) == everything
        assert ids({"$gt": MinKey()}) == [i for i in everything if i != 5]
        assert ids({"$lt": MaxKey()}) == [i for i in everything if i != 6]
        assert ids({"$lte": MinKey()}) == [5] and ids({"$gte": MaxKey()}) == [6]
        assert ids({"$lt": MinKey()}) == ids({"$gt": MaxKey()}) == []
        assert ids({"$gte": MinKey(), "$lt": 5}) == [0, 4]  # 1, and [1, "x"] through 1
    parts = [[d["_id"] for d in engine.find(NS, {"_id": {"$gte": lo, "$lt": hi}})]
             for lo, hi in ((MinKey(), 3), (3, 7), (7, MaxKey()))]
    assert parts == [[0, 1, 2], [3, 4, 5, 6], [7, 8, 9, 10, 99]]
    for path in ("v", "w"):  # split at a string: the other side keeps to strings
        parts = [sorted(d["_id"] for d in engine.find(NS, {path: {"$gte": lo, "$lt": hi}}))
                 for lo, hi in ((MinKey(), "s"), ("s", MaxKey()))]
        assert parts == [[], [1, 4]]  # no string below "s"; "s", and "x" of [1, "x"]


def test_index_query_sort_and_unique(engine):
    oids = [ObjectId() for _ in range(20)]
    docs = [{"_id": oids[i], "at": T0 + datetime.timedelta(minutes=i), "price": Decimal128(f"{i}.5"),
             "u": uuid.UUID(int=i)} for i in range(20)]
    engine.insert_many(NS, docs)
    with engine.begin() as tx:
        tx.create_index(NS, "at")
        tx.create_index(NS, "u", unique=True)
    st = Stats()
    got = list(engine.reader().find(NS, {"at": {"$gte": T0 + datetime.timedelta(minutes=15)}},
                                    stats=st))
    assert sorted(d["_id"] for d in got) == oids[15:] and st.plan == "IXSCAN at_1"
    assert engine.find(NS, {"_id": oids[3]})[0]["price"] == Decimal128("3.5")
    assert [d["u"] for d in engine.find(NS, {"price": {"$lt": 2}})] == [uuid.UUID(int=0),
                                                                      uuid.UUID(int=1)]
    assert [d["_id"] for d in engine.find(NS, sort=[["at", -1]], limit=2)] == oids[:-3:-1]
    assert [d["_id"] for d in engine.find(NS, sort=[["_id", 1]])] == sorted(oids)
    with pytest.raises(errors.DuplicateKey):
        engine.insert_many(NS, [{"u": uuid.UUID(int=4)}])
    # dates never match a number (type brackets, as MongoDB)
    assert engine.find(NS, {"at": {"$gt": 0}}) == []


# around the double 0.1 (0.1000000000000000055511151231257827021...): three
# values MongoDB tells apart, which a key by the nearest double merged
BELOW, ABOVE = Decimal128("0.1"), Decimal128("0.1000000000000000055511151231257828")


def test_decimal128_keys_are_exact_as_mongodbs_comparisons():
    """Numbers order and compare by their exact values, a Decimal128 among the
    doubles and integers (random values of every magnitude, and the
    neighbours of each: the decimal of a double, half a step past an
    integer beyond 2**53), and a key ends where the next field's begins."""
    import decimal
    import math
    import random
    from fractions import Fraction

    from raymx.storage.keys import value_end
    rnd = random.Random(7)
    vals = [0.1, BELOW, ABOVE, Decimal128("-0.1"), -0.1, Decimal128("1E-6176"),
            Decimal128("-9.999999999999999999999999999999999E+6144"), Decimal128("Infinity")]
    for _ in range(1500):
        n = rnd.randrange(-(1 << 63), 1 << 64)
        f = rnd.uniform(-1e6, 1e6) * rnd.choice([1, 1e-300, 1e250])
        vals += [n, f, Decimal128(f"{n}.5"), Decimal128(repr(f)), math.nextafter(f, math.inf),
                 Decimal128(decimal.Decimal(repr(f)) + decimal.Decimal("1E-24")),
                 Decimal128(f"{rnd.randrange(1, 10 ** 34)}E{rnd.randrange(-6176, 6111)}")]
    def value(v):
        x = v.to_decimal() if type(v) is Decimal128 else decimal.Decimal(v)
        return Fraction(x) if x.is_finite() else Fraction(10) ** 7000 * (1 if x > 0 else -1)

    exact = [(encode_key(v), value(v), v) for v in vals]
    ordered = sorted(exact, key=lambda x: x[0])
    for (k1, x1, v1), (k2, x2, v2) in zip(ordered, ordered[1:]):
        assert x1 < x2 or (x1 == x2 and k1 == k2), (v1, v2)
    for k, x, v in exact[:400]:  # a number's keys, whatever follows, stay below value_end
        assert k + b"\x7f" < value_end(k, k)
        assert all((k2 >= value_end(k, k)) == (x2 > x) for k2, x2, _ in exact[-300:])
    assert encode_key(BELOW) < encode_key(0.1) < encode_key(ABOVE)
    assert encode_key(Decimal128("NaN")) == encode_key(Decimal128("sNaN")) == encode_key(math.nan)


@pytest.mark.parametrize("indexed", [False, True])
def test_decimals_a_double_cannot_tell_apart_are_distinct_values(engine, indexed):
    """As in MongoDB: a double matches only what equals it exactly, so 0.1
    finds the double and neither decimal around it; ranges bounded by the
    double keep the decimals on their side (the index bounds too); a unique
    index and the _id hold each value once."""
    engine.insert_many(NS, [{"_id": 1, "v": 0.1}, {"_id": 2, "v": BELOW},
                            {"_id": 3, "v": ABOVE}, {"_id": 4, "v": Decimal128("0.10")}])
    if indexed:
        with engine.begin() as tx:
            tx.create_index(NS, "v")
    ids = lambda flt: sorted(d["_id"] for d in engine.find(NS, flt))  # noqa: E731
    assert ids({"v": 0.1}) == [1]
    assert ids({"v": BELOW}) == ids({"v": Decimal128("0.1000")}) == [2, 4]
    assert ids({"v": {"$gt": 0.1}}) == [3] and ids({"v": {"$gte": 0.1}}) == [1, 3]
    assert ids({"v": {"$lt": 0.1}}) == [2, 4] and ids({"v": {"$lte": 0.1}}) == [1, 2, 4]
    assert ids({"v": {"$gt": BELOW, "$lt": ABOVE}}) == [1]
    assert ids({"v": {"$in": [0.1, ABOVE]}}) == [1, 3]
    assert [d["_id"] for d in engine.find(NS, sort=[["v", 1], ["_id", 1]])] == [2, 4, 1, 3]
    with engine.begin() as tx:
        tx.create_index(NS + "u", "v", unique=True)
    engine.insert_many(NS + "u", [{"v": 0.1}, {"v": BELOW}, {"v": ABOVE}])
    with pytest.raises(errors.DuplicateKey):
        engine.insert_many(NS + "u", [{"v": Decimal128("0.100")}])
    engine.insert_many(NS + "i", [{"_id": BELOW}, {"_id": ABOVE}, {"_id": 0.1}])
    assert engine.find(NS + "i", {"_id": ABOVE}) == [{"_id": ABOVE}]
    with pytest.raises(errors.DuplicateKey):
        engine.insert_many(NS + "i", [{"_id": Decimal128("0.10")}])


@pytest.mark.parametrize("old_format", [1, 2])
def test_a_store_of_an_older_format_gets_the_keys_of_today_when_opened(tmp_path, old_format,
                                                                      caplog, monkeypatch):
    """A store written when a Decimal128 was keyed by its nearest double, a
    map's fields by name before type and binary bytewise by subtype bracket
    (format 1; format 2 kept only the binary keys) and marked with either
    format: opened now, its documents move to their new keys and its indexes
    are built again, so what it holds is what the same writes make today,
    and the term stays."""
    from raymx.storage import keys
    from raymx.storage.catalog import CollInfo
    from raymx.storage.engine import FORMAT
    from raymx.storage.lmdb_store import LMDBStore
    docs = [{"_id": BELOW, "v": ABOVE, "w": [1, {"d": BELOW}]}, {"_id": 2, "v": 0.1},
            {"_id": 3, "v": BELOW}, {"_id": 7, "v": Decimal128("2.5"), "w": 1},
            {"_id": {"s": "x", "n": 1}, "v": {"b": 1, "a": "s"}}, {"_id": {"n": 1}, "v": {"a": "s"}},
            {"_id": b"\x01\x02", "v": uuid.UUID(int=5)}, {"_id": b"\xff", "v": b"\x00\x00"}]

    def write(e):
        with e.begin() as tx:
            tx.create_index(NS, "v")
            tx.create_index(NS, [("w", 1), ("v", -1)])
        e.insert_many(NS, docs)
        e.insert_many("db.plain", [{"_id": i, "x": i} for i in range(5)])
        e.set_term(3)

    def old_key(v):  # format 1's keys
        if type(v) is Decimal128:
            return keys._num(float(v.to_decimal()))
        if type(v) is dict:
            return bytes((keys.T_MAP,)) + b"".join(
                keys._escaped(keys.T_STR, k.encode()) + old_key(x) for k, x in v.items()) + keys.END
        if type(v) is list:
            return bytes((keys.T_ARR,)) + b"".join(map(old_key, v)) + keys.END
        if type(v) is bytes:
            return keys._escaped(keys.T_BIN, v)
        if type(v) is uuid.UUID:
            return b"\x54" + v.bytes
        return encode_key(v)

    s = LMDBStore(str(tmp_path / "old"), map_bytes=1 << 26)
    write(Engine(s))
    with s.write() as t:  # the rows as format 1 wrote them
        c = CollInfo.from_record(NS, t.get("catalog", NS.encode()))
        for k, v in list(t.scan("docs", c.prefix, keys.prefix_end(c.prefix))):
            t.delete("docs", k)
            t.put("docs", c.prefix + old_key(codec.unpack_document(v)["_id"]), v)
        ix = c.indexes["v_1"]
        for k, pk in list(t.scan("index", ix.prefix, keys.prefix_end(ix.prefix))):
            t.delete("index", k)
        for d in docs:
            t.put("index", ix.prefix + old_key(d["v"]) + old_key(d["_id"]), old_key(d["_id"]))
        t.put("meta", b"format", codec.pack(old_format))
    assert old_key(docs[4]["_id"]) != encode_key(docs[4]["_id"])
    s.close()
    s = LMDBStore(str(tmp_path / "old"), map_bytes=1 << 26)
    from raymx.storage import engine as engine_mod
    monkeypatch.setattr(engine_mod, "UPGRADE_PROGRESS_S", 0.0)  # every progress point logs
    with caplog.at_level("WARNING", logger="raymx.storage.engine"):
        e = Engine(s)
    said = [r.getMessage() for r in caplog.records]
    assert said[0].startswith(f"store format {old_format} -> {FORMAT}: re-keying 13 document(s)")
    assert f"store format {old_format} -> {FORMAT}: rebuilding the indexes of {NS}, 0 of 8 " \
        "document(s)" in said  # long work shows its progress
    assert e.find(NS, {"_id": BELOW})[0]["v"] == ABOVE  # format 1 keyed it as 0.1
    assert e.find(NS, {"_id": {"s": "x", "n": 1}})[0]["v"] == {"b": 1, "a": "s"}
    assert e.find(NS, {"_id": b"\x01\x02"})[0]["v"] == uuid.UUID(int=5)
    assert [d["_id"] for d in e.find(NS, {"v": {"$type": "binData"}}, sort=[["v", 1]])] \
        == [b"\xff", b"\x01\x02"]  # by length first: 2 bytes < a UUID's 16
    assert [d["_id"] for d in e.find(NS, {"v": {"$gt": 0.1, "$lt": 5}}, sort=[["v", 1]])] \
        == [BELOW, 7]
    assert [d["_id"] for d in e.find(NS, {"v": {"$type": "object"}}, sort=[["v", 1]])] \
        == [{"s": "x", "n": 1}, {"n": 1}]
    now = Engine(MemoryStore())
    write(now)
    assert e.snapshot_state() == now.snapshot_state() and e.term == 3
    with s.read() as t:
        assert codec.unpack(t.get("meta", b"format")) == FORMAT
    s.close()


def test_binary_compares_as_bindata_by_length_then_subtype_then_bytes(engine):
    """MongoDB's BinData order, UUIDs (subtype 4) among them: the length
    first, then the subtype, then the bytes; a range on binary reaches every
    subtype (one type bracket, as in MongoDB)."""
    from bson.binary import Binary
    ordered = [b"", b"\xff", Binary(b"\x00", 3), Binary(b"\x00", 128), b"\x00\x00",
               b"\x00" * 15 + b"\xff", uuid.UUID(int=0), uuid.UUID(int=1), Binary(b"\x00" * 16, 5),
               b"\x00" * 17]
    ks = [encode_key(v) for v in ordered]
    assert ks == sorted(ks) and len(set(ks)) == len(ks)
    assert encode_key(Binary(b"ab", 0)) == encode_key(b"ab")
    assert encode_key(Binary(uuid.UUID(int=7).bytes, 4)) == encode_key(uuid.UUID(int=7))
    engine.insert_many(NS, [{"_id": i, "b": v} for i, v in enumerate(ordered)])
    for indexed in (False, True):
        got = [d["_id"] for d in engine.find(NS, {"b": {"$gt": b"\x00\x00"}}, sort=[["b", 1]])]
        assert got == [5, 6, 7, 8, 9]
        if not indexed:
            with engine.begin() as tx:
                tx.create_index(NS, "b")


def test_maps_compare_by_each_fields_type_then_name_then_value():
    """MongoDB's order of objects: field by field, the values' types first,
    then the names, then the values; a prefix first."""
    ordered = [{}, {"b": 1}, {"b": 1, "a": None}, {"b": 1, "a": 5}, {"z": 0}, {"a": "x"},
               {"a": {"b": 1}}, {"a": [1]}, {"c": True}]
    keys = [encode_key(v) for v in ordered]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert encode_key({"a": 1.0, "b": Int64(2)}) == encode_key({"a": 1, "b": 2})
    assert encode_key({"a\x00b": 1}) > encode_key({"a": 1})


def test_oplog_replays_the_types_on_another_member(engine):
    doc = {"_id": ObjectId(), "at": T0, "d": Decimal128("1E+10"), "u": uuid.uuid4()}
    engine.insert_many(NS, [doc])
    tx = engine.begin(autocommit=True)
    tx.update(NS, {"_id": doc["_id"]}, {"$set": {"at2": T0}})
    tx.commit()
    other = Engine(MemoryStore())
    for _, e in engine.read_oplog():
        other.apply_entry(e["ops"])
    assert other.find(NS, {"_id": doc["_id"]}) == [dict(doc, at2=T0)]


def test_arrow_mapping_both_ways():
    """Spark sees timestamp and decimal columns, ObjectId/UUID as text; written
    back, timestamps, dates and decimals are stored as datetime and Decimal128."""
    import decimal

    import pyarrow as pa

    from raymx.spark_bridge import convert
    oid, u = ObjectId(), uuid.uuid4()
    docs = [{"_id": oid, "at": T0, "price": Decimal128("12.25"), "u": u},
            {"_id": ObjectId(), "at": T0, "price": Decimal128("1"), "u": uuid.uuid4()}]
    schema = convert.infer_schema(docs)
    assert schema.field("at").type == pa.timestamp("us", tz="UTC")
    assert schema.field("price").type == pa.decimal128(38, 18)
    assert schema.field("_id").type == pa.string() and schema.field("u").type == pa.string()
    t = convert.docs_to_table(docs, schema)
    row = t.to_pylist()[0]
    assert row["_id"] == str(oid) and row["u"] == str(u)
    from bson.binary import Binary  # a binary column; the subtype stays in JSON only
    bins = [{"b": Binary(b"\x00z", 5)}, {"b": b"raw"}]
    assert convert.docs_to_table(bins, convert.infer_schema(bins)).column("b").to_pylist() \
        == [b"\x00z", b"raw"]
    assert json.loads(convert.to_json(bins[0]))["b"] == {"$binary": {"base64": "AHo=",
                                                                   "subType": "05"}}
    from raymx.storage import archive
    assert archive._from_json(convert.to_json(bins[0]))["b"] == Binary(b"\x00z", 5)
    assert row["price"] == decimal.Decimal("12.25")
    assert row["at"] == T0.replace(tzinfo=datetime.timezone.utc)
    back = convert.table_to_docs(pa.table({
        "at": pa.array([T0], pa.timestamp("us", tz="UTC")),
        "day": pa.array([datetime.date(2026, 11, 25)], pa.date32()),
        "d": pa.array([decimal.Decimal("3.50")], pa.decimal128(10, 2))}))
    stored = codec.unpack(codec.pack_document(back[0], 1 << 20))
    assert stored == {"at": T0, "day": datetime.datetime(2026, 11, 25),
                      "d": Decimal128("3.50")}
    others = [{"n": Int64(5), "ts": Timestamp(7, 1), "re": Regex("^a", "i"), "k": MinKey(),
               "js": Code("f()")}, {"n": 6, "ts": Timestamp(8, 0), "re": Regex("b"),
                                    "k": MaxKey(), "js": Code("g()")}]
    sch = convert.infer_schema(others)
    assert sch.field("n").type == pa.int64() and {sch.field(f).type for f in (
        "ts", "re", "k", "js")} == {pa.string()}
    assert convert.docs_to_table(others, sch).to_pylist()[0] == {"_id": None,
        "n": 5, "ts": '{"$timestamp":{"t":7,"i":1}}',
        "re": '{"$regularExpression":{"pattern":"^a","options":"i"}}', "k": '{"$minKey":1}',
        "js": "f()"}
    assert convert.to_json({"at": T0, "o": oid}) == \
        '{"at":{"$date":"2026-11-25T06:00:00.123Z"},"o":{"$oid":"%s"}}' % oid
