"""The client port's wire without Ray: hello and its secret, frames good and
hostile, what a request may carry (packed documents, parts, write concerns,
filters), and the port's Unix socket files."""
import os
import socket
import struct
import time

import msgpack
import pytest

from raymx import errors
from raymx.client import Connection, WriteConcern
from raymx.storage.keys import encode_key
from raymx.storage.limits import Limits
from tests.port_helpers import (SECRET, busy_writer, client_of, closed, frame, raw,
                                raw_after_hello, read_frame, serving)
from tests.port_helpers import port  # noqa: F401 (the fixture)


def test_bad_secret_gets_error_and_close(port):
    p, _ = port
    s = raw(p)
    s.sendall(frame({"id": 1, "op": "hello", "secret": "wrong"}))
    r = read_frame(s)
    assert r["err"]["err"] == "AuthenticationFailed"
    assert closed(s)
    with pytest.raises(errors.AuthenticationFailed):
        Connection("127.0.0.1", p.port, "wrong")


def test_request_before_hello_is_refused(port):
    p, _ = port
    s = raw(p)
    s.sendall(frame({"id": 1, "op": "find", "ns": "a.b"}))
    assert read_frame(s)["err"]["err"] == "AuthenticationFailed" and closed(s)


def test_without_a_hello_a_connection_is_kept_small_and_short(port, monkeypatch):
    """Before its hello, a frame over HELLO_BYTES_MAX is refused at its header
    (nothing buffered for it), and a connection that sends no hello in time is
    closed."""
    from raymx.actors import server
    p, _ = port
    s = raw(p)
    s.sendall(struct.pack(">I", 1 << 20) + b"x" * 1000)
    r = read_frame(s)
    assert r["err"]["err"] == "ProtocolError" and "limit 4096" in r["err"]["msg"]
    assert closed(s)
    monkeypatch.setattr(server, "HELLO_TIMEOUT_S", 0.3)
    s = raw(p)
    t0 = time.monotonic()
    r = read_frame(s)
    assert r["err"]["err"] == "AuthenticationFailed" and "no hello" in r["err"]["msg"]
    assert closed(s) and time.monotonic() - t0 < 3
    c = Connection("127.0.0.1", p.port, SECRET)  # a hello in time, then large frames are fine
    time.sleep(0.5)
    assert c.request({"op": "insert", "ns": "h.c", "docs": [{"_id": 1, "x": "y" * 100_000}]})
    c.close()


@pytest.mark.parametrize("payload", [
    struct.pack(">I", 5) + b"\xc1\xc1\xc1\xc1\xc1",        # not msgpack
    struct.pack(">I", 3) + msgpack.packb([1, 2]),           # not a map
    struct.pack(">I", 0),                                   # empty frame
    struct.pack(">I", 100 << 20),                           # oversized
])
def test_malformed_frames_get_error_and_close_and_server_survives(port, payload):
    p, svc = port
    s = raw_after_hello(p)
    s.sendall(payload)
    r = read_frame(s)
    assert r["err"]["err"] == "ProtocolError"
    assert closed(s)
    # the server still serves others
    c = Connection("127.0.0.1", p.port, SECRET)
    assert c.request({"op": "insert", "ns": "a.b", "docs": [{"_id": 1}]})["inserted_ids"] == [1]
    c.close()


def test_truncated_frame_then_disconnect_does_not_crash(port):
    p, _ = port
    s = raw(p)
    s.sendall(frame({"id": 1, "op": "hello", "secret": SECRET}))
    read_frame(s)
    s.sendall(struct.pack(">I", 100) + b"abc")
    s.close()
    c = Connection("127.0.0.1", p.port, SECRET)
    assert c.request({"op": "count", "ns": "a.b"})["value"] == 0


