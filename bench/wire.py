"""pymongo through the MongoDB wire port against raymx's native driver, same
1-member set, same run: insert_one (w=1; j=True), insert_many and find of N
documents. Prints both and the ratio (the issue's target: >= 0.7 of native).

    PYTHONPATH=. RAY_AUTH_MODE=disabled python bench/wire.py [N]
"""
import sys
import tempfile
import time

import pymongo
import ray

import raymx
from bench._util import docs, row

N_ONE = 3000


def timed(n, fn):
    t0 = time.perf_counter()
    fn()
    return n / (time.perf_counter() - t0)


def main(n_many=100_000):
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    rs = raymx.ReplicaSet.launch("wirebench", members=1, data_dir=tempfile.mkdtemp())
    try:
        rs.wait_for_primary()
        native = rs.client()
        mc = pymongo.MongoClient(rs.mongodb_uri())
        mc_noretry = pymongo.MongoClient(rs.mongodb_uri() + "&retryWrites=false")
        print(f"raymx wire port vs native driver, 1 member, one client process "
              f"(insert_one x {N_ONE:,}, insert_many/find x {n_many:,})")
        results = []
        for label, j in (("w=1", False), ("j=True", True)):
            a = native["b"][f"n{label}"]
            r_native = timed(N_ONE, lambda: [a.insert_one(d, j=j) for d in docs(N_ONE)])
            for name, cl in (("pymongo retryWrites=false", mc_noretry), ("pymongo", mc)):
                c = cl.get_database("b", write_concern=pymongo.WriteConcern(w=1, j=j))[
                    f"{name[-5:]}{label}"]
                r = timed(N_ONE, lambda: [c.insert_one(d) for d in docs(N_ONE)])
                results.append((f"insert_one {label}: {name}", r, r_native))
        big = docs(n_many)
        r_native = timed(n_many, lambda: native["b"]["many"].insert_many(big))
        r_wire = timed(n_many, lambda: mc.b.many2.insert_many(docs(n_many)))
        results.append(("insert_many", r_wire, r_native))
        r_native = timed(n_many, lambda: sum(1 for _ in native["b"]["many"].find({})))
        r_wire = timed(n_many, lambda: sum(1 for _ in mc.b.many2.find({})))
        results.append(("find (all)", r_wire, r_native))
        for name, r, base in results:
            row(f"{name} (native {base:,.0f}/s)", r, "docs/s", f"ratio {r / base:.2f}")
        mc.close()
        mc_noretry.close()
    finally:
        rs.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
