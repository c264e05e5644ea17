"""The oplog archive's decisions (DESIGN section 9), pure: no files, no threads.

Before trimming drops entries from the live oplog they are written as Parquet
segments (one row per op, the ``read_changes`` schema) under the replica set's
archive location. This module decides:

- what to archive next (``next_segment``): majority-committed entries only
  (never rolled back, so every member's copy of them is the same), starting
  right after what the index already holds;
- what trimming may drop (``trim_keep_from``): nothing past the archive;
- how the small index (``_index.json``) grows (``append``), with a fence: a
  segment archived under an older term than the index's is refused, so a
  deposed primary cannot extend a chain a newer primary now writes;
- which segments a reader needs for a resume token (``segments_after``), and
  how archived rows turn back into change events (``row_events``).

Segment files are named by their GTID range (``segment_name``), seq first so
that names sort in GTID order; the index and temporary files start with
``_`` or ``.``, which Spark's file sources skip.
"""
from __future__ import annotations

import base64
import json
import re

from bson.binary import Binary

from raymx.storage import changes, errors
from raymx.storage.gtid import GTID, ZERO

INDEX = "_index.json"
TMP_PREFIX = ".tmp-"
SEGMENT_ENTRIES_MAX = 50_000   # entries one segment holds at most
SEGMENT_OPS_MAX = 200_000      # and ops (rows): the writer ends a segment after the
                               # entry that reaches it (an entry is never split)
VERSION = 1
_NAME = re.compile(r"^seg-(\d{16})-(\d{16})-t(\d+)-t(\d+)\.parquet$")


ArchiveError = errors.ArchiveError


def segment_name(first: GTID, last: GTID) -> str:
    return f"seg-{first.seq:016d}-{last.seq:016d}-t{first.term}-t{last.term}.parquet"


def parse_name(name: str) -> tuple[GTID, GTID] | None:
    """(first, last) of a segment file's name, or None if it is not one."""
    m = _NAME.match(name)
    if m is None:
        return None
    fs, ls, ft, lt = map(int, m.groups())
    return GTID(ft, fs), GTID(lt, ls)


def empty_index() -> dict:
    return {"version": VERSION, "term": 0, "segments": [], "gaps": []}


def parse_index(text: str | bytes | None) -> dict:
    """The index from its JSON text (None: a new, empty archive). Checks its
    shape: segments in GTID order, not overlapping."""
    if text is None:
        return empty_index()
    try:
        d = json.loads(text)
    except ValueError as e:
        raise ArchiveError(f"the archive index {INDEX} is not JSON: {e}") from None
    if not isinstance(d, dict) or d.get("version") != VERSION or not isinstance(
            d.get("segments"), list):
        raise ArchiveError(f"the archive index {INDEX} is not a version-{VERSION} index")
    segs = []
    prev = None
    for s in d["segments"]:
        try:
            seg = {"file": str(s["file"]), "first": list(GTID.parse(s["first"])),
                   "last": list(GTID.parse(s["last"])), "rows": int(s["rows"]),
                   "term": int(s.get("term", 0))}
        except (KeyError, TypeError, ValueError):
            raise ArchiveError(f"the archive index {INDEX} has a malformed segment: "
                               f"{s!r:.120}") from None
        if seg["first"][1] > seg["last"][1] or (prev is not None and seg["first"][1] <= prev):
            raise ArchiveError(f"the archive index {INDEX}: segment {seg['file']} overlaps "
                               "or is out of order")
        prev = seg["last"][1]
        segs.append(seg)
    return {"version": VERSION, "term": int(d.get("term", 0)), "segments": segs,
            "gaps": [list(g) for g in d.get("gaps", [])]}


def dump_index(idx: dict) -> bytes:
    return json.dumps(idx, separators=(",", ":")).encode()


def through(idx: dict) -> GTID | None:
    """The newest entry the archive holds (None: nothing yet)."""
    return GTID(*idx["segments"][-1]["last"]) if idx["segments"] else None


def oldest(idx: dict) -> GTID | None:
    return GTID(*idx["segments"][0]["first"]) if idx["segments"] else None


def trim_keep_from(idx: dict | None) -> tuple[GTID, str]:
    """The oldest entry trimming must keep because of the archive, and why:
    everything after what it holds (an empty archive: everything)."""
    t = None if idx is None else through(idx)
    if t is None:
        return ZERO, "the archive (nothing archived yet)"
    return GTID(t.term, t.seq + 1), f"the archive at {t}"


def next_segment(idx: dict, first_live: GTID | None, majority: GTID | None,
                 oldest_pending_ts: int | None, now_ms: int, lag_ms: int,
                 want_trim: bool, max_entries: int = SEGMENT_ENTRIES_MAX
                 ) -> tuple[GTID | None, int] | None:
    """What to archive now: ``(after, until_seq)``, the entries with seq in
    (``after.seq``, ``until_seq``] (``after`` None: from the first live entry),
    or None (nothing, or not yet). The writer may end the segment sooner, at
    ``SEGMENT_OPS_MAX`` ops; the next round goes on from there.

    Only majority-committed entries (up to ``majority``). Written when the
    oldest pending entry is ``lag_ms`` old, a whole segment is pending, or
    trimming waits for the archive (``want_trim``). A segment holds at most
    ``max_entries`` entries (seqs are dense, so counts are subtractions).
    An archive whose next entry this oplog no longer holds (it was trimmed
    while the archive was off) continues at ``first_live``: ``gap_before``
    tells the caller to record the gap.
    """
    if majority is None or first_live is None or majority < first_live:
        return None
    t = through(idx)
    start = first_live.seq if t is None or t.seq + 1 < first_live.seq else t.seq + 1
    if majority.seq < start:
        return None
    pending = majority.seq - start + 1
    due = (want_trim or pending >= max_entries or oldest_pending_ts is None
           or now_ms - oldest_pending_ts >= lag_ms)
    if not due:
        return None
    after = t if t is not None and t.seq + 1 == start else None
    return after, start + min(pending, max_entries) - 1


