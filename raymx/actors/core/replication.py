"""Replication cores: feeder, producer and applier (pure: no Ray, no clock, no threads).

Storage comes in as an ``Engine``, time as ``now_ms`` arguments. The Ray shells
in ``raymx.actors.member`` own the threads and carry the notifications.

Entries travel as they are stored: ``(GTID bytes, entry bytes, [chunk bytes])``
(chunks only for spilled transactions). A producer validates them on arrival
(decode with limits, known op types, contiguous seqs, the hash chain) and
writes the same bytes; nothing is re-encoded.
"""
from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass

from raymx import errors
from raymx.storage import codec, oplog, replay
from raymx.storage.engine import RANGE_KEY, Engine, RangeRecord, entry_chunks
from raymx.storage.gtid import GTID, ZERO
from raymx.storage.keys import prefix_end
from raymx.storage.limits import Limits

Row = tuple  # (gtid bytes, entry bytes, list of chunk bytes)


def _rows(t, start: bytes | None, stop: bytes | None, max_entries: int, max_bytes: int
          ) -> list[Row]:
    out, size = [], 0
    for k, v in t.scan("oplog", start, stop):
        if len(out) >= max_entries or (out and size + len(v) > max_bytes):
            break
        chunks = entry_chunks(t, v)
        out.append((k, v, chunks))
        size += len(v) + sum(map(len, chunks))
    return out


