"""The driver: a pymongo-shaped client over the members' client ports.

One persistent connection per member (a Unix socket on the member's own
machine, else TCP), shared by every thread of the client and pipelined: each
request carries an id and the answers are matched to it, so many requests are
in flight on one socket. The caller that waits reads the answers itself (no
reader thread unless Futures are used). Errors raised by the member arrive as
the same ``raymx.errors`` classes.
"""
from __future__ import annotations

import functools
import itertools
import select
import socket
import struct
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from raymx import errors
from raymx.storage import codec
from raymx.storage.gtid import GTID
from raymx.storage.limits import DEFAULT as DEFAULT_LIMITS, READ_CONCERNS, write_concern_problem


_RECV_BYTES = 1 << 18  # one receive's buffer
_RECV_SLICE = struct.pack("ll", 0, 50_000)  # a receive waits at most 50 ms (SO_RCVTIMEO)
_CANCEL_SEND_S = 5.0  # a cancel frame after a failed part gets this long to go
_READ_OPS = {"find", "getMore", "count", "listCollections", "listIndexes", "killCursors"}


def _gtid(x) -> GTID | None:
    return None if x is None else GTID(*x)


# --- one connection -------------------------------------------------------
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
                 frame_bytes_max: int = DEFAULT_LIMITS.frame_bytes_max, unix: str | None = None):
        self.addr = (host, port) if unix is None else unix
        self.frame_bytes_max = frame_bytes_max
        if unix is None:
            self._sock = socket.create_connection(self.addr, timeout=timeout_s)
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        else:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._sock.settimeout(timeout_s)
            try:
                self._sock.connect(unix)
            except OSError:
                self._sock.close()
                raise
        # A receive or a send waits at most _RECV_SLICE (SO_RCVTIMEO,
        # SO_SNDTIMEO), then its caller looks at its deadline: no poll first.
        self._sock.settimeout(None)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _RECV_SLICE)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _RECV_SLICE)
        # A member that hung up: a send on a Unix socket fails at once (EPIPE),
        # so only TCP needs the check before sending into an idle connection.
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


def connect_member(m: dict, secret: str, timeout_s: float = 10.0) -> Connection:
    """A connection to member ``m`` (a topology entry): over its Unix socket
    when it runs on this machine (same kernel boot id, and its hello names the
    same member), else over TCP."""
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
    return Connection(m["host"], m["port"], secret, timeout_s)


# --- clients by URL (no Ray) --------------------------------------------------
def parse_url(url: str) -> tuple[list[tuple[str, int]], str, str | None]:
    """``raymx://[:SECRET@]host:port[,host:port...]/NAME`` -> (hosts, name, secret)."""
    from urllib.parse import unquote
    if not isinstance(url, str) or not url.startswith("raymx://"):
        raise errors.ConfigError(f"a raymx URL starts with raymx://, not {str(url)[:40]!r}")
    rest = url[len("raymx://"):]
    netloc, _, name = rest.partition("/")
    name = name.split("?", 1)[0]
    cred, _, hosts = netloc.rpartition("@")
    secret = unquote(cred.partition(":")[2]) if cred else None
    seeds = []
    for h in hosts.split(","):
        host, _, port = h.rpartition(":")
        if not host or not port.isdigit():
            raise errors.ConfigError(f"raymx URL: {h!r} is not host:port")
        seeds.append((host.strip("[]"), int(port)))
    if not name:
        raise errors.ConfigError("raymx URL: the replica set's name is missing (…/NAME)")
    return seeds, name, secret


class URLTopology:
    """The topology of a set learned from its members (``op: topology``), for
    clients outside Ray: the seed hosts first, then every member last seen."""

    def __init__(self, seeds: list[tuple[str, int]], name: str, secret: str,
                 timeout_s: float = 5.0):
        self.seeds, self.name, self.secret, self.timeout_s = seeds, name, secret, timeout_s
        self.known = list(seeds)

    def __call__(self) -> dict:
        tried = []
        for host, port in list(dict.fromkeys(self.known)):
            try:
                c = Connection(host, port, self.secret, self.timeout_s)
            except errors.AuthenticationFailed:
                raise errors.ConfigError(f"{host}:{port} refused the credential of the URL "
                                         f"for replica set {self.name!r}") from None
            except (OSError, errors.RaymxError) as e:
                tried.append(f"{host}:{port}: {type(e).__name__}")
                continue
            try:
                if isinstance(c.hello, dict) and c.hello.get("replset") not in (None, self.name):
                    raise errors.ConfigError(f"{host}:{port} is a member of replica set "
                                             f"{c.hello.get('replset')!r}, not {self.name!r}")
                topo = c.request({"op": "topology"}, self.timeout_s)
            except errors.ConfigError:
                raise
            except (OSError, errors.RaymxError) as e:
                tried.append(f"{host}:{port}: {type(e).__name__}")
                continue
            finally:
                c.close()
            self.known = self.seeds + [(m["host"], m["port"]) for m in topo["members"]]
            return dict(topo, secret=self.secret)
        raise errors.PrimaryUnavailable(f"no member of replica set {self.name!r} answered "
                                        f"({'; '.join(tried)})")


