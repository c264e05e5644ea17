"""ElectionCore decisions, driven directly (pure, injected time)."""
from raymx.actors.core.election import (DISK_HAND_OVER_EVERY_MS, DISK_ROOM_BYTES,
                                        ElectionCore, next_join)
from raymx.storage.gtid import GTID


def beat(core, mid, now, last=(1, 5), term=1, role="secondary", state="running", following=None,
         lead_term=None, disk_full=False, disk_free=1 << 40):
    core.on_heartbeat(mid, {"term": term, "last": list(last), "role": role, "state": state,
                            "following": following,
                            "lead_term": term if role == "primary" and lead_term is None
                            else lead_term, "disk_full": disk_full,
                            "disk_free": disk_free}, now)


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


# --- issue 19: votes of members that cannot stand, adoption, safe reconfig ----
def test_a_member_that_needs_a_resync_still_votes_but_is_never_elected():
    c = core3()
    beat(c, 0, 0, last=(2, 60), role="primary", term=2)
    c.on_elected(0, 2)
    beat(c, 1, 0, last=(1, 250), term=2, state="resync")  # a diverged old primary
    beat(c, 2, 0, last=(2, 58), term=2)
    c.on_heartbeat(0, None, 1200, dead=True)
    beat(c, 1, 1200, last=(1, 250), term=2, state="resync")
    beat(c, 2, 1200, last=(2, 58), term=2)
    acts = [a for a in c.tick(1200) if a.kind == "elect"]
    assert [(a.member, a.term) for a in acts] == [(2, 3)]  # 2 votes of 3: member 2 wins
    assert c.choose_winner([c.members[1], c.members[2]], 2) == 2


def test_a_voter_more_advanced_than_every_candidate_blocks_the_election():
    """Raft's vote rule: the resync member may hold a committed entry nobody
    running has; its vote does not count for them, so no one is elected."""
    c = core3()
    beat(c, 0, 0, last=(2, 5), state="synchronizing")
    beat(c, 1, 0, last=(2, 9), state="resync")
    beat(c, 2, 0, last=(2, 7))
    c.on_heartbeat(0, None, 1200, dead=True)
    beat(c, 1, 1200, last=(2, 9), state="resync")
    beat(c, 2, 1200, last=(2, 7))
    assert not [a for a in c.tick(1200) if a.kind == "elect"]
    assert c.choose_winner([c.members[1], c.members[2]]) is None


def test_a_primary_adopted_during_a_catch_up_ends_it_and_members_follow_again():
    """Seed 2592 of the simulation: a catch-up began (the primary looked
    failed), the primary answered again and was adopted; the catch-up mark
    must go, or no member is ever told to follow again."""
    c = core3({2: {"priority": 0}})
    beat(c, 0, 0, last=(1, 5))
    beat(c, 1, 0, last=(1, 6))
    beat(c, 2, 0, last=(1, 9))
    assert [a.kind for a in c.tick(0)] == ["catch_up"]
    beat(c, 2, 50, last=(1, 9), role="primary", term=1)  # it was the primary after all
    beat(c, 0, 50, last=(1, 5))
    beat(c, 1, 50, last=(1, 6))
    acts = c.tick(50)
    assert c.primary == 2 and c.catching_up is None
    assert sorted((a.kind, a.member, a.source) for a in acts) == \
        [("follow", 0, 2), ("follow", 1, 2)]


def test_a_restarted_coordinator_adopts_the_primary_of_the_highest_term():
    c = core3()
    beat(c, 0, 0, last=(2, 9), term=2, role="primary")
    beat(c, 1, 0, last=(2, 9), term=2)
    assert c.tick(0) == [] or all(a.kind != "elect" for a in c.tick(0))  # 2 still unheard
    beat(c, 2, 10, last=(1, 4), term=1, role="primary")  # a deposed one: steps down
    acts = c.tick(10)
    assert c.primary == 0 and c.term == 2 and c.elections == 0
    assert ("step_down", 2) in [(a.kind, a.member) for a in acts]
    # one that learned term 3 but leads term 2 (deposed, not yet stepped down) is
    # never adopted: the coordinator elects instead
    c = core3()
    beat(c, 0, 0, last=(2, 9), term=3, role="primary", lead_term=2)
    beat(c, 1, 0, last=(2, 9), term=3)
    beat(c, 2, 0, last=(2, 9), term=3)
    assert [a.kind for a in c.tick(0) if a.kind == "elect"] == ["elect"] and c.primary is None


