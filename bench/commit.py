"""Durable commit throughput through the driver, against raw LMDB fsync, in one run.

Measures, with ~200-byte documents:

1. durable (``j=True``) single-document inserts per second through the driver
   with 1, 8 and 16 concurrent clients, each client its own OS process
   (``multiprocessing`` "spawn"; the children only speak the client protocol,
   they never join Ray);
2. beside it, the raw LMDB rate of one fsync-ed transaction per document and
   the rate of trivial Ray actor calls;
3. the same clients against PostgreSQL, started by this benchmark when its
   binaries are present (bench/_pg.py: ``initdb`` into a temporary folder, a
   loopback port, ``synchronous_commit=on``, ``fsync=on``; psycopg, one
   ~200-byte single-row insert per autocommit transaction): raymx j=True
   against it at 1, 8 and 16 clients, target ratio 1.0 (printed as skipped,
   with the reason, when PostgreSQL is absent);
4. for diagnosis: the ratio of (1) to the raw fsync rate (old targets 2.0
   and 4.0 at 8 and 16), the non-durable (``j=False``) rate at 8 and 16
   clients (the request-path ceiling that group commit can at best
   approach), a bare msgpack echo (an asyncio server in its own process,
   the same Unix socket kind, the same client processes sending the same
   documents): the ceiling of any request/response on this machine, and a
   durable echo (the same, appending each request to a log file with one
   group ``fdatasync`` per wake-up before answering): the ceiling of any
   durable commit here;
5. ``find_one`` by ``_id`` against PostgreSQL's primary-key ``SELECT`` with
   the same clients (target 1.0);
6. ``insert_many`` in batches of 1,000 (``w=1``, no sync) against raw
   batched LMDB puts of the same documents (target 0.7), and its ceiling:
   the same batches packed as the driver packs them, sent to the bare echo
   server (no decode, no store).

Prints figures and ratios; asserts nothing (these machines are noisy: the
load average is printed at start and end). Progress lines go to stderr.

    .venv/bin/pip install -e '.[bench]'   # psycopg, for the PostgreSQL peer
    .venv/bin/python bench/commit.py
    RAYMX_BENCH_PROFILE=/tmp/prof .venv/bin/python bench/commit.py   # + cProfile of client 0
    RAY_worker_niceness=0 .venv/bin/python bench/commit.py         # member not niced by Ray
    RAYMX_BENCH_LEVELS=1,8 .venv/bin/python bench/commit.py        # other client counts
"""
import contextlib
import os
import random
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

# Keep the module top light: "spawn" children import it again.
from _util import docs, make_doc, progress, rate, raw_batched_rate, row  # noqa: E402

LEVELS = tuple(int(x) for x in os.environ.get("RAYMX_BENCH_LEVELS", "1,8,16").split(","))
TARGETS = {8: 2.0, 16: 4.0}  # durable txn/s : raw fsync-ed txn/s; j=False measured there too
DURATION_S = 4.0          # per concurrency level
RAW_FSYNC_S = 1.5         # per raw LMDB fsync measurement (one before each level too)
PING_N = 2000             # sequential Ray actor calls
ECHO_S = 2.0              # per bare-echo level
N_BATCH = 50_000          # insert_many docs (50 batches of 1,000)
BATCH_ROUNDS = 3          # alternating driver / raw rounds, the best of each kept
PEER_TARGET = 1.0          # raymx j=True : PostgreSQL durable txn/s, and find_one : PK SELECT
BATCH_TARGET = 0.7         # insert_many : raw batched LMDB puts


