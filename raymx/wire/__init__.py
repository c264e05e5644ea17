"""The MongoDB wire protocol on every member (issue 26): ``server`` (the
port), ``framing`` (messages), ``auth`` (SCRAM-SHA-256), ``commands`` and
``crud`` (commands translated into the member's own requests), ``aggregate``
(pipelines, pure code), ``errors`` (MongoDB's codes)."""
from __future__ import annotations

from urllib.parse import quote

from raymx.wire.auth import MECHANISM, USER


DRIVERS = ("any", "pymongo")


def mongodb_uri(name: str, topology: dict, with_secret: bool = True,
                tls: dict | None = None, driver: str = "any") -> str:
    """``mongodb://raymx:SECRET@host:port,.../?replicaSet=NAME&...`` from the
    coordinator's topology: every member's wire port but hidden ones.

    ``driver="any"`` (the default): options every driver takes as is,
    pymongo and mongosh (the Node.js driver) alike; as with MongoDB, pymongo
    then refuses to send a ``uuid.UUID`` until told how (its own error says
    so). ``"pymongo"``: also ``uuidRepresentation=standard``, so pymongo
    sends and shows UUIDs as binary subtype 4, as stored; the Node.js driver
    refuses that option as unknown (it always uses subtype 4)."""
    if driver not in DRIVERS:
        raise ValueError(f"driver {driver!r}: one of {', '.join(DRIVERS)}")
    uuid_opt = "&uuidRepresentation=standard" if driver == "pymongo" else ""
    hosts = ",".join(f"{m['wire'][0]}:{m['wire'][1]}" for m in topology["members"]
                     if m.get("wire") and not m.get("hidden"))
    cred = f"{USER}:{quote(topology['secret'], safe='')}@" if with_secret else ""
    return (f"mongodb://{cred}{hosts}/?replicaSet={quote(name, safe='')}"
            f"&authSource=admin&authMechanism={MECHANISM}{uuid_opt}"
            + ("" if not tls else "&tls=true" + (
                f"&tlsCAFile={quote(tls['ca_file'], safe='')}" if tls.get("ca_file") else "")))