def test_the_first_election_waits_for_a_late_member_only_a_heartbeat_timeout():
    c = core3()
    beat(c, 1, 0, last=(1, 3), term=1)
    beat(c, 2, 0, last=(1, 3), term=1)
    assert not [a for a in c.tick(0) if a.kind == "elect"]
    assert [a.kind for a in c.tick(1000) if a.kind == "elect"] == ["elect"]


def test_membership_edits_and_joins_are_decided_by_the_core():
    """The coordinator and the simulation's coordinator share these: a removal
    never takes the primary (asked for or installed), a put replaces or adds
    in id order, and a joining member gets what it asked for once caught up."""
    import pytest
    from raymx import errors
    from raymx.actors.core.election import edit_config, keeps_primary, next_join
    three = [{"id": i, "votes": 1, "priority": 1} for i in range(3)]
    assert [m["id"] for m in edit_config(three, 0, remove=2)] == [0, 1]
    with pytest.raises(errors.ConfigError, match="member 0 is the primary"):
        edit_config(three, 0, remove=0)
    with pytest.raises(errors.ConfigError, match="no member 7"):
        edit_config(three, 0, remove=7)
    new = {"id": 5, "votes": 0, "priority": 0, "joining": {"votes": 1, "priority": 2}}
    four = edit_config(three, 0, put=new)
    assert [m["id"] for m in four] == [0, 1, 2, 5] and three[-1]["id"] == 2  # a copy
    # a removal asked while 0 was primary, installed after 2 was elected
    waited = edit_config(three, 0, remove=2)
    with pytest.raises(errors.ConfigError, match="member 2 is the primary"):
        keeps_primary(waited, 2)
    keeps_primary(waited, None)
    # a member removed while its election was under way is not taken as primary
    gone = core3()
    gone.reconfigure(edit_config(three, None, remove=2))
    gone.on_elected(2, 4)
    assert (gone.primary, gone.term) == (None, 4)
    c = core3()
    c.reconfigure(four)
    beat(c, 0, 0, last=(1, 5000), role="primary")
    c.on_elected(0, 1)
    assert next_join(c, four, 100) is None  # never heard from
    c.on_heartbeat(5, {"term": 1, "last": [1, 4000]}, 100)
    assert next_join(c, four, 100) is None  # too far behind
    c.on_heartbeat(5, {"term": 1, "last": [1, 4950]}, 200)
    mid, joined = next_join(c, four, 100)
    assert mid == 5 and joined[-1] == {"id": 5, "votes": 1, "priority": 2}
    assert four[-1]["joining"]  # the configuration given is not changed
    # a removed member may stop once a majority of the voters that remain
    # recorded the configuration without it (a restarted coordinator finds it)
    two = edit_config(three, 0, remove=2)
    c.reconfigure(two)
    assert not c.config_recorded(2, two)
    c.on_heartbeat(0, {"term": 1, "last": [1, 5000], "role": "primary", "config_version": 2}, 300)
    assert not c.config_recorded(2, two)  # 1 of the 2 voters
    c.on_heartbeat(1, {"term": 1, "last": [1, 5000], "config_version": 2}, 300)
    assert c.config_recorded(2, two)


def test_config_changes_move_one_voter_at_a_time():
    import pytest
    from raymx import errors
    from raymx.actors.core.election import check_config_change
    five = [{"id": i} for i in range(5)]
    assert check_config_change(five, five[:1] + five[2:]) is True
    assert check_config_change(five, five + [{"id": 5, "votes": 0}]) is False
    assert check_config_change(five, [dict(m, priority=0) for m in five]) is False
    with pytest.raises(errors.ConfigError, match=r"at most one voter.*\[1, 2\]"):
        check_config_change(five, [five[0]] + five[3:])
    with pytest.raises(errors.ConfigError, match="one voter"):
        check_config_change(five, [dict(m, votes=0) if m["id"] in (1, 2) else m for m in five])
    with pytest.raises(errors.ConfigError, match="at least one voting"):
        check_config_change([{"id": 0}], [{"id": 0, "votes": 0}])


