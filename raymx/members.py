"""Members of a replica set before they run: their specs (checked), where
their processes go (placement over Ray's nodes), how they start over their
folders (a backup adopted first), and the status table operators read.
``raymx.replset`` drives these; ``format_status`` and ``OplogEntry`` are
re-exported there. Also a running member's oplog read page by page.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Iterator

from raymx import errors
from raymx.actors.core.election import DISK_ROOM_BYTES
from raymx.storage import codec
from raymx.storage.gtid import GTID
from raymx.storage.limits import Limits

log = logging.getLogger("raymx.replset")
NAMESPACE = "raymx"  # the Ray namespace of every raymx actor


def _place(ray, specs: list[dict], node_ids, placement: str) -> list[str]:
    """The node of each member (see ``ReplicaSet.launch``)."""
    here = ray.get_runtime_context().get_node_id()
    if node_ids:
        return [node_ids[m["id"] % len(node_ids)] for m in specs]
    if placement == "pack":
        return [here] * len(specs)
    if placement != "spread":
        raise errors.ConfigError(f"placement must be 'spread' or 'pack', not {placement!r}")
    nodes, out, k = _alive_nodes(ray), [], 0
    for m in specs:
        if os.path.isdir(m["path"]) and os.listdir(m["path"]):
            out.append(here)  # its files are here: it runs where they are
            continue
        out.append(nodes[k % len(nodes)])
        k += 1
    if k > len(nodes):
        import warnings
        msg = (f"{k} new members over {len(nodes)} Ray node(s): some share a node, and "
               "losing that node loses all of them (status lists them)")
        warnings.warn(msg, stacklevel=3)
        log.warning(msg)
    return out


def _alive_nodes(ray) -> list[str]:
    """Alive Ray nodes, the driver's first."""
    here = ray.get_runtime_context().get_node_id()
    return [here] + sorted(n["NodeID"] for n in ray.nodes()
                           if n.get("Alive") and n["NodeID"] != here)


def _least_used_node(ray, members: list[dict]) -> str:
    used = {}
    for m in members:
        used[m.get("node_id")] = used.get(m.get("node_id"), 0) + 1
    return min(_alive_nodes(ray), key=lambda n: used.get(n, 0))


def _on_node(node_id: str):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)


def _move_aside(path: str, aside: str) -> None:
    if os.path.exists(path):
        os.rename(path, aside)


def _adopt_backup(backup: str, path: str, limits: Limits) -> None:
    """Copy a hot backup's files into a new member folder and make them joinable."""
    import shutil

    from raymx.storage import snapshot
    from raymx.storage.engine import Engine
    from raymx.storage.lmdb_store import LMDBStore
    src = os.path.abspath(backup)
    if not os.path.isfile(os.path.join(src, "data.mdb")):
        raise errors.ConfigError(f"{src} is not a raymx backup (no data.mdb): make one with "
                                 "rs.backup(member, folder)")
    os.makedirs(path, mode=0o700, exist_ok=True)
    shutil.copy2(os.path.join(src, "data.mdb"), os.path.join(path, "data.mdb"))
    e = Engine(LMDBStore(path, map_bytes=limits.map_bytes), limits)
    try:
        snapshot.adopt_copy(e)
    finally:
        e.store.close()


