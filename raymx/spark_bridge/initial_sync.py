"""Snapshot-based member creation and resync (DESIGN 8), driven from the driver.

1. The new member's actors start on an empty folder and join the configuration
   with ``votes=0, priority=0``: while it synchronizes it is never elected and
   never counted in a majority, and ``rs.status()`` shows it *synchronizing*
   with its progress.
2. A running member (a secondary if one is running, else the primary) opens a
   snapshot: one LMDB read transaction, whose applied point is the GTID the new
   member will replicate from; it is planned as key-range partitions of the
   ``docs`` and ``index`` sub-databases.
3. The partitions travel as stored bytes, never through the driver: either
   straight from the source's actor to the target's (``spark=None``), or as a
   Spark job (``spark=`` a session from ``raymx.spark_bridge``): Spark tasks on
   the source's node read the partitions as of the snapshot's GTID from the
   source's LMDB folder themselves, checksum them and spool the runs on that
   node (``copy_tasks``); the target bulk-loads them in key order. (The
   partitions are key ranges already in order: nothing is sorted.)
4. The target compares each partition's checksum (computed by the source while
   reading it) with its own copy, writes the snapshot's oplog entry, and its
   producer starts pulling after that GTID; entries committed during the copy
   are caught up (in parallel replay when there are many, see
   ``raymx.storage.replay``).
5. Once it has applied what the primary had when the load finished, the member
   gets its real votes and priority.
"""
from __future__ import annotations

import logging
import time

from raymx import errors
from raymx.progress import Progress
from raymx.storage.gtid import GTID

log = logging.getLogger("raymx.initial_sync")


def choose_source(status: dict, exclude: int | None = None) -> int:
    """The most advanced running secondary that is not delayed, else the primary."""
    cands = [m for m in status["members"] if m.get("id") != exclude
             and m.get("state") == "running" and m.get("role") == "secondary"
             and not m.get("delay_s") and m.get("applied")]
    if cands:
        return max(cands, key=lambda m: (tuple(m["applied"]), -m["id"]))["id"]
    if status.get("primary") is None:
        raise errors.PrimaryUnavailable("no running member to take a snapshot from")
    return status["primary"]


