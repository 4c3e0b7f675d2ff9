"""The first probe after each commit, with the loader and the reader in separate processes.

    python -m ebb.tools.first_probe --workload many-keys --updates 12 --stores NoRebuild2x2,sqlite,lmdb

A reader in another process than the writer (`ebb serve`, or an analysis, beside `ebb run`)
meets each new version with nothing of it in memory: ebb checks the version's metadata pages
(``page_walk``), parses its state and prepares the runs the commit added; SQLite finds its page
cache stale and reads its pages again. The bench harness (tools/run_config.py) does not measure
that: it runs each store's writer and reader in one process (DuckDB and RocksDB allow no other
process to open a store being written), so there ebb's reader shares the process with the
commit, whose own snapshot has checked the new version's pages.

For each store, this process creates it and bulk-loads the workload, then starts a reader
process (a fresh interpreter), which opens the store once and waits. After each update this
process commits, the reader probes the update's probe key (``Workload.probe_key``), timed in the
reader, then another key (a probe a moment later). Every store must return as many rows for
each key. Prints the medians and writes JSON (``--out``).

An ebb layout named ``LAYOUT+follow`` reads as ``ebb serve`` does: its ``ArchiveReader``
follows new versions (``follow=True``), a background thread preparing each as it commits, and
probes read the version it serves. Until that thread has switched, a probe reads the version
before the commit, so the reader waits, untimed, until it serves the commit, then probes: the
wait, from the loader's return to the switch, is reported as ``switch_lag_s`` (how far such a
reader's answers trail the newest commit, less the moment between the commit becoming visible
and the loader returning).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .configs import parse
from .ebb_store import EbbStore
from .machine import describe, ebb_commit
from .run_config import make_store
from .workloads import WORKLOADS


FOLLOW = "+follow"
SWITCH_WAIT_S = 10.0  # a following reader that has not switched to a commit by then has failed


def store_spec(store: str) -> tuple[str, bool]:
    """(configuration, whether its reader follows new versions) of a ``--stores`` entry."""
    return (store[:-len(FOLLOW)], True) if store.endswith(FOLLOW) else (store, False)


def _reader(spec: str, path: str, workload: str, updates: int, conn) -> None:
    """The reader process: opens the store when told, then answers (key, at, update, committed)
    with the seconds and rows of a probe of that key and of the next key, and, if it follows,
    the seconds from the loader's return (``time.monotonic``) until it served ``update``."""
    config, follow = store_spec(spec)
    w = WORKLOADS[workload].with_updates(updates)
    conn.recv()
    store = make_store(parse(config), path, w, follow)
    store.open()  # ebb: an ArchiveReader of its own, its probes prepared or followed (tools/ebb_store.py)
    conn.send("open")
    while (msg := conn.recv()) is not None:
        key, at, update, committed = msg
        lag = None
        if follow:  # untimed: until the switch, a probe would read the version before the commit
            while (store.reader.followed_update_seq() or -1) < update:
                if time.monotonic() - committed > SWITCH_WAIT_S:
                    raise SystemExit(f"first_probe: {spec}'s follower did not serve update {update} "
                                     f"within {SWITCH_WAIT_S:.0f} s of its commit")
                time.sleep(0.0002)
            lag = time.monotonic() - committed
        got = []
        for k in (key, (key + 1) % w.keys):
            t = time.perf_counter()
            rows = store.probe(k, at).rows
            got.append((time.perf_counter() - t, rows))
        conn.send((got, lag))
    store.close()


