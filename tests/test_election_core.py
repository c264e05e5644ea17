"""ElectionCore decisions, driven directly (pure, injected time)."""
from raymx.actors.election import ElectionCore
from raymx.storage.gtid import GTID


def beat(core, mid, now, last=(1, 5), term=1, role="secondary", state="running", following=None):
    core.on_heartbeat(mid, {"term": term, "last": list(last), "role": role, "state": state,
                            "following": following}, now)


def core3(extra=None):
    specs = [{"id": 0}, {"id": 1}, {"id": 2}]
    for s in specs:
        s.update((extra or {}).get(s["id"], {}))
    return ElectionCore.from_specs(specs, heartbeat_timeout_ms=1000)


def test_initial_election_picks_highest_priority_then_lowest_id():
    c = core3({1: {"priority": 2}})
    for m in range(3):
        beat(c, m, 0, last=(0, 0), term=0)
    acts = c.tick(0)
    assert [(a.kind, a.member, a.term) for a in acts] == [("elect", 1, 1)]


def test_most_advanced_wins_and_needs_a_majority():
    c = core3()
    beat(c, 0, 0, last=(1, 9), role="primary")
    c.on_elected(0, 1)
    beat(c, 1, 0, last=(1, 7))
    beat(c, 2, 0, last=(1, 8))
    assert [a.kind for a in c.tick(500)] == ["follow", "follow"]
    # primary silent past the timeout: member 2 (largest GTID) wins under term 2
    beat(c, 1, 1200, last=(1, 7))
    beat(c, 2, 1200, last=(1, 8))
    c.on_heartbeat(0, None, 1200)
    acts = c.tick(1200)
    assert (acts[0].kind, acts[0].member, acts[0].term) == ("elect", 2, 2)
    # alone, no election
    c2 = core3()
    beat(c2, 0, 0, last=(1, 1))
    c2.on_heartbeat(1, None, 0, dead=True)
    c2.on_heartbeat(2, None, 0, dead=True)
    assert c2.tick(0) == []


def test_ineligible_most_advanced_member_feeds_the_winner_first():
    c = core3({2: {"priority": 0}})
    beat(c, 0, 0, last=(1, 5))
    beat(c, 1, 0, last=(1, 6))
    beat(c, 2, 0, last=(1, 9))
    acts = c.tick(0)
    assert (acts[0].kind, acts[0].member, acts[0].source, acts[0].target) == \
        ("catch_up", 1, 2, GTID(1, 9))
    beat(c, 1, 100, last=(1, 9))
    acts = c.tick(100)
    assert (acts[0].kind, acts[0].member) == ("elect", 1)


def test_synchronizing_members_are_never_elected_and_deposed_primaries_step_down():
    c = core3()
    beat(c, 0, 0, last=(1, 9), state="synchronizing")
    beat(c, 1, 0, last=(1, 5))
    beat(c, 2, 0, last=(1, 4))
    acts = c.tick(0)
    assert (acts[0].kind, acts[0].member) == ("elect", 1)
    c.on_elected(1, acts[0].term)
    beat(c, 2, 10, last=(1, 4), role="primary", term=1)  # an old primary still thinks it is
    kinds = {(a.kind, a.member) for a in c.tick(10)}
    assert ("step_down", 2) in kinds


def test_restarted_primary_is_replaced():
    c = core3()
    for m in range(3):
        beat(c, m, 0, last=(1, 5), role="primary" if m == 0 else "secondary")
    c.on_elected(0, 1)
    beat(c, 0, 100, last=(1, 5), term=1, role="secondary")  # came back as a secondary
    beat(c, 1, 100, last=(1, 5), term=1)
    beat(c, 2, 100, last=(1, 5), term=1)
    acts = c.tick(100)
    assert acts[0].kind == "elect" and acts[0].term == 2


def test_a_synchronizing_member_joins_once_loaded_and_caught_up():
    c = core3({2: {"votes": 0, "priority": 0}})
    beat(c, 0, 0, last=(1, 5000), role="primary")
    c.on_elected(0, 1)
    # still loading its snapshot: never, however close
    c.on_heartbeat(2, {"term": 1, "last": [1, 4990], "state": "synchronizing",
                       "loading": True}, 0)
    assert not c.ready_to_join(2, 100)
    # loaded, but further behind than allowed
    c.on_heartbeat(2, {"term": 1, "last": [1, 4000], "state": "synchronizing"}, 100)
    assert not c.ready_to_join(2, 100)
    c.on_heartbeat(2, {"term": 1, "last": [1, 4950], "state": "synchronizing"}, 200)
    assert c.ready_to_join(2, 100)
    # loaded at 1:4950 but not one pull since: wait (its sync source holds 1:4950 for
    # it until then); once it pulled, or when the primary has nothing newer, go
    c.on_heartbeat(2, {"term": 1, "last": [1, 4950], "loaded_at": [1, 4950]}, 210)
    assert not c.ready_to_join(2, 100)
    c.on_heartbeat(2, {"term": 1, "last": [1, 4951], "loaded_at": [1, 4950]}, 220)
    assert c.ready_to_join(2, 100)
    beat(c, 0, 230, last=(1, 4950), role="primary")
    c.on_heartbeat(2, {"term": 1, "last": [1, 4950], "loaded_at": [1, 4950]}, 230)
    assert c.ready_to_join(2, 100)
    beat(c, 0, 240, last=(1, 5000), role="primary")
    # no primary to compare with, or the member stopped answering: wait
    c.on_heartbeat(2, None, 5000)
    assert not c.ready_to_join(2, 100)
    beat(c, 2, 5000, last=(1, 4990), state="synchronizing")
    c.on_heartbeat(0, None, 5000, dead=True)
    assert not c.ready_to_join(2, 100)
    assert not c.ready_to_join(7, 100)  # not a member