def connect_url(url: str, secret: str | None = None, secret_file: str | None = None,
                w: int | str = 1, j: bool = False, wtimeout_ms: int | None = None,
                timeout_s: float = 30.0, read_preference="primary",
                read_concern="local") -> Client:
    """A ``Client`` of the replica set at ``url`` (``rs.url()``) from any Python
    process, without Ray: it learns the members from the members themselves
    and follows elections as the Ray-based client does. The credential comes
    from ``secret``, the URL, ``secret_file``, or the environment
    (``RAYMX_SECRET``, or a file named by ``RAYMX_SECRET_FILE``), in that order.
    Staleness-bounded reads (``max_staleness_s``) need ``rs.client()``."""
    import os
    seeds, name, url_secret = parse_url(url)
    secret_file = secret_file or os.environ.get("RAYMX_SECRET_FILE")
    if secret is None and url_secret is None and secret_file:
        try:
            with open(secret_file) as f:
                secret = f.read().strip()
        except OSError as e:
            raise errors.ConfigError(f"cannot read the secret file {secret_file}: {e}") from None
    secret = secret or url_secret or os.environ.get("RAYMX_SECRET")
    if not secret:
        raise errors.ConfigError("no credential for the replica set: put it in the URL, "
                                 "pass secret= or secret_file=, or set RAYMX_SECRET or "
                                 "RAYMX_SECRET_FILE")
    rp = read_preference if isinstance(read_preference, ReadPreference) \
        else ReadPreference(read_preference)
    return Client(URLTopology(seeds, name, secret), WriteConcern(w, j, wtimeout_ms), timeout_s,
                  rp, None, ReadConcern.of(read_concern))


# --- results ------------------------------------------------------------
@dataclass
class InsertOneResult:
    inserted_id: Any
    gtid: GTID | None


@dataclass
class InsertManyResult:
    inserted_ids: list
    gtid: GTID | None


@dataclass
class UpdateResult:
    matched_count: int
    modified_count: int
    upserted_id: Any
    gtid: GTID | None


@dataclass
class DeleteResult:
    deleted_count: int
    gtid: GTID | None


@dataclass(frozen=True)
class WriteConcern:
    """``w``: members that must hold the entry (a number or "majority");
    ``j``: wait for the sync that makes it durable; ``wtimeout_ms``: give up
    waiting (the write stays committed)."""

    w: int | str = 1
    j: bool = False
    wtimeout_ms: int | None = None

    def __post_init__(self):
        problem = write_concern_problem(self.w, self.j, self.wtimeout_ms)
        if problem is not None:
            raise errors.ConfigError(problem)

    def fields(self) -> dict:
        d = {"w": self.w, "j": self.j}
        if self.wtimeout_ms is not None:
            d["wtimeout_ms"] = self.wtimeout_ms
        return d

    @functools.cached_property
    def wire(self) -> dict:
        """``fields()``, built once: callers only read it."""
        return self.fields()


@dataclass(frozen=True)
class ReadPreference:
    """Where reads go: ``primary`` (default), ``secondary`` or ``nearest``.

    ``after``: read only once the chosen member has applied this GTID (waits up
    to ``after_timeout_ms``), e.g. the GTID of your last write: read your
    writes on a secondary. ``max_staleness_s``: only members whose applied
    state is at most this many seconds behind the primary.
    """

    mode: str = "primary"
    after: GTID | None = None
    after_timeout_ms: int = 10_000
    max_staleness_s: float | None = None

    def __post_init__(self):
        if self.mode not in ("primary", "secondary", "nearest"):
            raise errors.ConfigError(f"read preference {self.mode!r}: primary, secondary or nearest")
        if self.after is not None:
            object.__setattr__(self, "after", GTID.parse(self.after))

    def fields(self) -> dict:
        if self.after is None:
            return {}
        return {"after": list(self.after), "after_timeout_ms": self.after_timeout_ms}


