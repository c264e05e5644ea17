"""One LazyFS mount (https://github.com/dsrhaslab/lazyfs): a FUSE file system
that keeps every write in its own cache until it is fsync-ed, and drops what
is not synced when told to (``lazyfs::clear-cache`` written to its FIFO): a
power loss of that file system, without a reboot.

LazyFS is not part of raymx and nothing here builds it: build it from its
own README and pass the ``lazyfs`` binary it builds (``lazyfs/build/lazyfs``
in its checkout). Mounting needs root (or FUSE's ``user_allow_other``) and
``/dev/fuse``.
"""
from __future__ import annotations

import os
import re
import select
import shutil
import subprocess
import threading
import time

CONFIG = """\
[faults]
fifo_path="{fifo}"
fifo_path_completed="{done}"
[cache]
apply_eviction=false
[cache.simple]
custom_size="{cache}"
blocks_per_page=1
[filesystem]
log_all_operations=false
logfile="{log}"
"""


def missing_prerequisites(binary: str | None) -> list[str]:
    """What this machine lacks to mount LazyFS (empty: nothing)."""
    out = []
    if not binary:
        out.append("the LazyFS binary: build LazyFS from https://github.com/dsrhaslab/lazyfs "
                   "as its README says (it needs fuse3, libfuse3-dev, cmake and g++), then "
                   "pass --lazyfs PATH/lazyfs/build/lazyfs or set RAYMX_LAZYFS")
    elif not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        out.append(f"the LazyFS binary: {binary} is not an executable file (build LazyFS "
                   "from https://github.com/dsrhaslab/lazyfs; the binary is lazyfs/build/lazyfs)")
    if not os.path.exists("/dev/fuse"):
        out.append("FUSE: /dev/fuse does not exist (load the fuse module; in a container, "
                   "pass --device /dev/fuse --cap-add SYS_ADMIN)")
    if shutil.which("fusermount3") is None:
        out.append("FUSE 3's fusermount3 (Debian: apt-get install fuse3)")
    if os.geteuid() != 0:
        out.append("root: the harness mounts FUSE file systems and SIGSTOPs/SIGKILLs the "
                   "member processes Ray started (run it as root)")
    return out


class LazyFS:
    """A LazyFS mounted at ``mount`` over ``<work>/<name>.root``, run in the
    foreground as a child process (``stop`` unmounts it and waits for it)."""

    def __init__(self, binary: str, work: str, name: str, mount: str, cache: str = "2gb"):
        self.binary, self.mount, self.name = binary, os.path.abspath(mount), name
        base = os.path.join(os.path.abspath(work), name)
        self.root, self.config = base + ".root", base + ".toml"
        self.fifo, self.done, self.log = base + ".fifo", base + ".done.fifo", base + ".log"
        self.cache = cache
        self.proc: subprocess.Popen | None = None
        self._cmd_lock = threading.Lock()
        self._done_fd: int | None = None

    def start(self, timeout_s: float = 20.0) -> "LazyFS":
        for p in (self.root, self.mount):
            os.makedirs(p, exist_ok=True)
        for p in (self.fifo, self.done, self.log):
            if os.path.exists(p):
                os.unlink(p)
        with open(self.config, "w") as f:
            f.write(CONFIG.format(fifo=self.fifo, done=self.done, log=self.log, cache=self.cache))
        # LazyFS opens the completion FIFO once, for writing, and blocks until a
        # reader has it open; a reader that goes away would get LazyFS a SIGPIPE
        # at its next answer. So it is held open (non-blocking) for LazyFS's life.
        os.mkfifo(self.done)
        self._done_fd = os.open(self.done, os.O_RDONLY | os.O_NONBLOCK)
        self.proc = subprocess.Popen(
            [self.binary, self.mount, "--config-path", self.config, "-o", "allow_other",
             "-o", "modules=subdir", "-o", f"subdir={self.root}", "-f"],
            stdout=open(self.log + ".out", "w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while not (os.path.ismount(self.mount) and os.path.exists(self.fifo)):
            if self.proc.poll() is not None:
                raise RuntimeError(f"LazyFS exited with {self.proc.returncode} while mounting "
                                   f"{self.mount}: see {self.log}.out")
            if time.monotonic() > deadline:
                raise RuntimeError(f"LazyFS did not mount {self.mount} in {timeout_s}s")
            time.sleep(0.05)
        return self

    def _command(self, cmd: str) -> None:
        with open(self.fifo, "w") as f:
            f.write(cmd + "\n")

    def unsynced_bytes(self) -> int | None:
        """Bytes written and not fsync-ed (LazyFS's report, read from its log)."""
        with self._cmd_lock:
            start = os.path.getsize(self.log) if os.path.exists(self.log) else 0
            self._command("lazyfs::unsynced-data-report")
            deadline = time.monotonic() + 10
            pat = re.compile(r"total number of bytes un-fsynced: (\d+) bytes")
            while time.monotonic() < deadline:
                with open(self.log, errors="replace") as f:
                    f.seek(start)
                    m = pat.search(f.read())
                if m:
                    return int(m.group(1))
                time.sleep(0.02)
        return None

    def clear_cache(self, timeout_s: float = 30.0) -> None:
        """Drop every unsynced write (a power loss), and wait until LazyFS says so."""
        with self._cmd_lock:
            self._command("lazyfs::clear-cache")
            buf, deadline = b"", time.monotonic() + timeout_s
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self._done_fd], [], [], left)[0]:
                    raise RuntimeError(f"LazyFS at {self.mount} did not confirm clear-cache "
                                       f"within {timeout_s}s; see {self.log}")
                try:
                    chunk = os.read(self._done_fd, 4096)
                except BlockingIOError:
                    continue
                if not chunk:  # no writer yet (LazyFS still starting): wait
                    time.sleep(0.01)
                buf += chunk
        if buf.strip() != b"finished::clear-cache":
            raise RuntimeError(f"LazyFS at {self.mount} answered {buf!r} to clear-cache")

    def stop(self) -> None:
        if self.proc is None:
            return
        subprocess.run(["fusermount3", "-u", "-z", self.mount], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None
        if self._done_fd is not None:
            os.close(self._done_fd)
            self._done_fd = None


def unmount_under(work: str) -> list[str]:
    """Unmount LazyFS mounts left under ``work`` by a run that died (before
    the folder is emptied: removing files through a live mount would reach
    LazyFS's root)."""
    work = os.path.abspath(work) + os.sep
    gone = []
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 2 and parts[2] == "fuse.lazyfs" and parts[1].startswith(work):
                subprocess.run(["fusermount3", "-u", "-z", parts[1]], check=False)
                gone.append(parts[1])
    return gone
