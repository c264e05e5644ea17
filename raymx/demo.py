"""The README's main job (``./dev demo``): a replica set on a local Ray instance."""
from __future__ import annotations

import os
import sys
import time


def main(argv=None) -> int:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    import raymx
    from raymx.replset import format_status

    data = os.path.abspath(os.environ.get("RAYMX_DEMO_DIR", "raymx-data"))
    print(f"== starting a local Ray instance and a 3-member replica set 'demo' (data under {data})")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    t0 = time.time()
    # one machine here: pack the members on it (the default spreads them over
    # the cluster's nodes, and warns when they must share one)
    rs = raymx.ReplicaSet.launch("demo", members=3, data_dir=os.path.join(data, "demo"),
                                 placement="pack")
    print(f"   launched in {time.time() - t0:.1f}s")
    try:
        client = rs.client()
        orders = client["shop"]["orders"]
        orders.drop()
        r = orders.insert_many([{"_id": i, "sku": f"s{i % 3}", "qty": i, "ship": {"city": c}}
                                for i, c in zip(range(9), ["Oslo", "Lima", "Pune"] * 3)])
        print(f"== wrote {len(r.inserted_ids)} orders at GTID {r.gtid}")
        orders.create_index("sku")
        print("== read: orders of sku s1 shipped to Lima, newest first")
        for d in orders.find({"sku": "s1", "ship.city": "Lima"}, sort=[("_id", -1)]):
            print("  ", d)
        print("== a transaction: move 5 units from order 0 to order 1 (one GTID, j=True)")
        with client.transaction(j=True) as tx:
            o = tx["shop"]["orders"]
            o.update_one({"_id": 0}, {"$inc": {"qty": -5}})
            o.update_one({"_id": 1}, {"$inc": {"qty": 5}})
        print(f"   committed durably at {tx.gtid}: ",
              [orders.find_one({"_id": i})["qty"] for i in (0, 1)])
        print("== replication: 2,000 writes, then where every member stands")
        t0 = time.time()
        for i in range(20):
            orders.insert_many([{"_id": f"bulk{i}-{k}", "qty": k} for k in range(100)])
        g = orders.insert_one({"_id": "marker"}, w="majority", wtimeout_ms=10_000).gtid
        print(f"   {g} acknowledged by a majority after {time.time() - t0:.2f}s")
        print(format_status(rs.status()))
        sec = client.with_options(read_preference=raymx.ReadPreference("secondary", after=g))
        print("   read on a secondary after", g, "->", sec["shop"]["orders"].count_documents({}),
              "orders")
        print("== the oplog (newest 4 entries)")
        for e in list(rs.oplog())[-4:]:
            kinds = {}
            for op in e.ops:
                kinds[op["op"]] = kinds.get(op["op"], 0) + 1
            print(f"   {e.gtid}  h={e.h:016x}  ops: "
                  + ", ".join(f"{n} x {k}" for k, n in kinds.items()))
        print("== status (raymx status demo prints the same)")
        time.sleep(0.3)
        print(format_status(rs.status()))
        _failover(rs, client, format_status)
        _snapshot_member(rs, client, format_status)
        _spark_pipeline(rs, client, format_status)
    finally:
        rs.shutdown()
        ray.shutdown()
    return 0


