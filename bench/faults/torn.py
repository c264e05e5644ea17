"""Power loss with torn write-back, under raymx's storage (issue 24 part 1).

``powerloss.py`` drops *every* unsynced write at once (LazyFS's
clear-cache): the disk then holds exactly what the last fsync covered, which
LMDB survives in any sync mode. A real machine can also have written back
*some* unsynced pages before the power went: the kernel writes dirty pages
back in any order, at any time, each with its latest content. This harness
models that on a LazyFS mount: it stops the writer (SIGSTOP), takes the
pages of ``data.mdb`` and of the write-ahead log (``wal.*``) whose content
through the mount (LazyFS's cache) differs from the file underneath (what
fsync put on the disk), clears LazyFS's cache, writes a chosen subset of
those pages into the files underneath (the ones "written back"), kills the
writer and mounts again. The subsets of ``data.mdb``: only LMDB's two meta
pages, every page but them, a random half, a random tenth (one strategy per
trial, in turn); of the log, a random half of its unsynced pages (its torn
tail) in every trial.

A child process writes through ``raymx.storage`` as a member does
(``open_member``: ``Engine`` over ``LMDBStore``; 1-8 commits, then one
``Engine.sync()``, then the group is acknowledged, as ``GroupCommit`` does
for ``j=True``). The folder is then checked with ``checks.check_folder``:
it opens, ``verify_oplog`` passes, indexes equal the rebuilt ones, every
acknowledged document is there.

The store is opened as raymx opens it: LMDB without syncs under the
write-ahead log (``raymx/storage/wal.py``; before it, the ``--mode nosync``
of issue 24 forced LMDB's ``sync=False`` with syncs only by raymx, and
corrupted 25 of 40 trials, ARCHITECTURE.md "Power loss"). Needs what
``powerloss.py`` needs (root, FUSE, a LazyFS binary).
"""
from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

import click

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Ledger, check_folder_isolated  # noqa: E402
from lazyfs import LazyFS, missing_prerequisites, unmount_under  # noqa: E402

NS = "pl.docs"


def make_doc(i: int) -> dict:
    rnd = random.Random(i)
    pad = "x" * (rnd.choice((0, 50, 300, 1500)) if rnd.random() < 0.9 else rnd.randint(4000, 12000))
    return {"_id": i, "u": f"u{i}", "tags": [i % 7, f"t{i % 3}"], "pad": pad}


def child(path: str, seed: int, map_mib: int = 0) -> None:
    """Write until killed; print "acked N" once a sync covers everything up to N."""
    from raymx.actors.process import open_member
    from raymx.storage.limits import DEFAULT, Limits
    e = open_member(path, Limits(map_bytes=map_mib << 20) if map_mib else DEFAULT)
    e.sync()
    with e.begin() as tx:
        tx.create_index(NS, "u", unique=True)
        tx.create_index(NS, "tags")
    e.sync()
    rnd = random.Random(seed)
    i = e.count(NS)
    out = sys.stdout
    while True:
        for _ in range(rnd.randint(1, 8)):  # a group: commits, then one sync
            i += 1
            with e.begin() as tx:
                tx.insert(NS, [make_doc(i)])
                if i % 5 == 0:  # updates and deletes free pages that later commits reuse
                    tx.update(NS, {"_id": i - 3}, {"$set": {"pad": "y" * rnd.randint(0, 3000)}})
                if i % 11 == 0:
                    tx.delete(NS, {"_id": i - 7})
        e.sync()
        out.write(f"acked {i}\n")
        out.flush()


PAGE = 4096
STRATEGIES = ("meta-only", "data-only", "random-half", "random-tenth")


def dirty_pages(mounted: str, underlying: str) -> dict[int, bytes]:
    """Pages whose content through the mount (LazyFS's cache: the unsynced
    writes) differs from the file underneath (what fsync put on the disk)."""
    out = {}
    if not os.path.exists(underlying):
        open(underlying, "wb").close()
    with open(mounted, "rb") as a, open(underlying, "rb") as b:
        n = 0
        while True:
            pa, pb = a.read(PAGE), b.read(PAGE)
            if not pa:
                return out
            if pa != pb:
                out[n] = pa
            n += 1


def choose(pages: dict, strategy: str, rnd: random.Random) -> dict:
    """The unsynced pages the kernel wrote back before the power went."""
    if strategy == "meta-only":  # LMDB's meta pages are the file's first two
        return {n: p for n, p in pages.items() if n < 2}
    if strategy == "data-only":
        return {n: p for n, p in pages.items() if n >= 2}
    share = 0.5 if strategy == "random-half" else 0.1
    return {n: p for n, p in pages.items() if rnd.random() < share}


def run_trial(binary: str, work: str, k: int, rnd: random.Random, map_mib: int = 0) -> dict:
    lz = LazyFS(binary, work, f"t{k}", os.path.join(work, f"t{k}.mnt"), cache="512mb")
    try:
        return _trial(lz, k, rnd, map_mib)
    finally:
        lz.stop()


