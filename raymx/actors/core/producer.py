"""The producer's decisions: when to pull, what a pull's answer means (pure).

A secondary's producer pulls from its sync source, checks each batch and
writes it unapplied; the shell (``raymx.actors.producer.Producer``: a thread
and Ray calls) and the simulation carry out what ``ProducerCore`` decides:

* ``blocked()``: do not pull now (paused; no source; a resync is due; an
  initial sync is loading; or a newer term is known than the one it was told
  to follow in: the source may be a deposed primary, so wait for the
  coordinator's ``follow`` in the new term, Raft's "entries only from the
  leader of your current term": the ``stale_sync_source`` bug);
* ``request()``: the pull's fields (its last entry and hash, positions,
  term, the majority point it knows);
* ``on_answer()``: one of ``WRITE`` (check and write the rows, then sync
  before the next pull reports them), ``IDLE`` (nothing new: pull again),
  ``ROLLBACK`` (diverged: find the common point, undo past it), ``RETRY``
  (wait ``RETRY_MS`` and pull again; a resync mark is persisted first when
  the source trimmed past this member);
* ``on_failure()``: how long to wait after a failed step (a pull or a
  ``find_common`` that failed or timed out): never give up, a producer that
  stops leaves the member behind forever (the ``producer_thread_dies`` bug).

``run()`` is the producer's loop itself, shared by the Ray shell and the
simulation: a generator that yields each effect it needs (a pull, a
``find_common``, a sleep, a sync, taking or releasing the producer's write
lock, holding the applier) and is resumed with its result; a call that
failed or timed out is thrown back into it as ``CallFailed``. The shell
carries the effects out with a thread and Ray calls, the simulation with
timers and simulated calls; the order of every step is the same code.
"""
from __future__ import annotations

from typing import Generator, NamedTuple, Protocol

from raymx import errors
from raymx.actors.core import replication as rep
from raymx.actors.core.member import RECOVERING, RESYNC, RUNNING
from raymx.storage.engine import Engine
from raymx.storage.gtid import GTID, ZERO
from raymx.storage.limits import Limits

WRITE, IDLE, ROLLBACK, RETRY = "write", "idle", "rollback", "retry"
RETRY_MS = 200          # after a refusing answer
FAILURE_MS = 100        # after a failed or timed-out call
BATCH_REFUSED_MS = 500  # after a batch that did not check


class ProducerCore:
    def __init__(self, engine: Engine, member_id: int, limits: Limits):
        self.e = engine
        self.member_id = member_id
        self.limits = limits
        self.source: int | None = None
        self.term = 0          # the term it was told to follow in
        self.paused = True     # starts paused: the coordinator says whom to follow
        self.state = RUNNING   # running / recovering / resync (told to the shard)
        self.error: str | None = None
        # the majority-committed point learned from the sync source
        self.majority: GTID | None = engine.range().majority

    def follow(self, source: int, term: int) -> None:
        self.source, self.term = source, term
        self.paused = False

    def current(self) -> bool:
        """Was it told whom to follow in the newest term this member knows?"""
        return self.term >= self.e.term

    def blocked(self) -> bool:
        return (self.paused or self.source is None or not self.current()
                or bool(self.e.get_meta("needs_resync"))
                or self.e.get_meta("initial_sync") is not None)

    def request(self, downstream: dict) -> tuple[dict, GTID, int]:
        """The pull's fields, and the last entry (GTID, hash) they were made at."""
        last, last_h = self.e.last()
        lim = self.limits
        req = {"after": list(last), "after_h": last_h if last != ZERO else None,
               "max_entries": lim.pull_entries_max, "max_bytes": lim.pull_bytes_max,
               "wait_ms": lim.pull_wait_ms, "member": self.member_id,
               "durable": list(last) if last != ZERO else None,
               "applied": list(rep.applied_point(self.e)), "downstream": downstream,
               "term": max(self.term, self.e.term),
               "majority": None if self.majority is None else list(self.majority)}
        return req, last, last_h

    def on_answer(self, out: dict, last: GTID) -> tuple[str, GTID | None]:
        """What to do with a pull's answer; also whether it taught a newer
        majority point (returned, for the shard and chained members)."""
        status = out["status"]
        if status == "ok" and (out.get("term", 0) < self.e.term or not self.current()):
            # never take entries from a deposed primary, nor from a source chosen
            # in an older term than this member knows (learned while pulling)
            status = "stale_term"
        learned = None
        if status == "ok":
            mj = out.get("majority")
            if mj is not None and (self.majority is None or GTID(*mj) > self.majority):
                self.majority = learned = GTID(*mj)
            # the source holds our last entry (even with nothing new): confirmed
            self.state = RUNNING
        if status == "diverged":
            self.state = RECOVERING  # reads stop before anything is undone
            return ROLLBACK, learned
        if status != "ok":
            self.state = RESYNC if status == "too_stale" else RECOVERING
            if status == "too_stale":
                self.e.put_meta("needs_resync", f"sync source trimmed past {last}")
            self.error = f"sync source {self.source} says {status}: {out.get('reason') or out}"
            return RETRY, learned
        return (WRITE if out["rows"] else IDLE), learned

    def write(self, out: dict, last: GTID, last_h: int) -> tuple[GTID | None, int]:
        """Check the answer's rows against this member's last entry and write
        them unapplied (the caller syncs before the next pull reports them).
        Raises the check's error (the caller waits ``BATCH_REFUSED_MS``)."""
        batch = rep.check_batch(last, last_h, out["rows"], self.limits)
        g = rep.write_batch(self.e, batch)
        self.error = None
        return g, len(batch)

    def on_failure(self, what: str) -> int:
        """A step failed (the source is restarting, cut off, or gone): wait this
        long and go on from the pull."""
        self.error = what
        return FAILURE_MS