def test_errors_cross_as_the_same_classes_and_pipelining(port):
    p, svc = port
    c = Connection("127.0.0.1", p.port, SECRET)
    futs = [c.submit({"op": "insert", "ns": "a.b", "docs": [{"_id": i}]}) for i in range(200)]
    gtids = [f.result(10)["gtid"] for f in futs]
    assert [g[1] for g in gtids] == list(range(1, 201))  # one per statement, in order
    with pytest.raises(errors.DuplicateKey):
        c.request({"op": "insert", "ns": "a.b", "docs": [{"_id": 5}]})
    with pytest.raises(errors.InvalidFilter):
        c.request({"op": "find", "ns": "a.b", "filter": {"x": {"$nope": 1}}})
    with pytest.raises(errors.InvalidOperation):
        c.request({"op": "frobnicate"})
    with pytest.raises(errors.DocumentTooLarge):
        c.request({"op": "insert", "ns": "a.b", "docs": [{"_id": "big", "x": "y" * (600 << 10)}]})
    assert c.request({"op": "count", "ns": "a.b"})["value"] == 200
    c.close()



def test_requests_of_the_wrong_form_are_refused_naming_the_field(port):
    """Fields the member takes for granted, sent in another form by a client
    that is not raymx's driver (a request fuzzer found each as an "internal
    error": a list where a cursor id or index name belongs, NaN as a batch,
    a number as a namespace, an empty namespace to create): InvalidOperation
    or InvalidName naming what is wrong, nothing stored, the connection
    serving on."""
    p, _ = port
    c = Connection("127.0.0.1", p.port, SECRET)
    c.request({"op": "insert", "ns": "a.b", "docs": [{"_id": 1, "a": 1}]})
    for req, says in (({"op": "getMore", "cursor": [1]}, "cursor must be"),
                      ({"op": "killCursors", "cursors": None}, "cursors must be"),
                      ({"op": "find", "ns": "a.b", "batch": float("nan")}, "batch must be"),
                      ({"op": "find", "ns": "a.b", "projection": [{}]}, "projection must be"),
                      ({"op": "watch", "after": [0, 0], "wait_ms": "x"}, "wait_ms must be"),
                      ({"op": "dropIndex", "ns": "a.b", "name": [1]}, "name must be"),
                      ({"op": "createCollection", "ns": 5}, "ns must be"),
                      ({"op": "createCollection", "ns": ""}, "")):
        with pytest.raises(errors.InvalidInput) as ei:
            c.request(req)
        assert says in str(ei.value) and "internal" not in str(ei.value), req
    assert c.request({"op": "find", "ns": "a.b", "projection": ["a"]})["docs"] == [
        {"_id": 1, "a": 1}]
    assert c.request({"op": "listCollections"})["value"] == ["a.b"]
    c.close()

def test_packed_documents_are_checked_and_stored_as_sent(port):
    """The driver's form: each document its own msgpack binary. Bad ones get
    the statement's error (the connection stays); good ones are stored byte
    for byte, and a document without an _id gets one."""
    p, svc = port
    c = Connection("127.0.0.1", p.port, SECRET)
    good = msgpack.packb({"_id": 1, "a": [1, {"b": "x"}]})
    bad = [([good, b"\xc1"], errors.InvalidDocument, "document 1"),
           ([msgpack.packb([1, 2])], errors.InvalidDocument, "must be a map"),
           ([msgpack.packb({b"k": 1})], errors.InvalidDocument, "keys must be strings"),
           ([msgpack.packb({"$set": 1})], errors.InvalidDocument, "'$set'"),
           ([msgpack.packb({"t": msgpack.ExtType(42, b"x")})], errors.InvalidDocument, "t"),
           ([msgpack.packb({"t": msgpack.ExtType(5, b"")})], errors.InvalidDocument, "t"),
           ([good + b"\x00"], errors.InvalidDocument, "document 0"),
           ([msgpack.packb({"x": "y" * (600 << 10)})], errors.DocumentTooLarge, "over the limit"),
           ("nope", errors.InvalidDocument, "list of msgpack binaries"),
           ([{"_id": 3}], errors.InvalidDocument, "list of msgpack binaries")]
    for packed, cls, words in bad:
        with pytest.raises(cls, match=words.replace("$", r"\$")):
            c.request({"op": "insert", "ns": "p.c", "packed": packed})
    r = c.request({"op": "insert", "ns": "p.c", "packed": [good, msgpack.packb({"c": 2})]})
    assert r["inserted_ids"][0] == 1 and isinstance(r["inserted_ids"][1], str)
    assert svc.e.find("p.c", {"_id": 1}) == [{"_id": 1, "a": [1, {"b": "x"}]}]
    rd = svc.e.reader()
    try:
        assert rd.t.get("docs", rd.coll("p.c").prefix + encode_key(1)) == good
    finally:
        rd.t.abort()
    assert svc.e.verify_oplog() == r["gtid"][1] == 1  # the refused ones left no trace
    c.close()


