"""Doorbells: wake-ups between a member's co-located processes without Ray.

A member's actors share one node (hard node affinity) and one LMDB folder.
The data they hand each other is already in LMDB; what travels is only "look
again". A Ray actor call costs about 1 ms of CPU on this machine kind, so a
per-batch wake-up through Ray costs more than the batch itself at low rates.
A doorbell is a Unix datagram socket in the abstract namespace (no file in the
member's folder, released by the kernel when its process dies), named after
the member's folder and the listener's role:

* ``Bell(path, role).ring()`` sends one byte without blocking. It returns False
  when nobody listens (the listener is restarting, or the platform has no
  abstract sockets), so the caller can fall back to a Ray call.
* ``Listener(path, role, on_ring)`` binds the name and calls ``on_ring()`` from
  its own daemon thread after each burst of rings (rings coalesce).

A plain ring carries no data and no ordering: a listener must always re-read
the state it was woken for (and keep a timeout-based poll as a safety net).

A ring may also carry a small value that is not in LMDB (``ring(data)``, at
most ``DATA_BYTES_MAX``); a listener made with ``with_data=True`` gets every
value of a burst, in order (``on_ring(values)``). ``ring(data)`` returns False
when the listener's queue is full, since the value would be lost; the
caller then sends it another way.
"""
from __future__ import annotations

import errno
import hashlib
import logging
import os
import socket
import threading
import time

log = logging.getLogger("raymx.doorbell")

DATA_BYTES_MAX = 1024
_RING = b"!"


def address(path: str, role: str) -> bytes:
    h = hashlib.sha256(os.path.realpath(path).encode()).hexdigest()[:32]
    return b"\0raymx/" + h.encode() + b"/" + role.encode()


class Bell:
    """The ringing side (never blocks, never raises)."""

    def __init__(self, path: str, role: str):
        self._addr = address(path, role)
        self._sock = None

    def ring(self, data: bytes | None = None) -> bool:
        if data is not None and not 0 < len(data) <= DATA_BYTES_MAX:
            raise ValueError(f"a doorbell carries 1 to {DATA_BYTES_MAX} bytes, not {len(data)}")
        try:
            if self._sock is None:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                s.setblocking(False)
                self._sock = s
            self._sock.sendto(_RING if data is None else data, self._addr)
            return True
        except BlockingIOError:
            # the listener's queue is full: it has wake-ups pending, but a value
            # would be lost
            return data is None
        except OSError as e:
            if e.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                log.debug("doorbell ring failed: %s", e)
            return False
        except Exception:  # no AF_UNIX on this platform
            return False

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class Listener:
    """The listening side: ``on_ring()`` runs on a daemon thread after rings.

    ``ok`` is False while the name cannot be bound (a predecessor still
    exiting holds it: retried every 0.5 s for ``retry_s``; or no abstract
    sockets here); rings fail meanwhile and the ringer falls back to Ray.
    """

    def __init__(self, path: str, role: str, on_ring, retry_s: float = 30.0,
                 with_data: bool = False):
        self._on_ring = on_ring
        self._with_data = with_data
        self._closed = False
        self._addr = address(path, role)
        self._sock = None
        self.ok = False
        self._bind()
        if not self.ok and retry_s <= 0:
            return
        self._t = threading.Thread(target=self._run, args=(retry_s,),
                                   name=f"raymx-bell-{role}", daemon=True)
        self._t.start()

    def _bind(self) -> None:
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        except Exception:  # no AF_UNIX on this platform
            return
        try:
            s.bind(self._addr)
        except OSError:
            # a predecessor of this actor may still be exiting and hold the name
            s.close()
            return
        self._sock = s
        self.ok = True

    def _run(self, retry_s: float) -> None:
        waited = 0.0
        while not self.ok and not self._closed:
            if waited >= retry_s:
                log.warning("doorbell %r not available; using Ray calls", self._addr)
                return
            time.sleep(0.5)
            waited += 0.5
            self._bind()
        s = self._sock
        while not self._closed:
            try:
                values = [s.recv(DATA_BYTES_MAX)]
                if self._closed:
                    return
                s.setblocking(False)
                try:  # coalesce a burst of rings into one wake-up
                    while True:
                        values.append(s.recv(DATA_BYTES_MAX))
                except BlockingIOError:
                    pass
                finally:
                    s.setblocking(True)
            except OSError:
                if self._closed:
                    return
                continue
            try:
                if self._with_data:
                    self._on_ring(values)
                else:
                    self._on_ring()
            except Exception:
                log.exception("doorbell handler failed")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.ok:
            try:  # wake the thread blocked in recv, then let it go
                s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                s.setblocking(False)  # never wait on a full queue: it wakes the thread anyway
                try:
                    s.sendto(_RING, self._addr)
                except BlockingIOError:
                    pass
                s.close()
                self._t.join(2)
            except OSError:
                pass
            self._sock.close()
