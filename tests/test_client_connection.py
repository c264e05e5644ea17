"""The driver's ``Connection`` against a port or a scripted member: one
socket shared by threads and pipelined (callers read for each other, Futures
and their callbacks), deadlines, members that hang up or stop reading."""
import os
import socket
import subprocess
import sys
import threading
import time

import msgpack
import pytest

from raymx import errors
from raymx.client import Connection
from raymx.storage.limits import Limits
from tests.port_helpers import SECRET, busy_writer, frame, read_frame, serving, wait_for
from tests.port_helpers import port  # noqa: F401 (the fixture)


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


def test_a_member_that_hung_up_is_noticed_before_sending(tmp_path):
    """No reader thread watches an idle connection: the next request notices
    the hang-up first and is refused as not sent (safe to retry elsewhere)."""
    lim = Limits(frame_bytes_max=1 << 20, document_bytes_max=512 << 10)
    with serving(tmp_path, lim) as (p, svc):
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


_SCRIPTED_MEMBER = """
import socket, sys, time
from raymx.storage import codec
ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
ls.bind(sys.argv[1])
ls.listen(1)
print("ready", flush=True)
s, _ = ls.accept()
def read(n):
    b = s.recv(n, socket.MSG_WAITALL)
    if len(b) < n:  # the caller hung up
        raise SystemExit
    return b
while True:
    req = codec.unpack_frame(read(codec.frame_length(read(4), 1 << 20)))
    time.sleep(0.02)  # the request is read now; the answer comes later
    s.sendall(codec.pack_frame({"id": req["id"], "ok": {"member": 0}}))
"""


def _voluntary_switches() -> int:
    with open("/proc/thread-self/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc/thread-self/status")


def test_a_caller_waiting_over_a_unix_socket_sleeps_once_per_answer(tmp_path):
    """A caller waits for its answer in poll(), not inside recv(): asleep in
    recv() on a Unix socket it was also woken when the member read its
    request, and went back to sleep (two sleeps per request, measured). The
    member is another process, so no thread of this one shares the GIL."""
    if not os.path.exists("/proc/thread-self/status"):
        pytest.skip("needs Linux's /proc/thread-self")
    path = str(tmp_path / "m.sock")
    member = subprocess.Popen([sys.executable, "-c", _SCRIPTED_MEMBER, path],
                              stdout=subprocess.PIPE)
    try:
        assert member.stdout.readline().startswith(b"ready")
        c = Connection(None, 0, SECRET, unix=path)
        c.request({"op": "ping"}, timeout_s=5)
        before, n = _voluntary_switches(), 20
        for _ in range(n):
            assert c.request({"op": "ping"}, timeout_s=5) == {"member": 0}
        per_request = (_voluntary_switches() - before) / n
        assert per_request <= 1.5, f"{per_request} sleeps per request"
        c.close()
    finally:
        member.kill()
        member.wait()
