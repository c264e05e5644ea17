"""The deterministic simulation (tests/sim.py) in CI.

* a sweep of ``SEEDS`` seeds, in chunks, each a safety phase with faults and a
  liveness phase without; a failure prints the seed's options, the last events
  and ``reproduce: python -m tests.sim --seed N``;
* the named scenarios, which script their faults;
* replays are exact, also under another PYTHONHASHSEED;
* planted bugs (a primary acknowledging w="majority" before anyone else has
  the entry; an election reusing a term) are caught, so the invariants bite;
* transactions that clients leave open expire on the members' own clocks,
  and the plain writes parked behind them run (the trimmer's round);
* every protocol bug the simulation found (tests/sim.py KNOWN_BUGS) is fixed
  in the shipped cores, which the simulation runs as the shells do; put back
  into those cores (a monkeypatch), each is caught by its reproduction.
"""
import multiprocessing
import os
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor

import pytest

from tests import sim

CHUNKS = 10
PER_CHUNK = 40
SEEDS = CHUNKS * PER_CHUNK
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _failures(results) -> str:
    """The first failure in full, one line for each other."""
    bad = [r for r in results if not r.ok]
    if not bad:
        return ""
    out = [f"{len(bad)} of {len(results)} seeds failed", "", bad[0].report()]
    for r in bad[1:]:
        out.append(f"also: seed {r.seed}: {r.message.splitlines()[0]}\n"
                   f"  reproduce: {r.reproduce}")
    return "\n".join(out)


def _run_chunk(chunk: int) -> list:
    return [sim.run(s) for s in range(chunk * PER_CHUNK, (chunk + 1) * PER_CHUNK)]


@pytest.fixture(scope="module")
def sweep():
    """The chunks' results as they come: the runs are pure CPU in worker
    processes, one per core (this process would leave the other core idle)."""
    workers = max(1, min(CHUNKS, len(os.sched_getaffinity(0))))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield [pool.submit(_run_chunk, c) for c in range(CHUNKS)]


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_seeds(chunk, sweep):
    results = sweep[chunk].result()
    assert all(r.ok for r in results), _failures(results)
    # the runs did something: writes were acknowledged and survived elections,
    # and majority/linearizable reads were checked against the final history
    assert sum(r.stats["majority_acks"] for r in results) > 0
    assert sum(r.stats["reads"] for r in results) > 0


def test_transactions_left_open_expire_and_the_writes_parked_behind_them_run(monkeypatch):
    """Seeds whose clients walk away from some transfers (``abandon_p``): the
    transactions left open expire by the member's clock (the simulated one),
    and the trimmer's round (``sweep_waiting_writes``, a timer here as a
    thread's loop there) ends those that plain writes wait for, which then
    run. The bank balances still sum to zero on every member."""
    from raymx.actors.sessions import SessionPath
    from tests.sim_base import Options
    seen = {"released_by_round": 0, "expired": 0}
    sweep, end = SessionPath._sweep_txns, SessionPath._end_txn
    in_round = []

    def sweep_counted(self):
        in_round.append(1)
        try:
            return sweep(self)
        finally:
            in_round.pop()

    def end_counted(self, s, abort=False):
        if in_round:
            seen["released_by_round"] += len(s.waiting)
        return end(self, s, abort)
    monkeypatch.setattr(SessionPath, "_sweep_txns", sweep_counted)
    monkeypatch.setattr(SessionPath, "_end_txn", end_counted)
    seeds = [s for s in range(100, 200) if Options.swarm(s).bank_p and Options.swarm(s).abandon_p]
    abandoned = 0
    for seed in seeds[:12]:
        r = sim.run(seed)
        assert r.ok, r.report()
        abandoned += int(r.stats["transfers"].split("/")[3])
        seen["expired"] += r.stats["transactions_expired"]
    assert abandoned > 0 and seen["expired"] > 0 and seen["released_by_round"] > 0, seen


@pytest.mark.parametrize("name", sorted(sim.SCENARIOS))
def test_scenario(name):
    r = sim.run(scenario=name)
    assert r.ok, r.report()


def test_a_replay_is_exact():
    a, b = sim.run(7), sim.run(7)
    assert (a.digest, a.events, a.sim_ms, a.stats) == (b.digest, b.events, b.sim_ms, b.stats)
    assert sim.run(8).digest != a.digest


