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
    print(f"== starting a local Ray instance and replica set 'demo' (data under {data})")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    t0 = time.time()
    rs = raymx.ReplicaSet.launch("demo", members=1, data_dir=os.path.join(data, "demo"))
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
        print("== the oplog (newest 4 entries)")
        for e in list(rs.oplog())[-4:]:
            print(f"   {e.gtid}  h={e.h:016x}  ops={[op['op'] for op in e.ops]}")
        print("== status")
        print(format_status(rs.status()))
    finally:
        rs.shutdown()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