def test_documents_encoded_another_way_are_stored_as_sent_and_the_chain_holds(port):
    """Valid msgpack that is not this packer's encoding (another client's: a
    float32, a wide int, a str16 header on a short string) is stored as sent;
    the oplog's hash chain covers the stored bytes, so secondaries and
    verify_oplog accept it (they used to re-encode the ops and refuse it)."""
    from raymx.actors.core.replication import check_batch
    from raymx.storage.gtid import ZERO
    p, svc = port
    c = Connection("127.0.0.1", p.port, SECRET)
    odd = [msgpack.packb({"_id": 1, "x": 0.5}, use_single_float=True),
           b"\x82\xa3_id\x02\xa1n\xcf" + struct.pack(">Q", 7),     # uint64 for a 7
           b"\x82\xa3_id\x03\xa1s\xda\x00\x02hi",                 # str16 for "hi"
           b"\x81\xd9\x03_id\x04"]                                 # str8 key
    deep = {"v": 1}
    for _ in range(150):
        deep = {"d": deep}
    r = c.request({"op": "insert", "ns": "n.c", "packed": odd})
    assert r["inserted_ids"] == [1, 2, 3, 4]
    assert svc.e.find("n.c", {}) == [{"_id": 1, "x": 0.5}, {"_id": 2, "n": 7},
                                      {"_id": 3, "s": "hi"}, {"_id": 4}]
    rd = svc.e.reader()
    try:
        assert rd.t.get("docs", rd.coll("n.c").prefix + encode_key(2)) == odd[1]
    finally:
        rd.t.abort()
    assert svc.e.verify_oplog() == r["gtid"][1]
    with svc.e.store.read() as t:
        rows = [(k, v, []) for k, v in t.scan("oplog")]
    assert len(check_batch(ZERO, 0, rows, svc.limits)) == len(rows)  # a secondary takes them
    with pytest.raises(errors.InvalidDocument, match="nested deeper than 100"):
        c.request({"op": "insert", "ns": "n.c", "packed": [msgpack.packb({"_id": 5, **deep})]})
    c.close()


