"""One connection to a member: msgpack frames over a socket (a Unix socket on
the member's own machine, else TCP), shared by every thread of a client and
pipelined: each request carries an id and the answers are matched to it, so
many requests are in flight on one socket. The caller that waits reads the
answers itself (no reader thread unless Futures are used). Errors raised by
the member arrive as the same ``raymx.errors`` classes.
"""
from __future__ import annotations

import itertools
import select
import socket
import ssl
import struct
import threading
import time
from concurrent.futures import Future

from raymx import errors
from raymx.storage import codec
from raymx.storage.limits import DEFAULT as DEFAULT_LIMITS


_RECV_BYTES = 1 << 18  # one receive's buffer
_RECV_SLICE_MS = 50  # a receive waits at most this long (poll, then SO_RCVTIMEO)
_RECV_SLICE = struct.pack("ll", 0, _RECV_SLICE_MS * 1000)
_CANCEL_SEND_S = 5.0  # a cancel frame after a failed part gets this long to go


class _Wait:
    """The answer slot of one ``request`` (lighter than a Future)."""
    __slots__ = ("msg",)

    def __init__(self):
        self.msg = None  # the answer frame, or the exception that ended the connection


class Connection:
    """One connection to a member (TCP, or ``unix``: a socket path), shared by
    threads and pipelined.

    Answers are read by whoever waits for one: the first waiting caller reads
    the socket for everyone (matching answers to requests by id) until its own
    answer comes, then hands the socket to the next waiter. A single-threaded
    caller therefore costs one send and one receive per request, with no
    thread hand-off. ``submit`` (answers as Futures, possibly with callbacks
    and nobody waiting) starts a reader thread that owns receiving from then on.
    """

    def __init__(self, host: str, port: int, secret: str, timeout_s: float = 10.0,
                 frame_bytes_max: int = DEFAULT_LIMITS.frame_bytes_max, unix: str | None = None,
                 tls: ssl.SSLContext | None = None):
        """``tls``: a client ``SSLContext`` (``raymx.actors.tls.client_context``)
        for a member whose TCP port requires TLS; the secret is sent only after
        the handshake verified the member's certificate. A Unix socket (this
        machine, owner-only) stays plain."""
        self.addr = (host, port) if unix is None else unix
        self.frame_bytes_max = frame_bytes_max
        if unix is None:
            self._sock = socket.create_connection(self.addr, timeout=timeout_s)
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls is not None:
                self._sock = _TLSSocket(_tls_handshake(self._sock, tls, host, port))
        else:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._sock.settimeout(timeout_s)
            try:
                self._sock.connect(unix)
            except OSError:
                self._sock.close()
                raise
        # A receive or a send waits at most _RECV_SLICE (SO_RCVTIMEO,
        # SO_SNDTIMEO), then its caller looks at its deadline.
        if type(self._sock) is not _TLSSocket:
            self._sock.settimeout(None)
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _RECV_SLICE)
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _RECV_SLICE)
        # A member that hung up: a send on a Unix socket fails at once (EPIPE),
        # so only TCP needs the check before sending into an idle connection
        # (_check_idle polls _poll). Over a Unix socket a receive waits in
        # _poll first instead, not inside recv(): a thread asleep in recv() on
        # a Unix socket is also woken each time the member reads a request
        # from it (the kernel's write-space wake-up reaches every sleeper on
        # the socket; poll() asked for POLLIN only), a wake-up per request for
        # both ends (ARCHITECTURE.md, "The driver waits in poll()"). TCP wakes
        # no reader so, and a TLS socket polls in _TLSSocket already. Only the
        # thread owning the receive side polls (_reading), so never two at once.
        self._tcp = unix is None
        self._poll = select.poll()
        self._poll.register(self._sock, select.POLLIN)
        self._send_lock = threading.Lock()
        self._mu = threading.Lock()  # guards everything below; _cv waits on it
        self._cv = threading.Condition(self._mu)
        self._pending: dict[int, _Wait | Future] = {}
        self._reading = False   # a caller or the reader thread owns the receive side
        self._lead = 0          # the thread id of the caller reading (set by itself)
        self._waiting = 0       # callers waiting for the reading one to hand over
        self._reader: threading.Thread | None = None
        self._buf = bytearray()  # the start of a frame not yet complete
        self._rbuf = memoryview(bytearray(_RECV_BYTES))  # receives land here (no allocation)
        self._ids = itertools.count(1)
        self._closed: errors.RaymxError | None = None
        try:
            self.hello = self.request({"op": "hello", "secret": secret, "v": 1},
                                      timeout_s=timeout_s)
        except errors.ConnectionLost:
            why = self._closed  # the member refused the connection before the hello: say why
            self.close()
            if why is not None and not isinstance(why, errors.ConnectionLost):
                raise why from None
            raise
        except BaseException:
            self.close()
            raise

    def _send(self, req: dict, waiter, parts=None, deadline: float | None = None) -> int:
        rid = next(self._ids)
        self._check_idle()
        with self._mu:
            if self._closed is not None:
                raise errors.ConnectionLost(f"connection to {self.addr} is closed; the "
                                            "request was not sent", sent=False)
            self._pending[rid] = waiter
        try:
            if parts is not None:
                req = self._send_parts(req, rid, parts, deadline)
            self._send_frame(dict(req, id=rid), deadline)
        except BaseException:
            with self._mu:
                self._pending.pop(rid, None)
            raise
        return rid

    def _send_parts(self, req: dict, rid: int, parts: list, deadline: float | None) -> dict:
        """Send ``req`` in parts: each of ``parts`` is a function building the
        fields of one or more frames (a list of dicts), called when its turn
        comes. Every frame but the last goes now, marked ``more`` (the member
        holds them, unanswered, until the last); return ``req`` with the last.
        If building one fails, a ``cancel`` frame tells the member to drop what
        it holds of this request."""
        try:
            for build in parts[:-1]:
                for fields in build():
                    self._send_frame(dict(req, **fields, id=rid, more=True), deadline)
            *first, last = parts[-1]()
            for fields in first:
                self._send_frame(dict(req, **fields, id=rid, more=True), deadline)
            return dict(req, **last)
        except errors.ConnectionLost:
            raise
        except BaseException:
            try:
                self._send_frame(dict(req, packed=[], id=rid, cancel=True),
                                 time.monotonic() + _CANCEL_SEND_S)
            except errors.RaymxError:
                pass  # the connection is gone, and with it what the member held
            raise

    def _send_frame(self, obj: dict, deadline: float | None = None) -> None:
        """Send one frame whole, by ``deadline`` (``time.monotonic()``; None:
        no limit). Past it, ``TimeoutError`` if nothing of the frame went (the
        connection stays usable); if part of it went, the connection is closed
        (an incomplete frame is never executed) and ``ConnectionLost`` says the
        request was not sent."""
        try:
            frame = codec.pack_frame(obj)
        except Exception as e:
            raise errors.InvalidDocument(f"request cannot be encoded as msgpack: {e}") from None
        if len(frame) - 4 > self.frame_bytes_max:
            raise errors.DocumentTooLarge(
                f"request of {len(frame)} bytes exceeds the frame limit of {self.frame_bytes_max}"
                " (split it into smaller batches)")
        lock = self._send_lock
        if not lock.acquire(timeout=-1 if deadline is None else max(0.0, deadline - time.monotonic())):
            raise TimeoutError(f"could not send to {self.addr} in time: other requests' frames "
                               "held the connection; the request was not sent")
        sent, view = 0, memoryview(frame)
        try:
            while True:
                try:
                    sent += self._sock.send(view[sent:])
                except BlockingIOError:  # the member reads nothing (SO_SNDTIMEO slice)
                    pass
                if sent == len(frame):
                    return
                if deadline is not None and time.monotonic() >= deadline:
                    break
        except OSError as e:
            self._fail(errors.ConnectionLost(f"connection to {self.addr} lost: {e}"))
            raise errors.ConnectionLost(f"connection to {self.addr} lost ({e}); the request "
                                        "was not sent", sent=False) from None
        finally:
            lock.release()
        if not sent:
            raise TimeoutError(f"{self.addr} took nothing of the request in time (it does not "
                               "read); the request was not sent")
        self._fail(errors.ConnectionLost(f"connection to {self.addr} closed: a send timed out"))
        raise errors.ConnectionLost(f"{self.addr} took only {sent} of {len(frame)} bytes in "
                                    "time; the connection is closed and the request was not "
                                    "executed", sent=False)

    def cancel(self, rid: int, op: str) -> None:
        """Tell the member to drop request ``rid`` (its caller gave up): a
        ``cancel`` frame, best effort (a closed connection drops it anyway)."""
        try:
            self._send_frame({"id": rid, "op": op, "cancel": True},
                             time.monotonic() + _CANCEL_SEND_S)
        except (errors.RaymxError, TimeoutError):
            pass

    def _check_idle(self) -> None:
        """On an idle connection, notice a member that hung up (and drop answers
        to requests that timed out) before sending into it: a request sent into
        a dead connection would have an unknown outcome; this one was never sent.
        Over a Unix socket the send itself says so (EPIPE): no check needed."""
        if not self._tcp:
            return
        with self._mu:
            if self._reading or self._pending or self._closed is not None \
                    or not self._poll.poll(0):
                return
            self._reading = True
        try:
            self._receive()
        finally:
            with self._mu:
                self._reading = False
                if self._waiting:
                    self._cv.notify_all()

    def submit(self, req: dict) -> Future:
        """Send one request without waiting (pipelining); the Future holds the answer."""
        f: Future = Future()
        self._send(req, f)
        if self._reader is None:
            self._start_reader()
        return f

    def request(self, req: dict, timeout_s: float | None = None, parts=None):
        """Send one request and wait for its answer (``TimeoutError`` after
        ``timeout_s``). ``parts``: see ``_send_parts``."""
        w = _Wait()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        rid = self._send(req, w, parts, deadline)
        # a Future's callback runs on the thread reading (the reader thread, or
        # a caller reading for everyone): that thread reads its answer itself
        on_reader = self._lead == threading.get_ident() or (
            self._reader is not None and threading.current_thread() is self._reader)
        with self._mu:
            while w.msg is None and self._reading and not on_reader:
                self._waiting += 1
                try:
                    if deadline is None:
                        self._cv.wait()
                    elif not self._cv.wait(max(0.0, deadline - time.monotonic())) and \
                            w.msg is None and time.monotonic() >= deadline:
                        self._pending.pop(rid, None)
                        raise errors.RequestTimeout(f"no answer from {self.addr} in {timeout_s} s",
                                             request_id=rid)
                finally:
                    self._waiting -= 1
            lead = w.msg is None and not on_reader
            if lead:
                self._reading = True
                self._lead = threading.get_ident()
        if lead or on_reader:  # read for everyone until this answer is in
            try:
                while w.msg is None:
                    if deadline is not None and time.monotonic() >= deadline:
                        with self._mu:
                            self._pending.pop(rid, None)
                        raise errors.RequestTimeout(f"no answer from {self.addr} in {timeout_s} s",
                                             request_id=rid)
                    self._receive()
            finally:
                if lead:
                    with self._mu:
                        self._reading = False
                        self._lead = 0
                        if self._waiting:  # another caller waits: it reads next
                            self._cv.notify_all()
        msg = w.msg
        if isinstance(msg, BaseException):
            raise msg
        if "err" in msg:
            raise errors.from_wire(msg["err"])
        return msg.get("ok")

    def _start_reader(self) -> None:
        with self._mu:
            if self._reader is not None:
                return
            # a caller is reading: it hands over when its answer is in (or
            # another submit started the reader while this one waited)
            while self._reading and self._reader is None:
                self._waiting += 1
                try:
                    self._cv.wait()
                finally:
                    self._waiting -= 1
            if self._reader is not None:
                return
            self._reading = True  # for good: the reader thread receives from now on
            where = self.addr if isinstance(self.addr, str) else "%s:%s" % self.addr
            self._reader = threading.Thread(target=self._read_loop, daemon=True,
                                            name=f"raymx-conn-{where}")
        self._reader.start()

    def _read_loop(self):
        try:
            while self._closed is None:
                self._receive()
        except BaseException as e:  # a bug: every waiter hears of it, none waits for good
            self._fail(errors.ConnectionLost(f"connection to {self.addr}: the reader failed "
                                             f"({type(e).__name__}: {e})", sent=True))
            raise

    def _receive(self) -> None:
        """One ``recv`` (up to 256 KiB, into a buffer kept for it) and every
        complete frame it completes, each given to its waiter. A lost
        connection fails every waiter. Futures are completed last, once the
        buffers are settled: their callbacks may send and wait on this
        connection (reading it again, on this thread)."""
        done: list = []
        try:
            if not self._tcp and not self._poll.poll(_RECV_SLICE_MS):
                return  # nothing within the slice: the caller decides
            try:
                got = self._sock.recv_into(self._rbuf)
            except BlockingIOError:  # nothing within _RECV_SLICE: the caller decides
                return
            if not got:
                raise ConnectionError("closed by the member")
            joined = bool(self._buf)
            if joined:  # a frame started in an earlier receive
                self._buf += self._rbuf[:got]
                data = memoryview(self._buf)
            else:
                data = self._rbuf[:got]
            end, pos, woke = len(data), 0, False
            with data:
                while end - pos >= 4:
                    n = codec.frame_length(data[pos:pos + 4], self.frame_bytes_max)
                    if end - pos - 4 < n:
                        break
                    msg = codec.unpack_frame(data[pos + 4:pos + 4 + n])
                    pos += 4 + n
                    woke |= self._dispatch(msg, done)
                rest = None if joined else data[pos:end].tobytes()
            if joined:  # what is left stays in place: a large answer is not copied per receive
                del self._buf[:pos]
            elif rest:
                self._buf += rest
            if woke and self._waiting:
                with self._mu:
                    self._cv.notify_all()
        except errors.RaymxError as e:
            self._fail(e)
        except (OSError, ConnectionError) as e:
            self._fail(errors.ConnectionLost(
                f"connection to {self.addr} lost ({e}); the outcome of requests in flight "
                "is unknown", sent=True))
        for f, msg in done:
            if not f.set_running_or_notify_cancel():
                continue  # its caller cancelled it
            if "err" in msg:
                f.set_exception(errors.from_wire(msg["err"]))
            else:
                f.set_result(msg.get("ok"))

    def _dispatch(self, msg: dict, done: list) -> bool:
        """Hand ``msg`` to its waiter (a Future's goes to ``done``); True if a
        waiting ``request`` must be woken."""
        rid = msg.get("id")
        if rid is None and "err" in msg:
            raise errors.from_wire(msg["err"])
        with self._mu:
            w = self._pending.pop(rid, None)
        if w is None:
            return False
        if type(w) is _Wait:
            w.msg = msg
            return True
        done.append((w, msg))
        return False

    def _fail(self, e: errors.RaymxError):
        with self._mu:
            if self._closed is None:
                self._closed = e
            pending, self._pending = self._pending, {}
            for w in pending.values():
                if type(w) is _Wait:
                    w.msg = e
            self._cv.notify_all()
        for w in pending.values():
            if type(w) is not _Wait and w.set_running_or_notify_cancel():
                w.set_exception(e)
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes a receive blocked in another thread
        except OSError:
            pass
        self._sock.close()

    @property
    def closed(self) -> bool:
        return self._closed is not None

    def close(self):
        self._fail(errors.ConnectionLost("connection closed by the client"))


