"""The ``raymx`` command: launch, list, inspect and operate replica sets on a Ray cluster.

On token-authenticated Ray clusters (the default for Ray 2.60 local clusters)
run it with ``RAY_AUTH_MODE=token`` so it can attach.
"""
from __future__ import annotations

import contextlib
import json
import sys

import click


def _attach(address: str | None):
    import ray
    if not ray.is_initialized():
        ray.init(address=address or "auto", namespace="raymx", log_to_driver=False,
                 logging_level="ERROR")


@contextlib.contextmanager
def _one_line_errors():
    """A replica set or Ray cluster that cannot be reached: one line and exit 1."""
    import raymx
    try:
        yield
    except raymx.errors.RaymxError as e:
        click.echo(f"raymx: {e}", err=True)
        sys.exit(1)
    except ConnectionError as e:
        click.echo(f"raymx: cannot reach a Ray cluster ({e}); start one or pass --address",
                   err=True)
        sys.exit(1)


def _run_showing_sync(rs, member: int, call, what: str):
    """Run ``call()`` (work that brings ``member`` of ``rs`` up to date: a
    snapshot copy, a catch-up) on a thread while this one shows its progress
    from ``rs.status()``: each phase of a snapshot copy (rows loaded), then
    the catch-up (entries behind the primary). Returns ``call()``'s result or
    raises its error."""
    import threading

    from raymx.progress import Progress
    out: dict = {}

    def run():
        try:
            out["ok"] = call()
        except BaseException as e:  # noqa: B902 (re-raised on the caller's thread)
            out["err"] = e
    t = threading.Thread(target=run, name="raymx-cli-work", daemon=True)
    t.start()
    bar = None  # made when the first phase shows (quick work prints no progress)
    phase, base = "starting", None

    def step(label, total):
        nonlocal bar
        if bar is None:
            bar = Progress(label, total, unit="rows")
        else:
            bar.step(label, total)
    try:
        while t.is_alive():
            t.join(0.5)
            if not t.is_alive():
                break
            try:
                m = next((x for x in rs.status().get("members", []) if x.get("id") == member),
                         None)
            except Exception:  # the set is reconfiguring: ask again
                continue
            if m is None:
                continue
            p = m.get("initial_sync")
            if p:
                if p.get("phase") != phase:
                    phase = p.get("phase")
                    step(f"{what}: {phase}", p.get("rows"))
                bar.done = p.get("rows_done") or 0
                bar.update(0)
            elif m.get("lag") is not None and phase in ("starting", "copy", "verify",
                                                         "catch-up", "catching up"):
                if phase != "catching up":
                    phase, base = "catching up", max(int(m["lag"]), 1)
                    step(f"{what}: catching up (entries)", base)
                bar.done = max(0, base - int(m["lag"]))
                bar.update(0)
        if bar is not None and "ok" in out and phase == "catching up":
            bar.done = bar.total or 0
    finally:
        if bar is not None:
            bar.close()
    if "err" in out:
        raise out["err"]
    return out.get("ok")


@click.group()
def main():
    """Operate raymx replica sets running on a Ray cluster."""


@main.command()
@click.argument("name", default="rs0")
@click.option("--address", default=None, help="Ray address (default: RAY_ADDRESS or auto)")
@click.option("--json", "as_json", is_flag=True, help="print the raw status as JSON")
@click.option("--watch", "every", type=float, default=None, metavar="SECONDS",
              help="print it again every SECONDS until interrupted")
def status(name, address, as_json, every):
    """Role, state, term and positions of every member of NAME."""
    import time

    import raymx
    from raymx.replset import format_status
    with _one_line_errors():
        _attach(address)
        rs = raymx.connect(name)
        while True:
            st = rs.status()
            click.echo(json.dumps(st, indent=2, default=str) if as_json else format_status(st))
            if not every:
                return
            time.sleep(every)
            click.echo("")


