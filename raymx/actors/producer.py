"""Producer: a secondary's pull loop (a thread and Ray calls); decisions in
``raymx.actors.core.producer.ProducerCore``."""
from __future__ import annotations

import json
import logging
import os
import threading
import time

import ray

from raymx import errors
from raymx.actors import doorbell, logbook, metrics
from raymx.actors.core import producer as pc
from raymx.actors.process import (Notifier, _get, lock_member, open_member,
                                  serve_at_normal_priority, stop_process)
from raymx.storage import codec
from raymx.storage.gtid import GTID
from raymx.storage.limits import Limits

log = logging.getLogger("raymx.member")


@ray.remote(max_concurrency=4, concurrency_groups={"control": 2})
class Producer:
    """Pulls from the sync source, checks each batch, writes it unapplied, syncs.

    Starts paused: the coordinator tells it whom to follow. On ``diverged`` it
    rolls this member back to the common point (writing a rollback file) and
    goes on; on ``too_stale`` or an irreversible rollback the member needs a
    resync, which its status says.
    """

    def __init__(self, rs_name: str, member_id: int, path: str, limits: Limits):
        self.rs_name, self.member_id, self.limits, self.path = rs_name, member_id, limits, path
        logbook.install(rs_name, member_id, "producer")
        serve_at_normal_priority()
        self._dir_lock = lock_member(path, rs_name, member_id, "producer")
        self.engine = open_member(path, limits)
        self.core = pc.ProducerCore(self.engine, member_id, limits)
        self.batches = self.entries = self.rollbacks = self.pulls = 0
        self.latency = metrics.ReplicationLatency(rs_name, member_id)
        self._stop = threading.Event()
        self._paused = threading.Event()
        self._paused.set()
        self._write_lock = threading.Lock()  # held while a batch is checked and written
        # after each batch: wake the applier and this member's feeder (for members
        # syncing from this one) by doorbell; a Ray call only if nobody listens.
        # The durable position travels upstream with the next pull, sent at once.
        self._applier_bell = doorbell.Bell(path, "applier")
        self._feeder_bell = doorbell.Bell(path, "feeder")
        self._applier = Notifier(rs_name, member_id, "applier", "wake")
        self._feeder = Notifier(rs_name, member_id, "", "on_limit")
        self._down: dict = {}
        self._down_ref = None
        self._down_at = 0.0
        # the majority-committed point learned from the sync source goes to this
        # member's shard (change streams, trimming, and its feeder for members
        # syncing from this one)
        self._majority_bell = doorbell.Bell(path, "majority")
        self._majority_shard = Notifier(rs_name, member_id, "", "on_majority")
        # what the shard was last told of this member's state (it serves reads
        # only after "running"); told again after every follow()
        self._told: str | None = None
        self._told_at = 0.0
        self._tell_shard = Notifier(rs_name, member_id, "", "on_sync_state")
        if ray.get_runtime_context().was_current_actor_reconstructed:
            # restarted alone (crash): the shard knows whom this member follows
            try:
                ray.get(_get(rs_name, member_id, "").forget_following.remote(), timeout=10)
            except Exception:
                pass
        self._t = threading.Thread(target=self._run, name="raymx-producer", daemon=True)
        self._t.start()

    @property
    def sync_source(self) -> int | None:
        return self.core.source

    def _run(self):
        """Carries out the shared loop's effects (``pc.run``) with this thread
        and Ray calls."""
        loop = pc.run(self.core, self)
        src, src_id = None, None
        value, thrown = None, None
        while not self._stop.is_set():
            serve_at_normal_priority(every_s=2.0)
            try:
                eff = loop.throw(thrown) if thrown is not None else loop.send(value)
            except errors.DiskFailed as e:  # a sync failed: never carry on
                stop_process(e)
                return
            value, thrown = None, None
            try:
                if isinstance(eff, (pc.Pull, pc.FindCommon)):
                    if src is None or src_id != eff.source:
                        src_id = eff.source
                        src = _get(self.rs_name, src_id, "")  # its shard serves pulls
                    if isinstance(eff, pc.Pull):
                        value = self._pull(src, src_id, eff.req)
                    else:
                        value = ray.get(src.find_common.remote(eff.candidates), timeout=30)
                elif isinstance(eff, pc.Sleep):
                    self._stop.wait(eff.ms / 1000)
                elif eff == pc.SYNC:
                    self.engine.sync()
                elif eff == pc.LOCK:
                    self._write_lock.acquire()
                    self.core.paused = self._paused.is_set()  # pause(wait=True) set it first
                elif eff == pc.UNLOCK:
                    self._write_lock.release()
                elif eff in (pc.HOLD_APPLIER, pc.RELEASE_APPLIER):
                    ray.get(_get(self.rs_name, self.member_id, "applier").pause.remote(
                        eff == pc.HOLD_APPLIER), timeout=30)
                elif eff == pc.BLOCKED:
                    self.core.paused = self._paused.is_set()
                    self._stop.wait(0.02)
            except errors.DiskFailed as e:
                stop_process(e)
                return
            except Exception as e:  # the source is restarting or gone: the loop retries
                if isinstance(eff, (pc.Pull, pc.FindCommon)):
                    src = None
                what = "find_common" if isinstance(eff, pc.FindCommon) else str(eff)
                thrown = pc.CallFailed(f"{what}: {type(e).__name__}: {e}")

    def _pull(self, src, src_id: int, req: dict):
        self.core.paused = self._paused.is_set()
        ans = self._await(src.pull.remote(codec.pack(req)), src_id, 30)
        if ans is None:
            return None
        self.pulls += 1
        # one entry may exceed pull_bytes_max (a pull always carries one)
        out = codec.unpack(ans, "pull answer", self.limits.transaction_bytes_max
                           + self.limits.pull_bytes_max + (1 << 20))
        self.core.paused = self._paused.is_set()
        return out

    def _await(self, ref, src_id: int, timeout_s: float):
        """The answer of a pull, or None as soon as this member is told to follow
        another source (or paused): a pull to a source whose process died waits
        for Ray to restart it, and the new primary must not wait behind that."""
        deadline = time.monotonic() + timeout_s
        while True:
            ready, _ = ray.wait([ref], timeout=0.02)
            if ready:
                return ray.get(ref)
            if self.core.source != src_id or self._paused.is_set():
                return None
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no answer from sync source {src_id} in {timeout_s}s")

    def _downstream(self) -> dict:
        """Positions of members that sync from this one (chained replication),
        forwarded upstream with each pull. Never blocks the pull loop: the
        newest answer is used and the next request is already on its way.
        While nobody syncs from this member it asks about once a second, not
        once per pull (a Ray call each)."""
        ref = self._down_ref
        if ref is not None:
            ready, _ = ray.wait([ref], timeout=0)
            if ready:
                try:
                    self._down = ray.get(ref)
                except Exception:
                    pass
                ref = self._down_ref = None
        if ref is None and (self._down or time.monotonic() - self._down_at >= 1.0):
            self._down_at = time.monotonic()
            try:
                self._down_ref = _get(self.rs_name, self.member_id, "").positions.remote()
            except Exception:
                self._down_ref = None
        return self._down

    # -- what the loop tells this shell (pc.ProducerIO) --------------------------
    def downstream(self) -> dict:
        return self._downstream()

    def learned(self, g: GTID) -> None:
        if not self._majority_bell.ring(g.to_bytes()):
            self._majority_shard(list(g))  # the shard tells its feeder too

    def state(self, state: str) -> None:
        now = time.monotonic()
        if self._told != state or now - self._told_at >= 2.0:  # again now and then: a
            self._told, self._told_at = state, now           # restarting shard may miss one
            self._tell_shard(state)

    def written(self, g: GTID, n: int, rows: list) -> None:
        self.latency.entries(rows)  # durable here now: each entry's ts to now
        self.batches += 1
        self.entries += n
        if not self._applier_bell.ring():
            self._applier(list(g))
        if not self._feeder_bell.ring():
            self._feeder(list(g))

    def rollback_file(self, common: GTID):
        path = os.path.join(self.path, f"rollback-{int(time.time() * 1000)}.jsonl")

        def write_records(records):
            with open(path, "w") as f:
                for r in records:
                    f.write(json.dumps(r, default=repr) + "\n")
                f.flush()
                os.fsync(f.fileno())
        return path, write_records

    def rolling_back(self, source: int, common: GTID) -> None:
        log.warning("member %d diverged from member %d: rolling back to %s",
                    self.member_id, source, common)

    def rolled_back(self, common: GTID, n: int, where: str) -> None:
        self.rollbacks += 1
        self.last_rollback = {"common": list(common), "undone_entries": n, "file": where}
        log.warning("member %d rolled back %d entries after %s; undone ops in %s",
                    self.member_id, n, common, where)
        ray.get(_get(self.rs_name, self.member_id, "").truncated.remote(), timeout=30)

    def failed(self, e: Exception) -> None:
        if isinstance(e, errors.RaymxError):
            log.error("member %d: producer: %s", self.member_id, e)
        else:
            log.error("member %d: producer step failed", self.member_id, exc_info=e)

    @ray.method(concurrency_group="control")
    def follow(self, source: int, term: int) -> None:
        self.core.follow(source, term)
        self._told = None  # the shard waits for this source to confirm us
        self._paused.clear()

    @ray.method(concurrency_group="control")
    def pause(self, paused: bool = True, wait: bool = False) -> None:
        """Stop pulling; with ``wait``, return only once no batch is in flight."""
        if paused:
            self._paused.set()
            self.core.paused = True  # the loop re-reads it under the write lock
            if wait:
                with self._write_lock:
                    pass
        else:
            self._paused.clear()

    @ray.method(concurrency_group="control")
    def logs(self) -> dict:
        return {"records": logbook.records()}

    @ray.method(concurrency_group="control")
    def status(self) -> dict:
        return {"state": self.core.state, "error": self.core.error, "batches": self.batches,
                "entries": self.entries, "pulls": self.pulls, "sync_source": self.sync_source,
                "paused": self._paused.is_set() and self.sync_source is not None,
                "rollbacks": self.rollbacks,
                "last_rollback": getattr(self, "last_rollback", None)}

    def shutdown(self):
        self._stop.set()
        self._t.join(10)

    def pid(self) -> int:
        return os.getpid()
