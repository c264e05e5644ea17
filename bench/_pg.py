"""PostgreSQL as the peer of bench/commit.py, started by the benchmark itself.

``PostgreSQL.start(base)`` runs ``initdb`` into a temporary folder and
``pg_ctl start`` on a free loopback port with ``synchronous_commit=on`` and
``fsync=on`` (the defaults, set explicitly). Its clients are psycopg client
processes doing what raymx's clients do: one ~200-byte single-row insert per
autocommit (durable) transaction, or a primary-key SELECT. When the binaries
are missing (or will not start) ``Unavailable`` says why, and the benchmark
prints the PostgreSQL part as skipped with that reason.

As root, the server runs as the ``postgres`` user (PostgreSQL refuses root).
"""
import glob
import os
import pwd
import random
import shutil
import socket
import subprocess
import time

SCHEMA = ("CREATE TABLE docs (id bigint PRIMARY KEY, name text, age int, city text, "
          "score double precision, bio text)")
INSERT = "INSERT INTO docs (id, name, age, city, score, bio) VALUES (%s, %s, %s, %s, %s, %s)"
SELECT = "SELECT id, name, age, city, score, bio FROM docs WHERE id = %s"


class Unavailable(Exception):
    """No PostgreSQL to measure here (the message says why)."""


def _bindir() -> str:
    found = shutil.which("initdb")
    if found:
        return os.path.dirname(os.path.realpath(found))
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.path.exists(os.path.join(d, "initdb")):
            return d
    raise Unavailable("no initdb on PATH nor in /usr/lib/postgresql/*/bin "
                      "(install postgresql-15)")


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class PostgreSQL:
    def __init__(self, base: str):
        try:
            import psycopg
        except ImportError:
            raise Unavailable("psycopg is not installed (pip install -e '.[bench]')")
        self.bin = _bindir()
        self.dir = os.path.join(base, "pg")
        self.port = _free_port()
        self.user = None
        if os.geteuid() == 0:  # postgres refuses to run as root
            try:
                self.user = pwd.getpwnam("postgres")
            except KeyError:
                raise Unavailable("running as root and there is no 'postgres' user to "
                                  "run PostgreSQL as")
        os.makedirs(self.dir, mode=0o700)
        if self.user is not None:
            os.chmod(base, 0o755)  # the postgres user must reach its folder
            os.chown(self.dir, self.user.pw_uid, self.user.pw_gid)
        self.version = self._run("initdb", "--version").strip()
        self._run("initdb", "-D", self.dir, "-A", "trust", "-U", "bench", "-E", "UTF8",
                  "--no-sync")
        self._run("pg_ctl", "-D", self.dir, "-l", os.path.join(self.dir, "log"), "-w",
                  "-t", "60", "-o",
                  f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir} "
                  "-c synchronous_commit=on -c fsync=on -c max_connections=60",
                  "start")
        self.dsn = f"host=127.0.0.1 port={self.port} user=bench dbname=postgres"
        with psycopg.connect(self.dsn, autocommit=True) as c:
            c.execute(SCHEMA)
            self.settings = {k: c.execute(f"SHOW {k}").fetchone()[0]
                             for k in ("synchronous_commit", "fsync", "wal_sync_method")}

    def _run(self, prog: str, *args: str) -> str:
        cmd = [os.path.join(self.bin, prog), *args]
        if self.user is not None:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise Unavailable(f"{prog} failed ({p.returncode}): {(p.stderr or p.stdout)[-300:]}")
        return p.stdout

    def cpu_s(self) -> float:
        """CPU seconds of the server so far: the postmaster, its reaped children
        (the backends of past connections) and its live ones (Linux /proc)."""
        tick = os.sysconf("SC_CLK_TCK")
        try:
            with open(os.path.join(self.dir, "postmaster.pid")) as f:
                pid = int(f.readline())
            with open(f"/proc/{pid}/stat") as f:
                total = sum(int(x) for x in f.read().rsplit(")", 1)[1].split()[11:15]) / tick
        except (OSError, ValueError):
            return 0.0
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat") as f:
                        rest = f.read().rsplit(")", 1)[1].split()
                    if int(rest[1]) == pid:
                        total += (int(rest[11]) + int(rest[12])) / tick
                except (OSError, ValueError):
                    pass
        return total

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", self.dir, "-m", "immediate", "-w", "stop")
        except Exception:
            pass


def start(base: str):
    """A running PostgreSQL, or ``Unavailable`` (also when it cannot start)."""
    try:
        return PostgreSQL(base)
    except Unavailable:
        raise
    except Exception as e:
        raise Unavailable(f"PostgreSQL could not be started: {type(e).__name__}: {e}")


def pg_work(k, dsn, mode, start_at, end_at, make_doc):
    """One psycopg client process's part of a level: ``insert`` (one durable
    autocommit transaction per row) or ``select`` (by primary key, among the
    rows this client inserted). Returns (k, n, latencies, errors, last error, CPU s)."""
    import psycopg
    rnd = random.Random(k)
    base = (k + 1) * 1_000_000_000
    with psycopg.connect(dsn, autocommit=True) as c:
        cur = c.cursor()
        have = cur.execute("SELECT max(id) FROM docs WHERE id >= %s AND id < %s",
                           (base, base + 1_000_000_000)).fetchone()[0]
        i = 0 if have is None else have - base + 1
        if mode == "select" and have is None:  # its insert level ran too late under load
            d = make_doc(base, rnd)
            cur.execute(INSERT, (d["_id"], d["name"], d["age"], d["city"], d["score"], d["bio"]))
            i = 1
        n, errs, last_err, lat = 0, 0, None, []
        now = time.monotonic()
        if start_at > now:
            time.sleep(start_at - now)
        cpu0 = time.process_time()
        while True:
            if mode == "insert":
                d = make_doc(base + i, rnd)
                i += 1
                args = (d["_id"], d["name"], d["age"], d["city"], d["score"], d["bio"])
            else:
                args = (base + rnd.randrange(i),)
            t0 = time.monotonic()
            if t0 >= end_at:
                break
            try:
                if mode == "insert":
                    cur.execute(INSERT, args, prepare=True)
                else:
                    cur.execute(SELECT, args, prepare=True)
                    if cur.fetchone() is None:
                        raise LookupError(f"row {args[0]} not found")
            except Exception as e:
                errs += 1
                last_err = repr(e)[:300]
                continue
            t1 = time.monotonic()
            if t1 > end_at:
                break
            n += 1
            lat.append(t1 - t0)
        return (k, n, lat, errs, last_err, time.process_time() - cpu0)