class FeederCore:
    """Serves a tailable cursor over this member's oplog.

    ``limit`` is the newest GTID it may ship: the replicatable point's
    predecessor on a primary (only durable, gap-free entries), the end of the
    written oplog on a secondary (chained replication). The newest entries are
    kept in memory so hot readers do not touch LMDB.
    """

    def __init__(self, engine: Engine, limits: Limits, cache_entries: int = 4096):
        self.e = engine
        self.limits = limits
        self.limit: GTID = ZERO
        self.cache: deque[Row] = deque(maxlen=cache_entries)
        self.positions: dict[int, dict] = {}  # member id -> {"durable", "applied", "at_ms"}
        # majority-committed point: on a primary, computed from the positions of
        # members whose pull proved (by hash) that they hold this branch; on a
        # secondary, the one its producer learned upstream
        self.votes: dict[int, int] = {}
        self.validated: dict[int, GTID] = {}
        self.upstream_majority: GTID | None = None

    def set_votes(self, votes: dict) -> None:
        """A new configuration: the positions of members no longer in it go, so
        a member configured again later starts from what it reports then."""
        self.votes = {int(k): v for k, v in votes.items()}
        self.positions = {m: p for m, p in self.positions.items() if m in self.votes}

    def advance(self, limit: GTID) -> bool:
        """The shell calls this on every notification; True if there is something new."""
        if limit <= self.limit:
            return False
        start = prefix_end(self.limit.to_bytes()) if self.limit != ZERO else None
        stop = prefix_end(limit.to_bytes())
        cap = self.cache.maxlen
        with self.e.store.read() as t:
            if self.limit == ZERO or limit.seq - self.limit.seq > cap:
                # more than the cache holds (seqs are dense): find where the
                # newest ``cap`` entries start
                keys = []
                for k, _ in t.scan("oplog", start, stop, reverse=True):
                    keys.append(k)
                    if len(keys) >= cap:
                        break
                if not keys:
                    return False
                start = keys[-1]
            rows = _rows(t, start, stop, cap, 1 << 62)
        if not rows:
            return False
        if len(rows) >= cap or (self.cache and
                                GTID.from_bytes(rows[0][0]).seq != self.limit.seq + 1):
            self.cache.clear()  # keep the cache one contiguous run ending at limit
        self.cache.extend(rows)
        self.limit = GTID.from_bytes(rows[-1][0])
        return True

    def truncated(self) -> None:
        """After a rollback or a change of role: forget everything cached, the
        shipped bound, and the positions pullers reported (they were about the
        oplog as it was; the next pulls report them again)."""
        self.cache.clear()
        self.limit = ZERO
        self.validated.clear()
        self.positions.clear()

    def committed_point(self, self_id: int, primary: bool) -> GTID | None:
        """The majority-committed point this feeder can vouch for."""
        mp = self.upstream_majority
        if primary and self.votes:
            pos = {m: g for m, g in self.validated.items() if g <= self.limit}
            pos[self_id] = self.limit  # the limit is durable here
            own = committed(majority_point(pos, self.votes), self.e.term)
            if own is not None and (mp is None or own > mp):
                mp = own
        return mp

    def vouch(self, held: bool, after, durable, applied, downstream: dict | None,
              member: int | None = None, self_id: int | None = None) -> tuple:
        """The positions a pull reports that may count for write concern here.
        ``held``: this pull's answer was not ``diverged``/``too_stale``, i.e. the
        caller holds this oplog's entry at ``after`` (its last) with the same
        hash. The caller's position counts only then, and only if ``durable``
        is that entry; its downstream members' (chained replication: validated
        against the caller's oplog, maybe before the caller rolled back) only
        if this oplog holds their GTIDs too (one primary per term: an entry with
        that GTID, and everything before it, is this branch's), and never for
        the caller or this member themselves (the caller's own report is
        newer). A member on another branch counts for nothing, whatever its
        GTIDs say. Returns (durable, applied, downstream)."""
        if durable is not None and (tuple(durable) != tuple(after or ()) or not held):
            return None, None, {}
        down = {}
        if downstream:
            with self.e.store.read() as t:
                for m, p in downstream.items():
                    if int(m) in (member, self_id):
                        continue
                    d = p.get("durable")
                    if d is None or tuple(d) == tuple(ZERO) or \
                            t.get("oplog", GTID(*d).to_bytes()) is not None:
                        down[m] = p
        return durable, applied, down

    def report(self, member: int, durable, applied, now_ms: int) -> None:
        self.positions[member] = {"durable": None if durable is None else GTID(*durable),
                                  "applied": None if applied is None else GTID(*applied),
                                  "at_ms": now_ms}

    def admit(self, term: int, self_id: int) -> dict | None:
        """A pull from a caller that knows ``term``: None to serve it, or the
        ``stale_term`` answer after recording the newer term durably (this
        member, if it was primary, is deposed: it must not ship entries or
        gather acknowledgements any more)."""
        mine = self.e.term
        if term <= mine:
            return None
        self.e.set_term(term)
        return {"status": "stale_term", "term": term,
                "reason": f"member {self_id} was at term {mine} < {term}"}

    def answer(self, after, after_h, max_entries: int, max_bytes: int, term: int,
               member: int, self_id: int, primary: bool, caller: dict | None,
               now_ms: int) -> tuple[dict, dict | None, bool]:
        """One answer of a pull served at ``term`` (the member's term when it
        arrived): the entries after ``after``, with the majority point this
        feeder vouches for. ``caller``: the positions the pull reports
        (``durable``, ``applied``, ``downstream``), on its first answer only;
        they count as ``vouch`` says. Returns (answer, the positions now known
        if ``caller`` was given, whether the majority point moved)."""
        out = self.pull(after, after_h, max_entries, max_bytes)
        out["term"] = term
        report = None
        if caller is not None:
            d, a, down = self.vouch(out["status"] == "ok", after, caller.get("durable"),
                                    caller.get("applied"), caller.get("downstream"), member,
                                    self_id)
            self.report(member, d, a, now_ms)
            for m, p in down.items():
                self.report(int(m), p.get("durable"), p.get("applied"), p.get("at_ms", now_ms))
            report = dict(self.positions)
        before = self.committed_point(self_id, primary)
        if out["status"] == "diverged":
            self.validated.pop(member, None)
        elif out["status"] == "ok" and after is not None and after_h is not None \
                and tuple(after) != tuple(ZERO):
            cur = self.validated.get(member)  # the caller holds ``after`` with our hash
            if cur is None or GTID(*after) > cur:
                self.validated[member] = GTID(*after)
        mj = self.committed_point(self_id, primary)
        if mj is not None:
            out["majority"] = list(mj)
        return out, report, mj != before

    def pull(self, after, after_h: int | None, max_entries: int, max_bytes: int) -> dict:
        """Entries after ``after`` up to ``limit``; or ``diverged`` / ``too_stale``."""
        max_entries = min(max_entries, self.limits.pull_entries_max)
        max_bytes = min(max_bytes, self.limits.pull_bytes_max)
        after = None if after is None else GTID(*after)
        with self.e.store.read() as t:
            first = t.first("oplog")
            if after is not None and after != ZERO:
                v = t.get("oplog", after.to_bytes())
                if v is None:
                    # seqs, not GTIDs: a caller that diverged under another term at a
                    # seq this oplog still holds must hear "diverged", not "too stale"
                    if first is not None and after.seq < GTID.from_bytes(first[0]).seq:
                        return {"status": "too_stale", "first": list(GTID.from_bytes(first[0]))}
                    mine = t.last("oplog")
                    mine = GTID.from_bytes(mine[0]) if mine is not None else ZERO
                    if mine < after:
                        # this oplog ends below the caller's last entry, on no newer
                        # branch (GTIDs order by term first): the caller is ahead, and
                        # nothing here may make it undo entries (a majority may hold
                        # them). A stale view made a coordinator send it here (a
                        # catch-up from a member that looked more advanced)
                        return {"status": "behind", "last": list(mine),
                                "reason": f"this oplog ends at {mine}, before {after}"}
                    return {"status": "diverged", "reason": f"{after} is not in this oplog"}
                if after_h is not None and codec.unpack(v, "oplog entry")["h"] != after_h:
                    return {"status": "diverged", "reason": f"{after} has a different hash here"}
            elif first is not None and GTID.from_bytes(first[0]).seq > 1:
                return {"status": "too_stale", "first": list(GTID.from_bytes(first[0]))}
            if after is not None and after >= self.limit:
                return {"status": "ok", "rows": [], "limit": list(self.limit)}
            ak = None if after is None or after == ZERO else after.to_bytes()
            if self.cache and ak is not None and ak >= self.cache[0][0]:
                rows, size = [], 0
                for r in self.cache:
                    if r[0] <= ak:
                        continue
                    n = len(r[1]) + sum(len(c) for c in r[2])
                    if len(rows) >= max_entries or (rows and size + n > max_bytes):
                        break
                    rows.append(r)
                    size += n
            else:
                rows = _rows(t, None if ak is None else prefix_end(ak),
                             prefix_end(self.limit.to_bytes()), max_entries, max_bytes)
        return {"status": "ok", "rows": rows, "limit": list(self.limit)}


