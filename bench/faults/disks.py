"""A member's own small file system, and filling it: the disk-full fault of
``nemesis.py`` and of ``tests/test_failover.py`` (root only: a real tmpfs
mount, which every process of the member sees)."""
from __future__ import annotations

import os
import subprocess


def mount_tmpfs(path: str, mib: int) -> str | None:
    """A tmpfs of ``mib`` MiB at ``path`` (created); None, or why it cannot be."""
    if os.geteuid() != 0:
        return "mounting a tmpfs for a member's folder needs root"
    os.makedirs(path, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m,mode=0700", "tmpfs", path],
                       capture_output=True, text=True)
    return f"cannot mount a tmpfs: {r.stderr.strip()}" if r.returncode else None


def umount(path: str) -> None:
    subprocess.run(["umount", "-l", path], capture_output=True)


def fill(folder: str, name: str = "ballast") -> str:
    """A ballast file that takes every free block of ``folder``'s file system
    (a MiB at a time until ENOSPC); its path."""
    path = os.path.join(folder, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.posix_fallocate(fd, os.fstat(fd).st_size, 1 << 20)
    except OSError:
        pass
    finally:
        os.close(fd)
    return path
