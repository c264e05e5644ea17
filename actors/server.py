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
import hmac
import logging
import threading

from raymx import errors
from raymx.storage import codec

log = logging.getLogger("raymx.server")


class ClientPort:
    """An asyncio server on its own thread; ``handler.handle(req, reply, conn)``."""

    def __init__(self, handler, secret: str, host: str, frame_bytes_max: int, info: dict):
        self.handler = handler
        self.secret = secret.encode()
        self.host = host
        self.frame_bytes_max = frame_bytes_max
        self.info = info  # sent in the hello answer (member id, role...)
        self.port: int | None = None
        self.connections = 0
        self._tasks: dict = {}  # connection task -> its writer
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._t = threading.Thread(target=self._run, name="raymx-port", daemon=True)
        self._t.start()
        if not self._ready.wait(10) or self.port is None:
            raise RuntimeError(f"client port failed to start on {host}")

    def _run(self):
        asyncio.set_event_loop(self._loop)

        async def start():
            self._server = await asyncio.start_server(self._serve, self.host, 0,
                                                      limit=1 << 20)
            self.port = self._server.sockets[0].getsockname()[1]
            self._ready.set()
        try:
            self._loop.run_until_complete(start())
        except Exception:
            log.exception("cannot bind the client port on %s", self.host)
            self._ready.set()
            return
        self._loop.run_forever()

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter):
        self._tasks[asyncio.current_task()] = w
        self.connections += 1
        conn: dict = {}
        loop = asyncio.get_running_loop()
        authed = False

        def send(obj):
            if not w.is_closing():
                w.write(codec.pack_frame(obj))

        def reply_for(rid):
            def reply(ok=None, err=None):
                msg = {"id": rid, "err": err.to_wire()} if err is not None else {"id": rid, "ok": ok}
                try:
                    frame = codec.pack_frame(msg)
                except Exception as e:  # a result msgpack cannot carry: say so
                    frame = codec.pack_frame({"id": rid, "err": errors.RaymxError(
                        f"result could not be encoded: {e}").to_wire()})
                loop.call_soon_threadsafe(lambda: None if w.is_closing() else w.write(frame))
            return reply

        try:
            while True:
                try:
                    header = await r.readexactly(codec.FRAME_HEADER_BYTES)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                try:
                    n = codec.frame_length(header, self.frame_bytes_max)
                    body = await r.readexactly(n)
                    req = codec.unpack_frame(body)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                except errors.ProtocolError as e:
                    send({"id": None, "err": e.to_wire()})
                    return
                rid = req.get("id")
                if not authed:
                    sec = req.get("secret")
                    if (req.get("op") != "hello" or not isinstance(sec, str)
                            or not hmac.compare_digest(sec.encode(), self.secret)):
                        send({"id": rid, "err": errors.AuthenticationFailed(
                            "the first frame must be hello with this replica set's secret"
                        ).to_wire()})
                        return
                    authed = True
                    send({"id": rid, "ok": dict(self.info)})
                    continue
                if not isinstance(req.get("op"), str):
                    send({"id": rid, "err": errors.ProtocolError(
                        "a request needs a string 'op'").to_wire()})
                    return
                try:
                    self.handler.handle(req, reply_for(rid), conn)
                except errors.RaymxError as e:
                    send({"id": rid, "err": e.to_wire()})
                except Exception as e:
                    log.exception("handler failed")
                    send({"id": rid, "err": errors.RaymxError(f"internal error: {e}").to_wire()})
                await w.drain()
        finally:
            self.connections -= 1
            self._tasks.pop(asyncio.current_task(), None)
            try:
                self.handler.connection_closed(conn)
            finally:
                try:
                    await w.drain()
                    w.close()
                except (Exception, asyncio.CancelledError):
                    pass

    def close(self):
        async def stop():
            self._server.close()
            tasks = list(self._tasks)
            for w in self._tasks.values():
                w.transport.abort()  # the reads end with EOF, so each task ends cleanly
            await asyncio.wait(tasks, timeout=2) if tasks else None
        if self.port is not None:
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._t.join(5)