class _TLSSocket:
    """A TLS socket as ``Connection`` uses a plain one: a receive or a send
    waits at most one slice, then raises BlockingIOError. The ``SSLSocket`` is
    non-blocking and every call into it holds a lock (OpenSSL must not run a
    read and a write of one connection at once, and a reading thread and a
    sending one share it); the waits are polls outside the lock."""

    _SLICE_MS = _RECV_SLICE_MS

    def __init__(self, ssock: ssl.SSLSocket):
        ssock.setblocking(False)
        self._s = ssock
        self._lock = threading.Lock()

    def fileno(self) -> int:
        return self._s.fileno()

    def _call(self, fn, arg):
        for attempt in (0, 1):
            with self._lock:
                try:
                    return fn(arg)
                except ssl.SSLWantReadError:
                    ev = select.POLLIN
                except ssl.SSLWantWriteError:
                    ev = select.POLLOUT
            if attempt == 0:
                p = select.poll()
                p.register(self._s.fileno(), ev)
                if not p.poll(self._SLICE_MS):
                    break
        raise BlockingIOError

    def recv_into(self, buf) -> int:
        return self._call(self._s.recv_into, buf)

    def send(self, data) -> int:
        return self._call(self._s.send, data)

    def shutdown(self, how) -> None:
        socket.socket.shutdown(self._s, how)  # the file descriptor's: wakes a waiting poll

    def close(self) -> None:
        with self._lock:
            self._s.close()