def test_a_large_insert_many_goes_in_parts_as_one_statement(port, monkeypatch):
    """Past INSERT_PART_DOCS documents the driver sends parts, one frame each,
    decoded on arrival: one GTID for all, beyond one frame's size too; a bad
    document in a later part is named by its place in the whole batch and
    nothing is stored; a document the driver cannot pack cancels the parts sent."""
    from raymx.client import INSERT_PART_DOCS, collection
    monkeypatch.setattr(collection, "INSERT_PART_BYTES", 100_000)  # a part is several frames
    p, svc = port
    cl = client_of(p)
    coll = cl["big"]["c"]
    n = 3 * INSERT_PART_DOCS + 5
    big = "x" * 3000  # ~2.3 MB in all: more than the 1 MiB frame limit
    r = coll.insert_many([{"_id": k, "s": big} for k in range(n)])
    assert r.inserted_ids == list(range(n)) and r.gtid.seq == 1
    assert coll.count_documents({}) == n
    bad = [{"_id": f"b{k}"} for k in range(n)]
    bad[2 * INSERT_PART_DOCS + 7] = {"_id": "bad", "$x": 1}
    with pytest.raises(errors.InvalidDocument, match=f"document {2 * INSERT_PART_DOCS + 7} "):
        coll.insert_many(bad)
    bad[2 * INSERT_PART_DOCS + 7] = {"_id": "bad", "t": object()}  # msgpack cannot pack it
    with pytest.raises(errors.InvalidDocument, match="field t: type object"):
        coll.insert_many(bad)
    assert coll.count_documents({}) == n and svc.e.verify_oplog() == 1
    assert not any(c.state.get("inserts") for c in p._conns)  # nothing held after the cancel
    c = Connection("127.0.0.1", p.port, SECRET)  # by hand: an error in the first part
    parts = [{"packed": [b"\xc1"]}, {"packed": [msgpack.packb({"_id": "ok"})]}]
    with pytest.raises(errors.InvalidDocument, match="document 0 "):
        c.request({"op": "insert", "ns": "big.c"}, parts=[lambda p=p: [p] for p in parts])
    assert c.request({"op": "count", "ns": "big.c"})["value"] == n  # the connection goes on
    c.close()
    cl.close()


def test_parts_past_the_transaction_limit_are_refused(tmp_path):
    lim = Limits(frame_bytes_max=1 << 20, document_bytes_max=512 << 10,
                 transaction_bytes_max=2 << 20)
    with serving(tmp_path, lim) as (p, svc):
        c = Connection("127.0.0.1", p.port, SECRET)
        part = [msgpack.packb({"s": "y" * (300 << 10)}) for _ in range(3)]  # ~900 KB
        with pytest.raises(errors.TransactionTooLarge, match="transaction limit"):
            c.request({"op": "insert", "ns": "t.c"}, parts=[lambda: [{"packed": part}]] * 3)
        assert c.request({"op": "count", "ns": "t.c"})["value"] == 0
        c.close()


@pytest.mark.parametrize("wc", [{"wtimeout_ms": "500"}, {"wtimeout_ms": -1}, {"j": "yes"},
                                {"w": "two"}, {"w": -1}, {"w": 1.5}])
def test_a_bad_write_concern_is_refused_before_anything_is_written(port, wc):
    p, svc = port
    c = Connection("127.0.0.1", p.port, SECRET)
    blocker = busy_writer(svc)  # queued together: the bad one inside a write group
    futs = [c.submit({"op": "insert", "ns": "w.c", "docs": [{"_id": k}], **(wc if k == 1 else {})})
            for k in range(3)]
    blocker.set()
    with pytest.raises(errors.InvalidOperation, match="nothing was written"):
        futs[1].result(5)
    assert [futs[k].result(5)["inserted_ids"] for k in (0, 2)] == [[0], [2]]
    with pytest.raises(errors.InvalidOperation):  # also alone, on the port's thread
        c.request({"op": "update", "ns": "w.c", "filter": {"_id": 0}, "update": {"$set": {"a": 1}},
                   **wc})
    assert c.request({"op": "find", "ns": "w.c"})["docs"] == [{"_id": 0}, {"_id": 2}]
    with pytest.raises(errors.ConfigError):
        WriteConcern(**{"w": 1, **wc})
    c.close()


@pytest.mark.parametrize("flt", [None, [], "", 0, False, "x"])
def test_updates_and_deletes_need_a_filter_map(port, flt):
    """A filter that is not a map is refused, never taken as "every document"."""
    p, svc = port
    c = client_of(p)
    coll = c["ff"]["c"]
    coll.insert_many([{"_id": i, "v": i} for i in range(5)])
    with pytest.raises(errors.InvalidFilter, match="filter map"):
        coll.delete_many(flt)
    with pytest.raises(errors.InvalidFilter, match="filter map"):
        coll.update_many(flt, {"$set": {"x": 1}})
    assert coll.count_documents({"x": {"$exists": True}}) == 0
    assert coll.count_documents({}) == 5 and coll.find_one(3) == {"_id": 3, "v": 3}
    assert coll.delete_many({}).deleted_count == 5
    c.close()


