"""The MongoDB wire port of a member: an asyncio server on its own thread.

Messages are parsed on the loop (``raymx.wire.framing``) and each command is
translated into the member's own requests (``ShardService.handle``, the same
path the msgpack client port takes) by ``raymx.wire.commands.Dispatcher``:
the commands drivers send most run on the loop, their requests answered back
onto it; the rest run on the port's thread pool, which waits for the
answers. One connection's commands run one after the other, in arrival
order, as MongoDB does; different connections run side by side.

Bad input gets what a MongoDB server answers (an error document with a
code); only a message that cannot be framed at all (a wrong length, an
unknown opcode) closes its connection.
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from raymx.actors.server import BusyPoll, bind_preferring, new_loop, serve_loop
from raymx.actors.tls import server_context
from raymx.wire import framing
from raymx.wire.auth import Credential
from raymx.wire.commands import Dispatcher

log = logging.getLogger("raymx.wire")

MESSAGE_BYTES_MAX = 48_000_000  # MongoDB's maxMessageSizeBytes
_LIGHT = frozenset(("hello", "ismaster", "ping", "saslstart", "saslcontinue", "buildinfo"))


class WirePort:
    """``WirePort(service, secret, host, info)``; ``.port`` once started.
    ``info``: ``{"member": id, "replset": name}``."""

    def __init__(self, service, secret: str, host: str, info: dict, port: int = 0,
                 workers: int = 64, tls: dict | None = None):
        self.service = service
        # TLS settings as the client port's (raymx.actors.tls): drivers connect
        # with tls=true and the set's CA; the handshake comes first
        self._ssl = None if tls is None else server_context(tls)
        self.host = host
        self.info = dict(info)
        self.port: int | None = None
        self.connections = 0
        self.credential = Credential(secret)
        self.dispatcher = Dispatcher(service, self)
        self._conn_ids = itertools.count(1)
        self._conns: set = set()
        # commands not written as steps wait for the member's answers on these
        # threads (one queued behind an open transaction holds one); hello and
        # the SASL steps have their own, so drivers' heartbeats never wait
        # behind writes
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="raymx-wire")
        self.hello_pool = ThreadPoolExecutor(4, thread_name_prefix="raymx-wire-hello")
        self._loop = new_loop()
        self.poll = BusyPoll(self._loop, service.limits.port_busy_poll_us)
        self._tid: int | None = None  # the loop's thread
        self._ready = threading.Event()
        self._t = threading.Thread(target=self._run, args=(port,), name="raymx-wire-port",
                                   daemon=True)
        self._t.start()
        if not self._ready.wait(10) or self.port is None:
            raise RuntimeError(f"MongoDB wire port failed to start on {host}")
        # small writes and point reads then run on this port's loop, as on the
        # client port's (ShardService._drain, submit_read)
        attach = getattr(service, "attach_port", None)
        if attach is not None:
            attach(self)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def on_loop(self) -> bool:
        """True on the port's own thread."""
        return threading.get_ident() == self._tid

    def soon(self, fn) -> None:
        """From the port's thread: run ``fn`` once this wake-up's frames are read."""
        self._loop.call_soon(fn)

    def _run(self, port: int) -> None:
        asyncio.set_event_loop(self._loop)
        self._tid = threading.get_ident()

        async def bind(port: int):
            return await self._loop.create_server(lambda: _WireConn(self), self.host, port,
                                                  ssl=self._ssl)

        async def start():
            self._server = await bind_preferring(bind, port,
                                                 f"the MongoDB wire port on {self.host}")
            self.port = self._server.sockets[0].getsockname()[1]
            self._ready.set()
        serve_loop(self._loop, start(), self._ready, f"the MongoDB wire port on {self.host}")

    def close(self) -> None:
        async def stop():
            self._server.close()
            for c in list(self._conns):
                c.transport.abort()
            await asyncio.sleep(0)
        if self.port is not None:
            try:
                asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5)
            except Exception:
                pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._t.join(5)
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.hello_pool.shutdown(wait=False, cancel_futures=True)


