"""Prometheus metrics through ray.util.metrics (issue 23, part): a scrape of the
node's metrics endpoint finds each member's figures and the set's lag."""
import json
import os
import re
import time
import urllib.request

import raymx

from tests.test_replication import wait_until


def scrape(ray) -> str:
    n = next(x for x in ray.nodes() if x["Alive"])
    url = f"http://{n['NodeManagerAddress']}:{n['MetricsExportPort']}/metrics"
    return urllib.request.urlopen(url, timeout=5).read().decode()


def series(text: str, name: str, rs: str) -> dict[str, float]:
    """member -> value of metric ``name`` for replica set ``rs``."""
    out = {}
    for line in text.splitlines():
        if line.startswith(f"ray_{name}{{") and f'set="{rs}"' in line:
            out[re.search(r'member="(\d+)"', line).group(1)] = float(line.rsplit(" ", 1)[1])
    return out


def histogram_counts(text: str, name: str, rs: str, label: str | None = None) -> dict:
    """(member[, label value]) -> the ``_count`` of histogram ``name`` for ``rs``."""
    out = {}
    for line in text.splitlines():
        if line.startswith(f"ray_{name}_count{{") and f'set="{rs}"' in line:
            key = re.search(r'member="(\d+)"', line).group(1)
            if label:
                key = (key, re.search(label + r'="([^"]+)"', line).group(1))
            out[key] = float(line.rsplit(" ", 1)[1])
    return out


def test_members_and_the_set_export_prometheus_metrics(ray_session, tmp_path):
    rs = raymx.ReplicaSet.launch("metrics", members=3, data_dir=str(tmp_path),
                                 placement="pack")
    try:
        prim = rs.wait_for_primary()
        coll = rs.client()["m"]["c"]
        g = coll.insert_many([{"_id": i} for i in range(100)], w="majority").gtid
        for i in range(20):
            coll.insert_one({"_id": f"x{i}"}, w="majority")
        for i in range(5):  # one write of each other write concern class at least
            coll.insert_one({"_id": f"j{i}"}, w=1, j=True)
            coll.insert_one({"_id": f"w{i}"}, w=1)
        seen = {}

        def exported():
            text = scrape(ray_session)
            seen["commit"] = histogram_counts(text, "raymx_commit_latency_ms", "metrics", "wc")
            seen["replication"] = histogram_counts(text, "raymx_replication_latency_ms",
                                                   "metrics")
            for name in ("raymx_primary", "raymx_term", "raymx_last_seq", "raymx_applied_seq",
                         "raymx_lag_entries", "raymx_up", "raymx_commits_total",
                         "raymx_oplog_bytes"):
                seen[name] = series(text, name, "metrics")
            return all(len(seen[n]) == 3 for n in ("raymx_primary", "raymx_term", "raymx_up",
                                                   "raymx_lag_entries")) \
                and seen["raymx_commits_total"].get(str(prim), 0) >= 21 \
                and all(v >= g.seq + 20 for v in seen["raymx_applied_seq"].values()) \
                and seen["commit"].get((str(prim), "majority"), 0) >= 21 \
                and seen["commit"].get((str(prim), "j"), 0) >= 5 \
                and seen["commit"].get((str(prim), "w1"), 0) >= 5 \
                and all(seen["replication"].get(str(i), 0) >= g.seq + 20
                        for i in range(3) if i != prim)
        wait_until(exported, timeout_s=30, every_s=1)
        assert seen["raymx_primary"] == {str(i): float(i == prim) for i in range(3)}
        assert set(seen["raymx_term"].values()) == {1.0}
        assert all(v == 1.0 for v in seen["raymx_up"].values())
        assert all(v >= 0 for v in seen["raymx_lag_entries"].values())
        # the histograms: commit latency per write concern class on the primary
        # only (3 classes, no other label values), replication latency on the
        # secondaries only, with buckets and sums Prometheus can take quantiles of
        assert {m for m, _ in seen["commit"]} == {str(prim)}
        assert {c for _, c in seen["commit"]} == {"w1", "j", "majority"}
        assert str(prim) not in seen["replication"]
        text = scrape(ray_session)
        assert re.search(r'ray_raymx_commit_latency_ms_bucket\{[^}]*le="1\.0"', text)
        assert re.search(r'ray_raymx_replication_latency_ms_bucket\{[^}]*le="\+Inf"', text)
        # every series the shipped Grafana dashboard plots is served
        board = json.load(open(os.path.join(os.path.dirname(__file__), "..", "clusters",
                                             "grafana-dashboard.json")))
        plotted = {n for p in board["panels"] for t in p["targets"]
                   for n in re.findall(r"ray_raymx_\w+", t["expr"])}
        assert {"ray_raymx_commit_latency_ms_bucket",
                "ray_raymx_replication_latency_ms_bucket"} <= plotted
        served = {x.split("{", 1)[0] for x in text.splitlines() if 'set="metrics"' in x}
        assert plotted <= served, plotted - served
        sums = [float(x.rsplit(" ", 1)[1]) for x in text.splitlines()
                if x.startswith("ray_raymx_commit_latency_ms_sum{") and 'set="metrics"' in x]
        assert sums and all(0 < s < 60_000 * 200 for s in sums)
    finally:
        rs.shutdown()
