"""Ray shells for a member: thin wrappers that own processes and threads.

``OplogShard`` opens the member's LMDB folder, recovers, starts the shard
service (writer, group commit, readers) and the client port, and answers
control calls. ``GTIDManagerActor`` exposes the GTIDManager core to several
shards of one member; a one-shard member keeps the core in its shard process,
because a Ray call per commit (~1.3 ms) would cap the member at ~1,500
commits/s.
"""
from __future__ import annotations

import logging
import os
import threading

import ray

from raymx.actors.gtid_manager import GTIDManager
from raymx.actors.server import ClientPort
from raymx.actors.shard import ShardService, gtid_out
from raymx.storage import codec
from raymx.storage.engine import Engine
from raymx.storage.gtid import GTID
from raymx.storage.limits import Limits
from raymx.storage.lmdb_store import LMDBStore

log = logging.getLogger("raymx.member")


def open_member(path: str, limits: Limits) -> Engine:
    return Engine(LMDBStore(path, map_bytes=limits.map_bytes), limits)


@ray.remote(max_concurrency=16, concurrency_groups={"control": 4})
class OplogShard:
    def __init__(self, rs_name: str, member_id: int, path: str, secret: str,
                 limits: Limits, bind_host: str | None = None):
        self.rs_name, self.member_id, self.path, self.limits = rs_name, member_id, path, limits
        ctx = ray.get_runtime_context()
        self.node_id = ctx.get_node_id()
        self.restarted = ctx.was_current_actor_reconstructed
        fresh = not os.path.exists(os.path.join(path, "data.mdb"))
        self.engine = open_member(path, limits)
        self.engine.sync()  # whatever survived the crash is now durable: the recovered state
        if not fresh and self.engine.get_meta("member_id") not in (None, member_id):
            raise RuntimeError(f"{path} belongs to member {self.engine.get_meta('member_id')}, "
                               f"not {member_id}")
        self.engine.put_meta("member_id", member_id)
        self.engine.put_meta("replset", rs_name)
        # A (re)started primary comes back under a new term, recorded durably
        # before it accepts a write (DESIGN section 6).
        self.engine.set_term(self.engine.term + 1)
        self.service = ShardService(self.engine, limits, primary=True)
        host = bind_host or ray.util.get_node_ip_address()
        self.port = ClientPort(self.service, secret, host, limits.frame_bytes_max,
                               {"member": member_id, "replset": rs_name, "role": "primary"})
        log.info("member %s/%d serving on %s:%d term %d", rs_name, member_id, host,
                 self.port.port, self.engine.term)

    @ray.method(concurrency_group="control")
    def address(self) -> dict:
        return {"id": self.member_id, "host": self.port.host, "port": self.port.port,
                "role": "primary", "node_id": self.node_id}

    @ray.method(concurrency_group="control")
    def status(self) -> dict:
        s = self.service.status()
        r = self.engine.range()
        s.update({"id": self.member_id, "role": "primary", "state": "running",
                  "host": f"{self.port.host}:{self.port.port}", "pid": os.getpid(),
                  "applied": gtid_out(r.last_applied), "first": gtid_out(r.first),
                  "connections": self.port.connections, "restarted": self.restarted})
        return s

    @ray.method(concurrency_group="control")
    def oplog(self, after=None, limit: int = 1000) -> list[tuple[bytes, bytes]]:
        """Raw entries as stored (msgpack bytes); spilled ops are resolved."""
        out = []
        for g, e in self.engine.read_oplog(after=None if after is None else GTID(*after),
                                           limit=limit):
            out.append((g.to_bytes(), codec.pack(e)))
        return out

    def shutdown(self) -> None:
        self.port.close()
        self.service.close()
        self.engine.store.close()

    def pid(self) -> int:
        return os.getpid()


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
