"""The ``raymx`` command: status and shutdown of replica sets on a Ray cluster.

On token-authenticated Ray clusters (the default for Ray 2.60 local clusters)
run it with ``RAY_AUTH_MODE=token`` so it can attach.
"""
from __future__ import annotations

import json
import sys

import click


def _attach(address: str | None):
    import ray
    if not ray.is_initialized():
        ray.init(address=address or "auto", namespace="raymx", log_to_driver=False,
                 logging_level="ERROR")


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
    try:
        _attach(address)
        st = raymx.connect(name).status()
    except raymx.errors.RaymxError as e:
        click.echo(f"raymx: {e}", err=True)
        sys.exit(1)
    except ConnectionError as e:
        click.echo(f"raymx: cannot reach a Ray cluster ({e}); start one or pass --address",
                   err=True)
        sys.exit(1)
    click.echo(json.dumps(st, indent=2, default=str) if as_json else format_status(st))


@main.command()
@click.argument("name")
@click.option("--address", default=None)
@click.confirmation_option(prompt="Stop every member of this replica set? (data stays on disk)")
def shutdown(name, address):
    """Stop every member of NAME; its data stays on disk."""
    import raymx
    _attach(address)
    raymx.connect(name).shutdown()
    click.echo(f"replica set {name} stopped")


if __name__ == "__main__":
    main()