class _WireConn(asyncio.Protocol):
    """One driver connection: messages in, answers out, one command at a time."""

    def __init__(self, port: WirePort):
        self.port = port
        self.id = next(port._conn_ids)
        self.buf = bytearray()
        self.transport = None
        self.closing = False
        self.authed = False
        self.scram = None
        self.state: dict = {}  # the service's per-connection state (cursors, transactions)
        self.wire: dict = {}   # the dispatcher's (sessions, client metadata)
        self._queue: collections.deque = collections.deque()
        self._busy = False

    def connection_made(self, transport):
        self.transport = transport
        self.port._conns.add(self)
        self.port.connections += 1

    def connection_lost(self, exc):
        self.closing = True
        if self in self.port._conns:
            self.port._conns.discard(self)
            self.port.connections -= 1
            try:
                self.port.pool.submit(self.port.dispatcher.connection_closed, self)
            except RuntimeError:  # the pool is shut down: the member stops
                pass

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.port.poll.touch(self)
        buf = self.buf
        buf += data
        pos = 0
        try:
            while len(buf) - pos >= framing.HEADER_BYTES:
                length, rid, _, op = framing.parse_header(bytes(buf[pos:pos + 16]),
                                                          MESSAGE_BYTES_MAX)
                if len(buf) - pos < length:
                    break
                body = bytes(buf[pos + 16:pos + length])
                pos += length
                self._message(rid, op, body)
                if self.closing:
                    return
        except framing.WireError as e:
            log.info("wire connection %d closed: %s", self.id, e)
            self.closing = True
            self.transport.close()
        finally:
            if pos:
                del buf[:pos]

    def _message(self, rid: int, op: int, body: bytes) -> None:
        if op == framing.OP_MSG:
            try:
                flags, cmd = framing.parse_msg(body)
            except framing.WireError as e:  # framed, but not a command: answer it
                return self._enqueue(rid, framing.OP_MSG, 0, e)
            return self._enqueue(rid, framing.OP_MSG, flags, cmd)
        if op == framing.OP_QUERY:
            try:
                name, q = framing.parse_query(body)
            except framing.WireError as e:
                return self._enqueue(rid, framing.OP_QUERY, 0, e)
            if not name.endswith(".$cmd"):
                e = framing.WireError("OP_QUERY is only served for commands (legacy hello); "
                                      "use OP_MSG")
                return self._enqueue(rid, framing.OP_QUERY, 0, e)
            q.setdefault("$db", name[:-5])
            return self._enqueue(rid, framing.OP_QUERY, 0, q)
        raise framing.WireError(f"opcode {op} is not served (OP_MSG and the legacy "
                                "OP_QUERY hello are; compression is not offered)")

    def _enqueue(self, rid, op, flags, cmd) -> None:
        self._queue.append((rid, op, flags, cmd))
        if not self._busy:
            self._busy = True
            self._next()

    def _next(self) -> None:
        if not self._queue or self.closing:
            self._busy = False
            return
        item = self._queue.popleft()
        cmd = item[3]
        if isinstance(cmd, Exception):  # a message framed right that does not parse
            return self._done(item, {"ok": 0.0, "errmsg": str(cmd), "code": 9,
                                     "codeName": "FailedToParse"})
        pool = self.port.hello_pool if cmd and next(iter(cmd)).lower() in _LIGHT \
            else self.port.pool
        self.port.dispatcher.start(cmd, self, lambda doc: self._done(item, doc), pool)

    def _done(self, item, doc: dict) -> None:
        """On the loop: send a command's answer, then start the next one."""
        rid, op, flags, _ = item
        out = None
        if not flags & framing.MORE_TO_COME:  # moreToCome: the driver wants no answer
            build = framing.build_reply if op == framing.OP_QUERY else framing.build_msg
            try:
                out = build(0, rid, doc)
            except Exception as e:  # a value BSON cannot carry: say so, keep the connection
                out = build(0, rid, {"ok": 0.0, "code": 2, "codeName": "BadValue",
                                     "errmsg": f"the answer could not be encoded as BSON: {e}"})
            if len(out) > framing.MAX_MESSAGE_BYTES:  # the driver would drop the connection
                out = build(0, rid, {
                    "ok": 0.0, "code": 10334, "codeName": "BSONObjectTooLarge",
                    "errmsg": f"the answer is {len(out):,} bytes, over maxMessageSizeBytes "
                              f"({framing.MAX_MESSAGE_BYTES:,}): ask for less (a filter, a "
                              "projection, a smaller batchSize)"})
        if out is not None and not self.closing and not self.transport.is_closing():
            self.transport.write(out)
            self.port.poll.touch(self)
        # the next command after this wake-up's frames are read (an answer given
        # at once, an error, never recurses into the next command)
        self.port._loop.call_soon(self._next)
