"""The client port: msgpack frames over TCP, served from inside the member.

Frames are a 4-byte big-endian length and one msgpack map (see
ARCHITECTURE.md, "Client protocol"). The first frame must be ``hello`` with
the replica set's secret. Requests carry an ``id`` and may be pipelined; the
answers carry the same ``id`` and can come back in any order (a read does not
wait behind a durable write). A malformed, oversized or unauthenticated frame
gets an error frame and the connection is closed; the server keeps serving.
"""
from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import os
import secrets
import socket
import tempfile
import threading
import time

from raymx import errors
from raymx.actors import tls as tls_mod
from raymx.actors.admission import Admission, peer_address
from raymx.storage import codec
from raymx.storage.limits import DEFAULT as DEFAULT_LIMITS

log = logging.getLogger("raymx.server")


def new_loop() -> asyncio.AbstractEventLoop:
    """A port's event loop: uvloop's where it is installed (libuv in C: an
    echo server's CPU per request fell by a third with it, and the member's
    durable rate at 8 clients rose by a quarter; ARCHITECTURE.md, "Fewer
    instructions per request"), else asyncio's. ``RAYMX_ASYNCIO=1`` forces
    asyncio's."""
    if not os.environ.get("RAYMX_ASYNCIO"):
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


class BusyPoll:
    """Keeps a port's event loop polling instead of sleeping for ``window_s``
    after the port's last activity (``touch``: a frame read, an answer
    written), while that activity is one connection's.

    While it polls, a callback stays queued, so the loop's ``epoll`` does not
    wait; each turn gives the CPU to any other runnable task first
    (``sched_yield``, which also lets other threads take the GIL). The next
    request then finds the member's thread running: no wake-up from an idle
    CPU, which on a virtual machine (a halted vCPU, an exit to the host, cold
    caches) cost the member and its client tens of microseconds each, more
    than a point read itself (ARCHITECTURE.md, "Busy polling").

    It polls only while one connection is active: once a second one was
    active within the window, the loop sleeps between wake-ups again until a
    window passes with one connection only. A client's next request follows
    its answer, so polling catches it; several clients keep the loop busy
    anyway, and polling then only split their writes into smaller groups
    (more syncs) and took the CPU their processes need to send the next
    requests (measured: ARCHITECTURE.md, "Busy polling, one connection at a
    time"). A port with no traffic stops polling ``window_s`` after its last
    request; 0 turns it off. ``polled_s``: the time spent in stretches of
    polling, for status.
    """

    __slots__ = ("_loop", "window_s", "_until", "_since", "_conn", "_shared_until",
                 "turns", "polled_s")

    def __init__(self, loop, window_us: int):
        self._loop = loop
        self.window_s = window_us / 1e6
        self._until = 0.0
        self._since = None   # when the current stretch of polling began
        self._conn = None    # id() of the connection touched last
        self._shared_until = 0.0  # another connection was active: no polling until then
        self.turns = 0       # polling turns taken
        self.polled_s = 0.0  # in finished stretches

    def touch(self, conn=None) -> None:
        """On the loop's thread: the port did something for ``conn``; poll a
        while more, unless another connection was active within the window."""
        if self.window_s:
            now = time.monotonic()
            key = id(conn)
            if key != self._conn:
                if now < self._until:  # another connection was active within the window
                    self._shared_until = now + self.window_s
                self._conn = key
            self._until = now + self.window_s
            if self._since is None and now >= self._shared_until:
                self._since = now
                self._loop.call_soon(self._turn)

    def _turn(self) -> None:
        now = time.monotonic()
        if self._shared_until <= now < self._until:
            self.turns += 1
            os.sched_yield()
            self._loop.call_soon(self._turn)
        else:
            self.polled_s += now - self._since
            self._since = None


def serve_loop(loop, start, ready, what: str) -> None:
    """Run a port's event loop on this thread: ``start`` (a coroutine) binds
    and sets ``ready``; a port that cannot bind logs it and sets ``ready``
    (its ``port`` stays None)."""
    try:
        loop.run_until_complete(start)
    except Exception:
        log.exception("cannot bind %s", what)
        ready.set()
        return
    loop.run_forever()