def open_source(rs, source: int, rows_per_part: int | None = None):
    """A ``SnapshotSource`` actor on member ``source``'s node, holding one snapshot."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from raymx.actors.applier import SnapshotSource
    cfg = rs.config()
    m = next((x for x in cfg["members"] if x["id"] == source), None)
    if m is None:
        raise errors.ConfigError(f"no member {source} to take a snapshot from")
    limits = cfg["limits"]
    return SnapshotSource.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(m["node_id"], soft=False)
    ).remote(m["path"], limits, rows_per_part or limits.snapshot_part_rows)


def copy_snapshot(rs, source: int, target: int, spark=None, rows_per_part: int | None = None,
                  progress: bool = True, src=None) -> dict:
    """Copy a snapshot of member ``source`` into the empty member ``target``
    (``src``: a source already opened by ``open_source``; it is closed here)."""
    import ray
    src = src if src is not None else open_source(rs, source, rows_per_part)
    dst = rs.member(target)
    t0 = time.monotonic()
    phases = {}  # seconds per phase, for the caller's figures
    bar = None
    try:
        info = ray.get(src.info.remote())
        hold_trimming(rs, target, info["gtid"])
        bar = Progress(f"member {target}: copying from {source}", info["rows"], progress)
        ray.get(dst.load_begin.remote(info))
        phases["plan"] = time.monotonic() - t0
        sums = {}
        if spark is None:
            _copy_with_ray(src, dst, info, bar)
        else:
            sums = _copy_with_spark(spark, rs, source, src, dst, info, bar, phases)
        sums.update(ray.get(src.checksums.remote()))
        phases["copy"] = time.monotonic() - t0 - phases["plan"]
    finally:
        try:
            ray.get(src.close.remote(), timeout=30)
        except Exception:
            pass
        ray.kill(src, no_restart=True)
        if bar is not None:
            bar.close()
    t1 = time.monotonic()
    g = ray.get(dst.load_finish.remote(info, sums))
    phases["verify"] = time.monotonic() - t1
    return {"gtid": GTID(*g), "rows": info["rows"], "parts": len(info["parts"]),
            "source": source, "seconds": time.monotonic() - t0, "phases": phases,
            "via": "ray" if spark is None else "spark"}


def hold_trimming(rs, target: int, gtid, ttl_s: float = 3600) -> None:
    """Every running member keeps the snapshot's GTID in its oplog until
    ``target`` has pulled from it (it resumes there), or for ``ttl_s``;
    ``gtid=None`` lifts the hold (the copy failed)."""
    import ray
    refs = []
    for m in rs.config()["members"]:
        if m["id"] != target:
            try:
                refs.append(rs.member(m["id"]).hold_trim.remote(
                    target, None if gtid is None else list(gtid), ttl_s))
            except Exception:
                pass  # not running: it does not trim either
    ray.wait(refs, num_returns=len(refs), timeout=10)


def _copy_with_ray(src, dst, info, bar, window: int = 4) -> None:
    """Partitions go from the source's actor to the target's through the object
    store (never the driver), a few in flight, loaded in key order."""
    import ray
    pending = []
    for p in info["parts"]:
        rows_ref, _sum_ref = src.read.remote(p)
        pending.append(dst.load_rows.remote(p[1], rows_ref, 1, p[0]))
        while len(pending) >= window:
            done, pending = ray.wait(pending, num_returns=1)
            bar.update(ray.get(done[0]))
    for ref in pending:
        bar.update(ray.get(ref))


def _copy_with_spark(spark, rs, source: int, src, dst, info, bar, phases: dict,
                     window: int = 4, poll_s: float = 0.1) -> dict:
    """The copy as a Spark job (``copy_tasks``): Spark tasks on the source's
    node read their partitions as stored at the snapshot's GTID from the
    source's folder, checksum them and spool the runs there. While the job
    runs, the driver loads the spooled runs in partition order as they
    appear (the target bulk-loads sorted runs), reading a partition a task
    could not prove unchanged from ``src``. Returns the checksums the Spark
    tasks computed, by partition."""
    import ray

    from raymx.spark_bridge import copy_tasks
    cfg = rs.config()
    m = next(x for x in cfg["members"] if x["id"] == source)
    m = dict(m, limits=cfg["limits"])
    # the source's process runs on its node: it makes, reads and drops the spool
    spool = ray.get(src.make_spool.remote())
    parts = info["parts"]
    pending: list = []
    from_file: set = set()

    def load(i: int, kind: str) -> None:
        p = parts[i]
        if kind == "run":
            run = src.take_file.remote(copy_tasks.part_path(spool, i))
            from_file.add(i)
        else:  # written to since the snapshot: from the snapshot's own transaction
            run, _ = src.read.remote(p)
        pending.append(dst.load_rows.remote(p[1], run, 1, p[0]))
        while len(pending) >= window:
            done, pending[:] = ray.wait(pending, num_returns=1)
            bar.update(ray.get(done[0]))
    job = None
    try:
        slices = max(1, min(len(parts), 2 * spark.sparkContext.defaultParallelism))
        df = copy_tasks.copy_dataframe(spark, m, info, spool, slices)
        t0 = time.monotonic()
        job = copy_tasks.Job(df.collect, spark.sparkContext, bar.label)
        i = 0
        while job.alive() and i < len(parts):
            ready = ray.get(src.spooled.remote(spool, i))
            for kind in ready:
                load(i, kind)
                i += 1
            if not ready:
                job.wait(poll_s)
        rows = job.result()  # raises what failed the job
        phases["spark_job"] = time.monotonic() - t0
        got = {r["part"]: r for r in rows}
        missing = [j for j in range(len(parts)) if j not in got]
        if missing:
            raise errors.CorruptEntry(f"the Spark copy returned no row for partitions {missing}")
        phases["unproven_parts"] = sum(1 for r in rows if not r["local"])
        for j in range(i, len(parts)):
            load(j, "run" if got[j]["local"] else "unproven")
        for ref in pending:
            bar.update(ray.get(ref))
        sums = {}
        for j in range(len(parts)):
            if got[j]["local"]:
                sums[j] = [got[j]["rows"], got[j]["digest"]]
            elif j in from_file:  # a retried task found it changed: the source's checksum
                ray.get(src.read.remote(parts[j])[1])
        phases["spark_and_load"] = time.monotonic() - t0
        return sums
    finally:
        if job is not None:
            job.cancel()  # the load failed: no task writes into the spool after this
        ray.get(src.drop_spool.remote(spool))


def catch_up_with_spark(spark, rs, member: int, goal: GTID, timeout_s: float,
                        progress: bool = True) -> dict | None:
    """The entries committed during a Spark copy, replayed by a Spark job too.

    The new member's applier was held through the copy (``hold_applier``);
    once its producer has written ``goal`` (the primary's last GTID when the
    load finished) the backlog is replayed by ``spark_replay`` if it holds at
    least ``Limits.replay_entries_min`` entries, else applied entry by entry.
    The applier is released either way, and catches up itself if the Spark
    replay fails (logged; returned as ``{"error": ...}``)."""
    import ray

    from raymx.spark_bridge.spark_replay import spark_replay
    h = rs.member(member)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            st = ray.get(h.status.remote())
            last = GTID(*st["last"]) if st.get("last") else GTID(0, 0)
            if last >= goal or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        applied = GTID(*st["applied"]) if st.get("applied") else GTID(0, 0)
        if last.seq - applied.seq < rs.config()["limits"].replay_entries_min:
            return None
        try:
            return spark_replay(spark, rs, member, progress=progress)
        except Exception as e:  # the applier (released below) catches up instead
            log.warning("member %d: the Spark replay failed (%s: %.300s); its applier "
                        "catches up instead", member, type(e).__name__, e)
            return {"error": f"{type(e).__name__}: {e}"[:300]}
    finally:
        hold_applier(rs, member, False)


def hold_applier(rs, member: int, on: bool) -> None:
    import ray
    ray.get(ray.get_actor(f"{rs.name}/m{member}/applier", namespace="raymx").pause.remote(on))


def wait_caught_up(rs, member: int, goal: GTID, timeout_s: float, progress: bool) -> None:
    """Until ``member`` has applied ``goal`` (the primary's last GTID when the load
    finished): the entries committed during the copy."""
    import ray
    h = rs.member(member)
    st = ray.get(h.status.remote())
    start = GTID(*st["applied"]) if st.get("applied") else GTID(0, 0)
    bar = Progress(f"member {member}: catching up", max(1, goal.seq - start.seq), progress)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            st = ray.get(h.status.remote())
            applied = GTID(*st["applied"]) if st.get("applied") else GTID(0, 0)
            bar.done = max(0, applied.seq - start.seq)
            bar.update(0)
            if applied >= goal:
                bar.done = bar.total
                return
            if time.monotonic() > deadline:
                raise errors.PrimaryUnavailable(
                    f"member {member} did not catch up to {goal} within {timeout_s}s "
                    f"(applied {applied})")
            time.sleep(0.05)
    finally:
        bar.close()