@dataclass(frozen=True)
class ReadConcern:
    """What a read may see (as MongoDB's readConcern).

    ``"local"`` (default): whatever the member has committed (a write that can
    still be rolled back included). ``"majority"``: exactly the
    majority-committed point of the member that serves it, never a write that
    can be rolled back. ``"linearizable"``: on the primary only; majority-
    committed data, and after reading the primary confirms with a majority
    round that it still is one (a deposed primary never answers); meant for
    single-document reads. ``"snapshot"``: outside a transaction as
    ``"majority"`` (one point); a transaction's reads already see one
    snapshot."""

    level: str = "local"

    def __post_init__(self):
        if self.level not in READ_CONCERNS:
            raise errors.ConfigError(f"read concern {self.level!r}: one of "
                                     f"{', '.join(READ_CONCERNS)}")

    @classmethod
    def of(cls, v) -> "ReadConcern | None":
        return v if v is None or isinstance(v, ReadConcern) else cls(v)

    def fields(self) -> dict:
        return {} if self.level == "local" else {"readConcern": self.level}


INSERT_PART_DOCS = 256
INSERT_PART_BYTES = 8 << 20


def _pack(docs: list) -> list[bytes]:
    return codec.pack_each(docs, DEFAULT_LIMITS.document_bytes_max)


def _packed_part(docs: list) -> list[dict]:
    """The frames' fields of one part of an insert: one frame unless its
    documents pass INSERT_PART_BYTES (then cut into runs, each at most that
    or one document)."""
    frames, run, n = [], [], 0
    for r in _pack(docs):
        if run and n + len(r) > INSERT_PART_BYTES:
            frames.append({"packed": run})
            run, n = [], 0
        run.append(r)
        n += len(r)
    frames.append({"packed": run})
    return frames


def _wc(base: WriteConcern, kw: dict) -> dict:
    """The write concern fields of one call: ``base`` overridden by ``kw``
    (read only: the result may be ``base``'s own)."""
    if not kw:
        return base.wire
    w = kw.pop("w", None)
    j = kw.pop("j", None)
    wt = kw.pop("wtimeout_ms", None)
    if kw:
        raise TypeError(f"unexpected arguments: {sorted(kw)}")
    return WriteConcern(base.w if w is None else w, base.j if j is None else j,
                        base.wtimeout_ms if wt is None else wt).fields()


