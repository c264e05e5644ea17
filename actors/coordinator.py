"""The replica set's coordinator actor: configuration, topology and status.

It is restartable: its configuration comes in through its constructor (Ray
replays it on restart) and everything else is asked of the members.
"""
from __future__ import annotations

import time

import ray


@ray.remote(num_cpus=0, max_concurrency=8)
class Coordinator:
    def __init__(self, name: str, secret: str, members: list[dict]):
        self.name = name
        self.secret = secret
        self.members = members  # [{"id", "actor", "path", "node_id"}]
        self._addr: dict[int, dict] = {}

    def _handle(self, m):
        return ray.get_actor(m["actor"], namespace="raymx")

    def topology(self) -> dict:
        out = []
        for m in self.members:
            a = self._addr.get(m["id"])
            if a is None:
                try:
                    a = ray.get(self._handle(m).address.remote(), timeout=30)
                    self._addr[m["id"]] = a
                except Exception:
                    continue
            out.append(a)
        return {"secret": self.secret, "members": out}

    def forget_address(self, member_id: int) -> None:
        self._addr.pop(member_id, None)

    def config(self) -> dict:
        return {"name": self.name, "members": [dict(m) for m in self.members]}

    def status(self, timeout_s: float = 5.0) -> dict:
        refs = {}
        for m in self.members:
            try:
                refs[m["id"]] = self._handle(m).status.remote()
            except Exception:
                refs[m["id"]] = None
        members = []
        for m in self.members:
            ref = refs[m["id"]]
            try:
                s = ray.get(ref, timeout=timeout_s) if ref is not None else None
            except Exception as e:  # unreachable, restarting or dead
                s = None
                err = f"{type(e).__name__}"
            if s is None:
                s = {"id": m["id"], "role": "unknown", "state": "down",
                     "error": locals().get("err", "not found")}
            s["path"] = m["path"]
            if s["state"] != "down" and not m.get("primary"):
                try:
                    p = ray.get(ray.get_actor(m["actor"] + "/producer", namespace="raymx")
                                .status.remote(), timeout=timeout_s)
                    s["state"] = p["state"] if not p["paused"] else "paused"
                    if p["error"]:
                        s["error"] = p["error"]
                except Exception:
                    s["state"] = "down"
                    s["error"] = "producer unreachable"
            members.append(s)
        prim = next((s for s in members if s.get("role") == "primary"
                     and s["state"] != "down"), None)
        for s in members:
            if prim is None or s["state"] == "down" or s.get("applied") is None:
                s["lag"], s["lag_s"] = None, None
                continue
            s["lag"] = max(0, prim["last"][1] - s["applied"][1]) if prim.get("last") else 0
            behind = s["lag"] > 0 and prim.get("last_ts") and s.get("applied_ts")
            s["lag_s"] = max(0.0, (prim["last_ts"] - s["applied_ts"]) / 1000) if behind else 0.0
        return {"set": self.name, "time_ms": int(time.time() * 1000), "members": members}