@dataclass
class Checked:
    gtid: GTID
    key: bytes
    value: bytes
    chunks: list
    entry: dict
    ops: list


def check_batch(last: GTID, last_h: int, rows: list, limits: Limits) -> list[Checked]:
    """Refuse the whole batch unless every entry decodes, is known, is contiguous
    in seq and continues the hash chain from ``(last, last_h)``."""
    out = []
    prev, prev_h = last, last_h
    for i, row in enumerate(rows):
        if not isinstance(row, (list, tuple)) or len(row) != 3:
            raise errors.BatchRefused(f"row {i} is not (gtid, entry, chunks)")
        k, v, chunks = row
        if not isinstance(k, bytes) or len(k) != 16 or not isinstance(v, bytes):
            raise errors.BatchRefused(f"row {i}: key must be 16 bytes and the entry bytes")
        g = GTID.from_bytes(k)
        where = f"entry {g}"
        if g.seq != prev.seq + 1 or g.term < prev.term:
            raise errors.BatchRefused(f"{where} does not follow {prev}: a gap or a term going back",
                                      gtid=list(g), after=list(prev))
        try:
            e = codec.unpack(v, where, limits.transaction_bytes_max + (1 << 20))
            oplog.check_entry(e, where)
            if "ops" in e:
                ops = e["ops"]
            else:
                if not isinstance(chunks, list) or len(chunks) != e["chunks"]:
                    raise errors.CorruptEntry(f"{where}: expected {e['chunks']} spilled chunks")
                ops = []
                for c in chunks:
                    part = codec.unpack(c, f"{where} chunk")
                    if type(part) is not list:
                        raise errors.CorruptEntry(f"{where}: a chunk must be a list of ops")
                    ops.extend(part)
                for j, op in enumerate(ops):
                    oplog.check_op(op, f"{where} op {j}")
        except errors.CorruptEntry as ce:
            raise errors.BatchRefused(f"refused: {ce}", gtid=list(g)) from None
        h = oplog.chain_hash(prev_h, g, oplog.stored_digest(v, [] if "ops" in e else chunks))
        if h != e["h"]:
            raise errors.BatchRefused(f"{where}: hash chain broken (expected {h:016x}, "
                                      f"entry says {e['h']:016x})", gtid=list(g))
        out.append(Checked(g, k, v, list(chunks or []), e, ops))
        prev, prev_h = g, h
    return out


