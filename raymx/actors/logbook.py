"""What ``raymx logs`` shows: each member process keeps its last WARNING and
higher records of the ``raymx`` loggers in a small ring (``install``), served
by a Ray method of its actor (``records``); and each member's rollbacks,
from the rollback files in its folder (``rollbacks``: these survive restarts,
the ring does not).

Ray also writes every actor's stderr to the session's log files, but those
are on each node's disk, reachable through ``ray.util.state`` only when the
dashboard runs: a ring in the process itself answers wherever the actor does.
"""
from __future__ import annotations

import collections
import glob
import logging
import os
import threading
import time

RING = 200  # records kept per process
_lock = threading.Lock()
_ring: collections.deque = collections.deque(maxlen=RING)
_installed: dict = {}


class _RingHandler(logging.Handler):
    def __init__(self, who: dict):
        super().__init__(logging.WARNING)
        self.who = who

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                e = record.exc_info[1]
                msg += f" ({type(e).__name__}: {e})"  # the one line, not the traceback
            _ring.append(dict(self.who, ts=record.created, level=record.levelname,
                              logger=record.name, msg=msg, pid=os.getpid()))
        except Exception:  # never let logging break the member
            pass


def install(rs: str, member, role: str) -> None:
    """Keep this process's WARNING+ records of the ``raymx`` loggers (once
    per process; the last caller names the records)."""
    with _lock:
        h = _installed.get("handler")
        who = {"set": rs, "member": member, "role": role or "shard"}
        if h is None:
            h = _installed["handler"] = _RingHandler(who)
            lg = logging.getLogger("raymx")
            if not logging.getLogger().handlers and not lg.handlers:
                # nothing else is configured (Ray's workers): Python printed these
                # records to stderr (Ray's worker-*.err files) by its last-resort
                # handler, which a handler of ours would silence; keep doing so
                lg.addHandler(logging.StreamHandler())
                lg.handlers[-1].setLevel(logging.WARNING)
            lg.addHandler(h)
            if lg.getEffectiveLevel() > logging.WARNING:
                lg.setLevel(logging.WARNING)
        else:
            h.who = who


def records() -> list[dict]:
    """This process's kept records, oldest first."""
    return list(_ring)


def rollbacks(path: str) -> list[dict]:
    """The member's rollbacks, oldest first, from the ``rollback-<ms>.jsonl``
    files the producer writes (one record per undone operation)."""
    out = []
    for f in glob.glob(os.path.join(path, "rollback-*.jsonl")):
        try:
            ms = int(os.path.basename(f)[len("rollback-"):-len(".jsonl")])
            with open(f, "rb") as fh:
                ops = sum(1 for _ in fh)
        except (ValueError, OSError):
            continue
        out.append({"ts": ms / 1000, "file": f, "ops": ops})
    return sorted(out, key=lambda r: r["ts"])


def fmt_time(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts)) + f".{int(ts * 1000) % 1000:03d}Z"
