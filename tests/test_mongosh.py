"""mongosh (the npm package; ``./dev setup`` installs it into .tools/mongosh
when node and npm are present) runs a script against a 3-member set through
``rs.mongodb_uri()`` (the string pymongo takes too): documents with a Date and an ObjectId,
an index, a find, an aggregate with $group, ``rs.status()``, ``rs.conf()``,
``rs.printSecondaryReplicationInfo()``, ``db.getReplicationInfo()`` (what
``rs.printReplicationInfo()`` prints, from ``local.oplog.rs``) and
``db.currentOp()``, an oplog tailer (a tailable ``awaitData`` find of
``local.oplog.rs``), ``collMod`` of a TTL index, ``$indexStats`` and
``getDefaultRWConcern``; it prints JSON
that the test checks, and the native driver reads what mongosh wrote. Skipped,
saying why, when mongosh is not installed."""
import datetime
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
from bson import ObjectId

import raymx
from tests.test_replication import wait_until

ROOT = pathlib.Path(__file__).resolve().parent.parent
LOCAL = ROOT / ".tools" / "mongosh" / "node_modules" / ".bin" / "mongosh"

SCRIPT = r"""
const t = db.getSiblingDB("shapp").events;
const oid = ObjectId("65a1b2c3d4e5f60718293a4b");
const at = new Date("2026-11-25T06:00:00.123Z");
const ins = t.insertMany([
  {_id: oid, kind: "a", n: 1, at: at},
  {kind: "b", n: 2, at: new Date("2026-11-26T00:00:00Z")},
  {kind: "a", n: 3, at: at},
]);
const ix = t.createIndex({kind: 1, n: -1}, {name: "kind_n"});
let dup = null;
try { t.insertOne({_id: oid}); } catch (e) { dup = e.code; }
const one = t.findOne({_id: oid});
const found = t.find({kind: "a"}, {_id: 0, n: 1}).sort({n: -1}).toArray();
const groups = t.aggregate([
  {$group: {_id: "$kind", total: {$sum: "$n"}, count: {$sum: 1}, last: {$max: "$at"}}},
  {$sort: {_id: 1}}]).toArray();
const st = rs.status();
const conf = rs.conf();
const lag = rs.printSecondaryReplicationInfo();  // each secondary's lag behind the primary
const lagText = JSON.stringify(lag.value !== undefined ? lag.value : lag);
const probe = db.getSiblingDB("shapp").probe;
probe.insertOne({x: 1});  // creates it: one entry of two ops (applyOps)
probe.insertOne({x: 2});  // one op
const repl = db.getReplicationInfo();  // what rs.printReplicationInfo() prints: local.oplog.rs
const lastOp = db.getSiblingDB("local").oplog.rs.find({ns: "shapp.probe"})
  .sort({$natural: -1}).limit(1).toArray()[0];
// an oplog tailer from the last entry: it sees the next write
const tail = db.getSiblingDB("local").oplog.rs.find({ts: {$gt: lastOp.ts}, ns: "shapp.probe"})
  .tailable({awaitData: true});
probe.insertOne({x: 3});
const tailed = tail.hasNext() ? tail.next().o.x : null;
tail.close();
t.createIndex({at: 1});
const ttl = t.getDB().runCommand({collMod: "events",
  index: {keyPattern: {at: 1}, expireAfterSeconds: 86400}});
const usage = t.aggregate([{$indexStats: {}}]).toArray().map(x => x.name).sort();
print(JSON.stringify({
  inserted: Object.keys(ins.insertedIds).length,
  index: ix,
  indexes: t.getIndexes().map(i => i.name),
  dup: dup,
  oid: one._id instanceof ObjectId ? one._id.toHexString() : null,
  at: one.at instanceof Date ? one.at.toISOString() : null,
  found: found,
  groups: groups.map(g => [g._id, g.total, g.count, g.last.toISOString()]),
  count: t.countDocuments({}),
  members: st.members.map(m => m.stateStr).sort(),
  optimeDates: st.members.every(m => m.optimeDate instanceof Date && m.optimeDate > at),
  confHosts: conf.members.map(m => m.host).sort().join(",") ===
    st.members.map(m => m.name).sort().join(","),
  lagSources: (lagText.match(/source: /g) || []).length,
  behind: /secs \([0-9.]+ hrs\) behind the primary/.test(lagText),
  currentOp: db.currentOp().inprog.length > 0,
  startupWarnings: db.adminCommand({getLog: "startupWarnings"}).log.length,
  oplogMB: repl.configuredLogSizeMB,
  oplogWindow: repl.timeDiff >= 0 && typeof repl.tFirst === "string",
  lastOp: [lastOp.op, lastOp.ns, lastOp.o.x, lastOp.ts instanceof Timestamp],
  tailed: tailed,
  ttl: [ttl.ok, ttl.expireAfterSeconds_new],
  usage: usage,
  defaultW: db.adminCommand({getDefaultRWConcern: 1}).defaultWriteConcern.w,
}));
"""


