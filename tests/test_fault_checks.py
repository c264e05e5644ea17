"""The fault harnesses' checks (bench/faults/checks.py) on real LMDB folders:
each finds what it is for (a lost acknowledged write, a changed document, a
counter gone back, a missing or extra index entry, a gap in the oplog, a
folder that does not open) and nothing in an intact folder. The power-loss
harness itself needs root and LazyFS and runs outside CI."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench", "faults"))
from checks import Ledger, check_folder, converged, verify_indexes  # noqa: E402

from raymx.storage.engine import Engine  # noqa: E402
from raymx.storage.lmdb_store import LMDBStore  # noqa: E402

NS = "pl.docs"


def _open(path):
    return Engine(LMDBStore(path, map_bytes=1 << 28))


@pytest.fixture
def folder(tmp_path):
    """A member-like folder: indexes (unique, compound, multikey), 300
    documents written through the engine, and the ledger of those writes."""
    path = str(tmp_path / "m0")
    e = _open(path)
    ledger = Ledger()
    with e.begin() as tx:
        tx.create_index(NS, "u", unique=True)
        tx.create_index(NS, [("w", 1), ("seq", -1)])
        tx.create_index(NS, "tags")
    for b in range(3):
        docs = [{"_id": f"a-{b}.{i}", "w": "a", "seq": i, "u": f"a:{b}.{i}",
                 "tags": [i % 7, f"t{i % 3}"], "pad": "x" * (i * 60)} for i in range(100)]
        e.insert_many(NS, docs)
        for d in docs:
            ledger.doc(NS, d)
    with e.begin() as tx:
        tx.update(NS, {"_id": "ctr-a"}, {"$set": {"n": 7}}, upsert=True)
    ledger.counter(NS, "ctr-a", "n", 7)
    ledger.counter(NS, "ctr-a", "n", 5)  # an older acknowledgement: the bar stays at 7
    e.store.sync()
    e.store.close()
    return path, ledger


def test_intact_folder_passes(folder):
    path, ledger = folder
    fc = check_folder(path, ledger.view(), open_engine=_open)
    assert fc.ok, (fc.problems, fc.missing)
    assert fc.checked == 301 and fc.documents == 301 and fc.oplog_entries == 5  # indexes, 3 inserts, the counter


def test_lost_changed_and_stale_writes_are_reported(folder):
    path, ledger = folder
    e = _open(path)
    with e.begin() as tx:
        tx.delete(NS, {"_id": "a-1.5"})
        tx.update(NS, {"_id": "a-2.9"}, {"$set": {"pad": "changed"}})
        tx.update(NS, {"_id": "ctr-a"}, {"$set": {"n": 6}})
    e.store.close()
    fc = check_folder(path, ledger.view(), open_engine=_open)
    assert not fc.problems and not fc.ok
    assert len(fc.missing) == 3
    text = "\n".join(fc.missing)
    assert "'a-1.5': acknowledged insert is missing" in text
    assert "'a-2.9': stored" in text and "'changed'" in text
    assert "'ctr-a': n is 6, an acknowledged write set 7" in text


def test_index_entries_missing_or_extra_are_reported(folder):
    path, _ = folder
    e = _open(path)
    try:
        assert verify_indexes(e) == []
        with e.store.write() as t:  # below the engine: what a torn write could leave
            keys = list(t.scan_keys("index"))
            t.delete("index", keys[10])
            t.put("index", keys[20][:-1] + b"\x7f", b"")
        problems = verify_indexes(e)
    finally:
        e.store.close()
    assert len(problems) >= 1
    assert any("1 missing" in p for p in problems), problems
    assert any("1 extra" in p for p in problems), problems


def test_oplog_gap_and_unopenable_folder_are_reported(folder, tmp_path):
    path, ledger = folder
    e = _open(path)
    with e.store.write() as t:
        keys = list(t.scan_keys("oplog"))
        t.delete("oplog", keys[3])
    e.store.close()
    fc = check_folder(path, ledger.view(), open_engine=_open)
    assert any("verify_oplog" in p and "gap" in p for p in fc.problems), fc.problems

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "data.mdb").write_bytes(os.urandom(64 * 1024))
    fc = check_folder(str(bad), ledger.view(), open_engine=_open)
    assert not fc.opened and fc.problems and fc.problems[0].startswith("does not open")


def test_isolated_check_reports_a_crashing_read(folder):
    """The harnesses check in a child process: the same verdict on an intact
    folder, and a folder whose pages point past the end of the file (cut
    short, as after a power loss that kept a newer meta page) is reported,
    whether LMDB refuses it or the reading process dies of SIGBUS."""
    from checks import check_folder_isolated
    path, ledger = folder
    fc = check_folder_isolated(path, ledger.view())
    assert fc.ok and fc.checked == 301 and fc.oplog_entries == 5
    with open(os.path.join(path, "data.mdb"), "r+b") as f:
        f.truncate(3 * 4096)
    fc = check_folder_isolated(path, ledger.view())
    assert not fc.ok and fc.problems, fc
    assert ("the checking process died (killed by signal" in fc.problems[0]
            or fc.problems[0].startswith("does not open")), fc.problems


def test_the_bank_check_finds_a_transfer_applied_twice_lost_or_in_part():
    import bank
    logs = [{"tid": "1-1", "from": "a0", "to": "a1", "amt": 5},
            {"tid": "2-1", "from": "a1", "to": "a2", "amt": 3}]
    good = {"a0": 995, "a1": 1002, "a2": 1003}
    assert bank.check(good, logs, ["1-1", "2-1"]) == []
    assert bank.check(good, logs, ["1-1"]) == []  # an unknown outcome that happened
    twice = bank.check({"a0": 990, "a1": 1007, "a2": 1003}, logs + [logs[0]], ["1-1"])
    assert len(twice) == 1 and "more than once: ['1-1']" in twice[0]
    lost = bank.check(good, logs, ["1-1", "2-1", "3-1"])
    assert len(lost) == 1 and "acknowledged transfers lost: ['3-1']" in lost[0]
    part = bank.check({"a0": 995, "a1": 1005, "a2": 1003}, logs, ["1-1", "2-1"])
    assert len(part) == 1 and "'a1': (1005, 1002)" in part[0]
    # counts outside transactions: between the acknowledged ones and those plus the unknown
    for touched in (7, 9):
        assert bank.check(good, logs, ["1-1"], touched=touched, touches=(7, 2)) == []
    for touched in (6, 10):
        bad = bank.check(good, logs, ["1-1"], touched=touched, touches=(7, 2))
        assert len(bad) == 1 and f"counted up {touched} times" in bad[0]
    # what majority and snapshot reads saw during the run
    assert bank.check(good, logs, ["1-1"], seen={"1-1": "snapshot", "2-1": "majority"}) == []
    gone = bank.check(good, logs, ["1-1"], seen={"1-1": "snapshot", "4-2": "majority"})
    assert len(gone) == 1 and "served, then discarded): [('4-2', 'majority')]" in gone[0]
    torn = bank.check(good, logs, ["1-1"], torn=[("snapshot", 2995, 3)])
    assert len(torn) == 1 and "1 reads saw balances that do not add up" in torn[0]


def test_members_converge_when_collections_and_the_oplogs_common_part_agree():
    full = {"collections": b"c", "oplog": [([1, 1], 11), ([1, 2], 12), ([2, 3], 23)]}
    snap = {"collections": b"c", "oplog": [([1, 2], 12), ([2, 3], 23)]}  # from a snapshot
    assert converged([full, snap, dict(full)])
    assert not converged([full, dict(snap, collections=b"d")])
    assert not converged([full, dict(snap, oplog=[([1, 2], 12), ([2, 3], 99)])])  # a hash
    assert not converged([full, dict(snap, oplog=[([1, 2], 12)])])  # behind
    assert not converged([full, dict(full, oplog=[([1, 1], 11), ([2, 3], 23)])])  # a gap
    assert converged([{"collections": b"", "oplog": []}] * 2)
    assert not converged([{"collections": b"", "oplog": []}, full])
