"""The member, producer and primary cores (raymx/actors/core): their decisions
one by one, without Ray or threads. The simulation (tests/test_simulation.py)
runs them together under faults; the Ray shells run them in production."""
from raymx import errors
from raymx.actors.core import producer as pc
from raymx.actors.core.election import Action, ElectionCore
from raymx.actors.core.member import MemberCore
from raymx.actors.core.primary import WriteConcernCore, deposed, sees_majority
from raymx.actors.core.replication import FeederCore, apply_batch, match_common
from raymx.storage.engine import Engine
from raymx.storage.gtid import GTID, ZERO
from raymx.storage.limits import Limits
from raymx.storage.store import MemoryStore


def _engine(writes: int = 0, term: int = 1) -> Engine:
    e = Engine(MemoryStore())
    e.set_term(term)
    for seq in range(1, writes + 1):
        tx = e.begin(autocommit=True)
        tx.insert("db.c", [{"_id": seq}])
        tx.commit(GTID(term, seq))
    e.sync()
    return e


def test_a_higher_term_is_recorded_and_steps_a_primary_down():
    e = _engine()
    m = MemberCore(e, 1)
    m.became_primary(ZERO)
    assert not m.learn_term(1, serving=True, lead_term=1)  # its own term: nothing
    assert m.learn_term(2, serving=True, lead_term=1)      # newer: step down
    e.store.crash()  # unsynced writes are lost: the term was synced before the answer
    assert Engine(e.store).term == 2
    m.became_secondary()
    assert m.role == "secondary" and m.sync_state == "recovering"


def test_a_deposed_write_side_still_steps_the_role_down():
    """The deposed_role_stuck bug: a commit that saw a newer term cleared the
    write side alone; the role decides, at every heartbeat and step_down."""
    e = _engine()
    m = MemberCore(e, 1)
    m.became_primary(ZERO)
    e.set_term(2)  # learned through a pull
    assert m.heartbeat(2, serving=False, lead_term=1)
    assert m.step_down(2, serving=False, lead_term=1)
    assert m.follow(2, 3, serving=False, lead_term=1)


def test_a_secondary_serves_reads_only_once_a_source_confirmed_it():
    m = MemberCore(_engine(), 2)
    assert m.read_refusal() == "recovering" and m.state() == "recovering"
    m.on_sync_state("running")
    assert m.read_refusal() is None
    m.learn_term(5, serving=False, lead_term=0)  # a new term: its branch is in doubt
    assert m.read_refusal() == "recovering"


def test_a_configuration_is_kept_only_when_newer_and_moves_the_fence():
    e = _engine(writes=3)
    m = MemberCore(e, 1)
    m.became_primary(GTID(1, 1))
    assert m.set_config({"version": 2, "members": []}, serving=True)
    assert m.fence == GTID(1, 3) and m.config_version == 2
    assert not m.set_config({"version": 2, "members": []}, serving=True)
    assert MemberCore(e, 1).config_version == 2  # durable


def test_heartbeats_say_when_a_write_was_refused_for_a_full_disk():
    from raymx.actors.core.member import DISK_FULL_WINDOW_MS
    e = _engine(writes=1)
    m = MemberCore(e, 1)
    r = m.reply(1, now_ms=0)
    assert r["disk_full"] is False and r["disk_free"] > 0
    e.store.full = True
    assert m.reply(1, now_ms=10)["disk_free"] == 0
    assert m.reply(1, now_ms=10)["disk_full"] is False  # nothing refused yet
    tx = e.begin(autocommit=True)
    try:
        tx.insert("db.c", [{"_id": 2}])
        tx.commit(GTID(1, 2))
        raise AssertionError("a full store took a write")
    except errors.DiskFull:
        tx.abort()
    e.store.full = False
    assert m.reply(1, now_ms=20)["disk_full"] is True  # seen at this heartbeat
    assert m.reply(1, now_ms=20 + DISK_FULL_WINDOW_MS - 1)["disk_full"] is True
    assert m.reply(1, now_ms=20 + DISK_FULL_WINDOW_MS)["disk_full"] is False


def test_the_producer_follows_only_in_the_newest_term_it_knows():
    """The stale_sync_source bug: after learning a newer term, entries from the
    source chosen in the older term are refused until follow() in the new one."""
    e = _engine(writes=1)
    p = pc.ProducerCore(e, 2, Limits())
    assert p.blocked()  # starts paused
    p.follow(1, 1)
    assert not p.blocked()
    req, last, _ = p.request({})
    assert req["term"] == 1 and req["after"] == [1, 1]
    e.set_term(2)
    assert p.blocked()
    step, _ = p.on_answer({"status": "ok", "term": 2, "rows": [b"x"]}, last)
    assert step == pc.RETRY and p.state == "recovering"
    p.follow(3, 2)
    assert not p.blocked()


