"""The README's main job (``./dev demo``)."""
from __future__ import annotations

import sys
import tempfile


def main(argv=None) -> int:
    from raymx.storage.engine import Engine
    from raymx.storage.lmdb_store import LMDBStore
    d = tempfile.mkdtemp(prefix="raymx-demo-")
    e = Engine(LMDBStore(d))
    r = e.insert_many("shop.orders", [{"_id": i, "sku": f"s{i % 3}", "qty": i} for i in range(10)])
    print("inserted 10 orders at GTID", r.gtid)
    with e.begin() as tx:
        tx.create_index("shop.orders", "sku")
        tx.update("shop.orders", {"sku": "s1"}, {"$inc": {"qty": 100}}, multi=True)
    print("s1 orders:", e.find("shop.orders", {"sku": "s1"}))
    for g, ent in e.read_oplog():
        print(f"  {g}  h={ent['h']:016x}  ops={[op['op'] for op in ent['ops']]}")
    print("oplog verified:", e.verify_oplog(), "entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
