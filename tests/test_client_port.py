"""The client port without Ray: real LMDB, real sockets, hostile frames."""
import os
import socket
import struct
import threading
import time

import msgpack
import pytest

from raymx import errors
from raymx.actors.server import ClientPort
from raymx.actors.shard import ShardService
from raymx.client import Connection, WriteConcern
from raymx.storage.engine import Engine
from raymx.storage.keys import encode_key
from raymx.storage.limits import Limits
from raymx.storage.lmdb_store import LMDBStore

SECRET = "s3cret"


@pytest.fixture
def port(tmp_path):
    lim = Limits(frame_bytes_max=1 << 20, document_bytes_max=512 << 10, sync_interval_ms=20)
    e = Engine(LMDBStore(str(tmp_path / "m"), map_bytes=1 << 30), lim)
    svc = ShardService(e, lim)
    p = ClientPort(svc, SECRET, "127.0.0.1", lim.frame_bytes_max, {"member": 0})
    yield p, svc
    p.close()
    svc.close()
    e.store.close()


def raw(p):
    s = socket.create_connection(("127.0.0.1", p.port), timeout=5)
    return s


def frame(obj):
    b = msgpack.packb(obj)
    return struct.pack(">I", len(b)) + b


def read_frame(s):
    hdr = b""
    while len(hdr) < 4:
        c = s.recv(4 - len(hdr))
        if not c:
            return None
        hdr += c
    n = struct.unpack(">I", hdr)[0]
    body = b""
    while len(body) < n:
        body += s.recv(n - len(body))
    return msgpack.unpackb(body)


def busy_writer(svc):
    """Hold the writer thread (and with it the writer) until the event is set."""
    blocker, inside = threading.Event(), threading.Event()
    svc.on_writer(lambda: (inside.set(), blocker.wait()))
    assert inside.wait(5)
    return blocker


def closed(s):
    s.settimeout(5)
    try:
        return s.recv(1) == b""
    except ConnectionError:
        return True


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


@pytest.mark.parametrize("payload", [
    struct.pack(">I", 5) + b"\xc1\xc1\xc1\xc1\xc1",        # not msgpack
    struct.pack(">I", 3) + msgpack.packb([1, 2]),           # not a map
    struct.pack(">I", 0),                                   # empty frame
    struct.pack(">I", 100 << 20),                           # oversized
])
def test_malformed_frames_get_error_and_close_and_server_survives(port, payload):
    p, svc = port
    s = raw(p)
    s.sendall(frame({"id": 1, "op": "hello", "secret": SECRET}))
    assert "ok" in read_frame(s)
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


def test_group_commit_shares_syncs_among_durable_writers(port):
    p, svc = port
    conns = [Connection("127.0.0.1", p.port, SECRET) for _ in range(8)]
    errs = []

    def client(i):
        try:
            for k in range(50):
                conns[i].request({"op": "insert", "ns": "g.c", "docs": [{"_id": f"{i}-{k}"}],
                                  "j": True})
        except Exception as e:  # pragma: no cover - reported below
            errs.append(e)

    syncs0 = svc.group.syncs
    ts = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errs
    syncs = svc.group.syncs - syncs0
    assert svc.group.durable.seq == 400
    assert syncs < 400  # durable writers shared flushes
    for c in conns:
        c.close()


def test_one_connection_shared_by_threads_answers_each_its_own(port):
    """Callers read for each other (no reader thread): every thread gets the
    answer to its own request, including while Futures join in mid-way."""
    p, svc = port
    c = Connection("127.0.0.1", p.port, SECRET)
    assert c._reader is None  # request() alone needs no thread
    errs, got = [], {}

    def client(i):
        try:
            for k in range(60):
                r = c.request({"op": "insert", "ns": "s.c", "docs": [{"_id": f"{i}-{k}"}],
                               "j": k % 3 == 0}, timeout_s=30)
                assert r["inserted_ids"] == [f"{i}-{k}"]
                n = c.request({"op": "count", "ns": "s.c", "filter": {"_id": f"{i}-{k}"}},
                              timeout_s=30)
                assert n["value"] == 1
            got[i] = True
        except Exception as e:  # pragma: no cover - reported below
            errs.append(e)

    ts = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for t in ts:
        t.start()
    futs = [c.submit({"op": "insert", "ns": "s.f", "docs": [{"_id": k}]}) for k in range(50)]
    for t in ts:
        t.join()
    assert not errs and len(got) == 6
    assert [f.result(10)["inserted_ids"] for f in futs] == [[k] for k in range(50)]
    assert c._reader is not None  # submit handed receiving to a reader thread
    assert c.request({"op": "count", "ns": "s.c"})["value"] == 360
    c.close()