def test_sockets_of_killed_members_are_swept_live_ones_kept():
    from raymx.actors.server import unix_socket_path
    path = unix_socket_path({"replset": "sweep", "member": 1})
    folder = os.path.dirname(path)
    assert os.stat(folder).st_mode & 0o777 == 0o700
    dead, live = path, unix_socket_path({"replset": "sweep", "member": 2})
    for p_ in (dead, live):
        s = socket.socket(socket.AF_UNIX)
        s.bind(p_)
        s.listen(1)
        if p_ == dead:
            s.close()  # a killed member: the file stays, nobody listens
        else:
            keep = s
    unix_socket_path({"replset": "sweep", "member": 3})
    assert not os.path.exists(dead) and os.path.exists(live)
    keep.close()
    os.unlink(live)


@pytest.mark.parametrize("asyncio_only", [False, True])
def test_the_port_serves_on_uvloop_and_on_asyncio_s_loop(tmp_path, monkeypatch, asyncio_only):
    """The ports run on uvloop where it is installed (it is a dependency);
    RAYMX_ASYNCIO=1 (or no uvloop) gives asyncio's loop, which serves alike:
    durable writes, a point read and a pipelined burst from several threads."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    import uvloop
    if asyncio_only:
        monkeypatch.setenv("RAYMX_ASYNCIO", "1")
    else:
        monkeypatch.delenv("RAYMX_ASYNCIO", raising=False)
    lim = Limits(frame_bytes_max=1 << 20, document_bytes_max=512 << 10, sync_interval_ms=20)
    with serving(tmp_path, lim) as (p, _svc):
        assert isinstance(p._loop, uvloop.Loop) is not asyncio_only
        assert isinstance(p._loop, asyncio.AbstractEventLoop)
        cl = client_of(p)
        try:
            coll = cl["db"]["c"].with_options(WriteConcern(w=1, j=True))
            with ThreadPoolExecutor(8) as ex:
                list(ex.map(lambda i: coll.insert_one({"_id": i, "v": i}), range(200)))
            assert coll.find_one({"_id": 123}) == {"_id": 123, "v": 123}
            assert coll.count_documents({}) == 200
        finally:
            cl.close()


def test_collection_stats_are_counted_by_the_member(port):  # noqa: F811
    p, _ = port
    c = client_of(p)
    coll = c["db"]["st"]
    assert coll.stats() == {"ns": "db.st", "count": 0, "size": 0, "indexes": {"_id_": [0, 0]}}
    coll.insert_many([{"_id": i, "k": i} for i in range(20)])
    coll.create_index([("k", 1)])
    st = coll.stats()
    assert st["count"] == 20 and st["size"] > 0
    assert st["indexes"]["_id_"][0] == 20 and st["indexes"]["k_1"][0] == 20
    with pytest.raises(errors.InvalidName):
        c["db"]["bad\x00name"].stats()
    c.close()


def test_a_ttl_index_from_the_native_driver(port):  # noqa: F811
    p, svc = port
    c = client_of(p)
    coll = c["db"]["ttl"]
    assert coll.create_index("at", expire_after_seconds=60) == "at_1"
    assert coll.create_index("at", expire_after_seconds=60) == "at_1"  # the same: no-op
    with pytest.raises(errors.InvalidOperation, match="different spec"):
        coll.create_index("at", expire_after_seconds=61)
    with pytest.raises(errors.InvalidOperation, match="other than _id"):
        coll.create_index("_id", expire_after_seconds=1)
    ix = [i for i in coll.list_indexes() if i["name"] == "at_1"][0]
    assert ix["expireAfterSeconds"] == 60
    c.close()
