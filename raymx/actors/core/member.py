"""A member's role, term and configuration decisions (pure).

``MemberCore`` is what the election coordinator talks to: heartbeats carry
terms, ``follow``/``step_down``/``become_primary`` change the role,
``set_config`` the configuration. It persists what must survive a crash
through the engine (the term, the configuration) before answering, and
returns what the shell must do next (step down the serving side); the shell
(``raymx.actors.member.OplogShard``) owns the actors it calls and the
locks; the simulation (``tests/sim.py``) drives the same methods.

``serving`` and ``lead_term`` are the write side's view (the shell's
``ShardService.primary`` and its GTID manager's term): a commit that finds a
newer term clears ``serving`` alone, so the role decides whether a member
still has to step down fully (the ``deposed_role_stuck`` bug).
"""
from __future__ import annotations

from typing import Generator

from raymx.storage.engine import Engine
from raymx.storage.gtid import GTID

# sync states of a secondary (see ``state``)
RUNNING, RECOVERING, RESYNC, SYNCHRONIZING = "running", "recovering", "resync", "synchronizing"

# the steps of a promotion (``MemberCore.promote``), in order; the shell and
# the simulation carry each out
PAUSE_PRODUCER = "pause_producer"  # no batch is written after this one (pause(wait=True))
DRAIN = "drain"                    # everything written is applied
FEEDER_PRIMARY = "feeder_primary"  # the feeder ships only what the primary synced
TAKE_WRITES = "take_writes"        # ShardService.become_primary(term): a DiskFailed
#                                    from its sync stops the process
NOOP = "noop"                      # queue the new term's no-op entry (not waited for)
DURABLE = "durable"                # the feeder may ship up to the last entry

# a member that refused a write for a full disk within this long says so in its
# heartbeats (``reply``): a primary that does hands over to a member with room
DISK_FULL_WINDOW_MS = 2_000


def run_steps(steps: Generator, do) -> object:
    """Carry out a generator of steps in order (``do(step)`` answers each);
    its return value."""
    answer = None
    while True:
        try:
            step = steps.send(answer)
        except StopIteration as stop:
            return stop.value
        answer = do(step)


def start_config(engine: Engine, member_id: int, spec: dict, votes: dict) -> tuple[dict, dict]:
    """The member's own spec and the set's votes ({id: votes}) a starting
    member runs with: those of the configuration it holds durably, when it
    holds one, else ``spec`` and ``votes``, those it was created with. Ray
    restarts an actor with the arguments it was first created with, which
    predate every configuration installed since: a member added while it
    caught up (no vote), or launched in a smaller set, would otherwise count
    majorities over a membership that is gone (a majority never reached, or
    one reached too early: an acknowledged write a failover loses), and show
    the vote, priority, hidden flag and delay it was created with. A newer
    configuration still comes from the coordinator (``set_config``)."""
    cfg = engine.get_meta("rs_config")
    if not cfg or not cfg.get("members"):
        return dict(spec), {int(k): v for k, v in votes.items()}
    mine = next((m for m in cfg["members"] if m["id"] == member_id), None)
    return (dict(spec) if mine is None else dict(mine),
            {m["id"]: m.get("votes", 1) for m in cfg["members"]})


