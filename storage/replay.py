"""Parallel replay of an oplog range (DESIGN 8): explode, keep the last image, write.

Applying entries one at a time writes every intermediate version of a
document. Because every ``i``/``u``/``d`` op carries the full image after it
(``post``; nothing after a delete), only the last op per (namespace, ``_id``)
matters for the final state, and documents are independent of each other.
Commands are not: a ``create``/``drop``/``createIndex``/``dropIndex`` changes
what later ops mean, so commands cut the range into segments that are
replayed in order, each command alone between them.

The work splits into pure steps that Spark can also run (``spark_bridge``):

* ``explode(entries)`` -> one ``Change`` per op, with its segment number and
  its order ``(seq, op index)``; commands become ``Command`` barriers;
* ``last_images(changes)`` keeps the newest change per (segment, ns, pk);
* ``apply_segment`` writes one segment's results with index maintenance and
  removes the unapplied marks of the entries that segment completes, in the
  same LMDB transaction (several, split by key range, for a huge segment:
  the marks go with the last, and a crash in between replays the segment
  again, which gives the same result because images are absolute).

The result is exactly the state that applying the entries one at a time
gives (tests/test_replay.py checks that on random workloads), including the
collection and index ids the catalog hands out.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Iterator

from raymx.storage import codec
from raymx.storage.engine import Engine, _pk
from raymx.storage.gtid import GTID
from raymx.storage.keys import prefix_end


@dataclass
class Change:
    """One document op of the range, reduced to what the final state needs."""
    segment: int
    ns: str
    pk: bytes          # encode_key(_id): the document's key in its collection
    order: tuple       # (seq, op index): GTID order within the range
    post: dict | None  # the image after the op; None: deleted


@dataclass
class Command:
    segment: int       # the command runs after segment ``segment``
    order: tuple
    op: dict


@dataclass
class Segment:
    """What one segment writes, and the barrier command that follows it."""
    index: int
    changes: list[Change] = field(default_factory=list)  # the last one per (ns, pk)
    namespaces: list[str] = field(default_factory=list)  # in order of first use
    command: Command | None = None
    done_through: GTID | None = None  # entries up to here are complete after it


def explode(entries: Iterable[tuple[GTID, list[dict]]]) -> tuple[list[Change], list[Command],
                                                                  dict[int, GTID]]:
    """One ``Change`` per document op and one ``Command`` per command, in GTID order.

    Also returns, per segment, the newest entry whose every op lies in or
    before that segment (what may be marked applied once it is written)."""
    changes: list[Change] = []
    commands: list[Command] = []
    done: dict[int, GTID] = {}
    seg = 0
    for g, ops in entries:
        end = seg  # the entry is complete once this segment (and its command) ran
        for i, op in enumerate(ops):
            kind = op["op"]
            if kind == "n":
                continue
            order = (g.seq, i)
            end = seg
            if kind == "c":
                commands.append(Command(seg, order, op))
                seg += 1
                continue
            img = op["post"] if kind != "d" else None
            _id = (op["pre"] if kind == "d" else op["post"])["_id"]
            changes.append(Change(seg, op["ns"], _pk(_id), order, img))
        done[end] = g
    return changes, commands, done


def last_images(changes: Iterable[Change]) -> list[Change]:
    """The newest change per (segment, ns, pk), sorted by (segment, ns, pk)."""
    best: dict[tuple, Change] = {}
    for c in changes:
        k = (c.segment, c.ns, c.pk)
        cur = best.get(k)
        if cur is None or c.order > cur.order:
            best[k] = c
    return [best[k] for k in sorted(best)]


def plan(entries: Iterable[tuple[GTID, list[dict]]]) -> list[Segment]:
    """explode + last_images, grouped into segments (the single-process path)."""
    changes, commands, done = explode(entries)
    first_use: dict[tuple[int, str], tuple] = {}
    for c in changes:
        k = (c.segment, c.ns)
        if k not in first_use or c.order < first_use[k]:
            first_use[k] = c.order
    return build_segments(last_images(changes), commands, done, first_use)


def build_segments(last: list[Change], commands: list[Command], done: dict[int, GTID],
                   first_use: dict[tuple[int, str], tuple]) -> list[Segment]:
    """Group deduplicated changes by segment; ``first_use[(segment, ns)]`` is the
    order of the segment's first op on ``ns`` (collections an applier would
    create implicitly are created in that order, so catalog ids match)."""
    segs = [Segment(i) for i in range(len(commands) + 1)]  # the last has no command
    for c in last:
        segs[c.segment].changes.append(c)
    for cmd in commands:
        segs[cmd.segment].command = cmd
    by_seg: dict[int, list] = {}
    for (s, ns), order in first_use.items():
        by_seg.setdefault(s, []).append((order, ns))
    for s, lst in by_seg.items():
        segs[s].namespaces = [ns for _, ns in sorted(lst)]
    last_done = None
    for s in segs:
        last_done = done.get(s.index, last_done)
        s.done_through = last_done
    return [s for s in segs if s.changes or s.command is not None or s.index in done]


def apply_segment(engine: Engine, seg: Segment, first_unapplied: bytes | None,
                  txn_docs_max: int) -> int:
    """Write one segment's last images (index maintenance, no uniqueness checks:
    the primary decided), run its command, and delete the unapplied marks from
    ``first_unapplied`` through ``seg.done_through``. Returns documents written."""
    chunks = [seg.changes[i:i + txn_docs_max]
              for i in range(0, len(seg.changes), txn_docs_max)] or [[]]
    for n, chunk in enumerate(chunks):
        final = n == len(chunks) - 1
        tx = engine.begin(log=False, autocommit=True)
        try:
            if n == 0:
                for ns in seg.namespaces:
                    tx._coll_for_write(ns)  # implicit creations, in first-use order
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
                    tx._write_doc(coll, c.pk, cur, c.post, codec.pack(c.post), False)
            if final:
                if seg.command is not None:
                    tx.apply_op(seg.command.op)
                if seg.done_through is not None and first_unapplied is not None:
                    stop = prefix_end(seg.done_through.to_bytes())
                    for k in [k for k, _ in tx.t.scan("unapplied", first_unapplied, stop)]:
                        tx.t.delete("unapplied", k)
            tx.commit()
        except BaseException:
            tx.abort()
            raise
    return len(seg.changes)


def unapplied_entries(engine: Engine, until: GTID | None = None,
                      max_entries: int | None = None) -> Iterator[tuple[GTID, list[dict]]]:
    """The unapplied entries in GTID order (ops resolved), up to ``until``."""
    with engine.store.read() as t:
        n = 0
        for k, _ in t.scan("unapplied", None, None if until is None
                           else prefix_end(until.to_bytes())):
            v = t.get("oplog", k)
            if v is None:
                raise AssertionError(f"unapplied {GTID.from_bytes(k)} has no oplog entry")
            yield GTID.from_bytes(k), engine.entry_ops(t, codec.unpack(v, "oplog entry"))
            n += 1
            if max_entries is not None and n >= max_entries:
                return


def replay_unapplied(engine: Engine, txn_docs_max: int, until: GTID | None = None,
                     max_entries: int | None = None) -> tuple[int, int, GTID | None]:
    """Replay unapplied entries (up to ``until`` / ``max_entries``) in parallel
    form in this process. Returns (entries, documents written, last GTID)."""
    entries = list(unapplied_entries(engine, until, max_entries))
    if not entries:
        return 0, 0, None
    first = entries[0][0].to_bytes()
    written = 0
    for seg in plan(entries):
        written += apply_segment(engine, seg, first, txn_docs_max)
    return len(entries), written, entries[-1][0]
