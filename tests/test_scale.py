"""A million distinct keys with small records: probes stay correct (checked against a numpy
brute-force oracle), in both maintenance modes, and the directory has one entry per block."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from ebb.query.reader import ArchiveReader
from ebb.storage.archive import Archive
from ebb.storage.verify import verify

from support import config

N = 1_000_000


@pytest.mark.parametrize("mode", ["rebuild", "norebuild"])
def test_million_keys(tmp_path, mode):
    rng = np.random.default_rng(42)
    delta, s = 10, 100
    arc = Archive.create(str(tmp_path / "big"), config(tau=0, delta=delta, max_lifetime=s, mode=mode))
    keys = rng.permutation(N).astype(np.int64) * 3  # distinct, with gaps so absent keys exist
    ts = rng.integers(-s + 1, 1, N)
    exp = ts + rng.integers(1, s + 1, N)
    exp = np.maximum(exp, 1)  # all valid at the bulk load: a million live keys
    v = rng.integers(0, 1 << 40, N)
    rec = arc.load(pa.table({"key": keys, "ts": ts, "exp": exp, "v": v}), 0)
    assert rec["inserted"] == N
    st = arc.stats()
    assert st["records"] == N
    blocks = sum(s_["blocks"] for s_ in st["subindices"])
    assert blocks * (512 << 10) >= st["bytes"] and blocks < N // 1000  # blocks of ~512 KiB, not one per key

    m = 50_000
    k2 = rng.choice(keys, m)
    ts2 = rng.integers(1, delta + 1, m)
    exp2 = ts2 + rng.integers(1, s + 1, m)
    v2 = rng.integers(0, 1 << 40, m)
    arc.load(pa.table({"key": k2, "ts": ts2, "exp": exp2, "v": v2}), delta)

    all_k = np.concatenate([keys, k2])
    all_ts = np.concatenate([ts, ts2])
    all_exp = np.concatenate([exp, exp2])
    all_v = np.concatenate([v, v2])
    live = all_exp > delta  # the oracle: what survived the update at T = delta

    def oracle(mask):
        return sorted(zip(all_k[mask].tolist(), all_ts[mask].tolist(), all_exp[mask].tolist(), all_v[mask].tolist()))

    def got(t):
        return sorted(zip(*(t.column(c).to_pylist() for c in ("key", "ts", "exp", "v"))))

    with ArchiveReader(arc) as r:
        for k in np.concatenate([rng.choice(keys, 150), rng.choice(k2, 100), rng.choice(keys, 50) + 1]).tolist():
            assert got(r.probe(k)) == oracle(live & (all_k == k)), k
        lo, hi = sorted(rng.choice(keys, 2).tolist())
        hi = min(hi, lo + 30_000)
        assert got(r.probe_range(lo, hi)) == oracle(live & (all_k >= lo) & (all_k <= hi))
        t = 40
        assert got(r.probe_range(lo, hi, as_of=t)) == oracle(live & (all_exp > t) & (all_k >= lo) & (all_k <= hi))
        assert sum(b.num_rows for b in r.scan()) == int(live.sum())
    assert verify(arc)[0] == []
    arc.close()