async def bind_preferring(bind, port: int, what: str):
    """``await bind(port)``; if that port is taken, ``bind(0)`` (any free
    one), saying so. A restarted member asks for the ports it had, so the
    addresses clients were given (a MongoDB connection string above all) stay
    good across its restarts."""
    if port:
        try:
            return await bind(port)
        except OSError as e:
            log.warning("%s: port %d is taken (%s); another one is used, and clients "
                        "learn it from the set's topology", what, port, e)
    return await bind(0)


class ClientPort:
    """An asyncio server on its own thread; ``handler.handle(req, reply, conn)``.

    Per request the port costs one parse of the frames a ``recv`` brought (no
    coroutine per frame) and, per event-loop wake-up, one ``send`` per
    connection for every answer finished since the last one: answers from the
    writer, syncer and write-concern threads are queued and flushed together,
    so a group commit releasing 20 writers wakes the loop once, not 20 times.
    """

    def __init__(self, handler, secret: str, host: str, frame_bytes_max: int, info: dict,
                 unix: bool = True, limits=None, tls: dict | None = None, port: int = 0):
        """``limits``: the connection limits (``Limits``; default ``DEFAULT``).
        ``tls``: settings for ``raymx.actors.tls.server_context``; the TCP port
        then requires TLS (the Unix socket, owner-only on this machine, stays
        plain). ``port``: the TCP port to take if it is free (0: any)."""
        lim = limits or DEFAULT_LIMITS
        self.admission = Admission(lim.connections_max, lim.unauthenticated_per_address_max)
        self.tls = None if tls is None else tls_mod.server_context(tls)
        self.handler = handler
        self.secret = secret.encode()
        self.host = host
        self.frame_bytes_max = frame_bytes_max
        self.info = info  # sent in the hello answer (member id, role...)
        self.port: int | None = None
        # the same protocol on a Unix socket, for clients on this machine
        # (a loopback TCP round trip costs about twice the kernel time)
        self.unix_path: str | None = unix_socket_path(info) if unix else None
        self.connections = 0
        self._conns: set = set()
        self._out: list = []            # (connection, frame) answered, not yet sent
        self._out_lock = threading.Lock()
        self._flush_due = False         # a flush is scheduled on the loop
        self._loop = new_loop()
        self.poll = BusyPoll(self._loop, lim.port_busy_poll_us)
        self._tid: int | None = None  # the loop's thread
        self._ready = threading.Event()
        self._t = threading.Thread(target=self._run, args=(port,), name="raymx-port",
                                   daemon=True)
        self._t.start()
        if not self._ready.wait(10) or self.port is None:
            raise RuntimeError(f"client port failed to start on {host}")
        attach = getattr(handler, "attach_port", None)
        if attach is not None:
            attach(self)

    def _run(self, port: int):
        asyncio.set_event_loop(self._loop)
        self._tid = threading.get_ident()

        async def bind(port: int):
            if self.tls is None:
                return await self._loop.create_server(lambda: _Conn(self), self.host, port,
                                                      backlog=1024)
            return await tls_mod.serve(
                self._loop, self.host, self.tls, lambda: _Conn(self),
                lambda: _Conn(self, refuse=errors.TLSError(
                    f"member {self.info.get('member')}'s client port requires TLS: connect "
                    "with tls=True (and the CA of its certificate); nothing was read")),
                HELLO_TIMEOUT_S, port=port)

        async def start():
            self._server = await bind_preferring(bind, port, f"the client port on {self.host}")
            self.port = self._server.sockets[0].getsockname()[1]
            self._unix_server = None
            if self.unix_path is not None:
                try:
                    self._unix_server = await self._loop.create_unix_server(
                        lambda: _Conn(self), self.unix_path)
                    os.chmod(self.unix_path, 0o600)
                except OSError:
                    log.warning("no Unix socket at %s; clients use TCP", self.unix_path)
                    self.unix_path = None
            self._ready.set()
        serve_loop(self._loop, start(), self._ready, f"the client port on {self.host}")

    def on_loop(self) -> bool:
        """True on the port's own thread."""
        return threading.get_ident() == self._tid

    def soon(self, fn) -> None:
        """From the port's thread: run ``fn`` once this wake-up's frames are read."""
        self._loop.call_soon(fn)

    # answers from any thread: queued, sent by the loop in one flush per wake-up
    def post(self, conn: "_Conn", frame: bytes) -> None:
        if self.on_loop():  # answered on the port's thread: send now
            return conn.write(frame)
        with self._out_lock:
            self._out.append((conn, frame))
            if self._flush_due:
                return
            self._flush_due = True
        try:
            self._loop.call_soon_threadsafe(self._flush)
        except RuntimeError:  # the loop is closed: the port is shutting down
            pass

    def _flush(self) -> None:
        with self._out_lock:
            out, self._out = self._out, []
            self._flush_due = False
        if len(out) == 1:
            c, f = out[0]
            return c.write(f)
        by: dict = {}
        for c, f in out:
            by.setdefault(c, []).append(f)
        for c, fs in by.items():
            c.write(b"".join(fs))

    def close(self):
        async def stop():
            self._server.close()
            if self._unix_server is not None:
                self._unix_server.close()
            for c in list(self._conns):
                c.transport.abort()  # connection_lost runs for each, releasing its state
            await asyncio.sleep(0)
        if self.port is not None:
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._t.join(5)
        if self.unix_path is not None:
            try:
                os.unlink(self.unix_path)
            except OSError:
                pass


