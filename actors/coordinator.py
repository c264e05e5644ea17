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
            members.append(s)
        return {"set": self.name, "time_ms": int(time.time() * 1000), "members": members}