# --- client processes -------------------------------------------------------
def client_worker(k, topo, cmd_q, res_q):
    """One client process: its own Client; single-document inserts between start and end."""
    from raymx.client import Client, WriteConcern

    cl = Client(lambda: topo, WriteConcern(w=1, j=True))
    coll = cl["bench"]["durable"]
    fast = coll.with_options(WriteConcern(w=1, j=False))
    default = coll.with_options(WriteConcern())  # the driver's own: w "majority"
    rnd = random.Random(k)
    base = (k + 1) * 1_000_000_000
    i = 0
    deadline = time.monotonic() + 90
    while True:  # connect + warm up (the set may still be settling after launch)
        try:
            coll.insert_one(make_doc(base + i, rnd))
            break
        except Exception as e:
            if time.monotonic() > deadline:
                res_q.put(("failed", k, repr(e)[:300]))
                return
            time.sleep(0.5)
        finally:
            i += 1
    res_q.put(("ready", k, None))
    while True:
        cmd = cmd_q.get()
        if cmd is None:
            break
        start_at, end_at, durable, profile, mode, arg = cmd
        if mode == "echo":
            res_q.put(echo_client(k, arg, start_at, end_at, rnd))
            continue
        if mode in ("pg-insert", "pg-select"):
            from _pg import pg_work
            try:
                res_q.put(pg_work(k, arg, mode[3:], start_at, end_at, make_doc))
            except Exception as e:
                res_q.put((k, 0, [], 1, repr(e)[:300], 0.0))
            continue
        find = mode == "find"
        c = default if mode == "default" else coll if durable else fast
        prof = None
        if profile:
            import cProfile
            prof = cProfile.Profile()
        lat = []
        n, errs, last_err = 0, 0, None
        now = time.monotonic()
        if start_at > now:
            time.sleep(start_at - now)
        if prof:
            prof.enable()
        cpu0 = time.process_time()
        while True:
            if find:
                want = base + rnd.randrange(i)
            else:
                d = make_doc(base + i, rnd)
                i += 1
            t0 = time.monotonic()
            if t0 >= end_at:
                i -= not find  # this document was never inserted: find never asks for it
                break
            try:
                if not find:
                    c.insert_one(d)
                elif c.find_one({"_id": want}) is None:
                    raise LookupError(f"document {want} not found")
            except Exception as e:  # count it, say what it was, keep going
                errs += 1
                last_err = repr(e)[:300]
                time.sleep(0.01)
                continue
            t1 = time.monotonic()
            if t1 > end_at:
                break
            n += 1
            lat.append(t1 - t0)
        if prof:
            prof.disable()
            prof.dump_stats(profile)
        res_q.put((k, n, lat, errs, last_err, time.process_time() - cpu0))
    cl.close()


def answer_poll(s):
    """A ``poll`` for an echo client's socket: each answer is awaited in it
    before the ``recv``, as the driver awaits its own (``Connection._receive``)."""
    import select
    ready = select.poll()
    ready.register(s, select.POLLIN)
    return ready.poll


def echo_client(k, path, start_at, end_at, rnd):
    """Request/response with a bare echo server: what any server costs at least."""
    import socket

    import msgpack
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    ready = answer_poll(s)
    n = 0
    now = time.monotonic()
    if start_at > now:
        time.sleep(start_at - now)
    cpu0 = time.process_time()
    while time.monotonic() < end_at:
        b = msgpack.packb({"id": n, "op": "insert", "packed": [msgpack.packb(make_doc(n, rnd))]})
        s.sendall(len(b).to_bytes(4, "big") + b)
        ready()
        h = s.recv(4, socket.MSG_WAITALL)
        msgpack.unpackb(s.recv(int.from_bytes(h, "big"), socket.MSG_WAITALL))
        n += 1
    s.close()
    return (k, n, [], 0, None, time.process_time() - cpu0)


def batch_echo_rate(path, all_docs) -> float:
    """``insert_many``'s ceiling: docs/s of this process packing the same
    1,000-document batches as the driver does (one msgpack binary per
    document) and sending each in one frame to the bare echo server, which
    answers it once read (no document decoded, nothing stored)."""
    import socket

    import msgpack

    from raymx.storage import codec
    from raymx.storage.limits import Limits
    most = Limits().document_bytes_max
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    ready = answer_poll(s)

    def go():
        for n, i in enumerate(range(0, len(all_docs), 1000)):
            b = msgpack.packb({"id": n, "op": "insert", "ns": "bench.batch",
                               "packed": codec.pack_each(all_docs[i:i + 1000], most)})
            s.sendall(len(b).to_bytes(4, "big") + b)
            ready()
            h = s.recv(4, socket.MSG_WAITALL)
            msgpack.unpackb(s.recv(int.from_bytes(h, "big"), socket.MSG_WAITALL))
    try:
        return rate(len(all_docs), go)
    finally:
        s.close()