def _failover(rs, client, format_status) -> None:
    import raymx
    ray = __import__("ray")
    old = rs.wait_for_primary()
    orders = client["shop"]["orders"]
    print(f"== failover: member {old} is primary; two writes with w=1 that no secondary gets")
    for i in range(3):
        if i != old:
            ray.get(ray.get_actor(f"{rs.name}/m{i}/producer", namespace="raymx").pause.remote(True))
    for k in ("unreplicated-1", "unreplicated-2"):
        print("   wrote", k, "at", orders.insert_one({"_id": k}, w=1).gtid)
    print(f"== killing every process of member {old} (no restart)")
    t0 = time.time()
    rs.kill_member(old)
    while True:
        try:
            g = orders.insert_one({"_id": "after-failover"}, w="majority").gtid
            break
        except raymx.errors.ConnectionLost as e:
            print("   a write in flight to the dead primary:", e.msg.split(";")[-1].strip())
    took = time.time() - t0
    st = rs.status()
    print(f"   member {st['primary']} took over in term {st['term']}: first majority write "
          f"{g} {took:.2f}s after the kill (election {st['last_election']['took_ms']} ms "
          "after the last heartbeat the old primary answered)")
    print(f"== bringing member {old} back: it rolls back what only it had")
    rs.start_member(old)
    deadline = time.time() + 60
    while time.time() < deadline:
        m = [x for x in rs.status()["members"] if x["id"] == old][0]
        if m.get("rollbacks") and m.get("lag") == 0:
            break
        time.sleep(0.2)
    rb = m.get("last_rollback") or {}
    print(f"   rolled back {rb.get('undone_entries')} entries after {rb.get('common')}; "
          f"the rollback file {rb.get('file')}:")
    for line in open(rb["file"]) if rb.get("file") else []:
        print("     ", line.strip())
    print(format_status(rs.status()))


def _clear_next_member_folder(rs) -> None:
    """The folder the next added member gets, left by an interrupted earlier run."""
    import shutil
    cfg = rs.config()
    shutil.rmtree(os.path.join(os.path.dirname(cfg["members"][0]["path"]),
                               f"m{max(m['id'] for m in cfg['members']) + 1}"), ignore_errors=True)


def _snapshot_member(rs, client, format_status) -> None:
    """A fourth member created from a snapshot while a writer keeps committing."""
    import threading
    orders = client["shop"]["orders"]
    n0 = 20_000
    print(f"== a new member from a snapshot: {n0:,} more orders first, then a writer keeps going")
    _clear_next_member_folder(rs)
    for i in range(0, n0, 1000):
        orders.insert_many([{"_id": f"snap{i + k}", "qty": k, "sku": f"s{k % 3}"}
                            for k in range(1000)])
    stop, wrote = threading.Event(), [0]

    def writer():
        c = rs.client()["shop"]["orders"]
        while not stop.is_set():
            c.insert_one({"_id": f"live{wrote[0]}", "qty": 1})
            c.update_one({"_id": f"snap{wrote[0] % n0}"}, {"$inc": {"qty": 1}})
            wrote[0] += 1
    t = threading.Thread(target=writer, daemon=True)
    t.start()
    try:
        time.sleep(0.5)
        t0 = time.time()
        mid = rs.add_member(initial_sync="snapshot")  # progress bars on stderr
        took = time.time() - t0
    finally:
        stop.set()
        t.join(30)
    st = {m["id"]: m for m in rs.status()["members"]}
    print(f"   member {mid} copied, verified and caught up in {took:.1f}s while the writer "
          f"committed {wrote[0]:,} more transactions; now {st[mid]['state']} with "
          f"{st[mid]['votes']} vote")
    g = orders.insert_one({"_id": "after-snapshot"}, w=len(st), wtimeout_ms=30_000).gtid
    print(f"   a write acknowledged by all {len(st)} members at {g}")
    print(format_status(rs.status()))
    # the demo runs again over the same folder: take the extra member out again
    import shutil
    rs.remove_member(mid)
    shutil.rmtree(st[mid]["path"], ignore_errors=True)


