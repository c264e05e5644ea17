"""Bank transfers through pymongo transactions, for the nemesis.

Each client moves money between a few accounts with
``ClientSession.with_transaction``, as applications write transactions with
pymongo: two ``$inc`` updates and one insert into a transfer log naming the
transfer (``tid``), with ``w: "majority"``. The driver retries what it may
(a transient error runs the whole transaction again; a commit whose answer
was lost is sent again), which is exactly where a store can apply a
transaction twice or lose one it acknowledged.

Between transfers a client also counts an account up outside transactions
(``$inc`` of ``touched``, a retryable write, ``w: "majority"``): it waits for
a transaction that wrote the account until that one ends.

At the end one snapshot read (a pymongo snapshot session) gives the balances
and the log, and ``check`` finds:

- a transfer logged more than once (applied twice);
- an acknowledged transfer that is not logged (lost);
- balances that do not follow from the transfers logged (a transaction
  applied in part, or a write outside one);
- counts outside transactions lost (fewer than acknowledged) or applied
  twice (more than acknowledged and unknown together).

A transfer whose outcome the client does not know (an error) may or may not
be logged; it only has to be whole.

While they run, the clients also read now and then, with a snapshot
session, with read concern ``majority`` and in a read-only transaction (read
concern ``snapshot``, committed with ``w: "majority"``): all balances at once
(their sum never changes, so a read that saw part of a transfer shows) and
the newest transfers logged. What such a read returns is majority-committed,
so every transfer it saw must be in the final log: one that is not was
served to a reader and then discarded (``check``'s ``seen``).
"""
from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter

DB, ACCOUNTS, LOG = "nem", "bank", "banklog"
INITIAL = 1_000


def check(balances: dict, logs: list[dict], acked: list[str], initial: int = INITIAL,
          touched: int = 0, touches: tuple[int, int] = (0, 0), seen: dict | None = None,
          torn: list | None = None) -> list[str]:
    """What is wrong with a final state (empty if nothing): ``balances``
    {account: balance}, ``logs`` the transfer log's documents, ``acked`` the
    transfers the clients were told committed; ``touched`` the accounts'
    counts, ``touches`` (acknowledged, unknown) of the counting writes;
    ``seen`` {transfer: how it was read} by majority and snapshot reads during
    the run, ``torn`` the balance sums such reads found off."""
    problems = []
    if torn:
        problems.append(f"{len(torn)} reads saw balances that do not add up (part of a "
                        f"transfer, or a transfer not yet or no longer there): {torn[:3]}")
    if not touches[0] <= touched <= touches[0] + touches[1]:
        problems.append(f"the accounts were counted up {touched} times outside transactions; "
                        f"{touches[0]} acknowledged, {touches[1]} unknown")
    logged = Counter(x["tid"] for x in logs)
    twice = sorted(t for t, n in logged.items() if n > 1)
    if twice:
        problems.append(f"{len(twice)} transfers applied more than once: {twice[:5]}")
    lost = [t for t in acked if t not in logged]
    if lost:
        problems.append(f"{len(lost)} acknowledged transfers lost: {lost[:5]}")
    discarded = sorted((t, how) for t, how in (seen or {}).items() if t not in logged)
    if discarded:
        problems.append(f"{len(discarded)} transfers read by majority or snapshot reads are "
                        f"not in the final log (served, then discarded): {discarded[:5]}")
    expect = dict.fromkeys(balances, initial)
    for x in logs:
        expect[x["from"]] = expect.get(x["from"], initial) - x["amt"]
        expect[x["to"]] = expect.get(x["to"], initial) + x["amt"]
    off = {a: (balances.get(a), want) for a, want in expect.items() if balances.get(a) != want}
    if off:
        problems.append("balances do not follow from the transfers logged "
                        f"(account: (balance, expected)): {off}")
    return problems



def _kind(e: Exception) -> str:
    """An error's class, and its server code if it has one (``OperationFailure 251``)."""
    code = getattr(e, "code", None)
    return type(e).__name__ + (f" {code}" if isinstance(code, int) else "")

class Book:
    """What the clients were told: transfers acknowledged, errors by kind."""

    def __init__(self):
        self.acked: list[str] = []
        self.runs = 0  # callbacks run: above the transfers tried, the driver ran some again
        self.errors: Counter = Counter()
        self.touches = [0, 0]  # counting writes outside transactions: acknowledged, unknown
        self.seen: dict[str, str] = {}  # transfers majority and snapshot reads returned
        self.torn: list[tuple] = []  # (read kind, sum, accounts read) of reads that were off
        self.reads = Counter()  # reads done, by kind
        self.lock = threading.Lock()


