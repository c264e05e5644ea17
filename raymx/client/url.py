"""Clients by URL, without Ray: ``raymx://[:SECRET@]host:port[,...]/NAME``;
the members are learnt from the members themselves (``op: topology``)."""
from __future__ import annotations

from raymx import errors
from raymx.client.client import Client
from raymx.client.connection import Connection
from raymx.client.options import ReadConcern, ReadPreference, WriteConcern


def parse_url(url: str) -> tuple[list[tuple[str, int]], str, str | None]:
    """``raymx://[:SECRET@]host:port[,host:port...]/NAME[?tls=true&tlsCAFile=PATH]``
    -> (hosts, name, secret)."""
    from urllib.parse import unquote
    if not isinstance(url, str) or not url.startswith("raymx://"):
        raise errors.ConfigError(f"a raymx URL starts with raymx://, not {str(url)[:40]!r}")
    rest = url[len("raymx://"):]
    netloc, _, name = rest.partition("/")
    name = name.split("?", 1)[0]
    cred, _, hosts = netloc.rpartition("@")
    secret = unquote(cred.partition(":")[2]) if cred else None
    seeds = []
    for h in hosts.split(","):
        host, _, port = h.rpartition(":")
        if not host or not port.isdigit():
            raise errors.ConfigError(f"raymx URL: {h!r} is not host:port")
        seeds.append((host.strip("[]"), int(port)))
    if not name:
        raise errors.ConfigError("raymx URL: the replica set's name is missing (…/NAME)")
    return seeds, name, secret


class URLTopology:
    """The topology of a set learned from its members (``op: topology``), for
    clients outside Ray: the seed hosts first, then every member last seen."""

    def __init__(self, seeds: list[tuple[str, int]], name: str, secret: str,
                 timeout_s: float = 5.0, tls=None):
        self.seeds, self.name, self.secret, self.timeout_s = seeds, name, secret, timeout_s
        self.tls = tls
        self.known = list(seeds)

    def __call__(self) -> dict:
        tried = []
        for host, port in list(dict.fromkeys(self.known)):
            try:
                c = Connection(host, port, self.secret, self.timeout_s, tls=self.tls)
            except errors.TLSError:
                raise  # the driver's TLS setting does not fit the set's: say so, not "unreachable"
            except errors.AuthenticationFailed as e:
                raise errors.ConfigError(f"{host}:{port} refused the credential of the URL "
                                         f"for replica set {self.name!r} ({e})") from None
            except (OSError, errors.RaymxError) as e:
                tried.append(f"{host}:{port}: {type(e).__name__}")
                continue
            try:
                if isinstance(c.hello, dict) and c.hello.get("replset") not in (None, self.name):
                    raise errors.ConfigError(f"{host}:{port} is a member of replica set "
                                             f"{c.hello.get('replset')!r}, not {self.name!r}")
                topo = c.request({"op": "topology"}, self.timeout_s)
            except errors.ConfigError:
                raise
            except (OSError, errors.RaymxError) as e:
                tried.append(f"{host}:{port}: {type(e).__name__}")
                continue
            finally:
                c.close()
            self.known = self.seeds + [(m["host"], m["port"]) for m in topo["members"]]
            return dict(topo, secret=self.secret)
        raise errors.PrimaryUnavailable(f"no member of replica set {self.name!r} answered "
                                        f"({'; '.join(tried)})")


def connect_url(url: str, secret: str | None = None, secret_file: str | None = None,
                w: int | str = "majority", j: bool = False, wtimeout_ms: int | None = None,
                timeout_s: float = 30.0, read_preference="primary",
                read_concern="local", tls=None, tls_ca_file: str | None = None) -> Client:
    """A ``Client`` of the replica set at ``url`` (``rs.url()``) from any Python
    process, without Ray: it learns the members from the members themselves
    and follows elections as the Ray-based client does. The credential comes
    from ``secret``, the URL, ``secret_file``, or the environment
    (``RAYMX_SECRET``, or a file named by ``RAYMX_SECRET_FILE``), in that order.
    Staleness-bounded reads (``max_staleness_s``) need ``rs.client()``.

    ``tls``: True (or an ``ssl.SSLContext``) for a set launched with TLS;
    ``tls_ca_file``: the CA that signed the members' certificates (default:
    the system's). The URL may say the same: ``?tls=true&tlsCAFile=PATH``."""
    import os
    seeds, name, url_secret = parse_url(url)
    tls = _tls_of(url, tls, tls_ca_file)
    secret_file = secret_file or os.environ.get("RAYMX_SECRET_FILE")
    if secret is None and url_secret is None and secret_file:
        try:
            with open(secret_file) as f:
                secret = f.read().strip()
        except OSError as e:
            raise errors.ConfigError(f"cannot read the secret file {secret_file}: {e}") from None
    secret = secret or url_secret or os.environ.get("RAYMX_SECRET")
    if not secret:
        raise errors.ConfigError("no credential for the replica set: put it in the URL, "
                                 "pass secret= or secret_file=, or set RAYMX_SECRET or "
                                 "RAYMX_SECRET_FILE")
    rp = read_preference if isinstance(read_preference, ReadPreference) \
        else ReadPreference(read_preference)
    return Client(URLTopology(seeds, name, secret, tls=tls), WriteConcern(w, j, wtimeout_ms),
                  timeout_s, rp, None, ReadConcern.of(read_concern), tls)


def _tls_of(url: str, tls, ca_file: str | None):
    """The client ``SSLContext`` from the arguments and the URL's query, or None."""
    from urllib.parse import parse_qs, urlsplit
    q = {k.lower(): v[-1] for k, v in parse_qs(urlsplit(url).query).items()}
    if tls is None and "tls" in q:
        tls = q["tls"].lower() in ("true", "1", "yes")
    ca_file = ca_file or q.get("tlscafile")
    if tls is None or tls is False:
        if ca_file:
            raise errors.ConfigError("tlsCAFile given without tls=true")
        return None
    import ssl
    if isinstance(tls, ssl.SSLContext):
        return tls
    from raymx.actors.tls import client_context
    return client_context(ca_file)
