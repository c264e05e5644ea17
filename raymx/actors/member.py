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
from raymx.actors import doorbell
from raymx.actors.core import producer as pc
from raymx.actors.core import replication as rep
from raymx.actors.core.gtid_manager import GTIDManager
from raymx.actors.core.member import MemberCore
from raymx.actors.server import ClientPort, boot_id
from raymx.actors.shard import ShardService, gtid_out
from raymx.storage import codec, replay, snapshot
from raymx.storage.engine import Engine
from raymx.storage.gtid import GTID, ZERO
from raymx.storage.keys import prefix_end
from raymx.storage.limits import Limits
from raymx.storage.lmdb_store import LMDBStore

log = logging.getLogger("raymx.member")
NAMESPACE = "raymx"


def open_member(path: str, limits: Limits) -> Engine:
    return Engine(LMDBStore(path, map_bytes=limits.map_bytes), limits)


def lock_member(path: str, rs: str, member: int, role: str, wait_s: float = 5.0):
    """Hold ``<path>/.<role>.lock`` (an exclusive flock) for this process's
    life: two sets over one data folder, or a zombie process and its restart,
    never write one member's files at once. The kernel drops the lock when the
    process dies, however it dies; a holder that is going away (a kill just
    asked for) is waited for up to ``wait_s``. Returns the open file (keep it)."""
    import fcntl
    os.makedirs(path, mode=0o700, exist_ok=True)
    f = open(os.path.join(path, f".{role or 'shard'}.lock"), "a+")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError:
            if time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise errors.ConfigError(
                f"{path} is in use by {holder}: a member's folder serves one replica "
                "set member at a time (is a set already running over this data_dir?)"
            ) from None
    f.seek(0)
    f.truncate()
    f.write(f"replica set {rs!r} member {member} {role or 'shard'} (pid {os.getpid()})")
    f.flush()
    return f


def stop_process(e: Exception) -> None:
    """A sync failed (``errors.DiskFailed``): stop this process at once, as
    PostgreSQL PANICs. Carrying on could acknowledge writes whose pages the
    kernel dropped; Ray restarts the actor, which recovers from what reached
    the disk (or fails again, visibly, while the disk is broken)."""
    log.critical("stopping this member's process: %s", e)
    logging.shutdown()
    os._exit(70)


def actor_name(rs: str, member: int, role: str = "") -> str:
    return f"{rs}/m{member}" + (f"/{role}" if role else "")


def now_ms() -> int:
    return int(time.time() * 1000)


class Notifier:
    """Sends the newest value to a method of a named actor with at most one call
    in flight, so a fast writer never floods a slow reader with notifications.

    The actor's handle is looked up once (a GCS round trip and a handle built
    each time otherwise) and again only after a call through it failed: the
    actor was replaced, or is restarting.
    """

    def __init__(self, rs: str, member: int, role: str, method: str):
        self._where = (rs, member, role)
        self._method = method
        self._handle = None
        self._lock = threading.Lock()
        self._pending = None
        self._busy = False

    def _send(self, v):
        h = self._handle
        if h is None:
            h = self._handle = _get(*self._where)
        return getattr(h, self._method).remote(v)

    def __call__(self, value) -> None:
        with self._lock:
            self._pending = value
            if self._busy:
                return
            self._busy = True
        self._fire()

    def _fire(self):
        with self._lock:
            v, self._pending = self._pending, None
        try:
            ref = self._send(v)
            ref.future().add_done_callback(self._done)
        except Exception:  # the peer is restarting: the next value will retry
            self._handle = None
            with self._lock:
                self._busy = False

    def _done(self, f):
        if f.exception() is not None:
            self._handle = None  # look the actor up again for the next value
        with self._lock:
            if self._pending is None:
                self._busy = False
                return
        self._fire()


_reniced_at = [0.0]


PULL_REQUEST_BYTES_MAX = 1 << 20  # positions of every member: far below this


def serve_at_normal_priority(every_s: float = 0.0) -> None:
    """Ray starts workers at nice 15; a member's processes serve clients (and,
    for w > 1, replicate for them) at nice 0 when allowed. Measured: ~17-20%
    more durable commits at 8-16 clients for the shard; for the producer and
    applier, replication lag that does not wait behind every other program.

    On Linux the nice value belongs to each thread and new threads inherit it
    from their creator, so every thread of the process is set, and callers
    repeat it now and then (``every_s``) for threads Ray starts later (the
    threads of a concurrency group start with its first call)."""
    now = time.monotonic()
    if every_s and now - _reniced_at[0] < every_s:
        return
    _reniced_at[0] = now
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) > 0:
                os.setpriority(os.PRIO_PROCESS, tid, 0)
        except OSError:
            pass


