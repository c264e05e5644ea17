"""Launch, connect to, inspect and shut down a replica set."""
from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from typing import Iterator

from raymx import errors
from raymx.client import Client, WriteConcern  # noqa: F401
from raymx.storage import codec
from raymx.storage.gtid import GTID
from raymx.storage.limits import DEFAULT, Limits

NAMESPACE = "raymx"


def _ray():
    import ray
    return ray


def _ensure_ray():
    ray = _ray()
    if not ray.is_initialized():
        # Attaches to a running cluster (RAY_ADDRESS or a local one) or starts a local one.
        ray.init(namespace=NAMESPACE, log_to_driver=False)
    return ray


def _check_name(name) -> str:
    if not isinstance(name, str) or not name or len(name) > 64 or not all(
            c.isalnum() or c in "-_" for c in name):
        raise errors.ConfigError(f"replica set name {name!r}: 1-64 letters, digits, '-' or '_'")
    return name


@dataclass
class OplogEntry:
    gtid: GTID
    ts: int
    h: int
    ops: list


class ReplicaSet:
    """A handle on a running replica set (``launch`` or ``connect``)."""

    def __init__(self, name: str, coordinator):
        self.name = name
        self._coord = coordinator

    # --- life cycle ----------------------------------------------------
    @classmethod
    def launch(cls, name: str, members: int = 1, data_dir: str | None = None,
               limits: Limits | None = None, secret: str | None = None,
               bind_host: str | None = None) -> "ReplicaSet":
        """Start the members' actors on this node, pinned to it (their files live here).

        Restarting over an existing ``data_dir`` recovers every committed
        transaction and the oplog, under a new term.
        """
        _check_name(name)
        if not isinstance(members, int) or members < 1:
            raise errors.ConfigError(f"members must be a positive integer, got {members!r}")
        if members != 1:
            raise errors.ConfigError("this version runs single-member replica sets; "
                                     "multi-member replication is not built yet")
        limits = limits or DEFAULT
        ray = _ensure_ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from raymx.actors.coordinator import Coordinator
        from raymx.actors.member import OplogShard
        try:
            ray.get_actor(f"{name}/coordinator", namespace=NAMESPACE)
            raise errors.ConfigError(f"replica set {name!r} is already running: "
                                     f"use raymx.connect({name!r})")
        except ValueError:
            pass
        data_dir = os.path.abspath(data_dir or os.path.join("raymx-data", name))
        os.makedirs(data_dir, mode=0o700, exist_ok=True)
        secret = secret or secrets.token_urlsafe(32)
        node = ray.get_runtime_context().get_node_id()
        pin = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
        specs, handles = [], []
        for i in range(members):
            path = os.path.join(data_dir, f"m{i}")
            actor = f"{name}/m{i}"
            h = OplogShard.options(name=actor, namespace=NAMESPACE, lifetime="detached",
                                   max_restarts=-1, num_cpus=0, scheduling_strategy=pin
                                   ).remote(name, i, path, secret, limits, bind_host)
            handles.append(h)
            specs.append({"id": i, "actor": actor, "path": path, "node_id": node})
        try:
            ray.get([h.address.remote() for h in handles], timeout=120)
        except Exception:
            for h in handles:
                ray.kill(h)
            raise
        coord = Coordinator.options(name=f"{name}/coordinator", namespace=NAMESPACE,
                                    lifetime="detached", max_restarts=-1).remote(
            name, secret, specs)
        return cls(name, coord)

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
        """Stop every member (flushing LMDB) and the coordinator. Data stays on disk."""
        ray = _ray()
        cfg = ray.get(self._coord.config.remote())
        handles = []
        for m in cfg["members"]:
            try:
                handles.append(ray.get_actor(m["actor"], namespace=NAMESPACE))
            except ValueError:
                pass
        try:
            ray.get([h.shutdown.remote() for h in handles], timeout=30)
        except Exception:
            pass
        for h in handles + [self._coord]:
            try:
                ray.kill(h, no_restart=True)
            except Exception:
                pass

    # --- use -------------------------------------------------------------
    def _topology(self) -> dict:
        return _ray().get(self._coord.topology.remote())

    def client(self, w: int | str = 1, j: bool = False, wtimeout_ms: int | None = None,
               timeout_s: float = 30.0) -> Client:
        return Client(self._topology, WriteConcern(w, j, wtimeout_ms), timeout_s)

    def status(self) -> dict:
        return _ray().get(self._coord.status.remote())

    def member(self, member_id: int):
        return _ray().get_actor(f"{self.name}/m{member_id}", namespace=NAMESPACE)

    def _primary_member(self):
        for m in self._topology()["members"]:
            if m.get("role") == "primary":
                return self.member(m["id"])
        raise errors.PrimaryUnavailable("no primary is available")

    def oplog(self, after=None, limit: int | None = None, member: int | None = None
              ) -> Iterator[OplogEntry]:
        """Entries after ``after`` (a GTID or "term:seq"), in GTID order."""
        ray = _ray()
        h = self._primary_member() if member is None else self.member(member)
        pos = None if after is None else list(GTID.parse(after))
        n = 0
        while limit is None or n < limit:
            page = 1000 if limit is None else min(1000, limit - n)
            rows = ray.get(h.oplog.remote(pos, page))
            for k, v in rows:
                e = codec.unpack(v, "oplog entry")
                yield OplogEntry(GTID.from_bytes(k), e["ts"], e["h"], e["ops"])
                n += 1
            if len(rows) < page:
                return
            pos = list(GTID.from_bytes(rows[-1][0]))


def connect(name: str) -> ReplicaSet:
    """Attach to a running replica set by name (from any driver on the cluster)."""
    return ReplicaSet.connect(name)


def format_status(st: dict) -> str:
    """The table ``raymx status`` prints."""
    cols = ("id", "role", "state", "term", "last", "durable", "applied", "host")
    rows = [cols]
    g = lambda x: "-" if x is None else f"{x[0]}:{x[1]}"  # noqa: E731
    for m in st["members"]:
        rows.append((str(m.get("id")), m.get("role", "?"), m.get("state", "?"),
                     str(m.get("term", "-")), g(m.get("last")), g(m.get("durable")),
                     g(m.get("applied")), m.get("host", "-")))
    w = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    lines = [f"replica set {st['set']}"]
    lines += ["  ".join(c.ljust(w[i]) for i, c in enumerate(r)) for r in rows]
    return "\n".join(lines)