def write_batch(e: Engine, batch: list[Checked], applied: bool = False) -> GTID | None:
    """Write checked entries, unapplied, in one LMDB transaction (the producer).

    The entry bytes are stored as received. A term seen for the first time
    is recorded durably with the batch (the member learns it here).
    """
    if not batch:
        return None
    with e.store.write() as t:
        last = t.last("oplog")
        lg = ZERO if last is None else GTID.from_bytes(last[0])
        if batch[0].gtid.seq != lg.seq + 1:
            raise errors.BatchRefused(f"batch starts at {batch[0].gtid} but the oplog ends at {lg}")
        b = t.get("range", RANGE_KEY)
        r = RangeRecord() if b is None else RangeRecord.unpack(b)
        terms_before = len(r.terms)
        spill_max = 0
        for c in batch:
            t.put("oplog", c.key, c.value)
            if c.chunks:
                ref = c.entry["ref"]
                spill_max = max(spill_max, ref)
                for i, ch in enumerate(c.chunks):
                    t.put("oplog.refs", oplog.spill_key(ref, i), ch)
            if not applied:
                t.put("unapplied", c.key, b"")
            r.extend(c.gtid)
        if len(r.terms) != terms_before:
            t.put("range", RANGE_KEY, r.pack())
        term = codec.unpack(t.get("meta", b"term"))
        if batch[-1].gtid.term > term:
            t.put("meta", b"term", codec.pack(batch[-1].gtid.term))
        if spill_max:
            # spill ids of replicated entries must never be reused if this member
            # becomes primary and spills its own transactions
            nb = t.get("meta", b"next_spill")
            if nb is None or codec.unpack(nb) < spill_max:
                t.put("meta", b"next_spill", codec.pack(spill_max))
    e._committed(batch[-1].gtid, batch[-1].entry["h"])
    return batch[-1].gtid


def min_unapplied(e: Engine) -> GTID | None:
    with e.store.read() as t:
        f = t.first("unapplied")
        return None if f is None else GTID.from_bytes(f[0])


def apply_batch(e: Engine, limits: Limits, now_ms: int, delay_ms: int = 0,
                clock=None) -> tuple[int, int, GTID | None]:
    """Apply unapplied entries in GTID order, marking them applied in the same
    transaction. Bounded by ``apply_batch_ops/bytes/ms``; a command is applied
    alone (a barrier); entries younger than ``delay_ms`` wait (delayed member).

    Returns (entries, ops, last GTID applied). ``clock`` (ms) bounds the time.
    """
    n_entries = n_ops = n_bytes = 0
    last = None
    start = clock() if clock else now_ms
    tx = e.begin(log=False, autocommit=True)
    try:
        t = tx.t
        # each entry has at least one op, so no batch needs more keys than this
        for k, _ in list(itertools.islice(t.scan("unapplied"), limits.apply_batch_ops)):
            v = t.get("oplog", k)
            if v is None:
                raise AssertionError(f"unapplied {GTID.from_bytes(k)} has no oplog entry")
            entry = codec.unpack(v, "oplog entry")
            if delay_ms and entry["ts"] + delay_ms > now_ms:
                break
            ops = e.entry_ops(t, entry)
            is_cmd = any(op.get("op") == "c" for op in ops)
            if is_cmd and n_entries:
                break  # a command is applied alone, after what came before it
            for op in ops:
                tx.apply_op(op)
            t.delete("unapplied", k)
            g = GTID.from_bytes(k)
            if last is not None and g.seq != last.seq + 1:
                raise AssertionError(f"applied {g} after {last}: not in dense GTID order")
            last = g
            n_entries += 1
            n_ops += len(ops)
            n_bytes += len(v)
            if (is_cmd or n_ops >= limits.apply_batch_ops or n_bytes >= limits.apply_batch_bytes
                    or (clock and clock() - start >= limits.apply_batch_ms)):
                break
        tx.commit()
    except BaseException:
        tx.abort()
        raise
    return n_entries, n_ops, last


def backlog(e: Engine) -> int:
    """Entries written but not applied: a subtraction, since seqs are dense."""
    with e.store.read() as t:
        mu, last = t.first("unapplied"), t.last("oplog")
        if mu is None or last is None:
            return 0
        return GTID.from_bytes(last[0]).seq - GTID.from_bytes(mu[0]).seq + 1


