"""Applier (a secondary's apply loop), SnapshotSource (serves a snapshot's
parts to a new member) and GTIDManagerActor (the GTID manager for members
with several shards)."""
from __future__ import annotations

import logging
import os
import threading
import time

import ray

from raymx import errors
from raymx.actors import doorbell, logbook
from raymx.actors.core import replication as rep
from raymx.actors.core.gtid_manager import GTIDManager
from raymx.actors.core.member import start_config
from raymx.actors.process import lock_member, now_ms, open_member, serve_at_normal_priority
from raymx.storage import snapshot
from raymx.storage.gtid import GTID
from raymx.storage.limits import Limits

log = logging.getLogger("raymx.member")


@ray.remote(max_concurrency=4, concurrency_groups={"control": 2})
class Applier:
    """Applies unapplied entries in GTID order, in bounded batches."""

    def __init__(self, rs_name: str, member_id: int, path: str, limits: Limits,
                 delay_s: float = 0):
        self.member_id, self.limits = member_id, limits
        logbook.install(rs_name, member_id, "applier")
        serve_at_normal_priority()
        self._dir_lock = lock_member(path, rs_name, member_id, "applier")
        self.engine = open_member(path, limits)
        # restarted by Ray (its creation's delay): the configuration's decides
        spec, _ = start_config(self.engine, member_id, {"delay_s": delay_s}, {})
        self.delay_ms = int(spec.get("delay_s", 0) * 1000)
        self.applied_entries = self.applied_ops = self.replays = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._hold = threading.Event()
        self._idle = threading.Event()
        self._info_at = 0.0
        # the producer rings after each batch (a Ray call to wake() otherwise)
        self._bell = doorbell.Listener(path, "applier", self._wake.set)
        # reads parked in the shard's process until a GTID is applied (after_waits)
        self._applied_bell = doorbell.Bell(path, "applied")
        self._t = threading.Thread(target=self._run, name="raymx-applier", daemon=True)
        self._t.start()

    @ray.method(concurrency_group="control")
    def wake(self, _g=None) -> None:
        self._wake.set()

    @ray.method(concurrency_group="control")
    def set_delay(self, delay_s: float) -> None:
        self.delay_ms = int(delay_s * 1000)
        self._wake.set()

    # --- a Spark replay's spool on this node (raymx.spark_bridge.spark_replay) ----
    def make_spool(self) -> str:
        import tempfile
        return tempfile.mkdtemp(prefix="raymx-replay-")

    def merge_replay(self, paths: list, offsets: list):
        """The Spark tasks' spooled range tables merged (an Arrow table), for
        the member's ``replay_block``."""
        from raymx.spark_bridge.spark_replay import merge_runs
        return merge_runs(paths, offsets)

    def drop_spool(self, spool: str) -> None:
        import shutil
        shutil.rmtree(spool, ignore_errors=True)

    @ray.method(concurrency_group="control")
    def pause(self, paused: bool) -> None:
        """Hold applying (a rollback is rewriting the oplog); waits for a running batch."""
        if paused:
            self._hold.set()
            self._idle.wait(60)
        else:
            self._hold.clear()
            self._wake.set()

    def _run(self):
        while not self._stop.is_set():
            serve_at_normal_priority(every_s=2.0)
            if self._hold.is_set():
                self._idle.set()
                time.sleep(0.01)
                continue
            self._idle.clear()
            try:
                n, ops, _, mode = rep.apply_step(self.engine, self.limits, now_ms(),
                                                 self.delay_ms, clock=now_ms)
                if mode == "replay":
                    self.replays += 1
            except errors.DiskFull as e:  # nothing applied; again once the map grew or room came
                log.warning("member %d: apply refused, tried again in a second: %s",
                            self.member_id, e)
                time.sleep(1)
                continue
            except Exception:
                log.exception("member %d: apply failed", self.member_id)
                time.sleep(1)
                continue
            self.applied_entries += n
            self.applied_ops += ops
            if n:
                self._applied_bell.ring()
            if time.monotonic() - self._info_at >= 1.0:
                self._info_at = time.monotonic()
                try:
                    last, _ = self.engine.last()
                    rep.write_repl_info(self.engine, GTID(last.term, last.seq + 1))
                except Exception as e:  # a full map or disk: again in a second, never fatal
                    log.warning("member %d: recording the applied point failed: %s",
                                self.member_id, e)
            if n == 0:
                self._wake.wait(0.05 if self.delay_ms else 0.5)
                self._wake.clear()

    @ray.method(concurrency_group="control")
    def logs(self) -> dict:
        return {"records": logbook.records()}

    @ray.method(concurrency_group="control")
    def status(self) -> dict:
        return {"applied_entries": self.applied_entries, "applied_ops": self.applied_ops,
                "replays": self.replays}

    def shutdown(self):
        self._stop.set()
        self._wake.set()
        self._t.join(10)
        self._bell.close()
        self._applied_bell.close()

    def pid(self) -> int:
        return os.getpid()


@ray.remote(num_cpus=0, max_concurrency=2)
class SnapshotSource:
    """One consistent snapshot of a member (one LMDB read transaction), served
    from its own process on the member's node, so bulk reads never compete
    with the member's client port. Started by the driver for one copy."""

    def __init__(self, path: str, limits: Limits, rows_per_part: int):
        if not os.path.isfile(os.path.join(path, "data.mdb")):
            raise errors.ConfigError(f"no member data at {path}")
        self.engine = open_member(path, limits)
        self.snap = snapshot.Snapshot(self.engine, rows_per_part)
        self._lock = threading.Lock()  # a read transaction serves one thread at a time
        self.sums: dict[int, list] = {}

    def info(self) -> dict:
        return self.snap.info()

    @ray.method(num_returns=2)
    def read(self, part) -> tuple[bytes, list]:
        """One partition's rows as stored, packed into one run, and its checksum."""
        with self._lock:
            rows, c = self.snap.read(part)
        self.sums[snapshot.Part.of(part).index] = c
        return rows, c

    def checksums(self) -> dict:
        return dict(self.sums)

    # --- a Spark copy's spool on this node (raymx.spark_bridge.copy_tasks) ------
    def make_spool(self) -> str:
        import tempfile
        return tempfile.mkdtemp(prefix="raymx-copy-")

    def spooled(self, spool: str, i: int) -> list:
        from raymx.spark_bridge import copy_tasks
        return copy_tasks.ready(spool, i)

    def take_file(self, path: str) -> bytes:
        from raymx.spark_bridge import copy_tasks
        return copy_tasks.take_file(path)

    def drop_spool(self, spool: str) -> None:
        import shutil
        shutil.rmtree(spool, ignore_errors=True)

    def close(self) -> None:
        with self._lock:
            self.snap.close()
        self.engine.store.close()


@ray.remote(num_cpus=0)
class GTIDManagerActor:
    """The GTIDManager core behind a Ray actor, for members with several shards."""

    def __init__(self, term: int, next_seq: int):
        self.core = GTIDManager(term, next_seq, lock=threading.Lock())

    def allocate(self):
        return list(self.core.allocate())

    def done(self, gtid):
        self.core.done(GTID(*gtid))

    def min_live(self):
        return list(self.core.min_live())

    def before_sync(self):
        return list(self.core.before_sync())

    def after_sync(self, recorded):
        return list(self.core.after_sync(GTID(*recorded)))
