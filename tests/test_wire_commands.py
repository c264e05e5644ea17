"""The MongoDB wire port's commands beyond CRUD, with the real pymongo:
renameCollection, sparse and partial indexes, validate, dbHash,
currentOp and the host's facts (a member served in process)."""

import pytest
from bson import Timestamp
from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError, OperationFailure, WriteError

from raymx.storage.limits import Limits
from tests.port_helpers import serving
from tests.test_wire import client, served  # noqa: F401 (the fixtures)


def test_db_hash_host_info_list_commands_and_database_sizes(client):
    from raymx.wire import commands, crud
    db = client.hashes
    db.a.insert_many([{"_id": i, "v": "x" * i} for i in range(50)])
    db.b.insert_one({"_id": "only"})
    h1 = db.command("dbHash")
    assert set(h1["collections"]) == {"a", "b"} and len(h1["md5"]) == 32
    assert db.command("dbHash", collections=["b"])["collections"] == {
        "b": h1["collections"]["b"]}
    assert db.command("dbHash")["md5"] == h1["md5"]  # the same data, the same hash
    db.a.update_one({"_id": 3}, {"$set": {"v": "changed"}})
    h2 = db.command("dbHash")
    assert h2["collections"]["a"] != h1["collections"]["a"]
    assert h2["collections"]["b"] == h1["collections"]["b"] and h2["md5"] != h1["md5"]
    info = client.admin.command("hostInfo")
    assert info["system"]["numCores"] >= 1 and info["os"]["type"]
    names = client.admin.command("listCommands")["commands"]
    assert {"find", "aggregate", "dbHash", "listCommands"} <= set(names)
    assert {n.lower() for n in commands.COMMAND_NAMES} == \
        set(commands.COMMANDS) | set(crud.COMMANDS)
    dbs = {x["name"]: x for x in client.admin.command("listDatabases")["databases"]}
    assert dbs["hashes"]["sizeOnDisk"] > 50 and not dbs["hashes"]["empty"]
    assert dbs["local"]["sizeOnDisk"] > 0  # the oplog (local.oplog.rs)
    assert client.local.command("dbStats")["collections"] == 1


def test_the_admin_commands_tools_ask_for(client, served):
    """db.getUsers(), getCmdLineOpts, fsync and the profiler's status, as
    mongosh and monitoring tools ask; what raymx cannot do is refused by name."""
    p, svc = served
    users = client.admin.command("usersInfo", 1)["users"]
    assert [(u["user"], u["db"]) for u in users] == [("raymx", "admin")]
    assert client.admin.command("usersInfo", "nobody")["users"] == []
    opts = client.admin.command("getCmdLineOpts")
    assert opts["parsed"]["replication"]["replSetName"] == "rs"
    assert opts["parsed"]["net"]["port"] == p.port
    client.fs_db.c.insert_one({"_id": 1})  # w:1: acknowledged before it is durable
    assert client.admin.command("fsync")["numFiles"] == 1
    assert svc.group.durable is not None and svc.group.durable >= svc.group.committed
    with pytest.raises(OperationFailure, match="rs.backup"):
        client.admin.command("fsync", lock=True)
    assert client.fs_db.command("profile", -1)["was"] == 0
    with pytest.raises(OperationFailure, match="profiler is not supported"):
        client.fs_db.command("profile", 1)


def test_ids_the_server_makes_are_object_ids(client):
    """An upsert's new document, and an insert command's document without an
    _id, get an ObjectId, as MongoDB's server gives them (a 24-digit string
    before); a pipeline findAndModify is an update in change streams."""
    from bson import ObjectId
    c = client.ids.c
    r = c.update_one({"k": 1}, {"$set": {"v": 1}}, upsert=True)
    assert isinstance(r.upserted_id, ObjectId) and c.find_one({"k": 1})["_id"] == r.upserted_id
    assert isinstance(c.replace_one({"k": 2}, {"k": 2}, upsert=True).upserted_id, ObjectId)
    got = c.find_one_and_update({"k": 3}, {"$set": {"v": 3}}, upsert=True,
                                return_document=ReturnDocument.AFTER)
    assert isinstance(got["_id"], ObjectId)
    got = c.find_one_and_update({"k": 4, "$expr": {"$eq": [1, 1]}}, {"$set": {"v": 4}},
                                upsert=True, return_document=ReturnDocument.AFTER)
    assert isinstance(got["_id"], ObjectId)
    client.ids.command("insert", "c", documents=[{"k": 5}])
    assert isinstance(c.find_one({"k": 5})["_id"], ObjectId)
    with c.watch(max_await_time_ms=200) as s:
        c.find_one_and_update({"k": 5}, [{"$set": {"w": 1}}])
        assert s.next()["operationType"] == "update"


