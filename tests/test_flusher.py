"""The flush helper: durable writers flushed by a helper process while the
port goes on, never answered before a flush covers them, and a member that
flushes itself when the helper is gone. Real LMDB, real sockets, real process."""
import asyncio
import os
import signal
import threading
import time

import pytest

from raymx.actors.flusher import Flusher
from raymx.actors.server import ClientPort
from raymx.actors.shard import ShardService
from raymx.client import Connection
from raymx.storage.engine import Engine
from raymx.storage.gtid import GTID
from raymx.storage.limits import Limits
from raymx.storage.lmdb_store import LMDBStore

SECRET = "s3cret"


def serve(tmp_path, **kw):
    lim = Limits(sync_interval_ms=20, **kw)
    e = Engine(LMDBStore(str(tmp_path / "m"), map_bytes=1 << 30), lim)
    svc = ShardService(e, lim)
    p = ClientPort(svc, SECRET, "127.0.0.1", lim.frame_bytes_max, {"member": 0})
    return e, svc, p


def stop(e, svc, p):
    p.close()
    svc.close()
    e.store.close()


@pytest.fixture
def member(tmp_path):
    e, svc, p = serve(tmp_path)
    yield svc, p
    stop(e, svc, p)


def durable_writers(svc, p, n_clients, per_client, tag):
    """``n_clients`` connections inserting ``j=True`` concurrently. Each answer
    is checked against the member's durable point the moment it arrives: a
    durable writer answered before a flush covered it fails here."""
    conns = [Connection("127.0.0.1", p.port, SECRET) for _ in range(n_clients)]
    early, errs = [], []

    def client(i):
        try:
            for k in range(per_client):
                r = conns[i].request({"op": "insert", "ns": "f.c", "j": True,
                                      "docs": [{"_id": f"{tag}-{i}-{k}", "k": k}]})
                g, durable = GTID(*r["gtid"]), svc.group.durable
                if durable is None or g > durable:
                    early.append((g, durable))
        except Exception as e:  # reported below
            errs.append(e)

    ts = [threading.Thread(target=client, args=(i,)) for i in range(n_clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    for c in conns:
        c.close()
    assert not errs, errs[:3]
    assert not early, f"answered before durable: {early[:3]}"


def test_concurrent_durable_writers_are_flushed_by_the_helper_never_early(member):
    svc, p = member
    assert svc.flusher is not None and svc.status()["flusher"]["pid"] == svc.flusher.pid
    durable_writers(svc, p, 8, 40, "a")
    assert svc.flusher.flushes > 0            # concurrent writers went through the helper
    assert svc.group.durable.seq == 320       # every one of them is durable
    assert svc.group.syncs < 320              # and they shared flushes
    assert svc.e.verify_oplog() == 320


def test_a_lone_durable_writer_is_flushed_inline(member):
    svc, p = member
    durable_writers(svc, p, 1, 30, "lone")
    assert svc.flusher.flushes == 0  # one at a time: the port's thread flushes itself
    assert svc.group.durable.seq == 30


def test_a_killed_helper_is_noticed_and_the_member_flushes_itself(member):
    svc, p = member
    durable_writers(svc, p, 8, 10, "before")
    pid = svc.flusher.pid
    os.kill(pid, signal.SIGKILL)              # the helper this test's member started
    deadline = time.monotonic() + 10
    while svc.flusher.failed is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert svc.flusher.failed and "exited" in svc.flusher.failed
    durable_writers(svc, p, 8, 20, "after")   # still durable, still never early
    assert svc.group.durable.seq == 80 + 160
    assert svc.status()["flusher"]["failed"]


def test_the_helper_can_be_switched_off(tmp_path):
    e, svc, p = serve(tmp_path, flush_helper=False)
    try:
        assert svc.flusher is None and svc.status()["flusher"] is None
        durable_writers(svc, p, 4, 10, "off")
        assert svc.group.durable.seq == 40
    finally:
        stop(e, svc, p)


def test_flusher_one_flush_at_a_time_answered_on_the_loop(tmp_path):
    path = str(tmp_path / "data")
    with open(path, "wb") as f:
        f.write(b"\0" * 8192)
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    got, done = [], threading.Event()

    def on_done(ok):
        got.append((ok, threading.get_ident() == t.ident))
        done.set()
    fl = Flusher(path, loop, on_done)
    try:
        fd = os.open(path, os.O_WRONLY)
        os.pwrite(fd, b"x" * 4096, 4096)
        os.close(fd)
        started = loop.call_soon_threadsafe
        res = []
        started(lambda: res.extend([fl.start(), fl.start()]))  # the second: one in flight
        assert done.wait(10)
        assert res == [True, False]
        assert got == [(True, True)] and fl.flushes == 1 and not fl.busy
        done.clear()
        os.kill(fl.pid, signal.SIGKILL)  # a dead helper: reported, never "flushed"
        fl.proc.wait(10)
        deadline = time.monotonic() + 10
        while fl.failed is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fl.failed
        res.clear()
        started(lambda: res.append(fl.start()))
        deadline = time.monotonic() + 10
        while not res and time.monotonic() < deadline:
            time.sleep(0.01)
        assert res == [False] and got == [(True, True)]
    finally:
        fl.close()
        loop.call_soon_threadsafe(loop.stop)
        t.join(5)
        loop.close()
