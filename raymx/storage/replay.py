"""Parallel replay of an oplog range (DESIGN 8): explode, keep the last image, write.

Applying entries one at a time writes every intermediate version of a
document. Because every ``i``/``u``/``d`` op carries the full image after it
(``post``; nothing after a delete), only the last op per (namespace, ``_id``)
matters for the final state, and documents are independent of each other.
Commands are not: a ``create``/``drop``/``createIndex``/``dropIndex`` changes
what later ops mean, so commands cut the range into segments: segment ``k``
holds the document ops between command ``k-1`` and command ``k``, and command
``k`` runs alone right after segment ``k`` is written.

The steps are pure and row-shaped, so Spark can run the first two
(``raymx.spark_bridge.spark_replay``) and a member the last:

* ``explode_entry`` turns one entry into rows ``(seq, i, kind, ns, pk, post)``;
  ``kind`` is ``w`` (write ``post``), ``d`` (delete) or ``c`` (a command,
  ``post`` = the packed op);
* ``segment_of`` numbers a row's segment from the (few) command orders, and
  ``last_images`` keeps the newest row per (segment, ns, pk);
* ``SegmentWriter`` writes those rows in (segment, ns, pk) order with index
  maintenance, runs each command at its barrier, and removes the unapplied
  marks of the entries each barrier completes in the barrier's transaction.
  A crash before a barrier leaves the marks: the segment is replayed again,
  which gives the same result because images are absolute.

The result is exactly the state that applying the entries one at a time
gives, catalog ids included (tests/test_replay.py checks that on random
workloads, with and without Spark).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterable, Iterator

from raymx.storage import codec
from raymx.storage.catalog import _pk
from raymx.storage.engine import Engine
from raymx.storage.gtid import GTID


@dataclass
class Change:
    """The newest op on one document within one segment."""
    segment: int
    ns: str
    pk: bytes          # encode_key(_id): the document's key in its collection
    order: tuple       # (seq, op index): GTID order within the range
    post: bytes | None  # the packed image after the op; None: deleted


@dataclass
class Command:
    order: tuple       # (seq, op index); command k closes segment k
    op: dict


# --- explode (per entry: Spark runs this in its Python workers) -------------
def explode_entry(seq: int, ops: list[dict]) -> list[tuple]:
    """Rows ``(seq, i, kind, ns, pk, post bytes, last_i)`` for one entry's ops.

    ``last_i`` is the index of the entry's last op that is not a no-op: an
    entry is complete once the segment holding that op has been written."""
    last_i = max((i for i, op in enumerate(ops) if op["op"] != "n"), default=-1)
    out = []
    for i, op in enumerate(ops):
        kind = op["op"]
        if kind == "n":
            continue
        if kind == "c":
            out.append((seq, i, "c", op["ns"], b"", codec.pack(op), last_i))
        elif kind == "d":
            out.append((seq, i, "d", op["ns"], _pk(op["pre"]["_id"]), None, last_i))
        else:
            out.append((seq, i, "w", op["ns"], _pk(op["post"]["_id"]), codec.pack(op["post"]),
                        last_i))
    return out


def segment_of(cmd_orders: list[tuple], order: tuple) -> int:
    """The segment of a document op: how many commands come before it."""
    return bisect.bisect_left(cmd_orders, order)


def done_through(first_seq: int, last_seq: int, commands: list[tuple]) -> dict[int, int]:
    """For each segment ``k``, the newest seq whose entry is complete once
    segment ``k`` and its command have run.

    ``commands``: ``(seq, i, last_i)`` per command, sorted. An entry without
    commands ends in the segment of its position; one holding commands ends
    in the segment of its last op (a command closes its own segment)."""
    orders = [(s, i) for s, i, _ in commands]
    last_i = {s: li for s, _, li in commands}

    def end(s: int) -> int:
        return bisect.bisect_left(orders, (s, last_i.get(s, -1)))
    out = {}
    for k in range(len(orders) + 1):
        lo, hi = first_seq, last_seq  # end() never decreases with seq: bisect
        if end(lo) > k:
            continue
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if end(mid) <= k:
                lo = mid
            else:
                hi = mid - 1
        out[k] = lo
    return out


def last_images(rows: Iterable[tuple], cmd_orders: list[tuple]) -> list[Change]:
    """The newest document row per (segment, ns, pk), sorted by (segment, ns, pk)."""
    best: dict[tuple, tuple] = {}
    for seq, i, kind, ns, pk, post, _ in rows:
        if kind == "c":
            continue
        k = (segment_of(cmd_orders, (seq, i)), ns, pk)
        cur = best.get(k)
        if cur is None or (seq, i) > cur[0]:
            best[k] = ((seq, i), post)
    return [Change(k[0], k[1], k[2], v[0], v[1]) for k, v in sorted(best.items())]


def first_uses(rows: Iterable[tuple], cmd_orders: list[tuple]) -> dict[tuple, tuple]:
    """(segment, ns) -> order of the segment's first op on ns: an applier creates
    missing collections implicitly at first use, so the replay creates them in
    that order and the catalog hands out the same ids."""
    out: dict[tuple, tuple] = {}
    for seq, i, kind, ns, _, _, _ in rows:
        if kind == "c":
            continue
        k = (segment_of(cmd_orders, (seq, i)), ns)
        if k not in out or (seq, i) < out[k]:
            out[k] = (seq, i)
    return out


# --- write (on the member) ------------------------------------------------------
class SegmentWriter:
    """Writes deduplicated changes in (segment, ns, pk) order, possibly in many
    calls (blocks of a Spark result), running barriers as segments end."""

    def __init__(self, engine: Engine, commands: list[Command], done: dict[int, int],
                 first_use: dict[tuple, tuple], first_unapplied: bytes | None,
                 txn_docs_max: int):
        self.e = engine
        self.commands = sorted(commands, key=lambda c: c.order)
        self.done = done
        self.namespaces: dict[int, list[str]] = {}
        for (s, ns), order in sorted(first_use.items(), key=lambda x: x[1]):
            self.namespaces.setdefault(s, []).append(ns)
        self.first_unapplied = first_unapplied
        self.txn_docs_max = txn_docs_max
        self.seg = 0
        self.entered = False  # the current segment's collections exist
        self.written = 0

    def write(self, changes: list[Change]) -> None:
        i = 0
        while i < len(changes):
            s = changes[i].segment
            if s < self.seg:
                raise AssertionError(f"segment {s} arrived after segment {self.seg}")
            while self.seg < s:
                self._barrier()
            j = i
            while j < len(changes) and changes[j].segment == s:
                j += 1
            for a in range(i, j, self.txn_docs_max):
                self._write_docs(changes[a:min(j, a + self.txn_docs_max)])
            i = j

    def close(self) -> None:
        """Run the remaining barriers (through the last segment)."""
        while self.seg <= len(self.commands):
            self._barrier()

    def _enter(self, tx) -> None:
        if not self.entered:
            for ns in self.namespaces.get(self.seg, ()):
                tx._coll_for_write(ns)  # implicit creations, in first-use order
            self.entered = True

    def _write_docs(self, chunk: list[Change]) -> None:
        tx = self.e.begin(log=False, autocommit=True)
        try:
            self._enter(tx)
            colls = {}
            for c in chunk:
                coll = colls.get(c.ns)
                if coll is None:
                    coll = colls[c.ns] = tx._coll_for_write(c.ns)
                cur = tx._get_pk(coll, c.pk)
                if c.post is None:
                    if cur is not None:
                        tx._delete_doc(coll, c.pk, cur)
                else:
                    tx._write_doc(coll, c.pk, cur, codec.unpack_document(c.post), c.post, False)
            tx.commit()
        except BaseException:
            tx.abort()
            raise
        self.written += len(chunk)

    def _barrier(self) -> None:
        """The end of segment ``seg``: its command, then the marks it completes."""
        tx = self.e.begin(log=False, autocommit=True)
        try:
            self._enter(tx)
            if self.seg < len(self.commands):
                tx.apply_op(self.commands[self.seg].op)
            upto = self.done.get(self.seg)
            if upto is not None and self.first_unapplied is not None:
                # the unapplied table is in GTID order, which is seq order
                dead = []
                for k, _ in tx.t.scan("unapplied", self.first_unapplied):
                    if GTID.from_bytes(k).seq > upto:
                        break
                    dead.append(k)
                for k in dead:
                    tx.t.delete("unapplied", k)
            tx.commit()
        except BaseException:
            tx.abort()
            raise
        self.seg += 1
        self.entered = False


# --- the single-process path ----------------------------------------------------
def plan(entries: Iterable[tuple[GTID, list[dict]]]):
    """explode + last images in one streaming pass over entries in GTID order
    (the single-process path; same result as ``last_images``/``first_uses``):
    returns (changes, commands, done, first_use, entries seen, first GTID, last GTID)."""
    best: dict[tuple, tuple] = {}
    first_use: dict[tuple, tuple] = {}
    cmds = []
    seg = n = 0
    first = last = None
    for g, ops in entries:
        if first is None:
            first = g
        last = g
        n += 1
        for seq, i, kind, ns, pk, post, last_i in explode_entry(g.seq, ops):
            if kind == "c":
                cmds.append((seq, i, last_i, codec.unpack(post)))
                seg += 1
                continue
            best[(seg, ns, pk)] = ((seq, i), post)  # in GTID order: the newest wins
            if (seg, ns) not in first_use:
                first_use[(seg, ns)] = (seq, i)
    done = done_through(first.seq, last.seq, [c[:3] for c in cmds]) if n else {}
    changes = [Change(k[0], k[1], k[2], v[0], v[1]) for k, v in sorted(best.items())]
    return (changes, [Command((s, i), op) for s, i, _, op in cmds], done, first_use, n,
            first, last)


def unapplied_entries(engine: Engine, max_entries: int | None = None
                      ) -> Iterator[tuple[GTID, list[dict]]]:
    """The unapplied entries in GTID order (ops resolved), at most ``max_entries``."""
    with engine.store.read() as t:
        n = 0
        for k, _ in t.scan("unapplied"):
            v = t.get("oplog", k)
            if v is None:
                raise AssertionError(f"unapplied {GTID.from_bytes(k)} has no oplog entry")
            yield GTID.from_bytes(k), engine.entry_ops(t, codec.unpack(v, "oplog entry"))
            n += 1
            if max_entries is not None and n >= max_entries:
                return


def replay_unapplied(engine: Engine, txn_docs_max: int, max_entries: int | None = None
                     ) -> tuple[int, int, GTID | None]:
    """Replay up to ``max_entries`` unapplied entries in this process.
    Returns (entries, documents written, last GTID)."""
    changes, commands, done, first_use, n, first, last = plan(
        unapplied_entries(engine, max_entries))
    if not n:
        return 0, 0, None
    w = SegmentWriter(engine, commands, done, first_use, first.to_bytes(), txn_docs_max)
    w.write(changes)
    w.close()
    return n, w.written, last