# --- the client -----------------------------------------------------------
class Client:
    """Talks to a replica set; ``client["db"]["coll"]`` as in pymongo.

    ``topology`` returns ``{"secret": ..., "members": [{"id", "host", "port",
    "role"}]}``; the client asks it again when the primary changes.
    """

    def __init__(self, topology: Callable[[], dict], write_concern: WriteConcern | None = None,
                 timeout_s: float = 30.0, read_preference: "ReadPreference | None" = None,
                 status: Callable[[], dict] | None = None,
                 read_concern: "ReadConcern | str | None" = None):
        self._topology = topology
        self._status = status
        self.write_concern = write_concern or WriteConcern()
        self.read_preference = read_preference or ReadPreference()
        self.read_concern = ReadConcern.of(read_concern) or ReadConcern()
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._conns: dict[int, Connection] = {}
        self._primary: int | None = None
        self._rr = itertools.count()
        self.retry_interval_s = 0.05
        self._local = threading.local()  # .txn: the transaction this thread has open

    def _conn_to(self, m: dict, secret: str) -> Connection:
        c = self._conns.get(m["id"])
        if c is None or c.closed:
            c = self._conns[m["id"]] = connect_member(m, secret)
        return c

    def _read_conn(self, rp: "ReadPreference", skip=()) -> Connection:
        """A connection to a member that satisfies ``rp``, not one in ``skip``
        (it refused the read) nor one the set reports recovering, needing a
        resync or synchronizing (its data may still be rolled back)."""
        if rp.mode == "primary":
            return self._primary_conn()
        topo = self._topology()
        members = [m for m in topo["members"] if not m.get("hidden")]
        if rp.mode == "secondary":
            members = [m for m in members if m.get("role") == "secondary"]
        if rp.max_staleness_s is not None:
            if self._status is None:
                raise errors.StaleRead("max-staleness reads need the replica set's status")
            lag = {s["id"]: s.get("lag_s") for s in self._status()["members"]}
            members = [m for m in members if lag.get(m["id"]) is not None
                       and lag[m["id"]] <= rp.max_staleness_s]
        ready = [m for m in members if m["id"] not in skip
                 and (m.get("role") == "primary" or m.get("state", "running") == "running")]
        if not ready:
            raise errors.StaleRead(f"no member satisfies read preference {rp}",
                                   transient=len(ready) < len(members))
        m = ready[next(self._rr) % len(ready)]
        with self._lock:
            return self._conn_to(m, topo["secret"])

    def _read_call(self, rp: "ReadPreference", req: dict) -> tuple:
        """Run a read on a member that satisfies ``rp``: (answer, connection).
        A member that refuses it (``NotPrimaryOrSecondary``) or drops the
        connection is skipped and another one tried until ``timeout_s``."""
        if rp.mode == "primary":  # a member that is not (any more) primary refuses it
            return self._call_conn(dict(req, rp="primary"))
        deadline = time.monotonic() + self.timeout_s
        skip: set = set()
        while True:
            conn = None
            try:
                conn = self._read_conn(rp, skip)
                return conn.request(req, max(0.1, deadline - time.monotonic())), conn
            except (errors.NotPrimaryOrSecondary, errors.ConnectionLost, OSError) as e:
                err = e
                hello = getattr(conn, "hello", None)
                skip.add(hello.get("member") if isinstance(hello, dict) else None)
            except errors.StaleRead as e:
                if not e.info.get("transient"):
                    raise
                err, skip = e, set()  # every fitting member refused: try them again
            if time.monotonic() >= deadline:
                raise err
            time.sleep(self.retry_interval_s)

    def _primary_conn(self) -> Connection:
        with self._lock:
            if self._primary is not None:
                c = self._conns.get(self._primary)
                if c is not None and not c.closed:
                    return c
            try:
                topo = self._topology()
            except errors.ConfigError:
                raise  # the set was shut down, or never ran: final, not waited out
            except Exception as e:
                raise errors.PrimaryUnavailable(f"cannot reach the replica set: {e}") from None
            prim = [m for m in topo["members"] if m.get("role") == "primary"]
            if not prim:
                raise errors.PrimaryUnavailable("no primary is available (an election may be "
                                                "running)")
            m = prim[0]
            try:
                c = self._conn_to(m, topo["secret"])
            except OSError as e:
                raise errors.PrimaryUnavailable(f"cannot connect to the primary: {e}") from None
            self._primary = m["id"]
            return c

    def _call(self, req: dict, conn: Connection | None = None, parts=None):
        """Send to the primary, following it through elections.

        A request the member refused (NotPrimary), or that never left this
        process, is retried on the new primary until ``timeout_s``; a write lost
        in flight is not (its outcome is unknown) and says so.
        """
        if conn is not None:
            return conn.request(req, self.timeout_s, parts)
        return self._call_conn(req, parts)[0]

    def _call_conn(self, req: dict, parts=None) -> tuple:
        deadline = time.monotonic() + self.timeout_s
        write = req.get("op") not in _READ_OPS
        while True:
            try:
                c = self._primary_conn()
                return c.request(req, max(0.1, deadline - time.monotonic()), parts), c
            except (errors.NotPrimary, errors.PrimaryUnavailable,
                    errors.NotPrimaryOrSecondary) as e:
                if e.info.get("outcome") == "unknown":
                    raise  # committed there, then the primary stepped down: never retry
                err = e
            except errors.ConnectionLost as e:
                if write and e.info.get("sent", True):
                    raise errors.ConnectionLost(
                        f"{e.msg}; the write may or may not have been applied: check before "
                        "retrying", sent=True, outcome="unknown") from None
                err = e
            except errors.RequestTimeout as e:
                if write:
                    raise errors.RequestTimeout(
                        f"{e.msg}; the write may still be applied (it may wait behind a "
                        "transaction): check before retrying", outcome="unknown",
                        **e.info) from None
                raise
            with self._lock:
                self._primary = None
            if time.monotonic() >= deadline:
                raise err
            time.sleep(self.retry_interval_s)

    def __getitem__(self, name: str) -> "Database":
        return Database(self, name, self.write_concern)

    def with_options(self, write_concern: WriteConcern | None = None,
                     read_preference: ReadPreference | None = None,
                     read_concern: "ReadConcern | str | None" = None) -> "Client":
        c = Client(self._topology, write_concern or self.write_concern, self.timeout_s,
                   read_preference or self.read_preference, self._status,
                   ReadConcern.of(read_concern) or self.read_concern)
        return c

    def get_database(self, name: str) -> "Database":
        return self[name]

    def list_database_names(self) -> list[str]:
        names = self._call({"op": "listCollections"})["value"]
        return sorted({n.split(".", 1)[0] for n in names})

    def watch(self, after=None, namespaces=None, ops=None, majority: bool = True,
              read_preference: "str | ReadPreference | None" = None, batch: int | None = None,
              wait_ms: int | None = None, read_concern: "ReadConcern | str | None" = None
              ) -> "ChangeStream":
        """A change stream over the whole replica set (see ``ChangeStream``).

        ``after``: a resume token (an event's ``token``, a stream's
        ``resume_token``, or a GTID such as ``"3:1042"``); None starts at the
        current majority-committed point. ``namespaces``: ``"db"`` or
        ``"db.coll"`` names; ``ops``: event op names. ``majority=False`` (or
        ``read_concern="local"``) also delivers entries not yet
        majority-committed (they may be rolled back).
        """
        rc = ReadConcern.of(read_concern)
        if rc is not None:
            if rc.level == "linearizable":
                raise errors.InvalidOperation("a change stream cannot be linearizable: "
                                              "read concern 'majority' or 'local'")
            majority = rc.level != "local"
        rp = read_preference or self.read_preference
        rp = rp if isinstance(rp, ReadPreference) else ReadPreference(rp)
        return ChangeStream(self, after, namespaces, ops, majority, rp, batch, wait_ms)

    def transaction(self, **wc) -> "ClientTransaction":
        return ClientTransaction(self, _wc(self.write_concern, wc))

    def _no_open_transaction(self, what: str) -> None:
        """A transaction holds the member's writer until it ends: ``what`` on
        the thread that holds it open would wait for itself until the timeout."""
        if getattr(self._local, "txn", None) is not None:
            raise errors.InvalidOperation(
                f"this thread has a transaction open on this client; {what} would wait for "
                "it to end (a transaction holds the writer): write through the transaction "
                "(tx[db][coll]), or end it first")

    def close(self):
        with self._lock:
            for c in self._conns.values():
                c.close()
            self._conns.clear()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


