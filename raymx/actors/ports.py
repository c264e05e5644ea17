"""The ports' share of the primary's write path (a mixin of ``ShardService``):
a port serving the service (the msgpack client port, the MongoDB wire port)
attaches to it, and the small writes and point reads that arrive on its loop
may then run right there, with no hand-off to the writer thread and back.
"""
from __future__ import annotations

import functools

from raymx.actors.statements import runs_on_port


class PortPath:
    """Needs the service's ``_ports`` (a tuple), ``_q`` (the writer thread's
    queue), ``_wlock`` (the writer's turn), ``limits``, ``port_writes`` and
    ``_run_safely``."""

    def attach_port(self, port) -> None:
        """Called by a port serving this service (one with ``on_loop()`` and
        ``soon(fn)``): small writes and point reads may then run on the port's
        own thread (see ``_drain`` and ``submit_read``)."""
        port.arrived = []
        self._ports = self._ports + (port,)

    def port_here(self):
        """The attached port whose loop is the calling thread, or None."""
        for port in self._ports:
            if port.on_loop():
                return port
        return None

    def _arriving(self) -> bool:
        return any(port.arrived for port in self._ports)

    def _to_writer(self, item: tuple) -> None:
        port = self.port_here()
        if port is not None:
            port.arrived.append(item)
            if len(port.arrived) == 1:  # once, after every frame this wake-up read
                port.soon(functools.partial(self._drain, port))
        else:
            self._q.put(item)

    def _drain(self, port) -> None:
        """The writes that arrived in one wake-up of the port (from every
        connection), on the port's thread. When the writer thread is idle with
        nothing queued, the small ones run right here, as one group (one LMDB
        commit, one sync for those that want it): no hand-off between threads
        on their way. The rest go to the writer thread, in arrival order."""
        items, port.arrived = port.arrived, []
        if self._wlock.acquire(blocking=False):
            try:
                if self._q.unfinished_tasks == 0:  # nothing queued could come after these
                    most = self.limits.port_insert_docs_max
                    n = next((i for i, it in enumerate(items) if not runs_on_port(it, most)),
                             len(items))
                    cap = self.limits.write_group_max
                    for i in range(0, n, cap):
                        self._run_safely(items[i:min(i + cap, n)])
                    self.port_writes += n
                    items = items[n:]
            finally:
                self._wlock.release()
        for item in items:
            self._q.put(item)
