"""rs.oplog() over a trimmed oplog (issue 24, part 5): a reader never skips
trimmed entries silently, and its arguments are checked."""
import time

import pytest
import ray

import raymx
from raymx import errors
from raymx.storage.gtid import GTID, ZERO
from raymx.storage.limits import Limits

from tests.test_replication import wait_until


def test_reading_the_oplog_after_a_trimmed_gtid_names_the_oldest(ray_session, tmp_path):
    lim = Limits(trim_interval_ms=100, trim_batch_entries=50)
    rs = raymx.ReplicaSet.launch("oplogread", data_dir=str(tmp_path), limits=lim,
                                 oplog_cap={"max_bytes": 64 * 1024})
    try:
        coll = rs.client()["o"]["c"]
        for i in range(30):
            coll.insert_many([{"_id": i * 10 + k, "pad": "p" * 1000} for k in range(10)])
        wait_until(lambda: next(iter(rs.oplog(limit=1))).gtid.seq > 5, timeout_s=30)
        def settled():  # trimmed down to its cap (no writes now): the oldest stays
            first = next(iter(rs.oplog(limit=1))).gtid
            time.sleep(0.5)
            return first == next(iter(rs.oplog(limit=1))).gtid
        wait_until(settled, timeout_s=30)
        oldest = next(iter(rs.oplog(limit=1))).gtid
        for gone in (ZERO, GTID(oldest.term, oldest.seq - 2)):
            with pytest.raises(errors.OplogTrimmed) as ei:
                list(rs.oplog(after=gone))
            assert ei.value.info["oldest"] == list(oldest) and str(oldest.seq) in str(ei.value)
        # from the entry before the oldest, nothing is missing
        got = list(rs.oplog(after=GTID(oldest.term, oldest.seq - 1), limit=3))
        assert [e.gtid.seq for e in got] == [oldest.seq + k for k in range(3)]
        assert len(list(rs.oplog(limit=0))) == 0
        # bad arguments are refused at once, on the driver and on the member
        for bad in (dict(limit=-1), dict(limit="3"), dict(limit=True), dict(after="x")):
            with pytest.raises(errors.InvalidOperation):
                rs.oplog(**bad)
        for args in ((None, 10**9), (None, 0), ("nope", 5)):
            with pytest.raises(errors.InvalidOperation):
                ray.get(rs.member(0).oplog.remote(*args))
    finally:
        rs.shutdown()
