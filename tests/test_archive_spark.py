"""Spark over the oplog archive: a Structured Streaming query consumes the set's
changes across a primary failover, a restart of the query and a trim, and
sees every majority-committed op exactly once, in GTID order; ``read_changes``
reads from before the live oplog through the archive."""
import time

import pytest

import raymx
from raymx import errors
from raymx.spark_bridge import read_changes
from raymx.spark_bridge.archive_io import stream_changes
from raymx.storage.limits import Limits

from tests.test_replication import wait_until

LIM = Limits(trim_interval_ms=100, trim_batch_entries=200)
NS = "s.c"


def _write(rs, lo, hi, step=20):
    """Inserts ``lo..hi-1`` (majority), retrying while there is no primary."""
    c = rs.client(w="majority", wtimeout_ms=30_000)
    coll = c["s"]["c"]
    g = None
    for i in range(lo, hi, step):
        deadline = time.time() + 60
        while True:
            try:
                g = coll.insert_many([{"_id": k, "pad": "y" * 300}
                                      for k in range(i, min(i + step, hi))]).gtid
                break
            except (errors.PrimaryUnavailable, errors.NotPrimary, errors.ConnectionLost):
                if time.time() > deadline:
                    raise
                time.sleep(0.2)
    c.close()
    return g


def test_a_streaming_query_sees_every_majority_committed_op_once_in_order_across_failover_and_trim(
        spark, ray_session, tmp_path):
    rs = raymx.ReplicaSet.launch("archspark", members=3, data_dir=str(tmp_path / "rs"),
                                 limits=LIM, oplog_cap={"max_bytes": None})
    q = None
    try:
        rs.set_archive(str(tmp_path / "archive"), lag_s=0.3)
        with pytest.raises(errors.InvalidInput, match="checkpoint"):
            stream_changes(spark, rs, process=lambda df, b: None)
        c = rs.client(w="majority")
        start = c["s"]["c"].insert_one({"_id": "start"}).gtid
        c.close()
        sink = {}  # batch_id -> its rows: idempotent per batch (a rerun overwrites)

        def process(df, batch_id):
            sink[batch_id] = [tuple(r) for r in df.select("seq", "idx", "op", "_id").collect()]
        ckpt = str(tmp_path / "ckpt")

        def query():
            return stream_changes(spark, rs, after=start, checkpoint=ckpt, process=process,
                                  ns=NS, trigger_s=0.5)

        def seen():
            return [r for b in sorted(sink) for r in sink[b]]
        q = query()
        _write(rs, 0, 200)
        wait_until(lambda: len(seen()) >= 200, timeout_s=90, every_s=0.3)
        # the primary dies: the new one goes on archiving where the index ends
        old = rs.wait_for_primary()
        rs.kill_member(old)
        wait_until(lambda: (lambda p: p is not None and p != old)(rs._topology()["primary"]),
                   timeout_s=30, every_s=0.1)
        _write(rs, 200, 400)
        # the query stops and starts again from its checkpoint meanwhile
        q.stop()
        q = query()
        wait_until(lambda: len(seen()) >= 400, timeout_s=90, every_s=0.3)
        # trimming drops most of the live oplog (after the archive has it)
        rs.set_oplog_cap(max_bytes=48 * 1024)
        last = _write(rs, 400, 600)
        new = rs.wait_for_primary()
        wait_until(lambda: rs.status_of(new)["oplog"]["first"][1] > start.seq + 10,
                   timeout_s=30)
        wait_until(lambda: len(seen()) >= 600, timeout_s=90, every_s=0.3)
        time.sleep(1.5)  # a few more micro-batches: nothing more may arrive
        rows = seen()
        ids = [r[3] for r in rows]
        assert ids == [str(i) for i in range(600)], "every op exactly once, in order"
        assert [r[:2] for r in rows] == sorted(r[:2] for r in rows)
        assert {r[2] for r in rows} == {"i"}
        # the same ops as read_changes over the majority-committed history, which
        # reads the archive (before the live oplog) and then the live oplog
        df = read_changes(spark, rs, after=start, until=last, ns=NS)
        assert [tuple(r) for r in df.select("seq", "idx", "op", "_id").collect()] == rows
        st = rs.status_of(new)["oplog"]
        assert st["archive"]["through"][1] >= last.seq and st["first"][1] > start.seq
    finally:
        if q is not None:
            q.stop()
        rs.shutdown()
