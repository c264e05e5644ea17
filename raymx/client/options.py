"""A client's, a collection's or a call's options: where reads go
(``ReadPreference``), what they may see (``ReadConcern``) and what a write
waits for (``WriteConcern``)."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from raymx import errors
from raymx.storage.gtid import GTID
from raymx.storage.limits import READ_CONCERNS, write_concern_problem


@dataclass(frozen=True)
class WriteConcern:
    """``w``: members that must hold the entry durably (a number or
    "majority", the default, as MongoDB's since 5.0: no failover or power
    loss of a minority undoes an acknowledged write); ``j``: wait for the
    primary's sync (``w=1, j=True``: it survives the primary's power loss);
    ``wtimeout_ms``: give up waiting (the write stays committed).
    ``w=1`` alone answers at the primary's commit: fastest, and a failover
    before the secondaries pull it rolls it back."""

    w: int | str = "majority"
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
    writes on a secondary. With read concern ``"majority"`` it waits until
    the member knows that GTID majority-committed, so the majority snapshot
    holds it. ``max_staleness_s``: only members whose applied
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


def _wc_fields(base: WriteConcern, kw: dict) -> dict:
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


class ReturnDocument:
    """Which document ``find_one_and_update`` and ``find_one_and_replace``
    return (pymongo's names and values): the one ``BEFORE`` the change (the
    default) or ``AFTER`` it."""

    BEFORE = False
    AFTER = True
