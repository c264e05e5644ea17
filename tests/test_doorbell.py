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