@main.command()
@click.argument("name")
@click.option("--address", default=None)
@click.confirmation_option(prompt="Stop every member of this replica set? (data stays on disk)")
def shutdown(name, address):
    """Stop every member of NAME; its data stays on disk."""
    import raymx
    with _one_line_errors():
        _attach(address)
        raymx.connect(name).shutdown()
    click.echo(f"replica set {name} stopped")


def format_plan(plan: dict) -> str:
    g = lambda x: "-" if x is None else f"{x[0]}:{x[1]}"  # noqa: E731
    lines = [f"revert to {g(plan['target'])}: undo {plan['entries']} entries "
             f"({g(plan['oldest'])} .. {g(plan['newest'])}), {plan['ops']} ops"]
    for ns, per in sorted(plan["namespaces"].items()):
        lines.append(f"  {ns}: " + ", ".join(f"{n} {k}" for k, n in sorted(per.items())))
    return "\n".join(lines)


@main.command()
@click.argument("name")
@click.argument("gtid")
@click.option("--address", default=None, help="Ray address (default: RAY_ADDRESS or auto)")
@click.option("--dry-run", is_flag=True, help="only list what would be undone")
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
def revert(name, gtid, address, dry_run, yes):
    """Return every collection and index of NAME to its state right after GTID
    (term:seq), by appending compensating entries on the primary."""
    import raymx
    try:
        _attach(address)
        rs = raymx.connect(name)
        plan = rs.revert_to(gtid, dry_run=True)
        click.echo(format_plan(plan))
        if dry_run or not plan["entries"]:
            return
        if not yes:
            click.confirm(f"Append one compensating entry undoing these {plan['entries']} "
                          "entries on every member?", abort=True)
        out = rs.revert_to(gtid)
    except (raymx.errors.RaymxError, ValueError) as e:
        click.echo(f"raymx: {e}", err=True)
        sys.exit(1)
    click.echo(f"reverted {name} to {gtid}: {out['entries']} entries undone by entry {out['gtid']}")


@main.command()
@click.argument("name")
@click.argument("member", type=int)
@click.option("--address", default=None, help="Ray address (default: RAY_ADDRESS or auto)")
@click.option("--source", type=int, default=None,
              help="member to copy from (default: the most advanced secondary)")
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
def resync(name, member, address, source, yes):
    """Rebuild MEMBER of NAME from a snapshot of another member (a member whose
    status says resync: its sync source trimmed past it, or it could not roll
    back). Its old folder is moved aside, not deleted."""
    import raymx
    try:
        _attach(address)
        rs = raymx.connect(name)
        if not yes:
            click.confirm(f"Move member {member}'s files aside and copy it again from a "
                          "snapshot?", abort=True)
        out = _run_showing_sync(rs, member, lambda: rs.resync_member(
            member, source=source, progress=False), f"member {member} of {name}")
    except raymx.errors.RaymxError as e:
        click.echo(f"raymx: {e}", err=True)
        sys.exit(1)
    g = out["gtid"]
    click.echo(f"member {member} of {name} resynced from member {out['source']}: "
               f"{out['rows']:,} rows at {g.term}:{g.seq}, caught up; old files in "
               f"{out['moved_aside']}")


ADDRESS = click.option("--address", default=None,
                       help="Ray address (default: RAY_ADDRESS or auto)")


@main.command()
@click.argument("name")
@click.option("--members", default=3, show_default=True, help="number of members")
@click.option("--data-dir", default=None, help="folder of the members' data (node-local)")
@click.option("--placement", type=click.Choice(["spread", "pack"]), default="spread",
              show_default=True, help="spread: one member per node while there are nodes")
