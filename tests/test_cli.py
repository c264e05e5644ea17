"""``raymx status`` against a running replica set (in-process, on the session's Ray)."""
import json

from click.testing import CliRunner

from raymx.cli import main


def test_status_table_and_json(replset):
    g = replset.client()["a"]["b"].insert_one({"_id": 1}).gtid
    r = CliRunner().invoke(main, ["status", replset.name])
    assert r.exit_code == 0, r.output
    assert "primary" in r.output and "running" in r.output and "1:1" not in r.output.split()[0]
    r = CliRunner().invoke(main, ["status", replset.name, "--json"])
    st = json.loads(r.output)
    assert st["members"][0]["role"] == "primary" and st["members"][0]["last"] == list(g)


def test_status_of_unknown_set_fails_clearly(ray_session):
    r = CliRunner().invoke(main, ["status", "nosuchset"])
    assert r.exit_code == 1 and "no replica set named 'nosuchset'" in r.output


def test_revert_asks_then_reverts(replset):
    coll = replset.client()["a"]["r"]
    g = coll.insert_one({"_id": 1}).gtid
    coll.insert_one({"_id": 2})
    coll.update_one({"_id": 1}, {"$set": {"x": 1}})
    r = CliRunner().invoke(main, ["revert", replset.name, str(g)], input="n\n")
    assert r.exit_code == 1 and "undo 2 entries" in r.output and "a.r: 1 insert, 1 update" in r.output
    assert coll.count_documents({}) == 2  # declined: nothing changed
    r = CliRunner().invoke(main, ["revert", replset.name, str(g), "--dry-run"])
    assert r.exit_code == 0 and coll.count_documents({}) == 2
    r = CliRunner().invoke(main, ["revert", replset.name, str(g)], input="y\n")
    assert r.exit_code == 0 and "2 entries undone" in r.output, r.output
    assert list(coll.find({})) == [{"_id": 1}]
    r = CliRunner().invoke(main, ["revert", replset.name, "99:1", "--yes"])
    assert r.exit_code == 1 and "after the oplog's last entry" in r.output


def test_resync_asks_then_rebuilds_a_secondary(ray_session, tmp_path):
    import raymx
    from raymx.replset import format_status
    rs = raymx.ReplicaSet.launch("clirs", members=2, data_dir=str(tmp_path))
    try:
        coll = rs.client()["a"]["s"]
        coll.insert_many([{"_id": i} for i in range(100)], w=2)
        r = CliRunner().invoke(main, ["resync", "clirs", "1"], input="n\n")
        assert r.exit_code == 1 and not list(tmp_path.glob("m1.resync-*"))  # declined
        r = CliRunner().invoke(main, ["resync", "clirs", "1", "--yes"])
        assert r.exit_code == 0 and "resynced from member 0" in r.output, r.output
        # not a TTY: progress as plain lines (raymx.progress), the last one "done"
        assert "member 1 of clirs: " in r.output and ": done, " in r.output, r.output
        assert "\r" not in r.output
        assert len(list(tmp_path.glob("m1.resync-*"))) == 1  # moved aside, not deleted
        assert coll.insert_one({"_id": "x"}, w=2, wtimeout_ms=20_000).gtid  # it votes again
        r = CliRunner().invoke(main, ["resync", "clirs", "0", "--yes"])
        assert r.exit_code == 1 and "is the primary" in r.output
    finally:
        rs.shutdown()
    out = format_status({"set": "x", "members": [{"id": 2, "role": "secondary",
                                                   "state": "resync"}]})
    assert "member 2 needs a resync" in out and "raymx resync x 2" in out


