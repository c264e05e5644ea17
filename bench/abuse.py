"""Hostile clients against one member's client port (issue 24, part 3).

A well-behaved client (this process, over TCP) runs the same workload twice:
on a quiet member, then while 2,000 unauthenticated connections sit on the
port (held open from 40 loopback source addresses, 50 each: under the
per-address limit, so all are admitted; each reconnects when the member
drops it at the hello timeout) and one abusive authenticated client works
every limit as fast as it can (pipelined scans, filters nested 300 deep,
transactions and multi-part inserts past their per-connection limits, reads
parked after a far-future GTID up to their limit). Its p50/p99 latency is
printed for both runs, and the ratio.

The member is the real client port and shard service (real LMDB, default
``Limits``) in a process of its own, without Ray; the unauthenticated
connections and the abuser are processes of their own. Each process raises
its soft file-descriptor limit (RLIMIT_NOFILE) to the hard limit: 2,000
connections need more than the usual soft limit of 1,024.

    PYTHONPATH=. .venv/bin/python bench/abuse.py [--ops 3000] [--unauth 2000]
"""
import argparse
import json
import os
import random
import resource
import socket
import struct
import subprocess
import sys
import tempfile
import time

import msgpack

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECRET = "bench-secret"


def raise_fd_limit(need: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def frame(obj) -> bytes:
    b = msgpack.packb(obj)
    return struct.pack(">I", len(b)) + b


# --- the member -------------------------------------------------------------
def serve(path: str) -> None:
    from raymx.actors.server import ClientPort
    from raymx.actors.shard import ShardService
    from raymx.storage.engine import Engine
    from raymx.storage.limits import Limits
    from raymx.storage.lmdb_store import LMDBStore
    raise_fd_limit(10_000)
    lim = Limits()
    e = Engine(LMDBStore(path, map_bytes=1 << 32), lim)
    svc = ShardService(e, lim)
    p = ClientPort(svc, SECRET, "127.0.0.1", lim.frame_bytes_max, {"member": 0}, unix=False,
                   limits=lim)
    print(json.dumps({"port": p.port}), flush=True)
    sys.stdin.read()  # until the driver closes our stdin
    a = p.admission
    print(json.dumps({"open": a.open, "refused": a.refused, "connections": p.connections,
                      "after_waits": svc.after_waits.counters()}), flush=True)
    p.close()
    svc.close()
    e.store.close()


# --- 2,000 unauthenticated connections ---------------------------------------
def unauth(port: int, n: int, per_addr: int) -> None:
    import selectors
    raise_fd_limit(n + 1000)
    sel = selectors.DefaultSelector()
    addrs = [f"127.0.{1 + i // 200}.{1 + i % 200}" for i in range((n + per_addr - 1) // per_addr)]
    slots = [addrs[i // per_addr] for i in range(n)]
    stats = {"opened": 0, "dropped": 0, "failed": 0}

    def open_one(i):
        s = socket.socket()
        try:
            s.bind((slots[i], 0))
            s.connect(("127.0.0.1", port))
        except OSError:
            s.close()
            stats["failed"] += 1
            return
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, i)
        stats["opened"] += 1

    for i in range(n):
        open_one(i)
    print(json.dumps({"held": len(sel.get_map())}), flush=True)
    import threading
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    while not stop.is_set():
        for key, _ in sel.select(0.2):
            s, i = key.fileobj, key.data
            try:
                if s.recv(65536):
                    continue  # the member's "no hello" answer: the close follows
            except OSError:
                pass
            sel.unregister(s)
            s.close()
            stats["dropped"] += 1
            open_one(i)  # straight back
    print(json.dumps(dict(stats, held=len(sel.get_map()))), flush=True)


# --- one abusive authenticated client ------------------------------------------
def abuser(port: int, kinds: set) -> None:
    import threading

    from raymx.client import Connection
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    c = Connection("127.0.0.1", port, SECRET, timeout_s=60)
    seen: dict = {}

    def tally(f):
        e = f.exception()
        k = "ok" if e is None else type(e).__name__
        seen[k] = seen.get(k, 0) + 1

    deep = {"a": 1}
    for _ in range(300):
        deep = {"$and": [deep]}
    c.request({"op": "insert", "ns": "abuse.big", "docs": [{"_id": i, "pad": "z" * 200}
                                                           for i in range(5000)]})
    last = c.request({"op": "insert", "ns": "abuse.big", "docs": [{"_id": -1}]})["gtid"]
    far = [last[0], last[1] + 10**9]
    rid = 10**6
    s = socket.create_connection(("127.0.0.1", port))  # raw frames: parts and txns
    s.sendall(frame({"id": 1, "op": "hello", "secret": SECRET}))

    def drain():  # answers read all the time (else both sides wait to send)
        try:
            while s.recv(1 << 20):
                pass
        except OSError:
            pass
    threading.Thread(target=drain, daemon=True).start()
    rounds, parked = 0, []
    while not stop.is_set():
        futs = []
        if "scans" in kinds:  # cursors left open, past their limit
            futs += [c.submit({"op": "find", "ns": "abuse.big", "batch": 1000,
                               "filter": {"pad": {"$ne": "q"}}}) for _ in range(8)]
        if "deep" in kinds:
            futs += [c.submit({"op": "find", "ns": "abuse.big", "filter": deep})
                     for _ in range(8)]
        if "parked" in kinds:
            parked += [c.submit({"op": "find", "ns": "abuse.big", "after": far,
                                 "after_timeout_ms": 60_000}) for _ in range(8)]
        out = b""
        if "parts" in kinds:  # 20 multi-part inserts started, over the limit of 16
            for k in range(20):
                rid += 1
                out += frame({"id": rid, "op": "insert", "ns": "abuse.parts", "more": True,
                              "packed": [msgpack.packb({"_id": rid})]})
            for k in range(20):
                out += frame({"id": rid - k, "op": "insert", "ns": "abuse.parts",
                              "packed": [msgpack.packb({"_id": -rid + k})]})
        if "txns" in kinds:  # 20 transactions begun at once (16 allowed), then dropped
            for k in range(20):
                out += frame({"id": rid + 1 + k, "op": "txnBegin"})
            for k in range(20):
                out += frame({"id": rid + 1 + k, "op": "txnBegin", "cancel": True})
            rid += 20
        if not futs and not out:
            time.sleep(0.01)
        s.sendall(out)
        for f in futs:
            try:
                f.result(30)
            except Exception:
                pass
            tally(f)
        rounds += 1
    for f in parked:  # answered at once when over the limit; the rest still wait
        if f.done():
            tally(f)
    seen["parked, still waiting"] = sum(1 for f in parked if not f.done())
    print(json.dumps({"rounds": rounds, "answers": seen}), flush=True)


# --- the well-behaved client ------------------------------------------------
def workload(port: int, n: int, tag: str) -> dict:
    from raymx.client import Connection
    c = Connection("127.0.0.1", port, SECRET, timeout_s=60)
    rnd = random.Random(7)
    w, r = [], []
    for i in range(n):
        t0 = time.perf_counter()
        if i % 2 == 0:
            c.request({"op": "insert", "ns": "good.c",
                       "docs": [{"_id": f"{tag}{i}", "v": rnd.random(), "pad": "g" * 150}]})
            w.append(time.perf_counter() - t0)
        else:
            c.request({"op": "find", "ns": "good.c", "filter": {"_id": f"{tag}{i - 1}"}})
            r.append(time.perf_counter() - t0)
    c.close()

    def q(xs, p):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(p * len(xs)))] * 1000
    allx = w + r
    return {"p50": q(allx, .5), "p99": q(allx, .99), "w_p99": q(w, .99), "r_p99": q(r, .99)}


def spawn(*args):
    return subprocess.Popen([sys.executable, __file__, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=ROOT))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--role")
    ap.add_argument("--port", type=int)
    ap.add_argument("--path")
    ap.add_argument("--ops", type=int, default=3000)
    ap.add_argument("--unauth", type=int, default=2000)
    ap.add_argument("--abuse", default="scans,deep,parked,parts,txns",
                    help="what the abusive client does (a comma list)")
    a = ap.parse_args()
    if a.role == "serve":
        return serve(a.path)
    if a.role == "unauth":
        return unauth(a.port, a.unauth, 50)
    if a.role == "abuser":
        return abuser(a.port, set(a.abuse.split(",")))
    soft = raise_fd_limit(4096)
    print(f"file-descriptor soft limit raised to {soft} (RLIMIT_NOFILE) in every process")
    with tempfile.TemporaryDirectory() as d:
        srv = spawn("--role", "serve", "--path", d)
        port = json.loads(srv.stdout.readline())["port"]
        workload(port, 200, "warm")
        quiet = workload(port, a.ops, "q")
        un = spawn("--role", "unauth", "--port", str(port), "--unauth", str(a.unauth))
        held = json.loads(un.stdout.readline())["held"]
        idle = workload(port, a.ops, "u")
        ab = spawn("--role", "abuser", "--port", str(port), "--abuse", a.abuse)
        time.sleep(3)  # the abuser at full speed
        loud = workload(port, a.ops, "l")
        for p in (ab, un, srv):
            p.stdin.close()
        ab_out = json.loads(ab.stdout.readline())
        un_out = json.loads(un.stdout.readline())
        srv_out = json.loads(srv.stdout.readline())
        for p in (ab, un, srv):
            p.wait(60)
    print(f"unauthenticated connections held: {held} at once; over the run {un_out}")
    print(f"abuser ({a.abuse}): {ab_out['rounds']} rounds, answers {ab_out['answers']}")
    print(f"member at the end: {srv_out}")
    print(f"{'well-behaved client, ' + str(a.ops) + ' ops (insert/find by _id), ms':<50}"
          f"{'quiet':>8}{'unauth':>8}{'ratio':>7}{'+abuser':>9}{'ratio':>7}")
    for k, label in (("p50", "p50 latency"), ("p99", "p99 latency"),
                     ("w_p99", "p99 of inserts"), ("r_p99", "p99 of finds")):
        print(f"{label:<50}{quiet[k]:>8.2f}{idle[k]:>8.2f}{idle[k] / quiet[k]:>6.1f}x"
              f"{loud[k]:>9.2f}{loud[k] / quiet[k]:>6.1f}x")


if __name__ == "__main__":
    main()