def test_a_voter_is_removed_only_when_the_rest_hold_the_committed_point():
    """Issue 19's scenario: 0, 1 and 2 acknowledged 1:40; 3 and 4 lag."""
    from raymx.actors.core.election import committed_point, config_change_blockers
    five = [{"id": i} for i in range(5)]
    minus1 = [m for m in five if m["id"] != 1]
    durable = {0: GTID(1, 40), 1: GTID(1, 40), 2: GTID(1, 40), 3: GTID(1, 10), 4: GTID(1, 10)}
    mp = committed_point(five, durable)
    assert mp == GTID(1, 40)
    everyone, fence = [0, 1, 2, 3, 4], GTID(1, 1)
    why = config_change_blockers(five, minus1, everyone, 0, mp, fence, durable)
    assert len(why) == 1 and "new configuration" in why[0] and "[0, 2]" in why[0]
    durable[3] = GTID(1, 41)
    assert config_change_blockers(five, minus1, everyone, 0, mp, fence, durable) == []
    # writes acknowledged under the configuration before must be held by a
    # majority of the current one (its fence)
    why = config_change_blockers(five, minus1, everyone, 0, mp, GTID(1, 41), durable)
    assert len(why) == 1 and "current configuration" in why[0]
    # a removed member's position counts for nothing
    assert committed_point(minus1, {1: GTID(1, 40), 0: GTID(1, 40), 3: GTID(1, 2)}) is None
    # the current configuration must be recorded by a majority of its voters first
    why = config_change_blockers(five, minus1, [0, 1], 0, mp, fence, durable)
    assert len(why) == 1 and "recorded" in why[0]
    # and there must be a primary to tell what is committed
    assert "no primary" in config_change_blockers(five, minus1, everyone, None, None, None,
                                                  {})[0]


def test_the_protocol_cores_import_no_ray_threads_clock_randomness_or_lmdb():
    """Issue 20: the cores take time and randomness as inputs; a walk over their
    imports (not only the ones at the top of the file) finds none of these."""
    import ast
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    banned = {"ray", "threading", "time", "random", "lmdb"}
    core = os.path.join(root, "raymx", "actors", "core")
    files = sorted(f for f in os.listdir(core) if f.endswith(".py"))
    assert {"election.py", "replication.py", "gtid_manager.py", "member.py", "producer.py",
            "primary.py"} <= set(files)
    for rel in (os.path.join("raymx/actors/core", f) for f in files):
        tree = ast.parse(open(os.path.join(root, rel)).read())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for n in names:
                assert n.split(".")[0] not in banned, f"{rel} imports {n}"


# --- a primary whose disk is full hands over --------------------------------
def full_primary(now=0, p_last=(1, 9), **secondaries):
    """Member 0 primary in term 1, its disk full; members 1 and 2 as given
    (keyword ``mN`` = dict of ``beat`` arguments)."""
    c = core3()
    beat(c, 0, now, last=p_last, role="primary", disk_full=True, disk_free=0)
    c.on_elected(0, 1)
    for m in (1, 2):
        kw = dict(last=p_last, following=[0, 1])
        kw.update(secondaries.get(f"m{m}", {}))
        beat(c, m, now, **kw)
    return c


def test_a_primary_whose_disk_is_full_hands_over_to_a_member_with_room():
    c = full_primary(m1={"disk_free": 10 << 20})  # 1 has too little room
    acts = c.tick(100)
    assert [(a.kind, a.member, a.term, a.why) for a in acts] == [("elect", 2, 2, "disk_full")]
    assert c.log[-1] == ("disk_hand_over", 0, 2, 100)
    # the fence: the deposed primary answers too (as secondary); 2 is proposed and wins
    answers = {m: {"term": 2, "last": [1, 9], "role": "secondary", "state": "running",
                   "disk_full": m == 0, "disk_free": 0 if m == 0 else 1 << 40}
               for m in range(3)}
    assert c.fenced(acts[0], answers, 150) == 2