class Database:
    def __init__(self, client: Client, name: str, wc: WriteConcern, txn=None):
        self.client, self.name, self.write_concern, self._txn = client, name, wc, txn

    def __getitem__(self, coll: str) -> "Collection":
        return Collection(self.client, f"{self.name}.{coll}", self.write_concern, self._txn,
                          self.client.read_preference, self.client.read_concern)

    def __getattr__(self, n: str) -> "Collection":
        if n.startswith("_"):
            raise AttributeError(n)
        return self[n]

    def watch(self, after=None, ops=None, **kw) -> "ChangeStream":
        """Change events of every collection of this database."""
        return self.client.watch(after, [self.name], ops, **kw)

    def list_collection_names(self) -> list[str]:
        names = self.client._call({"op": "listCollections"})["value"]
        return sorted(n.split(".", 1)[1] for n in names if n.split(".", 1)[0] == self.name)

    def drop_collection(self, name: str) -> bool:
        return self[name].drop()


class Collection:
    def __init__(self, client: Client, ns: str, wc: WriteConcern, txn=None,
                 rp: ReadPreference | None = None, rc: ReadConcern | None = None):
        self.client, self.full_name, self.write_concern, self._txn = client, ns, wc, txn
        self.read_preference = rp or client.read_preference
        self.read_concern = rc or client.read_concern
        self.database_name, self.name = ns.split(".", 1)

    def with_options(self, write_concern: WriteConcern | None = None,
                     read_preference: ReadPreference | None = None,
                     read_concern: "ReadConcern | str | None" = None) -> "Collection":
        return Collection(self.client, self.full_name, write_concern or self.write_concern,
                          self._txn, read_preference or self.read_preference,
                          ReadConcern.of(read_concern) or self.read_concern)

    def _read_fields(self, read_concern=None) -> dict:
        """The read preference's and read concern's fields of a request (the
        call's ``read_concern`` over the collection's)."""
        asked = ReadConcern.of(read_concern)
        if self._txn is not None:  # the transaction's reads see one snapshot
            if asked is not None and asked.level not in ("local", "snapshot"):
                raise errors.InvalidOperation(f"read concern {asked.level!r} inside a "
                                              "transaction: its reads see one snapshot")
            return {}
        rc = asked or self.read_concern
        if rc.level == "linearizable" and self.read_preference.mode != "primary":
            raise errors.InvalidOperation("read concern 'linearizable' reads from the primary "
                                          f"only, not with read preference {self.read_preference}")
        out = {**self.read_preference.fields(), **rc.fields()}
        if rc.level == "linearizable":  # the member's confirmation round waits this long
            out["read_timeout_ms"] = max(100, int(self.client.timeout_s * 800))
        return out

    def _read(self, req: dict, read_concern=None):
        req.update(self._read_fields(read_concern))
        if self._txn is not None:
            return self._txn._call(req)
        return self.client._read_call(self.read_preference, req)[0]

    def _write(self, req: dict, wc: dict, parts=None):
        req["ns"] = self.full_name
        if self._txn is not None:
            return self._txn._call(req, parts)
        self.client._no_open_transaction("a write outside it")
        req.update(wc)
        return self.client._call(req, parts=parts)

    # writes
    # Documents travel packed one by one ("packed": a msgpack binary each): the
    # member decodes them to check them and stores these bytes, never packing
    # them again. What msgpack cannot encode fails here, before it is sent.
    def insert_one(self, doc: dict, **wc) -> InsertOneResult:
        r = self._write({"op": "insert", "packed": _pack([doc])}, _wc(self.write_concern, wc))
        return InsertOneResult(r["inserted_ids"][0], _gtid(r["gtid"]))

    # A large insert goes in parts of INSERT_PART_DOCS documents (a frame each,
    # or more past INSERT_PART_BYTES), still one atomic statement: the member
    # decodes each part while the next is packed here, and the whole may
    # exceed one frame (up to the member's transaction_bytes_max).
    def insert_many(self, docs, **wc) -> InsertManyResult:
        docs, wc = list(docs), _wc(self.write_concern, wc)
        if len(docs) <= INSERT_PART_DOCS:
            r = self._write({"op": "insert", "packed": _pack(docs)}, wc)
        else:
            parts = [functools.partial(_packed_part, docs[i:i + INSERT_PART_DOCS])
                     for i in range(0, len(docs), INSERT_PART_DOCS)]
            r = self._write({"op": "insert"}, wc, parts)
        return InsertManyResult(r["inserted_ids"], _gtid(r["gtid"]))

    def _update(self, flt, update, multi, upsert, replace, wc) -> UpdateResult:
        r = self._write({"op": "update", "filter": flt, "update": update, "multi": multi,
                         "upsert": upsert, "replace": replace}, _wc(self.write_concern, wc))
        return UpdateResult(r["matched"], r["modified"], r["upserted_id"], _gtid(r["gtid"]))

    def update_one(self, flt, update, upsert=False, **wc) -> UpdateResult:
        return self._update(flt, update, False, upsert, False, wc)

    def update_many(self, flt, update, upsert=False, **wc) -> UpdateResult:
        return self._update(flt, update, True, upsert, False, wc)

    def replace_one(self, flt, replacement, upsert=False, **wc) -> UpdateResult:
        return self._update(flt, replacement, False, upsert, True, wc)

    def delete_one(self, flt, **wc) -> DeleteResult:
        r = self._write({"op": "delete", "filter": flt, "multi": False}, _wc(self.write_concern, wc))
        return DeleteResult(r["deleted"], _gtid(r["gtid"]))

    def delete_many(self, flt, **wc) -> DeleteResult:
        r = self._write({"op": "delete", "filter": flt, "multi": True}, _wc(self.write_concern, wc))
        return DeleteResult(r["deleted"], _gtid(r["gtid"]))

    def create_index(self, keys, unique: bool = False, name: str | None = None, **wc) -> str:
        if isinstance(keys, list):
            keys = [list(k) if isinstance(k, tuple) else k for k in keys]
        return self._write({"op": "createIndex", "key": keys, "unique": unique, "name": name},
                           _wc(self.write_concern, wc))["value"]

    def drop_index(self, name: str, **wc) -> None:
        self._write({"op": "dropIndex", "name": name}, _wc(self.write_concern, wc))

    def drop(self, **wc) -> bool:
        return self._write({"op": "dropCollection"}, _wc(self.write_concern, wc))["value"]

    def list_indexes(self) -> list[dict]:
        return self.client._call({"op": "listIndexes", "ns": self.full_name})["value"]

    def watch(self, after=None, ops=None, **kw) -> "ChangeStream":
        """Change events of this collection."""
        return self.client.watch(after, [self.full_name], ops, **kw)

    # reads
    def find(self, filter=None, projection=None, sort=None, skip: int = 0, limit: int = 0,
             batch_size: int = 0, read_concern: "ReadConcern | str | None" = None) -> "Cursor":
        return Cursor(self, filter, projection, sort, skip, limit, batch_size, read_concern)

    def find_one(self, filter=None, projection=None, sort=None,
                 read_concern: "ReadConcern | str | None" = None):
        """The first matching document or None; a filter that is not a map
        means ``{"_id": filter}`` (as in pymongo)."""
        if filter is not None and not isinstance(filter, dict):
            filter = {"_id": filter}
        for d in self.find(filter, projection, sort, limit=1, read_concern=read_concern):
            return d
        return None

    def count_documents(self, filter=None, read_concern: "ReadConcern | str | None" = None
                        ) -> int:
        return self._read({"op": "count", "ns": self.full_name,
                           "filter": {} if filter is None else filter}, read_concern)["value"]