def _start_member(name: str, m: dict, secret: str, limits: Limits, votes: dict,
                  bind_host: str | None, oplog_cap: dict | None = None,
                  tls: dict | None = None) -> list:
    """Create a member's three co-located actors, pinned to the node of its files
    (the shard process also serves the feeder).

    Hard node affinity: a restarted actor comes back only on that node (a
    placement group or soft affinity would restart it elsewhere, without its
    data). Every member has a producer and an applier: roles change at elections.
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from raymx.actors.applier import Applier
    from raymx.actors.member import OplogShard
    from raymx.actors.process import actor_name
    from raymx.actors.producer import Producer
    opts = dict(namespace=NAMESPACE, lifetime="detached", max_restarts=-1, num_cpus=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=m["node_id"],
                                                                   soft=False))
    i, path = m["id"], m["path"]
    return [
        OplogShard.options(name=m["actor"], **opts).remote(name, m, path, secret, limits, votes,
                                                           bind_host, oplog_cap, tls),
        Producer.options(name=actor_name(name, i, "producer"), **opts).remote(name, i, path,
                                                                              limits),
        Applier.options(name=actor_name(name, i, "applier"), **opts).remote(name, i, path, limits,
                                                                            m["delay_s"]),
    ]


_SPEC_KEYS = {"priority", "votes", "hidden", "delay_s", "sync_source"}


def _one_spec(i: int, m) -> dict:
    """Validate one member spec; hidden and delayed members get priority 0."""
    if not isinstance(m, dict) or set(m) - _SPEC_KEYS:
        raise errors.ConfigError(f"member {i}: a dict with keys among {sorted(_SPEC_KEYS)}")
    s = {"id": i, "priority": m.get("priority", 1), "votes": m.get("votes", 1),
         "hidden": bool(m.get("hidden", False)), "delay_s": m.get("delay_s", 0),
         "sync_source": m.get("sync_source")}
    if not isinstance(s["priority"], (int, float)) or s["priority"] < 0:
        raise errors.ConfigError(f"member {i}: priority must be >= 0")
    if s["votes"] not in (0, 1):
        raise errors.ConfigError(f"member {i}: votes must be 0 or 1")
    if not isinstance(s["delay_s"], (int, float)) or s["delay_s"] < 0:
        raise errors.ConfigError(f"member {i}: delay_s must be >= 0")
    if s["hidden"] or s["delay_s"]:
        s["priority"] = 0  # hidden and delayed members never become primary
    return s


def _joining(spec: dict) -> dict:
    """A new member's spec while it catches up: no vote, priority 0, and what it
    asked for under ``joining`` (the coordinator gives it, and ends a snapshot
    member's synchronizing, once it caught up)."""
    return dict(spec, votes=0, priority=0,
                joining={"votes": spec["votes"], "priority": spec["priority"]})


def next_member_id(cfg: dict) -> int:
    """The id the next ``add_member`` takes (the coordinator hands it out:
    ``reserve_member_id``): above every id the set ever configured
    (``next_id``), so no member ever gets a removed one's."""
    return max([cfg.get("next_id", 0)] + [m["id"] + 1 for m in cfg["members"]])


def _check_cap(cap) -> dict:
    """Validate an oplog cap: ``max_bytes`` (int > 0 or None), ``max_age_s``
    (number > 0 or None), ``force`` (bool), ``archive`` (None, a location, or
    ``{"uri", "lag_s"}``: see ``ReplicaSet.set_archive``)."""
    if not isinstance(cap, dict) or set(cap) - {"max_bytes", "max_age_s", "force", "archive"}:
        raise errors.ConfigError(f"oplog cap {cap!r}: a dict with max_bytes, max_age_s, force, "
                                 "archive")
    mb, age = cap.get("max_bytes"), cap.get("max_age_s")
    if mb is not None and (not isinstance(mb, int) or isinstance(mb, bool) or mb <= 0):
        raise errors.ConfigError(f"oplog max_bytes must be a positive integer or None, got {mb!r}")
    if age is not None and (not isinstance(age, (int, float)) or isinstance(age, bool)
                            or age <= 0):
        raise errors.ConfigError(f"oplog max_age_s must be a positive number or None, got {age!r}")
    out = {"max_bytes": mb, "max_age_s": age, "force": bool(cap.get("force", False))}
    if cap.get("archive") is not None:
        out["archive"] = _check_archive(cap["archive"])
    return out


def _check_archive(a) -> dict:
    """An archive location: a folder path or a ``pyarrow.fs`` URI, and the
    most seconds a majority-committed entry waits before it is archived."""
    if isinstance(a, str):
        a = {"uri": a}
    if not isinstance(a, dict) or set(a) - {"uri", "lag_s"} or not isinstance(
            a.get("uri"), str) or not a["uri"]:
        raise errors.ConfigError(f"archive {a!r}: a folder or pyarrow.fs URI, or a dict with "
                                 "uri and lag_s")
    lag = a.get("lag_s", 1.0)
    if not isinstance(lag, (int, float)) or isinstance(lag, bool) or not 0 < lag <= 86400:
        raise errors.ConfigError(f"archive lag_s must be a number of seconds in (0, 86400], "
                                 f"got {lag!r}")
    uri = a["uri"] if "://" in a["uri"] else os.path.abspath(a["uri"])
    if "://" in uri:
        try:
            import pyarrow.fs as pafs
            pafs.FileSystem.from_uri(uri)
        except Exception as e:
            raise errors.ConfigError(f"archive {uri!r} is not a pyarrow.fs location: {e}") \
                from None
    return {"uri": uri, "lag_s": float(lag)}


def _member_specs(members) -> list[dict]:
    if isinstance(members, int) and not isinstance(members, bool):
        if members < 1:
            raise errors.ConfigError(f"members must be at least 1, got {members}")
        members = [{} for _ in range(members)]
    if not isinstance(members, (list, tuple)) or not members:
        raise errors.ConfigError("members must be a positive count or a list of member specs")
    specs = [_one_spec(i, m) for i, m in enumerate(members)]
    if not any(s["priority"] > 0 for s in specs):
        raise errors.ConfigError("no member can be primary (all have priority 0)")
    if sum(s["votes"] for s in specs) == 0:
        raise errors.ConfigError("at least one member must vote")
    for s in specs:
        src = s["sync_source"]
        if src is not None and (src not in range(len(specs)) or src == s["id"]):
            raise errors.ConfigError(f"member {s['id']}: sync_source {src!r} is not another member")
    _check_no_cycles(specs)
    return specs


def _check_no_cycles(specs):
    by = {s["id"]: s for s in specs}
    for s in specs:
        seen, cur = set(), s
        while cur["sync_source"] is not None:
            if cur["id"] in seen:
                raise errors.ConfigError(f"sync sources form a cycle through member {cur['id']}")
            seen.add(cur["id"])
            cur = by[cur["sync_source"]]


def format_status(st: dict) -> str:
    """The table ``raymx status`` prints."""
    cols = ("id", "role", "state", "term", "last", "durable", "applied", "lag", "lag_s",
            "source", "oplog_MiB", "first", "window_s", "host")
    rows = [cols]
    g = lambda x: "-" if x is None else f"{x[0]}:{x[1]}"  # noqa: E731
    notes = []
    for m in st["members"]:
        lag_s = m.get("lag_s")
        ol = m.get("oplog") or {}
        win = ol.get("window_s")
        state = m.get("state", "?")
        p = m.get("initial_sync")
        if p:  # a snapshot copy in progress: its phase and how much is loaded
            state += f" ({p['phase']} {100 * p['rows_done'] // max(p['rows'] or 1, 1)}%)"
        rows.append((str(m.get("id")), m.get("role", "?"), state,
                     str(m.get("term", "-")), g(m.get("last")), g(m.get("durable")),
                     g(m.get("applied")), "-" if m.get("lag") is None else str(m["lag"]),
                     "-" if lag_s is None else f"{lag_s:.3f}",
                     "-" if m.get("sync_source") is None else str(m["sync_source"]),
                     "-" if "bytes" not in ol else f"{ol['bytes'] / 2**20:.1f}",
                     g(ol.get("first")), "-" if win is None else f"{win:.0f}",
                     m.get("host", "-")))
        if m.get("shares_node") and m["id"] < min(m["shares_node"]):  # once per node
            ids = ", ".join(str(i) for i in sorted([m["id"]] + m["shares_node"]))
            notes.append(f"members {ids} share node {m['node_id'][:12]}: losing that node "
                         "loses all of them")
        if m.get("joining"):
            notes.append(f"member {m.get('id')} is joining: it gets {m['joining']['votes']} "
                         f"vote(s) and priority {m['joining']['priority']} once it has caught "
                         "up with the primary")
        if m.get("state") == "resync":
            notes.append(f"member {m.get('id')} needs a resync (its sync source no longer "
                         "holds its position, or it could not roll back): "
                         f"raymx resync {st['set']} {m.get('id')}")
        ar = ol.get("archive")
        if ar and ar.get("error"):
            notes.append(f"member {m.get('id')}: the oplog archive {ar['uri']} cannot be "
                         f"{'written' if m.get('role') == 'primary' else 'read'} "
                         f"({ar['error']}); trimming is held at what it holds "
                         f"({g(ar.get('through'))}): nothing is lost")
        elif ar and m.get("role") == "primary":
            notes.append(f"oplog archive {ar['uri']}: {g(ar.get('oldest'))} .. "
                         f"{g(ar.get('through'))} in {ar['segments']} segments")
        free = m.get("disk_free")
        if free is not None and free < DISK_ROOM_BYTES:
            notes.append(f"member {m.get('id')}: {free / 2**20:.1f} MiB free on its disk: writes "
                         "it cannot fit are refused (DiskFull) and a primary that refuses "
                         "them hands over to a member with room")
        if ol.get("over_cap"):
            cap = ol["cap"]["max_bytes"]
            notes.append(f"member {m.get('id')}: oplog {ol['bytes']:,} bytes is over its cap "
                         f"of {cap:,}; trimming held by {ol.get('held_by') or 'nothing (catching up)'}")
    for why in st.get("unsettled") or ():  # a restarted coordinator, waiting for members
        notes.append(f"no elections or changes yet: {why}")
    w = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    lines = [f"replica set {st['set']}"]
    lines += ["  ".join(c.ljust(w[i]) for i, c in enumerate(r)) for r in rows]
    return "\n".join(lines + notes)


@dataclass
class OplogEntry:
    gtid: GTID
    ts: int
    h: int
    ops: list


def oplog_entries(ray, member, pos: list | None, limit: int | None) -> Iterator[OplogEntry]:
    """A member's oplog entries after ``pos`` (at most ``limit``), in pages of
    1,000 (``OplogShard.oplog``); its errors (``OplogTrimmed``) as raised there."""
    from ray.exceptions import RayTaskError
    n = 0
    while limit is None or n < limit:
        page = 1000 if limit is None else min(1000, limit - n)
        try:
            rows = ray.get(member.oplog.remote(pos, page))
        except RayTaskError as e:
            if isinstance(e.cause, errors.RaymxError):
                raise e.cause from None
            raise
        for k, v in rows:
            e = codec.unpack(v, "oplog entry")
            yield OplogEntry(GTID.from_bytes(k), e["ts"], e["h"], e["ops"])
            n += 1
        if len(rows) < page:
            return
        pos = list(GTID.from_bytes(rows[-1][0]))