def test_launch_ls_url_oplog_watch_step_down_and_members(ray_session, tmp_path):
    """The rest of the CLI (issue 23, part), each command end to end."""
    import raymx
    run = CliRunner().invoke
    r = run(main, ["launch", "clifull", "--members", "3", "--placement", "pack",
                   "--data-dir", str(tmp_path / "d")])
    assert r.exit_code == 0 and "primary 0" in r.output and "raymx://" in r.output, r.output
    try:
        assert "clifull" in run(main, ["ls"]).output.split()
        r = run(main, ["url", "clifull", "--secret"])
        assert r.exit_code == 0 and r.output.startswith("raymx://:") and "@" in r.output
        c = raymx.connect_url(r.output.strip())
        c["a"]["b"].insert_many([{"_id": i} for i in range(3)], w=3)
        r = run(main, ["url", "clifull", "--secret", "--mongodb"])
        assert r.exit_code == 0 and r.output.startswith("mongodb://raymx:"), r.output
        import pymongo
        with pymongo.MongoClient(r.output.strip(), serverSelectionTimeoutMS=30_000) as mc:
            assert mc.a.b.count_documents({}) == 3  # pymongo takes it as is
        r2 = run(main, ["url", "clifull", "--secret", "--pymongo"])  # UUIDs as stored
        assert r2.output.strip() == r.output.strip() + "&uuidRepresentation=standard", r2.output
        r = run(main, ["oplog", "clifull", "--limit", "5"])
        assert r.exit_code == 0 and "i a.b" in r.output, r.output
        r = run(main, ["watch", "clifull", "--after", "0:0", "--limit", "4"])
        evs = [json.loads(x) for x in r.output.splitlines()]
        assert [e["op"] for e in evs] == ["create"] + ["insert"] * 3, r.output
        r = run(main, ["status", "clifull", "--json"])
        assert r.exit_code == 0 and len(json.loads(r.output)["members"]) == 3
        r = run(main, ["step-down", "clifull"])
        assert r.exit_code == 0 and "is primary in term 2" in r.output, r.output
        prim = raymx.connect("clifull").wait_for_primary()
        r = run(main, ["remove-member", "clifull", str(prim)])
        assert r.exit_code == 1 and "is the primary" in r.output and "Traceback" not in r.output
        other = next(i for i in range(3) if i != prim)
        r = run(main, ["remove-member", "clifull", str(other)])
        assert r.exit_code == 0, r.output
        r = run(main, ["add-member", "clifull", "--initial-sync", "oplog"])
        assert r.exit_code == 0 and "member 3 added" in r.output, r.output
        r = run(main, ["backup", "clifull", str(prim), str(tmp_path / "bk")])
        assert r.exit_code == 0 and "copied to" in r.output, r.output
    finally:
        raymx.connect("clifull").shutdown()
    r = run(main, ["step-down", "clifull"])
    assert r.exit_code == 1 and "Traceback" not in r.output


def test_logs_show_a_rollback_first_then_warnings_newest_last(ray_session, tmp_path):
    """``raymx logs``: a real rollback (an old primary's unreplicated writes)
    is listed first, from its file, and the producer's warning about it is
    among the warnings and errors, read from the members' processes."""
    import raymx
    from tests.test_replication import converged, wait_until
    ray = ray_session
    run = CliRunner().invoke
    rs = raymx.ReplicaSet.launch("clilogs", members=3, data_dir=str(tmp_path), placement="pack")
    try:
        old = rs.wait_for_primary()
        r = run(main, ["logs", "clilogs"])
        assert r.exit_code == 0 and "no rollbacks in clilogs" in r.output, r.output
        coll = rs.client(w=1)["r"]["c"]
        coll.insert_many([{"_id": i} for i in range(5)], w="majority")
        for i in range(3):
            if i != old:
                ray.get(ray.get_actor(f"clilogs/m{i}/producer", namespace="raymx")
                        .pause.remote(True))
        for i in range(3):
            coll.insert_one({"_id": f"lost{i}"})  # w1: never replicated
        rs.kill_member(old)
        wait_until(lambda: rs._topology()["primary"] not in (None, old), timeout_s=20)
        # a new client: ``coll``'s connection to the killed member may not have
        # seen its close yet, and a write sent there ends with an unknown outcome
        rs.client()["r"]["c"].insert_one({"_id": "new"}, w="majority")
        rs.start_member(old)
        wait_until(lambda: converged(ray, rs, [0, 1, 2]), timeout_s=60)
        r = run(main, ["logs", "clilogs"])
        assert r.exit_code == 0, r.output
        lines = r.output.splitlines()
        assert lines[0] == "rollbacks of clilogs (oldest first):", r.output
        assert f"member {old}: 3 op(s) undone, saved in " in lines[1]
        assert "rollback-" in lines[1] and lines[1].endswith(".jsonl")
        warn = [x for x in lines if f"member {old} producer  WARNING" in x]
        assert any(f"member {old} rolled back 3 entries" in x for x in warn), r.output
        assert lines.index("warnings and errors (newest last):") > 1
        # one member only; JSON; a member that is not there: one line, no traceback
        r = run(main, ["logs", "clilogs", str(old), "--json"])
        got = json.loads(r.output)
        assert [x["member"] for x in got["rollbacks"]] == [old]
        assert {x["member"] for x in got["records"]} == {old}
        others = [i for i in range(3) if i != old]
        r = run(main, ["logs", "clilogs", str(others[0])])
        assert r.exit_code == 0 and "no rollbacks in clilogs" in r.output
        r = run(main, ["logs", "clilogs", "7"])
        assert r.exit_code == 1 and "has no member 7" in r.output
        assert "Traceback" not in r.output and len(r.output.splitlines()) == 1
    finally:
        rs.shutdown()
    r = run(main, ["logs", "clilogs"])
    assert r.exit_code == 1 and "no replica set named 'clilogs'" in r.output, r.output
    assert len(r.output.splitlines()) == 1