def test_index_conflicts_get_mongodb_codes(client):
    """One key, one index: another name for it is IndexOptionsConflict (85);
    a name taken by another key is IndexKeySpecsConflict (86); a partial
    index may share a key."""
    c = client.ixc.c
    assert c.create_index("a", name="one") == "one" and c.create_index("a", name="one") == "one"
    for call, code in ((lambda: c.create_index("a"), 85),
                       (lambda: c.create_index("a", name="two", unique=True), 85),
                       (lambda: c.create_index("b", name="one"), 86)):
        with pytest.raises(OperationFailure) as ei:
            call()
        assert ei.value.code == code
    assert c.create_index("a", name="p", partialFilterExpression={"a": {"$gt": 1}}) == "p"
    assert sorted(c.index_information()) == ["_id_", "one", "p"]


def test_rename_collection_through_pymongo(client):
    db = client.ren
    db.a.insert_many([{"_id": i, "k": i % 2} for i in range(5)])
    db.a.create_index("k")
    stream = db.watch(max_await_time_ms=200)
    db.a.rename("b")
    assert db.list_collection_names() == ["b"] and db.b.count_documents({"k": 1}) == 2
    assert "k_1" in db.b.index_information()
    db.c.insert_one({"_id": "c"})
    with pytest.raises(OperationFailure) as e:
        db.b.rename("c")
    assert e.value.code == 48  # NamespaceExists
    db.b.rename("c", dropTarget=True)
    assert db.list_collection_names() == ["c"] and db.c.count_documents({}) == 5
    with pytest.raises(OperationFailure) as e:
        db.nope.rename("x")
    assert e.value.code == 26  # NamespaceNotFound
    for name in ("c", "nope"):  # to itself: refused before the source is looked for
        with pytest.raises(OperationFailure, match="Can't rename a collection to itself") as e:
            db[name].rename(name)
        assert e.value.code == 20  # IllegalOperation
    client.admin.command("renameCollection", "ren.c", to="ren2.moved")  # across databases
    assert client.ren2.moved.count_documents({}) == 5
    evs = []
    for _ in range(20):
        ev = stream.try_next()
        if ev is not None:
            evs.append(ev)
        if any(x["operationType"] == "rename" and x["to"]["coll"] == "c" for x in evs):
            break
    renames = [(x["ns"]["coll"], x["to"]["coll"]) for x in evs if x["operationType"] == "rename"]
    assert renames[:2] == [("a", "b"), ("b", "c")]
    stream.close()


def test_rename_collection_through_the_native_driver(tmp_path):
    from tests.port_helpers import client_of
    with serving(tmp_path, Limits(sync_interval_ms=20)) as (p, svc):
        cl = client_of(p)
        c = cl["n"]["a"]
        c.insert_one({"_id": 1})
        b = c.rename("b")
        assert b.full_name == "n.b" and b.find_one({"_id": 1}) == {"_id": 1}
        from raymx import errors
        cl["n"]["x"].insert_one({"_id": 2})
        with pytest.raises(errors.CollectionExists):
            b.rename("x")
        assert b.rename("x", drop_target=True).count_documents({}) == 1
        s = cl["n"]["s"]  # and a unique sparse index from the native driver
        s.create_index("e", unique=True, sparse=True)
        s.insert_one({"_id": 1})
        s.insert_one({"_id": 2})
        with pytest.raises(errors.DuplicateKey):
            s.insert_many([{"_id": 3, "e": 1}, {"_id": 4, "e": 1}])
        assert s.list_indexes()[1]["sparse"] is True
        cl.close()


def test_sparse_and_partial_indexes_through_pymongo(client):
    c = client.t.accounts
    c.create_index("email", unique=True, sparse=True)
    c.create_index("code", unique=True, partialFilterExpression={"active": {"$eq": True}})
    c.insert_many([{"_id": 1, "email": "a@x"}, {"_id": 2}, {"_id": 3},
                   {"_id": 4, "code": 7, "active": True}, {"_id": 5, "code": 7}])
    with pytest.raises(DuplicateKeyError):
        c.insert_one({"_id": 6, "email": "a@x"})
    with pytest.raises(DuplicateKeyError):
        c.insert_one({"_id": 6, "code": 7, "active": True})
    info = c.index_information()
    assert info["email_1"]["sparse"] is True and info["email_1"]["unique"] is True
    assert info["code_1"]["partialFilterExpression"] == {"active": {"$eq": True}}
    assert sorted(d["_id"] for d in c.find({"email": {"$exists": False}})) == [2, 3, 4, 5]
    with pytest.raises(OperationFailure) as e:
        c.create_index("z", hidden=True)
    assert e.value.code == 197  # an option raymx does not have is refused, named


def test_current_op_lists_the_commands_running_now(client):
    ops = client.admin.command("currentOp")["inprog"]
    me = [o for o in ops if o["command"].get("currentOp")]
    assert len(me) == 1 and me[0]["active"] and me[0]["ns"] == "admin.$cmd"
    assert me[0]["microsecs_running"] >= 0
    assert not any("find" in o["command"] for o in ops)  # nothing else runs
    import threading
    import time
    stream = client.t.watched.watch(max_await_time_ms=3000)
    waiting = threading.Thread(target=stream.try_next)
    waiting.start()  # a getMore that waits for events
    time.sleep(0.5)
    ops = client.admin.command("currentOp")["inprog"]
    more = [o for o in ops if "getMore" in o["command"]]
    waiting.join(10)
    stream.close()
    assert len(more) == 1 and more[0]["op"] == "getmore" and more[0]["ns"] == "t.watched"
    assert more[0]["secs_running"] >= 0 and more[0]["microsecs_running"] > 100_000


