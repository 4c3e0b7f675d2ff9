"""The benchmark workloads of thesis section 4.4 and the records they feed every store.

A workload is a stream of expiring records: uniform search keys, uniform integer lifetimes in
[1, S] with S = p * Delta (p = 36 as in the thesis), one record per chronon on average. It
starts with a bulk load at tau = 0 (the records generated during the p slots before tau that are
still valid at tau) and continues with one batch per periodic update at T_j = j * Delta. Each
record has the columns ``key``, ``ts``, ``exp``, ``seq`` (a unique id: peers key on
(key, exp, seq)) and a random ``payload`` padding it to ``record_bytes``.

Generation is deterministic (a numpy generator seeded by the workload seed and the slot) and
fully vectorised, so every store in every process sees byte-identical batches without storing
them. Records that would already be expired when loaded are not generated (SPEC 2.3 would drop
them; leaving them out keeps every store's contents identical).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

FIXED_COLUMNS_BYTES = 32  # key, ts, exp, seq: four int64
CHUNK_BYTES = 1 << 30  # payload bytes per Arrow chunk (binary offsets are 32-bit)
INT_COLUMNS = ("key", "ts", "exp", "seq")


def schema(payload_columns: int = 1) -> pa.Schema:
    """key, ts, exp, seq (int64) and the payload: one binary column ``payload``, or
    ``payload0..payloadK-1`` splitting it (see ``Workload.payload_columns``)."""
    names = ["payload"] if payload_columns == 1 else [f"payload{i}" for i in range(payload_columns)]
    return pa.schema([pa.field(c, pa.int64(), nullable=False) for c in INT_COLUMNS]
                     + [pa.field(n, pa.binary(), nullable=False) for n in names])


SCHEMA = schema(1)


@dataclass(frozen=True)
class Workload:
    """Parameters of one benchmark workload (all sizes in records unless named bytes)."""

    name: str
    record_bytes: int  # logical size of one record: 32 bytes of integers + payload
    keys: int  # distinct search keys, uniform
    per_slot: int  # records generated per Delta (= Delta: one record per chronon)
    updates: int  # periodic updates after the bulk load
    p: int = 36  # S / Delta
    fluctuation: float = 1.0  # max/min ratio of the per-slot data rate (thesis 4.4.4 uses 4)
    # > 0: the rate is periodic with this period (in update slots) instead of random: one burst
    # slot, ``fluctuation`` times as fast as the others, in every period (see ``rate_factors``)
    period: int = 0
    seed: int = 20061
    # The payload is split over this many binary columns, so that no binary column of a 5 GB bulk
    # load holds more than 2 GiB: Arrow's binary type has 32-bit offsets, and ebb's update sorts a
    # batch with ``Table.take`` (storage/update_plan.py), which may build a column as one array.
    payload_columns: int = 1
    description: str = ""

    @property
    def delta(self) -> int:
        return self.per_slot

    @property
    def max_lifetime(self) -> int:
        return self.p * self.delta

    @property
    def payload_bytes(self) -> int:
        return self.record_bytes - FIXED_COLUMNS_BYTES

    @property
    def expected_live_bytes(self) -> int:
        """Live data in steady state: rate * mean lifetime * record size (~ per_slot * p / 2)."""
        return int(self.per_slot * (self.p + 1) / 2 * self.record_bytes)

    def time_of(self, j: int) -> int:
        return j * self.delta

    def with_updates(self, updates: int) -> "Workload":
        return replace(self, updates=updates)

    def scaled(self, factor: float) -> "Workload":
        """The same workload with ``factor`` times the records per update and the keys (so a probe
        still returns as many records), for a quick check of a benchmark; at least 10 records per
        update and 100 keys."""
        if factor == 1.0:
            return self
        return replace(self, per_slot=max(10, int(round(self.per_slot * factor))),
                       keys=max(100, int(round(self.keys * factor))))

    # -- data ------------------------------------------------------------------------------
    def rate_factors(self) -> np.ndarray:
        """Per-slot data-rate multipliers for slots 1-p .. updates (index slot + p - 1).
        Constant 1 unless the workload fluctuates. A periodic workload's bursts are the slots j
        with (j - 1) mod period = 0, ``fluctuation`` times the rate of the other slots, scaled
        to mean 1 over every whole period: these are the slots round-robin partitioning sends to
        row 0 of a doubly partitioned index with G = period (docs/spec.md section 3). Otherwise
        the factors are log-uniform in [1/sqrt(f), sqrt(f)] (so the fastest interval is at most f
        times the slowest), renormalised to mean 1 over the bulk-load slots and, separately, over
        the update slots, so that both the initial archive and the data the updates bring match
        the steady workload's volume (thesis 4.4.4)."""
        n = self.p + self.updates
        if self.fluctuation <= 1.0:
            return np.ones(n)
        if self.period > 0:
            j = np.arange(1 - self.p, self.updates + 1)
            f = np.where((j - 1) % self.period == 0, self.fluctuation, 1.0)
            return f * self.period / (self.fluctuation + self.period - 1)
        rng = np.random.default_rng([self.seed, 0xF1])
        half = np.log(self.fluctuation) / 2
        f = np.exp(rng.uniform(-half, half, n))
        f[: self.p] /= f[: self.p].mean()
        f[self.p:] /= f[self.p:].mean()
        return f

    def bursts(self, slots: np.ndarray) -> np.ndarray:
        """Which of ``slots`` (each in 1-p .. updates) have a data rate above the mean."""
        return self.rate_factors()[np.asarray(slots) + self.p - 1] > 1.0

    def slot_count(self, j: int) -> int:
        """Records generated during slot j (ts in (T_{j-1}, T_j])."""
        return int(round(self.per_slot * self.rate_factors()[j + self.p - 1]))

    def _slot_records(self, j: int, seq0: int) -> tuple[dict[str, np.ndarray], int]:
        rng = np.random.default_rng([self.seed, j + 1_000_000])
        m = self.slot_count(j)
        lo = self.time_of(j - 1) + 1
        ts = rng.integers(lo, self.time_of(j) + 1, m, dtype=np.int64)
        exp = ts + rng.integers(1, self.max_lifetime + 1, m, dtype=np.int64)
        key = rng.integers(0, self.keys, m, dtype=np.int64)
        seq = np.arange(seq0, seq0 + m, dtype=np.int64)
        return {"key": key, "ts": ts, "exp": exp, "seq": seq, "_rng_state": rng}, m

    def _table(self, cols: dict[str, np.ndarray], rng: np.random.Generator) -> pa.Table:
        """The records as a table. Payload columns are built in chunks of at most CHUNK_BYTES so
        their 32-bit offsets never overflow."""
        n = int(cols["key"].size)
        k = self.payload_columns
        widths = [self.payload_bytes // k + (1 if i < self.payload_bytes % k else 0) for i in range(k)]
        payloads = []
        for pb in widths:
            per_chunk = max(1, CHUNK_BYTES // pb)
            chunks = []
            for a in range(0, max(n, 1), per_chunk):
                m = min(per_chunk, n - a)
                data = pa.py_buffer(rng.bytes(m * pb))
                offsets = pa.py_buffer((np.arange(m + 1, dtype=np.int64) * pb).astype(np.int32).tobytes())
                chunks.append(pa.Array.from_buffers(pa.binary(), m, [None, offsets, data]))
            payloads.append(pa.chunked_array(chunks, type=pa.binary()))
        ints = [pa.chunked_array([cols[c]]) for c in INT_COLUMNS]
        return pa.Table.from_arrays(ints + payloads, schema=schema(k))

    def _seq_base(self, j: int) -> int:
        """First seq number of slot j: cumulative counts, so ids are unique across slots."""
        counts = np.round(self.per_slot * self.rate_factors()).astype(np.int64)
        return int(counts[: j + self.p - 1].sum())

    def bulk(self) -> pa.Table:
        """Initial load at tau = 0: records of slots 1-p .. 0 still valid at 0."""
        parts_cols: list[dict[str, np.ndarray]] = []
        rng_last = None
        for j in range(1 - self.p, 1):
            cols, _ = self._slot_records(j, self._seq_base(j))
            rng_last = cols.pop("_rng_state")
            keep = cols["exp"] > 0
            parts_cols.append({k: v[keep] for k, v in cols.items()})
        merged = {k: np.concatenate([c[k] for c in parts_cols]) for k in ("key", "ts", "exp", "seq")}
        return self._table(merged, rng_last)

    def batch(self, j: int) -> pa.Table:
        """Records handed to the update of slot j >= 1 (those not already expired at T_j)."""
        cols, _ = self._slot_records(j, self._seq_base(j))
        rng = cols.pop("_rng_state")
        keep = cols["exp"] > self.time_of(j)
        return self._table({k: v[keep] for k, v in cols.items()}, rng)

    def probe_key(self, j: int) -> int:
        """The random key probed after update j (the same for every store)."""
        return int(np.random.default_rng([self.seed, j, 0x9B]).integers(0, self.keys))

    def random_keys(self, n: int, stream: int = 0, unique: bool = False) -> np.ndarray:
        """``n`` keys drawn uniformly from the key space [0, keys) as int64, deterministically: the
        generator is seeded by the workload's seed and ``stream`` alone, so every store, in every
        process, gets the same keys, and another ``stream`` gives an independent draw. With
        ``unique``, no key repeats (``n`` at most ``keys``), in random order."""
        rng = np.random.default_rng([self.seed, 0x1A7E, stream])
        if not unique:
            return rng.integers(0, self.keys, n, dtype=np.int64)
        if n > self.keys:
            raise ValueError(f"{n} unique keys asked of a workload with {self.keys} keys")
        return rng.choice(self.keys, size=n, replace=False).astype(np.int64)

    def generated(self) -> dict[str, np.ndarray]:
        """key, ts, exp and seq of every record generated in slots 1-p .. updates, without the
        payload (including records expired before their load: callers select by time)."""
        parts = [self._slot_records(j, self._seq_base(j))[0] for j in range(1 - self.p, self.updates + 1)]
        return {k: np.concatenate([c[k] for c in parts]) for k in INT_COLUMNS}

    def oracle(self) -> dict[int, dict[str, int]]:
        """Per update slot j >= 1, what a correct store returns as of T_j: the number of records
        and sum of ``seq`` of the scan and of the probe of ``probe_key(j)``. Computed from the
        generated keys and times alone (no payload), by brute force over every record."""
        g = self.generated()
        key, ts, exp, seq = (g[k] for k in INT_COLUMNS)
        out: dict[int, dict[str, int]] = {}
        for j in range(1, self.updates + 1):
            t = self.time_of(j)
            live = (ts <= t) & (exp > t)
            probe = live & (key == self.probe_key(j))
            out[j] = {"scan_rows": int(live.sum()), "scan_seq": int(seq[live].sum()),
                      "probe_rows": int(probe.sum()), "probe_seq": int(seq[probe].sum())}
        return out

    def batches(self) -> Iterator[tuple[int, int, pa.Table]]:
        """(slot, time, records): the bulk load at slot 0, then each periodic update."""
        yield 0, 0, self.bulk()
        for j in range(1, self.updates + 1):
            yield j, self.time_of(j), self.batch(j)


STRING_KEY_PREFIX = "sensor-"


def key_digits(keys: int) -> int:
    """Digits of a string key (``string_keys``) in a key space of ``keys`` keys: at least 7."""
    return max(7, len(str(max(keys - 1, 0))))


def string_keys(keys, digits: int = 7) -> pa.Array:
    """Integer keys as strings ``sensor-0000042``, zero-padded to ``digits`` digits so that string
    order is numeric order, converted by Arrow's kernels (no Python per key). ``keys``: a numpy
    array or an Arrow (chunked) array of int64."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    elif not isinstance(keys, pa.Array):
        keys = pa.array(np.asarray(keys, dtype=np.int64))
    digits_ = pc.utf8_lpad(pc.cast(keys, pa.string()), digits, "0")
    return pc.binary_join_element_wise(STRING_KEY_PREFIX, digits_, "")


def with_string_keys(table: pa.Table, digits: int = 7) -> pa.Table:
    """``table`` with its int64 ``key`` column replaced by ``string_keys`` (the other columns as
    they are): the same records keyed by strings."""
    i = table.schema.get_field_index("key")
    return table.set_column(i, pa.field("key", pa.string(), nullable=False), string_keys(table.column("key"), digits))


def _per_slot(live_bytes: float, record_bytes: int, p: int = 36) -> int:
    return int(round(live_bytes * 2 / (p + 1) / record_bytes))


MB = 1_000_000
WORKLOADS: dict[str, Workload] = {
    "thesis-small": Workload(
        "thesis-small", record_bytes=1000, keys=100, per_slot=_per_slot(500 * MB, 1000), updates=36,
        description="thesis 4.4.2-4.4.3: 1000-byte records, 100 keys, about 500 MB live, 36 updates"),
    "thesis-large": Workload(
        "thesis-large", record_bytes=1000, keys=100, per_slot=_per_slot(5000 * MB, 1000), updates=36, payload_columns=3,
        description="thesis 4.4.5: as thesis-small at about 5 GB live"),
    "fluctuating": Workload(
        "fluctuating", record_bytes=1000, keys=100, per_slot=_per_slot(500 * MB, 1000), updates=36,
        fluctuation=4.0,
        description="thesis 4.4.4: as thesis-small, data rate varying randomly by up to x4 per interval"),
    # thesis-large's archive with thesis-small's batch: the same rate and Delta as thesis-small
    # (27,027 records of 1000 bytes per update), lifetimes up to S = 370 Delta instead of 36 Delta,
    # so 10x the live data (about 5 GB, as thesis-large). thesis-large itself gets to 5 GB with
    # ten times thesis-small's batch; this one isolates what the archive's size alone costs, and
    # is the comparison issue 8's memory target asks for.
    "thesis-large-smallbatch": Workload(
        "thesis-large-smallbatch", record_bytes=1000, keys=100, per_slot=_per_slot(500 * MB, 1000), updates=36,
        p=370, payload_columns=3,
        description="thesis-small's per-update batch (27,027 records) with lifetimes up to 370 Delta: about 5 GB live, "
        "10x thesis-small's archive at the same batch size"),
    # thesis section 4.3.3's worst case for round-robin: a rate alternating between bursts and quiet
    # slots with the period G of the index, so every burst lands in the same row. Thesis-small's
    # size and lifetimes; its configurations are the G = 4 doubly layouts (tools/configs.py).
    "periodic": Workload(
        "periodic", record_bytes=1000, keys=100, per_slot=_per_slot(500 * MB, 1000), updates=36,
        fluctuation=4.0, period=4,
        description="as thesis-small, with a data rate periodic over 4 updates: one burst slot at 4x the rate of "
        "the 3 quiet ones, the same volume per period, so round-robin sends every burst to the same row of a "
        "4 x E index (thesis 4.3.3)"),
    "many-keys": Workload(
        "many-keys", record_bytes=200, keys=1_000_000, per_slot=_per_slot(500 * MB, 200), updates=36,
        description="1,000,000 uniform keys, 200-byte records, about 500 MB live"),
    # tools/library_bench.py: many-keys' records at 180 MB live (Delta = 48,649 records per update,
    # about 900,000 live), a bulk load then 8 updates; every store is built once and then probed
    # from a fresh process (warm and cold latency, a batch of keys, full scans)
    "library": Workload(
        "library", record_bytes=200, keys=1_000_000, per_slot=_per_slot(180 * MB, 200), updates=8,
        description="library-level comparison (tools/library_bench.py): 1,000,000 uniform keys, 200-byte records, "
        "about 180 MB live (900,000 records), a bulk load then 8 updates"),
    "quick": Workload(
        "quick", record_bytes=200, keys=50, per_slot=400, updates=4,
        description="CI smoke test: 200-byte records, 50 keys, about 1.5 MB live, 4 updates"),
}
