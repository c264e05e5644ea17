"""Admission of client connections to a member's port (``Limits``
``connections_max`` and ``unauthenticated_per_address_max``). Runs on the
port's event loop thread only: no lock."""
from __future__ import annotations

import socket

from raymx.storage.errors import LimitExceeded


def peer_address(transport) -> str:
    """The peer's IP address; every Unix-socket peer is ``"unix"``."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family == socket.AF_UNIX:
        return "unix"
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, (tuple, list)) and peer else "unknown"


class Admission:
    def __init__(self, connections_max: int, unauthenticated_per_address_max: int):
        self.connections_max = connections_max
        self.unauth_max = unauthenticated_per_address_max
        self.open = 0
        self.unauthenticated: dict[str, int] = {}
        self.refused = 0

    def admit(self, addr: str) -> LimitExceeded | None:
        """A new connection from ``addr``: None if admitted (counted until
        ``left``), else the error to answer it with before closing it."""
        if self.open >= self.connections_max:
            self.refused += 1
            return LimitExceeded(
                f"the member has {self.open} client connections, the most allowed "
                f"(Limits.connections_max = {self.connections_max}): close idle ones or "
                "share connections between threads", limit="connections_max",
                max=self.connections_max)
        n = self.unauthenticated.get(addr, 0)
        if n >= self.unauth_max:
            self.refused += 1
            return LimitExceeded(
                f"{n} connections from {addr} have not sent their hello yet, the most "
                f"allowed (Limits.unauthenticated_per_address_max = {self.unauth_max})",
                limit="unauthenticated_per_address_max", max=self.unauth_max)
        self.open += 1
        self.unauthenticated[addr] = n + 1
        return None

    def _done_unauthenticated(self, addr: str) -> None:
        n = self.unauthenticated.get(addr, 0) - 1
        if n > 0:
            self.unauthenticated[addr] = n
        else:
            self.unauthenticated.pop(addr, None)

    def authenticated(self, addr: str) -> None:
        self._done_unauthenticated(addr)

    def left(self, addr: str, authenticated: bool) -> None:
        self.open -= 1
        if not authenticated:
            self._done_unauthenticated(addr)