def _get(rs: str, member: int, role: str):
    return ray.get_actor(actor_name(rs, member, role), namespace=NAMESPACE)


@ray.remote(max_concurrency=16,
            concurrency_groups={"control": 4, "heartbeat": 2, "oplog": 2, "load": 1,
                                "feeder": 8})
class OplogShard:
    """Starts as a secondary; the election coordinator makes it primary or tells
    it whom to follow (also after a restart, so a returning old primary never
    takes writes on its own)."""

    def __init__(self, rs_name: str, member: dict, path: str, secret: str,
                 limits: Limits, votes: dict, bind_host: str | None = None,
                 oplog_cap: dict | None = None):
        self.rs_name, self.member_id, self.path, self.limits = rs_name, member["id"], path, limits
        self.spec = member
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
                                    {int(k): v for k, v in votes.items()})
        # the producer rings after each batch it writes: wake long-polling pulls
        self._bell = doorbell.Listener(path, "feeder", self.feeder.on_limit)
        # and with each newer majority point it learns (the 16 GTID bytes)
        self._majority_bell = doorbell.Listener(path, "majority", self._majority_rung,
                                                with_data=True)
        self.service = ShardService(self.engine, limits, primary=False,
                                    on_durable=self._on_durable, member_id=self.member_id,
                                    votes={int(k): v for k, v in votes.items()},
                                    on_fatal=stop_process)
        cfg = self.engine.get_meta("rs_config") or {}
        self.service.read_refusal = self.core.read_refusal
        self.service.topology_source = lambda: ray.get(ray.get_actor(
            f"{rs_name}/coordinator", namespace=NAMESPACE).topology.remote(), timeout=5)
        cap = cfg.get("oplog_cap") or oplog_cap
        if cap:
            self.service.set_oplog_cap(cap)
        host = bind_host or ray.util.get_node_ip_address()
        self.port = ClientPort(self.service, secret, host, limits.frame_bytes_max,
                               {"member": self.member_id, "replset": rs_name})

    def _on_durable(self, g: GTID) -> None:
        if not self.service.primary or len(self.service.votes) == 1:
            return  # nobody pulls from a one-member set: spare a Ray call per sync
        # the replicatable point is min_live recorded before the sync; ship below it
        rp = self.service.gm.replicatable()
        self.feeder.on_limit(GTID(rp.term, rp.seq - 1) if rp.seq > 1 else ZERO)

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
        return dict(self.core.reply(self.service.gm.term),
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
            prod = _get(self.rs_name, self.member_id, "producer")
            ray.get(prod.pause.remote(True, wait=True), timeout=timeout_s)
            deadline = time.monotonic() + timeout_s
            while rep.min_unapplied(self.engine) is not None:
                if time.monotonic() > deadline:
                    raise errors.PrimaryUnavailable(
                        f"member {self.member_id} could not apply its oplog in {timeout_s}s")
                ray.get(_get(self.rs_name, self.member_id, "applier").wake.remote())
                time.sleep(0.005)
            self.engine.set_term(term)  # durable before the first write under it
            # the feeder leaves "ship the written oplog" mode before any write
            # under the new term can commit (unsynced entries must not ship)
            self.feeder.set_primary(True)
            self.service.become_primary(term)
            last, _ = self.engine.last()  # synced by become_primary
            self.core.became_primary(last)
            self._on_durable(last)
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
                "hidden": bool(self.spec.get("hidden"))}

    @ray.method(concurrency_group="control")
    def status(self) -> dict:
        s = self.service.status()
        r = self.engine.range()
        applied = r.last_applied or ZERO

        def ts(g):  # commit time of an entry, for lag in seconds
            return None if g is None or g == ZERO else \
                codec.unpack(t.get("oplog", g.to_bytes()))["ts"]
        with self.engine.store.read() as t:
            last_ts, applied_ts = ts(r.last), ts(applied)
        s.update({"id": self.member_id, "role": self.role, "state": self.core.state(),
                  "initial_sync": self.load_progress,
                  "host": f"{self.port.host}:{self.port.port}", "pid": os.getpid(),
                  "node_id": self.node_id,
                  "term": self.engine.term, "applied": gtid_out(applied),
                  "first": gtid_out(r.first), "last_ts": last_ts, "applied_ts": applied_ts,
                  "connections": self.port.connections, "restarted": self.restarted,
                  "priority": self.spec.get("priority", 1), "votes": self.spec.get("votes", 1),
                  "hidden": bool(self.spec.get("hidden")), "delay_s": self.spec.get("delay_s", 0),
                  "sync_source": self.spec.get("sync_source")})
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
                "trim_error": tr["last_error"],
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

    # --- parallel replay driven by a Spark job (raymx.spark_bridge.replay) ----------
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
        out = []
        for g, e in self.engine.read_oplog(after=None if after is None else GTID(*after),
                                           limit=limit):
            out.append((g.to_bytes(), codec.pack(e)))
        return out

    @ray.method(concurrency_group="control")
    def state_digest(self) -> dict:
        """Collections and oplog (GTIDs and hashes), for convergence checks."""
        st = self.engine.snapshot_state()
        ol = [(list(g), e["h"]) for g, e in self.engine.read_oplog()]
        return {"collections": codec.pack(st), "oplog": ol}

    def shutdown(self) -> None:
        self._bell.close()
        self._majority_bell.close()
        self.port.close()
        self.service.close()
        self.engine.store.close()

    def pid(self) -> int:
        return os.getpid()


