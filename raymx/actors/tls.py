"""TLS for a member's client-facing ports (ARCHITECTURE.md, "TLS").

One settings dict, given at launch (``ReplicaSet.launch(tls=...)``):
``{"cert_file": PEM chain, "key_file": PEM key, "ca_file": PEM CA (for
clients; optional)}``; the paths must be readable on every node that runs a
member (keys never travel through Ray). ``server_context`` is the one place
a server-side ``SSLContext`` is built from it: the client port uses it, and a
MongoDB-protocol port is meant to call it too.

``serve`` listens on a port that requires TLS: it looks at a new
connection's first bytes without consuming them (``MSG_PEEK``); a TLS
ClientHello gets the handshake, anything else (a driver without TLS) gets
one clear error frame in plain text and is closed, before it could send
anything else (its hello, with the secret, is refused unread).
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl

from raymx.storage.errors import ConfigError

log = logging.getLogger("raymx.server")

_KEYS = {"cert_file", "key_file", "ca_file"}


def check_settings(tls: dict | None) -> dict | None:
    """Validate launch settings (where they are given: the files must exist here)."""
    if tls is None:
        return None
    if not isinstance(tls, dict) or set(tls) - _KEYS or not tls.get("cert_file") \
            or not tls.get("key_file"):
        raise ConfigError("tls: a dict with cert_file and key_file (PEM paths) and optional "
                          f"ca_file, got {tls!r:.80}")
    out = {k: os.path.abspath(v) for k, v in tls.items() if v}
    for k, path in out.items():
        if not os.path.isfile(path):
            raise ConfigError(f"tls {k}: no file at {path}")
    return out


def server_context(tls: dict) -> ssl.SSLContext:
    """The server side's context for ``tls`` settings: TLS 1.2 or newer, the
    member's certificate chain and key."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.num_tickets = 0  # drivers do not resume sessions: no tickets after the handshake
    try:
        ctx.load_cert_chain(tls["cert_file"], tls["key_file"])
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"tls: cannot load the certificate {tls['cert_file']} and key "
                          f"{tls['key_file']}: {e}") from None
    return ctx


def client_context(ca_file: str | None = None) -> ssl.SSLContext:
    """A driver's context: the member's certificate must chain to ``ca_file``
    (default: the system's trusted CAs) and name the host connected to."""
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"tls: cannot load the CA file {ca_file}: {e}") from None


def looks_like_tls(head: bytes) -> bool:
    """A TLS handshake record (0x16, version 3.x). A plain client port frame
    starts with its 4-byte length: 0x16 there means a frame of over 350 MiB,
    which no port accepts."""
    return len(head) >= 2 and head[0] == 0x16 and head[1] == 0x03


class _Server:
    """A listening socket whose connections start TLS (``serve``); as much of
    ``asyncio.Server`` as ``ClientPort`` uses (``sockets``, ``close``)."""

    def __init__(self, loop, sock, ctx, factory, refuse_factory, timeout_s):
        self._loop, self._ctx, self._timeout_s = loop, ctx, timeout_s
        self._factory, self._refuse = factory, refuse_factory
        self.sockets = [sock]
        self._task = loop.create_task(self._accept(sock))

    async def _accept(self, lsock):
        while True:
            try:
                sock, _ = await self._loop.sock_accept(lsock)
            except asyncio.CancelledError:
                return
            except OSError as e:  # out of file descriptors: others leave meanwhile
                log.warning("accepting a client connection failed: %s", e)
                await asyncio.sleep(0.1)
                continue
            self._loop.create_task(self._start(sock))

    async def _start(self, sock):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            head = await asyncio.wait_for(self._peek(sock), self._timeout_s)
            if not head:
                sock.close()
            elif looks_like_tls(head):
                await self._loop.connect_accepted_socket(
                    self._factory, sock, ssl=self._ctx, ssl_handshake_timeout=self._timeout_s)
            else:
                await self._loop.connect_accepted_socket(self._refuse, sock)
        except (OSError, asyncio.TimeoutError, ssl.SSLError, ConnectionError) as e:
            log.debug("a client connection failed before its hello: %s", e)
            sock.close()

    async def _peek(self, sock) -> bytes:
        fd = sock.fileno()
        ready = self._loop.create_future()
        self._loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
        try:
            await ready
        finally:
            self._loop.remove_reader(fd)
        try:
            return sock.recv(5, socket.MSG_PEEK)
        except BlockingIOError:
            return await self._peek(sock)

    def close(self):
        self._task.cancel()
        for s in self.sockets:
            s.close()


async def serve(loop, host: str, ctx: ssl.SSLContext, factory, refuse_factory,
                timeout_s: float, backlog: int = 1024, port: int = 0) -> _Server:
    """Listen on ``host`` (``port``, 0: any free one) for connections that must
    use TLS: ``factory()`` serves those that do, ``refuse_factory()`` answers
    the others."""
    info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(info[0], socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(info[4])
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return _Server(loop, sock, ctx, factory, refuse_factory, timeout_s)