@functools.cache
def boot_id() -> str:
    """This kernel's boot id: a client with the same one can reach our Unix sockets."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def unix_socket_path(info: dict) -> str:
    """A fresh socket path in an owner-only folder (short: sun_path holds 107 bytes)."""
    d = os.path.join(tempfile.gettempdir(), f"raymx-{os.getuid()}")
    os.makedirs(d, mode=0o700, exist_ok=True)
    os.chmod(d, 0o700)
    _remove_dead_sockets(d)
    tag = "".join(ch for ch in str(info.get("replset", "")) if ch.isalnum())[:24]
    return os.path.join(d, f"{tag}-m{info.get('member', 0)}-{secrets.token_hex(4)}.sock")


def _remove_dead_sockets(d: str) -> None:
    """Sockets of members that were killed (no close ran): nobody listens there."""
    for name in os.listdir(d):
        path = os.path.join(d, name)
        if not name.endswith(".sock"):
            continue
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.setblocking(False)
            s.connect(path)
        except ConnectionRefusedError:
            try:
                os.unlink(path)
            except OSError:
                pass
        except OSError:
            pass  # listening but busy, or vanished meanwhile: leave it
        finally:
            s.close()


# Before its hello, a connection may send frames of at most HELLO_BYTES_MAX and
# must send the hello within HELLO_TIMEOUT_S: without the secret, nobody makes
# the member hold large buffers or idle connections.
HELLO_BYTES_MAX = 4096
HELLO_TIMEOUT_S = 10.0


class _Conn(asyncio.Protocol):
    """One client connection: frames in, answers out (matched by ``id``)."""

    def __init__(self, port: ClientPort, refuse: errors.RaymxError | None = None):
        self.port = port
        self.refuse = refuse  # answered at once, then closed (see connection_made)
        self.peer = None      # the peer's address while admitted (Admission)
        self.buf = bytearray()
        self.authed = False
        self.state: dict = {}  # per-connection state of the handler (cursors, sessions)
        self.transport = None
        self.closing = False
        self.hello_timer = None

    def connection_made(self, transport):
        self.transport = transport
        self.port._conns.add(self)
        self.port.connections += 1
        self.hello_timer = asyncio.get_running_loop().call_later(HELLO_TIMEOUT_S, self.no_hello)
        if self.refuse is None:
            self.refuse = self.port.admission.admit(peer_address(transport))
            if self.refuse is None:
                self.peer = peer_address(transport)
        if self.refuse is not None:  # over a limit, or plain text on a TLS port
            self.send_and_close({"id": None, "err": self.refuse.to_wire()})

    def no_hello(self):
        if not self.authed and not self.closing:
            self.send_and_close({"id": None, "err": errors.AuthenticationFailed(
                f"no hello within {HELLO_TIMEOUT_S:g} s").to_wire()})

    def connection_lost(self, exc):
        self.closing = True
        self.hello_timer.cancel()
        if self.peer is not None:
            self.port.admission.left(self.peer, self.authed)
            self.peer = None
        if self in self.port._conns:
            self.port._conns.discard(self)
            self.port.connections -= 1
            self.port.handler.connection_closed(self.state)

    # flow control: a client that does not read its answers stops being read
    def pause_writing(self):
        self.transport.pause_reading()

    def resume_writing(self):
        self.transport.resume_reading()

    def write(self, frame: bytes) -> None:
        """On the port's thread."""
        if not self.closing and not self.transport.is_closing():
            self.transport.write(frame)
            self.port.poll.touch(self)

    def send_and_close(self, obj) -> None:
        self.write(codec.pack_frame(obj))
        self.closing = True
        self.transport.close()  # after the buffered answer is written

    def reply_for(self, rid):
        post, most = self.port.post, self.port.frame_bytes_max

        def reply(ok=None, err=None):
            msg = {"id": rid, "err": err.to_wire()} if err is not None else {"id": rid, "ok": ok}
            try:
                frame = codec.pack_frame(msg)
            except Exception as e:  # a result msgpack cannot carry: say so
                frame = codec.pack_frame({"id": rid, "err": errors.RaymxError(
                    f"result could not be encoded: {e}").to_wire()})
            if len(frame) - codec.FRAME_HEADER_BYTES > most:  # the driver would drop the connection
                frame = codec.pack_frame({"id": rid, "err": errors.InvalidOperation(
                    f"the answer of {len(frame)} bytes exceeds the frame limit of {most}: ask "
                    "for less at once (a smaller batch, a projection, a limit)").to_wire()})
            post(self, frame)
        return reply

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.port.poll.touch(self)
        buf = self.buf
        buf += data
        pos = 0
        n_buf = len(buf)
        try:
            while n_buf - pos >= codec.FRAME_HEADER_BYTES:
                n = codec.frame_length(bytes(buf[pos:pos + 4]), self.port.frame_bytes_max
                                       if self.authed else HELLO_BYTES_MAX)
                if n_buf - pos - 4 < n:
                    break
                req = codec.unpack_frame(bytes(buf[pos + 4:pos + 4 + n]))
                pos += 4 + n
                self._request(req)
                if self.closing:
                    return
        except errors.ProtocolError as e:
            return self.send_and_close({"id": None, "err": e.to_wire()})
        finally:
            if pos:
                del buf[:pos]

    def _request(self, req: dict) -> None:
        rid = req.get("id")
        if not self.authed:
            sec = req.get("secret")
            if (req.get("op") != "hello" or not isinstance(sec, str)
                    or not hmac.compare_digest(sec.encode(), self.port.secret)):
                return self.send_and_close({"id": rid, "err": errors.AuthenticationFailed(
                    "the first frame must be hello with this replica set's secret").to_wire()})
            self.authed = True
            self.port.admission.authenticated(self.peer)
            self.hello_timer.cancel()
            return self.write(codec.pack_frame({"id": rid, "ok": dict(self.port.info)}))
        if not isinstance(req.get("op"), str):
            return self.send_and_close({"id": rid, "err": errors.ProtocolError(
                "a request needs a string 'op'").to_wire()})
        try:
            self.port.handler.handle(req, self.reply_for(rid), self.state)
        except errors.ProtocolError as e:  # the client ignores the protocol: cut it off
            self.send_and_close({"id": rid, "err": e.to_wire()})
        except errors.RaymxError as e:
            self.write(codec.pack_frame({"id": rid, "err": e.to_wire()}))
        except Exception as e:
            log.exception("handler failed")
            self.write(codec.pack_frame({"id": rid, "err": errors.RaymxError(
                f"internal error: {e}").to_wire()}))