def test_the_producer_reads_each_answer():
    e = _engine(writes=1)
    p = pc.ProducerCore(e, 2, Limits())
    p.follow(1, 1)
    last = GTID(1, 1)
    assert p.on_answer({"status": "ok", "term": 1, "rows": [], "majority": [1, 1]}, last) \
        == (pc.IDLE, GTID(1, 1))
    assert p.state == "running" and p.majority == GTID(1, 1)
    assert p.on_answer({"status": "ok", "term": 0, "rows": []}, last)[0] == pc.RETRY  # deposed
    assert p.on_answer({"status": "diverged"}, last)[0] == pc.ROLLBACK
    assert p.on_answer({"status": "too_stale", "first": [1, 9]}, last)[0] == pc.RETRY
    assert e.get_meta("needs_resync") and p.state == "resync" and p.blocked()
    assert p.on_failure("find_common failed") > 0  # never gives up


def test_write_concern_waiters_are_acknowledged_timed_out_or_failed_when_deposed():
    wc = WriteConcernCore({1: 1, 2: 1, 3: 1})
    wc.reset(1, GTID(1, 5))
    assert wc.wait(GTID(1, 5), "majority", 100, "a") is None
    assert wc.wait(GTID(1, 5), 3, 50, "b") is None
    assert isinstance(wc.wait(GTID(1, 5), 4, None, "c"), errors.WriteConcernTimeout)
    assert wc.sweep(0, 1, True) == []
    assert wc.update(2, GTID(1, 5)) and not wc.update(2, GTID(1, 4))
    assert [t for t, err in wc.sweep(10, 1, True)] == ["a"]
    done = wc.sweep(60, 1, True)
    assert [t for t, _ in done] == ["b"] and isinstance(done[0][1], errors.WriteConcernTimeout)
    # the stale_write_concern bug: a newer term fails every waiter, unknown outcome
    wc.wait(GTID(1, 6), "majority", None, "d")
    (t, err), = wc.sweep(70, 2, True)
    assert t == "d" and isinstance(err, errors.NotPrimary)
    wc.wait(GTID(1, 7), "majority", None, "e")
    assert [t for t, _ in wc.step_down(1)] == ["e"] and wc.durable == {}


def test_a_removed_members_position_is_forgotten():
    """Were member 3 configured again (a new member under its id), its old
    position would count for writes it does not hold."""
    wc = WriteConcernCore({1: 1, 2: 1, 3: 1})
    wc.reset(1, GTID(1, 9))
    wc.update(3, GTID(1, 9))
    wc.set_votes({1: 1, 2: 1})
    assert wc.durable == {1: GTID(1, 9)}
    wc.set_votes({1: 1, 2: 1, 3: 1})
    assert wc.update(3, GTID(1, 2)) and wc.majority_point(1) == GTID(1, 2)
    f = FeederCore(_engine(writes=2), Limits())
    f.set_votes({"1": 1, "2": 1})
    f.positions = {1: {"durable": GTID(1, 1)}, 2: {"durable": GTID(1, 2)}}
    f.set_votes({1: 1})
    assert f.votes == {1: 1} and list(f.positions) == [1]


def test_deposed_and_sees_majority():
    assert deposed(False, 1, 1) and deposed(True, 2, 1) and not deposed(True, 1, 1)
    votes = {1: 1, 2: 1, 3: 1}
    assert sees_majority(votes, {2: 900}, 1, 1000, 500)
    assert not sees_majority(votes, {2: 100}, 1, 1000, 500)
    assert sees_majority({1: 1}, {}, 1, 10**9, 1)


def test_a_pull_with_a_newer_term_is_refused_after_recording_it():
    e = _engine(writes=2)
    f = FeederCore(e, Limits())
    assert f.admit(1, 1) is None
    out = f.admit(3, 1)
    assert out["status"] == "stale_term" and e.term == 3


def test_only_positions_on_this_branch_count():
    e = _engine(writes=2)
    f = FeederCore(e, Limits())
    f.advance(GTID(1, 2))
    out, report, _ = f.answer([1, 1], e.last()[1] if False else None, 10, 1 << 20, 1, 2, 1,
                              True, {"durable": [1, 1], "applied": [1, 1], "downstream": {}},
                              5)
    assert out["status"] == "ok" and report[2]["durable"] == GTID(1, 1)
    out, report, _ = f.answer([2, 2], None, 10, 1 << 20, 1, 3, 1, True,
                              {"durable": [2, 2], "applied": None, "downstream": {}}, 5)
    assert out["status"] == "behind" and report[3]["durable"] is None
    out, report, _ = f.answer([0, 2], None, 10, 1 << 20, 1, 3, 1, True,
                              {"durable": [0, 2], "applied": None, "downstream": {}}, 5)
    assert out["status"] == "diverged" and report[3]["durable"] is None


