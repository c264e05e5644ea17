"""Parallel replay of a far-behind member's unapplied range as a Spark job (DESIGN 8).

The member's applier is held and its unapplied range cut into GTID key
ranges (``replay_prepare``). One Spark job, ``spark.range(ranges).mapInArrow``:
each Spark task runs on the member's node, opens the member's own LMDB
folder in its Python worker (``direct.local_engine``, a reader), reads its
range's stored entries, explodes them into one row per op and keeps the
newest row per (segment, namespace, ``_id``) *within its range*
(``plan_range``: the per-op Python work, which is what parallelises), and
spools the result as an Arrow file on that node; it returns one small row
(the range's entry count, its commands, its first uses).

The driver numbers the segments across ranges (range r's local segment s is
global segment s + the commands of the ranges before it), and the member's
applier process (on its node, held meanwhile) merges the spooled tables (``merge_runs``: one Arrow sort
by (segment, ns, pk, seq, i) and keeping each key's last row, vectorised) so
a document changed in several ranges is written once per segment. The
member writes the result in that order (``SegmentWriter``: index
maintenance, each command at its barrier, the range marked applied there),
then its applier resumes normal tailing. Nothing goes through Ray Data or
RayDP's Spark <-> Ray transfers, and nothing is shuffled by Spark.

The row steps are the same pure functions the single-process path uses, so
both give exactly the state of applying the entries one at a time
(tests/test_replay.py, tests/test_spark_replay.py).
"""
from __future__ import annotations

import os
import time

import pyarrow as pa

from raymx import errors
from raymx.progress import Progress
from raymx.storage import codec, replay
from raymx.storage.gtid import GTID

CHANGES = pa.schema([("seg", pa.int32()), ("ns", pa.string()), ("pk", pa.binary()),
                     ("seq", pa.int64()), ("i", pa.int32()), ("kind", pa.string()),
                     ("post", pa.binary())])
RANGE_ROW = pa.schema([("r", pa.int32()), ("entries", pa.int64()), ("rows", pa.int64()),
                       ("cmds", pa.binary()), ("first_use", pa.binary()),
                       ("path", pa.string())])


def plan_range(entries) -> tuple[pa.Table, list, dict, int]:
    """``entries`` (``(GTID, ops)`` in GTID order) -> (the newest row per
    (local segment, ns, pk) as a ``CHANGES`` table sorted by those, the
    commands ``[seq, i, last_i, packed op]``, first uses ``{(local segment,
    ns): (seq, i)}``, entries seen). Local segment k: k commands before it in
    this range."""
    best: dict[tuple, tuple] = {}
    first_use: dict[tuple, tuple] = {}
    cmds: list = []
    seg = n = 0
    for g, ops in entries:
        n += 1
        for seq, i, kind, ns, pk, post, last_i in replay.explode_entry(g.seq, ops):
            if kind == "c":
                cmds.append([seq, i, last_i, post])
                seg += 1
                continue
            best[(seg, ns, pk)] = (seq, i, kind, post)  # in GTID order: the newest wins
            if (seg, ns) not in first_use:
                first_use[(seg, ns)] = (seq, i)
    keys = sorted(best)
    vals = [best[k] for k in keys]
    table = pa.table([pa.array([k[0] for k in keys], pa.int32()),
                      pa.array([k[1] for k in keys], pa.string()),
                      pa.array([k[2] for k in keys], pa.binary()),
                      pa.array([v[0] for v in vals], pa.int64()),
                      pa.array([v[1] for v in vals], pa.int32()),
                      pa.array([v[2] for v in vals], pa.string()),
                      pa.array([v[3] for v in vals], pa.binary())], schema=CHANGES)
    return table, cmds, first_use, n


def merge_tables(tables: list[pa.Table], offsets: list[int]) -> pa.Table:
    """Ranges' ``plan_range`` tables in GTID order, their segments shifted by
    ``offsets``, as one table: the newest row per (segment, ns, pk), sorted."""
    import pyarrow.compute as pc
    shifted = [t.set_column(0, "seg", pc.add(t.column("seg"), pa.scalar(off, pa.int32())))
               for t, off in zip(tables, offsets)]
    t = pa.concat_tables(shifted) if shifted else CHANGES.empty_table()
    if len(tables) < 2 or t.num_rows < 2:
        return t
    t = t.sort_by([("seg", "ascending"), ("ns", "ascending"), ("pk", "ascending"),
                   ("seq", "ascending"), ("i", "ascending")])
    same = None  # row j has the key of row j + 1: a newer row follows, drop it
    for name in ("seg", "ns", "pk"):
        c = t.column(name)
        eq = pc.equal(c.slice(0, len(c) - 1), c.slice(1))
        same = eq if same is None else pc.and_(same, eq)
    keep = pa.concat_arrays([pc.invert(same).combine_chunks(), pa.array([True])])
    return t.filter(keep)


def read_range(m: dict, r: int, start: bytes, stop: bytes, spool: str) -> pa.RecordBatch:
    """Spark task body: range ``r`` of member ``m``'s oplog, read from its folder
    on this host, planned (``plan_range``) and spooled; one ``RANGE_ROW``."""
    from raymx.spark_bridge.direct import local_engine
    e = local_engine(m["path"], m["limits"], m["id"])
    with e.store.read() as t:
        table, cmds, first_use, n = plan_range(
            (GTID.from_bytes(k), e.entry_ops(t, codec.unpack(v, "oplog entry")))
            for k, v in t.scan("oplog", start, stop))
    path = os.path.join(spool, f"range-{r:06d}.arrow")
    with pa.OSFile(path + ".tmp", "wb") as f, pa.ipc.new_file(f, CHANGES) as w:
        w.write_table(table)
    os.replace(path + ".tmp", path)  # a retried task writes the same table again
    return pa.RecordBatch.from_pylist([{
        "r": r, "entries": n, "rows": table.num_rows, "cmds": codec.pack(cmds),
        "first_use": codec.pack([[s, ns, list(o)] for (s, ns), o in first_use.items()]),
        "path": path}], schema=RANGE_ROW)