class ChangeStream:
    """Change events in GTID order (format: ``raymx.storage.changes``).

    Iterate it (blocks), or call ``try_next()`` (one long-poll of at most
    ``wait_ms``: an event or None). ``resume_token`` is the token after the
    last event returned, or, on a quiet or filtered stream, the high-water
    mark (the majority-committed point the member has reached), so a consumer
    that stores it with its own effects and restarts from it (``watch(after=
    token)``) sees every event exactly once. A lost member is not an error:
    the stream resumes from its token on the primary, or on any other member
    while there is none (every member serves the same events). A token older
    than the oplog raises ``OplogTrimmed`` naming the oldest GTID available.
    """

    def __init__(self, client: Client, after, namespaces, ops, majority, rp, batch, wait_ms):
        from raymx.storage.changes import Filter, parse_token
        Filter(namespaces, ops)  # validate here, before any request
        self.client = client
        self.resume_token = None if after is None else list(parse_token(after))
        self._req = {"op": "watch", "namespaces": None if namespaces is None else list(namespaces),
                     "ops": None if ops is None else list(ops), "majority": bool(majority),
                     "batch": batch, "wait_ms": wait_ms}
        self._rp = rp
        self._wait_s = (wait_ms or DEFAULT_LIMITS.watch_wait_ms) / 1000
        self._conn: Connection | None = None
        self._buf: list = []
        self._batch_resume = None
        self.member: int | None = None  # the member serving this stream now
        self.closed = False
        if self.resume_token is None:  # start now: the member's majority point
            self.resume_token = self._fetch()["resume"]

    def _connect(self) -> Connection:
        c = self.client
        try:
            if self._rp.mode == "primary":
                conn = c._primary_conn()
            else:
                conn = c._read_conn(self._rp)
        except (errors.PrimaryUnavailable, errors.StaleRead, OSError):
            # no primary now (an election): any member serves the same events
            topo = c._topology()
            ms = [m for m in topo["members"] if not m.get("hidden") and (
                m.get("role") == "primary" or m.get("state", "running") == "running")]
            if not ms:
                raise errors.PrimaryUnavailable("no member of the replica set is reachable")
            m = ms[next(c._rr) % len(ms)]
            with c._lock:
                conn = c._conn_to(m, topo["secret"])
        self.member = conn.hello.get("member") if isinstance(conn.hello, dict) else None
        return conn

    def _fetch(self) -> dict:
        deadline = time.monotonic() + self.client.timeout_s
        while True:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = self._connect()
                return self._conn.request(dict(self._req, after=self.resume_token),
                                          self._wait_s + self.client.timeout_s)
            except (errors.ConnectionLost, errors.PrimaryUnavailable, errors.ShutDown,
                    errors.NotPrimaryOrSecondary, OSError, TimeoutError) as e:
                err = e
            except Exception as e:  # e.g. Ray reporting a member restarting
                if isinstance(e, errors.RaymxError):
                    raise
                err = e
            self._conn = None
            with self.client._lock:
                self.client._primary = None
            if time.monotonic() >= deadline:
                raise errors.PrimaryUnavailable(f"change stream: no member answered within "
                                                f"{self.client.timeout_s}s ({err})")
            time.sleep(self.client.retry_interval_s)

    def try_next(self) -> dict | None:
        """The next event, or None after one long-poll found nothing (the
        resume token may still have moved: the high-water mark)."""
        if self.closed:
            raise errors.InvalidOperation("the change stream is closed")
        if not self._buf:
            r = self._fetch()
            self._buf = list(reversed(r["events"]))
            self._batch_resume = r["resume"]
            if not self._buf:
                self.resume_token = self._batch_resume
                return None
        ev = self._buf.pop()
        ev["gtid"] = GTID(*ev["gtid"])
        # after the last event of a batch, the batch's own token (it may be higher)
        self.resume_token = ev["token"] if self._buf else self._batch_resume
        return ev

    def __iter__(self) -> Iterator[dict]:
        while not self.closed:
            ev = self.try_next()
            if ev is not None:
                yield ev

    def close(self) -> None:
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


