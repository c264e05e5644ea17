"""What ``rs.status()`` and ``rs.conf()`` read through the wire port
(``replSetGetStatus``, ``replSetGetConfig``): every configured member with
its state, health, last applied entry and sync source, from the set's
coordinator (a member outside a set lists what its topology knows), and the
set's configuration as the member stores it, in MongoDB's shapes; the
set's default read and write concerns (``getDefaultRWConcern``); and
``rs.stepDown()`` (``replSetStepDown``), the coordinator's planned hand-over.
"""
from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

from bson import Int64

from raymx.storage.gtid import GTID, ZERO
from raymx.wire import crud
from raymx.wire.errors import CommandError

if TYPE_CHECKING:
    from raymx.wire.commands import Dispatcher


_STATES = {"primary": (1, "PRIMARY"), "running": (2, "SECONDARY"), "paused": (2, "SECONDARY"),
           "recovering": (3, "RECOVERING"), "resync": (3, "RECOVERING"),
           "synchronizing": (5, "STARTUP2"), "down": (8, "(not reachable/healthy)")}


def _optime(g, ts_ms) -> dict:
    """A GTID and its entry's commit time as MongoDB's optime fields."""
    g = GTID(*g) if g else GTID(0, 0)
    date = datetime.datetime.fromtimestamp((ts_ms or 0) / 1000, datetime.timezone.utc)
    op = {"ts": crud.operation_time(g), "t": Int64(g.term)}
    return {"optime": op, "optimeDurable": op, "optimeDate": date, "optimeDurableDate": date,
            "lastAppliedWallTime": date, "lastDurableWallTime": date}


def last_write(svc) -> dict:
    """``hello``'s ``lastWrite``: the newest entry applied here and the
    newest majority-committed one known here (no later than it), as
    MongoDB's opTimes with their commit times. Drivers' ``maxStalenessSeconds``
    compares each secondary's ``lastWriteDate`` with the primary's (pymongo
    fails its server selection on a member without one)."""
    applied = svc.e.applied_point()
    maj = min(svc.majority_known or ZERO, applied)
    applied_ms, maj_ms = svc.e.commit_times(applied, maj)
    a, m = _optime(applied, applied_ms), _optime(maj, maj_ms)
    return {"opTime": a["optime"], "lastWriteDate": a["optimeDate"],
            "majorityOpTime": m["optime"], "majorityWriteDate": m["optimeDate"]}


def _learn_names(d: Dispatcher, members) -> dict[int, str]:
    """Remember each member's wire address as ``host:port`` (a member that
    is down keeps the name it had); all names known."""
    d.wire_names.update({m["id"]: f"{m['wire'][0]}:{m['wire'][1]}" for m in members
                         if m.get("wire")})
    d.wire_names[d.port.info.get("member", 0)] = d.port.address
    return d.wire_names


def _set_status(d: Dispatcher) -> dict | None:
    """The set's status from its coordinator (every member, with its last
    applied entry and lag), or None where there is none to ask."""
    try:
        return d.service.status_source()
    except Exception:  # no coordinator (a member outside a set), or it restarts
        return None


def get_status(d: Dispatcher, cmd: dict, conn):
    """``rs.status()``: every configured member with its state, health, last
    applied entry (``optime``, and ``optimeDate`` its commit time, from which
    mongosh's ``rs.printSecondaryReplicationInfo()`` shows each secondary's
    lag), and sync source, from the coordinator's status; raymx's own view
    (lag in entries and seconds, state) under ``raymx``. A member asked
    without a coordinator lists the members its topology knows."""
    svc, port = d.service, d.port
    topo = d.topology()
    names = _learn_names(d, topo.get("members", ()))
    st = yield crud.blocking(_set_status, d)
    members = []
    if st is not None:
        _learn_names(d, st["members"])
        for m in st["members"]:
            down = m.get("state") == "down"
            role = "primary" if m.get("role") == "primary" and not down else m.get("state")
            code, name = _STATES.get(role, (0, "STARTUP"))
            x = {"_id": m["id"], "name": names.get(m["id"], f"member {m['id']}"),
                 "health": 0.0 if down else 1.0, "state": code, "stateStr": name}
            if m.get("role") == "primary":
                x.update(_optime(m.get("last"), m.get("last_ts")))
            else:
                x.update(_optime(m.get("applied"), m.get("applied_ts")))
            src = m.get("sync_source")
            x["syncSourceHost"] = names.get(src, "") if src is not None else ""
            x["syncSourceId"] = src if src is not None else -1
            x["lastHeartbeatMessage"] = m.get("error") or "" if down else ""
            x["raymx"] = {"state": m.get("state"), "lag": m.get("lag"), "lag_s": m.get("lag_s")}
            members.append(x)
    else:
        for m in topo.get("members", ()):
            if not m.get("wire"):
                continue
            role = "primary" if m.get("role") == "primary" else m.get("state", "running")
            code, name = _STATES.get(role, (0, "STARTUP"))
            members.append({"_id": m["id"], "name": names[m["id"]], "health": 1.0,
                            "state": code, "stateStr": name})
    for x in members:
        if x["_id"] == port.info.get("member"):
            x["self"] = True
    if not any(x.get("self") for x in members):  # alone: itself, as its own answer
        info = svc.e.oplog_info()
        code, name = _STATES["primary" if svc.primary else "running"]
        members.append({"_id": port.info.get("member", 0), "name": port.address,
                        "health": 1.0, "state": code, "stateStr": name, "self": True,
                        "syncSourceHost": "", "syncSourceId": -1,
                        **_optime(info["last"], info["last_ts"])})
    writable = bool(svc.primary and not svc.handing_over)
    my = 1 if writable else (2 if svc.read_refusal() is None else 3)
    return {"set": port.info.get("replset", "raymx"),
            "date": datetime.datetime.now(datetime.timezone.utc), "myState": my,
            "term": Int64(int(svc.gm.term)), "heartbeatIntervalMillis":
                Int64(svc.limits.heartbeat_interval_ms), "members": members}