def test_validate_checks_documents_against_their_indexes(served, client):
    _, svc = served
    c = client.t.checked
    c.insert_many([{"_id": i, "a": i % 3, "tags": ["x", f"t{i}"]} for i in range(30)])
    c.create_index("a")
    c.create_index("tags", sparse=True)
    v = client.t.command("validate", "checked")
    assert v["valid"] and v["nrecords"] == 30 and v["errors"] == []
    assert v["keysPerIndex"] == {"_id_": 30, "a_1": 30, "tags_1": 90}  # multikey: 3 each
    ix = svc.e.reader().coll("t.checked").indexes["a_1"]
    with svc.e.store.write() as t:  # lose one index entry behind raymx's back
        k = next(iter(t.scan("index", ix.prefix, ix.prefix + b"\xff")))[0]
        t.delete("index", k)
    v = client.t.command("validate", "checked")
    assert not v["valid"] and v["indexDetails"]["a_1"] == {"valid": False}
    assert v["errors"] == ["index a_1: 1 missing, 0 extra entries"]
    with pytest.raises(OperationFailure) as e:
        client.t.command("validate", "nope")
    assert e.value.code == 26


def test_positional_projection_and_find_options_that_would_change_the_answer(client):
    """``{"arr.$": 1}`` returns the first element the filter matched through
    (it returned ``[{}]`` before: a silent wrong answer); find options raymx
    does not serve (min/max, returnKey, showRecordId, tailable) are refused,
    never ignored (min/max used to return every document)."""
    from pymongo import CursorType, ReturnDocument
    co = client.proj.c
    co.insert_many([{"_id": 1, "arr": [1, 5, 9], "s": {"xs": [{"a": 1}, {"a": 7}]}, "n": 1},
                    {"_id": 2, "arr": [2, 3, {"k": 2}], "n": 2}])
    assert co.find_one({"arr": {"$gt": 4}}, {"arr.$": 1}) == {"_id": 1, "arr": [5]}
    assert co.find_one({"_id": 2, "arr.k": 2}, {"arr.$": 1, "n": 1}) == \
        {"_id": 2, "arr": [{"k": 2}], "n": 2}
    assert co.find_one({"s.xs.a": {"$gt": 2}}, {"s.xs.$": 1, "_id": 0}) == \
        {"s": {"xs": [{"a": 7}]}}
    assert [d["arr"] for d in co.find({"arr": {"$in": [3, 9]}}, {"arr.$": 1}).sort("_id", 1)] \
        == [[9], [3]]
    assert co.find_one_and_update({"arr": 9}, {"$set": {"n": 10}}, projection={"arr.$": 1},
                                  return_document=ReturnDocument.AFTER) == \
        {"_id": 1, "arr": [9]}
    for flt, proj in (({"n": 1}, {"arr.$": 1}), ({"arr": 1}, {"arr.$": 1, "s.xs.$": 1}),
                      ({"arr": 1}, {"arr.$": 0})):
        with pytest.raises(OperationFailure, match="positional") as ei:
            co.find_one(flt, proj)
        assert ei.value.code == 2
    refused = [(lambda: co.find().min([("_id", 1)]).hint([("_id", 1)]), "min/max"),
               (lambda: co.find().max([("_id", 2)]).hint([("_id", 1)]), "min/max"),
               (lambda: co.find(return_key=True), "returnKey"),
               (lambda: co.find(show_record_id=True), "record id"),
               (lambda: co.find(cursor_type=CursorType.TAILABLE), "capped")]
    for cursor, why in refused:
        with pytest.raises(OperationFailure, match=why) as ei:
            list(cursor())
        assert ei.value.code == 2
    assert co.count_documents({}) == 2  # the connection and the data are as they were


def test_what_mongosh_s_replication_helpers_read(client):
    """``rs.conf()`` (replSetGetConfig), ``local.system.replset`` (which
    ``rs.printSecondaryReplicationInfo()`` counts before it reads
    ``rs.status()``), and ``db.currentOp()`` (an ``aggregate: 1`` with a
    ``$currentOp`` stage); ``local.system.replset`` is read-only."""
    conf = client.admin.command("replSetGetConfig")["config"]
    assert conf["_id"] == "rs" and [m["_id"] for m in conf["members"]] == [0]
    assert conf["members"][0]["host"] == "%s:%d" % client.address
    sysrs = client.local["system.replset"]
    assert sysrs.count_documents({}) == 1 and sysrs.find_one({"_id": "rs"}) == conf
    assert sysrs.find_one({"_id": "other"}) is None
    with pytest.raises(OperationFailure):
        sysrs.insert_one({"_id": "mine"})
    st = client.admin.command("replSetGetStatus")
    me = [m for m in st["members"] if m.get("self")]
    assert len(me) == 1 and me[0]["stateStr"] == "PRIMARY"
    ops = list(client.admin.aggregate([{"$currentOp": {"allUsers": True}},
                                       {"$match": {"active": True}}]))
    assert any(o["command"].get("aggregate") == 1 for o in ops)