class Cursor:
    """Streams a query's results in batches (``getMore``) from one snapshot."""

    def __init__(self, coll: Collection, flt, projection, sort, skip, limit, batch_size,
                 read_concern=None):
        self._c = coll
        self._spec = {"op": "find", "ns": coll.full_name, "filter": {} if flt is None else flt,
                      "projection": projection, "sort": _sort_spec(sort), "skip": skip,
                      "limit": limit, "batch": batch_size}
        self._fields = coll._read_fields(read_concern)
        self._started = False

    def sort(self, key, direction: int = 1) -> "Cursor":
        self._spec["sort"] = _sort_spec(key if isinstance(key, list) else [(key, direction)])
        return self

    def skip(self, n: int) -> "Cursor":
        self._spec["skip"] = n
        return self

    def limit(self, n: int) -> "Cursor":
        self._spec["limit"] = n
        return self

    def batch_size(self, n: int) -> "Cursor":
        self._spec["batch"] = n
        return self

    def __iter__(self) -> Iterator[dict]:
        if self._started:
            raise errors.InvalidOperation("a cursor can be iterated once")
        self._started = True
        txn = self._c._txn
        if txn is not None:
            yield from txn._call(dict(self._spec))["docs"]
            return
        rp = self._c.read_preference
        r, conn = self._c.client._read_call(rp, {**self._spec, **self._fields})
        cid = r["cursor"]
        try:
            while True:
                yield from r["docs"]
                if not cid:
                    return
                r = conn.request({"op": "getMore", "cursor": cid, "batch": self._spec["batch"]},
                                 self._c.client.timeout_s)
                cid = r["cursor"]
        finally:
            if cid and not conn.closed:
                conn.submit({"op": "killCursors", "cursors": [cid]})

    def to_list(self) -> list[dict]:
        return list(self)


