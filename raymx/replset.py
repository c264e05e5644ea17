"""Launch, connect to, inspect and shut down a replica set."""
from __future__ import annotations

import logging
import os
import secrets
import shutil
import time
from typing import Iterator

from raymx import errors
from raymx.actors.tls import check_settings, client_context
from raymx.client import Client, ReadConcern, ReadPreference, WriteConcern
from raymx.members import (NAMESPACE, _SPEC_KEYS, OplogEntry, _adopt_backup, _check_cap,
                           _joining, _least_used_node, _member_specs, _move_aside, _on_node,
                           _one_spec, _place, _start_member,
                           format_status, next_member_id,  # noqa: F401 (re-exported)
                           oplog_entries)
from raymx.storage.gtid import GTID
from raymx.storage.limits import DEFAULT, Limits

log = logging.getLogger("raymx.replset")


def _ray():
    import ray
    return ray


def _ensure_ray():
    ray = _ray()
    if not ray.is_initialized():
        # Attaches to a running cluster (RAY_ADDRESS or a local one) or starts a local one.
        ray.init(namespace=NAMESPACE, log_to_driver=False)
    return ray


def _coordinator_read(coord, method: str, timeout_s: float = 60.0):
    """Call a read-only coordinator method, waiting out a restart.

    The coordinator is a detached actor with unlimited restarts: when its node
    dies Ray starts it again elsewhere and, meanwhile, calls fail with
    ActorUnavailableError (or RayActorError for a call in flight). Reads are
    safe to repeat, so they are retried until ``timeout_s``."""
    ray = _ray()
    from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ray.get(getattr(coord, method).remote())
        except (ActorUnavailableError, RayActorError) as e:
            if isinstance(e, ActorDiedError) and "killed by `ray.kill`" in str(e):
                raise errors.ConfigError("the replica set's coordinator was stopped "
                                         "(the set was shut down)") from None
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _ready(handles, timeout_s: float = 120) -> None:
    """Wait until new actors are up; a ConfigError raised by one's constructor
    (its folder is in use, or belongs to another member or set) is raised as
    such, not as Ray's ActorDiedError."""
    ray = _ray()
    from ray.exceptions import RayActorError
    try:
        ray.get([h.__ray_ready__.remote() for h in handles], timeout=timeout_s)
    except RayActorError as e:
        text = str(e)
        if "ConfigError: " in text:
            raise errors.ConfigError(text.split("ConfigError: ", 1)[1].splitlines()[0]) \
                from None
        raise


def _wait_dead(handle, timeout_s: float = 10.0) -> None:
    """``ray.kill`` only asks for the kill: wait until the actor is gone, so a
    read right after ``shutdown()`` returns finds the set shut down."""
    ray = _ray()
    from ray.exceptions import ActorDiedError
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(handle.__ray_ready__.remote(), timeout=1)
        except ActorDiedError:
            return
        except Exception:  # still going away (unavailable, or no answer yet)
            pass
        time.sleep(0.05)


SECRET_FILE = "secret"  # in the set's data folder (mode 0600): a relaunch keeps it


