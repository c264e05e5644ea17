"""The ``raymx`` command: status, revert, resync and shutdown of replica sets on a Ray cluster.

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


@click.group()
def main():
    """Operate raymx replica sets running on a Ray cluster."""


@main.command()
@click.argument("name", default="rs0")
@click.option("--address", default=None, help="Ray address (default: RAY_ADDRESS or auto)")
@click.option("--json", "as_json", is_flag=True, help="print the raw status as JSON")
def status(name, address, as_json):
    """Role, state, term and positions of every member of NAME."""
    import raymx
    from raymx.replset import format_status
    with _one_line_errors():
        _attach(address)
        st = raymx.connect(name).status()
    click.echo(json.dumps(st, indent=2, default=str) if as_json else format_status(st))


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
        out = rs.resync_member(member, source=source)
    except raymx.errors.RaymxError as e:
        click.echo(f"raymx: {e}", err=True)
        sys.exit(1)
    g = out["gtid"]
    click.echo(f"member {member} of {name} resynced from member {out['source']}: "
               f"{out['rows']:,} rows at {g.term}:{g.seq}, caught up; old files in "
               f"{out['moved_aside']}")


if __name__ == "__main__":
    main()
