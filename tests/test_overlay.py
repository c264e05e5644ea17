"""An interactive transaction's overlay (raymx/storage/overlay.py): its reads
are those of a write transaction of the store that made the same writes
(checked against one, for random writes, savepoints and ranges, over both
stores), and its conflict check names what another commit changed."""
import random

import pytest

from raymx.storage.lmdb_store import LMDBStore
from raymx.storage.overlay import Overlay
from raymx.storage.store import MemoryStore


@pytest.fixture(params=["memory", "lmdb"])
def store(request, tmp_path):
    s = MemoryStore() if request.param == "memory" else LMDBStore(str(tmp_path / "s"),
                                                                   map_bytes=1 << 26)
    yield s
    s.close()


def _key(rnd):
    return bytes([rnd.randrange(40)])


def test_overlay_reads_as_a_write_transaction_making_the_same_writes(store):
    rnd = random.Random(7)
    with store.write() as w:
        for _ in range(25):
            w.put("docs", _key(rnd), b"base")
    for round_ in range(30):
        ov = Overlay(store.read())
        ref = store.write()  # the same writes, made in the store (aborted after)
        stack = [(ov, ref)]
        for step in range(40):
            o, r = stack[-1]
            act = rnd.random()
            k = _key(rnd)
            if act < 0.35:
                v, over = b"v%d" % step, rnd.random() < 0.8
                assert o.put("docs", k, v, over) == r.put("docs", k, v, over)
            elif act < 0.5:
                assert o.delete("docs", k) == r.delete("docs", k)
            elif act < 0.6:
                rows = [(_key(rnd), b"n%d" % step) for _ in range(3)]
                assert o.put_new("docs", rows) == r.put_new("docs", rows)
            elif act < 0.7 and len(stack) < 4:
                stack.append((o.nested(), r.nested()))
            elif act < 0.8 and len(stack) > 1:
                o, r = stack.pop()
                if rnd.random() < 0.5:
                    o.commit()
                    r.commit()
                else:
                    o.abort()
                    r.abort()
            o, r = stack[-1]
            a, b = sorted((_key(rnd), _key(rnd)))
            rev = rnd.random() < 0.5
            assert list(o.scan("docs", a, b, rev)) == list(r.scan("docs", a, b, rev)), round_
            assert list(o.scan("docs")) == list(r.scan("docs"))
            assert o.get("docs", k) == r.get("docs", k)
            assert o.last("docs") == r.last("docs") and o.first("docs") == r.first("docs")
        while len(stack) > 1:
            stack.pop()[0].abort()
        ref.abort()
        ov.abort()


def test_the_conflict_check_names_what_changed_since_the_snapshot(store):
    with store.write() as w:
        w.put("docs", b"a", b"1")
        w.put("catalog", b"db.c", b"c1")
    ov = Overlay(store.read())
    ov.get("catalog", b"db.c")  # a collection it uses
    ov.put("docs", b"a", b"mine")
    ov.put("docs", b"new", b"mine")
    with store.write() as w:  # nothing it saw changed
        assert ov.conflict(w) is None
        w.put("docs", b"other", b"x")
    with store.write() as w:
        assert ov.conflict(w) is None  # another key: no conflict
        w.put("docs", b"new", b"theirs")
    w = store.write()
    assert ov.conflict(w) == "a document it wrote"
    w.abort()
    ov2 = Overlay(store.read())
    ov2.get("catalog", b"db.c")
    ov2.put("docs", b"z", b"mine")
    with store.write() as w:
        w.put("catalog", b"db.c", b"c2")  # its collection redefined
    w = store.write()
    assert ov2.conflict(w) == "collection db.c"
    ov2.replay(w)  # what a commit would write
    assert w.get("docs", b"z") == b"mine"
    w.abort()
    ov.abort()
    ov2.abort()
    with pytest.raises(RuntimeError):
        ov.get("docs", b"a")  # finished


def test_sorted_keys_answer_ranges_as_a_sorted_list():
    """``SortedKeys`` (an overlay's written keys) against ``sorted``: keys
    added in random, ascending and descending order, small lists so that
    they split often."""
    from raymx.storage.overlay import SortedKeys
    rnd = random.Random(3)
    for order in ("random", "up", "down"):
        ks = SortedKeys(load=4)
        ref: list[bytes] = []
        pool = [rnd.randrange(10_000).to_bytes(2, "big") for _ in range(600)]
        pool = list(dict.fromkeys(pool))
        if order != "random":
            pool.sort(reverse=order == "down")
        for k in pool:
            ks.add(k)
            ref.append(k)
            if rnd.random() < 0.2:
                ref.sort()
                a, b = sorted(rnd.randrange(10_000).to_bytes(2, "big") for _ in range(2))
                want = [x for x in ref if a <= x < b]
                assert ks.range(a, b) == want
                assert ks.range(None, b) == [x for x in ref if x < b]
                assert ks.range(a, None) == [x for x in ref if x >= a]
        assert ks.range(None, None) == sorted(ref)