@click.option("--tls-cert", default=None, help="PEM certificate chain: client ports require TLS")
@click.option("--tls-key", default=None, help="PEM private key of --tls-cert")
@click.option("--tls-ca", default=None, help="PEM CA that signed it (for clients)")
@ADDRESS
def launch(name, members, data_dir, placement, tls_cert, tls_key, tls_ca, address):
    """Start replica set NAME (or restart it over its data) and print its URL."""
    import raymx
    tls = None if not (tls_cert or tls_key or tls_ca) else {
        "cert_file": tls_cert, "key_file": tls_key, "ca_file": tls_ca}
    with _one_line_errors():
        _attach(address)
        rs = raymx.ReplicaSet.launch(name, members=members, data_dir=data_dir,
                                     placement=placement, tls=tls)
        click.echo(f"replica set {name}: {members} member(s), primary {rs.wait_for_primary()}")
        click.echo(f"connect from outside Ray: raymx.connect_url({rs.url(with_secret=False)!r})"
                   " with RAYMX_SECRET set (raymx url --secret prints it)")


@main.command(name="ls")
@ADDRESS
def ls(address):
    """The replica sets running on the Ray cluster."""
    import ray
    with _one_line_errors():
        _attach(address)
        names = sorted(a["name"][:-len("/coordinator")] for a in
                       ray.util.list_named_actors(all_namespaces=True)
                       if a.get("namespace") == "raymx" and a["name"].endswith("/coordinator"))
    click.echo("\n".join(names) if names else "no replica set is running")


@main.command()
@click.argument("name")
@click.option("--secret", "with_secret", is_flag=True, help="include the credential")
@click.option("--mongodb", is_flag=True,
              help="the mongodb:// string for pymongo, mongosh and other MongoDB drivers")
@click.option("--pymongo", is_flag=True,
              help="the mongodb:// string with uuidRepresentation=standard (pymongo "
                   "sends UUIDs as stored; mongosh refuses the option)")
@ADDRESS
def url(name, with_secret, mongodb, pymongo, address):
    """NAME's connection string for raymx.connect_url (--mongodb, --pymongo: for
    MongoDB drivers)."""
    import raymx
    with _one_line_errors():
        _attach(address)
        rs = raymx.connect(name)
        if mongodb or pymongo:
            click.echo(rs.mongodb_uri(with_secret=with_secret,
                                      driver="pymongo" if pymongo else "any"))
        else:
            click.echo(rs.url(with_secret=with_secret))


@main.command()
@click.argument("name")
@click.argument("location", required=False)
@click.option("--lag-s", type=float, default=1.0, show_default=True,
              help="most seconds a majority-committed entry waits before it is archived")
@click.option("--off", is_flag=True, help="stop archiving (trimming no longer waits for it)")
@ADDRESS
def archive(name, location, lag_s, off, address):
    """Show, set or stop NAME's oplog archive: Parquet segments of every op
    (LOCATION: a folder every member reaches, or a pyarrow.fs URI)."""
    import raymx
    with _one_line_errors():
        _attach(address)
        rs = raymx.connect(name)
        if off or location:
            rs.set_archive(None if off else location, lag_s=lag_s)
        loc = rs.archive_location()
        if loc is None:
            click.echo(f"{name}: no oplog archive")
            return
        st = rs.status()
        ar = next((m["oplog"].get("archive") for m in st["members"]
                   if m.get("role") == "primary" and m.get("oplog")), None) or {}
        g = lambda x: "-" if x is None else f"{x[0]}:{x[1]}"  # noqa: E731
        click.echo(f"{name}: oplog archive {loc['uri']} (lag {loc['lag_s']}s): "
                   f"{g(ar.get('oldest'))} .. {g(ar.get('through'))} in "
                   f"{ar.get('segments', 0)} segments"
                   + (f"; cannot be written: {ar['error']}" if ar.get("error") else ""))


@main.command(name="step-down")
@click.argument("name")
@ADDRESS
def step_down(name, address):
    """Hand NAME's primary role over to the most advanced secondary."""
    import raymx
    with _one_line_errors():
        _attach(address)
        out = raymx.connect(name).step_down()
    click.echo(f"member {out['new']} is primary in term {out['term']} "
               f"(was member {out['old']}; {out['took_ms']} ms)")


