"""Small helpers shared by the benchmarks: timing and a progress line."""
import sys
import time


def rate(n, fn, label=""):
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    return n / dt


def progress(msg):
    print(f"  .. {msg}", file=sys.stderr, flush=True)


def row(name, value, unit="", extra=""):
    print(f"{name:<58} {value:>12,.0f} {unit:<8} {extra}", flush=True)