class FeederService:
    """Tailable cursors over a member's oplog for downstream producers, served
    from the member's OplogShard process (its "feeder" concurrency group).

    Living beside the shard makes the two notifications of every replicated
    batch in-process calls: the new replicatable point after each sync
    (``on_limit``) and the durable positions a pull reports (``on_positions``,
    which releases write-concern waiters at once). On a primary the limit is
    the replicatable point's predecessor, moved only by ``on_limit``; on a
    secondary it is the end of its written oplog, re-read by every pull (the
    producer rings a doorbell after each batch to wake long-polling pulls).
    Answers carry the majority-committed point this feeder can vouch for.
    """

    def __init__(self, engine: Engine, limits: Limits, member_id: int, on_positions,
                 votes: dict | None = None):
        self.engine = engine
        self.member_id = member_id
        self.limits = limits
        self.core = rep.FeederCore(engine, limits)
        self.core.votes = {int(k): v for k, v in (votes or {}).items()}
        self.core.upstream_majority = engine.range().majority
        self.primary = False
        self._on_positions = on_positions
        self._core_lock = threading.Lock()   # FeederCore is not thread-safe
        self._latch = threading.Condition()  # long-polling pulls wait here
        self._version = 0                    # bumped by every notification
        self._target = ZERO                  # newest limit notified (primary)
        self.reset()

    def reset(self) -> None:
        """A secondary ships its written, gap-free oplog (chained replication); a
        new primary everything it holds (it synced before taking writes)."""
        with self._core_lock:
            self.core.truncated()
            self._target = self.engine.last()[0]
            self.core.advance(self._target)
        self._ring()

    def set_primary(self, primary: bool) -> None:
        with self._core_lock:
            self.primary = primary
        self.reset()

    def on_limit(self, limit: GTID | None = None) -> None:
        """New entries up to ``limit`` may be shipped (a primary's sync); on a
        secondary (``None``): the producer wrote a batch. Never blocks on LMDB."""
        if limit is not None:
            with self._latch:
                if limit > self._target:
                    self._target = limit
        self._ring()

    def _ring(self) -> None:
        with self._latch:
            self._version += 1
            self._latch.notify_all()

    def set_votes(self, votes: dict) -> None:
        with self._core_lock:
            self.core.votes = {int(k): v for k, v in votes.items()}

    def on_majority(self, g: GTID) -> None:
        """The majority point this member's producer learned (chained members)."""
        with self._core_lock:
            if self.core.upstream_majority is not None and g <= self.core.upstream_majority:
                return
            self.core.upstream_majority = g
        self._ring()

    def pull(self, after, after_h, max_entries: int, max_bytes: int, wait_ms: int,
             member: int, durable, applied, downstream: dict | None, term: int,
             majority=None) -> dict:
        """Entries after ``after`` (long-poll up to ``wait_ms``). Answers carry
        the majority-committed point; a pull returns, even empty, when it is
        newer than the caller's ``majority`` (change streams wait on it), but
        only after lingering ``majority_linger_ms`` for new entries: the report
        a pull carries usually moves the majority itself, and answering that at
        once would double the pulls (each a Ray call) under a light load."""
        with self._core_lock:
            stale = self.core.admit(term, self.member_id)
        if stale is not None:
            return stale
        my_term = self.engine.term
        now = now_ms()
        caller = {"durable": durable, "applied": applied, "downstream": downstream}
        t0 = time.monotonic()
        deadline = t0 + wait_ms / 1000
        linger_until = t0 + self.limits.majority_linger_ms / 1000
        known = None if majority is None else GTID(*majority)
        while True:
            with self._latch:
                seen = self._version  # read before pulling, so no notification is missed
                target = self._target
            with self._core_lock:
                if not self.primary:
                    target = self.engine.last()[0]
                if target > self.core.limit:
                    self.core.advance(target)
                out, report, changed = self.core.answer(
                    after, after_h, max_entries, max_bytes, my_term, member, self.member_id,
                    self.primary, caller, now)
            caller = None  # the positions count once, with the first answer
            if report:  # outside the lock: it reaches the write-concern waiters
                self._on_positions({m: p["durable"] for m, p in report.items()},
                                   {m: p["at_ms"] for m, p in report.items()})
            if changed:
                self._ring()  # long-polls learn the new point
            seen_mj = None if out.get("majority") is None else GTID(*out["majority"])
            if out["status"] != "ok" or out["rows"]:
                return out
            until = deadline
            if seen_mj is not None and (known is None or seen_mj > known):
                until = min(deadline, linger_until)  # news of the majority only
            with self._latch:
                left = until - time.monotonic()
                if left <= 0:
                    return out
                if self._version == seen:
                    self._latch.wait(left)

    def find_common(self, candidates: list) -> list | None:
        g = rep.match_common(self.engine, candidates)
        return None if g is None else list(g)

    def positions(self) -> dict:
        with self._core_lock:
            pos = dict(self.core.positions)
        return {m: {"durable": None if p["durable"] is None else list(p["durable"]),
                    "applied": None if p["applied"] is None else list(p["applied"]),
                    "at_ms": p["at_ms"]} for m, p in pos.items()}


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
        serve_at_normal_priority()
        self._dir_lock = lock_member(path, rs_name, member_id, "producer")
        self.engine = open_member(path, limits)
        self.core = pc.ProducerCore(self.engine, member_id, limits)
        self.batches = self.entries = self.rollbacks = self.pulls = 0
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