def _sort_spec(sort):
    if sort is None:
        return None
    if isinstance(sort, str):
        return [[sort, 1]]
    if isinstance(sort, dict):
        return [[k, v] for k, v in sort.items()]
    return [list(x) if isinstance(x, (tuple, list)) else [x, 1] for x in sort]


class ClientTransaction:
    """``with client.transaction() as tx: tx["db"]["coll"].insert_one(...)``.

    All statements run on the primary under one LMDB write transaction and
    commit under one GTID; an exception in the block aborts and leaves no
    trace. The transaction holds the shard's writer: keep it short.
    """

    def __init__(self, client: Client, wc: dict):
        self.client = client
        self._wc = wc
        self._conn: Connection | None = None
        self._id = None
        self.gtid: GTID | None = None

    def __enter__(self):
        self.client._no_open_transaction("another transaction")
        self._conn = self.client._primary_conn()
        try:
            self._id = self._conn.request({"op": "txnBegin"}, self.client.timeout_s)["txn"]
        except errors.RequestTimeout as e:  # the member may open it later: it must abort that one
            self._conn.cancel(e.request_id, "txnBegin")
            raise
        self.client._local.txn = self
        return self

    def _call(self, req: dict, parts=None):
        if self._id is None:
            raise errors.TransactionAborted("the transaction is not open")
        req["txn"] = self._id
        return self._conn.request(req, self.client.timeout_s, parts)

    def __getitem__(self, db: str) -> Database:
        return Database(self.client, db, self.client.write_concern, self)

    def collection(self, ns: str) -> Collection:
        db, coll = ns.split(".", 1)
        return self[db][coll]

    def commit(self):
        try:
            r = self._call({"op": "txnCommit", **self._wc})
        finally:
            self._ended()
        self.gtid = _gtid(r.get("gtid"))
        return self.gtid

    def abort(self):
        if self._id is not None:
            try:
                self._call({"op": "txnAbort"})
            finally:
                self._ended()

    def _ended(self) -> None:
        self._id = None
        if getattr(self.client._local, "txn", None) is self:
            self.client._local.txn = None

    def __exit__(self, et, e, tb):
        if self._id is None:
            return
        if et is None:
            self.commit()
        else:
            self.abort()
