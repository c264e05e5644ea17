"""Producer: a secondary's pull loop (a thread and Ray calls); decisions in
``raymx.actors.core.producer.ProducerCore``."""
from __future__ import annotations

import logging
import os
import threading
import time

import ray

from raymx import errors
from raymx.actors import doorbell, logbook, metrics
from raymx.actors.core import producer as pc
from raymx.actors.core import replication as rep
from raymx.actors.process import (Notifier, _get, lock_member, open_member,
                                  serve_at_normal_priority, stop_process)
from raymx.storage import codec
from raymx.storage.gtid import GTID, ZERO
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
        src = None
        src_id = None
        core = self.core
        while not self._stop.is_set():
            serve_at_normal_priority(every_s=2.0)
            core.paused = self._paused.is_set()
            if core.blocked():
                time.sleep(0.02)
                continue
            try:
                if src is None or src_id != core.source:
                    src_id = core.source
                    src = _get(self.rs_name, src_id, "")  # its shard serves pulls
                req, last, last_h = core.request(self._downstream())
                ans = self._await(src.pull.remote(codec.pack(req)), src_id, 30)
                if ans is None:
                    continue  # told to follow another source meanwhile: pull from it now
                # one entry may exceed pull_bytes_max (a pull always carries one)
                out = codec.unpack(ans, "pull answer", self.limits.transaction_bytes_max
                                   + self.limits.pull_bytes_max + (1 << 20))
                self.pulls += 1
            except Exception as e:  # the source is restarting or gone: retry
                src = None
                time.sleep(core.on_failure(
                    f"sync source {core.source} unreachable: {type(e).__name__}") / 1000)
                continue
            with self._write_lock:
                if self._paused.is_set():
                    continue  # paused while pulling: write nothing more
                try:
                    self._handle(out, src, last, last_h)
                except errors.DiskFailed as e:  # a sync of a rollback: never carry on
                    stop_process(e)
                except Exception as e:  # a failed step (find_common): report and retry
                    log.exception("member %d: producer step failed", self.member_id)
                    src = None
                    time.sleep(core.on_failure(f"{type(e).__name__}: {e}") / 1000)

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

    def _tell_state(self) -> None:
        state = self.core.state
        now = time.monotonic()
        if self._told != state or now - self._told_at >= 2.0:  # again now and then: a
            self._told, self._told_at = state, now           # restarting shard may miss one
            self._tell_shard(state)

    def _handle(self, out, src, last, last_h) -> None:
        step, learned = self.core.on_answer(out, last)
        if learned is not None and not self._majority_bell.ring(learned.to_bytes()):
            self._majority_shard(list(learned))  # the shard tells its feeder too
        self._tell_state()
        if step == pc.ROLLBACK:
            return self._roll_back(src)
        if step == pc.RETRY:
            time.sleep(pc.RETRY_MS / 1000)
            return
        if step == pc.IDLE:
            return
        try:
            g, n = self.core.write(out, last, last_h)
            self.engine.sync()  # durable before the next pull reports it upstream
        except errors.DiskFailed as e:
            stop_process(e)  # never report unsynced entries as durable
        except errors.RaymxError as e:
            self.core.error = f"batch refused: {e}"
            log.error("member %d: %s", self.member_id, self.core.error)
            time.sleep(pc.BATCH_REFUSED_MS / 1000)
            return
        self.latency.entries(out["rows"])  # durable here now: each entry's ts to now
        self.batches += 1
        self.entries += n
        if not self._applier_bell.ring():
            self._applier(list(g))
        if not self._feeder_bell.ring():
            self._feeder(list(g))

    def _roll_back(self, src) -> None:
        """Find the common point with the sync source, undo past it, truncate."""
        before = None
        common = None
        while common is None:
            cands = rep.own_hashes(self.engine, before, 1000)
            if not cands:
                common = ZERO
                break
            g = ray.get(src.find_common.remote(cands), timeout=30)
            common = None if g is None else GTID(*g)
            before = GTID(*cands[-1][0])
        path = os.path.join(self.path, f"rollback-{int(time.time() * 1000)}.jsonl")

        def write_file(records):
            import json
            with open(path, "w") as f:
                for r in records:
                    f.write(json.dumps(r, default=repr) + "\n")
                f.flush()
                os.fsync(f.fileno())
        try:
            # the applier must not apply while entries are being undone
            ray.get(_get(self.rs_name, self.member_id, "applier").pause.remote(True), timeout=30)
            n = rep.rollback_to(self.engine, common, self.limits.rollback_ops_max, write_file)
            self.engine.sync()
        except errors.IrreversibleOp as e:
            self.engine.put_meta("needs_resync", str(e))
            self.core.state, self.core.error = "resync", str(e)
            self._tell_state()
            log.error("member %d cannot roll back: %s", self.member_id, e)
            return
        finally:
            ray.get(_get(self.rs_name, self.member_id, "applier").pause.remote(False), timeout=30)
        self.rollbacks += 1
        self.last_rollback = {"common": list(common), "undone_entries": n, "file": path}
        log.warning("member %d rolled back %d entries after %s; undone ops in %s",
                    self.member_id, n, common, path)
        ray.get(_get(self.rs_name, self.member_id, "").truncated.remote(), timeout=30)

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