def _kept_secret(data_dir: str, secret: str | None) -> str:
    """The set's secret: ``secret`` if given (stored for the next relaunch),
    else the one a launch over this folder stored, else a new one. So a
    relaunch keeps the password of every connection string given out."""
    path = os.path.join(data_dir, SECRET_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            stored = f.read().strip()
    except FileNotFoundError:
        stored = None
    if (secret is not None and type(secret) is not str) or secret == "":
        raise errors.ConfigError("secret must be a non-empty string")
    if stored and secret is None:
        return stored
    secret = secret or secrets.token_urlsafe(32)
    if secret != stored:
        tmp = path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(secret)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    return secret


def _check_name(name) -> str:
    if not isinstance(name, str) or not name or len(name) > 64 or not all(
            c.isalnum() or c in "-_" for c in name):
        raise errors.ConfigError(f"replica set name {name!r}: 1-64 letters, digits, '-' or '_'")
    return name


class ReplicaSet:
    """A handle on a running replica set (``launch`` or ``connect``)."""

    def __init__(self, name: str, coordinator):
        self.name = name
        self._coord = coordinator

    # --- life cycle ----------------------------------------------------
    @classmethod
    def launch(cls, name: str, members=1, data_dir: str | None = None,
               limits: Limits | None = None, secret: str | None = None,
               bind_host: str | None = None, node_ids: list[str] | None = None,
               oplog_cap: dict | None = None, placement: str = "spread",
               tls: dict | None = None) -> "ReplicaSet":
        """Start every member's actors, each pinned to its node (its files live there).

        ``placement="spread"`` (default) puts the members on distinct alive
        nodes of the Ray cluster, the driver's node first (more members than
        nodes: as evenly as possible, with a warning, and ``status`` says which
        share a node); a member whose folder already holds files on this node
        (a relaunch) stays here. ``placement="pack"`` puts every member on this
        node (development).

        ``members`` is a count or a list of member specs: dicts with optional
        ``priority`` (0: never primary), ``votes`` (0 or 1), ``hidden``,
        ``delay_s`` (a delayed member applies entries that old) and
        ``sync_source`` (a member id, for chained replication). Restarting
        over an existing ``data_dir`` recovers every committed transaction and
        the oplog; the primary comes back under a new term. ``oplog_cap``:
        ``{"max_bytes": n, "max_age_s": s}`` (either may be None; default
        ``Limits.oplog_bytes_max`` bytes, no age), see ``set_oplog_cap``. ``node_ids`` places
        member i on ``node_ids[i]`` (over ``placement``). The data folder's path
        must be node-local (or shared) on each node a member runs on. ``tls``:
        ``{"cert_file", "key_file", "ca_file"}`` (PEM paths on every node): the
        members' TCP client ports then require TLS (README.md, "TLS").
        """
        _check_name(name)
        specs = _member_specs(members)
        limits = limits or DEFAULT
        cap = _check_cap(oplog_cap if oplog_cap is not None
                         else {"max_bytes": limits.oplog_bytes_max})
        ray = _ensure_ray()
        from raymx.actors.coordinator import Coordinator
        from raymx.actors.process import actor_name
        try:
            ray.get_actor(f"{name}/coordinator", namespace=NAMESPACE)
            raise errors.ConfigError(f"replica set {name!r} is already running: "
                                     f"use raymx.connect({name!r})")
        except ValueError:
            pass
        data_dir = os.path.abspath(data_dir or os.path.join("raymx-data", name))
        os.makedirs(data_dir, mode=0o700, exist_ok=True)
        secret = _kept_secret(data_dir, secret)
        tls = check_settings(tls)
        votes = {m["id"]: m["votes"] for m in specs}
        handles = []
        for m in specs:
            m["path"] = os.path.join(data_dir, f"m{m['id']}")
            m["actor"] = actor_name(name, m["id"])
        for m, node in zip(specs, _place(ray, specs, node_ids, placement)):
            m["node_id"] = node
        try:
            for m in specs:
                handles += _start_member(name, m, secret, limits, votes, bind_host, cap, tls)
            # its process starts while the members' do (it reads their stored
            # configuration once they are up)
            coord = Coordinator.options(name=f"{name}/coordinator", namespace=NAMESPACE,
                                        lifetime="detached", max_restarts=-1, num_cpus=0).remote(
                name, secret, specs, limits, {"bind_host": bind_host, "oplog_cap": cap, "tls": tls})
            handles.append(coord)
            _ready(handles[:-1])  # a member's ConfigError (its folder) first
            _ready([coord])
            rs = cls(name, coord)
            rs.wait_for_primary(60)
        except Exception:
            for h in handles:
                ray.kill(h, no_restart=True)
            raise
        return rs

    def wait_for_primary(self, timeout_s: float = 30) -> int:
        """Block until the set has a primary (the first election runs at launch)."""
        deadline = time.monotonic() + timeout_s
        while True:
            topo = self._topology()
            if topo.get("primary") is not None and any(
                    m["role"] == "primary" for m in topo["members"]):
                return topo["primary"]
            if time.monotonic() > deadline:
                raise errors.PrimaryUnavailable(f"no primary elected within {timeout_s}s")
            time.sleep(0.05)

    def kill_member(self, member_id: int) -> list:
        """Kill every process of a member at once, without restart (a crash: no
        flush, no goodbye). Its files stay; ``start_member`` brings it back.
        Returns the actors' handles (``ray.kill`` only asks for the kill)."""
        ray = _ray()
        killed = []
        for role in ("", "producer", "applier"):
            try:
                h = ray.get_actor(f"{self.name}/m{member_id}" + (f"/{role}" if role else ""),
                                  namespace=NAMESPACE)
            except ValueError:
                continue
            ray.kill(h, no_restart=True)
            killed.append(h)
        return killed

    def _discard_new(self, spec: dict) -> None:
        """A member this ``add_member`` started that no configuration holds: its
        processes go, and its folder (empty before, checked), so its id, which
        a restarted coordinator may hand out again, is free."""
        for h in self.kill_member(spec["id"]):
            _wait_dead(h)
        shutil.rmtree(spec["path"], ignore_errors=True)

    def start_member(self, member_id: int) -> None:
        """Start a member's actors again over its files (after ``kill_member``).

        It comes back as a secondary; if it had written entries the others do
        not hold, it rolls them back (see its rollback file) and catches up.
        """
        _ray()  # Ray is up (a clear error if not)
        cfg = self.config()
        m = next((x for x in cfg["members"] if x["id"] == member_id), None)
        if m is None:
            raise errors.ConfigError(f"replica set {self.name} has no member {member_id}")
        votes = {x["id"]: x["votes"] for x in cfg["members"]}
        hs = _start_member(self.name, m, cfg["secret"], cfg["limits"], votes,
                           cfg["extra"].get("bind_host"), cfg.get("oplog_cap"), cfg["extra"].get("tls"))
        _ready(hs)

    # --- reconfiguration ---------------------------------------------------
    def add_member(self, priority: float = 1, votes: int = 1, hidden: bool = False,
                   delay_s: float = 0, sync_source: int | None = None,
                   initial_sync: str = "auto", source: int | None = None, spark=None,
                   backup: str | None = None, progress: bool = True,
                   timeout_s: float = 3600, wait: bool = True) -> int:
        """Add a member on the alive node with the fewest members (this one on a
        tie); returns its id.

        ``initial_sync``: ``"oplog"`` replicates the whole oplog from its sync
        source (refused with ConfigError unless that member's oplog still starts
        at the set's first entry: not after trimming, nor on a member that
        began from a snapshot); ``"auto"`` (the default) is ``"oplog"`` when
        every member's oplog starts there, else ``"snapshot"``; ``"snapshot"``
        copies a consistent snapshot of a running member (``source``, default the
        most advanced secondary) and replicates from the snapshot's GTID, as a
        Spark job when ``spark`` is a session from ``raymx.spark_bridge``, else
        straight between the members' actors; ``"backup"`` starts from a hot
        copy made by ``rs.backup()`` (``backup=`` its folder), re-applying from
        its replInfo point and skipping the GTIDs it already has. Whatever the
        way, the new member joins with no vote and priority 0 (``joining`` in
        the configuration holds what it asked for), as MongoDB's newly added
        members: the coordinator gives it ``votes``/``priority`` once it has
        caught up (within ``Limits.join_lag_entries`` of the primary), so a
        member far behind never counts toward a majority or wins an election.
        While a snapshot sync runs the member is *synchronizing*, shown with
        its progress in ``status()``. ``wait=True`` returns once it has its
        votes; ``wait=False`` once it replicates (a snapshot: once loaded).
        A change that is refused, or dies with the coordinator before any
        configuration holds the member, stops the member it started and
        removes its (new) folder before the error is raised.
        """
        if initial_sync not in ("auto", "oplog", "snapshot", "backup"):
            raise errors.ConfigError(f"initial_sync must be 'auto', 'oplog', 'snapshot' or "
                                     f"'backup', not {initial_sync!r}")
        if (backup is not None) != (initial_sync == "backup"):
            raise errors.ConfigError("backup= goes with initial_sync='backup' (and only there)")
        ray = _ray()
        cfg = self.config()
        members = [dict(m) for m in cfg["members"]]
        spec = _one_spec(next_member_id(cfg), {"priority": priority, "votes": votes,
                                               "hidden": hidden, "delay_s": delay_s,
                                               "sync_source": sync_source})
        if sync_source is not None and sync_source not in {m["id"] for m in members}:
            raise errors.ConfigError(f"sync_source {sync_source} is not a member")
        if initial_sync in ("auto", "oplog"):
            initial_sync = self._oplog_or_snapshot(initial_sync, sync_source)
        # the id, taken from the coordinator: two additions at once get two
        new_id = ray.get(self._coord.reserve_member_id.remote())
        spec.update(id=new_id, actor=f"{self.name}/m{new_id}",
                    path=os.path.join(os.path.dirname(members[0]["path"]), f"m{new_id}"),
                    node_id=_least_used_node(ray, members))
        if os.path.isdir(spec["path"]) and os.listdir(spec["path"]):
            raise errors.ConfigError(f"{spec['path']} already holds files: move it away first")
        if initial_sync == "backup":
            _adopt_backup(backup, spec["path"], cfg["limits"])
        if initial_sync != "snapshot":
            joining = _joining(spec)
            members.append(joining)
            self._start(joining, cfg, members)
            try:
                self._change(min(timeout_s, RECONFIG_TIMEOUT_S), put=joining)
            except errors.ConfigError:
                self._discard_new(spec)  # never configured
                raise
            except Exception:
                # the coordinator died with the change (Ray restarts it): a
                # member its newest configuration does not hold goes, else it
                # would run on unconfigured, never asked to replicate
                try:
                    configured = any(m["id"] == new_id for m in self.config()["members"])
                except Exception:
                    configured = True  # unknown: leave it (status shows it)
                if not configured:
                    self._discard_new(spec)
                raise
            if wait:
                self._wait_joined(new_id, timeout_s)
            return new_id
        self._sync_from_snapshot(spec, cfg, members, source, spark, progress, timeout_s, wait)
        return new_id

    def _oplog_or_snapshot(self, how: str, sync_source: int | None) -> str:
        """``"oplog"`` if a new member can replicate the whole oplog: every
        member's oplog starts at the set's first entry (``"auto"``), or its
        sync source's does (``"oplog"``, else ConfigError); else ``"snapshot"``."""
        st = self.status()
        whole = {m["id"] for m in st["members"] if "first" in m and (
            m["first"] is None or m["first"][1] == 1)}
        if how == "auto":
            return "oplog" if all(m["id"] in whole for m in st["members"]) else "snapshot"
        src = sync_source if sync_source is not None else st.get("primary")
        if src is None:
            raise errors.PrimaryUnavailable("no primary to replicate the oplog from; nothing "
                                            "changed")
        if src not in whole:
            first = next((m.get("first") for m in st["members"] if m["id"] == src), None)
            raise errors.ConfigError(
                f"member {src}'s oplog starts at {first or 'an unknown entry'}, not at the "
                "set's first entry (it was trimmed, or the member began from a snapshot): a "
                "new member cannot replicate the whole oplog from it; use "
                "initial_sync='snapshot' (or 'auto', the default)")
        return "oplog"

    def _wait_joined(self, mid: int, timeout_s: float) -> None:
        """Until member ``mid`` has its votes and priority (it caught up).
        ConfigError if it is no longer configured (removed meanwhile, or a
        restarted coordinator took a configuration from before it)."""
        deadline = time.monotonic() + timeout_s
        while True:
            cfg = self.config()
            m = next((x for x in cfg["members"] if x["id"] == mid), None)
            # unsettled: a restarted coordinator may yet take a newer
            # configuration, with this member, from the members
            if m is None and cfg.get("settled", True):
                raise errors.ConfigError(
                    f"member {mid} is no longer in the configuration (removed, or the "
                    "coordinator restarted and found only members holding an older one): "
                    f"it never got its votes; stop it with kill_member({mid})")
            if m is not None and "joining" not in m:
                return
            if time.monotonic() > deadline:
                raise errors.PrimaryUnavailable(
                    f"member {mid} did not catch up and get its votes in {timeout_s}s "
                    "(is there a primary? status() shows its lag)")
            time.sleep(0.05)

    def _config_member(self, member_id: int) -> tuple[dict, list[dict], dict]:
        """The configuration, its members (copies, to reconfigure) and member ``member_id``'s."""
        cfg = self.config()
        members = [dict(m) for m in cfg["members"]]
        m = next((x for x in members if x["id"] == member_id), None)
        if m is None:
            raise errors.ConfigError(f"no member {member_id}")
        return cfg, members, m

    def resync_member(self, member_id: int, source: int | None = None, spark=None,
                      progress: bool = True, timeout_s: float = 3600) -> dict:
        """Rebuild a member (too stale, or unable to roll back) from a snapshot of
        another member, by the same path as ``add_member(initial_sync="snapshot")``.
        Its old folder is moved aside (``<path>.resync-<ms>``), not deleted."""
        ray = _ray()
        cfg, members, m = self._config_member(member_id)
        if self._topology().get("primary") == member_id:
            raise errors.ConfigError(f"member {member_id} is the primary: step_down() first")
        final = dict(m)
        m.update(votes=0, priority=0)  # never counted or elected while it resyncs
        self._change(RECONFIG_TIMEOUT_S, put=m)
        self.kill_member(member_id)
        aside = f"{m['path']}.resync-{int(time.time() * 1000)}"
        ray.get(ray.remote(num_cpus=0)(_move_aside).options(
            scheduling_strategy=_on_node(m["node_id"])).remote(m["path"], aside))
        members = [x for x in members if x["id"] != member_id]
        out = self._sync_from_snapshot(final, cfg, members, source, spark, progress,
                                       timeout_s)
        out["moved_aside"] = aside
        return out

    def _start(self, spec: dict, cfg: dict, members: list, initial_sync: bool = False) -> None:
        _ray()  # Ray is up (a clear error if not)
        votes_map = {m["id"]: m["votes"] for m in members}
        hs = _start_member(self.name, dict(spec, initial_sync=initial_sync), cfg["secret"],
                           cfg["limits"], votes_map, cfg["extra"].get("bind_host"),
                           cfg.get("oplog_cap"), cfg["extra"].get("tls"))
        _ready(hs)

    def _sync_from_snapshot(self, spec: dict, cfg: dict, members: list, source, spark,
                            progress: bool, timeout_s: float, wait: bool = True) -> dict:
        from raymx.spark_bridge import initial_sync as isync
        ray = _ray()
        mid = spec["id"]
        # no vote while it synchronizes; the coordinator gives it ``joining``'s
        # votes and priority once it has caught up (also if this driver is gone)
        syncing = _joining(spec)
        all_members = members + [syncing]
        all_members.sort(key=lambda x: x["id"])
        if source is None:
            source = isync.choose_source(self.status(), exclude=mid)
        # nothing is trimmed while the snapshot opens; the copy then holds its GTID
        isync.hold_trimming(self, mid, [0, 0])
        held, src = spark is not None and wait, None
        try:
            # the snapshot's process starts while the member's actors do
            src = isync.open_source(self, source)
            # started marked as synchronizing: its producer pulls nothing until loaded
            self._start(syncing, cfg, all_members, initial_sync=True)
            self._change(RECONFIG_TIMEOUT_S, put=syncing)
            if held:
                isync.hold_applier(self, mid, True)  # the catch-up is a Spark job too
        except BaseException:
            if src is not None:
                ray.kill(src, no_restart=True)
            isync.hold_trimming(self, mid, None)
            raise
        try:
            out = isync.copy_snapshot(self, source, mid, spark=spark, progress=progress,
                                      src=src)
        except BaseException:
            if held:
                isync.hold_applier(self, mid, False)
            isync.hold_trimming(self, mid, None)  # trimming need not wait for it now
            raise
        if not wait:
            return out
        goal = GTID(*self.status_of(self._primary_id())["last"])
        if spark is not None:
            out["replay"] = isync.catch_up_with_spark(spark, self, mid, goal, timeout_s,
                                                      progress)
        isync.wait_caught_up(self, mid, goal, timeout_s, progress)
        self._wait_joined(mid, timeout_s)
        out["caught_up_to"] = goal
        return out

    def _primary_id(self) -> int:
        p = self._topology().get("primary")
        if p is None:
            raise errors.PrimaryUnavailable("no primary is available")
        return p

    def status_of(self, member_id: int) -> dict:
        return _ray().get(self.member(member_id).status.remote())

    def backup(self, member_id: int, dest: str) -> GTID:
        """A consistent hot copy of a member's files into ``dest`` (a folder on that
        member's node). ``add_member(initial_sync="backup", backup=dest)`` joins it."""
        return GTID(*_ray().get(self.member(member_id).backup.remote(os.path.abspath(dest))))

    def remove_member(self, member_id: int, timeout_s: float | None = None) -> None:
        """Remove a secondary (step the primary down first); its files stay on disk.

        A voter is removed only once the primary's last entry is durable on a
        majority of the remaining voters (and of the current ones): a lagging
        set waits for its members to catch up, up to ``timeout_s`` (default
        60 s), then refuses with ConfigError and nothing changes. Calls made
        together run one after the other, each waiting for the one before.
        The member stops once a majority of the voters that remain have
        recorded the new configuration; if they have not within the timeout,
        ConfigError says so and it keeps running (unconfigured):
        ``kill_member`` it once ``status()`` shows them back."""
        cfg = self._change(RECONFIG_TIMEOUT_S if timeout_s is None else timeout_s,
                           remove=member_id)
        if not cfg.get("recorded", True):
            raise errors.ConfigError(
                f"member {member_id} is removed from the configuration, but a majority of "
                "the voters that remain has not recorded it yet (a coordinator restarted now "
                f"could take the configuration before, where member {member_id} votes): it "
                f"keeps running; stop it with kill_member({member_id}) once status() shows "
                "the others up", recorded=False)
        self.kill_member(member_id)

    def reconfigure_member(self, member_id: int, timeout_s: float | None = None,
                           **changes) -> None:
        """Change ``priority``, ``votes``, ``hidden`` or ``delay_s`` online (a vote
        given or taken waits as ``remove_member`` does)."""
        allowed = {"priority", "votes", "hidden", "delay_s"}
        if set(changes) - allowed:
            raise errors.ConfigError(f"can change only {sorted(allowed)}")
        _, members, m = self._config_member(member_id)
        m.update(changes)
        m.update(_one_spec(member_id, {k: m[k] for k in _SPEC_KEYS}))
        if m["priority"] == 0 and self._topology().get("primary") == member_id:
            raise errors.ConfigError(f"member {member_id} is the primary: step_down() first")
        self._change(RECONFIG_TIMEOUT_S if timeout_s is None else timeout_s, put=m)

    def _change(self, timeout_s: float, **edit) -> dict:
        """One configuration change through the coordinator (it applies them one
        at a time, to the configuration current then)."""
        ray = _ray()
        from ray.exceptions import RayTaskError
        try:
            return ray.get(self._coord.change.remote(timeout_s=timeout_s, **edit),
                           timeout=timeout_s + 120)
        except RayTaskError as e:
            if isinstance(e.cause, errors.RaymxError):
                raise e.cause from None
            raise

    def set_oplog_cap(self, max_bytes: int | None = None, max_age_s: float | None = None,
                      force: bool = False) -> dict:
        """Cap every member's oplog by size and/or age, online (None: no cap on
        that dimension; both None: no trimming). Members trim in the background
        in small transactions, never past the majority-committed point or the
        position of a running member unless ``force`` (never an unapplied
        entry). Kept in the configuration, so restarted members keep it."""
        cap = {"max_bytes": max_bytes, "max_age_s": max_age_s, "force": force}
        arch = (self.config().get("oplog_cap") or {}).get("archive")
        if arch:  # the archive stays (set_archive changes it)
            cap["archive"] = arch
        return _ray().get(self._coord.set_oplog_cap.remote(_check_cap(cap)))

    def set_archive(self, uri: str | None, lag_s: float = 1.0) -> dict:
        """Archive the oplog as Parquet segments before it is trimmed (DESIGN
        section 9; README "The oplog archive"), online, kept in the
        configuration: ``uri`` a folder every member reaches or a
        ``pyarrow.fs`` URI; entries archived at most ``lag_s`` after they are
        majority-committed. ``None`` stops archiving."""
        cap = dict(self.config().get("oplog_cap") or {"max_bytes": None})
        cap.pop("archive", None)
        if uri is not None:
            cap["archive"] = {"uri": uri, "lag_s": lag_s}
        return _ray().get(self._coord.set_oplog_cap.remote(_check_cap(cap)))

    def archive_location(self) -> dict | None:
        """The archive's ``{"uri", "lag_s"}`` (None: no archive)."""
        return (self.config().get("oplog_cap") or {}).get("archive")

    def trim_now(self) -> list[dict]:
        """Trim every running member to the cap now (it also happens every
        ``Limits.trim_interval_ms``); returns each member's oplog status."""
        ray = _ray()
        cfg = self.config()
        out = []
        for m in cfg["members"]:
            try:
                h = self.member(m["id"])
                ray.get(h.trim_now.remote(), timeout=60)
                out.append(dict(ray.get(h.status.remote(), timeout=30)["oplog"], id=m["id"]))
            except Exception as e:
                out.append({"id": m["id"], "error": f"{type(e).__name__}: {e}"})
        return out

    def revert_to(self, gtid, dry_run: bool = False, w: int | str = "majority",
                  j: bool = True, timeout_s: float = 300) -> dict:
        """Point-in-time recovery: return every collection and index to their
        state right after ``gtid`` by appending compensating ops (the inverse of
        every later op, newest first, from the logged images) on the primary.

        They commit as ONE new entry (one GTID): the revert is atomic, replicates
        like any write, honours ``w``/``j``, and the oplog keeps the whole
        history (reverting the revert is another ``revert_to``). Writes after
        ``gtid`` that touched the same documents are undone too. Refuses,
        naming the entry and op, if a later entry cannot be undone (a dropped
        collection: ``IrreversibleOp``) or if ``gtid`` is below the oplog's
        first entry (``OplogTrimmed``, with the oldest GTID available).

        ``dry_run=True`` changes nothing and returns what would be undone:
        ``entries``, ``ops``, ``newest``/``oldest`` GTIDs, ``gtids`` (up to
        1,000) and per-namespace op counts. Otherwise returns the same plan
        plus ``gtid``, the compensating entry's GTID (None if nothing to undo).
        """
        target = list(GTID.parse(gtid))
        c = self.client(w=w, j=j, timeout_s=timeout_s)
        try:
            if dry_run:
                return c._call({"op": "revertPlan", "target": target})["value"]
            r = c._call({"op": "revertTo", "target": target, **WriteConcern(w, j).fields()})
        finally:
            c.close()
        plan = r["value"]
        plan["gtid"] = None if r.get("gtid") is None else GTID(*r["gtid"])
        return plan

    def step_down(self) -> dict:
        """Hand the primary role over in a planned way: writes pause, the best
        eligible secondary catches up, then it is elected. Nothing is lost."""
        try:
            return _ray().get(self._coord.step_down.remote())
        except Exception as e:
            cause = getattr(e, "cause", None) or e
            raise errors.PrimaryUnavailable(f"step-down failed: {cause}") from None

    @classmethod
    def connect(cls, name: str) -> "ReplicaSet":
        ray = _ensure_ray()
        try:
            coord = ray.get_actor(f"{_check_name(name)}/coordinator", namespace=NAMESPACE)
        except ValueError:
            raise errors.ConfigError(f"no replica set named {name!r} is running on this "
                                     "Ray cluster") from None
        return cls(name, coord)

    def shutdown(self) -> None:
        """Stop every member (flushing LMDB) and the coordinator. Data stays on
        disk. A set already shut down: nothing to do."""
        ray = _ray()
        try:
            cfg = self.config()
        except errors.ConfigError:  # its coordinator was stopped: shut down already
            return
        try:
            ray.get(self._coord.stop.remote(), timeout=10)  # no elections while stopping
        except Exception:
            pass
        everything = []
        # downstream roles first, so nothing writes while the shards flush and close
        # (roles, whether they have a polite shutdown)
        for roles, polite in ((("producer", "applier"), True), (("",), True)):
            handles = []
            for m in cfg["members"]:
                for role in roles:
                    try:
                        handles.append(ray.get_actor(m["actor"] + (f"/{role}" if role else ""),
                                                     namespace=NAMESPACE))
                    except ValueError:
                        pass
            if polite:
                try:
                    ray.get([h.shutdown.remote() for h in handles], timeout=30)
                except Exception:
                    pass
            everything += handles
        for h in everything + [self._coord]:
            try:
                ray.kill(h, no_restart=True)
            except Exception:
                pass
        _wait_dead(self._coord)

    # --- use -------------------------------------------------------------
    def config(self) -> dict:
        """The set's configuration as the coordinator holds it (members, votes, cap)."""
        return _coordinator_read(self._coord, "config")

    def _topology(self) -> dict:
        return _coordinator_read(self._coord, "topology")

    def client(self, w: int | str = "majority", j: bool = False, wtimeout_ms: int | None = None,
               timeout_s: float = 30.0, read_preference: str | ReadPreference = "primary",
               read_concern: str | ReadConcern = "local") -> Client:
        rp = read_preference if isinstance(read_preference, ReadPreference) \
            else ReadPreference(read_preference)
        tls = self.config()["extra"].get("tls")
        return Client(self._topology, WriteConcern(w, j, wtimeout_ms), timeout_s, rp, self.status,
                      ReadConcern.of(read_concern), tls and client_context(tls.get("ca_file")))

    def status(self) -> dict:
        return _coordinator_read(self._coord, "status")

    def url(self, with_secret: bool = True) -> str:
        """A connection string for ``raymx.connect_url`` from any Python process
        (no Ray needed): ``raymx://:SECRET@host:port,.../NAME``. Without the
        secret, clients take it from ``RAYMX_SECRET`` or ``RAYMX_SECRET_FILE``."""
        from urllib.parse import quote
        topo = self._topology()
        hosts = ",".join(f"{m['host']}:{m['port']}" for m in topo["members"])
        cred = f":{quote(topo['secret'], safe='')}@" if with_secret else ""
        tls = self.config()["extra"].get("tls")
        q = "" if not tls else "?tls=true" + (f"&tlsCAFile={quote(tls['ca_file'], safe='')}"
                                              if tls.get("ca_file") else "")
        return f"raymx://{cred}{hosts}/{self.name}{q}"

    def mongodb_uri(self, with_secret: bool = True, driver: str = "any") -> str:
        """A connection string of the wire ports that pymongo, mongosh and
        other MongoDB drivers take as is; ``driver="pymongo"`` adds
        ``uuidRepresentation=standard`` (UUIDs as stored, binary subtype 4),
        an option the Node.js driver (mongosh's) refuses."""
        from raymx.wire import mongodb_uri
        return mongodb_uri(self.name, self._topology(), with_secret,
                           self.config()["extra"].get("tls"), driver)

    def member(self, member_id: int):
        return _ray().get_actor(f"{self.name}/m{member_id}", namespace=NAMESPACE)

    def _primary_member(self):
        for m in self._topology()["members"]:
            if m.get("role") == "primary":
                return self.member(m["id"])
        raise errors.PrimaryUnavailable("no primary is available")

    def oplog(self, after=None, limit: int | None = None, member: int | None = None
              ) -> Iterator[OplogEntry]:
        """Entries after ``after`` (a GTID or "term:seq"; None: from the oldest
        kept), in GTID order, at most ``limit`` (None: all). ``OplogTrimmed``
        (``info["oldest"]``) if the entries right after ``after`` were trimmed."""
        if limit is not None and (type(limit) is not int or limit < 0):
            raise errors.InvalidOperation(f"limit must be a non-negative int or None, got "
                                          f"{limit!r:.40}")
        try:
            pos = None if after is None else list(GTID.parse(after))
        except (ValueError, TypeError):
            raise errors.InvalidOperation(f"after must be a GTID, got {after!r:.60}") from None
        h = self._primary_member() if member is None else self.member(member)
        return oplog_entries(_ray(), h, pos, limit)


# how long a configuration change waits for lagging members by default
RECONFIG_TIMEOUT_S = 60.0


def connect(name: str) -> ReplicaSet:
    """Attach to a running replica set by name (from any driver on the cluster)."""
    return ReplicaSet.connect(name)