class Client(threading.Thread):
    """One pymongo client doing transfers until ``stop`` is set."""

    def __init__(self, cid: int, uri: str, accounts: list[str], book: Book, stop, seed: int,
                 initial: int = INITIAL):
        super().__init__(daemon=True, name=f"bank-{cid}")
        self.cid, self.uri, self.accounts, self.book = cid, uri, accounts, book
        self.stop, self.rnd, self.seq = stop, random.Random(seed), 0
        self.total = initial * len(accounts)

    def run(self):
        import pymongo
        from pymongo.write_concern import WriteConcern
        cl = pymongo.MongoClient(self.uri, serverSelectionTimeoutMS=6000,
                                 socketTimeoutMS=6000, connectTimeoutMS=3000,
                                 heartbeatFrequencyMS=500)
        db = cl.get_database(DB)
        acct, log = db[ACCOUNTS], db[LOG]
        wc = WriteConcern("majority", wtimeout=4000)
        try:
            while not self.stop.is_set():
                self.seq += 1
                tid = f"{self.cid}-{self.seq}"
                a, b = self.rnd.sample(self.accounts, 2)
                amt = self.rnd.randint(1, 9)

                def transfer(s, a=a, b=b, amt=amt, tid=tid):
                    with self.book.lock:
                        self.book.runs += 1
                    acct.update_one({"_id": a}, {"$inc": {"bal": -amt}}, session=s)
                    acct.update_one({"_id": b}, {"$inc": {"bal": amt}}, session=s)
                    log.insert_one({"tid": tid, "from": a, "to": b, "amt": amt}, session=s)
                try:
                    with cl.start_session() as s:
                        s.with_transaction(transfer, write_concern=wc)
                    with self.book.lock:
                        self.book.acked.append(tid)
                except Exception as e:  # noqa: BLE001 - its outcome is unknown: recorded
                    with self.book.lock:
                        self.book.errors[_kind(e)] += 1
                    time.sleep(0.05)
                if self.rnd.random() < 0.3:
                    self._touch(acct.with_options(write_concern=wc))
                if self.rnd.random() < 0.2:
                    self._audit(cl, db)
        finally:
            cl.close()

    def _audit(self, cl, db) -> None:
        """Read every balance and the newest transfers at one point, in a
        snapshot session, at read concern majority or in a read-only
        transaction; note what was seen."""
        from pymongo.read_concern import ReadConcern
        from pymongo.write_concern import WriteConcern
        kind = self.rnd.choice(("snapshot", "majority", "transaction"))
        acct, log = db[ACCOUNTS], db[LOG]
        if kind == "majority":
            rc = ReadConcern("majority")
            acct, log = acct.with_options(read_concern=rc), log.with_options(read_concern=rc)
        try:
            with contextlib.ExitStack() as scope:
                s = None
                if kind == "snapshot":
                    s = scope.enter_context(cl.start_session(snapshot=True))
                elif kind == "transaction":  # read only: what it saw holds once committed
                    s = scope.enter_context(cl.start_session())
                    scope.enter_context(s.start_transaction(
                        read_concern=ReadConcern("snapshot"),
                        write_concern=WriteConcern("majority", wtimeout=4000)))
                bals = [d["bal"] for d in acct.find({}, session=s)]
                tids = [d["tid"] for d in log.find({}, {"tid": 1}, session=s)
                        .sort("_id", -1).limit(20)]
        except Exception as e:  # noqa: BLE001 - a read that failed saw nothing
            with self.book.lock:
                self.book.errors[f"{kind} read " + _kind(e)] += 1
            return
        with self.book.lock:
            self.book.reads[kind] += 1
            if len(bals) != len(self.accounts) or sum(bals) != self.total:
                self.book.torn.append((kind, sum(bals), len(bals)))
            for t in tids:
                self.book.seen.setdefault(t, kind)

    def _touch(self, acct) -> None:
        try:
            acct.update_one({"_id": self.rnd.choice(self.accounts)}, {"$inc": {"touched": 1}})
            k = 0
        except Exception as e:  # noqa: BLE001 - its outcome is unknown: recorded
            k = 1
            with self.book.lock:
                self.book.errors["touch " + _kind(e)] += 1
        with self.book.lock:
            self.book.touches[k] += 1


def setup(rs, n_accounts: int) -> list[str]:
    accounts = [f"a{i}" for i in range(n_accounts)]
    rs.client(w="majority")[DB][ACCOUNTS].insert_many(
        [{"_id": a, "bal": INITIAL} for a in accounts])
    return accounts


def final_state(uri: str) -> tuple[dict, list[dict], int]:
    """The balances, the log and the accounts' counts (summed), read at one
    point (a snapshot session), retried while the set settles."""
    import pymongo
    cl = pymongo.MongoClient(uri, serverSelectionTimeoutMS=30_000)
    try:
        for attempt in range(30):
            try:
                with cl.start_session(snapshot=True) as s:
                    db = cl.get_database(DB)
                    accts = list(db[ACCOUNTS].find({}, session=s))
                    logs = list(db[LOG].find({}, {"_id": 0}, session=s))
                return ({d["_id"]: d["bal"] for d in accts}, logs,
                        sum(d.get("touched", 0) for d in accts))
            except pymongo.errors.PyMongoError:
                if attempt == 29:
                    raise
                time.sleep(1)
    finally:
        cl.close()
    raise AssertionError("unreachable")
