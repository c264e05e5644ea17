"""Progress of long work (a snapshot copy, a catch-up, a backup): a tqdm bar
on a terminal; on anything else (a pipe, a CI log, a file) one plain line per
step, at most one every ``every_s`` seconds, and a last line when it ends.

``Progress`` (used by the CLI and by ``raymx.spark_bridge.initial_sync``'s
copies and catch-ups): ``Progress(label, total,
enabled=True, width=30)``, ``update(n, force=False)``, ``done`` (readable and
settable; ``update(0)`` then shows it), ``total``, ``close()``.
"""
from __future__ import annotations

import sys
import time


class Progress:
    """A tqdm bar on a TTY, else a log line per step; nothing if not ``enabled``."""

    def __init__(self, label: str, total: int | None, enabled: bool = True, width: int = 30,
                 file=None, unit: str = "", every_s: float = 2.0, tty: bool | None = None):
        self.label, self.enabled = label, enabled
        self.total = None if total is None else max(int(total), 1)
        self.file = file if file is not None else sys.stderr
        self.every_s = every_s
        self.t0 = time.monotonic()
        self._done = 0
        self._logged_at = None  # when the last line was written (no TTY)
        self._logged_done = None
        self._closed = False
        self._bar = None
        if tty is None:
            isatty = getattr(self.file, "isatty", None)
            tty = bool(isatty and isatty())
        self.tty = tty
        if enabled and tty:
            from tqdm import tqdm
            # ``width`` is the old bar's; tqdm fits the terminal's width itself
            self._bar = tqdm(total=self.total, desc=label, unit=unit or "it", file=self.file,
                             unit_scale=True, dynamic_ncols=True, leave=True, mininterval=0.2)
        elif enabled:
            self._line(force=True)

    @property
    def done(self) -> int:
        return self._done

    @done.setter
    def done(self, value: int) -> None:
        self._done = int(value)

    def update(self, n: int = 1, force: bool = False) -> None:
        """``n`` more done (0: show ``done`` as set)."""
        self._done += n
        if not self.enabled or self._closed:
            return
        if self._bar is not None:
            self._bar.n = self._done
            if force:
                self._bar.refresh()
            else:
                self._bar.update(0)  # tqdm redraws at most every mininterval
            return
        self._line(force)

    def step(self, label: str, total: int | None = None) -> None:
        """A new step of the same work (another phase): its label and total."""
        if self._bar is None and self.enabled and not self._closed \
                and self._done != self._logged_done:
            self._line(force=True)  # where the step before ended
        self.label, self._done, self.t0 = label, 0, time.monotonic()
        self.total = None if total is None else max(int(total), 1)
        if self._bar is not None and not self._closed:
            self._bar.set_description(label, refresh=False)
            self._bar.reset(total=self.total)
        elif self.enabled and not self._closed:
            self._logged_done = None
            self._line(force=True)

    def _line(self, force: bool = False, end: bool = False) -> None:
        now = time.monotonic()
        if not force and (self._done == self._logged_done or (
                self._logged_at is not None and now - self._logged_at < self.every_s)):
            return
        self._logged_at, self._logged_done = now, self._done
        el = now - self.t0
        rate = self._done / el if el > 0 else 0.0
        if self.total:
            f = min(1.0, self._done / self.total)
            what = f"{f * 100:5.1f}% {self._done:,}/{self.total:,}"
        else:
            what = f"{self._done:,}"
        self.file.write(f"{self.label}: {'done, ' if end else ''}{what} "
                        f"({el:.1f} s, {rate:,.0f}/s)\n")
        self.file.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.n = self._done
            self._bar.close()
        else:
            self._line(force=True, end=True)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
