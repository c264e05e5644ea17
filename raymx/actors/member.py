"""Ray shells for a member: thin wrappers that own processes, threads and messages.

A member is a group of co-located actors sharing one LMDB folder, each with
its own environment handle (LMDB is multi-process safe on one machine). Only
notifications travel between them, never data:

* ``OplogShard``: the client port and the shard service (writes on the
  primary, reads everywhere) and, in its "feeder" concurrency group, the
  ``FeederService`` that serves ``pull`` to downstream producers (long-poll
  on a latch). The replicatable point after each sync and the positions each
  pull reports are in-process calls, not Ray hops;
* ``Producer`` (secondaries): pulls from the sync source, checks, writes
  unapplied entries, syncs, rings the applier's and its own feeder's
  doorbells (``raymx.actors.doorbell``: a local datagram, not a Ray call);
* ``Applier`` (secondaries): applies unapplied entries in GTID order.

The GTIDManager core lives in the shard's process for a one-shard member (a
Ray call per commit would cap it at ~1.5k commits/s); ``GTIDManagerActor``
exposes the same core to members with several shards.
"""
from __future__ import annotations

import logging
import os
import threading
import time

import ray

from raymx import errors
from raymx.actors import doorbell, logbook, metrics
from raymx.actors.core import replication as rep
from raymx.actors.core import member as mc
from raymx.actors.core.member import MemberCore
from raymx.actors.feeder import FeederService
from raymx.actors.process import (NAMESPACE, _get, lock_member, now_ms, open_member,
                                  serve_at_normal_priority, stop_process)
from raymx.actors.server import ClientPort, boot_id
from raymx.actors.shard import ShardService, gtid_out
from raymx.storage import codec, replay, snapshot
from raymx.storage.gtid import GTID, ZERO
from raymx.storage.keys import prefix_end
from raymx.storage.limits import Limits
from raymx.wire.server import WirePort

log = logging.getLogger("raymx.member")
PULL_REQUEST_BYTES_MAX = 1 << 20  # positions of every member: far below this


@ray.remote(max_concurrency=16,
            concurrency_groups={"control": 4, "heartbeat": 2, "oplog": 2, "load": 1,
                                "feeder": 8})
