"""What must hold after a crash, checked through raymx's public storage API.

Reusable by any fault harness (power loss with LazyFS today, other faults or
another durability scheme later): nothing here knows LMDB's file layout, the
key layout of the sub-databases, or LazyFS. A member's folder is opened by
the caller's ``open_engine(path)`` (by default what a member itself runs at
start, ``raymx.actors.process.open_member``), and everything is read through
``Engine``: ``verify_oplog`` (density and the hash chain), ``snapshot_state``
(documents and index entries) and ``find``. A change of the durability scheme
(a write-ahead log, another store) is checked by the same code as long as a
restarted member's folder opens into an ``Engine``.

- ``Ledger``: every acknowledged write (thread-safe; writers record after
  the acknowledgement, never before), the documents that must be present
  and the counters whose stored value must be at least what was acknowledged.
- ``verify_indexes(engine)``: every index's entries equal the entries the
  engine's own index code gives for the stored documents, a unique index
  holds no key twice (``Reader.validate``, as the ``validate`` command).
- ``check_folder(path, ledger_view, ns)``: opens, verifies the oplog and the
  indexes, and lists acknowledged writes that are missing.
- ``converged(digests)``: running members' ``state_digest``s agree.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

from raymx.storage.engine import Engine


class Ledger:
    """Acknowledged writes: what a crash must not lose.

    ``doc(ns, d)``: an insert of ``d`` (with its ``_id``) was acknowledged, so
    the document must be stored exactly so (writers never change it later).
    ``counter(ns, _id, field, n)``: ``{"$set": {field: n}}`` on the document
    ``_id`` was acknowledged, with ``n`` growing per writer, so the stored
    value must be at least ``n`` (a later unacknowledged write may have
    raised it). ``view()`` is a consistent copy to check against: take it
    before reading the store, so everything in it was acknowledged before
    the read began.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._docs: dict[str, dict] = {}        # ns -> {_id: doc}
        self._counters: dict[str, dict] = {}    # ns -> {_id: (field, n)}
        self.acked = 0

    def doc(self, ns: str, d: dict) -> None:
        with self._lock:
            self._docs.setdefault(ns, {})[d["_id"]] = d
            self.acked += 1

    def counter(self, ns: str, _id, fld: str, n: int) -> None:
        with self._lock:
            cur = self._counters.setdefault(ns, {}).get(_id)
            if cur is None or n > cur[1]:
                self._counters[ns][_id] = (fld, n)
            self.acked += 1

    def view(self) -> "LedgerView":
        with self._lock:
            return LedgerView({ns: dict(d) for ns, d in self._docs.items()},
                              {ns: dict(c) for ns, c in self._counters.items()}, self.acked)


@dataclass
class LedgerView:
    docs: dict
    counters: dict
    acked: int

    def writes(self) -> int:
        """Acknowledged writes this view checks (documents + counter documents)."""
        return sum(len(d) for d in self.docs.values()) + sum(
            len(c) for c in self.counters.values())

    def missing(self, stored: Callable[[str], dict]) -> list[str]:
        """What an acknowledged write left that ``stored(ns)`` ({_id: doc}) lacks."""
        out = []
        for ns in sorted(set(self.docs) | set(self.counters)):
            have = stored(ns)
            for _id, d in self.docs.get(ns, {}).items():
                got = have.get(_id)
                if got is None:
                    out.append(f"{ns} {_id!r}: acknowledged insert is missing")
                elif got != d:
                    out.append(f"{ns} {_id!r}: stored {got!r} != acknowledged {d!r}")
            for _id, (fld, n) in self.counters.get(ns, {}).items():
                got = have.get(_id)
                v = None if got is None else got.get(fld)
                if not isinstance(v, int) or v < n:
                    out.append(f"{ns} {_id!r}: {fld} is {v!r}, an acknowledged write set {n}")
        return out


def verify_indexes(engine: Engine) -> list[str]:
    """Every collection's documents against its indexes: each index holds
    exactly the entries raymx's own index code gives for the stored
    documents, a unique one no key twice (``Reader.validate``, what the
    ``validate`` command answers). Returns the differences (empty: equal)."""
    r = engine.reader()
    try:
        return [f"{ns}: {p}" for ns in r.list_collections() for p in r.validate(ns)["errors"]]
    finally:
        r.t.abort()


