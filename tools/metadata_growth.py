"""Metadata growth over many updates: the size of ``index/data.mdb`` and of each published copy
after N idle updates (an empty batch each: the cheapest tick, and the one whose metadata would
grow fastest relative to its data if anything were kept per update).

    python -m ebb.tools.metadata_growth --ticks 100000 --at 1000 2000 10000 100000

The archive has its own data directory (so every commit is also published) and keeps 20
chronons of history (``retain``): the update log, the kept versions and the published copies
must all stop growing once full (issue 24).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import pyarrow as pa


def main(argv: list[str] | None = None) -> int:
    from ..storage.archive import Archive
    from ..storage.config import build_config
    from ..storage.published import meta_dir

    p = argparse.ArgumentParser(prog="python -m ebb.tools.metadata_growth", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ticks", type=int, default=100_000)
    p.add_argument("--at", type=int, nargs="+", default=[1000, 2000, 10_000, 100_000], metavar="N",
                   help="print the sizes after these many updates")
    p.add_argument("--dir", help="where to build the archive (default: a temporary directory)")
    a = p.parse_args(argv)
    schema = pa.schema([("key", pa.int64()), ("ts", pa.int64()), ("exp", pa.int64())])
    empty = schema.empty_table()
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        cfg = build_config(layout="doubly", mode="norebuild", interval=1, max_lifetime=4, start=0, retain=20)
        arc = Archive.create(os.path.join(d, "a"), cfg, data_dir=os.path.join(d, "shared"))
        arc.load(pa.Table.from_pylist([{"key": 1, "ts": 0, "exp": 3}], schema=schema), 0)
        mdb, meta = os.path.join(arc.path, "index", "data.mdb"), meta_dir(arc.data_dir)
        t0 = time.perf_counter()
        for T in range(1, a.ticks + 1):
            arc.load(empty, T)
            if T in a.at:
                copies = [os.path.getsize(os.path.join(meta, c, "data.mdb")) for c in sorted(os.listdir(meta))
                          if c.startswith("v")]
                print(f"after {T:>7} updates: data.mdb {os.path.getsize(mdb):>9} B, published copies {copies} B "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)
        arc.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
