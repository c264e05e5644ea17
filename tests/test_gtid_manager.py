"""GTIDManager against a naive model: sequential (hypothesis) and with threads."""
import random
import threading

from hypothesis import given, settings, strategies as st

from raymx.actors.core.gtid_manager import GTIDManager
from raymx.storage.gtid import GTID


class Naive:
    def __init__(self, nxt):
        self.nxt, self.live = nxt, []

    def allocate(self):
        self.live.append(self.nxt)
        self.nxt += 1
        return self.nxt - 1

    def done(self, s):
        self.live.remove(s)

    def min_live(self):
        return min(self.live) if self.live else self.nxt


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 1000)), max_size=200), st.integers(1, 50))
def test_matches_naive_model(script, start):
    m, n = GTIDManager(3, start), Naive(start)
    held = []
    for alloc, pick in script:
        if alloc or not held:
            g = m.allocate()
            assert g == GTID(3, n.allocate())
            held.append(g)
        else:
            g = held.pop(pick % len(held))  # finish out of order
            m.done(g)
            n.done(g.seq)
        assert m.min_live() == GTID(3, n.min_live())


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=100))
def test_durability_gate_never_passes_a_live_gtid(script):
    m = GTIDManager(1, 1)
    live = []
    for step in script:
        if step == 0 or not live:
            live.append(m.allocate())
        elif step == 1:
            m.done(live.pop(0))
        elif step == 2:
            m.done(live.pop())
        else:
            rec = m.before_sync()
            pub = m.after_sync(rec)
            assert all(g >= pub for g in live)


def test_concurrent_allocators_finishing_out_of_order():
    m = GTIDManager(2, 1, lock=threading.Lock())
    seen, errors = [], []
    seen_lock = threading.Lock()

    def worker(seed):
        rnd = random.Random(seed)
        mine = []
        for _ in range(2000):
            if not mine or rnd.random() < 0.55:
                mine.append(m.allocate())
            else:
                g = mine.pop(rnd.randrange(len(mine)))
                # invariant: what I still hold is never below min_live
                if mine and m.min_live() > min(mine):
                    errors.append((m.min_live(), min(mine)))
                m.done(g)
                with seen_lock:
                    seen.append(g.seq)
        for g in mine:
            m.done(g)
            with seen_lock:
                seen.append(g.seq)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    assert sorted(seen) == list(range(1, len(seen) + 1))  # none twice, none skipped
    assert m.min_live() == GTID(2, len(seen) + 1) and m.live_count() == 0
