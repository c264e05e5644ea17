"""Doorbells between a member's co-located processes (no Ray)."""
import threading
import time

from raymx.actors import doorbell


def test_rings_wake_the_listener_and_coalesce(tmp_path):
    woke = threading.Event()
    n = [0]

    def on_ring():
        n[0] += 1
        woke.set()
    lis = doorbell.Listener(str(tmp_path), "applier", on_ring)
    try:
        assert lis.ok
        bell = doorbell.Bell(str(tmp_path), "applier")
        for _ in range(1000):
            assert bell.ring()  # a full queue still counts as rung
        assert woke.wait(5)
        time.sleep(0.1)
        assert 1 <= n[0] <= 1000
        # another member's folder, or another role, is another doorbell
        assert not doorbell.Bell(str(tmp_path / "other"), "applier").ring()
        assert not doorbell.Bell(str(tmp_path), "feeder").ring()
    finally:
        lis.close()
    assert not doorbell.Bell(str(tmp_path), "applier").ring()  # nobody listens any more


def test_a_second_listener_takes_over_when_the_first_is_gone(tmp_path):
    first = doorbell.Listener(str(tmp_path), "feeder", lambda: None)
    woke = threading.Event()
    second = doorbell.Listener(str(tmp_path), "feeder", woke.set, retry_s=5)
    try:
        assert first.ok and not second.ok  # the name is held (a predecessor exiting)
        first.close()
        deadline = time.monotonic() + 5
        while not second.ok and time.monotonic() < deadline:
            time.sleep(0.05)
        assert second.ok
        assert doorbell.Bell(str(tmp_path), "feeder").ring()
        assert woke.wait(5)
    finally:
        first.close()
        second.close()


def test_rings_can_carry_values_delivered_in_order(tmp_path):
    got, done = [], threading.Event()

    def on_ring(values):
        got.extend(values)
        if got and got[-1] == b"last":
            done.set()
    lis = doorbell.Listener(str(tmp_path), "majority", on_ring, with_data=True)
    try:
        bell = doorbell.Bell(str(tmp_path), "majority")
        sent = [i.to_bytes(16, "big") for i in range(50)] + [b"last"]
        for v in sent:  # the kernel queues a few (net.unix.max_dgram_qlen): pace them
            deadline = time.monotonic() + 5
            while not bell.ring(v):
                assert time.monotonic() < deadline
                time.sleep(0.001)
        assert done.wait(5)
        assert got == sent  # every value, in order, however the rings coalesced
        try:
            bell.ring(b"x" * (doorbell.DATA_BYTES_MAX + 1))
            raise AssertionError("an oversized value was sent")
        except ValueError:
            pass
    finally:
        lis.close()


def test_a_value_that_would_be_dropped_is_reported_unsent(tmp_path):
    blocked = threading.Event()
    release = threading.Event()

    def on_ring(values):
        blocked.set()
        release.wait(10)  # a listener stuck in its handler: its queue fills up
    lis = doorbell.Listener(str(tmp_path), "majority", on_ring, with_data=True)
    try:
        bell = doorbell.Bell(str(tmp_path), "majority")
        assert bell.ring(b"first")
        assert blocked.wait(5)
        results = [bell.ring(b"v" * 512) for _ in range(10_000)]
        assert results[0] and not results[-1]  # a full queue: the caller must send it another way
        assert bell.ring()  # a plain ring still counts (wake-ups are pending)
    finally:
        release.set()
        lis.close()