def test_request_timeout_then_connection_loss_wakes_every_waiter(port):
    p, svc = port
    c = Connection("127.0.0.1", p.port, SECRET)
    blocker = busy_writer(svc)  # writes queue behind it
    with pytest.raises(TimeoutError):
        c.request({"op": "insert", "ns": "t.c", "docs": [{"_id": 1}]}, timeout_s=0.2)
    errs = []

    def waiter():
        try:
            c.request({"op": "insert", "ns": "t.c", "docs": [{"_id": 2}]})
        except Exception as e:
            errs.append(e)

    ts = [threading.Thread(target=waiter) for _ in range(3)]
    for t in ts:
        t.start()
    time.sleep(0.3)
    c.close()  # wakes the caller blocked in recv and those waiting for it
    for t in ts:
        t.join(5)
    assert not any(t.is_alive() for t in ts)
    assert len(errs) == 3 and all(isinstance(e, errors.ConnectionLost) for e in errs)
    blocker.set()
    c2 = Connection("127.0.0.1", p.port, SECRET)
    c2.request({"op": "insert", "ns": "t.c", "docs": [{"_id": 3}]})  # after the queued ones
    assert c2.request({"op": "count", "ns": "t.c", "filter": {"_id": 1}})["value"] == 1
    # a timeout is not a cancellation: the timed-out write ran once the writer was free
    c2.close()


def test_queued_writes_share_one_commit_and_a_failing_one_fails_alone(port):
    """Writes that queue behind a busy writer run as one LMDB transaction: one
    GTID each, in arrival order; a duplicate among them fails alone."""
    p, svc = port
    blocker = threading.Event()
    svc.on_writer(blocker.wait)
    answers = {}
    done = threading.Semaphore(0)

    def reply_for(k):
        def reply(ok=None, err=None):
            answers[k] = (ok, err)
            done.release()
        return reply
    reqs = [{"op": "insert", "ns": "q.c", "docs": [{"_id": k % 7}], "j": k % 2 == 0}
            for k in range(10)]  # _id 0..6, then 0, 1, 2 again: duplicates
    for k, r in enumerate(reqs):
        svc.handle(r, reply_for(k), {})
    groups0 = svc.write_groups
    blocker.set()
    for _ in reqs:
        assert done.acquire(timeout=10)
    assert svc.write_groups == groups0 + 1
    ok = [answers[k][0] for k in range(7)]
    assert [o["gtid"][1] for o in ok] == list(range(1, 8))  # dense, in arrival order
    assert all(isinstance(answers[k][1], errors.DuplicateKey) for k in (7, 8, 9))
    assert svc.group.durable.seq == 7  # the j=True ones were answered after the flush
    assert svc.e.verify_oplog() == 7


def test_a_member_that_hung_up_is_noticed_before_sending(tmp_path):
    """No reader thread watches an idle connection: the next request notices
    the hang-up first and is refused as not sent (safe to retry elsewhere)."""
    lim = Limits(frame_bytes_max=1 << 20, document_bytes_max=512 << 10)
    e = Engine(LMDBStore(str(tmp_path / "m"), map_bytes=1 << 30), lim)
    svc = ShardService(e, lim)
    p = ClientPort(svc, SECRET, "127.0.0.1", lim.frame_bytes_max, {"member": 0})
    try:
        for unix in (None, p.unix_path):
            c = Connection("127.0.0.1", p.port, SECRET, unix=unix)
            c.request({"op": "insert", "ns": "h.c", "docs": [{"_id": str(unix)}]})
            for conn in list(p._conns):
                p._loop.call_soon_threadsafe(conn.transport.close)
            time.sleep(0.2)
            with pytest.raises(errors.ConnectionLost) as ei:
                c.request({"op": "insert", "ns": "h.c", "docs": [{"_id": 1}]})
            assert ei.value.info.get("sent") is False
            assert c.closed
        assert svc.e.count("h.c", {}) == 2  # the refused requests never ran
    finally:
        p.close()
        svc.close()
        e.store.close()


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