def test_a_replay_does_not_depend_on_the_string_hash_seed():
    outs = []
    for hs in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hs)
        p = subprocess.run([sys.executable, "-m", "tests.sim", "--seed", "11"], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        outs.append(p.stdout)
    assert outs[0] == outs[1]
    assert "trace digest" in outs[0]


def test_unsafe_reconfiguration_is_caught_and_the_safe_rules_prevent_it():
    """Issue 19 scenario 1 in the simulation: two votes taken while the voters
    that remain lag, then the primary's machine crashes. Installed at once
    (the old coordinator), majority-acknowledged writes are rolled back; with
    the shipped rules (one voter per change, the committed point on a new
    majority first) the changes wait, are refused, and nothing is lost."""
    r = sim.run(scenario="reconfigure_while_lagging", broken="unsafe_reconfig")
    assert not r.ok and "majority-acknowledged write" in r.message, r.report()
    r = sim.run(scenario="reconfigure_while_lagging")
    assert r.ok, r.report()


def test_members_removed_while_the_rest_lag_lose_nothing():
    """The mission's worst fault, with members really removed and added (the
    shipped core's edit_config, next_join and change rules): two removals
    asked while the other voters lag, the primary's machine crashes, two new
    members join. Installed at once, majority-acknowledged writes are lost;
    with the shipped rules they are not, and a removal whose member was
    elected while it waited is refused."""
    r = sim.run(scenario="remove_two_while_lagging", broken="unsafe_reconfig")
    assert not r.ok and "majority-acknowledged write" in r.message, r.report()
    s = sim.Sim(scenario="remove_two_while_lagging")
    r = s.run()
    assert r.ok, r.report()
    # m2 was elected while its removal waited (refused), m3 went, m6 and m7
    # joined and got their votes
    assert s.member_ids == [1, 2, 4, 5, 6, 7], s.member_ids
    assert [(m["id"], m.get("votes", 1)) for m in s.node("c").config] == [
        (1, 1), (2, 1), (4, 1), (5, 1), (6, 1), (7, 1)]


def test_a_failed_fsync_must_stop_the_member():
    """Issue 20 (fsyncgate): fsyncs fail now and then; members that stop (as the
    shells do) lose nothing acknowledged; members that retry over the pages the
    kernel dropped (the planted bug) are caught."""
    assert sim.run(scenario="fsync_fails").ok
    r = sim.run(scenario="fsync_fails", broken="fsync_retry")
    assert not r.ok, r.report()


@pytest.mark.parametrize("broken", [b for b in sim.BROKEN
                                    if b not in ("unsafe_reconfig", "fsync_retry")])
def test_the_invariants_catch_a_planted_bug(broken):
    for seed in range(60):
        r = sim.run(seed, broken=broken)
        if not r.ok:
            rep = r.report()
            assert f"reproduce: python -m tests.sim --seed {seed} --broken {broken}" in rep
            assert sim.run(seed, broken=broken).digest == r.digest  # and it replays
            return
    pytest.fail(f"no seed in 0..59 caught the planted bug {broken!r}: the invariants are blind")


def test_a_failing_seed_prints_how_to_replay_it(capsys):
    seed = next(s for s in range(60) if not sim.run(s, broken="reuse_term").ok)
    assert sim.main(["--seed", str(seed), "--broken", "reuse_term"]) == 1
    out = capsys.readouterr().out
    assert f"SEED={seed}" in out and "last events:" in out
    assert f"reproduce: python -m tests.sim --seed {seed} --broken reuse_term" in out


def _known_bug_cases():
    for b in sim.KNOWN_BUGS.values():
        for repro in b.repro:
            yield pytest.param(b.name, repro, id=f"{b.name}-{repro}")


def _run(repro, regress, off=()):
    if isinstance(repro, str):
        return sim.run(scenario=repro, regress=regress)
    return sim.run(repro, regress=regress, off=off)


@pytest.mark.parametrize("name,repro", list(_known_bug_cases()))
def test_a_known_bug_put_back_into_the_shipped_cores_is_caught(name, repro):
    """Each protocol bug the simulation found is fixed in a core the shells
    run. Put back (``KnownBug.old``: monkeypatches of that core, the code path
    the Ray shells and the simulation share), the run fails as the bug did;
    with only the bugs it needs to show (``also``) put back, the same run
    passes: the failure is this bug's."""
    b = sim.KNOWN_BUGS[name]
    r = _run(repro, (name,) + b.also, b.off)
    assert not r.ok, f"{name} put back, and nothing failed: the sweep is blind to it\n" \
        + r.report()
    assert any(s in r.message for s in b.symptoms), \
        f"{name}: failed, but not as the bug does:\n{r.report()}"
    r = _run(repro, b.also, b.off)
    assert r.ok, r.report()


def test_every_known_bug_has_a_reproduction():
    assert all(b.repro for b in sim.KNOWN_BUGS.values()), \
        [b.name for b in sim.KNOWN_BUGS.values() if not b.repro]
