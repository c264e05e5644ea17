"""Remove the primary's node from a multi-node Ray cluster (run as a script).

Run by tests/test_failover.py in a subprocess: it needs its own Ray cluster
(``ray.cluster_utils.Cluster``), one member per simulated node, with the fast
health-check settings that make Ray declare a lost node dead in about a second.
"""
import os
import sys
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

import raymx  # noqa: E402

FAST = {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
        "health_check_timeout_ms": 500, "health_check_initial_delay_ms": 0}


def main(data_dir: str) -> int:
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": False, "_system_config": FAST})
    workers = [c.add_node(num_cpus=1) for _ in range(3)]
    c.wait_for_nodes()
    ray.init(address=c.address, namespace="raymx", log_to_driver=False)
    try:
        # default placement: one member per node while there are nodes (5
        # members on 4 nodes: all 4 used, one pair shares a node, with a warning)
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            five = raymx.ReplicaSet.launch("five", members=5,
                                           data_dir=os.path.join(data_dir, "five"))
        assert any("share a node" in str(x.message) for x in caught), \
            [str(x.message) for x in caught]
        st = five.status()["members"]
        assert len({m["node_id"] for m in st}) == 4 and sum(bool(m["shares_node"])
                                                            for m in st) == 2
        five.shutdown()
        # placement="pack": every member on the driver's node, whatever the
        # cluster has (the decision alone: launching it costs 5 s and shows
        # nothing more than the launches here, which pin members the same way)
        from raymx.members import _place
        here = ray.get_runtime_context().get_node_id()
        specs = [{"id": i, "path": os.path.join(data_dir, "pack", f"m{i}")} for i in range(3)]
        assert _place(ray, specs, None, "pack") == [here] * 3
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rs = raymx.ReplicaSet.launch("nodes", members=3, data_dir=data_dir,
                                         node_ids=[w.node_id for w in workers])
        assert not any("share a node" in str(x.message) for x in caught)
        st = rs.status()["members"]
        assert [m["node_id"] for m in st] == [w.node_id for w in workers]
        assert not any(m["shares_node"] for m in st)
        old = rs.wait_for_primary()
        coll = rs.client(w="majority", wtimeout_ms=10_000)["n"]["c"]
        acked = [coll.insert_one({"_id": i}).inserted_id for i in range(50)]
        t0 = time.time()
        c.remove_node(workers[old], allow_graceful=False)  # the primary's node dies
        # its worker processes outlive the raylet for a moment and may still take
        # writes; the set is failed over once another member is primary
        k = 0
        while time.time() - t0 < 60:
            k += 1
            try:
                acked.append(coll.insert_one({"_id": f"after{k}"}).inserted_id)
                if rs._topology()["primary"] not in (None, old):
                    break
            except (raymx.errors.ConnectionLost, raymx.errors.PrimaryUnavailable):
                pass  # outcome unknown, or no primary yet: not counted as acknowledged
        took = time.time() - t0
        st = rs.status()
        new = st["primary"]
        have = {d["_id"] for d in coll.find({})}
        lost = [i for i in acked if i not in have]
        print(f"old={old} new={new} took={took:.2f}s lost={len(lost)}", flush=True)
        ok = new is not None and new != old and not lost
        rs.shutdown()
        return 0 if ok else 1
    finally:
        ray.shutdown()
        c.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
