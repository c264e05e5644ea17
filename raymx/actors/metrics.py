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
