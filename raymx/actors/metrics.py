"""Prometheus metrics through ``ray.util.metrics`` (a Ray shell: Ray's metrics
agent serves them on each node's metrics export port, no new dependency).

Every series carries the tags ``set`` and ``member``. The coordinator
publishes them every ``PERIOD_S`` from a thread of its own, from the one
status round that also gives lag against the primary and elections (so no
member computes its status twice, and nothing runs on a write path).
Counters are published as the difference to the last published total.
"""
from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("raymx.metrics")

PERIOD_S = 2.0

# name -> (kind, description); kind "gauge" or "counter"
SERIES = {
    "primary": ("gauge", "1 on the primary, 0 on a secondary"),
    "serving_reads": ("gauge", "1 while the member serves reads (not recovering, resync or "
                               "synchronizing)"),
    "term": ("gauge", "the member's durable term"),
    "last_seq": ("gauge", "seq of the last oplog entry written"),
    "durable_seq": ("gauge", "seq of the last entry known durable (synced)"),
    "applied_seq": ("gauge", "seq of the last entry applied to the collections"),
    "oplog_bytes": ("gauge", "bytes in the live oplog"),
    "oplog_window_seconds": ("gauge", "time between the oplog's first and last entries"),
    "commits": ("counter", "transactions committed on this member as primary"),
    "syncs": ("counter", "LMDB syncs (group commits) on this member as primary"),
    "trimmed_entries": ("counter", "oplog entries trimmed"),
    "lag_entries": ("gauge", "entries the member's applied state is behind the primary"),
    "lag_seconds": ("gauge", "commit-time lag of the member's applied state behind the primary"),
    "up": ("gauge", "1 if the coordinator reached the member in its last status round"),
    "elections": ("counter", "elections won (per winning member)"),
}


class Publisher:
    """One metric family per name; ``publish(member, values)`` sets gauges and
    advances counters to the given totals."""

    def __init__(self, rs: str, spec: dict):
        from ray.util.metrics import Counter, Gauge
        self.rs = rs
        self._spec = spec
        self._m = {}
        for name, (kind, desc) in spec.items():
            cls = Gauge if kind == "gauge" else Counter
            full = f"raymx_{name}" + ("_total" if kind == "counter" else "")
            self._m[name] = cls(full, description=desc, tag_keys=("set", "member"))
        self._last: dict[tuple, float] = {}

    def publish(self, member, values: dict) -> None:
        tags = {"set": self.rs, "member": str(member)}
        for name, v in values.items():
            if v is None or name not in self._m:
                continue
            if self._spec[name][0] == "gauge":
                self._m[name].set(float(v), tags=tags)
                continue
            key = (name, str(member))
            delta = float(v) - self._last.get(key, 0.0)
            if delta < 0:  # the process behind the total restarted
                delta = float(v)
            if delta:
                self._m[name].inc(delta, tags=tags)
            self._last[key] = float(v)


def run_every(period_s: float, fn, stop: threading.Event, name: str) -> threading.Thread:
    """Call ``fn`` every ``period_s`` until ``stop``; its errors are logged once."""
    def loop():
        failed = False
        while not stop.wait(period_s):
            try:
                fn()
                failed = False
            except Exception:
                if not failed:
                    log.exception("publishing %s metrics failed", name)
                failed = True
    t = threading.Thread(target=loop, name=f"raymx-metrics-{name}", daemon=True)
    t.start()
    return t


def seq(g) -> int | None:
    return None if g is None else g[1]


def member_values(s: dict) -> dict:
    """A member's figures from its ``status()``."""
    ol = s.get("oplog") or {}
    return {"primary": 1 if s.get("role") == "primary" else 0,
            "serving_reads": 1 if s.get("state") in ("running", "paused") else 0,
            "term": s.get("term"), "last_seq": seq(s.get("last")),
            "durable_seq": seq(s.get("durable")), "applied_seq": seq(s.get("applied")),
            "oplog_bytes": ol.get("bytes"), "oplog_window_seconds": ol.get("window_s"),
            "commits": s.get("commits"), "syncs": s.get("syncs"),
            "trimmed_entries": s.get("trimmed")}


# --- latency histograms (recorded in the members' processes) ---------------
# Bucket bounds in milliseconds. Few buckets and one small label keep the
# series count tiny: (set, member) and, for commits, the write concern class.
COMMIT_BOUNDS_MS = [0.25, 0.5, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 10000]
REPLICATION_BOUNDS_MS = [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 10000, 60000]
FLUSH_S = 1.0
PENDING_MAX = 100_000  # values waiting for the flush thread; past it the oldest are dropped
# ``Histogram.observe`` costs ~3-4 us (measured in a Ray worker here); past this
# many values in one flush, a uniform sample of this many is observed (the
# quantiles hold, ``_count`` then counts the sample: raymx_commits_total counts all)
OBSERVE_MAX = 2_000


