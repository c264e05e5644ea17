"""pymongo through the MongoDB wire port against raymx's native driver, same
1-member set, same run: insert_one (w=1; j=True) from one client process and
from 8 client processes (the issue's shape: each process its own client,
closed loop, the same seconds), insert_many and find of N documents. Prints
both and the ratio (the issue's target: >= 0.7 of native). Then the ceiling:
the same client processes against a member that does no work
(bench/_noop.py: both ports over a service answering at once), so what is
the drivers' own cost and what the member's shows.

    PYTHONPATH=. RAY_AUTH_MODE=disabled python bench/wire.py [N]
"""
import multiprocessing as mp
import sys
import tempfile
import time

import pymongo
import ray

import raymx
from bench._util import docs, row

N_ONE = 3000
PROCS = 8
N_MANY_CEILING = 100_000
SECONDS = 5.0


def _client_proc(kind, url, j, k, start_at, end_at, out):
    """One closed-loop client process: insert_one until end_at; puts its count."""
    if kind == "native":
        import raymx
        coll = raymx.connect_url(url)["b"][f"p{int(j)}"]
        one = lambda d: coll.insert_one(d, w=1, j=j)  # noqa: E731
    else:
        cl = pymongo.MongoClient(url)
        coll = cl.get_database("b", write_concern=pymongo.WriteConcern(w=1, j=j))[f"q{int(j)}"]
        one = coll.insert_one
        coll.find_one({"_id": -1})  # connected and authenticated before the clock starts
    base, n = (k + 1) * 10_000_000 + (1_000_000 if kind != "native" else 0), 0
    while time.time() < start_at:
        time.sleep(0.001)
    while time.time() < end_at:
        one({"_id": base + n, "name": f"user{n:08d}", "age": n % 100, "city": "Oslo",
             "score": 0.5, "bio": "x" * 140})
        n += 1
    out.put(n)


def many_clients(kind, url, j, procs=PROCS) -> float:
    """insert_one/s of ``procs`` client processes over the same SECONDS."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 6.0  # the children import and connect meanwhile
    procs = [ctx.Process(target=_client_proc,
                         args=(kind, url, j, k, start_at, start_at + SECONDS, out))
             for k in range(procs)]
    for p in procs:
        p.start()
    total = sum(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    return total / SECONDS


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
        print(f"raymx wire port vs native driver, 1 member: insert_one x {N_ONE:,} from one "
              f"client process and for {SECONDS:g} s from {PROCS} client processes, "
              f"insert_many/find x {n_many:,}")
        results = []
        for label, j in (("w=1", False), ("j=True", True)):
            a = native["b"][f"n{label}"]
            r_native = timed(N_ONE, lambda: [a.insert_one(d, j=j) for d in docs(N_ONE)])
            for name, cl in (("pymongo retryWrites=false", mc_noretry), ("pymongo", mc)):
                c = cl.get_database("b", write_concern=pymongo.WriteConcern(w=1, j=j))[
                    f"{name[-5:]}{label}"]
                r = timed(N_ONE, lambda: [c.insert_one(d) for d in docs(N_ONE)])
                results.append((f"insert_one {label}: {name}", r, r_native))
        for label, j in (("w=1", False), ("j=True", True)):
            r_native = many_clients("native", rs.url(), j)
            r_wire = many_clients("pymongo", rs.mongodb_uri(), j)
            results.append((f"insert_one {label}, {PROCS} client processes: pymongo",
                            r_wire, r_native))
        big = docs(n_many)
        r_native = timed(n_many, lambda: native["b"]["many"].insert_many(big))
        r_wire = timed(n_many, lambda: mc.b.many2.insert_many(docs(n_many)))
        results.append(("insert_many", r_wire, r_native))
        r_native = timed(n_many, lambda: sum(1 for _ in native["b"]["many"].find({})))
        r_wire = timed(n_many, lambda: sum(1 for _ in mc.b.many2.find({})))
        results.append(("find (all)", r_wire, r_native))
        for name, r, base in results:
            row(f"{name} (native {base:,.0f}/s)", r, "docs/s", f"ratio {r / base:.2f}")
        ceiling()
        mc.close()
        mc_noretry.close()
    finally:
        rs.shutdown()
        ray.shutdown()


def ceiling() -> None:
    """The same insert_one client processes against a member doing no work."""
    from bench import _noop
    from raymx.wire import mongodb_uri
    ctx = mp.get_context("spawn")
    out, stop = ctx.Queue(), ctx.Event()
    srv = ctx.Process(target=_noop.serve, args=(out, stop), daemon=True)
    srv.start()
    try:
        cport, wport = out.get(timeout=60)
        url = f"raymx://:{_noop.SECRET}@127.0.0.1:{cport}/noop"
        uri = mongodb_uri("noop", {"secret": _noop.SECRET,
                                   "members": [{"wire": ["127.0.0.1", wport]}]})
        print("ceiling: the same clients against a member doing no work "
              "(bench/_noop.py)")
        for procs in (1, PROCS):
            native = many_clients("native", url, False, procs)
            wire = many_clients("pymongo", uri, False, procs)
            row(f"insert_one, {procs} client process(es): pymongo (native {native:,.0f}/s)",
                wire, "docs/s", f"ratio {wire / native:.2f}")
        import raymx
        native_c = raymx.connect_url(url)["b"]["c"]
        with pymongo.MongoClient(uri) as mc:
            native = timed(N_MANY_CEILING, lambda: native_c.insert_many(docs(N_MANY_CEILING)))
            wire = timed(N_MANY_CEILING, lambda: mc.b.c.insert_many(docs(N_MANY_CEILING)))
        native_c.client.close()
        row(f"insert_many x {N_MANY_CEILING:,}: pymongo (native {native:,.0f}/s)", wire,
            "docs/s", f"ratio {wire / native:.2f}")
    finally:
        stop.set()
        srv.join(10)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