def _tls_handshake(sock: socket.socket, ctx: ssl.SSLContext, host: str, port: int):
    """``sock`` wrapped in TLS, the member's certificate checked; TLSError if not."""
    try:
        return ctx.wrap_socket(sock, server_hostname=host)
    except ssl.SSLCertVerificationError as e:
        sock.close()
        raise errors.TLSError(f"the certificate of {host}:{port} is not trusted: "
                              f"{e.verify_message}; nothing was sent") from None
    except (ssl.SSLError, ConnectionError, OSError) as e:
        sock.close()
        raise errors.TLSError(f"TLS handshake with {host}:{port} failed ({e}): its client port "
                              "may not use TLS (connect without tls); nothing was sent") from None


def connect_member(m: dict, secret: str, timeout_s: float = 10.0,
                   tls: ssl.SSLContext | None = None) -> Connection:
    """A connection to member ``m`` (a topology entry): over its Unix socket
    when it runs on this machine (same kernel boot id, and its hello names the
    same member), else over TCP (with ``tls``, if given)."""
    from raymx.actors.server import boot_id
    path = m.get("unix")
    if path and m.get("boot") and m.get("boot") == boot_id():
        try:
            c = Connection(m["host"], m["port"], secret, timeout_s, unix=path)
        except (OSError, errors.RaymxError):
            pass  # another mount namespace, or not this member any more: try TCP
        else:
            if isinstance(c.hello, dict) and c.hello.get("member") == m["id"]:
                return c
            c.close()
    return Connection(m["host"], m["port"], secret, timeout_s, tls=tls)
