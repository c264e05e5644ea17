"""TLS on the client port (issue 24, part 4), with a throwaway CA from
``trustme``: the secret never crosses in clear text (a relay between driver
and member records the bytes), a driver without TLS on a TLS port and one
with TLS on a plain port both get a clear ``TLSError``, an untrusted
certificate is refused, and a replica set launched with TLS serves clients
by URL."""
import socket
import threading

import pytest
import trustme

import raymx
from raymx import errors
from raymx.actors.tls import client_context
from raymx.client import Connection
from raymx.storage.limits import Limits
from tests.port_helpers import SECRET, closed, frame, raw, read_frame, serving

BASE = dict(frame_bytes_max=1 << 20, document_bytes_max=512 << 10, sync_interval_ms=20)


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    """A CA, and the member's certificate and key for 127.0.0.1, as PEM files."""
    d = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    cert.private_key_pem.write_to_path(str(d / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(d / "cert.pem"))
    for pem in cert.cert_chain_pems[1:]:
        pem.write_to_path(str(d / "cert.pem"), append=True)
    return {"cert_file": str(d / "cert.pem"), "key_file": str(d / "key.pem"),
            "ca_file": str(d / "ca.pem")}


class Relay:
    """A TCP relay to ``port`` that records what the driver sends."""

    def __init__(self, port: int):
        self.sent = bytearray()
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self.lsock.getsockname()[1]
        self.target = port
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                a, _ = self.lsock.accept()
            except OSError:
                return
            b = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(a, b, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(b, a, False), daemon=True).start()

    def _pipe(self, src, dst, record):
        try:
            while True:
                d = src.recv(65536)
                if not d:
                    break
                if record:
                    self.sent += d
                dst.sendall(d)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.lsock.close()


def test_the_secret_and_the_data_cross_only_encrypted(tmp_path, ca):
    with serving(tmp_path / "tls", Limits(**BASE), tls=ca) as (p, _):
        relay = Relay(p.port)
        c = Connection("127.0.0.1", relay.port, SECRET, tls=client_context(ca["ca_file"]))
        big = "q" * 300_000  # frames spanning many TLS records, both ways
        c.request({"op": "insert", "ns": "t.c", "docs": [{"_id": i, "v": big} for i in range(2)]})
        futs = [c.submit({"op": "find", "ns": "t.c", "filter": {"_id": i % 2}})
                for i in range(50)]  # pipelined, answers read by the reader thread
        assert all(f.result(10)["docs"][0]["v"] == big for f in futs)
        c.close()
        relay.close()
        assert len(relay.sent) > 600_000
        assert SECRET.encode() not in relay.sent and b"qqqqqqqq" not in relay.sent
    # the control: on a plain port the same relay sees both
    with serving(tmp_path / "plain", Limits(**BASE)) as (p, _):
        relay = Relay(p.port)
        c = Connection("127.0.0.1", relay.port, SECRET)
        c.request({"op": "insert", "ns": "t.c", "docs": [{"_id": 1, "v": "q" * 100}]})
        c.close()
        relay.close()
        assert SECRET.encode() in relay.sent and b"qqqqqqqq" in relay.sent


def test_tls_must_match_on_both_sides(tmp_path, ca):
    with serving(tmp_path / "tls", Limits(**BASE), tls=ca) as (p, _):
        # a driver without TLS: refused before its hello is read
        with pytest.raises(errors.TLSError, match="requires TLS"):
            Connection("127.0.0.1", p.port, SECRET)
        s = raw(p)
        s.sendall(frame({"id": 1, "op": "hello", "secret": SECRET}))
        r = read_frame(s)
        assert r["id"] is None and r["err"]["err"] == "TLSError" and closed(s)
        # a certificate from another CA: refused by the driver, nothing sent
        other = trustme.CA()
        ctx = client_context()
        other.configure_trust(ctx)
        with pytest.raises(errors.TLSError, match="not trusted"):
            Connection("127.0.0.1", p.port, SECRET, tls=ctx)
        # the right CA: served
        c = Connection("127.0.0.1", p.port, SECRET, tls=client_context(ca["ca_file"]))
        assert c.request({"op": "count", "ns": "t.c"})["value"] == 0
        c.close()
    with serving(tmp_path / "plain", Limits(**BASE)) as (p, _):
        with pytest.raises(errors.TLSError, match="may not use TLS"):
            Connection("127.0.0.1", p.port, SECRET, tls=client_context(ca["ca_file"]))
        c = Connection("127.0.0.1", p.port, SECRET)  # the port serves on
        assert c.request({"op": "count", "ns": "t.c"})["value"] == 0
        c.close()


def test_a_replica_set_launched_with_tls_serves_clients_by_url(ray_session, tmp_path, ca):
    with pytest.raises(errors.ConfigError, match="key_file"):
        raymx.ReplicaSet.launch("tlsbad", data_dir=str(tmp_path / "bad"),
                                tls={"cert_file": ca["cert_file"]})
    rs = raymx.ReplicaSet.launch("tlsset", members=2, data_dir=str(tmp_path / "d"),
                                 bind_host="127.0.0.1", placement="pack", tls=ca)
    try:
        url = rs.url()
        assert url.endswith("/tlsset?tls=true&tlsCAFile=" + ca["ca_file"].replace("/", "%2F"))
        c = raymx.connect_url(url, w="majority")  # the CA from the URL
        coll = c["s"]["c"]
        coll.insert_one({"_id": 1})
        assert coll.find_one({"_id": 1}) == {"_id": 1}
        c.close()
        plain = url.split("?")[0]
        with pytest.raises(errors.TLSError, match="requires TLS"):
            raymx.connect_url(plain)["s"]["c"].find_one({})
        with pytest.raises(errors.TLSError, match="not trusted"):
            raymx.connect_url(plain, tls=True)["s"]["c"].find_one({})  # the system's CAs
        rc = rs.client()
        assert rc.tls is not None and rc["s"]["c"].count_documents({}) == 1
        rc.close()
        # the MongoDB wire ports use the same certificate: pymongo by rs.mongodb_uri()
        import pymongo
        from pymongo.errors import ServerSelectionTimeoutError
        uri = rs.mongodb_uri()
        assert "&tls=true&tlsCAFile=" in uri
        with pymongo.MongoClient(uri, serverSelectionTimeoutMS=20_000) as mc:
            assert mc["s"]["c"].find_one({"_id": 1}) == {"_id": 1}
        with pymongo.MongoClient(uri.split("&tls=")[0], serverSelectionTimeoutMS=2_000) as mc:
            with pytest.raises(ServerSelectionTimeoutError):
                mc["s"]["c"].find_one({})
    finally:
        rs.shutdown()


def test_the_wire_port_carries_documents_only_encrypted(tmp_path, ca):
    """pymongo over TLS to the MongoDB wire port, through a recording relay."""
    import pymongo
    from raymx.wire.server import WirePort
    with serving(tmp_path, Limits(sync_interval_ms=20), make_port=lambda svc: WirePort(
            svc, SECRET, "127.0.0.1", {"member": 0, "replset": "rs"}, tls=ca)) as (p, _):
        relay = Relay(p.port)
        uri = (f"mongodb://raymx:{SECRET}@127.0.0.1:{relay.port}/?directConnection=true"
               f"&authMechanism=SCRAM-SHA-256&tls=true&tlsCAFile={ca['ca_file']}"
               "&tlsAllowInvalidHostnames=true")
        with pymongo.MongoClient(uri, serverSelectionTimeoutMS=10_000) as mc:
            mc["s"]["c"].insert_one({"_id": 1, "v": "qqqqqqqq"})
            assert mc["s"]["c"].find_one({"_id": 1})["v"] == "qqqqqqqq"
        relay.close()
        assert relay.sent and b"qqqqqqqq" not in relay.sent