def test_small_writes_run_on_the_port_thread_in_order_with_queued_ones(port):
    """Small autocommit writes run on the port's thread when the writer thread
    is idle; the others go to the writer. Pipelined on one connection, every
    write still commits in the order it was sent, also while the writer is busy."""
    p, svc = port
    c = Connection("127.0.0.1", p.port, SECRET)
    many = [{"_id": f"m{k}", "n": k} for k in range(svc.limits.port_insert_docs_max + 1)]
    reqs = []
    for k in range(30):
        reqs.append({"op": "insert", "ns": "o.c", "docs": [{"_id": k, "n": k}]})
        if k % 10 == 3:  # writer-thread work between the small ones
            reqs.append({"op": "update", "ns": "o.c", "filter": {}, "update": {"$inc": {"n": 1}},
                         "multi": True})
        if k == 20:
            reqs.append({"op": "insert", "ns": "o.c", "docs": many})
    inline0 = svc.port_writes
    futs = [c.submit(r) for r in reqs]
    seqs = [f.result(10)["gtid"][1] for f in futs]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert svc.port_writes > inline0  # most of them ran on the port's thread
    # the writer is busy: small writes queue behind it, and keep their order
    blocker = busy_writer(svc)
    futs = [c.submit({"op": "insert", "ns": "o.q", "docs": [{"_id": k}]}) for k in range(20)]
    time.sleep(0.2)
    assert not any(f.done() for f in futs)
    blocker.set()
    seqs = [f.result(10)["gtid"][1] for f in futs]
    assert seqs == list(range(seqs[0], seqs[0] + 20))
    # a write queued and not yet run (the writer took it, not yet the lock):
    # what arrives meanwhile must queue behind it, never overtake it on the port
    with svc._q.mutex:
        svc._q.unfinished_tasks += 1
    inline0 = svc.port_writes
    c.request({"op": "insert", "ns": "o.q", "docs": [{"_id": "late"}]})
    assert svc.port_writes == inline0
    deadline = time.monotonic() + 5  # the writer counts it done after answering
    while svc._q.unfinished_tasks > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    with svc._q.mutex:
        svc._q.unfinished_tasks -= 1
    for k in range(50):  # back on the port (unless a trim holds the writer just then)
        c.request({"op": "insert", "ns": "o.q", "docs": [{"_id": f"later{k}"}]})
        if svc.port_writes > inline0:
            break
    assert svc.port_writes > inline0
    assert c.request({"op": "count", "ns": "o.c", "filter": {"n": {"$gte": 0}}})["value"] == 95
    assert svc.e.verify_oplog() == seqs[-1] + 2 + k
    c.close()


def test_only_point_writes_run_on_the_port_thread(port):
    """An update or delete by _id runs on the port's thread; one whose filter
    may scan (no _id equality) goes to the writer thread, so it never holds
    the port."""
    p, svc = port
    c = Connection("127.0.0.1", p.port, SECRET)
    c.request({"op": "insert", "ns": "u.c", "docs": [{"_id": k, "n": k} for k in range(100)]})
    before = svc.port_writes
    for flt in ({"n": 3}, {"_id": {"$gt": 5}}, {}):
        c.request({"op": "update", "ns": "u.c", "filter": flt, "update": {"$inc": {"n": 1}}})
        c.request({"op": "delete", "ns": "u.c", "filter": flt})
    assert svc.port_writes == before
    # the writer answers before it marks its queue done: let it finish, so the
    # point writes find it idle (the condition for running on the port thread)
    deadline = time.monotonic() + 10
    while svc._q.unfinished_tasks and time.monotonic() < deadline:
        time.sleep(0.001)
    c.request({"op": "update", "ns": "u.c", "filter": {"_id": 50}, "update": {"$set": {"n": 0}}})
    c.request({"op": "delete", "ns": "u.c", "filter": {"_id": 51}})
    assert svc.port_writes >= before + 1  # (a trim holding the writer may send one away)
    c.close()