@dataclass
class FolderCheck:
    """One check of one member's folder."""
    path: str
    opened: bool = False
    oplog_entries: int = 0
    documents: int = 0
    problems: list = field(default_factory=list)   # corruption: open, oplog, indexes
    missing: list = field(default_factory=list)     # acknowledged writes not there
    checked: int = 0                                # acknowledged writes checked

    @property
    def ok(self) -> bool:
        return self.opened and not self.problems and not self.missing


def check_folder(path: str, view: LedgerView | None,
                 open_engine: Callable[[str], Engine] | None = None,
                 close: Callable[[Engine], None] | None = None,
                 indexes: bool = True) -> FolderCheck:
    """Open a member's folder, verify the oplog and (``indexes``) every
    index, and list what ``view`` holds that is not stored. The folder may be
    in use by the running member (LMDB allows readers in other processes):
    every read is one snapshot per call."""
    if open_engine is None:
        from raymx.actors.process import open_member
        from raymx.storage.limits import DEFAULT
        open_engine = lambda p: open_member(p, DEFAULT)  # noqa: E731
    out = FolderCheck(path)
    try:
        e = open_engine(path)
    except Exception as ex:
        out.problems.append(f"does not open: {type(ex).__name__}: {ex}")
        return out
    out.opened = True
    try:
        try:
            out.oplog_entries = e.verify_oplog()
        except Exception as ex:
            out.problems.append(f"verify_oplog: {type(ex).__name__}: {ex}")
        if indexes:
            try:
                out.problems += verify_indexes(e)
            except Exception as ex:
                out.problems.append(f"reading documents and indexes: {type(ex).__name__}: {ex}")
        if view is not None:
            def stored(ns):
                docs = {d["_id"]: d for d in e.find(ns)}
                out.documents += len(docs)
                return docs
            try:
                out.missing = view.missing(stored)
                out.checked = view.writes()
            except Exception as ex:
                out.problems.append(f"reading documents: {type(ex).__name__}: {ex}")
    finally:
        (close or (lambda x: x.store.close()))(e)
    return out


def _check_child(conn, path: str, view: LedgerView | None, indexes: bool) -> None:
    conn.send(check_folder(path, view, indexes=indexes))
    conn.close()


def check_folder_isolated(path: str, view: LedgerView | None, indexes: bool = True,
                          timeout_s: float = 900.0) -> FolderCheck:
    """``check_folder`` (with the member's own ``open_member``) in a child
    process: a corrupt file can make LMDB read through a page pointer past the
    end of its map (SIGBUS) or follow garbage (SIGSEGV), which is a finding to
    report, not the end of the harness."""
    import multiprocessing as mp
    ctx = mp.get_context("forkserver")  # forked from a fresh server: no Ray threads
    recv, send = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_check_child, args=(send, path, view, indexes), daemon=True)
    p.start()
    send.close()
    out = None
    try:
        if recv.poll(timeout_s):
            out = recv.recv()
    except EOFError:
        pass
    finally:
        recv.close()
    if out is None and p.is_alive():
        p.kill()
    p.join(30)
    if out is None:
        out = FolderCheck(path)
        code = p.exitcode
        why = (f"killed by signal {-code}" if code is not None and code < 0
               else f"exit code {code}")
        out.problems.append(f"the checking process died ({why}): reading the folder crashed "
                            "LMDB, e.g. SIGBUS on a page pointer past the end of the file")
    return out


def converged(digests: list[dict]) -> bool:
    """Members' ``state_digest``s agree: the same collections, and the same
    oplog entries (GTID and hash) from the latest first entry on; a member
    added from a snapshot holds the oplog from its snapshot's point only."""
    if any(d["collections"] != digests[0]["collections"] for d in digests):
        return False
    logs = [[(tuple(g), h) for g, h in d["oplog"]] for d in digests]
    if not all(logs):
        return not any(logs)
    start = max(ol[0][0] for ol in logs)
    tails = [[x for x in ol if x[0] >= start] for ol in logs]
    return all(t == tails[0] for t in tails)