class OplogShard:
    """Starts as a secondary; the election coordinator makes it primary or tells
    it whom to follow (also after a restart, so a returning old primary never
    takes writes on its own)."""

    def __init__(self, rs_name: str, member: dict, path: str, secret: str,
                 limits: Limits, votes: dict, bind_host: str | None = None,
                 oplog_cap: dict | None = None, tls: dict | None = None):
        self.rs_name, self.member_id, self.path, self.limits = rs_name, member["id"], path, limits
        logbook.install(rs_name, self.member_id, "")
        serve_at_normal_priority()
        ctx = ray.get_runtime_context()
        self.node_id = ctx.get_node_id()
        self.restarted = ctx.was_current_actor_reconstructed
        self._dir_lock = lock_member(path, rs_name, self.member_id, "")
        self.engine = open_member(path, limits)
        self.engine.sync()  # whatever survived a crash is now the durable, recovered state
        owner = self.engine.get_meta("member_id")
        if owner not in (None, self.member_id):
            raise errors.ConfigError(f"{path} belongs to member {owner}, not {self.member_id}")
        owner_rs = self.engine.get_meta("replset")
        if owner_rs not in (None, rs_name):
            raise errors.ConfigError(f"{path} belongs to replica set {owner_rs!r}, not "
                                     f"{rs_name!r}")
        self.engine.put_meta("member_id", self.member_id)
        self.engine.put_meta("replset", rs_name)
        # restarted by Ray (same arguments as at creation): the configuration
        # it installed since decides its votes and spec (mc.start_config)
        self.spec, votes = mc.start_config(self.engine, self.member_id, member, votes)
        if member.get("initial_sync") and snapshot.is_empty(self.engine) and \
                self.engine.get_meta("initial_sync") is None:
            # to be loaded from a snapshot: the producer must not pull from the
            # start of the oplog meanwhile (begin_load replaces this mark)
            self.engine.put_meta("initial_sync", {"pending": True})
        self.core = MemberCore(self.engine, self.member_id)
        self._majority_at = 0.0
        self._majority_busy = False
        self._role_lock = threading.Lock()
        self.load_progress: dict | None = None
        self._loaded_sums: dict[int, list] = {}  # part -> checksum of the run loaded for it
        self.loaded_at: list | None = None  # the snapshot GTID this process loaded
        self.feeder = FeederService(self.engine, limits, self.member_id, self._positions,
                                    dict(votes))
        # the producer rings after each batch it writes: wake long-polling pulls
        self._bell = doorbell.Listener(path, "feeder", self.feeder.on_limit)
        self.service = ShardService(self.engine, limits, primary=False,
                                    on_durable=self._on_durable, member_id=self.member_id,
                                    votes=dict(votes),
                                    on_fatal=stop_process)
        # and with each newer majority point it learns (the 16 GTID bytes); after
        # the service, which its handler tells (a ring before it was lost: its
        # ringer falls back to a Ray call until this listens, and Ray calls wait
        # for this constructor)
        self._majority_bell = doorbell.Listener(path, "majority", self._majority_rung,
                                                with_data=True)
        # the applier rings after each batch: reads parked until a GTID is applied
        self._applied_bell = doorbell.Listener(path, "applied", self.service.after_waits.kick)
        cfg = self.engine.get_meta("rs_config") or {}
        self.service.read_refusal = self.core.read_refusal
        self.service.latency = metrics.CommitLatency(rs_name, self.member_id)
        def coord():  # looked up at each call: Ray restarts the coordinator
            return ray.get_actor(f"{rs_name}/coordinator", namespace=NAMESPACE)
        self.service.topology_source = lambda: ray.get(coord().topology.remote(), timeout=5)
        self.service.status_source = lambda: ray.get(coord().status.remote(2.0), timeout=10)
        self.service.step_down_source = lambda catch_up_s: ray.get(
            coord().step_down.remote(catch_up_s), timeout=catch_up_s + 60)
        cap = cfg.get("oplog_cap") or oplog_cap
        if cap:
            self.service.set_oplog_cap(cap)
        host = bind_host or ray.util.get_node_ip_address()
        # the ports this member had on this host, taken again if free: a
        # connection string (pymongo's, mongosh's) stays good across restarts
        where = {"host": host, "set": rs_name, "member": self.member_id}
        had = self.engine.get_meta("ports") or {}
        had = had if all(had.get(k) == v for k, v in where.items()) else {}  # (a copy's)
        self.port = ClientPort(self.service, secret, host, limits.frame_bytes_max,
                               {"member": self.member_id, "replset": rs_name},
                               limits=limits, tls=tls, port=had.get("client", 0))
        self.wire = WirePort(self.service, secret, host,  # MongoDB drivers (raymx/wire)
                             {"member": self.member_id, "replset": rs_name}, tls=tls,
                             port=had.get("wire", 0))
        now = dict(where, client=self.port.port, wire=self.wire.port)
        if now != had:
            try:
                self.engine.put_meta("ports", now)
            except (errors.RaymxError, OSError) as e:  # a full disk: the next start asks again
                log.warning("member %d could not record its ports: %s", self.member_id, e)

    def _on_durable(self, g: GTID | None = None) -> None:
        limit = rep.shipping_limit(self.service.primary, self.service.votes,
                                   self.service.gm.replicatable())
        if limit is not None:
            self.feeder.on_limit(limit)

    # --- elections (called by the coordinator) ------------------------------
    @property
    def role(self) -> str:
        return self.core.role

    def _serving(self) -> tuple[bool, int]:
        return self.service.primary, self.service.gm.term

    @ray.method(concurrency_group="heartbeat")
    def heartbeat(self, term: int, alive: list | None = None) -> dict:
        """The coordinator's heartbeat; ``alive``: members it hears from, which
        count for this primary's view of a majority along with the pulls."""
        serve_at_normal_priority(every_s=2.0)
        if self.core.heartbeat(term, *self._serving()):
            with self._role_lock:
                if self.core.is_primary(self.service.primary):
                    self._become_secondary()
        if alive:
            now = now_ms()
            self.service.set_positions({}, {int(m): now for m in alive})
        return dict(self.core.reply(self.service.gm.term, int(time.monotonic() * 1000)),
                    loading=self.engine.get_meta("initial_sync") is not None,
                    loaded_at=self.loaded_at, port=[self.port.host, self.port.port])

    @ray.method(concurrency_group="control")
    def on_sync_state(self, state: str) -> None:
        """The producer's state (see ``MemberCore.on_sync_state``)."""
        with self._role_lock:
            self.core.on_sync_state(state)

    @ray.method(concurrency_group="control")
    def commit_state(self) -> dict:
        """For configuration changes: each member's durable position as this
        primary knows them, its last entry, and its fence: its last entry when
        it became primary or installed the current configuration (every write
        acknowledged under an earlier configuration is at most that)."""
        durable = {m: list(g) for m, g in self.service.wc.positions().items() if g is not None}
        last, _ = self.engine.last()
        fence = self.core.fence
        return {"primary": self.service.primary and self.role == "primary",
                "term": self.engine.term, "last": list(last), "durable": durable,
                "fence": None if fence is None else list(fence)}

    @ray.method(concurrency_group="control")
    def become_primary(self, term: int, timeout_s: float = 30) -> dict:
        """Stop pulling, apply everything written, take ``term`` durably, accept writes."""
        with self._role_lock:
            deadline = time.monotonic() + timeout_s

            def do(step):
                what, arg = step
                if what == mc.PAUSE_PRODUCER:
                    prod = _get(self.rs_name, self.member_id, "producer")
                    ray.get(prod.pause.remote(True, wait=True), timeout=timeout_s)
                elif what == mc.DRAIN:
                    while rep.min_unapplied(self.engine) is not None:
                        if time.monotonic() > deadline:
                            raise errors.PrimaryUnavailable(f"member {self.member_id} could "
                                                            f"not apply its oplog in {timeout_s}s")
                        ray.get(_get(self.rs_name, self.member_id, "applier").wake.remote())
                        time.sleep(0.005)
                elif what == mc.FEEDER_PRIMARY:
                    self.feeder.set_primary(True)
                elif what == mc.TAKE_WRITES:
                    try:
                        self.service.become_primary(arg)
                    except errors.DiskFailed as e:  # its sync failed: never elected again as is
                        stop_process(e)
                elif what == mc.NOOP:
                    self.service.on_writer(self.service.own_noop)  # not waited for
                elif what == mc.DURABLE:
                    self._on_durable(arg)
            last = mc.run_steps(self.core.promote(term), do)
            log.info("member %s/%d is primary in term %d at %s", self.rs_name,
                     self.member_id, term, last)
            return {"term": term, "last": list(last)}

    def _become_secondary(self) -> None:
        self.core.became_secondary()
        self.service.step_down()
        self.feeder.set_primary(False)

    @ray.method(concurrency_group="control")
    def follow(self, term: int, source: int | None) -> None:
        """Be a secondary of term ``term`` pulling from ``source``."""
        with self._role_lock:
            if self.core.follow(term, source, *self._serving()):
                self._become_secondary()
            if source is not None:
                ray.get(_get(self.rs_name, self.member_id, "producer").follow.remote(source, term))
                self.core.following_now(source, term)

    @ray.method(concurrency_group="control")
    def set_config(self, config: dict) -> None:
        """A new replica set configuration (reconfiguration): kept durably, so a
        restarted coordinator rebuilds the newest one from the members."""
        if not self.core.set_config(config, self.service.primary):
            return
        mine = next((m for m in config["members"] if m["id"] == self.member_id), None)
        if mine is not None:
            self.spec = mine
        self.service.set_votes({m["id"]: m["votes"] for m in config["members"]})
        for m in config["members"]:
            if not m.get("joining"):  # it has joined: its pulls hold trimming now
                self.service.trim_holds.pop(m["id"], None)
        if config.get("oplog_cap"):
            self.service.set_oplog_cap(config["oplog_cap"])
        self.feeder.set_votes({m["id"]: m["votes"] for m in config["members"]})
        self._on_durable()  # a member added to a set of one: what it may pull now
        ray.get(_get(self.rs_name, self.member_id, "applier").set_delay.remote(
            (mine or {}).get("delay_s", 0)))

    @ray.method(concurrency_group="control")
    def get_config(self) -> dict | None:
        return self.engine.get_meta("rs_config")

    @ray.method(concurrency_group="control")
    def forget_following(self) -> None:
        """The producer restarted: the coordinator will tell it whom to follow again."""
        self.core.following = None

    @ray.method(concurrency_group="control")
    def step_down(self, term: int, drain_s: float = 0.0) -> None:
        """Stop being primary. A planned hand-over (``drain_s``) first refuses new
        writes and lets the accepted ones finish and be acknowledged (up to
        ``drain_s``), so none of them ends with an unknown outcome."""
        with self._role_lock:
            if drain_s and self.core.is_primary(self.service.primary):
                self.service.hand_over(drain_s)
            if self.core.step_down(term, *self._serving()):
                self._become_secondary()

    @ray.method(concurrency_group="control")
    def on_positions(self, durable: dict, heard: dict | None = None) -> None:
        self._positions({int(m): None if g is None else GTID(*g) for m, g in durable.items()},
                        {int(m): at for m, at in (heard or {}).items()})

    def _positions(self, durable: dict, heard: dict) -> None:
        """Durable positions (and when each member was heard from), as pulls report them."""
        self.service.set_positions(durable, heard)
        mp = self.service.wc.majority_point() if self.service.primary else None
        self.service.note_majority(mp)
        self._persist_majority()

    def _persist_majority(self) -> None:
        mp = self.service.majority_known
        if mp is not None and time.monotonic() - self._majority_at >= 1.0 \
                and not self._majority_busy:
            # about once a second: a restart point. A write transaction,
            # so never on the pulling thread (an open client transaction holds LMDB's
            # writer and would stall replication)
            self._majority_at = time.monotonic()
            self._majority_busy = True

            def record():
                try:
                    self.engine.set_majority(mp)
                except errors.RaymxError as e:  # a full map or disk: again in a second
                    log.warning("member %d: recording the majority point failed: %s",
                                self.member_id, e)
                finally:
                    self._majority_busy = False
            threading.Thread(target=record, name="raymx-majority", daemon=True).start()

    @ray.method(concurrency_group="control")
    def on_majority(self, g) -> None:
        """A secondary's producer learned a newer majority-committed point (for
        this member's change streams, its trimming, and members syncing from it):
        by doorbell, or by this call when the doorbell cannot carry it."""
        self._note_majority(GTID(*g))

    def _majority_rung(self, values: list) -> None:
        gs = [GTID.from_bytes(v) for v in values if len(v) == 16]
        if gs:
            self._note_majority(max(gs))

    def _note_majority(self, g: GTID) -> None:
        self.service.note_majority(g)
        self.feeder.on_majority(g)
        self._persist_majority()

    @ray.method(concurrency_group="control")
    def set_oplog_cap(self, cap: dict) -> None:
        """Change this member's oplog cap now (the coordinator also records it
        in the configuration, so restarted members keep it)."""
        self.service.set_oplog_cap(cap)

    @ray.method(concurrency_group="control")
    def hold_trim(self, member: int, gtid, ttl_s: float) -> None:
        """Keep ``gtid`` on: ``member`` is loading a snapshot taken there and will
        pull after it (until it has pulled from here or joined, or for ``ttl_s``);
        ``gtid=None`` lifts the hold."""
        if gtid is None:
            self.service.trim_holds.pop(int(member), None)
        else:
            self.service.trim_holds[int(member)] = (GTID(*gtid),
                                                    now_ms() + int(ttl_s * 1000))

    @ray.method(concurrency_group="control")
    def trim_now(self) -> dict:
        """Trim to the cap at once (tests, operators); returns the trim state."""
        return dict(self.service.trim_once())

    # --- the feeder (pulls from downstream producers) ------------------------
    @ray.method(concurrency_group="feeder")
    def pull(self, req: bytes) -> bytes:
        """Stored rows after ``after`` (long-polls up to ``wait_ms``); the caller's
        positions count for write concern as soon as the pull arrives.

        One msgpack map in (``ProducerCore.request``), one out: a Ray call with one
        bytes argument and a bytes result costs ~25% less CPU on each side than
        with ten arguments and a dict (measured). The entries ride in the
        answer as msgpack bin: the stored bytes, unchanged."""
        r = codec.unpack(req, "pull request", PULL_REQUEST_BYTES_MAX)
        try:
            args = (r["after"], r["after_h"], r["max_entries"], r["max_bytes"], r["wait_ms"],
                    r["member"], r["durable"], r["applied"], r.get("downstream"),
                    r.get("term", 0), r.get("majority"))
        except (KeyError, TypeError) as e:
            raise errors.ProtocolError(f"malformed pull request: {e!r:.200}") from None
        return codec.pack(self.feeder.pull(*args))

    @ray.method(concurrency_group="feeder")
    def find_common(self, candidates: list) -> list | None:
        return self.feeder.find_common(candidates)

    @ray.method(concurrency_group="feeder")
    def positions(self) -> dict:
        """Positions of the members pulling from this one (chained replication)."""
        return self.feeder.positions()

    @ray.method(concurrency_group="feeder")
    def on_limit(self, _limit=None) -> None:
        """The producer wrote a batch (the Ray fallback of the doorbell)."""
        self.feeder.on_limit(None)

    @ray.method(concurrency_group="control")
    def truncated(self) -> None:
        """The oplog was rolled back: forget cached entries past its new end."""
        self.feeder.reset()

    @ray.method(concurrency_group="control")
    def address(self) -> dict:
        return {"id": self.member_id, "host": self.port.host, "port": self.port.port,
                "unix": self.port.unix_path, "boot": boot_id(), "role": self.role, "node_id": self.node_id,
                "hidden": bool(self.spec.get("hidden")), "wire": [self.wire.host, self.wire.port]}

    @ray.method(concurrency_group="control")
    def logs(self) -> dict:
        """This process's last warnings and errors, and the member's rollbacks (``raymx logs``)."""
        return {"records": logbook.records(), "rollbacks": logbook.rollbacks(self.path)}

    @ray.method(concurrency_group="control")
    def status(self) -> dict:
        s = self.service.status()
        r = self.engine.range()
        applied = r.last_applied or ZERO
        last_ts, applied_ts = self.engine.commit_times(r.last, applied)  # for lag in seconds
        s.update({"id": self.member_id, "role": self.role, "state": self.core.state(),
                  "initial_sync": self.load_progress,
                  "host": f"{self.port.host}:{self.port.port}", "pid": os.getpid(),
                  "node_id": self.node_id,
                  "term": self.engine.term, "applied": gtid_out(applied),
                  "first": gtid_out(r.first), "last_ts": last_ts, "applied_ts": applied_ts,
                  "connections": self.port.connections, "restarted": self.restarted,
                  # seconds the client port's loop spent polling (Limits.port_busy_poll_us)
                  "port_polled_s": round(self.port.poll.polled_s, 3),
                  "priority": self.spec.get("priority", 1), "votes": self.spec.get("votes", 1),
                  "hidden": bool(self.spec.get("hidden")), "delay_s": self.spec.get("delay_s", 0),
                  "sync_source": self.spec.get("sync_source"),
                  "joining": self.spec.get("joining"),
                  "disk_free": self.engine.store.free_bytes(),
                  "disk_refusals": self.engine.store.disk_refusals})
        if self.role != "primary":
            s["durable"] = gtid_out(r.last)  # the producer syncs every batch it writes
        s["oplog"] = self.oplog_status()
        s["trimmed"] = self.service.trim["trimmed"]
        return s

    def oplog_status(self) -> dict:
        info = self.engine.oplog_info()
        cap = self.service.oplog_cap
        tr = self.service.trim
        over = bool(cap.get("max_bytes") and info["bytes"] > cap["max_bytes"])
        window = None if info["first_ts"] is None else (info["last_ts"] - info["first_ts"]) / 1000
        return {"bytes": info["bytes"], "entries": info["entries"],
                "first": gtid_out(info["first"]), "last": gtid_out(info["last"]),
                "first_ts": info["first_ts"], "last_ts": info["last_ts"], "window_s": window,
                "cap": dict(cap), "over_cap": over,
                "held_by": tr["held_by"] if over else None,
                "trimmed": tr["trimmed"], "trim_txns": tr["txns"],
                "max_trim_txn_entries": tr["max_txn_entries"],
                "max_trim_txn_ms": tr["max_txn_ms"], "trim_ms": round(tr["ms"], 3),
                "trim_error": tr["last_error"], "archive": self.service.archive_status(),
                "majority": gtid_out(self.service.majority_known)}

    # --- bulk-loading a snapshot into this (new) member: DESIGN 8 ---------------
    @ray.method(concurrency_group="load")
    def load_begin(self, info: dict) -> None:
        self.core.synchronizing = True
        self._loaded_sums: dict[int, list] = {}
        snapshot.begin_load(self.engine, info)
        total = sum(1 for _ in info["parts"])
        self.load_progress = {"source": info.get("member"), "gtid": info["gtid"],
                              "parts": total, "parts_done": 0, "rows": info.get("rows"),
                              "rows_done": 0, "phase": "copy"}

    @ray.method(concurrency_group="load")
    def load_rows(self, db: str, rows: bytes, parts_done: int = 1, part: int | None = None) -> int:
        """Bulk-load one sorted run (one concurrency slot: runs arrive in order);
        ``part``: the run is that whole source partition, checksummed as loaded."""
        if part is None:
            n = snapshot.load_rows(self.engine, db, rows)
        else:
            c = self._loaded_sums[int(part)] = snapshot.load_run(self.engine, db, rows)
            n = c[0]
        self._loaded(n, parts_done)
        return n

    @ray.method(concurrency_group="load")
    def load_table(self, table, parts_done: int = 0) -> int:
        """Bulk-load an Arrow table with columns ``db``, ``key``, ``value``, sorted
        by (db, key) (a Spark partition after repartition and sort)."""
        dbs = table.column("db").to_pylist()
        keys = table.column("key").to_pylist()
        vals = table.column("value").to_pylist()
        n, i = 0, 0
        while i < len(dbs):
            j = i
            while j < len(dbs) and dbs[j] == dbs[i]:
                j += 1
            n += snapshot.load_rows(self.engine, dbs[i], list(zip(keys[i:j], vals[i:j])))
            i = j
        self._loaded(n, parts_done)
        return n

    def _loaded(self, rows: int, parts: int) -> None:
        p = self.load_progress
        if p is not None:
            p["rows_done"] += rows
            p["parts_done"] += parts

    @ray.method(concurrency_group="load")
    def load_finish(self, info: dict, checksums: dict) -> list:
        """Verify every partition's checksum, then start the oplog at the snapshot."""
        if self.load_progress is not None:
            self.load_progress["phase"] = "verify"
        # Set before finish_load clears the loading mark: a heartbeat that saw the
        # member loaded (and its oplog at the snapshot) without ``loaded_at`` would
        # let it join before its first pull, which lifts the trimming holds for
        # it, so its sources could trim past the snapshot and it would come up
        # too stale.
        self.loaded_at = list(info["gtid"])
        try:
            g = snapshot.finish_load(self.engine, info,
                                     {int(k): v for k, v in checksums.items()}, self._loaded_sums)
        except BaseException:
            self.loaded_at = None
            raise
        if self.load_progress is not None:
            self.load_progress["phase"] = "catch-up"
        self.feeder.reset()  # its oplog starts here now
        return list(g)

    # --- parallel replay driven by a Spark job (raymx.spark_bridge.spark_replay) ----------
    @ray.method(concurrency_group="load")
    def replay_prepare(self, max_entries: int | None, per_part: int) -> dict | None:
        """Hold the applier and cut the unapplied range into GTID key ranges."""
        applier = _get(self.rs_name, self.member_id, "applier")
        ray.get(applier.pause.remote(True))
        max_entries = max_entries or self.limits.replay_entries_max
        keys = []
        with self.engine.store.read() as t:
            for k, _ in t.scan("unapplied"):
                keys.append(k)
                if len(keys) >= max_entries:
                    break
        if not keys:
            ray.get(applier.pause.remote(False))
            return None
        starts = keys[::per_part]
        stops = starts[1:] + [prefix_end(keys[-1])]
        return {"first": list(GTID.from_bytes(keys[0])), "last": list(GTID.from_bytes(keys[-1])),
                "entries": len(keys), "ranges": list(zip(starts, stops))}

    @ray.method(concurrency_group="oplog")
    def oplog_rows(self, start: bytes, stop: bytes) -> list:
        """Stored oplog rows (gtid, entry, chunks) with ``start <= gtid < stop``."""
        with self.engine.store.read() as t:
            return rep._rows(t, start, stop, 1 << 62, 1 << 62)

    @ray.method(concurrency_group="load")
    def replay_begin(self, commands: list, done: dict, first_use: list, first: list) -> None:
        cmds = [replay.Command(tuple(o), codec.unpack(op)) for o, op in commands]
        self._replay = replay.SegmentWriter(
            self.engine, cmds, {int(k): v for k, v in done.items()},
            {(s, ns): tuple(o) for s, ns, o in first_use}, GTID(*first).to_bytes(),
            self.limits.replay_txn_docs_max)

    @ray.method(concurrency_group="load")
    def replay_block(self, table) -> int:
        """One block of the Spark result, in (segment, ns, pk) order."""
        c = {n: table.column(n).to_pylist() for n in ("seg", "ns", "pk", "seq", "i", "kind",
                                                      "post")}
        changes = [replay.Change(sg, ns, pk, (q, i), None if k == "d" else post)
                   for sg, ns, pk, q, i, k, post in zip(c["seg"], c["ns"], c["pk"], c["seq"],
                                                        c["i"], c["kind"], c["post"])]
        self._replay.write(changes)
        return len(changes)

    @ray.method(concurrency_group="load")
    def replay_end(self) -> int:
        """The last barriers (commands, marks), then the applier resumes tailing."""
        w, self._replay = self._replay, None
        w.close()
        self.replays = getattr(self, "replays", 0) + 1
        ray.get(_get(self.rs_name, self.member_id, "applier").pause.remote(False))
        return w.written

    @ray.method(concurrency_group="load")
    def replay_abort(self) -> None:
        self._replay = None
        ray.get(_get(self.rs_name, self.member_id, "applier").pause.remote(False))

    @ray.method(concurrency_group="control")
    def set_synchronizing(self, on: bool) -> None:
        self.core.synchronizing = on
        if not on:
            self.load_progress = None

    @ray.method(concurrency_group="control")
    def backup(self, dest: str) -> list:
        """A consistent hot copy of this member's files into ``dest`` (this node)."""
        return list(snapshot.backup(self.engine, dest))

    @ray.method(concurrency_group="control")
    def oplog(self, after=None, limit: int = 1000) -> list[tuple[bytes, bytes]]:
        """Entries as msgpack bytes, spilled ops resolved (for rs.oplog())."""
        return [(g.to_bytes(), codec.pack(e)) for g, e in self.engine.oplog_page(after, limit)]

    @ray.method(concurrency_group="control")
    def state_digest(self) -> dict:
        """Collections and oplog (GTIDs and hashes), for convergence checks."""
        st = self.engine.snapshot_state()
        ol = [(list(g), e["h"]) for g, e in self.engine.read_oplog()]
        return {"collections": codec.pack(st), "oplog": ol}

    def shutdown(self) -> None:
        self._bell.close()
        self._majority_bell.close()
        self.wire.close()
        self._applied_bell.close()
        self.port.close()
        self.service.close()
        self.engine.store.close()

    def pid(self) -> int:
        return os.getpid()