# --- the loop ---------------------------------------------------------------
class Pull(NamedTuple):
    """Ask ``source`` for entries; resumes with its answer, or ``None`` when
    the producer was told to follow another source (or paused) meanwhile."""
    source: int
    req: dict


class FindCommon(NamedTuple):
    """Ask ``source`` which of these (GTID, hash) pairs it holds; resumes with
    the newest it holds (a GTID as a list) or ``None``."""
    source: int
    candidates: list


class Sleep(NamedTuple):
    ms: int


SYNC = "sync"                 # engine.sync(): durable before the next pull reports it
LOCK, UNLOCK = "lock", "unlock"  # the producer's write lock (pause(wait=True) waits for it)
HOLD_APPLIER, RELEASE_APPLIER = "hold_applier", "release_applier"  # during a rollback
BLOCKED = "blocked"           # blocked(): wait for follow() or a while


class CallFailed(Exception):
    """A pull or ``find_common`` failed or timed out (thrown into the loop)."""


class ProducerIO(Protocol):
    """What the loop tells its shell (none of these block)."""

    def downstream(self) -> dict: ...          # positions of members syncing from this one
    def learned(self, g: GTID) -> None: ...    # a newer majority point from the source
    def state(self, state: str) -> None: ...   # running / recovering / resync, for the shard
    def written(self, g: GTID, n: int, rows: list) -> None: ...  # a batch is durable
    def rollback_file(self, common: GTID) -> tuple[str, object]: ...  # (where, write_records)
    def rolling_back(self, source: int, common: GTID) -> None: ...
    def rolled_back(self, common: GTID, n: int, where: str) -> None: ...
    def failed(self, e: Exception) -> None: ...  # a step failed; the loop waits and goes on


Effect = Pull | FindCommon | Sleep | str


def run(core: ProducerCore, io: ProducerIO, hashes_per_round: int = 1000
        ) -> Generator[Effect, object, None]:
    """The producer's loop: pull, check, write unapplied, sync, tell; roll
    back on ``diverged``. A ``DiskFailed`` leaves it (the caller stops the
    process: never report unsynced entries as durable); every other failed
    step waits ``on_failure()`` and pulls again."""
    while True:
        if core.blocked():
            yield BLOCKED
            continue
        src = core.source
        req, last, last_h = core.request(io.downstream())
        try:
            out = yield Pull(src, req)
        except CallFailed as e:
            yield Sleep(core.on_failure(f"sync source {src} unreachable: {e}"))
            continue
        if out is None:
            continue  # told to follow another source meanwhile: pull from it now
        yield LOCK
        try:
            if not core.paused:  # paused while pulling: write nothing more
                yield from _step(core, io, out, src, last, last_h, hashes_per_round)
        except errors.DiskFailed:
            raise
        except Exception as e:  # a failed step (find_common, a full disk): report, retry
            yield UNLOCK
            io.failed(e)
            yield Sleep(core.on_failure(f"{type(e).__name__}: {e}"))
            continue
        yield UNLOCK


def _step(core: ProducerCore, io: ProducerIO, out: dict, src: int, last: GTID, last_h: int,
          hashes_per_round: int):
    step, learned = core.on_answer(out, last)
    if learned is not None:
        io.learned(learned)
    io.state(core.state)
    if step == ROLLBACK:
        yield from _roll_back(core, io, src, hashes_per_round)
    elif step == RETRY:
        yield Sleep(RETRY_MS)
    elif step == WRITE:
        try:
            g, n = core.write(out, last, last_h)
        except errors.DiskFailed:
            raise
        except errors.RaymxError as e:
            core.error = f"batch refused: {e}"
            io.failed(e)
            yield Sleep(BATCH_REFUSED_MS)
            return
        yield SYNC  # durable before the next pull reports it upstream
        io.written(g, n, out["rows"])


def _roll_back(core: ProducerCore, io: ProducerIO, src: int, hashes_per_round: int):
    """Find the common point with the source, undo past it, truncate."""
    e = core.e
    before, common = None, None
    while common is None:
        cands = rep.own_hashes(e, before, hashes_per_round)
        if not cands:
            common = ZERO
            break
        g = yield FindCommon(src, cands)
        common = None if g is None else GTID(*g)
        before = GTID(*cands[-1][0])
    io.rolling_back(src, common)
    where, write_records = io.rollback_file(common)
    yield HOLD_APPLIER  # the applier must not apply while entries are undone
    try:
        n = rep.rollback_to(e, common, core.limits.rollback_ops_max, write_records)
    except errors.IrreversibleOp as x:
        e.put_meta("needs_resync", str(x))
        core.state, core.error = RESYNC, str(x)
        io.state(core.state)
        io.failed(x)
        yield RELEASE_APPLIER
        return
    except Exception:
        yield RELEASE_APPLIER
        raise
    yield SYNC
    yield RELEASE_APPLIER
    io.rolled_back(common, n, where)
