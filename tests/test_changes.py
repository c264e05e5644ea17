"""Change events from the oplog (pure core of change streams)."""
import pytest

from raymx import errors
from raymx.storage import changes, oplog
from raymx.storage.gtid import GTID, ZERO

ALL = changes.Filter()


def setup(engine):
    engine.set_term(1)
    engine.insert_many("db.a", [{"_id": 1, "v": 1}])                  # 1:1 (create + insert)
    with engine.begin() as tx:                                         # 1:2 a transaction
        tx.update("db.a", {"_id": 1}, {"$set": {"v": 2}})
        tx.insert("db.b", [{"_id": "x"}, {"_id": "y"}])
        tx.delete("db.a", {"_id": 1})
    with engine.begin() as tx:                                         # 1:3
        tx.create_index("other.c", "k")


def test_events_format_order_and_tokens(engine):
    setup(engine)
    out = changes.scan(engine, (0, 0), GTID(1, 3), ALL, 100)
    evs = out["events"]
    assert [(e["op"], e["ns"], e["_id"]) for e in evs] == [
        ("create", "db.a", None), ("insert", "db.a", 1),
        ("update", "db.a", 1), ("create", "db.b", None), ("insert", "db.b", "x"),
        ("insert", "db.b", "y"), ("delete", "db.a", 1),
        ("create", "other.c", None), ("createIndex", "other.c", None)]
    up = evs[2]
    assert up["pre"] == {"_id": 1, "v": 1} and up["post"] == {"_id": 1, "v": 2}
    assert up["gtid"] == [1, 2] and up["token"] == [1, 2, 0] and isinstance(up["ts"], int)
    assert evs[-1]["index"] == {"name": "k_1", "key": [["k", 1]], "unique": False}
    assert out["resume"] == [1, 3]
    # resume in the middle of the transaction: exactly the rest
    rest = changes.scan(engine, tuple(evs[4]["token"]), GTID(1, 3), ALL, 100)["events"]
    assert rest == evs[5:]
    # a batch limit splits a big entry at an op, and the token says where
    part = changes.scan(engine, (1, 1), GTID(1, 3), ALL, 2)
    assert len(part["events"]) == 2 and part["resume"] == [1, 2, 1]
    nxt = changes.scan(engine, tuple(part["resume"]), GTID(1, 3), ALL, 100)["events"]
    assert part["events"] + nxt == evs[2:]


def test_a_replacement_is_a_replace_event_and_undoes_as_one(engine):
    """A replacement's op says so ("r"): its event is ``replace``, as
    MongoDB's; an operator update, a merge and an upsert's insert are not."""
    engine.set_term(1)
    engine.insert_many("db.r", [{"_id": i, "v": i} for i in range(4)])
    with engine.begin() as tx:
        tx.update("db.r", {"_id": 0}, {"_id": 0, "w": 1}, replace=True)
        tx.update("db.r", {"_id": 1}, {"$set": {"v": 9}})
        tx.replace_many("db.r", [{"_id": 2, "w": 2}, {"_id": 9, "w": 9}], upsert=True)
        tx.replace_many("db.r", [{"_id": 3, "w": 3}], merge=True)
        tx.update("db.r", {"_id": 1}, {"_id": 1, "x": 1}, replace=True, computed=True)
    evs = changes.scan(engine, (1, 1), GTID(1, 2), ALL, 100)["events"]
    assert [(e["op"], e["_id"]) for e in evs] == [
        ("replace", 0), ("update", 1), ("replace", 2), ("insert", 9), ("update", 3),
        ("update", 1)]
    assert evs[0]["pre"] == {"_id": 0, "v": 0} and evs[0]["post"] == {"_id": 0, "w": 1}
    f = changes.Filter(None, ["replace"])
    assert [e["_id"] for e in changes.scan(engine, (0, 0), GTID(1, 2), f, 100)["events"]] \
        == [0, 2]
    entry = dict(engine.read_oplog())[GTID(1, 2)]
    rep = entry["ops"][0]
    assert rep["r"] is True and oplog.invert(rep) == {**rep, "pre": rep["post"],
                                                      "post": rep["pre"]}
    oplog.check_op(rep, "here")
    with pytest.raises(errors.CorruptEntry):
        oplog.check_op({**rep, "r": 1}, "here")


def test_gate_filters_and_high_water_mark(engine):
    setup(engine)
    out = changes.scan(engine, (0, 0), GTID(1, 1), ALL, 100)
    assert len(out["events"]) == 2 and out["resume"] == [1, 1]  # nothing past the gate
    f = changes.Filter(["other"], None)
    out = changes.scan(engine, (1, 1), GTID(1, 2), f, 100)
    assert out == {"events": [], "resume": [1, 2]}  # filtered out, token still moves
    f = changes.Filter(["db.b"], ["insert"])
    assert [e["_id"] for e in changes.scan(engine, (0, 0), GTID(1, 3), f, 100)["events"]] \
        == ["x", "y"]
    assert changes.scan(engine, (1, 3), GTID(1, 3), ALL, 100) == {"events": [], "resume": [1, 3]}
    assert changes.scan(engine, (1, 3), None, ALL, 100)["resume"] == [1, 3]
    with pytest.raises(errors.InvalidOperation):
        changes.Filter(None, ["explode"])
    with pytest.raises(errors.InvalidOperation):
        changes.parse_token("nope")


def test_trimmed_and_rolled_back_tokens(engine):
    setup(engine)
    engine.insert_many("db.a", [{"_id": 9}])  # 1:4
    engine.trim_oplog(None, 1, None, 2)        # first is 1:3 now
    with pytest.raises(errors.OplogTrimmed) as ei:
        changes.scan(engine, (1, 1), GTID(1, 4), ALL, 100)
    assert ei.value.info["oldest"] == [1, 3] and "1:3" in str(ei.value)
    with pytest.raises(errors.OplogTrimmed):
        changes.scan(engine, (1, 2, 0), GTID(1, 4), ALL, 100)  # needs the rest of 1:2
    assert len(changes.scan(engine, (1, 2), GTID(1, 4), ALL, 100)["events"]) == 3
    with pytest.raises(errors.Diverged):
        changes.scan(engine, (7, 3), GTID(1, 4), ALL, 100)
    # a token past this member's end (it is behind): nothing yet, no error
    assert changes.scan(engine, (1, 9), GTID(1, 4), ALL, 100) == {"events": [],
                                                                  "resume": [1, 9]}
    assert ZERO == GTID(0, 0)