def test_statement_fields_raymx_does_not_know_fail_the_command_instead_of_being_ignored(client):
    """An update's ``sort`` (MongoDB 8's) updated another document than asked
    for, and a delete's ``limit: 5`` deleted one: both now fail the command,
    as MongoDB 7 parses them. ``$natural`` sorts by raymx's stored order
    (``_id``) both ways, a ``$meta`` sort is refused by name, and an update
    statement's constants (``c``) reach its expressions."""
    co = client.stmts.c
    co.insert_many([{"_id": i, "a": i % 3} for i in range(10)])
    for call in (lambda: co.update_one({"a": 1}, {"$set": {"hit": 1}}, sort={"_id": -1}),
                 lambda: co.replace_one({"a": 1}, {"a": 1, "r": 1}, sort={"_id": -1})):
        with pytest.raises(OperationFailure, match="'update.updates.sort' is an unknown field"
                           ".*find_one_and_update") as ei:
            call()
        assert ei.value.code == 40415
    assert co.count_documents({"hit": 1}) == 0 and co.count_documents({"r": 1}) == 0
    with pytest.raises(OperationFailure, match="must be 0 or 1. Got 5") as ei:
        client.stmts.command("delete", "c", deletes=[{"q": {}, "limit": 5}])
    assert ei.value.code == 9 and co.count_documents({}) == 10
    with pytest.raises(OperationFailure, match="'delete.deletes.limit' is missing") as ei:
        client.stmts.command("delete", "c", deletes=[{"q": {}}])  # as MongoDB: required
    assert ei.value.code == 40414 and co.count_documents({}) == 10
    with pytest.raises(OperationFailure, match="'cursor' option is required") as ei:
        client.stmts.command("aggregate", "c", pipeline=[])  # as MongoDB: no cursor, no answer
    assert ei.value.code == 9
    assert [d["_id"] for d in co.find().sort("$natural", -1).limit(2)] == [9, 8]
    assert [d["_id"] for d in co.aggregate([{"$sort": {"$natural": -1}}, {"$limit": 2}])] == \
        [9, 8]
    with pytest.raises(OperationFailure, match="no text search"):
        list(co.find().sort([("s", {"$meta": "textScore"})]))
    for kind in ("text", "2dsphere", "hashed"):  # refused by name, not as a bad key
        with pytest.raises(OperationFailure, match=f"'{kind}' indexes .* not supported"):
            co.create_index([("s", kind)])
    r = client.stmts.command("update", "c", updates=[
        {"q": {"$expr": {"$eq": ["$a", "$$v"]}}, "u": {"$set": {"c": 1}}, "multi": True,
         "c": {"v": 1}}])
    assert r["n"] == 3 and sorted(d["_id"] for d in co.find({"c": 1})) == [1, 4, 7]


def test_an_empty_replacement_leaves_the_id_and_a_multi_replacement_is_refused(client):
    """MongoDB takes ``u: {}`` as a replacement by the document's ``_id``
    alone (raymx refused it as an empty update); a replacement with ``multi``
    is refused whole, as MongoDB parses it (raymx replaced every match)."""
    co = client.repl.c
    co.insert_many([{"_id": i, "a": i} for i in range(3)])
    r = co.replace_one({"_id": 1}, {})
    assert (r.matched_count, r.modified_count) == (1, 1) and co.find_one({"_id": 1}) == {"_id": 1}
    assert co.find_one_and_replace({"_id": 2}, {}, return_document=ReturnDocument.AFTER) == \
        {"_id": 2}
    r = co.replace_one({"_id": 7}, {}, upsert=True)
    assert r.upserted_id == 7 and co.find_one({"_id": 7}) == {"_id": 7}
    r = client.repl.command("update", "c", updates=[{"q": {}, "u": {"b": 1}, "multi": True}])
    (err,) = r["writeErrors"]
    assert err["code"] == 9 and r["n"] == 0, r
    assert err["errmsg"] == "multi update is not supported for replacement-style update"
    assert co.count_documents({"b": 1}) == 0 and co.find_one({"_id": 0}) == {"_id": 0, "a": 0}


