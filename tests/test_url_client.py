"""Clients by URL (issue 23, part): any Python process, no Ray."""
import os
import subprocess
import sys

import pytest

import raymx
from raymx import errors

from tests.test_replication import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_process_outside_ray_connects_by_url_and_follows_a_failover(ray_session, tmp_path):
    rs = raymx.ReplicaSet.launch("byurl", members=3, data_dir=str(tmp_path))
    try:
        old = rs.wait_for_primary()
        url = rs.url(with_secret=False)
        assert url.startswith("raymx://") and url.endswith("/byurl") and "@" not in url
        secret = rs._topology()["secret"]
        # another process, which never imports ray: the secret from the environment
        code = ("import sys, raymx; c = raymx.connect_url(sys.argv[1], w='majority');"
                "coll = c['u']['c']; coll.insert_one({'_id': 1, 'by': 'url'});"
                "print(coll.find_one({'_id': 1}), c.read_preference.mode,"
                " 'ray' in sys.modules)")
        p = subprocess.run([sys.executable, "-c", code, url], cwd=ROOT, capture_output=True,
                           text=True, timeout=120,
                           env=dict(os.environ, RAYMX_SECRET=secret))
        assert p.returncode == 0, p.stderr[-2000:]
        assert p.stdout.split() == ["{'_id':", "1,", "'by':", "'url'}", "primary", "False"]
        # the secret from a file; this client follows the election by itself
        f = tmp_path / "secret"
        f.write_text(secret + "\n")
        c = raymx.connect_url(url, secret_file=str(f), w="majority", wtimeout_ms=10_000)
        coll = c["u"]["c"]
        assert coll.find_one({"_id": 1}) == {"_id": 1, "by": "url"}
        rs.kill_member(old)
        r = None
        for i in range(200):
            try:
                r = coll.insert_one({"_id": f"after{i}"})
                break
            except errors.RaymxError as e:
                assert e.info.get("outcome") == "unknown" or e.retryable
        assert r is not None and r.gtid.term > 1
        wait_until(lambda: rs._topology()["primary"] not in (None, old))
        assert coll.count_documents({}) >= 2
        c.close()
    finally:
        rs.shutdown()


def test_bad_urls_and_credentials_are_refused_clearly(ray_session, tmp_path):
    with pytest.raises(errors.ConfigError, match="raymx://"):
        raymx.connect_url("mongodb://h:1/x")
    with pytest.raises(errors.ConfigError, match="not host:port"):
        raymx.connect_url("raymx://:s@h/x")
    with pytest.raises(errors.ConfigError, match="name is missing"):
        raymx.connect_url("raymx://:s@h:1")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYMX_SECRET")}
    p = subprocess.run([sys.executable, "-c", "import raymx; raymx.connect_url('raymx://h:1/x')"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode != 0 and "no credential" in p.stderr
    rs = raymx.ReplicaSet.launch("byurl2", members=1, data_dir=str(tmp_path))
    try:
        url = rs.url(with_secret=False)
        c = raymx.connect_url(url, secret="wrong", timeout_s=5)
        with pytest.raises(errors.ConfigError, match="refused the credential"):
            c["a"]["b"].find_one({})
        name_url = url.replace("/byurl2", "/other")
        c = raymx.connect_url(name_url, secret=rs._topology()["secret"], timeout_s=5)
        with pytest.raises(errors.ConfigError, match="not 'other'"):
            c["a"]["b"].find_one({})
    finally:
        rs.shutdown()
