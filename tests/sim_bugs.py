"""The protocol bugs the simulation found, as regressions of the shipped
code (``KNOWN_BUGS``, ``--regress``), and the planted bugs (``BROKEN``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from raymx.actors.core import replication as rep
from raymx.actors.core.election import ElectionCore
from raymx.actors.core import member as mc
from raymx.actors.core import producer as pc
from raymx.actors.core.member import MemberCore
from raymx.actors.core.primary import WriteConcernCore
from raymx.actors.sessions import SessionPath
from raymx.actors.shard import ShardService
from raymx.storage.gtid import GTID
from raymx.storage.overlay import Overlay


BROKEN = ("ack_before_durable", "reuse_term", "unsafe_reconfig", "dirty_reads", "fsync_retry",
          "blind_commit")


# --- the protocol bugs the simulation found, as regressions of the shipped cores
def _old_too_stale_by_term() -> list:
    orig = rep.FeederCore.pull

    def pull(self, after, after_h, max_entries, max_bytes):
        out = orig(self, after, after_h, max_entries, max_bytes)
        if out["status"] == "diverged" and after is not None:
            with self.e.store.read() as t:
                first = t.first("oplog")
            if first is not None and GTID(*after) < GTID.from_bytes(first[0]):
                return {"status": "too_stale", "first": list(GTID.from_bytes(first[0]))}
        return out
    return [(rep.FeederCore, "pull", pull)]


def _old_stale_write_concern() -> list:
    orig = WriteConcernCore.sweep
    return [(WriteConcernCore, "sweep",
             lambda self, now_ms, term, primary: orig(self, now_ms, 0, True)),
            (WriteConcernCore, "step_down", lambda self, member: [])]


def _old_election_not_fenced() -> list:
    return [(ElectionCore, "fence", lambda self, a: []),
            (ElectionCore, "fenced", lambda self, a, answers, now_ms: a.member)]


def _old_deposed_role_stuck() -> list:
    return [(MemberCore, "is_primary", lambda self, serving: serving),
            (MemberCore, "heartbeat", lambda self, term, serving, lead_term:
             self.learn_term(term, serving, lead_term))]


def _old_stale_sync_source() -> list:
    return [(pc.ProducerCore, "current", lambda self: True)]


def _old_majority_of_old_terms() -> list:
    from raymx.actors.core import primary
    orig = MemberCore.became_primary

    def old(point, term):
        return point  # any point durable on a majority
    return [(rep, "committed", old), (primary, "committed", old),
            (MemberCore, "became_primary", lambda self, last: orig(self, last) and False)]


def _old_catch_up_outlives_adoption() -> list:
    orig = ElectionCore._adopt

    def _adopt(self):
        was = self.catching_up
        orig(self)
        self.catching_up = was  # kept: no member was told to follow again
    return [(ElectionCore, "_adopt", _adopt)]


def _old_producer_thread_dies() -> list:
    orig = pc.ProducerCore.on_failure

    def on_failure(self, what):
        if "find_common" in what:
            raise RuntimeError(what)  # was outside the loop's try: the thread ended
        return orig(self, what)
    return [(pc.ProducerCore, "on_failure", on_failure)]


def _old_deposed_writes_held_noops() -> list:
    return [(ShardService, "_owes_unwritten", lambda self: True)]


def _old_behind_source_diverged() -> list:
    orig = rep.FeederCore.pull

    def pull(self, after, after_h, max_entries, max_bytes):
        out = orig(self, after, after_h, max_entries, max_bytes)
        if out["status"] == "behind":
            return {"status": "diverged", "reason": out["reason"]}
        return out
    return [(rep.FeederCore, "pull", pull)]


def _old_coordinator_took_old_config() -> list:
    def standing(self, version, specs):
        self.settled = True  # whatever it found at its restart, taken as the newest
        return None
    return [(ElectionCore, "config_standing", standing),
            (ElectionCore, "unsettled", lambda self, specs: [])]


def _old_restart_with_creation_votes() -> list:
    return [(mc, "start_config", lambda engine, member_id, spec, votes: (
        dict(spec), {int(k): v for k, v in votes.items()}))]


@dataclass(frozen=True)
class KnownBug:
    """A protocol bug the simulation found, fixed in the shipped cores.
    ``old()`` returns the monkeypatches that put the old behaviour back into
    the code path the shells and the simulation both run (``--regress NAME``);
    tests/test_simulation.py shows that the sweep catches it then."""

    name: str
    where: str
    what: str
    fix: str
    old: Callable[[], list]
    symptoms: tuple         # what the failure message says when it bites (any of)
    repro: tuple            # scenario names and/or seeds that fail with it put back
    also: tuple = ()        # other bugs it needs back to show (they would mask it)
    # faults its reproduction predates (switched off to replay it): every bug
    # here was found before members were removed and added (membership_p)
    off: tuple = ("membership_p",)


KNOWN_BUGS = {b.name: b for b in (
    KnownBug("too_stale_by_term", "raymx/actors/core/replication.py FeederCore.pull",
             "'after < first' compared GTIDs, term first: a member whose last entry is "
             "(1, 1) pulling from a source whose oplog starts at (2, 1) (another branch "
             "from seq 1) was told too_stale, not diverged, and marked itself needs_resync "
             "forever although nothing was trimmed",
             "compare seqs: too_stale only if after.seq < first.seq (seqs are dense "
             "across terms); otherwise answer diverged", _old_too_stale_by_term,
             ("resync=sync source trimmed past",), ("isolated_first_primary",)),
    KnownBug("stale_write_concern", "raymx/actors/core/primary.py WriteConcernCore",
             "write-concern waiters survived step-down and a newer term: a deposed primary "
             "rolled its write back and still acknowledged it w='majority' later, when "
             "members reported durable positions >= g (from their old copy or another "
             "branch)",
             "fail every waiting write with NotPrimary ('outcome unknown') on step-down "
             "and whenever the member's term passes the write's term; reset the positions",
             _old_stale_write_concern,
             ("majority-acknowledged write", "majority-committed point"), (141,),
             ("election_not_fenced", "stale_sync_source"), ("zombie_p", "bank_p")),
    KnownBug("election_not_fenced", "raymx/actors/core/election.py ElectionCore.fence/fenced",
             "an election read each member's last GTID and term from heartbeat replies "
             "sent up to a round earlier, and the new term was durable only on the winner "
             "before it took writes: a restarted coordinator could hand the same term to a "
             "second member (two primaries in one term), and the old primary kept getting "
             "w='majority' acknowledgements from members that did not know the new term",
             "fence first, as Raft's vote does: send the new term to every member that "
             "answers, wait for their last GTID as of after recording it, and choose the "
             "winner among those answers only; never reuse a term once sent",
             _old_election_not_fenced,
             ("two primaries accepted writes", "majority-acknowledged write"),
             ("coordinator_dies_mid_election",)),
    KnownBug("deposed_role_stuck", "raymx/actors/core/member.py MemberCore.is_primary/heartbeat",
             "a primary that learned a higher term through a pull had its write side "
             "(ShardService.primary) cleared by its next commit, but its role stayed "
             "'primary'; step_down/follow/_learn_term acted only on the write side's flag, "
             "so the member never stepped down and never converged",
             "decide on the role, not the write side's flag, and step down a member whose "
             "role is primary while its write side is deposed, at every heartbeat",
             _old_deposed_role_stuck, ("role=primary shard_primary=False",),
             (147,), ("stale_sync_source",), ("bank_p",)),
    KnownBug("stale_sync_source", "raymx/actors/core/producer.py ProducerCore.current",
             "after a member learned a new term, its producer kept pulling from the sync "
             "source it was given for the old term and accepted the entries: the old "
             "primary's branch became 'majority durable' while the new primary lacked it",
             "a producer pulls, and takes entries, only while its follow() term is the "
             "member's term (Raft: entries only from the leader of your current term)",
             _old_stale_sync_source,
             ("majority-acknowledged write", "majority-committed point"), (141,),
             ("election_not_fenced", "stale_write_concern"), ("zombie_p", "bank_p")),
    KnownBug("producer_thread_dies", "raymx/actors/core/producer.py ProducerCore.on_failure "
             "+ raymx/actors/core/producer.py run",
             "a find_common call that failed or timed out (the source crashed or was cut "
             "off mid-rollback) raised out of the producer's step and ended its thread; "
             "the member never replicated again",
             "every failed step goes through ProducerCore.on_failure: wait, pull again",
             _old_producer_thread_dies, ("producer_dead=True",), (204,),
             off=("bank_p", "membership_p")),
    KnownBug("majority_of_old_terms", "raymx/actors/core/replication.py committed "
             "(WriteConcernCore.majority_point, FeederCore.committed_point)",
             "a primary called majority-committed any entry durable on a majority, "
             "entries of earlier terms included (Raft's figure 8): a member that never "
             "held such an entry won the next election and rolled it back, after a "
             "majority read had returned it",
             "a primary's majority point is only ever an entry of its own term; a new "
             "primary writes a no-op at once so the point moves with no client write",
             _old_majority_of_old_terms, ("majority-committed point", "majority read"),
             ("figure_eight",), off=("zombie_p", "membership_p")),
    KnownBug("catch_up_outlives_adoption", "raymx/actors/core/election.py ElectionCore._adopt",
             "the coordinator started catching an eligible member up for an election, then "
             "adopted the old primary when it answered again; the catch-up mark stayed "
             "set, and while it is set no member is told to follow: a member that had "
             "restarted meanwhile never replicated again",
             "adopting a primary ends any catch-up",
             _old_catch_up_outlives_adoption, ("no convergence",), ("catch_up_then_adopt",),
             off=("zombie_p", "membership_p")),
    KnownBug("deposed_writes_held_noops", "raymx/actors/shard.py "
             "ShardService._settle_unwritten (_owes_unwritten)",
             "the n entry of a commit that failed on a full disk waited for room; the "
             "member stepped down, followed the new primary (its position confirmed at "
             "the entry before), and the next item on its writer wrote the held entry "
             "under the old term: a secondary with an entry of its own past its "
             "confirmed position served it to majority reads until a pull found it "
             "diverged and rolled it back",
             "held n entries are written only by the primary of their term; a deposed "
             "member drops them (nothing was written at their GTIDs); a step-down also "
             "waits for the write running on the writer (ShardService.step_down)",
             _old_deposed_writes_held_noops, ("saw a write that is rolled back",), (1235,)),
    KnownBug("behind_source_diverged", "raymx/actors/core/replication.py FeederCore.pull",
             "a source whose oplog ends below the caller's last entry answered 'diverged' "
             "(the caller's last entry is not in its oplog), so the caller rolled back "
             "to the common point: with a stale heartbeat view the coordinator made the "
             "member to be elected catch up from a joining member (priority 0) that "
             "looked more advanced and was behind it, and it rolled back a "
             "majority-acknowledged write",
             "a source whose last GTID is below the caller's answers 'behind': the caller "
             "undoes nothing and pulls again (GTIDs order by term first, so such a source "
             "holds no newer branch)", _old_behind_source_diverged,
             ("rolls back majority-acknowledged write",), (235393,), off=()),
    KnownBug("coordinator_took_old_config",
             "raymx/actors/core/election.py ElectionCore.config_standing",
             "a restarted coordinator that no member holding the newest configuration "
             "answered (down, cut off) took an older one, or its launch's, as the newest: "
             "it counted the votes of members removed since, so the set reduced to one "
             "member never had a primary again, and its changes gave out configuration "
             "versions the members held with other members",
             "a restarted coordinator elects no one and changes nothing until a majority "
             "of its configuration's voters answered with nothing newer; a member "
             "reporting a newer one gives it its own", _old_coordinator_took_old_config,
             ("no convergence",), (241875,), off=()),
    KnownBug("restart_with_creation_votes", "raymx/actors/core/member.py start_config",
             "a member process restarted by Ray ran with the votes it was created with "
             "(Ray restarts an actor with its creation's arguments), not those of the "
             "configuration it had installed since: it counted majorities over members "
             "removed since, or without members added since. Found on the real set "
             "(bench/faults/nemesis.py seed 403: after two remove-two faults the "
             "restarted primary's majority point never moved, and no w='majority' write "
             "or linearizable read was answered again). In a set grown from 3 members to 5, "
             "a restarted primary counted 2 of its creation's 3 voters as a majority and "
             "acknowledged writes a failover then lost",
             "a starting member takes its votes and its own spec from the configuration it "
             "holds durably, when it holds one (start_config, run by the shell, the "
             "applier and the simulation alike)", _old_restart_with_creation_votes,
             ("rolls back majority-acknowledged write",), ("restart_after_growing",), off=()),
)}


def _planted_ack_before_durable() -> list:
    def _answer_when(self, g, out, req, reply):
        reply(ok=out)  # acknowledged before it is durable anywhere
        return False
    return [(ShardService, "_answer_when", _answer_when)]


def _planted_blind_commit() -> list:
    """Transactions commit without their checks: no document locks between
    open transactions, no first-committer-wins at commit (lost updates)."""
    return [(Overlay, "conflict", lambda self, w: None),
            (SessionPath, "_lock_written", lambda self, s: s.tx.t.fresh.clear())]


# planted bugs that live in shipped code: patched in for the run, as known bugs are
PLANTED = {"ack_before_durable": _planted_ack_before_durable,
           "blind_commit": _planted_blind_commit}


class regressed:
    """Put known bugs back into the shipped cores for a run (``--regress``),
    and a planted bug that lives in shipped code (``PLANTED``)."""

    def __init__(self, names=(), broken: str | None = None):
        unknown = [n for n in names if n not in KNOWN_BUGS]
        if unknown:
            raise ValueError(f"unknown bugs {unknown} (known: {', '.join(KNOWN_BUGS)})")
        self.names = tuple(n for n in KNOWN_BUGS if n in names)
        self._patches = [KNOWN_BUGS[n].old for n in self.names] + \
            ([PLANTED[broken]] if broken in PLANTED else [])
        self._saved: list = []

    def __enter__(self):
        for old in self._patches:
            for obj, attr, fn in old():
                self._saved.append((obj, attr, obj.__dict__[attr]))
                setattr(obj, attr, fn)
        return self

    def __exit__(self, *exc):
        for obj, attr, fn in reversed(self._saved):
            setattr(obj, attr, fn)
        self._saved.clear()