def _mongosh() -> str:
    exe = str(LOCAL) if LOCAL.exists() else shutil.which("mongosh")
    if exe is None:
        why = ("mongosh is not installed: ./dev setup installs it into .tools/mongosh when "
               "node and npm are on PATH")
        print(f"test_mongosh: skipped: {why}", file=sys.stderr)
        pytest.skip(why)
    try:
        subprocess.run([exe, "--version"], check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        why = f"mongosh at {exe} does not run: {e}"
        print(f"test_mongosh: skipped: {why}", file=sys.stderr)
        pytest.skip(why)
    return exe


def test_mongosh_runs_a_script_against_a_three_member_set(ray_session, tmp_path):
    exe = _mongosh()
    rs = raymx.ReplicaSet.launch("mongosh3", members=3, data_dir=str(tmp_path / "rs"))
    try:
        rs.wait_for_primary()
        wait_until(lambda: len(rs._topology()["members"]) == 3
                   and all(m.get("wire") for m in rs._topology()["members"]), timeout_s=60)
        uri = rs.mongodb_uri()
        script = tmp_path / "script.js"
        script.write_text(SCRIPT)
        r = subprocess.run([exe, uri, "--quiet", "--norc", "--file", str(script)],
                           capture_output=True, text=True, timeout=180,
                           env=dict(os.environ, HOME=str(tmp_path)))  # its logs go there
        assert r.returncode == 0, f"mongosh failed:\n{r.stdout}\n{r.stderr}"
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out == {
            "inserted": 3, "index": "kind_n", "indexes": ["_id_", "kind_n", "at_1"],
            "dup": 11000,  # a duplicate _id: MongoDB's code, mongosh's MongoServerError
            "oid": "65a1b2c3d4e5f60718293a4b", "at": "2026-11-25T06:00:00.123Z",
            "found": [{"n": 3}, {"n": 1}],
            "groups": [["a", 4, 2, "2026-11-25T06:00:00.123Z"],
                       ["b", 2, 1, "2026-11-26T00:00:00.000Z"]],
            "count": 3, "members": ["PRIMARY", "SECONDARY", "SECONDARY"],
            "optimeDates": True, "confHosts": True, "lagSources": 2, "behind": True,
            "currentOp": True,
            "startupWarnings": 0,
            "oplogMB": 1024, "oplogWindow": True, "lastOp": ["i", "shapp.probe", 2, True],
            "tailed": 3, "ttl": [1, 86400], "usage": ["_id_", "at_1", "kind_n"],
            "defaultW": "majority",
        }, out
        # what mongosh wrote is stored natively: the native driver reads the types back
        coll = rs.client()["shapp"]["events"]
        doc = coll.find_one(ObjectId("65a1b2c3d4e5f60718293a4b"))
        assert doc["at"] == datetime.datetime(2026, 11, 25, 6, 0, 0, 123000)
        assert [i["name"] for i in coll.list_indexes()] == ["_id_", "kind_n", "at_1"]
        assert all(type(d["_id"]) is ObjectId for d in coll.find())  # mongosh made the others
    finally:
        rs.shutdown()
