"""The election coordinator actor: heartbeats, failover, topology and status.

One per replica set, named, restarted by Ray if it dies. Its configuration
comes in through its constructor (Ray replays it on restart) and everything
else, terms included, it rebuilds from the members' heartbeats: the members
hold the durable terms. The decisions are ``ElectionCore``'s; this shell only
sends heartbeats on a timer and carries the actions out.
"""
from __future__ import annotations

import logging
import re
import socket
import threading
import time

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, ActorUnschedulableError

from raymx import errors
from raymx.actors import logbook, metrics
from raymx.actors.core.election import (Action, ElectionCore, candidates, change_blockers,
                                        check_config_change, edit_config, keeps_primary,
                                        next_join)
from raymx.storage.gtid import GTID

log = logging.getLogger("raymx.coordinator")


# a planned step-down lets the writes the primary accepted finish this long at most
HAND_OVER_S = 5.0
# a restarted coordinator that is not settled asks the set's member actors it
# does not hold for their configuration this often (``_rediscover``)
REDISCOVER_S = 5.0


def _now_ms() -> int:
    return int(time.time() * 1000)


def _newest_config(actors: list[str], wait_s: float) -> dict | None:
    """The newest configuration the member actors named ``actors`` hold,
    each asked for at most ``wait_s``; None if none answered."""
    best = None
    for actor in actors:
        try:
            c = ray.get(ray.get_actor(actor, namespace="raymx").get_config.remote(),
                        timeout=wait_s)
        except Exception:
            continue
        if c is not None and (best is None or c["version"] > best["version"]):
            best = c
    return best


def _member_actors(name: str) -> list[str]:
    """The names of the set's member actors (``<set>/m<id>``) alive or being
    restarted in Ray, in id order."""
    pat = re.compile(re.escape(name) + r"/m(\d+)")
    found = []
    for a in ray.util.list_named_actors(all_namespaces=True):
        m = pat.fullmatch(a["name"]) if a.get("namespace") == "raymx" else None
        if m:
            found.append((int(m.group(1)), a["name"]))
    return [n for _, n in sorted(found)]


