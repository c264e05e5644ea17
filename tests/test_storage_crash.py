"""SIGKILL a process in the middle of a stream of commits, reopen, check everything."""
import os
import signal
import subprocess
import sys
import textwrap
import time

from raymx.storage.engine import Engine
from raymx.storage.gtid import GTID
from raymx.storage.lmdb_store import LMDBStore

WRITER = textwrap.dedent("""
    import sys
    from raymx.storage.engine import Engine
    from raymx.storage.lmdb_store import LMDBStore
    e = Engine(LMDBStore(sys.argv[1], map_bytes=1 << 30))
    i = 0
    while True:
        with e.begin() as tx:   # a two-statement transaction: both or neither
            tx.insert("t.a", [{"_id": i, "pad": "x" * 300}])
            tx.update("t.b", {"_id": 0}, {"$inc": {"n": 1}}, upsert=True)
        if i % 3 == 0:
            e.sync()
            print(i, flush=True)   # reported committed and synced
        i += 1
""")


def test_sigkill_mid_stream_loses_nothing_synced(tmp_path):
    path = str(tmp_path / "m")
    p = subprocess.Popen([sys.executable, "-c", WRITER, path], stdout=subprocess.PIPE, text=True)
    synced = -1
    t0 = time.time()
    while time.time() - t0 < 3 and synced < 600:
        line = p.stdout.readline()
        if line:
            synced = int(line)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert synced > 0
    e = Engine(LMDBStore(path, map_bytes=1 << 30))
    n = e.count("t.a")
    assert n >= synced + 1  # every synced commit is there
    # nothing half-written: each transaction wrote one insert and one $inc together
    assert e.find("t.b")[0]["n"] == n
    assert e.count("t.a", {"_id": {"$lt": n}}) == n
    assert e.verify_oplog() == e.last()[0].seq
    # one create per collection plus one entry per transaction: dense seqs
    assert e.last()[0] == GTID(0, n)