@main.command(name="add-member")
@click.argument("name")
@click.option("--initial-sync", type=click.Choice(["auto", "oplog", "snapshot"]),
              default="auto", show_default=True,
              help="auto: the whole oplog if every member still holds it, else a snapshot")
@click.option("--votes", default=1, show_default=True)
@click.option("--priority", default=1.0, show_default=True)
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="wait until the new member has caught up with the primary")
@ADDRESS
def add_member(name, initial_sync, votes, priority, wait, address):
    """Add a member to NAME (on the node with the fewest members); shows the
    snapshot copy's and the catch-up's progress while it waits."""
    import raymx
    from raymx.members import next_member_id
    with _one_line_errors():
        _attach(address)
        rs = raymx.connect(name)
        new = next_member_id(rs.config())  # as add_member numbers it

        def add():
            return rs.add_member(priority=priority, votes=votes, initial_sync=initial_sync,
                                 progress=False, wait=wait)
        mid = _run_showing_sync(rs, new, add, f"member {new} of {name}") if wait else add()
    click.echo(f"member {mid} added to {name}" + ("" if wait else " (still catching up)"))


@main.command(name="remove-member")
@click.argument("name")
@click.argument("member", type=int)
@click.option("--timeout", "timeout_s", default=60.0, show_default=True,
              help="seconds to wait for lagging members before refusing")
@ADDRESS
def remove_member(name, member, timeout_s, address):
    """Remove secondary MEMBER from NAME (its files stay on disk)."""
    import raymx
    with _one_line_errors():
        _attach(address)
        raymx.connect(name).remove_member(member, timeout_s=timeout_s)
    click.echo(f"member {member} removed from {name}")


@main.command()
@click.argument("name")
@click.argument("member", type=int)
@click.argument("dest")
@ADDRESS
def backup(name, member, dest, address):
    """A consistent hot copy of MEMBER's files into DEST (on its node)."""
    import threading

    import raymx
    from raymx.progress import Progress
    with _one_line_errors():
        _attach(address)
        rs = raymx.connect(name)
        out: dict = {}

        def run():
            try:
                out["ok"] = rs.backup(member, dest)
            except BaseException as e:  # noqa: B902 (re-raised below)
                out["err"] = e
        t = threading.Thread(target=run, name="raymx-cli-backup", daemon=True)
        t.start()
        # the copy runs on the member's node: seconds elapsed is what shows here
        with Progress(f"backup of member {member} of {name} (s)", None, unit="s") as bar:
            while t.is_alive():
                t.join(1.0)
                if t.is_alive():
                    bar.update(1)
        if "err" in out:
            raise out["err"]
    click.echo(f"member {member} of {name} copied to {dest} at {out['ok']}")


@main.command()
@click.argument("name")
@click.option("--after", default=None, help="a resume token or GTID (default: now)")
@click.option("--ns", "namespaces", multiple=True, help="only these db or db.coll names")
@click.option("--limit", default=0, help="stop after this many events (0: never)")
@ADDRESS
def watch(name, after, namespaces, limit, address):
    """Tail NAME's change events, one JSON line each."""
    import raymx
    with _one_line_errors():
        _attach(address)
        stream = raymx.connect(name).client().watch(after=after,
                                                    namespaces=list(namespaces) or None)
        n = 0
        for ev in stream:
            ev["gtid"] = str(ev["gtid"])
            click.echo(json.dumps(ev, default=str))
            n += 1
            if limit and n >= limit:
                break


@main.command()
@click.argument("name")
@click.option("--after", default=None, help="GTID to start after (default: the first)")
@click.option("--limit", default=20, show_default=True)
@ADDRESS
def oplog(name, after, limit, address):
    """NAME's oplog entries: GTID, commit time and ops."""
    import raymx
    with _one_line_errors():
        _attach(address)
        for e in raymx.connect(name).oplog(after=after, limit=limit):
            ops = ", ".join(f"{op['op']} {op.get('ns', '')}".strip() for op in e.ops)
            click.echo(f"{e.gtid}  {e.ts}  {ops}")