def measure(config: str, workload: str, updates: int, root: Path) -> dict:
    """One store: the reader's timings and rows after each of ``updates`` commits."""
    w = WORKLOADS[workload].with_updates(updates)
    path = root / config.replace("/", "_")
    path.mkdir(parents=True)
    store = make_store(parse(store_spec(config)[0]), str(path), w)
    store.create()
    store.load(w.bulk(), w.time_of(0))
    ours, theirs = multiprocessing.get_context("spawn").Pipe()
    reader = multiprocessing.get_context("spawn").Process(target=_reader, args=(config, str(path), workload, updates, theirs))
    reader.start()
    theirs.close()  # the reader's end is the reader's: if it dies, ``recv`` here ends (EOFError)
    first, after, rows, loads, lags = [], [], [], [], []
    try:
        ours.send("open")
        ours.recv()
        for j in range(1, updates + 1):
            batch = w.batch(j)
            t = time.perf_counter()
            store.load(batch, w.time_of(j))
            committed = time.monotonic()
            loads.append(time.perf_counter() - t)
            del batch
            update = store.update_seq() if isinstance(store, EbbStore) else None
            ours.send((w.probe_key(j), w.time_of(j), update, committed))
            ((t1, r1), (t2, r2)), lag = ours.recv()
            first.append(t1)
            after.append(t2)
            rows.append([r1, r2])
            if lag is not None:
                lags.append(lag)
        ours.send(None)
        reader.join(60)
    except (EOFError, BrokenPipeError):
        reader.join(10)
        raise SystemExit(f"first_probe: the reader process of {config} exited ({reader.exitcode}); its error is above")
    finally:
        if reader.is_alive():
            reader.kill()
        store.close()
        shutil.rmtree(path, ignore_errors=True)
    got = {"first_p50_s": float(np.median(first)), "first_s": first, "next_p50_s": float(np.median(after)),
           "next_s": after, "update_p50_s": float(np.median(loads)), "rows": rows}
    if lags:
        got.update(switch_lag_p50_s=float(np.median(lags)), switch_lag_s=lags)
    return got


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ebb.tools.first_probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="many-keys", choices=sorted(WORKLOADS))
    p.add_argument("--updates", type=int, default=12, help="updates after the bulk load (default 12)")
    p.add_argument("--stores", default="NoRebuild2x2,sqlite,lmdb",
                   help="ebb configurations and peers that another process can read while one writes "
                        "(sqlite, lmdb, parquet; not duckdb or rocksdb), comma-separated "
                        "(default NoRebuild2x2,sqlite,lmdb); an ebb configuration with +follow "
                        "(D-ins4+follow) reads through a reader that follows new versions, as ebb serve does")
    p.add_argument("--dir", help="where the stores are built (default: a new directory under /tmp)")
    p.add_argument("--out", help="write the results as JSON to this file")
    args = p.parse_args(argv)
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    for s in stores:
        config, follow = store_spec(s)
        if parse(config).name in ("duckdb", "rocksdb"):
            p.error(f"{s}: this store cannot be read by another process while one writes it here")
        if follow and parse(config).family == "peer":
            p.error(f"{s}: {FOLLOW} is for ebb layouts, whose readers can follow new versions")
    root = Path(tempfile.mkdtemp(prefix="ebb-first-probe-", dir=args.dir or "/tmp"))
    results, machine = {}, describe(str(root), 0)
    try:
        for s in stores:
            print(f"{s}: {args.updates} updates of {args.workload}", file=sys.stderr, flush=True)
            results[s] = measure(s, args.workload, args.updates, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    want = results[stores[0]]["rows"]
    wrong = [s for s in stores if results[s]["rows"] != want]
    if wrong:
        print(f"error: {', '.join(wrong)} returned other rows than {stores[0]}", file=sys.stderr)
        return 1
    base = results["sqlite"] if "sqlite" in results else None
    print(f"{'store':<20} {'first probe after commit':>26} {'next probe':>12} {'update':>10} {'switch lag':>12}")
    for s in stores:
        r = results[s]
        ratio = f" ({r['first_p50_s'] / base['first_p50_s']:.2f}x SQLite)" if base and s != "sqlite" else ""
        lag = f"{r['switch_lag_p50_s'] * 1e3:>9.2f} ms" if "switch_lag_p50_s" in r else f"{'-':>12}"
        print(f"{s:<20} {r['first_p50_s'] * 1e3:>10.3f} ms{ratio:<16} {r['next_p50_s'] * 1e3:>9.3f} ms "
              f"{r['update_p50_s']:>8.3f} s {lag}")
    if args.out:
        Path(args.out).write_text(json.dumps({"workload": args.workload, "updates": args.updates, "commit": ebb_commit(),
                                              "machine": machine, "stores": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