def test_no_hand_over_without_a_full_disk_or_a_member_with_room_and_everything():
    c = core3()  # a primary with room: nothing
    beat(c, 0, 0, last=(1, 9), role="primary")
    c.on_elected(0, 1)
    for m in (1, 2):
        beat(c, m, 0, last=(1, 9), following=[0, 1])
    assert c.tick(100) == []
    # every secondary full, short of room, behind, not running or not eligible
    for sec in ({"disk_full": True}, {"disk_free": DISK_ROOM_BYTES - 1}, {"disk_free": None},
                {"last": (1, 8)}, {"state": "recovering"}):
        c = full_primary(m1=sec, m2=sec)
        assert c.tick(100) == [], sec
    c = core3({1: {"priority": 0}, 2: {"hidden": True, "priority": 0}})
    beat(c, 0, 0, last=(1, 9), role="primary", disk_full=True)
    c.on_elected(0, 1)
    for m in (1, 2):
        beat(c, m, 0, last=(1, 9), following=[0, 1])
    assert c.tick(100) == []


def test_hand_overs_from_full_disks_are_spaced_out():
    c = full_primary()
    assert [a.kind for a in c.tick(100)] == ["elect"]
    # that election did not happen (its fence found no majority, say): the
    # primary stays, and the next try waits (a full disk everywhere must not
    # make elections loop)
    assert c.tick(200) == []
    assert c.tick(100 + DISK_HAND_OVER_EVERY_MS - 1) == []
    assert [a.kind for a in c.tick(100 + DISK_HAND_OVER_EVERY_MS)] == ["elect"]


def test_elections_prefer_a_member_with_room_among_equals():
    c = core3()
    beat(c, 0, 0, last=(1, 9), disk_full=True, disk_free=0)
    beat(c, 1, 0, last=(1, 9))
    beat(c, 2, 0, last=(1, 8))
    assert [(a.kind, a.member) for a in c.tick(0)] == [("elect", 1)]
    # but never one that lacks an entry
    c = core3()
    beat(c, 0, 0, last=(1, 9), disk_full=True, disk_free=0)
    beat(c, 1, 0, last=(1, 8))
    beat(c, 2, 0, last=(1, 8))
    assert [(a.kind, a.member) for a in c.tick(0)] == [("elect", 0)]


def test_a_restarted_coordinator_decides_nothing_until_it_knows_its_config_is_the_newest():
    """``config_standing``: a restarted coordinator (``settled`` False) elects
    no one and holds every change until a majority of its configuration's
    voters answered with nothing newer; a member reporting a newer
    configuration is named (the shell takes that member's), also once settled."""
    specs = [{"id": 0}, {"id": 1}, {"id": 2}]
    c = ElectionCore.from_specs(specs, heartbeat_timeout_ms=1000)
    c.settled = False
    beat(c, 0, 0, last=(1, 5))
    c.members[0].config_version = 3
    assert c.config_standing(3, specs) is None and not c.settled  # 1 of 3 voters heard
    assert c.tick(0) == [] and next_join(c, specs, 10) is None
    assert "heard from voters [0] of [0, 1, 2] only; it needs 2" in c.unsettled(specs)[0]
    beat(c, 1, 10, last=(1, 4))
    c.members[1].config_version = 2  # behind: it holds nothing newer
    assert c.config_standing(3, specs) is None and c.settled and c.unsettled(specs) == []
    assert c.tick(20) == []  # settled: its first round waits for member 2 (or a timeout)
    beat(c, 0, 1100, last=(1, 5))
    beat(c, 1, 1100, last=(1, 4))
    assert [(a.kind, a.member) for a in c.tick(1100)] == [("elect", 0)]
    c.members[2].alive, c.members[2].config_version = True, 5
    assert c.config_standing(3, specs) == 2  # newer, held by member 2: take it
    # an old configuration whose voters are gone: only a member's newer one helps
    c = ElectionCore.from_specs(specs, heartbeat_timeout_ms=1000)
    c.settled = False
    beat(c, 0, 0)
    c.members[0].config_version = 3
    assert c.config_standing(1, specs) == 0 and not c.settled
    c.reconfigure([{"id": 0}])
    assert c.config_standing(3, [{"id": 0}]) is None and c.settled