def test_a_retried_commit_is_answered_from_the_session_s_record_not_run_again(tmp_path):
    """A commitTransaction the driver sends again after a lost answer (here
    or on the next primary) is answered ok from the record the commit wrote
    in its own transaction; before, it got NoSuchTransaction with
    TransientTransactionError and pymongo's with_transaction ran the
    committed transaction a second time. A transaction the member aborted
    (idle too long) fails its next statement with that label, so
    with_transaction runs it again, once."""
    import time

    import pymongo
    from bson import Int64
    from raymx.wire.server import WirePort
    from tests.test_wire import SECRET, uri
    with serving(tmp_path, Limits(sync_interval_ms=20, transaction_idle_ms=300),
                 make_port=lambda svc: WirePort(svc, SECRET, "127.0.0.1",
                                                {"member": 0, "replset": "rs"})) as (p, svc):
        c = pymongo.MongoClient(uri(p), serverSelectionTimeoutMS=10_000)
        co = c.txr.acct
        co.insert_many([{"_id": 0, "bal": 100}, {"_id": 1, "bal": 100}])
        with c.start_session() as s:
            s.start_transaction()
            co.update_one({"_id": 0}, {"$inc": {"bal": -10}}, session=s)
            co.update_one({"_id": 1}, {"$inc": {"bal": 10}}, session=s)
            s.commit_transaction()
            num = s._server_session.transaction_id  # the number the driver committed
            again = {"commitTransaction": 1, "txnNumber": Int64(num), "autocommit": False,
                     "writeConcern": {"w": "majority"}}
            assert c.admin.command(again, session=s)["ok"] == 1.0  # the retry: ok
            with pytest.raises(OperationFailure) as ei:  # a number never begun: not open
                c.admin.command(dict(again, txnNumber=Int64(num + 5)), session=s)
            assert ei.value.code == 251 and ei.value.has_error_label(
                "TransientTransactionError")
        assert [d["bal"] for d in co.find().sort("_id", 1)] == [90, 110]  # once
        # a transaction that only reads commits without a record: no oplog entry
        at = c.admin.command("ping")["operationTime"]
        with c.start_session() as s:
            assert s.with_transaction(lambda s: co.find_one({"_id": 0}, session=s))["bal"] == 90
        assert c.admin.command("ping")["operationTime"] == at
        attempts = []

        def transfer(s):
            attempts.append(1)
            co.update_one({"_id": 0}, {"$inc": {"bal": -1}}, session=s)
            if len(attempts) == 1:
                time.sleep(1.0)  # past transaction_idle_ms: the member aborts it
            co.update_one({"_id": 1}, {"$inc": {"bal": 1}}, session=s)
        with c.start_session() as s:
            s.with_transaction(transfer)
        assert len(attempts) == 2
        assert [d["bal"] for d in co.find().sort("_id", 1)] == [89, 111]
        c.close()


def test_a_change_stream_starts_after_the_writes_acknowledged_before_it(tmp_path):
    """A w:1 write acknowledged before ``watch()`` is not one of the stream's
    events, though it is not majority-committed yet when the stream opens
    (the stream started at the majority point before: an application that
    wrote and then watched saw its own earlier write as a new change)."""
    import time

    import pymongo
    from raymx.wire.server import WirePort
    from tests.test_wire import SECRET, uri
    # syncs far apart: a w:1 write is acknowledged long before it is durable
    with serving(tmp_path, Limits(sync_interval_ms=400),
                 make_port=lambda svc: WirePort(svc, SECRET, "127.0.0.1",
                                                {"member": 0, "replset": "rs"})) as (p, svc):
        c = pymongo.MongoClient(uri(p), serverSelectionTimeoutMS=10_000)
        co = c.cs.c
        co.insert_one({"_id": "seed"})
        co.insert_one({"_id": "before"})
        stream = co.watch()
        co.delete_one({"_id": "seed"})
        got, deadline = [], time.time() + 10
        while not got and time.time() < deadline:
            ev = stream.try_next()
            if ev is not None:
                got.append((ev["operationType"], ev["documentKey"]["_id"]))
        stream.close()
        assert got == [("delete", "seed")]
        c.close()


def test_a_collection_s_stream_ends_with_invalidate_at_its_drop(client):
    """As MongoDB's: the drop, then ``invalidate`` (the cursor closes); a new
    stream ``start_after`` that token sees what comes next. A database's
    stream goes on past a collection's drop."""
    import time
    co = client.inv.c

    def take(stream, n):
        out, deadline = [], time.time() + 10
        while len(out) < n and time.time() < deadline and stream.alive:
            ev = stream.try_next()
            if ev is not None:
                out.append(ev)
        return out
    stream, dbs = co.watch(), client.inv.watch()
    co.insert_one({"_id": 1})
    co.drop()
    evs = take(stream, 3)
    assert [e["operationType"] for e in evs] == ["insert", "drop", "invalidate"]
    assert not stream.alive  # the server closed the cursor
    co.insert_one({"_id": 2})
    after = co.watch(start_after=evs[-1]["_id"])
    got = take(after, 1)
    after.close()
    assert [(e["operationType"], e["documentKey"]["_id"]) for e in got] == [("insert", 2)]
    assert [e["operationType"] for e in take(dbs, 3)] == ["insert", "drop", "insert"]
    dbs.close()