def merge_runs(paths: list[str], offsets: list[int]) -> pa.Table:
    """``merge_tables`` over spooled range files, which are removed (a Ray task
    on the member's node)."""
    tables = []
    for p in paths:
        with pa.memory_map(p) as f:
            tables.append(pa.ipc.open_file(f).read_all())
        os.unlink(p)
    return merge_tables(tables, offsets)


def replay_dataframe(spark, m: dict, ranges: list, spool: str, counter):
    """One Spark task per GTID range (``read_range``); ``counter`` (an
    accumulator) counts entries read, for progress."""
    from raymx.spark_bridge import session
    m = {k: m[k] for k in ("path", "limits", "id")}

    def run(batches):
        for b in batches:
            for r in b.column(0).to_pylist():
                out = read_range(m, r, ranges[r][0], ranges[r][1], spool)
                counter.add(out.column(1)[0].as_py())
                yield out
    n = len(ranges)
    return spark.range(0, n, 1, n).mapInArrow(run, session.spark_schema(RANGE_ROW))


def combine(rows: list[dict]) -> tuple[list, list, dict, list[int]]:
    """The ranges' rows (in range order) -> (commands ``[(seq, i), op]``,
    ``(seq, i, last_i)`` per command, global first uses, segment offsets)."""
    commands, cmds, first_use, offsets, off = [], [], {}, [], 0
    for row in rows:
        offsets.append(off)
        cs = codec.unpack(row["cmds"])
        for seq, i, last_i, op in cs:
            commands.append(replay.Command((seq, i), codec.unpack(op)))
            cmds.append((seq, i, last_i))
        for s, ns, o in codec.unpack(row["first_use"]):
            k = (s + off, ns)
            if k not in first_use or tuple(o) < first_use[k]:
                first_use[k] = tuple(o)
        off += len(cs)
    return commands, cmds, first_use, offsets


def spark_replay(spark, rs, member: int, max_entries: int | None = None,
                 entries_per_read: int | None = None, progress: bool = True) -> dict:
    """Replay member ``member``'s unapplied entries (up to ``max_entries``) with
    Spark doing the reading, explode and last-image selection; returns figures.
    ``entries_per_read``: entries per Spark task (default: the range cut into
    twice Spark's default parallelism)."""
    import ray
    h = rs.member(member)
    # the member's applier process (on its node, held during the replay)
    # makes, merges and drops the spool: no other process starts for it
    applier = ray.get_actor(f"{rs.name}/m{member}/applier", namespace="raymx")
    t0 = time.monotonic()
    cfg = rs.config()
    m = dict(next(x for x in cfg["members"] if x["id"] == member), limits=cfg["limits"])
    if entries_per_read is None:
        behind = h.status.remote()
        st = ray.get(behind)
        n = (st["last"] or [0, 0])[1] - (st["applied"] or [0, 0])[1]
        n = min(n, max_entries or cfg["limits"].replay_entries_max)
        entries_per_read = max(1000, -(-n // (2 * spark.sparkContext.defaultParallelism)))
    plan = ray.get(h.replay_prepare.remote(max_entries, entries_per_read))  # holds the applier
    if plan is None:
        return {"entries": 0, "seconds": time.monotonic() - t0}
    spool = ray.get(applier.make_spool.remote())
    bar = Progress(f"member {member}: Spark replay", plan["entries"], progress, unit="entries")
    phases = {}
    try:
        counter = spark.sparkContext.accumulator(0)
        from raymx.spark_bridge.copy_tasks import run_job
        df = replay_dataframe(spark, m, plan["ranges"], spool, counter)
        rows = sorted(run_job(df.collect, bar, counter, sc=spark.sparkContext),
                      key=lambda r: r["r"])
        phases["spark"] = time.monotonic() - t0
        read = sum(r["entries"] for r in rows)
        if len(rows) != len(plan["ranges"]) or read != plan["entries"]:
            raise errors.Diverged(
                f"member {member}'s unapplied range changed during the Spark replay (planned "
                f"{plan['entries']} entries in {len(plan['ranges'])} ranges, read {read} in "
                f"{len(rows)}): it rolled back; the applier takes over")
        commands, cmds, first_use, offsets = combine(rows)
        first, last = GTID(*plan["first"]), GTID(*plan["last"])
        done = replay.done_through(first.seq, last.seq, cmds)
        merged = applier.merge_replay.remote([r["path"] for r in rows], offsets)
        ray.get(h.replay_begin.remote([[list(c.order), codec.pack(c.op)] for c in commands],
                                      done, [[s, ns, list(o)] for (s, ns), o in first_use.items()],
                                      list(first)))
        bar.step(f"member {member}: Spark replay, writing", None)
        written = ray.get(h.replay_block.remote(merged))
        bar.update(written)
        ray.get(h.replay_end.remote())
        phases["write"] = time.monotonic() - t0 - phases["spark"]
    except BaseException:
        try:
            ray.get(h.replay_abort.remote())
        except Exception:
            pass
        raise
    finally:
        bar.close()
        ray.get(applier.drop_spool.remote(spool))
    return {"entries": plan["entries"], "documents": written, "first": first, "last": last,
            "seconds": time.monotonic() - t0, "phases": phases, "ranges": len(rows)}
