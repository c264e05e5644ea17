"""What the client port's tests share: a member's client port served in
process (real LMDB, real sockets, no Ray), raw frames, and a driver ``Client``
of it."""
import contextlib
import socket
import struct
import threading
import time

import msgpack
import pytest

from raymx.actors.server import ClientPort
from raymx.actors.shard import ShardService
from raymx.storage.engine import Engine
from raymx.storage.limits import Limits
from raymx.storage.lmdb_store import LMDBStore

SECRET = "s3cret"


@contextlib.contextmanager
def serving(tmp_path, lim: Limits, tls: dict | None = None, make_port=None):
    """(port, service) of a fresh engine under ``tmp_path`` with limits ``lim``
    (and TLS settings ``tls``); all closed afterwards. ``make_port(svc)``: a
    port of another kind (the MongoDB wire port) instead of the client port."""
    e = Engine(LMDBStore(str(tmp_path / "m"), map_bytes=1 << 30), lim)
    svc = ShardService(e, lim)
    p = make_port(svc) if make_port is not None else ClientPort(
        svc, SECRET, "127.0.0.1", lim.frame_bytes_max, {"member": 0}, limits=lim, tls=tls)
    try:
        yield p, svc
    finally:
        p.close()
        svc.close()
        e.store.close()


@pytest.fixture
def port(tmp_path):
    lim = Limits(frame_bytes_max=1 << 20, document_bytes_max=512 << 10, sync_interval_ms=20)
    with serving(tmp_path, lim) as served:
        yield served


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


def raw_after_hello(p):
    """A raw socket to port ``p`` past its hello."""
    s = raw(p)
    s.sendall(frame({"id": 1, "op": "hello", "secret": SECRET}))
    assert "ok" in read_frame(s)
    return s


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


def client_of(p):
    """A driver ``Client`` of port ``p`` alone (its member the primary)."""
    from raymx.actors.server import boot_id
    from raymx.client import Client
    topo = {"secret": SECRET, "members": [{"id": 0, "host": "127.0.0.1", "port": p.port,
                                           "unix": p.unix_path, "boot": boot_id(),
                                           "role": "primary"}]}
    return Client(lambda: topo)


def wait_for(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)
