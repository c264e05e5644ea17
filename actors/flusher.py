"""Flusher: the LMDB data file's fdatasync in a helper process, so the client
port's thread asks for a flush and goes on serving while the disk works.

LMDB opened without a write map makes a commit durable with one
``fdatasync`` of its data file (``mdb_env_sync``), and that call flushes the
file's dirty pages whichever descriptor or process makes it. The helper is a
bare interpreter that reads a byte from its request pipe, flushes and writes
a byte back; it shares no lock and no GIL with the member, so the port's
thread runs the next writes while the helper flushes the ones before.
The port's event loop watches the answer pipe (``add_reader``): completion
costs it one readable descriptor among its client sockets.

One flush is in flight at a time. What a flush covers is decided by the
caller before asking (every commit that finished before the request byte was
written is on disk when the answer byte arrives). If the helper dies or the
disk fails, the flusher says so (``failed``) and the caller goes back to
flushing itself: nothing is acknowledged as durable that a flush did not
cover.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys

log = logging.getLogger("raymx.flusher")

# The helper's whole program: no imports beyond os and sys (-I -S: no site).
_HELPER = r"""
import os, sys
req, ans, fd = map(int, sys.argv[1:4])
while True:
    try:
        b = os.read(req, 64)
    except InterruptedError:
        continue
    if not b:
        break
    try:
        os.fdatasync(fd)
        os.write(ans, b"k")
    except OSError as e:
        os.write(ans, b"e" + str(e.errno).encode()[:8] + b";")
"""


class Flusher:
    """A helper process flushing one file on request (one request at a time).

    ``start()`` asks for a flush and returns at once; the loop calls
    ``on_done(ok)`` on its own thread when the flush finished (``ok`` False:
    the disk failed, or the helper is gone and ``failed`` is set).
    """

    def __init__(self, data_file: str, loop, on_done):
        self.path = data_file
        self._loop = loop
        self._on_done = on_done
        self.busy = False
        self.failed: str | None = None
        self.flushes = 0
        fd = os.open(data_file, os.O_RDWR | os.O_CLOEXEC)
        req_r, self._req_w = os.pipe2(os.O_CLOEXEC)
        self._ans_r, ans_w = os.pipe2(os.O_CLOEXEC)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _HELPER, str(req_r), str(ans_w), str(fd)],
                pass_fds=(req_r, ans_w, fd), stdin=subprocess.DEVNULL, close_fds=True)
        finally:
            for x in (req_r, ans_w, fd):
                os.close(x)
        os.set_blocking(self._ans_r, False)
        loop.call_soon_threadsafe(loop.add_reader, self._ans_r, self._answered)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def start(self) -> bool:
        """Ask for a flush (on the loop's thread). False if one is in flight or
        the helper is gone."""
        if self.busy or self.failed:
            return False
        try:
            os.write(self._req_w, b"f")
        except OSError as e:
            self._fail(f"cannot reach the flush helper: {e}")
            return False
        self.busy = True
        return True

    def _answered(self) -> None:
        try:
            b = os.read(self._ans_r, 64)
        except BlockingIOError:
            return
        except OSError as e:
            b, why = b"", str(e)
        else:
            why = "the flush helper exited"
        if not b:
            self._fail(f"{why} (exit code {self.proc.poll()})")
            return self._done(False)
        ok = b[:1] == b"k"
        if ok:
            self.flushes += 1
        else:
            log.error("fdatasync of %s failed in the flush helper: %r", self.path, b)
        self._done(ok)

    def _done(self, ok: bool) -> None:
        if self.busy:
            self.busy = False
            self._on_done(ok)

    def _fail(self, why: str) -> None:
        if self.failed is None:
            self.failed = why
            log.error("flush helper unusable, the member flushes itself from now on: %s", why)
            try:
                self._loop.remove_reader(self._ans_r)
            except Exception:
                pass

    def close(self) -> None:
        """Stop the helper (any thread): it exits when its request pipe closes."""
        self.failed = self.failed or "closed"
        try:
            os.close(self._req_w)
        except OSError:
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

        def release():
            try:
                self._loop.remove_reader(self._ans_r)
            except Exception:  # the loop is closed: nothing watches it any more
                pass
            os.close(self._ans_r)
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(release)
        else:  # the port stopped its loop first (the usual order)
            release()
