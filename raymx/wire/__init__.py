"""The MongoDB wire protocol on every member (issue 26): ``server`` (the
port), ``framing`` (messages), ``auth`` (SCRAM-SHA-256), ``commands`` and
``crud`` (commands translated into the member's own requests), ``aggregate``
(pipelines, pure code), ``errors`` (MongoDB's codes)."""
from __future__ import annotations

from urllib.parse import quote

from raymx.wire.auth import MECHANISM, USER


def mongodb_uri(name: str, topology: dict, with_secret: bool = True,
                tls: dict | None = None) -> str:
    """``mongodb://raymx:SECRET@host:port,.../?replicaSet=NAME&...`` from the
    coordinator's topology: every member's wire port but hidden ones. UUIDs
    travel as binary subtype 4 (``uuidRepresentation=standard``), as stored."""
    hosts = ",".join(f"{m['wire'][0]}:{m['wire'][1]}" for m in topology["members"]
                     if m.get("wire") and not m.get("hidden"))
    cred = f"{USER}:{quote(topology['secret'], safe='')}@" if with_secret else ""
    return (f"mongodb://{cred}{hosts}/?replicaSet={quote(name, safe='')}"
            f"&authSource=admin&authMechanism={MECHANISM}&uuidRepresentation=standard"
            + ("" if not tls else "&tls=true" + (
                f"&tlsCAFile={quote(tls['ca_file'], safe='')}" if tls.get("ca_file") else "")))