def echo_poll():
    """The busy polling of the member's ports (``BusyPoll``, the default
    ``Limits.port_busy_poll_us``) for an echo server's running loop: the
    ceilings poll as the member does."""
    import asyncio

    from raymx.actors.server import BusyPoll
    from raymx.storage.limits import DEFAULT
    return BusyPoll(asyncio.get_running_loop(), DEFAULT.port_busy_poll_us)


def echo_server(path, ready):
    """An asyncio server answering each frame with a small one (no work)."""
    import asyncio

    import msgpack
    poll = None

    async def serve(r, w):
        try:
            while True:
                n = int.from_bytes(await r.readexactly(4), "big")
                req = msgpack.unpackb(await r.readexactly(n))
                out = msgpack.packb({"id": req["id"], "ok": {"n": 1}})
                w.write(len(out).to_bytes(4, "big") + out)
                poll.touch(w)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass

    async def main():
        nonlocal poll
        poll = echo_poll()
        await asyncio.start_unix_server(serve, path)
        ready.set()
        await asyncio.sleep(3600)
    asyncio.run(main())


def durable_echo_server(path, log_path, ready):
    """The echo server with a durable log, the shape of any group-committed
    store and nothing more (polling as the member's ports do, ``echo_poll``):
    each request frame is appended to a log file
    (reused, already written once, as PostgreSQL's WAL segments and raymx's
    log are), one ``fdatasync`` per event-loop wake-up covers every frame that
    wake-up read, then each gets a small answer. What the same clients make
    against it is the ceiling of durable commits with this client, this
    socket kind and this disk."""
    import asyncio

    import msgpack

    fd = os.open(log_path, os.O_RDWR | os.O_CREAT, 0o600)
    os.pwrite(fd, bytes(64 << 20), 0)  # written once, as a reused log is
    os.fsync(fd)
    pending = []                       # (transport, answer) of this wake-up
    at = [0]
    poll = None

    def flush():
        out = list(pending)
        pending.clear()
        os.fdatasync(fd)
        for tr, frame in out:
            tr.write(frame)
            poll.touch(tr)

    class Echo(asyncio.Protocol):
        def connection_made(self, tr):
            self.tr, self.buf = tr, bytearray()

        def data_received(self, data):
            poll.touch(self.tr)
            buf = self.buf
            buf += data
            while len(buf) >= 4:
                n = int.from_bytes(buf[:4], "big")
                if len(buf) < 4 + n:
                    break
                body = bytes(buf[4:4 + n])
                del buf[:4 + n]
                req = msgpack.unpackb(body)
                if at[0] + len(body) > (64 << 20):
                    at[0] = 0
                os.pwrite(fd, body, at[0])
                at[0] += len(body)
                out = msgpack.packb({"id": req["id"], "ok": {"n": 1}})
                if not pending:
                    asyncio.get_running_loop().call_soon(flush)
                pending.append((self.tr, len(out).to_bytes(4, "big") + out))

    async def main():
        nonlocal poll
        poll = echo_poll()
        await asyncio.get_running_loop().create_unix_server(Echo, path)
        ready.set()
        await asyncio.sleep(3600)
    asyncio.run(main())


