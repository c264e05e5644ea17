"""Parallel replay of a far-behind member's unapplied range as a Spark job (DESIGN 8).

The member's applier is held; its unapplied entries come out through a Ray
Data datasource (stored bytes, by GTID key ranges), Spark explodes them into
one row per op (``raymx.storage.replay.explode_entry`` in its Python
workers), numbers each row's segment from the commands, keeps the newest row
per (segment, namespace, ``_id``), and range-partitions and sorts the result;
the member writes it block by block in that order (``SegmentWriter``: index
maintenance, each command at its barrier, the range marked applied there),
then its applier resumes normal tailing.

The row steps are the same pure functions the single-process path uses, so
both give exactly the state of applying the entries one at a time
(tests/test_replay.py).
"""
from __future__ import annotations

import itertools
import time

from raymx.storage import codec, replay
from raymx.storage.gtid import GTID

_EXPLODED = ("seq long, i int, kind string, ns string, pk binary, post binary, last_i int")
_names = itertools.count(1)


def oplog_datasource(member, ranges: list):
    """A Ray Data datasource over a member's oplog: one read task per GTID key
    range ``[start, stop)``, rows ``(gtid, entry, chunks)`` as stored."""
    import pyarrow as pa
    import ray
    from ray.data import Datasource, ReadTask
    from ray.data.block import BlockMetadata

    schema = pa.schema([("gtid", pa.binary()), ("entry", pa.binary()),
                        ("chunks", pa.list_(pa.binary()))])

    class OplogRange(Datasource):
        def estimate_inmemory_data_size(self):
            return None

        def get_read_tasks(self, parallelism, per_task_row_limit=None, data_context=None):
            def task(start, stop):
                def read():
                    rows = ray.get(member.oplog_rows.remote(start, stop))
                    yield pa.table({"gtid": [r[0] for r in rows], "entry": [r[1] for r in rows],
                                    "chunks": [list(r[2]) for r in rows]}, schema=schema)
                return ReadTask(read, BlockMetadata(None, None, None, None, None), schema=schema)
            return [task(a, b) for a, b in ranges]

    return OplogRange()


def _explode_batches(batches):
    """Spark ``mapInPandas``: stored entries -> one row per op."""
    import pandas as pd
    for pdf in batches:
        out = []
        for g, v, chunks in zip(pdf["gtid"], pdf["entry"], pdf["chunks"]):
            e = codec.unpack(bytes(v), "oplog entry")
            if "ops" in e:
                ops = e["ops"]
            else:
                ops = [op for c in chunks for op in codec.unpack(bytes(c), "spilled ops")]
            out.extend(replay.explode_entry(GTID.from_bytes(bytes(g)).seq, ops))
        yield pd.DataFrame(out, columns=["seq", "i", "kind", "ns", "pk", "post", "last_i"])


def _with_segments(cmd_orders):
    def assign(batches):
        for pdf in batches:
            pdf["seg"] = [replay.segment_of(cmd_orders, (s, i))
                          for s, i in zip(pdf["seq"], pdf["i"])]
            yield pdf
    return assign


def last_images_df(spark, entries_df, partitions: int):
    """The Spark half: (sorted result DataFrame, commands, done map, first uses).

    ``entries_df`` has columns gtid, entry, chunks (stored bytes)."""
    ex = entries_df.mapInPandas(_explode_batches, _EXPLODED).persist()
    try:
        cmd_rows = ex.filter("kind = 'c'").select("seq", "i", "last_i", "post") \
            .orderBy("seq", "i").collect()
        cmds = [(r["seq"], r["i"], r["last_i"]) for r in cmd_rows]
        orders = [c[:2] for c in cmds]
        commands = [replay.Command((r["seq"], r["i"]), codec.unpack(bytes(r["post"])))
                    for r in cmd_rows]
        docs = ex.filter("kind != 'c'").mapInPandas(_with_segments(orders),
                                                    _EXPLODED + ", seg int")
        view = f"raymx_replay_{next(_names)}"
        docs.createOrReplaceTempView(view)
        first_use = {(r["seg"], r["ns"]): (r["o"]["seq"], r["o"]["i"]) for r in spark.sql(
            f"SELECT seg, ns, min(named_struct('seq', seq, 'i', i)) AS o FROM {view} "
            "GROUP BY seg, ns").collect()}
        last = spark.sql(
            f"SELECT seg, ns, pk, seq, i, kind, post FROM (SELECT *, row_number() OVER "
            f"(PARTITION BY seg, ns, pk ORDER BY seq DESC, i DESC) AS rn FROM {view}) "
            "WHERE rn = 1")
        out = last.repartitionByRange(max(1, partitions), "seg", "ns", "pk") \
            .sortWithinPartitions("seg", "ns", "pk")
        return out, ex, commands, cmds, first_use
    except BaseException:
        ex.unpersist()
        raise


def spark_replay(spark, rs, member: int, max_entries: int | None = None,
                 entries_per_read: int = 50_000) -> dict:
    """Replay member ``member``'s unapplied entries (up to ``max_entries``) with
    Spark doing the explode and the last-image selection; returns figures."""
    import ray
    h = rs.member(member)
    t0 = time.monotonic()
    plan = ray.get(h.replay_prepare.remote(max_entries, entries_per_read))  # holds the applier
    if plan is None:
        return {"entries": 0, "seconds": time.monotonic() - t0}
    ex = None
    try:
        ds = ray.data.read_datasource(oplog_datasource(h, plan["ranges"]),
                                      override_num_blocks=len(plan["ranges"]))
        out, ex, commands, cmds, first_use = last_images_df(
            spark, ds.to_spark(spark), len(plan["ranges"]))
        first, last = GTID(*plan["first"]), GTID(*plan["last"])
        done = replay.done_through(first.seq, last.seq, cmds)
        ray.get(h.replay_begin.remote([[list(c.order), codec.pack(c.op)] for c in commands],
                                      done, [[s, ns, list(o)] for (s, ns), o in first_use.items()],
                                      list(first)))
        written = 0
        for ref in ray.data.from_spark(out).to_arrow_refs():
            written += ray.get(h.replay_block.remote(ref))
        ray.get(h.replay_end.remote())
    except BaseException:
        try:
            ray.get(h.replay_abort.remote())
        except Exception:
            pass
        raise
    finally:
        if ex is not None:
            ex.unpersist()
    return {"entries": plan["entries"], "documents": written, "first": first, "last": last,
            "seconds": time.monotonic() - t0}