def test_every_bson_type_round_trips_through_pymongo(client):
    """Int64 (its width kept), Timestamp, Regex, MinKey, MaxKey and Code are
    stored as sent and read back as pymongo's types; they sort in MongoDB's
    order across types, index, match by value and by $type; arithmetic on a
    long stays a long, as MongoDB's (a plain int's width follows its value)."""
    import re

    from bson import Code, Int64, MaxKey, MinKey, Regex, Timestamp
    co = client.types.c
    docs = {1: Int64(5), 2: 7, 3: Regex("^a", "i"), 4: Timestamp(100, 2), 5: MinKey(),
            6: MaxKey(), 7: Code("function () {}"), 8: "abc", 9: Int64(1 << 40), 10: None,
            11: re.compile("x", re.M), 12: Int64(-(1 << 63))}
    co.insert_many([{"_id": k, "v": v} for k, v in docs.items()])
    co.insert_one({"_id": Int64(13), "v": 2.5})
    back = {d["_id"]: d["v"] for d in co.find()}
    for k, v in docs.items():
        want = Regex.from_native(v) if isinstance(v, re.Pattern) else v
        assert back[k] == want and type(back[k]) is type(want), (k, back[k])
    assert type(co.find_one({"_id": 13})["_id"]) is Int64  # found by the int 13 too
    order = [d["_id"] for d in co.find({}, {"_id": 1}).sort([("v", 1), ("_id", 1)])]
    assert order == [5, 10, 12, 13, 1, 2, 9, 8, 4, 3, 11, 7, 6]
    co.create_index("v")
    assert [d["_id"] for d in co.find().sort("v", 1).hint("v_1")][:3] == [5, 10, 12]
    by_type = {d["_id"]: d["t"] for d in co.aggregate([{"$project": {"t": {"$type": "$v"}}}])}
    assert [by_type[k] for k in range(1, 14)] == [
        "long", "int", "regex", "timestamp", "minKey", "maxKey", "javascript", "string",
        "long", "null", "regex", "long", "double"]
    for name, ids in (("long", [1, 9, 12]), ("int", [2]), ("timestamp", [4]), ("regex", [3, 11]),
                      ("minKey", [5]), ("maxKey", [6]), ("javascript", [7])):
        assert sorted(d["_id"] for d in co.find({"v": {"$type": name}})) == ids, name
    assert [d["_id"] for d in co.find({"v": {"$gt": Timestamp(1, 0)}})] == [4]
    assert [d["_id"] for d in co.find({"v": 5})] == [1]
    co.update_one({"_id": 1}, {"$inc": {"v": 1}})
    co.update_one({"_id": 2}, {"$inc": {"v": Int64(1)}})
    co.update_one({"_id": 8}, {"$set": {"w": Int64(3)}, "$bit": {"n": {"or": Int64(4)}}})
    got = {d["_id"]: d for d in co.find({"_id": {"$in": [1, 2, 8]}})}
    assert (got[1]["v"], got[2]["v"], got[8]["w"], got[8]["n"]) == (6, 8, 3, 4)
    assert {type(x) for x in (got[1]["v"], got[2]["v"], got[8]["w"], got[8]["n"])} == {Int64}
    s = list(co.aggregate([{"$match": {"_id": {"$in": [1, 9]}}},
                           {"$group": {"_id": None, "s": {"$sum": "$v"}}}]))[0]["s"]
    assert s == (1 << 40) + 6 and type(s) is Int64
    with pytest.raises(WriteError) as ei:  # a long past 64 signed bits: MongoDB's BadValue
        co.update_one({"_id": 12}, {"$inc": {"v": Int64(-1)}})
    assert ei.value.code == 2 and "Failed to apply $inc operations to current value " \
        "((NumberLong)-9223372036854775808) for document {_id: 12}" in str(ei.value)


def test_transactions_of_several_sessions_interleave_as_in_mongodb(client):
    """Two sessions' transactions open at once on one thread (as MongoDB's
    documentation shows them): both commit when they write different
    documents; the second to write one document fails at once with
    WriteConflict (code 112, TransientTransactionError), the first commits;
    a write outside transactions waits only for one that wrote its document
    (until it ends), and one that commits first makes its commit fail."""
    import time
    co = client.txi.c
    co.insert_many([{"_id": 1, "n": 0}, {"_id": 2, "n": 0}])
    s1, s2 = client.start_session(), client.start_session()
    s1.start_transaction()
    s2.start_transaction()
    co.update_one({"_id": 1}, {"$inc": {"n": 1}}, session=s1)
    t0 = time.monotonic()
    co.update_one({"_id": 2}, {"$inc": {"n": 1}}, session=s2)
    co.insert_one({"_id": 3})  # outside both
    assert time.monotonic() - t0 < 1
    assert co.find_one({"_id": 1}, session=s2)["n"] == 0  # s2's snapshot
    s1.commit_transaction()
    s2.commit_transaction()
    assert [d.get("n") for d in co.find().sort("_id", 1)] == [1, 1, None]
    s1.start_transaction()
    s2.start_transaction()
    co.update_one({"_id": 1}, {"$inc": {"n": 10}}, session=s1)
    with pytest.raises(OperationFailure) as ei:
        co.update_one({"_id": 1}, {"$inc": {"n": 100}}, session=s2)
    assert ei.value.code == 112 and ei.value.has_error_label("TransientTransactionError")
    s2.abort_transaction()
    s1.commit_transaction()
    # a commit after another commit changed the document since its snapshot:
    # WriteConflict at commit
    s1.start_transaction()
    co.find_one({"_id": 2}, session=s1)
    co.update_one({"_id": 2}, {"$set": {"by": "plain"}})
    co.update_one({"_id": 2}, {"$set": {"by": "txn"}}, session=s1)
    with pytest.raises(OperationFailure) as ei:
        s1.commit_transaction()
    assert ei.value.code == 112 and ei.value.has_error_label("TransientTransactionError")
    assert [(d["_id"], d.get("n"), d.get("by")) for d in co.find().sort("_id", 1)] == [
        (1, 11, None), (2, 1, "plain"), (3, None, None)]
    # a write outside transactions to a document an open one wrote waits for
    # its commit, then runs on what it wrote (MongoDB's document lock)
    import threading
    s1.start_transaction()
    co.update_one({"_id": 1}, {"$inc": {"n": 1}}, session=s1)
    done = []
    th = threading.Thread(target=lambda: done.append(
        co.update_one({"_id": 1}, {"$inc": {"n": 100}}).modified_count), daemon=True)
    th.start()
    time.sleep(0.3)
    assert th.is_alive() and not done
    co.update_one({"_id": 2}, {"$set": {"by": "plain2"}})  # another document: at once
    s1.commit_transaction()
    th.join(5)
    assert done == [1] and co.find_one({"_id": 1})["n"] == 112
    s1.end_session()
    s2.end_session()