class MemberCore:
    def __init__(self, engine: Engine, member_id: int):
        self.e = engine
        self.member_id = member_id
        self.role = "secondary"
        self.following: list | None = None  # [source, term] as follow() set it
        cfg = engine.get_meta("rs_config") or {}
        self.config_version: int = cfg.get("version", 0)
        # a secondary serves reads only once a sync source confirmed its last
        # entry (after each start, step-down, follow and rollback): until then
        # its data may be a diverged branch
        self.sync_state = RESYNC if engine.get_meta("needs_resync") else RECOVERING
        self.synchronizing = engine.get_meta("initial_sync") is not None
        # the primary's last entry when it became primary or installed the
        # current configuration: every write acknowledged before is at most this
        self.fence: GTID | None = None
        self._refusals = engine.store.disk_refusals  # as of the last heartbeat
        self._full_ms: int | None = None  # when a heartbeat first saw that count move

    # --- terms and roles -------------------------------------------------
    def is_primary(self, serving: bool) -> bool:
        return self.role == "primary" or serving

    def learn_term(self, term: int, serving: bool, lead_term: int) -> bool:
        """Record a higher term durably; True if this member must step down."""
        if term > self.e.term:
            self.e.set_term(term)  # synced before the answer
            if self.role != "primary" and self.sync_state == RUNNING:
                # entries from the old term's primary may not be on the new
                # primary's branch: no reads until a source of this term confirms
                self.sync_state = RECOVERING
        return term >= self.e.term and self.is_primary(serving) and term > lead_term

    def heartbeat(self, term: int, serving: bool, lead_term: int) -> bool:
        """The coordinator's heartbeat; True if this member must step down: a
        newer term, or deposed between heartbeats (a pull or a commit saw a
        higher term), so the coordinator elects again instead of waiting on it."""
        down = self.learn_term(term, serving, lead_term)
        return down or (self.role == "primary" and (not serving or self.e.term > lead_term))

    def step_down(self, term: int, serving: bool, lead_term: int) -> bool:
        """``step_down`` or ``follow`` from the coordinator: learn ``term``; True
        if this member must step down first (a follower then points its
        producer at the source and calls ``following_now``)."""
        self.learn_term(term, serving, lead_term)
        return self.is_primary(serving)

    def follow(self, term: int, source: int | None, serving: bool, lead_term: int) -> bool:
        return self.step_down(term, serving, lead_term)

    def following_now(self, source: int, term: int) -> None:
        self.following = [source, term]

    def became_primary(self, last: GTID) -> bool:
        """The member took its term's writes, its oplog ending at ``last``.
        True: write a no-op entry under the new term now. A primary calls
        majority-committed only entries of its own term (``committed``), so
        without one its majority point (majority reads, change streams,
        trimming) would wait for the first client write."""
        self.role = "primary"
        self.following = None
        self.fence = last  # every committed entry is at most this
        return True

    def promote(self, term: int) -> Generator[tuple, object, GTID]:
        """A member becoming primary in ``term``: the steps, in their order
        (each a (step, argument) pair). Nothing is written under the new term
        before the term is durable, and the feeder leaves "ship the written
        oplog" mode before any such write can commit: unsynced entries must
        never ship. Raises ``StaleTerm`` if a newer term is known."""
        yield PAUSE_PRODUCER, None
        yield DRAIN, None
        self.e.set_term(term)  # durable before the first write under it
        yield FEEDER_PRIMARY, None
        yield TAKE_WRITES, term
        last, _ = self.e.last()  # synced by TAKE_WRITES
        if self.became_primary(last):
            yield NOOP, None
        yield DURABLE, last
        return last

    def became_secondary(self) -> None:
        self.following = None
        self.sync_state = RECOVERING  # it may hold writes the new primary lacks
        self.role = "secondary"

    def on_sync_state(self, state: str) -> None:
        """The producer's view: "running" once a pull from its sync source
        confirmed this member's last entry; "recovering" or "resync" when not."""
        if self.role != "primary" and state in (RUNNING, RECOVERING, RESYNC):
            self.sync_state = state

    def state(self) -> str:
        """running; synchronizing (initial sync: never elected, see DESIGN 4);
        resync; recovering (a secondary whose position no sync source has
        confirmed since it started, stepped down or rolled back: it may be
        elected, it serves no reads)."""
        if self.synchronizing or self.e.get_meta("initial_sync") is not None:
            return SYNCHRONIZING
        if self.e.get_meta("needs_resync"):
            return RESYNC
        return RUNNING if self.role == "primary" else self.sync_state

    def read_refusal(self) -> str | None:
        """Why reads are refused here now (memory only: it runs on every read)."""
        if self.role == "primary":
            return None
        if self.synchronizing:
            return SYNCHRONIZING
        return None if self.sync_state == RUNNING else self.sync_state

    def reply(self, lead_term: int, now_ms: int) -> dict:
        """The heartbeat's answer (the shell adds its own fields). ``disk_full``:
        this process refused a write for a full disk in the last
        ``DISK_FULL_WINDOW_MS``; ``disk_free``: the room left on its disk."""
        last, h = self.e.last()
        n = self.e.store.disk_refusals
        if n != self._refusals:
            self._refusals, self._full_ms = n, now_ms
        full = self._full_ms is not None and now_ms - self._full_ms < DISK_FULL_WINDOW_MS
        return {"term": self.e.term, "last": list(last), "h": h, "role": self.role,
                "following": self.following, "state": self.state(),
                "config_version": self.config_version,
                "lead_term": lead_term if self.role == "primary" else None,
                "disk_full": full, "disk_free": self.e.store.free_bytes()}

    # --- configuration -----------------------------------------------------
    def set_config(self, config: dict, serving: bool) -> bool:
        """A newer configuration, kept durably (a restarted coordinator rebuilds
        the newest one from the members); False if it is not newer. The shell
        then applies its votes (majorities follow at once)."""
        cur = self.e.get_meta("rs_config")
        if cur is not None and cur["version"] >= config["version"]:
            return False
        self.e.put_meta("rs_config", config)
        self.e.sync()
        self.config_version = config["version"]
        if self.is_primary(serving):
            # writes acknowledged under the configuration before are at most this
            self.fence = self.e.last()[0]
        return True
