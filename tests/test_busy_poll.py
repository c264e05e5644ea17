"""A port's busy polling (``Limits.port_busy_poll_us``, ``server.BusyPoll``):
after traffic its event loop polls instead of sleeping, serves every request
while it does, lets the other threads of the member run, and goes back to
sleep once the connections are quiet. Real ports in process (real LMDB, real
sockets), the driver and pymongo as clients."""
import os
import threading
import time

import pymongo
import pytest

from raymx.storage.errors import ConfigError
from raymx.storage.limits import Limits
from raymx.wire.server import WirePort
from tests.port_helpers import SECRET, client_of, serving, wait_for

WINDOW_US = 10_000  # the longest allowed: easy to see


def thread_cpu_s(native_id: int) -> float:
    with open(f"/proc/self/task/{native_id}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def quiet_after(port) -> None:
    """Once the window has passed with no traffic, the port's thread sleeps:
    under a fifth of a core over a second (a polling loop takes all of one;
    a driver's own periodic requests, as pymongo's, poll a window each)."""
    time.sleep(port.poll.window_s * 3)
    tid = port._t.native_id
    c0 = thread_cpu_s(tid)
    time.sleep(1.0)
    assert thread_cpu_s(tid) - c0 < 0.2, "the port kept polling with no traffic"


def test_limits_bound_the_window():
    assert Limits(port_busy_poll_us=0).port_busy_poll_us == 0  # off
    assert Limits().port_busy_poll_us > 0                      # on by default
    for bad in (-1, 10_001, 1.5, True, "200"):
        with pytest.raises(ConfigError, match="port_busy_poll_us"):
            Limits(port_busy_poll_us=bad)
    with pytest.raises(ConfigError, match="write_group_max must be a positive integer"):
        Limits(write_group_max=0)  # zero stays refused everywhere else


def test_client_port_polls_after_traffic_then_sleeps(tmp_path):
    with serving(tmp_path, Limits(port_busy_poll_us=WINDOW_US, sync_interval_ms=20)) as (p, _):
        cl = client_of(p)
        coll = cl["app"]["c"]
        quiet_after(p)  # after the hello and the topology's requests
        before = p.poll.turns
        for i in range(50):
            coll.insert_one({"_id": i, "v": i}, j=True)
            assert coll.find_one({"_id": i}) == {"_id": i, "v": i}
        assert p.poll.turns > before, "no polling turn after 100 requests"
        quiet_after(p)  # the port's thread sleeps again
        assert 0 < p.poll.polled_s < 5
        cl.close()


def test_polling_lets_the_writer_thread_run(tmp_path):
    """While a client keeps the port polling, writes that go to the writer
    thread (an insert of more than ``port_insert_docs_max`` documents) and a
    plain Python thread of the process still get the GIL and finish. The
    busy loop and the big insert share the client's one connection, so the
    port keeps polling throughout (it polls for one connection at a time)."""
    lim = Limits(port_busy_poll_us=WINDOW_US, port_insert_docs_max=4, sync_interval_ms=20)
    with serving(tmp_path, lim) as (p, _):
        stop = threading.Event()
        busy_err: list = []
        cl = client_of(p)

        def keep_busy():
            try:
                i = 0
                while not stop.is_set():
                    cl["app"]["busy"].insert_one({"_id": i}, j=False)
                    i += 1
            except Exception as e:  # the assertion below says what it was
                busy_err.append(e)

        t = threading.Thread(target=keep_busy, daemon=True)
        t.start()
        try:
            wait_for(lambda: p.poll.turns > 0)
            before = p.poll.turns
            r = cl["app"]["big"].insert_many([{"_id": i} for i in range(500)], j=True)
            assert len(r.inserted_ids) == 500
            counted = []
            worker = threading.Thread(target=lambda: counted.append(sum(range(200_000))))
            worker.start()
            worker.join(10)
            assert counted == [sum(range(200_000))]
            assert cl["app"]["big"].count_documents({}) == 500
            assert p.poll.turns > before, "the port stopped polling: the test shows nothing"
        finally:
            stop.set()
            t.join(10)
            cl.close()
        assert not busy_err, busy_err
        quiet_after(p)


def test_polling_waits_while_two_connections_are_active(tmp_path):
    """Two clients taking turns keep the loop busy between them: the port
    does not poll for them (it would split their writes into smaller groups
    and take the CPU their processes need); one client alone again, and it
    polls."""
    with serving(tmp_path, Limits(port_busy_poll_us=WINDOW_US, sync_interval_ms=20)) as (p, _):
        a, b = client_of(p), client_of(p)
        ca, cb = a["app"]["c"], b["app"]["c"]
        ca.insert_one({"_id": 0, "v": 0})
        try:
            quiet_after(p)
            polled = p.poll.polled_s
            for _ in range(100):
                assert ca.find_one({"_id": 0}) == {"_id": 0, "v": 0}
                assert cb.find_one({"_id": 0}) == {"_id": 0, "v": 0}
            quiet_after(p)
            together = p.poll.polled_s - polled
            # at most the stretch before the second connection's first request
            # (polling throughout would take the 200 requests' time and a window)
            assert together < WINDOW_US / 1e6 / 2, f"polled {together:.4f} s for two clients"
            polled = p.poll.polled_s
            for _ in range(100):
                assert ca.find_one({"_id": 0}) == {"_id": 0, "v": 0}
            quiet_after(p)
            alone = p.poll.polled_s - polled
            assert alone >= WINDOW_US / 1e6, f"polled {alone:.4f} s for one client"
        finally:
            a.close()
            b.close()


def test_no_polling_when_off(tmp_path):
    with serving(tmp_path, Limits(port_busy_poll_us=0, sync_interval_ms=20)) as (p, _):
        cl = client_of(p)
        for i in range(20):
            cl["app"]["c"].insert_one({"_id": i})
        assert cl["app"]["c"].count_documents({}) == 20
        assert p.poll.turns == 0 and p.poll.polled_s == 0
        cl.close()


def test_wire_port_polls_after_traffic_then_sleeps(tmp_path):
    lim = Limits(port_busy_poll_us=WINDOW_US, sync_interval_ms=20)
    with serving(tmp_path, lim, make_port=lambda svc: WirePort(
            svc, SECRET, "127.0.0.1", {"member": 0, "replset": "rs"})) as (p, _):
        c = pymongo.MongoClient(
            f"mongodb://raymx:{SECRET}@127.0.0.1:{p.port}/?replicaSet=rs"
            "&authMechanism=SCRAM-SHA-256", serverSelectionTimeoutMS=10_000,
            heartbeatFrequencyMS=60_000, serverMonitoringMode="poll")
        try:
            coll = c["app"]["c"]
            coll.insert_one({"_id": 0})
            quiet_after(p)
            before = p.poll.turns
            for i in range(1, 30):
                coll.insert_one({"_id": i})
                assert coll.find_one({"_id": i}) == {"_id": i}
            assert p.poll.turns > before
            quiet_after(p)
        finally:
            c.close()
