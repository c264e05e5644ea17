"""A member that does no work, for the ceilings in bench/wire.py: the real
client port and MongoDB wire port over a service that answers every request
at once (an insert with its ids and a GTID, a find with nothing). What the
same client processes make against it is what any server could give them;
the ratio of the two drivers there is the best ratio the real member could
show."""
import types

from raymx.storage.limits import DEFAULT as LIMITS

SECRET = "noop-secret"


class NoWork:
    primary, handing_over, limits = True, False, LIMITS
    gm = types.SimpleNamespace(term=1)

    def __init__(self):
        self.seq = 0
        self.topo = {"members": [], "primary": 0}

    def handle(self, req, reply, conn):
        op = req.get("op")
        if op == "topology":
            return reply(ok=self.topo)
        if op == "insert":
            self.seq += 1
            n = len(req.get("packed") or req.get("docs") or ())
            return reply(ok={"inserted_ids": list(range(n)), "gtid": [1, self.seq]})
        if op == "find":
            return reply(ok={"docs": [], "cursor": 0})
        if op == "txnBegin":
            self.seq += 1
            return reply(ok={"txn": self.seq})
        reply(ok={"gtid": [1, self.seq]})

    def read_refusal(self):
        return None

    def topology_source(self):
        return self.topo

    def connection_closed(self, conn):
        pass


def serve(out, stop):
    """In a process of its own: start both ports, put (client port, wire port)
    on ``out``, serve until ``stop`` is set."""
    from raymx.actors.server import ClientPort
    from raymx.wire.server import WirePort
    svc = NoWork()
    cp = ClientPort(svc, SECRET, "127.0.0.1", LIMITS.frame_bytes_max,
                    {"member": 0, "replset": "noop"}, limits=LIMITS)
    wp = WirePort(svc, SECRET, "127.0.0.1", {"member": 0, "replset": "noop"})
    svc.topo = {"members": [{"id": 0, "host": "127.0.0.1", "port": cp.port, "role": "primary",
                             "state": "running", "wire": ["127.0.0.1", wp.port]}],
                "primary": 0}
    out.put((cp.port, wp.port))
    stop.wait()
    wp.close()
    cp.close()
