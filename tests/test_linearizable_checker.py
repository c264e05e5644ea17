"""The nemesis harness's linearizability checker (bench/faults/linearizable.py)
on small histories whose answer is known: it accepts the linearizable ones
and finds each kind of violation (a stale read, a lost write, a read of a
value never written, a failed compare-and-set that should have matched),
and an operation whose outcome is unknown may have happened or not."""
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench", "faults"))
from linearizable import INF, Op, check, check_key  # noqa: E402


def r(v, call, ret, key="k"):
    return Op(key, "read", None, v, call, ret)


def w(v, call, ret=INF, key="k"):
    return Op(key, "write", v, True, call, ret)


def cas(old, new, ok, call, ret=INF, key="k"):
    return Op(key, "cas", (old, new), ok, call, ret)


def test_sequential_and_concurrent_histories_that_are_linearizable():
    assert check_key([w(1, 0, 1), r(1, 2, 3), w(2, 4, 5), r(2, 6, 7)], 0)[0] is True
    # a read overlapping a write may see either value
    assert check_key([w(1, 0, 10), r(0, 1, 2), r(1, 3, 4)], 0)[0] is True
    # but once one read saw the new value, a later read cannot see the old one
    assert check_key([w(1, 0, 10), r(1, 1, 2), r(0, 3, 4)], 0)[0] is False
    assert check_key([cas(0, 5, True, 0, 1), r(5, 2, 3), cas(0, 6, False, 4, 5)], 0)[0] is True


def test_each_kind_of_violation_is_found():
    stale = [w(1, 0, 1), r(0, 2, 3)]
    lost = [w(1, 0, 1), w(2, 2, 3), r(1, 4, 5)]
    never_written = [w(1, 0, 1), r(7, 2, 3)]
    cas_should_match = [w(1, 0, 1), cas(1, 2, False, 2, 3)]
    cas_cannot_match = [w(1, 0, 1), cas(0, 2, True, 2, 3)]
    for h in (stale, lost, never_written, cas_should_match, cas_cannot_match):
        ok, why = check_key(h, 0)
        assert ok is False and why["op"] is h[-1], h


def test_an_unknown_outcome_may_have_happened_or_not():
    # a write that timed out: a later read may see it or not
    assert check_key([w(1, 0), r(0, 2, 3)], 0)[0] is True
    assert check_key([w(1, 0), r(1, 2, 3)], 0)[0] is True
    assert check_key([w(1, 0), r(1, 2, 3), r(0, 4, 5)], 0)[0] is False  # not undone
    # not before its call
    assert check_key([r(1, 0, 1), w(1, 2)], 0)[0] is False
    # an unknown compare-and-set takes effect only where it matches
    assert check_key([cas(0, 3, None, 0), w(1, 1, 2), r(3, 3, 4)], 0)[0] is False
    assert check_key([cas(0, 3, None, 0), r(3, 3, 4)], 0)[0] is True


def test_keys_are_checked_apart_and_a_random_sequential_history_passes():
    rnd = random.Random(7)
    hist, state, t = [], {}, 0.0
    for _ in range(3000):
        k = rnd.randrange(5)
        cur = state.get(k, 0)
        kind = rnd.choice(["read", "write", "cas"])
        if kind == "read":
            hist.append(r(cur, t, t + 1, key=k))
        elif kind == "write":
            v = rnd.randrange(5)
            hist.append(w(v, t, t + 1, key=k))
            state[k] = v
        else:
            old, new = rnd.randrange(5), rnd.randrange(5)
            hist.append(cas(old, new, old == cur, t, t + 1, key=k))
            if old == cur:
                state[k] = new
        t += 2
    res = check(hist, 0)
    assert res["valid"] is True and res["keys"] == 5
    hist[-1] = Op(hist[-1].key, "read", None, 99, hist[-1].call, hist[-1].ret)
    res = check(hist, 0)
    assert res["valid"] is False and list(res["failures"]) == [hist[-1].key]