class Clients:
    """A pool of client processes, started once; each level uses the first n."""

    def __init__(self, topo, n):
        import multiprocessing as mp
        ctx = mp.get_context("spawn")
        self.res_q = ctx.Queue()
        self.cmd_qs = [ctx.Queue() for _ in range(n)]
        self.procs = [ctx.Process(target=client_worker, args=(k, topo, self.cmd_qs[k], self.res_q),
                                  daemon=True) for k in range(n)]
        for p in self.procs:
            p.start()
        import queue
        ready, deadline = 0, time.monotonic() + 120
        while ready < n:
            try:
                tag, k, err = self.res_q.get(timeout=1.0)
                if tag != "ready":
                    self.close()
                    raise RuntimeError(f"client {k} could not insert: {err}")
                ready += 1
            except queue.Empty:
                dead = [p.pid for p in self.procs if p.exitcode not in (None, 0)]
                if dead or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"client processes failed to start (dead: {dead})")

    def run(self, n, duration, durable=True, profile=None, mode="insert", arg=None):
        """Synchronised start: every client starts at the same monotonic instant
        (CLOCK_MONOTONIC is system-wide on Linux) and stops at the same one.
        ``mode``: "insert" (single-document inserts), "default" (the same with
        the driver's default write concern, w "majority"), "find" (``find_one`` by
        ``_id`` among the documents this client inserted), "echo" (``arg``: the
        path of an echo server), "pg-insert" / "pg-select" (``arg``: a
        PostgreSQL DSN; the same clients through psycopg)."""
        start_at = time.monotonic() + 0.5
        end_at = start_at + duration
        for k in range(n):
            self.cmd_qs[k].put((start_at, end_at, durable, profile if k == 0 else None,
                                mode, arg))
        got = [self.res_q.get(timeout=duration + 60) for _ in range(n)]
        total = sum(g[1] for g in got)
        lat = sorted(x for g in got for x in g[2])
        errs = sum(g[3] for g in got)
        self.cpu_s = sum(g[5] for g in got)  # the client processes' CPU in this level
        if errs:
            progress(f"{errs} failed inserts, e.g. {next(g[4] for g in got if g[4])}")
        return total, lat, errs

    def close(self):
        for q in self.cmd_qs:
            q.put(None)
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.terminate()


def pct(lat, q):
    return lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else float("nan")


# --- raw references ---------------------------------------------------------
def raw_fsync_rate(path, per_txn_env_sync):
    """One write transaction per document, each made durable before the next.

    ``per_txn_env_sync``: env opened ``sync=False`` and ``env.sync(True)`` after
    each commit (one fdatasync, the mechanism raymx's group commit uses);
    otherwise a ``sync=True`` env (LMDB syncs data, then the meta page).
    """
    import lmdb
    import msgpack
    sync = not per_txn_env_sync
    env = lmdb.open(path, map_size=1 << 32, max_dbs=4, sync=sync, metasync=sync)
    db = env.open_db(b"docs")
    rnd = random.Random(7)
    n = 0
    t0 = time.perf_counter()
    end = t0 + RAW_FSYNC_S
    while True:
        d = make_doc(n, rnd)
        with env.begin(write=True) as t:
            t.put(msgpack.packb(d["_id"]), msgpack.packb(d), db=db)
        if per_txn_env_sync:
            env.sync(True)
        n += 1
        if time.perf_counter() >= end:
            break
    r = n / (time.perf_counter() - t0)
    env.close()
    return r




@contextlib.contextmanager
def echo_serving(base, kind: str):
    """A bare echo server (``kind``: "echo", "durable-echo" with its
    group-committed, fdatasync-ed log, or "batch-echo") in a process of its
    own while the block runs; yields its Unix socket's path."""
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    path, ready = os.path.join(base, f"{kind}.sock"), ctx.Event()
    if kind == "durable-echo":
        target, args = durable_echo_server, (path, os.path.join(base, "echo.log"), ready)
    else:
        target, args = echo_server, (path, ready)
    srv = ctx.Process(target=target, args=args, daemon=True)
    srv.start()
    try:
        if not ready.wait(30):
            raise RuntimeError(f"the {kind} server did not start")
        yield path
    finally:
        srv.terminate()
        srv.join(10)


def echo_rates(pool, base, durable=False) -> dict:
    """Requests/s of the client pool against a bare echo server (``durable``:
    the one with a group-committed, fdatasync-ed log), at every level."""
    kind = "durable-echo" if durable else "echo"
    with echo_serving(base, kind) as path:
        out = {}
        for n in LEVELS:
            progress(f"bare msgpack {kind}, {n} clients, {ECHO_S:.0f} s")
            total, _, _ = pool.run(n, ECHO_S, mode="echo", arg=path)
            out[n] = total / ECHO_S
        return out