def _spark_pipeline(rs, client, format_status) -> None:
    """The data pipeline on Spark (RayDP, on the same Ray cluster): a DataFrame
    written into the set, that write's changes read back, a read with a filter
    pushed down to an index, and a member created through Spark."""
    import shutil

    from raymx.spark_bridge import (read_changes, read_collection, spark_session, stop_spark,
                                    stream_changes, write_dataframe)
    print("== Spark on the same Ray cluster (RayDP): starting it")
    t0 = time.time()
    spark = spark_session(rs)
    print(f"   up in {time.time() - t0:.1f}s")
    query = None
    try:
        events = client["shop"]["events"]
        events.drop()
        events.create_index("kind")
        # the oplog archive: Parquet segments of every majority-committed op
        # (this run's own: an earlier run's folder belongs to another history)
        folder = os.path.join(os.path.dirname(rs.config()["members"][0]["path"]), "archive")
        shutil.rmtree(folder, ignore_errors=True)
        rs.set_archive(folder, lag_s=0.5)
        mark = events.insert_one({"_id": -1, "kind": "start"}, w="majority").gtid
        n = 50_000  # (the whole demo stays under two minutes on a 2-core machine)
        # a streaming query consuming the write's changes as they are archived
        seen = {}  # micro-batch id -> (ops, newest seq, when): idempotent per batch

        def consume(bdf, batch_id):
            r = bdf.groupBy().agg({"seq": "max", "*": "count"}).collect()[0]
            seen[batch_id] = (r["count(1)"], r["max(seq)"], time.time())
        ckpt = os.path.join(os.path.dirname(folder), "stream-checkpoint")
        shutil.rmtree(ckpt, ignore_errors=True)
        spark.sparkContext.setLogLevel("ERROR")  # Spark warns of a slow micro-batch
        query = stream_changes(spark, rs, after=mark, checkpoint=ckpt, process=consume,
                               ns="shop.events", trigger_s=0.5)
        query.processAllAvailable()  # running (its first batch) before the write starts
        df = spark.range(n).selectExpr("id as _id", "concat('k', id % 10) as kind",
                                       "id * 3 as amount")
        t0 = time.time()
        out = write_dataframe(df, rs, "shop.events", mode="append", w=1)
        took = time.time() - t0
        print(f"== a Spark job wrote {out.written:,} documents in {took:.2f}s "
              f"({out.written / took:,.0f}/s; every task straight to the primary), newest at "
              f"{out.gtid}")
        done = t0 + took
        while time.time() < done + 60 and max((v[1] or 0 for v in seen.values()),
                                               default=0) < out.gtid.seq:
            time.sleep(0.1)
        got = sum(v[0] for v in seen.values())
        last = max((v[2] for v in seen.values()), default=done)
        print(f"== a streaming query (Spark Structured Streaming over the oplog archive) "
              f"consumed {got:,} changes of that write in {sum(1 for v in seen.values() if v[0])} "
              f"micro-batches, the last {last - done:.2f}s after the write returned "
              f"(a segment at most 0.5s after commit, a micro-batch every 0.5s)")
        query.stop()
        query = None
        spark.sparkContext.setLogLevel("WARN")
        t0 = time.time()
        changes = read_changes(spark, rs, after=mark, until=out.gtid, ns="shop.events")
        ops = changes.groupBy("op").count().collect()
        print(f"   its changes as a DataFrame: {dict((r['op'], r['count']) for r in ops)} "
              f"in {time.time() - t0:.2f}s")
        t0 = time.time()
        k3 = read_collection(spark, rs, "shop.events", filter={"kind": "k3"},
                             columns=["_id", "amount"])
        total = k3.groupBy().sum("amount").collect()[0][0]
        plan = k3.read_plan
        print(f"== a Spark read with the filter pushed down: kind = 'k3' read "
              f"{plan['keys']:,} keys ({plan['plan']}) in {time.time() - t0:.2f}s; "
              f"sum(amount) = {total:,} as of {k3.snapshot_gtid}")
        print("== a new member created through Spark (snapshot copy by a Spark job)")
        _clear_next_member_folder(rs)
        t0 = time.time()
        mid = rs.add_member(initial_sync="snapshot", spark=spark)
        took = time.time() - t0
        deadline = time.time() + 10  # until its sync source confirms its position
        while True:
            st = {m["id"]: m for m in rs.status()["members"]}
            if st[mid]["state"] == "running" or time.time() > deadline:
                break
            time.sleep(0.1)
        print(f"   member {mid} copied and caught up in {took:.1f}s; now {st[mid]['state']}")
        print(format_status(rs.status()))
        rs.remove_member(mid)  # the demo runs again over the same folder
        shutil.rmtree(st[mid]["path"], ignore_errors=True)
    finally:
        if query is not None:
            query.stop()
        stop_spark()


if __name__ == "__main__":
    sys.exit(main())