def get_config(d: Dispatcher, cmd: dict, conn) -> dict:
    """``rs.conf()``: the set's configuration as this member stores it."""
    svc, port = d.service, d.port
    cfg = svc.e.get_meta("rs_config") or {}
    names = _learn_names(d, d.topology().get("members", ()))
    specs = cfg.get("members") or [{"id": port.info.get("member", 0)}]
    members = [{"_id": m["id"], "host": names.get(m["id"], f"member {m['id']}"),
                "arbiterOnly": False, "buildIndexes": True, "hidden": bool(m.get("hidden")),
                "priority": float(m.get("priority", 1)), "tags": {},
                "secondaryDelaySecs": Int64(int(m.get("delay_s") or 0)),
                "votes": int(m.get("votes", 1))} for m in specs]
    lim = svc.limits
    return {"config": {
        "_id": port.info.get("replset", "raymx"), "version": int(cfg.get("version", 1)),
        "term": int(svc.gm.term), "protocolVersion": Int64(1),
        "writeConcernMajorityJournalDefault": True, "members": members,
        "settings": {"chainingAllowed": True,
                     "heartbeatIntervalMillis": lim.heartbeat_interval_ms,
                     "electionTimeoutMillis": lim.heartbeat_timeout_ms}}}


def get_default_rw_concern(d: Dispatcher, cmd: dict, conn) -> dict:
    """``getDefaultRWConcern``: MongoDB's implicit defaults, which the port
    applies (``crud.DEFAULT_W``; reads at ``local``). They are fixed here:
    ``setDefaultRWConcern`` is not served."""
    return {"defaultReadConcern": {"level": "local"},
            "defaultWriteConcern": {"w": crud.DEFAULT_W, "wtimeout": 0},
            "defaultReadConcernSource": "implicit", "defaultWriteConcernSource": "implicit",
            "localUpdateWallClockTime": datetime.datetime.now(datetime.timezone.utc)}


def _seconds(cmd: dict, key: str, default: float) -> float:
    v = cmd.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
        raise CommandError(f"{key} must be a non-negative number, not {v!r}", 2, "BadValue")
    return float(v)


def step_down(d: Dispatcher, cmd: dict, conn):
    """``rs.stepDown()``: on the primary, the set's planned hand-over (writes
    pause, the most advanced eligible secondary catches up within
    ``secondaryCatchUpPeriodSecs``, default 10 s, and is elected; nothing
    acknowledged is lost). The old primary is not elected again meanwhile: the
    new one is, at once. ``force`` is accepted; nothing is handed over
    without a secondary that caught up."""
    if cmd.get("$db", "admin") != "admin":
        raise CommandError("replSetStepDown may only be run against the admin database.",
                           13, "Unauthorized")
    secs = _seconds(cmd, "replSetStepDown", 60)
    catch_up = _seconds(cmd, "secondaryCatchUpPeriodSecs", min(10.0, secs))
    if catch_up > secs:
        raise CommandError("stepdown period must be longer than secondaryCatchUpPeriodSecs",
                           2, "BadValue")
    if d.service.step_down_source is None:
        raise CommandError("this member is not in a replica set: nothing to step down", 76,
                           "NoReplicationEnabled")
    if not d.service.primary:
        raise CommandError("not primary so can't step down", 10107, "NotWritablePrimary")
    try:
        yield crud.blocking(d.service.step_down_source, max(catch_up, 1.0))
    except Exception as e:
        cause = getattr(e, "cause", None) or e
        raise CommandError(f"No electable secondaries caught up as of the step-down: "
                           f"{cause}", 262, "ExceededTimeLimit") from None
    return {}
