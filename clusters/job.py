"""A Ray job that starts (or reattaches to) a replica set and uses it.

Submit it to a running cluster::

    ray job submit --address http://HEAD:8265 --working-dir clusters \\
        --runtime-env-json '{"pip": ["raymx"]}' -- python job.py

(On token-authenticated clusters, the Ray 2.60 default, set RAY_AUTH_MODE=token.)
"""
import raymx
from raymx.replset import format_status


def main() -> None:
    try:
        rs = raymx.connect("rs0")
    except raymx.errors.ConfigError:  # not running yet: one member per node
        rs = raymx.ReplicaSet.launch("rs0", members=3, data_dir="/var/lib/raymx/rs0")
    orders = rs.client(w="majority")["shop"]["orders"]
    orders.insert_one({"sku": "s1", "qty": 1})
    print("orders:", orders.count_documents({}))
    print("clients outside Ray connect with raymx.connect_url(",
          repr(rs.url(with_secret=False)), ") and RAYMX_SECRET set")
    print(format_status(rs.status()))


if __name__ == "__main__":
    main()