def _trial(lz: LazyFS, k: int, rnd: random.Random, map_mib: int) -> dict:
    lz.start()
    path = os.path.join(lz.mount, "m0")
    acked = [0]
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", path,
                          "--seed", str(k), "--map-mib", str(map_mib)],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def read():
        for line in p.stdout:
            if line.startswith("acked "):
                acked[0] = int(line.split()[1])
    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 120
    while not acked[0] and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # the child is writing
    time.sleep(rnd.uniform(0.5, 2.0))  # pages freed and reused meanwhile
    os.kill(p.pid, signal.SIGSTOP)  # the power goes: nothing more is written
    time.sleep(0.05)
    strategy = STRATEGIES[k % len(STRATEGIES)]
    back, n_dirty = {}, 0  # file -> {page: content} written back
    for name in sorted(os.listdir(os.path.join(lz.mount, "m0"))):
        if name != "data.mdb" and not name.startswith("wal."):
            continue
        rel = os.path.join("m0", name)
        dirty = dirty_pages(os.path.join(lz.mount, rel), os.path.join(lz.root, rel))
        n_dirty += len(dirty)
        back[rel] = choose(dirty, strategy, rnd) if name == "data.mdb" else \
            choose(dirty, "random-half", rnd)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    ack = acked[0]
    lz.clear_cache()
    lz.stop()
    for rel, pages in back.items():
        fd = os.open(os.path.join(lz.root, rel), os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            for n, page in pages.items():
                os.pwrite(fd, page, n * PAGE)
            os.fsync(fd)
        finally:
            os.close(fd)
    lz.start()  # over the same files: what reached the disk
    view = Ledger()
    for d in _expected_state(ack).values():
        view.doc(NS, d)
    fc = check_folder_isolated(path, view.view())
    lz.stop()
    if fc.ok:  # the failing ones stay under --work for a look
        shutil.rmtree(lz.root)
    return {"strategy": strategy, "dirty": n_dirty, "acked": ack,
            "written": sum(len(p) for p in back.values()),
            "check": fc}


def _expected_state(upto: int) -> dict:
    """Replays the child's writes (documents it only inserted and never changed
    or deleted; the changed ones are checked by the index and oplog checks)."""
    return {i: make_doc(i) for i in range(1, upto + 1)
            if (i + 3) % 5 and (i + 7) % 11}  # never updated or deleted by a later commit


@click.command(context_settings={"help_option_names": ["-h", "--help"]},
               help=__doc__.split("\n\n")[0] + "\n\n" + " ".join(__doc__.split("\n\n")[1:4]))
@click.option("--lazyfs", "binary", envvar="RAYMX_LAZYFS", metavar="PATH",
              help="The LazyFS binary built from https://github.com/dsrhaslab/lazyfs "
                   "(lazyfs/build/lazyfs); or RAYMX_LAZYFS.")
@click.option("--trials", default=30, show_default=True, help="Torn crashes.")
@click.option("--work", default="/tmp/raymx-torn", show_default=True)
@click.option("--seed", type=int, default=None)
@click.option("--map-mib", default=0, show_default=True,
              help="The child's LMDB map in MiB (0: the default): a small one grows (is "
                   "remapped) again and again while the child writes.")
@click.option("--child", "child_path", hidden=True)
def main(binary, trials, work, seed, map_mib, child_path):
    if child_path:
        child(child_path, seed or 0, map_mib)
        return
    missing = missing_prerequisites(binary)
    if missing:
        print("torn: cannot run; missing:\n  - " + "\n  - ".join(missing))
        sys.exit(2)
    seed = int(time.time()) if seed is None else seed
    if os.path.exists(work):
        unmount_under(work)
        shutil.rmtree(work)
    os.makedirs(work)
    rnd = random.Random(seed)
    print(f"torn write-back harness: seed {seed}, {trials} trials"
          + (f", a {map_mib} MiB map" if map_mib else ""), flush=True)
    found = False
    for m in ["store"]:
        bad = fired = acked = 0
        t0 = time.monotonic()
        for k in range(trials):
            r = run_trial(binary, work, k, rnd, map_mib)
            fc = r["check"]
            fired += r["written"] > 0
            acked += fc.checked
            if not fc.ok:
                bad += 1
            print(f"  {m} trial {k + 1:3d}: {r['strategy']:12s} {r['written']:4d} of "
                  f"{r['dirty']:4d} unsynced pages written back; acked {r['acked']}; "
                  + ("ok" if fc.ok else f"FOUND {(fc.problems + fc.missing)[:3]}"), flush=True)
        found |= bad > 0
        print(f"== {m}: {trials} crashes ({fired} with pages written back), {bad} with corruption or lost "
              f"acknowledged writes, {acked:,} acknowledged writes checked, "
              f"{time.monotonic() - t0:.0f} s", flush=True)
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