def apply_step(e: Engine, limits: Limits, now_ms: int, delay_ms: int = 0,
               clock=None) -> tuple[int, int, GTID | None, str]:
    """One applier step: parallel replay of up to ``replay_entries_max`` entries
    when more than ``replay_entries_min`` are behind (not for a delayed member:
    it must hold young entries back), else one ordinary batch.

    Returns (entries, ops or documents written, last GTID applied, mode)."""
    if not delay_ms and backlog(e) > limits.replay_entries_min:
        n, docs, last = replay.replay_unapplied(e, limits.replay_txn_docs_max,
                                                max_entries=limits.replay_entries_max)
        return n, docs, last, "replay"
    return (*apply_batch(e, limits, now_ms, delay_ms, clock), "batch")


def applied_point(e: Engine) -> GTID:
    """The newest GTID applied here: the entry before the first unapplied one."""
    return e.applied_point()


def write_repl_info(e: Engine, min_uncommitted: GTID | None) -> None:
    """replInfo: the conservative restart point for restarts and hot backups."""
    with e.store.write() as t:
        mu = t.first("unapplied")
        t.put("replInfo", b"min_unapplied", b"" if mu is None else mu[0])
        t.put("replInfo", b"min_uncommitted",
              b"" if min_uncommitted is None else min_uncommitted.to_bytes())


def shipping_limit(primary: bool, votes: dict[int, int], replicatable: GTID) -> GTID | None:
    """What a primary's feeder may ship after a sync, or a configuration
    change: every entry below the replicatable point (``min_live`` recorded
    before the sync). None where nobody pulls: not a primary, or a set of one
    member (a Ray-free wake-up spared per sync). A member added to a set of
    one must then be told at once, by its configuration: else the limit the
    feeder holds is the one from before the set was alone, and the new member
    pulls nothing until the next write."""
    if not primary or len(votes) < 2:
        return None
    return GTID(replicatable.term, replicatable.seq - 1) if replicatable.seq > 1 else ZERO


def majority_count(votes: list[int]) -> int:
    """Acknowledgements a majority needs: more than half of the voting members."""
    voting = sum(1 for v in votes if v > 0)
    return voting // 2 + 1


def majority_point(durable: dict[int, GTID | None], votes: dict[int, int]) -> GTID | None:
    """The newest GTID durable on a majority of voting members (never rolled back).
    Only members of the configuration (``votes``) count: a removed member's
    position, still known, says nothing about the new configuration's majorities."""
    need = majority_count(list(votes.values()))
    pts = sorted((d for m, d in durable.items() if d is not None and votes.get(m, 0) > 0),
                 reverse=True)
    return pts[need - 1] if len(pts) >= need else None


def committed(point: GTID | None, term: int) -> GTID | None:
    """What a primary of ``term`` may call majority-committed, given the newest
    point durable on a majority: that point only if it is an entry of ``term``
    itself (Raft's commitment rule, section 5.4.2 and figure 8 of the paper).
    An entry of an earlier term can be durable on a majority and still be
    rolled back: a member that never held it can win the next election (its
    last entry has a newer term) and overwrite it. An entry of the primary's
    own term on a majority cannot be (no member without it can win), and it
    commits everything before it; a new primary writes one at once (a no-op)
    so its point moves without client writes."""
    return point if point is not None and point.term == term else None


def acknowledged(gtid: GTID, w, durable: dict[int, GTID | None], votes: dict[int, int]) -> bool:
    """Is ``gtid`` durable on enough members for write concern ``w``?

    ``durable`` maps every member (the primary included) to its durable
    position; a number counts any member of the configuration (``votes``),
    "majority" counts voting members.
    """
    have = [m for m, d in durable.items() if d is not None and d >= gtid and m in votes]
    if w == "majority":
        return sum(1 for m in have if votes[m] > 0) >= majority_count(list(votes.values()))
    return len(have) >= int(w)


def trim_bound(majority: GTID | None, applied: GTID | None, durable: dict,
               heard_ms: dict, now_ms: int, timeout_ms: int, self_id: int,
               force: bool = False, holds: dict | None = None) -> tuple[GTID, str]:
    """The oldest entry trimming must keep on this member, and what holds it.

    Always the applied point (an unapplied entry is never dropped). Unless
    ``force``: the majority-committed point (so an entry that could still be
    rolled back, and the resume points of change streams, stay) and the
    durable position of every member heard from within ``timeout_ms`` (a
    running member resumes from its last entry, which the feeder checks by
    hash). A stopped member is not waited for: it will hear ``too_stale``.
    ``holds``: {member: (GTID, expiry ms)} for members loading a snapshot taken
    at that GTID, which have not pulled from it yet (no durable position at
    or past it; a resynced member's old one is older): kept until then, or expiry.
    """
    cands = [(applied or ZERO, f"the applier at {applied or ZERO}")]
    if not force:
        cands.append((majority or ZERO, f"the majority-committed point {majority or ZERO}"))
        for m, d in sorted(durable.items()):
            if m != self_id and d is not None and now_ms - heard_ms.get(m, 0) <= timeout_ms:
                cands.append((d, f"member {m} at {d}"))
        for m, (g, until) in sorted((holds or {}).items()):
            if now_ms < until and (durable.get(m) is None or durable[m] < g):
                cands.append((g, f"member {m} loading a snapshot at {g}"))
    return min(cands, key=lambda c: c[0])