@ray.remote(num_cpus=0, max_concurrency=8)
class Coordinator:
    def __init__(self, name: str, secret: str, members: list[dict], limits, extra: dict):
        self.name = name
        logbook.install(name, "coordinator", "coordinator")
        self.extra = extra
        self.secret = secret
        self.members = members  # [{"id", "actor", "path", "node_id", "priority", ...}]
        self.limits = limits
        self.version = 1
        self.oplog_cap = extra.get("oplog_cap")
        # the id the next added member gets: above every id ever configured, so a
        # removed member's id (its folder, its actors' names, the positions and
        # votes others knew it by) is never another member's
        self.next_id = max(m["id"] for m in members) + 1
        restarted = self._load_newest_config()
        self.core = ElectionCore.from_specs(self.members, limits.heartbeat_timeout_ms)
        # restarted by Ray: what it found may be an older configuration than the
        # newest (members down or cut off): nothing is decided until members
        # answer (ElectionCore.config_standing)
        self.core.settled = not restarted
        self._rediscover_at = time.monotonic() + REDISCOVER_S
        self._addr: dict[int, dict] = {}
        # member id -> the last wire address it had: rs.status() names a member
        # that is down by it, as MongoDB names a member by its configured host
        self._last_wire: dict[int, list] = {}
        self._handles: dict[int, object] = {}
        self._inflight: dict[int, object] = {}
        self._pushing: dict[int, object] = {}  # configuration pushes to members behind
        self._ports: dict[int, tuple] = {}  # each member's client port, from its heartbeats
        self._lock = threading.RLock()
        self._reconfig_lock = threading.Lock()  # one configuration change at a time
        self._join_start: dict[int, dict] = {}  # a joining member's start point (see change)
        self._stop = threading.Event()
        self.failed_at_ms: int | None = None
        self.last_election: dict | None = None
        self._t = threading.Thread(target=self._loop, name="raymx-heartbeats", daemon=True)
        self._t.start()
        self._metrics = metrics.Publisher(name, metrics.SERIES)
        metrics.run_every(metrics.PERIOD_S, self._publish_metrics, self._stop, "set")

    def _publish_metrics(self) -> None:
        """Each member's figures, its lag behind the primary, whether it is up
        and the elections it won, from one status round."""
        st = self.status(timeout_s=metrics.PERIOD_S)
        won: dict[int, int] = {}
        for e in self.core.log:
            if e[0] == "elected":
                won[e[1]] = won.get(e[1], 0) + 1
        for m in st["members"]:
            up = m["state"] != "down"
            self._metrics.publish(m["id"], dict(
                metrics.member_values(m) if up else {}, lag_entries=m.get("lag"),
                lag_seconds=m.get("lag_s"), up=int(up), elections=won.get(m["id"], 0)))

    def _load_newest_config(self) -> bool:
        """After a restart: the members hold the newest configuration durably.
        At launch the members start beside this process, so it waits for each
        (a member that fails to start fails the launch, which then kills this
        actor too); restarted by Ray, it asks each for 5 s (one may be gone).
        Ray restarts this actor with its launch's member list, so a restarted
        one also asks every member actor of the set that Ray knows by name:
        members added since (after a rolling replacement, none of the launch's
        may be left)."""
        restarted = ray.get_runtime_context().was_current_actor_reconstructed
        actors = [m["actor"] for m in self.members]
        if restarted:
            actors += [a for a in _member_actors(self.name) if a not in actors]
        best = _newest_config(actors, 5 if restarted else 120)
        if best is not None:
            self._take_config(best)
        return restarted

    def _rediscover(self) -> None:
        """Lock held, while not settled: the set's member actors this
        coordinator does not hold (added since the configuration it took;
        after a rolling replacement its members may all be gone) are asked for
        theirs again, every REDISCOVER_S, as at its restart."""
        now = time.monotonic()
        if now < self._rediscover_at:
            return
        self._rediscover_at = now + REDISCOVER_S
        known = {m["actor"] for m in self.members}
        best = _newest_config([a for a in _member_actors(self.name) if a not in known], 1)
        if best is not None and best["version"] > self.version:
            self._adopt_config(best, "a member it did not hold")

    def _take_config(self, cfg: dict) -> None:
        """A configuration a member recorded becomes this coordinator's."""
        # the stored members, on the nodes this launch placed them on: a
        # relaunch on a new Ray cluster (a new session, or the machine
        # rebooted) has new node ids, and the stored ones name nodes that
        # are gone (restarting such a member would be unschedulable)
        placed = {m["id"]: m.get("node_id") for m in self.members}
        self.members = [dict(m, node_id=placed.get(m["id"]) or m.get("node_id"))
                        for m in cfg["members"]]
        self.version = cfg["version"]
        self.oplog_cap = cfg.get("oplog_cap") or self.oplog_cap
        self.next_id = max(self.next_id, cfg.get("next_id", 0),
                           max(m["id"] for m in self.members) + 1)

    def _standing(self) -> bool:
        """Lock held, after a heartbeat round: may this coordinator decide on
        its configuration? A member reporting a newer one gives it its own
        (``ElectionCore.config_standing``), and it decides nothing this round;
        while it is not settled it also asks the members it does not hold
        (``_rediscover``)."""
        mid = self.core.config_standing(self.version, self.members)
        if mid is None:
            if not self.core.settled:
                self._rediscover()
            return self.core.settled
        try:
            cfg = ray.get(self._handle(mid).get_config.remote(), timeout=5)
        except Exception:
            return False  # asked again next round
        if cfg is not None and cfg["version"] > self.version:
            self._adopt_config(cfg, f"member {mid}")
        return False

    def _adopt_config(self, cfg: dict, held_by: str) -> None:
        log.warning("replica set %s: %s holds configuration %d, newer than this "
                    "coordinator's %d (it restarted and found an older one): taken",
                    self.name, held_by, cfg["version"], self.version)
        self._take_config(cfg)
        self._forget_unconfigured()
        self.core.reconfigure(self.members)

    def _config(self) -> dict:
        return {"version": self.version, "members": [dict(m) for m in self.members],
                "oplog_cap": self.oplog_cap, "next_id": self.next_id}

    def _push_config(self) -> dict:
        cfg = self._config()
        refs = {}
        for m in self.members:
            try:
                refs[m["id"]] = self._handle(m["id"]).set_config.remote(cfg)
            except Exception:
                pass
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=30)
        for mid, ref in refs.items():
            if ref in ready:
                try:
                    ray.get(ref)
                    self.core.members[mid].config_version = self.version  # recorded
                except Exception:
                    pass
        return cfg

    def set_oplog_cap(self, cap: dict) -> dict:
        """A new oplog cap for every member, kept in the configuration."""
        self._await_settled(time.monotonic() + 60, 60)
        with self._lock:
            self.version += 1
            self.oplog_cap = dict(cap)
            return self._push_config()

    def reconfigure(self, members: list[dict], timeout_s: float = 60.0) -> dict:
        """Install a new member list (ids kept); every member records it durably.

        A change of the voters (one added or removed at most, else ConfigError)
        waits until the current configuration is recorded by a majority of its
        voters, what was acknowledged before it (the primary's fence) is
        durable on a majority of its voters, and the majority-committed point
        on a majority of the new voters (``config_change_blockers``); after
        ``timeout_s`` it is refused with ConfigError saying what it waited for,
        and nothing changes. Changes run one at a time, each after the one
        before it."""
        return self.change(members=members, timeout_s=timeout_s)

    def change(self, put: dict | None = None, remove: int | None = None,
               members: list[dict] | None = None, timeout_s: float = 60.0) -> dict:
        """One configuration change, applied to the configuration current when
        its turn comes (so two callers' changes never undo each other): ``put``
        adds or replaces a member's spec, ``remove`` removes a secondary,
        ``members`` replaces the whole list. See ``reconfigure``. A removal
        also waits (within ``timeout_s``) until a majority of the voters that
        remain have recorded it: ``recorded`` in the answer says whether they
        have, and only then may the removed member stop."""
        with self._reconfig_lock:
            deadline = time.monotonic() + timeout_s
            self._await_settled(deadline, timeout_s)
            with self._lock:
                new = edit_config(self.members if members is None else members,
                                  self.core.primary, put, remove)
                votes_change = check_config_change(self.members, new)
            start: dict = {}  # primary -> the committed point when the change began
            while True:
                why = self._change_blockers(new, start) if votes_change else []
                if not why:
                    with self._lock:
                        keeps_primary(new, self.core.primary)  # elected meanwhile?
                        cfg = self._install(new)
                    if remove is not None:
                        cfg["recorded"] = self._await_recorded(deadline)
                    return cfg
                if time.monotonic() >= deadline:
                    raise errors.ConfigError(
                        f"configuration change refused after {timeout_s:g}s, nothing "
                        f"changed: {'; '.join(why)}", blockers=why)
                time.sleep(0.05)

    def _await_settled(self, deadline: float, timeout_s: float) -> None:
        """A restarted coordinator changes nothing until it knows its
        configuration is the newest (``ElectionCore.unsettled``); ConfigError
        at ``deadline``."""
        while True:
            with self._lock:
                why = self.core.unsettled(self.members)
            if not why:
                return
            if time.monotonic() >= deadline:
                raise errors.ConfigError(f"configuration change refused after {timeout_s:g}s, "
                                         f"nothing changed: {'; '.join(why)}", blockers=why)
            time.sleep(0.05)

    def _await_recorded(self, deadline: float) -> bool:
        """Until a majority of the voters of the configuration recorded it (the
        heartbeat loop pushes it to those behind); False if the deadline came
        first."""
        while True:
            with self._lock:
                if self.core.config_recorded(self.version, self.members):
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def _change_blockers(self, members: list[dict], start: dict) -> list[str]:
        """What a voter change waits for, from the primary's view of positions.
        The committed point waited for is the one when the change began
        (``start``, per primary), so a busy primary's newer writes never keep
        the change waiting."""
        with self._lock:
            old, version, prim = [dict(m) for m in self.members], self.version, self.core.primary
            recorded = self.core.config_committed(version, old)
            behind = [m["id"] for m in old if m["id"] not in recorded]
        self._push_to(behind)
        state = None
        if prim is not None:
            try:
                state = ray.get(self._handle(prim).commit_state.remote(), timeout=2)
            except Exception:
                state = None
        with self._lock:
            return change_blockers(self.core, version, old, members, start, state)

    def reserve_member_id(self) -> int:
        """The id of a member about to be added: never handed out twice (a
        restarted coordinator starts from the stored ``next_id``; an id handed
        out and never configured then may come again, and its folder, if any,
        is refused)."""
        self._await_settled(time.monotonic() + 60, 60)  # its next_id may be an old one
        with self._lock:
            self.next_id += 1
            return self.next_id - 1

    def _install(self, members: list[dict]) -> dict:
        self.version += 1
        self.members = members
        self.next_id = max([self.next_id] + [m["id"] + 1 for m in members])
        self._forget_unconfigured()
        self.core.reconfigure(members)
        return self._push_config()

    def _forget_unconfigured(self) -> None:
        ids = {m["id"] for m in self.members}
        self._handles = {k: v for k, v in self._handles.items() if k in ids}
        self._inflight = {k: v for k, v in self._inflight.items() if k in ids}

    def _push_to(self, ids: list[int]) -> None:
        """Send the configuration to members that have not recorded it (they
        were down, or the last push timed out); never waits for them."""
        cfg = None
        for mid in ids:
            ref = self._pushing.get(mid)
            if ref is not None and not ray.wait([ref], timeout=0)[0]:
                continue  # the previous push is still on its way
            cfg = cfg or self._config()
            try:
                self._pushing[mid] = self._handle(mid).set_config.remote(cfg)
            except Exception:
                self._pushing.pop(mid, None)

    # --- heartbeats and actions ------------------------------------------
    def _handle(self, mid: int):
        h = self._handles.get(mid)
        if h is None:
            m = next(x for x in self.members if x["id"] == mid)
            h = self._handles[mid] = ray.get_actor(m["actor"], namespace="raymx")
        return h

    def _beat(self) -> None:
        interval = self.limits.heartbeat_interval_ms / 1000
        alive = [v.id for v in self.core.members.values() if v.alive]
        for m in self.members:
            mid = m["id"]
            if mid in self._inflight:
                continue  # the previous heartbeat has not come back: no new one
            try:
                self._inflight[mid] = self._handle(mid).heartbeat.remote(self.core.term, alive)
            except Exception:
                self._handles.pop(mid, None)
                self.core.on_heartbeat(mid, None, _now_ms())
        refs = list(self._inflight.values())
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=interval) if refs else ([], [])
        ready = set(ready)
        now = _now_ms()
        for mid, ref in list(self._inflight.items()):
            if ref not in ready:
                if self._refused(mid):
                    # its process is gone (nothing listens on its port): down now,
                    # not after a heartbeat timeout or Ray's restart of it
                    del self._inflight[mid]
                    self._addr.pop(mid, None)
                    self.core.on_heartbeat(mid, None, now, dead=True)
                else:
                    self.core.on_heartbeat(mid, None, now)
                continue
            del self._inflight[mid]
            try:
                reply = ray.get(ref)
                if reply.get("port"):
                    self._ports[mid] = tuple(reply["port"])
                self.core.on_heartbeat(mid, reply, now)
            except (ActorDiedError, ActorUnschedulableError):
                self._handles.pop(mid, None)
                self._addr.pop(mid, None)
                self.core.on_heartbeat(mid, None, now, dead=True)
            except ActorUnavailableError:
                # its process died and Ray is restarting it: down now, not in a
                # heartbeat timeout (it comes back as a secondary)
                self._addr.pop(mid, None)
                self.core.on_heartbeat(mid, None, now, dead=True)
            except Exception:
                self._addr.pop(mid, None)  # restarting: its port will change
                self.core.on_heartbeat(mid, None, now)

    def _refused(self, mid: int) -> bool:
        """A member whose heartbeat is late: does its client port refuse
        connections (the process died; the kernel closed its socket)? A busy or
        unreachable member is not refused: the heartbeat timeout decides then."""
        addr = self._ports.get(mid)
        if addr is None:
            return False
        try:
            socket.create_connection(addr, timeout=0.05).close()
        except ConnectionRefusedError:
            self._ports.pop(mid, None)  # a restarted process listens elsewhere
            return True
        except OSError:
            pass
        return False

    def _act(self, a: Action) -> None:
        h = self._handle(a.member)
        try:
            if a.kind == "elect":
                t0 = _now_ms()
                if a.why == "disk_full":
                    log.warning("replica set %s: primary %s refuses writes for a full disk; "
                                "an election proposes member %d, which has room",
                                self.name, self.core.primary, a.member)
                winner = self._prepare(a)
                if winner is None:
                    self.core.on_failed(a)
                    return
                a = Action("elect", winner, a.term, why=a.why)
                method, args = self.core.call(a)
                ray.get(getattr(self._handle(winner), method).remote(*args), timeout=30)
                self.core.on_elected(a.member, a.term)
                self._addr.pop(a.member, None)
                done = _now_ms()
                self.last_election = {
                    "member": a.member, "term": a.term, "at_ms": done,
                    "took_ms": None if self.failed_at_ms is None else done - self.failed_at_ms,
                    "become_primary_ms": done - t0, "why": a.why or "election"}
                self.failed_at_ms = None
                log.warning("replica set %s: member %d elected primary, term %d",
                            self.name, a.member, a.term)
            else:
                method, args = self.core.call(a)
                ray.get(getattr(h, method).remote(*args), timeout=10)
        except Exception as e:
            log.warning("replica set %s: %s for member %d failed: %s", self.name, a.kind,
                        a.member, e)
            self.core.on_failed(a)

    def _prepare(self, a: Action) -> int | None:
        """Fence the election (``ElectionCore.fence``/``fenced``): the members
        record the new term durably and answer with their last GTID; the
        winner is chosen from those fresh answers only."""
        refs = {}
        for mid in self.core.fence(a):
            try:
                refs[mid] = self._handle(mid).heartbeat.remote(a.term)
            except Exception:
                pass
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs),
                            timeout=self.limits.heartbeat_timeout_ms / 1000) if refs else ([], [])
        answers = {}
        for mid, ref in refs.items():
            if ref in ready:
                try:
                    answers[mid] = ray.get(ref)
                except Exception:
                    pass
        return self.core.fenced(a, answers, _now_ms())

    def _loop(self) -> None:
        interval = self.limits.heartbeat_interval_ms / 1000
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                with self._lock:
                    had = self.core.primary
                    self._beat()
                    actions = self.core.tick(_now_ms()) if self._standing() else []
                    if had is not None and self.core.primary is None and self.failed_at_ms is None:
                        # the failure happened after the last heartbeat it answered
                        ev = self.core.log[-1] if self.core.log else None
                        seen = ev[3] if ev and ev[0] == "primary_failed" else None
                        self.failed_at_ms = seen if seen is not None else _now_ms()
                    for a in actions:
                        self._act(a)
                    if self.core.settled:  # (else it may be an old configuration)
                        self._push_to([v.id for v in self.core.members.values()
                                       if v.alive and v.config_version < self.version])
                    self._finish_joins()
            except Exception:
                log.exception("heartbeat round failed")
            time.sleep(max(0.0, interval - (time.monotonic() - t0)))

    def _finish_joins(self) -> None:
        """Members synchronizing from a snapshot (``joining`` in the configuration
        holds their real votes and priority) get them once caught up."""
        if not self._reconfig_lock.acquire(blocking=False):
            return  # an operator's change is under way: next round
        try:
            self._finish_one_join()
        finally:
            self._reconfig_lock.release()

    def _finish_one_join(self) -> None:
        """One configuration change per heartbeat round at most."""
        ready = next_join(self.core, self.members, self.limits.join_lag_entries)
        if ready is None:
            return
        mid, members = ready
        try:
            ray.get(self._handle(mid).set_synchronizing.remote(False), timeout=10)
        except Exception as e:
            log.warning("replica set %s: member %d could not leave synchronizing: %s",
                        self.name, mid, e)
            return
        if check_config_change(self.members, members):
            why = self._change_blockers(members, self._join_start.setdefault(mid, {}))
            if why:  # a new voter: try again next round (never block heartbeats)
                log.info("replica set %s: member %d waits to vote: %s", self.name, mid,
                         "; ".join(why))
                return
        self._join_start.pop(mid, None)
        self._install(members)
        got = next(x for x in members if x["id"] == mid)
        log.warning("replica set %s: member %d caught up; it now has %d vote(s), "
                    "priority %s", self.name, mid, got["votes"], got["priority"])

    # --- operator calls ----------------------------------------------------
    def step_down(self, timeout_s: float = 30) -> dict:
        """Planned hand-over: the primary stops writes, the best eligible secondary
        catches up with it, then is elected. No acknowledged write is lost."""
        with self._lock:
            old = self.core.primary
            if old is None:
                raise RuntimeError("there is no primary to step down")
            cands = [v for v in candidates(self.core.members.values())
                     if v.id != old and v.alive and v.eligible]
            if not cands:
                raise RuntimeError("no eligible secondary can take over")
            target = max(cands, key=lambda v: (v.last, v.priority, -v.id))
            t0 = _now_ms()
            ray.get(self._handle(old).step_down.remote(self.core.term, HAND_OVER_S),
                    timeout=HAND_OVER_S + 10)
            goal = GTID(*ray.get(self._handle(old).heartbeat.remote(self.core.term))["last"])
            ray.get(self._handle(target.id).follow.remote(self.core.term, old), timeout=10)
            deadline = time.monotonic() + timeout_s
            while True:
                r = ray.get(self._handle(target.id).heartbeat.remote(self.core.term), timeout=10)
                if GTID(*r["last"]) >= goal:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"member {target.id} did not catch up to {goal}")
                time.sleep(0.01)
            self.core.primary = None
            for a in self.core.step_down_to(target.id):
                self._act(a)
            if self.core.primary != target.id:
                raise RuntimeError(f"member {target.id} could not become primary")
            return {"old": old, "new": target.id, "term": self.core.term,
                    "took_ms": _now_ms() - t0}

    def stop(self) -> None:
        self._stop.set()
        self._t.join(5)

    def topology(self) -> dict:
        """Addresses and roles. Never waits long on a member that is restarting:
        drivers call this during elections and must not stall behind it."""
        missing = {}
        for m in self.members:
            v = self.core.members.get(m["id"])
            if v is not None and v.dead and not v.alive:
                continue  # its process died (Ray may be restarting it): never wait on it
            if m["id"] not in self._addr:
                try:
                    missing[m["id"]] = self._handle(m["id"]).address.remote()
                except Exception:  # killed or not started: not in the topology now
                    self._handles.pop(m["id"], None)
        if missing:
            refs = list(missing.values())
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0.3)
            for mid, ref in missing.items():
                if ref in ready:
                    try:
                        self._addr[mid] = ray.get(ref)
                        if self._addr[mid].get("wire"):
                            self._last_wire[mid] = self._addr[mid]["wire"]
                    except Exception:
                        pass
        out = []
        for m in self.members:
            a = self._addr.get(m["id"])
            if a is not None:
                v = self.core.members.get(m["id"])
                out.append(dict(a, role="primary" if m["id"] == self.core.primary
                                else "secondary", state=v.state if v else "unknown"))
        return {"secret": self.secret, "members": out, "term": self.core.term,
                "primary": self.core.primary}

    def config(self) -> dict:
        return {"name": self.name, "members": [dict(m) for m in self.members],
                "version": self.version, "oplog_cap": self.oplog_cap, "next_id": self.next_id,
                "settled": self.core.settled,
                "secret": self.secret, "limits": self.limits, "extra": self.extra}

    def logs(self) -> dict:
        return {"records": logbook.records()}

    def status(self, timeout_s: float = 5.0) -> dict:
        refs = {}
        members_cfg = list(self.members)  # a reconfiguration may replace the list meanwhile
        for m in members_cfg:
            try:
                refs[m["id"]] = self._handle(m["id"]).status.remote()
            except Exception:
                refs[m["id"]] = None
        members = []
        for m in members_cfg:
            ref, err = refs[m["id"]], "not found"
            try:
                s = ray.get(ref, timeout=timeout_s) if ref is not None else None
            except Exception as e:  # unreachable, restarting or dead
                s, err = None, type(e).__name__
            if s is None:
                s = {"id": m["id"], "role": "unknown", "state": "down", "error": err}
            s["path"] = m["path"]
            s["wire"] = self._last_wire.get(m["id"])
            if s["state"] != "down" and s.get("role") != "primary":
                try:
                    p = ray.get(ray.get_actor(m["actor"] + "/producer", namespace="raymx")
                                .status.remote(), timeout=timeout_s)
                    if s["state"] == "running":
                        s["state"] = "paused" if p["paused"] else p["state"]
                    s["sync_source"] = p["sync_source"]
                    s["rollbacks"] = p["rollbacks"]
                    s["last_rollback"] = p["last_rollback"]
                    if p["error"]:
                        s["error"] = p["error"]
                except Exception:
                    s["state"] = "down"
                    s["error"] = "producer unreachable"
            members.append(s)
        for s in members:  # members on one node all go when it does: say so
            node = s.get("node_id")
            s["shares_node"] = [x["id"] for x in members
                                if node and x is not s and x.get("node_id") == node] or None
        prim = next((s for s in members if s.get("role") == "primary"
                     and s["state"] != "down"), None)
        for s in members:
            if prim is None or s["state"] == "down" or s.get("applied") is None:
                s["lag"], s["lag_s"] = None, None
                continue
            s["lag"] = max(0, prim["last"][1] - s["applied"][1]) if prim.get("last") else 0
            if s["lag"] == 0:
                s["lag_s"] = 0.0
            elif prim.get("last_ts") and s.get("applied_ts"):
                s["lag_s"] = max(0.0, (prim["last_ts"] - s["applied_ts"]) / 1000)
            else:  # behind, since an unknown time (nothing applied yet): no staleness-bounded reads
                s["lag_s"] = None
        return {"set": self.name, "time_ms": _now_ms(), "term": self.core.term,
                "primary": self.core.primary, "last_election": self.last_election,
                "config_version": self.version, "unsettled": self.core.unsettled(self.members),
                "members": members}