class Latencies:
    """A ``ray.util.metrics.Histogram`` fed in batch. ``add`` on a hot path
    appends a float to a list per label value (no lock, no Ray call; floats
    are not tracked by the garbage collector, so a second's worth of them
    costs it nothing); a daemon thread observes what accumulated every
    ``FLUSH_S``, at most ``OBSERVE_MAX`` values (a uniform sample past that).
    Values past ``PENDING_MAX`` waiting are dropped, never the writer slowed.
    The flush takes a list's first n values and deletes them (``del l[:n]``,
    atomic under the GIL): values appended meanwhile stay for the next one."""

    def __init__(self, name: str, description: str, bounds_ms: list, rs: str, member: int,
                 label: str | None = None, values: tuple = (None,)):
        from ray.util.metrics import Histogram
        keys = ("set", "member") + ((label,) if label else ())
        self._h = Histogram(f"raymx_{name}", description=description, boundaries=bounds_ms,
                            tag_keys=keys)
        base = {"set": rs, "member": str(member)}
        self._tags = {v: dict(base, **({label: v} if label else {})) for v in values}
        self.pending: dict[str | None, list] = {v: [] for v in values}
        self.observed = 0
        self.unobserved = 0  # left out of a sample, or dropped
        self._stop = threading.Event()
        run_every(FLUSH_S, self.flush, self._stop, name)

    def add(self, ms: float, cls: str | None = None) -> None:
        vals = self.pending[cls]
        if len(vals) < PENDING_MAX:
            vals.append(ms)
        else:
            self.unobserved += 1

    @staticmethod
    def _take(vals: list) -> list:
        n = len(vals)
        out = vals[:n]
        del vals[:n]
        return out

    def _sample(self, values: list, most: int) -> list:
        if len(values) <= most:
            return values
        import random
        self.unobserved += len(values) - most
        return random.sample(values, most)

    def flush(self) -> int:
        """Observe the pending values (the flush thread; tests call it too)."""
        taken = {cls: self._take(vals) for cls, vals in self.pending.items()}
        total = sum(len(v) for v in taken.values()) or 1
        n = 0
        for cls, vals in taken.items():  # the sample shared in proportion
            tags = self._tags[cls]
            for ms in self._sample(vals, max(1, OBSERVE_MAX * len(vals) // total)):
                self._h.observe(ms if ms > 0 else 0.0, tags=tags)
                n += 1
        self.observed += n
        return n

    def stop(self) -> None:
        self._stop.set()


WC_CLASSES = ("w1", "j", "majority")


def wc_class(req: dict) -> str:
    """A write's write concern class: ``majority`` for any w above 1 (a
    number or "majority": it waits for other members), ``j`` for a journaled
    write acknowledged by this member alone, else ``w1``."""
    w = req.get("w", 1)
    if w not in (0, 1, None):
        return "majority"
    return "j" if req.get("j") else "w1"


class CommitLatency(Latencies):
    """Commit latency on the primary: from a write's arrival at the member's
    shard service (``ShardService.handle``, after its frame is decoded) to its
    acknowledgement (the successful reply), per write concern class. A
    transaction counts once, from its ``txnCommit``; refused and failed writes
    are not counted."""

    def __init__(self, rs: str, member: int):
        super().__init__("commit_latency_ms", "write arrival to acknowledgement on the "
                         "primary, ms, per write concern class (w1, j, majority)",
                         COMMIT_BOUNDS_MS, rs, member, label="wc", values=WC_CLASSES)

    def timed(self, op, req: dict, reply):
        """``reply`` wrapped to record the latency of its success, for a write
        that commits (an autocommit write or ``txnCommit``); else ``reply``."""
        if op == "txnBegin" or op == "txnAbort" or ("txn" in req and op != "txnCommit"):
            return reply
        t0, vals, mono = time.monotonic(), self.pending[wc_class(req)], time.monotonic

        def timed_reply(ok=None, err=None):
            if err is None and len(vals) < PENDING_MAX:
                vals.append((mono() - t0) * 1000.0)
            reply(ok=ok, err=err)
        return timed_reply


class ReplicationLatency(Latencies):
    """Replication latency on a secondary: from an entry's commit on the
    primary (its ``ts``, the primary's wall clock) to its durable write here
    (after the producer's sync), against this member's wall clock: clock skew
    between the nodes adds to it (a negative value counts as 0)."""

    def __init__(self, rs: str, member: int):
        super().__init__("replication_latency_ms", "entry commit on the primary (its ts) to "
                         "its durable write on this secondary, ms, by this node's clock",
                         REPLICATION_BOUNDS_MS, rs, member)

    def entries(self, rows: list, now_ms: float | None = None) -> None:
        """The pull answer's ``rows`` just synced: their latencies, from each
        entry's ``ts`` read in its first bytes (not decoded)."""
        now = time.time() * 1000.0 if now_ms is None else now_ms
        vals = self.pending[None]
        if len(vals) + len(rows) > PENDING_MAX:
            self.unobserved += len(rows)
            return
        for r in rows:
            ts = entry_ts(r[1])
            if ts is not None:
                vals.append(now - ts)


_TS_INLINE = b"\x83\xa2ts\xcf"   # {ts: uint64, h, ops}: how the engine writes an entry
_TS_SPILLED = b"\x84\xa2ts\xcf"  # {ts: uint64, h, ref, chunks}


def entry_ts(entry: bytes) -> int | None:
    """The ``ts`` of a stored oplog entry from its first bytes (None if unreadable)."""
    head = entry[:5]
    if (head == _TS_INLINE or head == _TS_SPILLED) and len(entry) >= 13:
        return int.from_bytes(entry[5:13], "big")
    from raymx.storage import codec
    try:
        return codec.entry_ts(entry)
    except Exception:
        return None