def echo_batches(base, batch_docs) -> float:
    """``batch_echo_rate`` against an echo server of its own (the best of
    BATCH_ROUNDS rounds, as the driver's and the raw puts')."""
    with echo_serving(base, "batch-echo") as path:
        return max(batch_echo_rate(path, batch_docs) for _ in range(BATCH_ROUNDS))


def member_counters(rs):
    """(commits, syncs) of the primary so far, or None if status lacks them."""
    import ray
    try:
        s = ray.get(rs.member(0).status.remote(), timeout=30)
        return s["commits"], s["syncs"]
    except Exception:
        return None


def per_sync(before, after):
    if before is None or after is None or after[1] == before[1]:
        return float("nan")
    return (after[0] - before[0]) / (after[1] - before[1])


def proc_cpu_s(pid) -> float:
    """CPU seconds (user + system) a process has used so far (Linux; 0 elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return 0.0


def settle(pid, most_s: float = 60.0) -> float:
    """Wait until process ``pid`` is nearly idle (under 5% of a core over a
    second: the member's checkpoints and trimming of what the levels before
    wrote), at most ``most_s``; returns the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < most_s:
        c0 = proc_cpu_s(pid)
        time.sleep(1.0)
        if proc_cpu_s(pid) - c0 < 0.05:
            break
    return time.monotonic() - t0


def cpu_note(total, member_s, client_s, server="member") -> str:
    if not total:
        return ""
    return (f"; CPU per txn: {server} {member_s / total * 1e6:.0f} us, "
            f"client {client_s / total * 1e6:.0f} us")