def test_a_transaction_holds_back_small_writes_of_other_connections(port):
    """An open transaction holds the writer: an autocommit write from another
    connection waits for its commit (never runs on the port thread meanwhile)."""
    p, svc = port
    a, b = Connection("127.0.0.1", p.port, SECRET), Connection("127.0.0.1", p.port, SECRET)
    txn = a.request({"op": "txnBegin"})["txn"]
    a.request({"op": "insert", "ns": "x.c", "docs": [{"_id": 1}], "txn": txn})
    f = b.submit({"op": "insert", "ns": "x.c", "docs": [{"_id": 2}]})
    time.sleep(0.2)
    assert not f.done()
    g_txn = a.request({"op": "txnCommit", "txn": txn})["gtid"]
    assert f.result(10)["gtid"][1] == g_txn[1] + 1
    a.close()
    b.close()


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
           ([msgpack.packb({"t": msgpack.ExtType(5, b"x")})], errors.InvalidDocument, "t"),
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


def _client(p):
    from raymx.actors.server import boot_id
    from raymx.client import Client
    topo = {"secret": SECRET, "members": [{"id": 0, "host": "127.0.0.1", "port": p.port,
                                           "unix": p.unix_path, "boot": boot_id(),
                                           "role": "primary"}]}
    return Client(lambda: topo)


def test_a_large_insert_many_goes_in_parts_as_one_statement(port, monkeypatch):
    """Past INSERT_PART_DOCS documents the driver sends parts, one frame each,
    decoded on arrival: one GTID for all, beyond one frame's size too; a bad
    document in a later part is named by its place in the whole batch and
    nothing is stored; a document the driver cannot pack cancels the parts sent."""
    from raymx.client import INSERT_PART_DOCS, collection
    monkeypatch.setattr(collection, "INSERT_PART_BYTES", 100_000)  # a part is several frames
    p, svc = port
    cl = _client(p)
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
    e = Engine(LMDBStore(str(tmp_path / "m"), map_bytes=1 << 30), lim)
    svc = ShardService(e, lim)
    p = ClientPort(svc, SECRET, "127.0.0.1", lim.frame_bytes_max, {"member": 0})
    try:
        c = Connection("127.0.0.1", p.port, SECRET)
        part = [msgpack.packb({"s": "y" * (300 << 10)}) for _ in range(3)]  # ~900 KB
        with pytest.raises(errors.TransactionTooLarge, match="transaction limit"):
            c.request({"op": "insert", "ns": "t.c"}, parts=[lambda: [{"packed": part}]] * 3)
        assert c.request({"op": "count", "ns": "t.c"})["value"] == 0
        c.close()
    finally:
        p.close()
        svc.close()
        e.store.close()