def own_hashes(e: Engine, before: GTID | None, n: int) -> list[tuple[list, int]]:
    """Up to ``n`` of this oplog's (GTID, hash), newest first, below ``before``."""
    out = []
    with e.store.read() as t:
        stop = None if before is None else before.to_bytes()
        for k, v in t.scan("oplog", None, stop, reverse=True):
            out.append((list(GTID.from_bytes(k)), codec.unpack(v, "oplog entry")["h"]))
            if len(out) >= n:
                break
    return out


def match_common(e: Engine, candidates: list[tuple[list, int]]) -> GTID | None:
    """The first (newest) candidate this oplog holds with the same hash (feeder side)."""
    with e.store.read() as t:
        for g, h in candidates:
            v = t.get("oplog", GTID(*g).to_bytes())
            if v is not None and codec.unpack(v, "oplog entry")["h"] == h:
                return GTID(*g)
    return None


def rollback_to(e: Engine, common: GTID, ops_max: int, write_records) -> int:
    """Undo every entry after ``common`` newest first and truncate the oplog, in
    one LMDB transaction. ``write_records(records)`` runs before the commit (the
    rollback file must be safe first). Applied entries are undone from their
    images; entries still unapplied are only dropped. Raises IrreversibleOp (or
    if more than ``ops_max`` ops would be undone) without changing anything.
    """
    records = []
    tx = e.begin(log=False, autocommit=True)
    try:
        t = tx.t
        first = t.first("oplog")
        if first is not None and common < GTID.from_bytes(first[0]) and \
                GTID.from_bytes(first[0]).seq > 1:
            # the oplog starts mid-chain (created from a snapshot, or trimmed): what
            # lies before its first entry cannot be undone from images it holds
            raise errors.IrreversibleOp(
                f"the common point {common} is before this oplog's first entry "
                f"{GTID.from_bytes(first[0])}: this member needs a resync", gtid=list(common))
        later = list(t.scan("oplog", prefix_end(common.to_bytes()), None, reverse=True))
        n_ops = 0
        for k, v in later:
            g = GTID.from_bytes(k)
            entry = codec.unpack(v, "oplog entry")
            ops = e.entry_ops(t, entry)
            n_ops += len(ops)
            if n_ops > ops_max:
                raise errors.IrreversibleOp(
                    f"rollback after {common} would undo more than {ops_max} ops "
                    "(rollback_ops_max): this member needs a resync", gtid=list(g))
            if t.get("unapplied", k) is not None:
                t.delete("unapplied", k)
            else:
                for op in ops:
                    if oplog.is_irreversible(op):
                        raise errors.IrreversibleOp(
                            f"entry {g} holds an irreversible op ({op.get('cmd')} on "
                            f"{op.get('ns')}): this member needs a resync", gtid=list(g))
                tx.undo_ops(ops)
            for op in reversed(ops):
                if op.get("op") != "n":
                    records.append({"gtid": str(g), "ns": op.get("ns"), "op": op["op"],
                                    "pre": op.get("pre"), "post": op.get("post"),
                                    "cmd": op.get("cmd")})
            if "ref" in entry:
                for i in range(entry["chunks"]):
                    t.delete("oplog.refs", oplog.spill_key(entry["ref"], i))
            t.delete("oplog", k)
        b = t.get("range", RANGE_KEY)
        if b is not None:
            r = RangeRecord.unpack(b)
            r.terms = [x for x in r.terms if GTID(x[0], x[1]) <= common]
            if r.majority is not None and r.majority > common:
                raise AssertionError(f"rollback below the majority-committed point {r.majority}")
            t.put("range", RANGE_KEY, r.pack())
        write_records(records)
        tx.commit()
    except BaseException:
        tx.abort()
        raise
    e._tail = None
    return len(later)