def gather_logs(name: str, member: int | None = None, timeout_s: float = 10.0) -> dict:
    """Every member process's kept warnings and errors (shard, producer,
    applier; the coordinator's too unless ``member`` is given) and the
    members' rollbacks: {"rollbacks", "records", "unreachable"}."""
    import ray

    import raymx
    from raymx.actors.process import NAMESPACE, actor_name
    st = raymx.connect(name).status()
    ids = [m["id"] for m in st["members"]]
    if member is not None:
        if member not in ids:
            raise raymx.errors.ConfigError(
                f"replica set {name!r} has no member {member} (members: "
                f"{', '.join(map(str, ids))})")
        ids = [member]
    targets = [(m, role, actor_name(name, m, role)) for m in ids
               for role in ("", "producer", "applier")]
    if member is None:
        targets.append(("coordinator", "coordinator", f"{name}/coordinator"))
    refs, out = {}, {"rollbacks": [], "records": [], "unreachable": []}
    for m, role, actor in targets:
        try:
            refs[(m, role or "shard")] = ray.get_actor(actor, namespace=NAMESPACE).logs.remote()
        except ValueError:  # no such actor (a member removed, or down for good)
            out["unreachable"].append((m, role or "shard", "not running"))
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    ready = set(ready)
    for (m, role), ref in refs.items():
        if ref not in ready:
            out["unreachable"].append((m, role, f"no answer in {timeout_s:g}s"))
            continue
        try:
            got = ray.get(ref)
        except Exception as e:  # the process died meanwhile, or an older member
            out["unreachable"].append((m, role, type(e).__name__))
            continue
        out["records"] += got.get("records", [])
        out["rollbacks"] += [dict(r, member=m) for r in got.get("rollbacks", [])]
    out["rollbacks"].sort(key=lambda r: r["ts"])
    out["records"].sort(key=lambda r: r["ts"])
    return out


def format_logs(name: str, got: dict, limit: int = 50) -> str:
    from raymx.actors.logbook import fmt_time
    lines = []
    if got["rollbacks"]:
        lines.append(f"rollbacks of {name} (oldest first):")
        lines += [f"  {fmt_time(r['ts'])}  member {r['member']}: {r['ops']} op(s) undone, "
                  f"saved in {r['file']}" for r in got["rollbacks"]]
    else:
        lines.append(f"no rollbacks in {name}")
    recs = got["records"][-limit:] if limit else got["records"]
    if recs:
        more = len(got["records"]) - len(recs)
        lines.append("warnings and errors (newest last" + (f"; {more} older not shown"
                                                            if more else "") + "):")
        for r in recs:
            who = "coordinator" if r["member"] == "coordinator" else \
                f"member {r['member']} {r['role']}"
            lines.append(f"  {fmt_time(r['ts'])}  {who}  {r['level']}  {r['msg']}")
    else:
        lines.append("no warnings or errors since the members' processes started")
    lines += [f"  ({'coordinator' if m == 'coordinator' else f'member {m} {role}'}: "
              f"unreachable, {why})" for m, role, why in got["unreachable"]]
    return "\n".join(lines)


@main.command()
@click.argument("name")
@click.argument("member", type=int, required=False)
@click.option("--limit", default=50, show_default=True,
              help="at most this many warnings and errors (the newest; 0: all)")
@click.option("--json", "as_json", is_flag=True, help="print them as JSON")
@ADDRESS
def logs(name, member, limit, as_json, address):
    """NAME's rollbacks, then the warnings and errors its members' processes
    logged (each keeps its last 200; a restarted process starts empty), newest
    last. With MEMBER: that member's only."""
    with _one_line_errors():
        _attach(address)
        got = gather_logs(name, member)
    if as_json:
        click.echo(json.dumps(got, indent=2, default=str))
    else:
        click.echo(format_logs(name, got, limit))


if __name__ == "__main__":
    main()