def test_answers_split_and_joined_across_receives_reach_their_callers(tmp_path):
    """The driver's receive path against a scripted member: an answer cut into
    one-byte pieces, two answers in one send, and an answer larger than one
    receive's buffer each reach the request they answer; a wait past its
    deadline raises TimeoutError and the connection stays usable."""
    path = str(tmp_path / "scripted.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    big = "y" * (600 << 10)  # > the 256 KiB receive buffer

    def member():
        s, _ = srv.accept()
        f = s.makefile("rb")

        def req():
            n = int.from_bytes(f.read(4), "big")
            return msgpack.unpackb(f.read(n))
        s.sendall(frame({"id": req()["id"], "ok": {"member": 0}}))  # hello
        a = frame({"id": req()["id"], "ok": {"value": "dribbled"}})
        for i in range(len(a)):
            s.sendall(a[i:i + 1])
            time.sleep(0.0005)
        s.sendall(frame({"id": req()["id"], "ok": {"value": big}}))
        slow = req()
        time.sleep(0.4)  # past the caller's deadline
        s.sendall(frame({"id": slow["id"], "ok": {"value": "late"}}))
        s.sendall(frame({"id": req()["id"], "ok": {"value": "after"}}))
        r1, r2 = req(), req()
        s.sendall(frame({"id": r2["id"], "ok": {"value": 2}}) + frame({"id": r1["id"], "ok": {"value": 1}}))
        time.sleep(0.5)
        s.close()
    t = threading.Thread(target=member, daemon=True)
    t.start()
    c = Connection("127.0.0.1", 0, SECRET, frame_bytes_max=2 << 20, unix=path)
    try:
        assert c.request({"op": "find"}, timeout_s=5)["value"] == "dribbled"
        assert c.request({"op": "find"}, timeout_s=5)["value"] == big
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            c.request({"op": "find"}, timeout_s=0.15)
        assert time.monotonic() - t0 < 0.35  # within one receive slice of the deadline
        assert c.request({"op": "find"}, timeout_s=5)["value"] == "after"  # "late" was dropped
        f1, f2 = c.submit({"op": "find"}), c.submit({"op": "find"})  # one send, both answers
        assert (f1.result(5)["value"], f2.result(5)["value"]) == (1, 2)
    finally:
        c.close()
        srv.close()
        t.join(5)


def test_a_write_after_a_small_one_in_the_same_read_runs_once(port):
    """A small write and one that must go to the writer thread (a multi update,
    a transaction) arriving in one read: each runs once and is answered once."""
    p, svc = port
    c = Connection("127.0.0.1", p.port, SECRET)
    c.request({"op": "insert", "ns": "d.c", "docs": [{"_id": "ctr", "n": 0}]})
    s = raw(p)
    s.sendall(frame({"id": 1, "op": "hello", "secret": SECRET}))
    assert "ok" in read_frame(s)
    s.sendall(frame({"id": 10, "op": "insert", "ns": "d.c", "docs": [{"_id": 1}]})
              + frame({"id": 11, "op": "update", "ns": "d.c", "filter": {"_id": "ctr"},
                       "multi": True, "update": {"$inc": {"n": 1}}})
              + frame({"id": 12, "op": "insert", "ns": "d.c", "docs": [{"_id": 2}]})
              + frame({"id": 13, "op": "txnBegin"}))
    answers = [read_frame(s) for _ in range(4)]
    assert sorted(a["id"] for a in answers) == [10, 11, 12, 13]
    assert all("ok" in a for a in answers), answers
    txn = next(a["ok"]["txn"] for a in answers if a["id"] == 13)
    s.sendall(frame({"id": 14, "op": "txnAbort", "txn": txn}))
    assert read_frame(s) == {"id": 14, "ok": {"aborted": True}}
    s.settimeout(0.3)  # and nothing more: no second answer to any of them
    with pytest.raises(socket.timeout):
        s.recv(1)
    assert c.request({"op": "find", "ns": "d.c", "filter": {"_id": "ctr"}})["docs"] == [
        {"_id": "ctr", "n": 1}]
    s.close()
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


def test_a_failure_after_a_group_commit_answers_that_write_and_keeps_the_writer(port, monkeypatch):
    """A bug while acknowledging one write of a group (here: injected) answers
    that write with an internal error; the rest are answered and the writer
    thread lives on."""
    p, svc = port
    c = Connection("127.0.0.1", p.port, SECRET)
    ack = svc._acknowledge

    def flaky(g, res, req, reply):
        if req.get("docs") == [{"_id": "bad"}]:
            raise RuntimeError("injected")
        return ack(g, res, req, reply)
    monkeypatch.setattr(svc, "_acknowledge", flaky)
    blocker = busy_writer(svc)
    futs = [c.submit({"op": "insert", "ns": "f.c", "docs": [{"_id": k}]})
            for k in (1, "bad", 2)]
    blocker.set()
    with pytest.raises(errors.RaymxError, match="injected"):
        futs[1].result(5)
    assert futs[0].result(5)["inserted_ids"] == [1] and futs[2].result(5)["inserted_ids"] == [2]
    assert svc._writer.is_alive()
    blocker = busy_writer(svc)  # the writer thread still runs writes
    f = c.submit({"op": "insert", "ns": "f.c", "docs": [{"_id": 3}]})
    blocker.set()
    assert f.result(5)["inserted_ids"] == [3]
    c.close()


def _hello(p):
    s = raw(p)
    s.sendall(frame({"id": 1, "op": "hello", "secret": SECRET}))
    assert "ok" in read_frame(s)
    return s


def wait_for(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_a_find_still_running_when_its_client_leaves_keeps_no_cursor(port):
    """The find waits (read after a GTID not yet written) while its connection
    closes; when it runs, its cursor is closed at once (it holds an LMDB
    snapshot, and nobody can ask for more)."""
    p, svc = port
    c = Connection("127.0.0.1", p.port, SECRET)
    c.request({"op": "insert", "ns": "k.c", "docs": [{"_id": i} for i in range(50)]})
    last, _ = svc.e.last()
    s = _hello(p)
    s.sendall(frame({"id": 2, "op": "find", "ns": "k.c", "batch": 1,
                     "after": [last.term, last.seq + 1], "after_timeout_ms": 5000}))
    time.sleep(0.2)
    s.close()
    wait_for(lambda: p.connections == 1)
    c.request({"op": "insert", "ns": "k.c", "docs": [{"_id": 99}]})  # the find runs now
    time.sleep(0.3)
    assert svc.status()["open_cursors"] == 0
    # a live client's cursors: open while it reads, forgotten when exhausted
    out = c.request({"op": "find", "ns": "k.c", "batch": 20})
    assert out["cursor"] and svc.status()["open_cursors"] == 1
    while out["cursor"]:
        cid = out["cursor"]
        out = c.request({"op": "getMore", "cursor": cid, "batch": 20})
    assert svc.status()["open_cursors"] == 0
    c.close()


def test_idle_cursors_expire(tmp_path):
    lim = Limits(cursor_idle_ms=300, sync_interval_ms=20)
    e = Engine(LMDBStore(str(tmp_path / "m"), map_bytes=1 << 30), lim)
    svc = ShardService(e, lim)
    p = ClientPort(svc, SECRET, "127.0.0.1", lim.frame_bytes_max, {"member": 0})
    try:
        c = Connection("127.0.0.1", p.port, SECRET)
        c.request({"op": "insert", "ns": "i.c", "docs": [{"_id": i} for i in range(100)]})
        idle = c.request({"op": "find", "ns": "i.c", "batch": 2})["cursor"]
        busy = c.request({"op": "find", "ns": "i.c", "batch": 2})["cursor"]
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:  # one is used, the other left alone
            assert len(c.request({"op": "getMore", "cursor": busy, "batch": 1})["docs"]) == 1
            time.sleep(0.1)
        c.request({"op": "find", "ns": "i.c", "batch": 2})  # a cursor opens: the sweep runs
        with pytest.raises(errors.InvalidOperation, match="not found"):
            c.request({"op": "getMore", "cursor": idle})
        assert c.request({"op": "getMore", "cursor": busy, "batch": 1})["docs"]
        assert svc.status()["open_cursors"] == 2
        c.close()
    finally:
        p.close()
        svc.close()
        e.store.close()


def test_two_first_submits_while_a_caller_reads_both_return(port):
    """Thread A reads the socket for its own answer; B and C make their first
    submits meanwhile: one starts the reader thread, the other must not wait for
    a hand-over that never comes."""
    p, svc = port
    c = Connection("127.0.0.1", p.port, SECRET)
    blocker = busy_writer(svc)
    ta = threading.Thread(target=c.request, args=(
        {"op": "insert", "ns": "s.c", "docs": [{"_id": "a"}]}, 20))
    ta.start()
    wait_for(lambda: c._reading)
    futs = {}
    subs = [threading.Thread(target=lambda k=k: futs.setdefault(k, c.submit(
        {"op": "count", "ns": "s.c"})), daemon=True) for k in "BC"]
    for t in subs:
        t.start()
    wait_for(lambda: c._waiting == 2)
    blocker.set()
    ta.join(5)
    for t in subs:
        t.join(5)
        assert not t.is_alive(), "submit never returned"
    assert all(futs[k].result(5)["value"] in (0, 1) for k in "BC")  # reads pass writes
    c.close()


def test_a_cancelled_future_leaves_the_connection_serving(port):
    p, svc = port
    c = Connection("127.0.0.1", p.port, SECRET)
    blocker = busy_writer(svc)
    f1 = c.submit({"op": "insert", "ns": "x.c", "docs": [{"_id": 1}]})
    f2 = c.submit({"op": "insert", "ns": "x.c", "docs": [{"_id": 2}]})
    assert f1.cancel()  # the caller gave up; the write itself still runs
    blocker.set()
    assert f2.result(5)["inserted_ids"] == [2]
    assert c.request({"op": "count", "ns": "x.c"}, timeout_s=5)["value"] == 2
    assert c._reader.is_alive()
    c.close()


def test_a_request_deadline_holds_while_the_member_does_not_read():
    """A member that answers hello and then never reads again (hung, cut off):
    a request gives up at its deadline even while its frame cannot go, and
    says whether anything was sent."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    held = []

    def member():
        s, _ = srv.accept()
        held.append(s)
        hello = read_frame(s)
        s.sendall(frame({"id": hello["id"], "ok": {"member": 0}}))
    t = threading.Thread(target=member, daemon=True)
    t.start()
    c = Connection("127.0.0.1", srv.getsockname()[1], SECRET, timeout_s=5)
    big = [{"_id": i, "x": "y" * 1000} for i in range(20_000)]  # far more than socket buffers
    t0 = time.monotonic()
    with pytest.raises(errors.ConnectionLost) as ei:
        c.request({"op": "insert", "ns": "a.b", "docs": big}, timeout_s=1.0)
    assert time.monotonic() - t0 < 4
    assert ei.value.info.get("sent") is False and c.closed
    # nothing of a frame went: a TimeoutError and the connection stays
    t = threading.Thread(target=member, daemon=True)
    t.start()
    c2 = Connection("127.0.0.1", srv.getsockname()[1], SECRET, timeout_s=5)
    c2._send_lock.acquire()  # another thread's frame holds the connection
    try:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="not sent"):
            c2.request({"op": "count", "ns": "a.b"}, timeout_s=0.5)
        assert time.monotonic() - t0 < 3 and not c2.closed and not c2._pending
    finally:
        c2._send_lock.release()
    c2.close()
    for s in held:
        s.close()
    srv.close()


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


def test_a_transaction_begin_that_timed_out_is_aborted_not_left_holding_the_writer(tmp_path):
    """c2's txnBegin waits behind c1's transaction and times out at c2: the
    driver cancels it, so when c1 commits the member aborts that transaction
    at once instead of holding the writer for its whole lifetime."""
    from raymx.client import Client
    lim = Limits(transaction_lifetime_ms=20_000, sync_interval_ms=20)
    e = Engine(LMDBStore(str(tmp_path / "m"), map_bytes=1 << 30), lim)
    svc = ShardService(e, lim)
    p = ClientPort(svc, SECRET, "127.0.0.1", lim.frame_bytes_max, {"member": 0})
    topo = {"secret": SECRET, "members": [{"id": 0, "host": "127.0.0.1", "port": p.port,
                                           "role": "primary"}]}
    c1, c2 = Client(lambda: topo, timeout_s=10), Client(lambda: topo, timeout_s=0.5)
    try:
        tx1 = c1.transaction().__enter__()
        tx1["a"]["b"].insert_one({"_id": "t1"})
        with pytest.raises(TimeoutError):
            with c2.transaction() as tx2:
                tx2["a"]["b"].insert_one({"_id": "t2"})
        tx1.commit()
        t0 = time.monotonic()
        c1["a"]["b"].insert_one({"_id": "after"})
        assert time.monotonic() - t0 < 3  # not the 20 s lifetime of an orphan
        assert [d["_id"] for d in c1["a"]["b"].find()] == ["after", "t1"]
        with c2.transaction() as tx2:  # c2's connection serves transactions as before
            tx2["a"]["b"].insert_one({"_id": "t2"})
        assert c1["a"]["b"].count_documents({}) == 3
    finally:
        c1.close()
        c2.close()
        p.close()
        svc.close()
        e.store.close()


def test_a_future_callback_may_wait_on_the_same_connection(port):
    """A Future's callback runs on the thread reading the connection; a request
    it makes there reads its own answer instead of waiting for itself."""
    p, svc = port
    c = Connection("127.0.0.1", p.port, SECRET)
    blocker = busy_writer(svc)  # the insert is answered only after the callback is set
    f = c.submit({"op": "insert", "ns": "cb.c", "docs": [{"_id": 1}]})
    got, where = [], []

    def after(fut):
        where.append(threading.current_thread())
        got.append(c.request({"op": "count", "ns": "cb.c"}, timeout_s=3)["value"])
    f.add_done_callback(after)
    blocker.set()
    wait_for(lambda: got)
    assert got == [1] and where == [c._reader]
    assert c.request({"op": "count", "ns": "cb.c"}, timeout_s=3)["value"] == 1
    c.close()


def test_a_cursor_killed_during_its_get_more_is_closed_when_that_ends(port):
    """killCursors (or the client leaving) while a getMore holds the cursor:
    the cursor is closed when the getMore ends, not put back until idle expiry."""
    p, svc = port
    c = Connection("127.0.0.1", p.port, SECRET)
    c.request({"op": "insert", "ns": "gk.c", "docs": [{"_id": i} for i in range(20)]})
    cid = c.request({"op": "find", "ns": "gk.c", "batch": 2})["cursor"]
    cur, inside, go = svc._cursors[cid], threading.Event(), threading.Event()
    rest = cur.it

    def slow():
        inside.set()
        go.wait(5)
        yield from rest
    cur.it = slow()
    f = c.submit({"op": "getMore", "cursor": cid, "batch": 2})
    assert inside.wait(5)
    assert c.request({"op": "killCursors", "cursors": [cid]}, timeout_s=5) == {}
    go.set()
    out = f.result(5)
    assert len(out["docs"]) == 2 and out["cursor"] == 0  # its batch, and no more
    assert svc.status()["open_cursors"] == 0
    with pytest.raises(errors.InvalidOperation, match="not found"):
        c.request({"op": "getMore", "cursor": cid}, timeout_s=5)
    c.close()


def test_large_documents_come_back_in_batches_that_fit_a_frame(port):
    """Batches are cut by the documents' encoded size, so whatever was stored
    can be read (here 40 documents of 200 KB through a 1 MiB frame limit); a
    find in a transaction that cannot fit one answer says so and the
    connection stays."""
    p, svc = port
    c = _client(p)
    coll = c["big"]["c"]
    for k in range(0, 40, 4):  # 800 KB per insert (a frame of this port holds 1 MiB)
        coll.insert_many([{"_id": i, "s": "x" * 200_000} for i in range(k, k + 4)])
    got = [d["_id"] for d in coll.find()]
    assert got == list(range(40))
    assert [d["_id"] for d in coll.find(batch_size=3)] == list(range(40))
    with c.transaction() as tx:
        with pytest.raises(errors.InvalidOperation, match="inside a transaction"):
            list(tx["big"]["c"].find())
        assert len(list(tx["big"]["c"].find({"_id": {"$lt": 3}}))) == 3
    assert coll.count_documents({}) == 40
    c.close()


@pytest.mark.parametrize("flt", [None, [], "", 0, False, "x"])
def test_updates_and_deletes_need_a_filter_map(port, flt):
    """A filter that is not a map is refused, never taken as "every document"."""
    p, svc = port
    c = _client(p)
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


def test_a_write_that_times_out_says_its_outcome_is_unknown(port):
    p, svc = port
    c = _client(p)
    c.timeout_s = 0.5
    blocker = busy_writer(svc)
    with pytest.raises(errors.RequestTimeout) as ei:
        c["to"]["c"].insert_one({"_id": 1})
    assert isinstance(ei.value, TimeoutError) and ei.value.info["outcome"] == "unknown"
    assert "may still be applied" in str(ei.value)
    blocker.set()
    wait_for(lambda: c["to"]["c"].count_documents({}) == 1)  # it was: the caller was told so
    c.close()


def test_a_thread_inside_a_transaction_cannot_wait_for_itself(port):
    """A write outside the transaction, or a second transaction, on the thread
    holding one open would wait for it until the timeout: refused at once."""
    p, svc = port
    c = _client(p)
    c.timeout_s = 5
    coll = c["tt"]["c"]
    other = []
    with c.transaction() as tx:
        tx["tt"]["c"].insert_one({"_id": "in"})
        t0 = time.monotonic()
        with pytest.raises(errors.InvalidOperation, match="transaction open"):
            coll.insert_one({"_id": "out"})
        with pytest.raises(errors.InvalidOperation, match="transaction open"):
            with c.transaction():
                pass
        assert time.monotonic() - t0 < 1
        t = threading.Thread(target=lambda: other.append(coll.insert_one({"_id": "other"})))
        t.start()  # another thread's write waits for the transaction, as documented
        time.sleep(0.2)
        assert not other
    t.join(5)
    assert other and sorted(d["_id"] for d in coll.find()) == ["in", "other"]
    coll.insert_one({"_id": "after"})
    c.close()