@ray.remote(max_concurrency=4, concurrency_groups={"control": 2})
class Applier:
    """Applies unapplied entries in GTID order, in bounded batches."""

    def __init__(self, rs_name: str, member_id: int, path: str, limits: Limits,
                 delay_s: float = 0):
        self.member_id, self.limits = member_id, limits
        serve_at_normal_priority()
        self.delay_ms = int(delay_s * 1000)
        self._dir_lock = lock_member(path, rs_name, member_id, "applier")
        self.engine = open_member(path, limits)
        self.applied_entries = self.applied_ops = self.replays = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._hold = threading.Event()
        self._idle = threading.Event()
        self._info_at = 0.0
        # the producer rings after each batch (a Ray call to wake() otherwise)
        self._bell = doorbell.Listener(path, "applier", self._wake.set)
        self._t = threading.Thread(target=self._run, name="raymx-applier", daemon=True)
        self._t.start()

    @ray.method(concurrency_group="control")
    def wake(self, _g=None) -> None:
        self._wake.set()

    @ray.method(concurrency_group="control")
    def set_delay(self, delay_s: float) -> None:
        self.delay_ms = int(delay_s * 1000)
        self._wake.set()

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
            except Exception:
                log.exception("member %d: apply failed", self.member_id)
                time.sleep(1)
                continue
            self.applied_entries += n
            self.applied_ops += ops
            if time.monotonic() - self._info_at >= 1.0:
                self._info_at = time.monotonic()
                last, _ = self.engine.last()
                rep.write_repl_info(self.engine, GTID(last.term, last.seq + 1))
            if n == 0:
                self._wake.wait(0.05 if self.delay_ms else 0.5)
                self._wake.clear()

    @ray.method(concurrency_group="control")
    def status(self) -> dict:
        return {"applied_entries": self.applied_entries, "applied_ops": self.applied_ops,
                "replays": self.replays}

    def shutdown(self):
        self._stop.set()
        self._wake.set()
        self._t.join(10)
        self._bell.close()

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