def test_an_election_is_fenced_and_chooses_from_the_fresh_answers():
    core = ElectionCore.from_specs([{"id": 1}, {"id": 2}, {"id": 3}], 1000)
    for m in (1, 2, 3):
        core.on_heartbeat(m, {"term": 1, "last": [1, m], "role": "secondary"}, 0)
    a = Action("elect", 3, 2)
    assert core.fence(a) == [1, 2, 3] and core.term == 2
    # member 3 did not answer the fence: it cannot win; 1 and 2 are a majority
    winner = core.fenced(a, {1: {"term": 2, "last": [1, 1]}, 2: {"term": 2, "last": [1, 2]}}, 5)
    assert winner == 2
    # a member that answers with another term did not record this one
    assert core.fenced(a, {1: {"term": 2, "last": [1, 1]}, 2: {"term": 3, "last": [1, 2]}},
                       6) is None
    assert core.call(Action("follow", 1, 2, source=2)) == ("follow", (2, 2))
    assert core.call(Action("catch_up", 1, 4, source=2)) == ("follow", (core.term, 2))


class _LoopShell:
    """The producer loop's shell for these tests: records what it is told."""

    def __init__(self):
        self.told, self.records = [], []

    def downstream(self):
        return {}

    def learned(self, g):
        self.told.append(("learned", g))

    def state(self, s):
        self.told.append(("state", s))

    def written(self, g, n, rows):
        self.told.append(("written", g))

    def rollback_file(self, common):
        return "memory", self.records.extend

    def rolling_back(self, source, common):
        self.told.append(("rolling_back", common))

    def rolled_back(self, common, n, where):
        self.told.append(("rolled_back", common, n))

    def failed(self, e):
        self.told.append(("failed", type(e).__name__))


def _source_answer(src: Engine, req: dict) -> dict:
    f = FeederCore(src, Limits())
    f.advance(src.last()[0])
    out, _, _ = f.answer(req["after"], req["after_h"], req["max_entries"], req["max_bytes"],
                         src.term, req["member"], 1, True, None, 0)
    return out


def test_the_producer_loop_rolls_back_through_a_failed_find_common_and_converges():
    """``pc.run`` is the loop both the Ray shell and the simulation carry out:
    a diverged member finds the common point (a ``find_common`` that fails is
    waited out, never the loop's end), undoes past it with the applier held
    and synced, then pulls the source's branch; every batch is synced before
    the shell is told it is written."""
    src = _engine(writes=3)
    old = _engine(writes=3)
    old.insert_many("db.c", [{"_id": "lost"}])  # (1, 4) here only
    src.set_term(2)
    src.insert_many("db.c", [{"_id": "new"}])   # (2, 4) on the source's branch
    old.sync()
    core = pc.ProducerCore(old, 2, Limits())
    core.follow(1, 2)
    shell, effects = _LoopShell(), []
    loop = pc.run(core, shell, hashes_per_round=2)
    value, thrown, find_commons = None, None, 0
    for _ in range(100):
        eff = loop.throw(thrown) if thrown else loop.send(value)
        value, thrown = None, None
        effects.append(eff)
        if isinstance(eff, pc.Pull):
            if old.last() == src.last() and ("written", GTID(2, 4)) in shell.told:
                break
            value = _source_answer(src, eff.req)
        elif isinstance(eff, pc.FindCommon):
            find_commons += 1
            if find_commons == 1:
                thrown = pc.CallFailed("find_common from m1 timed out")
            else:
                g = match_common(src, eff.candidates)
                value = None if g is None else list(g)
        elif eff == pc.SYNC:
            old.sync()
    assert old.last() == src.last(), effects
    # the failed find_common: the lock released, the failure waited out, a new pull
    i = effects.index(next(e for e in effects if isinstance(e, pc.FindCommon)))
    assert effects[i + 1:i + 4] == [pc.UNLOCK, pc.Sleep(pc.FAILURE_MS), effects[i + 3]]
    assert isinstance(effects[i + 3], pc.Pull) and ("failed", "CallFailed") in shell.told
    # the rollback: applier held, undone, synced, released; then the new branch
    j = effects.index(pc.HOLD_APPLIER)
    assert effects[j + 1:j + 3] == [pc.SYNC, pc.RELEASE_APPLIER]
    assert ("rolled_back", GTID(1, 3), 1) in shell.told
    assert [r["post"]["_id"] for r in shell.records] == ["lost"]
    k = shell.told.index(("written", GTID(2, 4)))
    assert effects.count(pc.SYNC) == 2 and k > shell.told.index(("rolled_back", GTID(1, 3), 1))
    while apply_batch(old, Limits(), 0)[0]:
        pass
    assert old.snapshot_state() == src.snapshot_state()


def test_the_producer_loop_writes_nothing_once_paused_while_pulling():
    """``pause(wait=True)`` (a promotion) sets ``paused`` and then waits for the
    write lock: an answer that arrives after it is dropped under the lock."""
    src = _engine(writes=3)
    e = Engine(MemoryStore())
    core = pc.ProducerCore(e, 2, Limits())
    core.follow(1, 1)
    loop = pc.run(core, _LoopShell())
    pull = next(loop)
    assert isinstance(pull, pc.Pull)
    answer = _source_answer(src, pull.req)
    assert len(answer["rows"]) == 3
    core.paused = True  # pause() runs while the pull is out
    assert loop.send(answer) == pc.LOCK
    assert loop.send(None) == pc.UNLOCK
    assert loop.send(None) == pc.BLOCKED
    assert e.last()[0] == ZERO