def load():
    return "load avg " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def main():
    import msgpack
    import ray

    import raymx

    profile_dir = os.environ.get("RAYMX_BENCH_PROFILE")  # cProfile of client 0, per level
    if profile_dir:
        os.makedirs(profile_dir, exist_ok=True)
    base = tempfile.mkdtemp(prefix="raymx-bench-commit-")
    print(f"doc size ~{len(msgpack.packb(docs(1)[0]))} bytes; {os.cpu_count()} CPUs; "
          f"{load()} at start")

    # Raw reference first, with nothing of ours running; then again right before
    # each driver level (the disk is shared: its fsync rate drifts), and the
    # ratio of a level uses the better of the first and its own.
    progress("raw LMDB: one fsync-ed txn per doc (env.sync per txn)")
    raw_first = raw_fsync_rate(os.path.join(base, "raw-envsync-0"), True)
    progress("raw LMDB: one fsync-ed txn per doc (sync=True env)")
    raw_st = raw_fsync_rate(os.path.join(base, "raw-synctrue"), False)

    pg, pg_skip = None, None
    try:
        import _pg
        progress("PostgreSQL: initdb, pg_ctl start")
        pg = _pg.start(base)
    except Exception as e:  # _pg.Unavailable: the reason is printed in the results
        pg_skip = str(e)
        progress(f"PostgreSQL skipped: {pg_skip}")

    progress("ray.init")
    ray.init(address="local", num_cpus=2, include_dashboard=False,
             object_store_memory=100 * 1024**2, log_to_driver=False)
    rs = None
    try:
        @ray.remote(num_cpus=0)
        class Pinger:
            def ping(self):
                return None

        p = Pinger.remote()
        for _ in range(50):
            ray.get(p.ping.remote())
        progress(f"ray actor ping x{PING_N}")
        ping = rate(PING_N, lambda: [ray.get(p.ping.remote()) for _ in range(PING_N)])
        ray.kill(p)

        progress("launch replica set")
        rs = raymx.ReplicaSet.launch("bench", members=1, data_dir=os.path.join(base, "rs"))
        topo = rs._topology()
        member_pid = ray.get(rs.member(0).pid.remote())
        try:  # Ray runs workers niced (RAY_worker_niceness, default 15); clients are not
            member_nice = os.getpriority(os.PRIO_PROCESS, member_pid)
        except Exception:
            member_nice = "?"
        progress(f"start {max(LEVELS)} client processes (spawn)")
        pool = Clients(topo, max(LEVELS))
        results, raw_at, pg_res, finds, pg_finds = {}, {}, {}, {}, {}

        def level(n, durable, prof=None, mode="insert"):
            """(txn/s, latencies, errors, CPU note) of n clients inserting one doc at a time."""
            c0 = proc_cpu_s(member_pid)
            total, lat, errs = pool.run(n, DURATION_S, durable, prof, mode)
            return (total / DURATION_S, lat, errs,
                    cpu_note(total, proc_cpu_s(member_pid) - c0, pool.cpu_s))

        def pg_level(n, mode):
            c0 = pg.cpu_s()
            total, lat, errs = pool.run(n, DURATION_S, mode=mode, arg=pg.dsn)
            time.sleep(0.2)  # the backends exit and are reaped: their CPU is counted
            return (total / DURATION_S, lat, errs,
                    cpu_note(total, pg.cpu_s() - c0, pool.cpu_s, "server"))

        def find_level(n):
            c0 = proc_cpu_s(member_pid)
            total, lat, errs = pool.run(n, DURATION_S, mode="find")
            return (total / DURATION_S, lat, errs,
                    cpu_note(total, proc_cpu_s(member_pid) - c0, pool.cpu_s))
        try:
            for n in LEVELS:
                progress(f"raw LMDB fsync-ed txns, before the {n}-client level")
                raw_at[n] = raw_fsync_rate(os.path.join(base, f"raw-envsync-{n}"), True)
                progress(f"durable (j=True) inserts, {n} client(s), {DURATION_S:.0f} s")
                m0 = member_counters(rs)
                prof = (os.path.join(profile_dir, f"client-{n}.prof") if profile_dir else None)
                r, lat, errs, cpu = level(n, True, prof)
                results[n] = (r, lat, per_sync(m0, member_counters(rs)), errs,
                              cpu + f"; {load()}")
                if pg is not None:
                    progress(f"PostgreSQL durable inserts, {n} client(s), {DURATION_S:.0f} s")
                    pg_res[n] = pg_level(n, "pg-insert")
            fast = {}  # the same clients with no sync at all: what group commit can approach
            for n in [n for n in TARGETS if n in LEVELS]:
                progress(f"non-durable (j=False) inserts, {n} clients, {DURATION_S:.0f} s")
                fast[n] = level(n, False)
            dflt = {}  # what a user gets without choosing: w "majority" (durable too)
            for n in [n for n in (1, 8) if n in LEVELS]:
                progress(f"inserts with the driver's default write concern, {n} client(s)")
                dflt[n] = level(n, True, mode="default")
            for n in LEVELS:
                progress(f"find_one by _id, {n} client(s), {DURATION_S:.0f} s")
                finds[n] = find_level(n)
                if pg is not None:
                    progress(f"PostgreSQL SELECT by primary key, {n} client(s)")
                    pg_finds[n] = pg_level(n, "pg-select")
            echo = echo_rates(pool, base)
            decho = echo_rates(pool, base, durable=True)
        finally:
            pool.close()
        if pg is not None:  # its part is done: its checkpoint and vacuum would load
            progress("stop PostgreSQL")  # the batched rounds' machine (stop is idempotent)
            pg.stop()
        quiet_s = settle(member_pid)

        # Batched inserts: BATCH_ROUNDS alternating rounds of the driver and of
        # raw puts, each on fresh data removed after it, the best of each side
        # kept (the host's noise only ever slows a round down).
        batch_docs = docs(N_BATCH, start=50_000_000)
        cl = rs.client(w=1)  # as the raw puts: no sync, no other member
        cl["bench"]["warm"].insert_many(docs(10, start=90_000_000))  # warm up the connection
        drv = {"rate": 0.0, "member": float("inf"), "driver": float("inf")}
        raw_b, raw_b_us = 0.0, float("inf")
        for rnd in range(BATCH_ROUNDS):
            progress(f"insert_many {N_BATCH:,} docs in batches of 1,000: driver, then raw "
                     f"LMDB batched puts (round {rnd + 1} of {BATCH_ROUNDS})")
            coll = cl["bench"][f"batch{rnd}"]

            def drv_batched():
                for i in range(0, N_BATCH, 1000):
                    coll.insert_many(batch_docs[i:i + 1000])
            c0, d0 = proc_cpu_s(member_pid), time.process_time()
            drv["rate"] = max(drv["rate"], rate(N_BATCH, drv_batched))
            drv["member"] = min(drv["member"], (proc_cpu_s(member_pid) - c0) / N_BATCH * 1e6)
            drv["driver"] = min(drv["driver"], (time.process_time() - d0) / N_BATCH * 1e6)
            coll.drop()
            path = os.path.join(base, f"raw-batch-{rnd}")
            d0 = time.process_time()
            raw_b = max(raw_b, raw_batched_rate(path, batch_docs))
            raw_b_us = min(raw_b_us, (time.process_time() - d0) / N_BATCH * 1e6)
            shutil.rmtree(path)
        drv_b = drv["rate"]
        progress("insert_many's ceiling: the same batches packed and sent to a bare echo server")
        batch_ceiling = echo_batches(base, batch_docs)
        drv_cpu = (f"CPU per doc: member {drv['member']:.1f} us, driver {drv['driver']:.1f} us; "
                   f"{load()}; after {quiet_s:.0f} s for the member to go quiet, "
                   "PostgreSQL stopped")
        raw_b_cpu = f"CPU per doc {raw_b_us:.1f} us"
        cl.close()
    finally:
        progress("shutdown")
        if rs is not None:
            rs.shutdown()
        ray.shutdown()
        if pg is not None:
            pg.stop()
        shutil.rmtree(base, ignore_errors=True)

    ref = {n: max(raw_first, raw_at[n]) for n in LEVELS}  # never flatter the ratio
    print(f"{load()} at end (other work on this machine skews every figure)")
    print()
    print("references")
    row("raw LMDB, 1 txn/doc, env.sync(True) per txn (reference)", raw_first, "txn/s",
        "before each level: " + ", ".join(f"{raw_at[n]:,.0f}" for n in LEVELS))
    row("raw LMDB, 1 txn/doc, sync=True env (data + meta sync)", raw_st, "txn/s")
    row("Ray actor call, sequential ray.get(ping)", ping, "calls/s",
        f"{1e6 / ping:,.0f} us/call")
    for n, r in echo.items():
        row(f"bare msgpack echo, Unix socket, {n} clients (no work)", r, "req/s",
            f"{r / ref[n]:.1f}x raw fsync: the request/response ceiling")
    for n, r in decho.items():
        row(f"durable msgpack echo, Unix socket, {n} clients", r, "req/s",
            "a log append + group fdatasync per request: the durable ceiling")
    print()
    print(f"durable (j=True) single-doc inserts through the driver; separate client processes "
          f"(nice 0), member process nice {member_nice}")
    for n in LEVELS:
        r, lat, ps, errs, cpu = results[n]
        row(f"  {n:>2} client(s)", r, "txn/s",
            f"p50 {pct(lat, .5):.1f} ms, p99 {pct(lat, .99):.1f} ms, {ps:.1f} commits/sync"
            + (f", {errs} FAILED" if errs else "") + cpu)
    for n, (r, lat, errs, cpu) in fast.items():
        row(f"  {n:>2} clients, j=False (no sync: the request ceiling)", r, "txn/s",
            f"p50 {pct(lat, .5):.1f} ms; durable = {results[n][0] / r:.2f}x of it"
            + (f", {errs} FAILED" if errs else "") + cpu)
    for n, (r, lat, errs, cpu) in dflt.items():
        row(f"  {n:>2} client(s), the driver's default (w: majority)", r, "txn/s",
            f"p50 {pct(lat, .5):.1f} ms; {r / results[n][0]:.2f}x of w=1, j=True"
            + (f", {errs} FAILED" if errs else "") + cpu)
    print()
    print("durable driver txn/s : raw LMDB fsync-ed txn/s (the better of the first and the "
          "level's own)")
    for n in LEVELS:
        x, target = results[n][0] / ref[n], TARGETS.get(n)
        verdict = ""
        if target is not None:  # met or not, and what it asks beside the no-sync rate
            need, ceiling = target * ref[n], fast[n][0]
            verdict = f"target >= {target:.1f}: {'met' if x >= target else 'NOT met'}"
            verdict += (f" (needs {need:,.0f} txn/s; with no sync at all the same clients "
                        f"make {ceiling:,.0f}: {need / ceiling:.2f}x of that)")
        print(f"  {n:>2} client(s) {x:>47.2f}x  {verdict}")
    print()
    if pg is None:
        print(f"PostgreSQL: SKIPPED ({pg_skip})")
    else:
        print(f"{pg.version}, same run: {pg.settings}; psycopg {psycopg_version()} client "
              f"processes (the same ones), TCP loopback; raymx clients use a Unix socket")
        print(f"  {'clients':<8} {'raymx j=True':>13} {'PostgreSQL':>11} {'ratio':>6}   "
              f"{'target >= ' + format(PEER_TARGET, '.1f'):<16} {'echo (no work)':>14} "
              f"{'durable echo':>13} {'raymx/it':>8}")
        for n in LEVELS:
            r, p = results[n][0], pg_res[n][0]
            print(f"  {n:<8} {r:>13,.0f} {p:>11,.0f} {r / p if p else 0:>6.2f}   "
                  f"{'met' if p and r / p >= PEER_TARGET else 'NOT met':<16} {echo[n]:>14,.0f} "
                  f"{decho[n]:>13,.0f} {r / decho[n] if decho[n] else 0:>8.2f}")
        print("  (echo: the same client processes against a bare msgpack echo server doing no "
              "work: the ceiling of any request/response here; durable echo: the same server "
              "appending each request to a log with one fdatasync per wake-up before it "
              "answers: the ceiling of durable commits here)")
        for n in LEVELS:
            r, lat, errs, cpu = pg_res[n]
            row(f"  PostgreSQL insert, {n:>2} client(s)", r, "txn/s",
                f"p50 {pct(lat, .5):.1f} ms, p99 {pct(lat, .99):.1f} ms"
                + (f", {errs} FAILED" if errs else "") + cpu)
    print()
    print("find_one by _id (raymx) and SELECT by primary key (PostgreSQL), same clients")
    for n in LEVELS:
        r, lat, errs, cpu = finds[n]
        extra = ""
        if pg is not None:
            p = pg_finds[n][0]
            extra = (f"PostgreSQL {p:,.0f}: ratio {r / p if p else 0:.2f} (target >= "
                     f"{PEER_TARGET:.1f}: {'met' if p and r / p >= PEER_TARGET else 'NOT met'}); ")
        row(f"  raymx find_one, {n:>2} client(s)", r, "reads/s",
            extra + f"p50 {pct(lat, .5):.2f} ms" + (f", {errs} FAILED" if errs else "") + cpu)
    if pg is not None:
        for n in LEVELS:
            r, lat, errs, cpu = pg_finds[n]
            row(f"  PostgreSQL SELECT, {n:>2} client(s)", r, "reads/s",
                f"p50 {pct(lat, .5):.2f} ms" + (f", {errs} FAILED" if errs else "") + cpu)
    print()
    print(f"batched inserts, 1,000 docs per transaction (best of {BATCH_ROUNDS} alternating rounds)")
    row("raw LMDB+msgpack batched puts, no sync", raw_b, "docs/s", raw_b_cpu)
    row("driver insert_many, w=1", drv_b, "docs/s",
        f"ratio {drv_b / raw_b:.2f} (target >= {BATCH_TARGET}: "
        f"{'met' if drv_b / raw_b >= BATCH_TARGET else 'NOT met'})")
    print(f"  {drv_cpu}")
    row("  ceiling: the same batches to a bare echo server", batch_ceiling, "docs/s",
        f"{batch_ceiling / raw_b:.2f} of raw puts; the driver makes {drv_b / batch_ceiling:.2f} "
        "of it (packing and the socket only: no decode, no store)")


def psycopg_version() -> str:
    import psycopg
    return f"{psycopg.__version__} ({psycopg.pq.__impl__})"


if __name__ == "__main__":
    main()