def gap_before(idx: dict, first: GTID) -> list | None:
    """``[after seq, first seq]`` if a segment starting at ``first`` leaves a gap."""
    t = through(idx)
    if t is not None and first.seq > t.seq + 1:
        return [t.seq, first.seq]
    return None


def append(idx: dict, first: GTID, last: GTID, rows: int, file: str, term: int) -> dict:
    """The index with one more segment. Refuses (``ArchiveError``) a writer
    whose term is older than the index's (a deposed primary) and a segment
    that does not start after what the index holds (someone archived it)."""
    if term < idx["term"]:
        raise ArchiveError(f"the archive is written under term {idx['term']} now; this member "
                           f"(term {term}) no longer archives")
    t = through(idx)
    if t is not None and first.seq <= t.seq:
        raise ArchiveError(f"segment {file} starts at {first}, but the archive already holds "
                           f"up to {t}")
    gaps = list(idx["gaps"])
    g = gap_before(idx, first)
    if g is not None:
        gaps.append(g)
    seg = {"file": file, "first": list(first), "last": list(last), "rows": rows, "term": term}
    return {"version": VERSION, "term": max(term, idx["term"]),
            "segments": idx["segments"] + [seg], "gaps": gaps}


def adoptable(names: list[str], start_seq: int) -> tuple[GTID, GTID, str] | None:
    """A segment file already in the folder that starts at ``start_seq``:
    written by a primary that stopped before it recorded it in the index (its
    rows are majority-committed entries, the same on every member). Adopting
    it, not writing an overlapping one, keeps a file stream over the folder
    exact. The longest such file if several."""
    best = None
    for n in names:
        r = parse_name(n)
        if r is not None and r[0].seq == start_seq and (best is None or r[1].seq > best[1].seq):
            best = (r[0], r[1], n)
    return best


def segments_after(idx: dict, token: tuple) -> list[dict]:
    """The segments a reader resuming after ``token`` ([term, seq] or [term,
    seq, i]) needs, in order. Raises ``OplogTrimmed`` if the archive does not
    hold the entry right after the token (older than the archive, or in a gap)."""
    need = token[1] if len(token) == 3 else token[1] + 1
    segs = idx["segments"]
    out = [s for s in segs if s["last"][1] >= need]
    if not segs or (out and out[0]["first"][1] > need) or (
            not out and need <= segs[-1]["last"][1]):
        o = oldest(idx)
        raise errors.OplogTrimmed(
            f"resume token {list(token)} is older than the oplog and its archive "
            f"({'empty' if o is None else f'which starts at {o}'}): that history is gone",
            token=list(token), oldest=None if o is None else list(o))
    return out


# --- archived rows back into change events ---------------------------------
def _binary_hook(d: dict):
    if len(d) == 1 and "$binary" in d:
        b = d["$binary"]
        if isinstance(b, str):
            return base64.b64decode(b)
        if isinstance(b, dict) and set(b) == {"base64", "subType"}:  # another subtype
            return Binary(base64.b64decode(b["base64"]), int(b["subType"], 16))
    return d


def _from_json(s):
    return None if s is None else json.loads(s, object_hook=_binary_hook)


def row_event(r: dict) -> dict:
    """A change event (``raymx.storage.changes``) from one archived row."""
    ts = r["ts"]
    ms = ts // 1000 if isinstance(ts, int) else int(ts.timestamp() * 1000)
    ev = {"gtid": [r["term"], r["seq"]], "ts": ms, "ns": r["ns"], "_id": None, "pre": None,
          "post": None, "index": None, "token": [r["term"], r["seq"], r["idx"]]}
    if r.get("lsid") is not None:  # a driver transaction's change (segments since stop 45)
        ev["session"] = [r["lsid"], r.get("txn_number")]
    if r["op"] == "c":
        return changes.command_event(ev, _from_json(r["cmd"]) or {})
    return changes.image_event(ev, r["op"], _from_json(r["pre"]), _from_json(r["post"]),
                               r.get("replace") is True)


def row_events(rows, token: tuple, gate: GTID | None, flt, n_max: int, seg_last: GTID,
               more: bool = False) -> tuple[list[dict], list, bool]:
    """Events of one segment's rows (in (seq, idx) order) after ``token`` and
    up to ``gate``, at most ``n_max``. ``more``: ``rows`` is a slice and the
    segment goes on after it. Returns (events, resume token, whether the
    segment was read to its end or the gate)."""
    g0, skip = token[1], (token[2] if len(token) == 3 else None)
    events: list[dict] = []
    limit = seg_last if gate is None or gate.seq >= seg_last.seq else gate
    for r in rows:
        s = r["seq"]
        if s < g0 or (s == g0 and (skip is None or r["idx"] <= skip)):
            continue
        if s > limit.seq:
            return events, [limit.term, limit.seq], True
        if not flt.wants_ns(r["ns"]):
            continue
        ev = row_event(r)
        if flt.ops is None or ev["op"] in flt.ops:
            if len(events) >= n_max:
                return events, events[-1]["token"], False
            events.append(ev)
    if more and rows:  # the slice is looked at: after its last op
        r = rows[-1]
        return events, [r["term"], r["seq"], r["idx"]], False
    return events, [limit.term, limit.seq], True