def test_a_transactions_change_events_carry_its_lsid_and_txn_number(client):
    """As MongoDB's: the events of a driver transaction's changes name its
    session (``lsid``) and ``txnNumber``; other changes carry neither. The
    session records the transaction wrote (``config.transactions``) are no
    event, also in a stream of the whole set."""
    import uuid
    co = client.txe.c
    co.insert_one({"_id": 0})
    with co.watch(max_await_time_ms=200) as st, client.watch(max_await_time_ms=200) as every:
        with client.start_session() as s:
            with s.start_transaction():
                co.insert_one({"_id": 1}, session=s)
                co.update_one({"_id": 0}, {"$set": {"x": 1}}, session=s)
            lsid = uuid.UUID(bytes=bytes(s.session_id["id"]))  # the client reads UUIDs
        co.insert_one({"_id": 2})
        evs = [st.next() for _ in range(3)]
        assert [(e["ns"]["coll"], e["documentKey"]["_id"]) for e in
                (every.next() for _ in range(3))] == [("c", 1), ("c", 0), ("c", 2)]
    assert [e["documentKey"]["_id"] for e in evs] == [1, 0, 2]
    for e in evs[:2]:
        assert e["lsid"]["id"] == lsid and e["txnNumber"] >= 1
    assert "lsid" not in evs[2] and "txnNumber" not in evs[2]


def test_a_failing_statement_aborts_its_transaction_as_in_mongodb(client):
    """A statement of a transaction that fails (a duplicate key, a bad filter)
    aborts it, as MongoDB does (jstests multi_statement_transaction_abort):
    the statement's error comes back, the session's next statement and its
    commit get NoSuchTransaction (TransientTransactionError), and nothing of
    the transaction is stored. A new transaction on the session works."""
    co = client.txa.c
    co.insert_one({"_id": 1})
    with client.start_session() as s:
        s.start_transaction()
        co.insert_one({"_id": 2}, session=s)
        with pytest.raises(DuplicateKeyError):
            co.insert_one({"_id": 1, "x": 0}, session=s)
        for then in (lambda: co.insert_one({"_id": 3}, session=s), s.commit_transaction):
            with pytest.raises(OperationFailure) as ei:
                then()
            assert ei.value.code == 251 and ei.value.has_error_label("TransientTransactionError")
        assert sorted(d["_id"] for d in co.find()) == [1]
        s.start_transaction()
        with pytest.raises(OperationFailure) as ei:
            list(co.find({"$bogus": 1}, session=s))
        assert ei.value.code == 2
        with pytest.raises(OperationFailure) as ei:
            co.find_one({}, session=s)
        assert ei.value.code == 251
        s.abort_transaction()  # pymongo's abort of an aborted transaction passes

        def body(ss):
            co.insert_one({"_id": 5}, session=ss)
            co.insert_one({"_id": 1}, session=ss)
        with pytest.raises(DuplicateKeyError):
            s.with_transaction(body)
        with s.start_transaction():
            co.insert_one({"_id": 6}, session=s)
    assert sorted(d["_id"] for d in co.find()) == [1, 6]


def test_concurrent_transactions_and_atomic_writes_lose_nothing(client):
    """Threads moving money between five accounts in transactions
    (``with_transaction``), others incrementing one counter with
    find_one_and_update and others moving money with plain updates, all at
    once on the same documents: every conflict is run again (by the driver
    for transactions, by the member's port for the single commands, which
    never fail with it), so the total stays and every increment counts."""
    import random
    import threading
    acct, seq = client.txc.acct, client.txc.seq
    acct.insert_many([{"_id": i, "bal": 100} for i in range(5)])
    seq.insert_one({"_id": "n", "v": 0})
    failures, moved = [], []

    def transfers(k):
        rnd = random.Random(k)
        for _ in range(25):
            a, b = rnd.sample(range(5), 2)

            def move(s):
                acct.update_one({"_id": a}, {"$inc": {"bal": -1}}, session=s)
                acct.update_one({"_id": b}, {"$inc": {"bal": 1}}, session=s)
            with client.start_session() as s:
                s.with_transaction(move)
            moved.append(1)

    def counter(k):
        for _ in range(40):
            seq.find_one_and_update({"_id": "n"}, {"$inc": {"v": 1}})

    def plain(k):
        rnd = random.Random(100 + k)
        for _ in range(40):
            a, b = rnd.sample(range(5), 2)
            acct.update_one({"_id": a}, {"$inc": {"bal": -1}})
            acct.update_one({"_id": b}, {"$inc": {"bal": 1}})

    def run(fn, k):
        try:
            fn(k)
        except Exception as e:  # noqa: BLE001 (reported below)
            failures.append(repr(e))
    threads = [threading.Thread(target=run, args=(fn, k))
               for k in range(3) for fn in (transfers, counter, plain)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures[:3]
    assert len(moved) == 75
    assert sum(d["bal"] for d in acct.find()) == 500
    assert seq.find_one({"_id": "n"})["v"] == 120


def test_an_empty_collection_name_is_an_invalid_namespace_and_the_connection_goes_on(client):
    with pytest.raises(OperationFailure, match="Invalid namespace specified 'names.'") as ei:
        client.names.command("insert", "", documents=[{"x": 1}])
    assert ei.value.code == 73
    with pytest.raises(OperationFailure, match="invalid type int") as ei:
        client.names.command("find", 5)
    assert ei.value.code == 73
    assert client.names.c.insert_one({"x": 1}).acknowledged


def test_upserts_seed_from_what_mongodb_reads_as_equalities(client):
    """An $in or $all of one value and an $or of one clause seed the upserted
    document, as MongoDB's own upsert tests expect."""
    c = client.seeds.c
    for flt in ({"x": {"$in": [1]}}, {"x": {"$all": [1]}}, {"$or": [{"x": {"$eq": 1}}]},
                {"$and": [{"x": {"$eq": 1}}]}):
        c.delete_many({})
        c.update_one(flt, {"$set": {"a": 1}}, upsert=True)
        assert c.find_one({}, {"_id": 0}) == {"x": 1, "a": 1}, flt
    c.delete_many({})
    c.update_one({"x": {"$in": [1, 2]}}, {"$set": {"a": 1}}, upsert=True)
    assert c.find_one({}, {"_id": 0}) == {"a": 1}


def test_update_and_delete_hints_name_an_existing_index(client):
    """As a find's hint and MongoDB's: a hint naming no index is the statement's
    write error (it was ignored), the others of an unordered batch still run."""
    c = client.hints.c
    c.create_index("k")
    c.insert_many([{"k": i} for i in range(4)])
    assert c.update_one({"k": 1}, {"$set": {"z": 1}}, hint="k_1").modified_count == 1
    assert c.delete_one({"k": 2}, hint=[("k", 1)]).deleted_count == 1
    for bad in (lambda: c.update_one({"k": 1}, {"$set": {"z": 2}}, hint="nope_1"),
                lambda: c.delete_one({"k": 3}, hint={"nope": 1})):
        with pytest.raises(WriteError, match="hint provided does not correspond") as ei:
            bad()
        assert ei.value.code == 2
    assert c.count_documents({"k": 3}) == 1 and c.count_documents({"z": 2}) == 0
    from pymongo import UpdateOne
    from pymongo.errors import BulkWriteError
    with pytest.raises(BulkWriteError) as ei:
        c.bulk_write([UpdateOne({"k": 0}, {"$set": {"z": 3}}, hint="nope_1"),
                      UpdateOne({"k": 0}, {"$set": {"z": 4}})], ordered=False)
    assert [e["index"] for e in ei.value.details["writeErrors"]] == [0]
    assert c.find_one({"k": 0})["z"] == 4


def test_get_parameter_answers_what_it_knows_and_refuses_the_rest(client):
    a = client.admin
    assert a.command("getParameter", 1, featureCompatibilityVersion=1)[
        "featureCompatibilityVersion"] == {"version": "7.0"}
    got = a.command("getParameter", 1, logComponentVerbosity=1, nope=1)  # mongosh's
    assert got["logComponentVerbosity"]["verbosity"] == 0 and "nope" not in got
    assert a.command("getParameter", "*")["authenticationMechanisms"] == ["SCRAM-SHA-256"]
    with pytest.raises(OperationFailure, match="no option found to get") as ei:
        a.command("getParameter", 1, nope=1)
    assert ei.value.code == 72


def test_a_filter_of_the_wrong_type_is_named_as_mongodb_names_it(client):
    db = client.kinds
    db.c.insert_one({"x": 1})
    for cmd, field in ((dict(find="c", filter=[1]), "find.filter"),
                       (dict(find="c", sort="x"), "find.sort"),
                       (dict(count="c", query=5), "count.query"),
                       (dict(distinct="c", key="x", query=[]), "distinct.query")):
        with pytest.raises(OperationFailure, match=f"BSON field '{field}' is the wrong type") \
                as ei:
            db.command(cmd)
        assert ei.value.code == 14
    assert db.c.find_one({}, {"_id": 0}) == {"x": 1}
