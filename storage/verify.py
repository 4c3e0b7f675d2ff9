"""``ebb verify``: checks every invariant of one committed state, read-only.

Checks, for every sub-index: directory entries well formed; bucket CRCs; every record's key is
its directory key, buckets sorted by exp with the recorded exp range and count; no record
expired as of the last update or from the future; every record in the sub-index that SPEC
section 3 assigns it; sizes equal to the manifest's; Rebuild files exactly the concatenation
of their buckets; NoRebuild slots each used once or free, never both.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import directory, keys as keycodec
from .files import DATA_DIR, norebuild_file, parse_data_file, rebuild_file
from .manifest import read_free, read_garbage
from .ranges import gather
from .records import crc32_many
from .schema import INS_SLOT

CHUNK_BYTES = 64 << 20


def verify(archive) -> tuple[list[str], list[str]]:
    """Returns (problems, notes). Problems mean the archive is damaged; notes are harmless
    leftovers (e.g. files of an interrupted update, removed by the next update)."""
    problems: list[str] = []
    notes: list[str] = []
    with archive.snapshot() as snap:
        cfg, state = snap.config, snap.state
        layout, tm = cfg.layout_obj, cfg.time
        if len(state.subindices) != layout.n:
            return [f"manifest lists {len(state.subindices)} sub-indices, layout needs {layout.n}"], notes
        if state.update_seq and snap.schema is None:
            problems.append("updates were committed but no schema is stored")
        last_time = snap.time
        cap = state.bucket_capacity
        referenced = set()
        for i, s in enumerate(state.subindices):
            name = f"I{i + 1}"
            ent = directory.load_all(snap.txn, archive.dir_dbs[i])
            d = ent.descs
            if cfg.mode == "rebuild" and s.generation:
                referenced.add(rebuild_file(i, s.generation))
            if cfg.mode == "norebuild" and s.slots:
                referenced.add(norebuild_file(i))
                path = os.path.join(archive.path, DATA_DIR, norebuild_file(i))
                if cap and os.path.exists(path) and os.path.getsize(path) > s.slots * cap:
                    notes.append(f"{norebuild_file(i)}: longer than its {s.slots} committed slots (an interrupted "
                                 "update); truncated by the next update")
            if d.size != s.buckets or int(d["count"].sum()) != s.records or int(d["nbytes"].sum()) != s.bytes:
                problems.append(
                    f"{name}: manifest says {s.records} records / {s.bytes} bytes / {s.buckets} buckets, "
                    f"directory holds {int(d['count'].sum())} / {int(d['nbytes'].sum())} / {d.size}")
            if not d.size:
                continue
            if (d["count"] == 0).any() or (d["nbytes"] == 0).any():
                problems.append(f"{name}: {int(((d['count'] == 0) | (d['nbytes'] == 0)).sum())} empty buckets in the directory")
            if (d["min_exp"] > d["max_exp"]).any():
                problems.append(f"{name}: buckets with min_exp > max_exp")
            if s.min_exp != int(d["min_exp"].min()) or s.max_exp != int(d["max_exp"].max()):
                problems.append(f"{name}: manifest exp range [{s.min_exp}, {s.max_exp}] differs from the buckets'")
            try:
                f = snap.file(i)
            except FileNotFoundError:
                problems.append(f"{name}: its bucket file is missing")
                continue
            size = f.array.size
            ends = d["loc"].astype(np.int64) + d["nbytes"].astype(np.int64)
            if (ends > size).any():
                problems.append(f"{name}: {int((ends > size).sum())} buckets extend past the end of the file ({size} bytes)")
                continue
            if cfg.mode == "rebuild":
                if (np.bincount(ent.bucket_key, minlength=len(ent.keys)) != 1).any():
                    problems.append(f"{name}: Rebuild must have exactly one bucket per key")
                order = np.argsort(d["loc"])
                loc, nb = d["loc"][order].astype(np.int64), d["nbytes"][order].astype(np.int64)
                if loc[0] != 0 or (loc[1:] != (loc + nb)[:-1]).any() or int((loc + nb)[-1]) != size:
                    problems.append(f"{name}: buckets are not a gap-free concatenation covering the file")
            else:
                problems += _check_slots(name, snap, i, d, cap, s.slots, size)
            problems += _check_records(name, snap, i, ent, last_time, layout, tm, cfg)
        data_dir = os.path.join(archive.path, DATA_DIR)
        pending = {g[0] for g in read_garbage(snap.txn, archive.meta_db)}
        for fname in sorted(os.listdir(data_dir)):
            if fname in referenced:
                continue
            if fname in pending:
                notes.append(f"{fname}: replaced, deleted once no reader needs it")
            elif parse_data_file(fname) is not None:
                notes.append(f"{fname}: left by an interrupted update; removed by the next update")
            else:
                notes.append(f"{fname}: not an ebb file")
    return problems, notes


def _check_slots(name, snap, i, d, cap, hwm, size) -> list[str]:
    out = []
    if not cap:
        return [f"{name}: NoRebuild buckets exist but no bucket capacity is recorded"]
    if (d["loc"] % cap).any():
        out.append(f"{name}: buckets not aligned to the {cap}-byte slots")
    nslots = -(-d["nbytes"].astype(np.int64) // cap)
    first = d["loc"].astype(np.int64) // cap
    used = np.repeat(first - (np.cumsum(nslots) - nslots), nslots) + np.arange(int(nslots.sum()))
    free = read_free(snap.txn, snap._archive.meta_db, i)["slot"].astype(np.int64)
    if np.unique(used).size != used.size:
        out.append(f"{name}: a slot is used by two buckets")
    if np.unique(free).size != free.size:
        out.append(f"{name}: a slot is on the free list twice")
    if np.intersect1d(used, free).size:
        out.append(f"{name}: {np.intersect1d(used, free).size} slots are both used and free")
    all_slots = np.union1d(used, free)
    if all_slots.size != hwm or (all_slots.size and (all_slots[0] != 0 or all_slots[-1] != hwm - 1)):
        out.append(f"{name}: used and free slots do not cover exactly the {hwm} slots of the file")
    if size < hwm * cap:
        out.append(f"{name}: slot file has {size} bytes, needs {hwm * cap}")
    return out


def _check_records(name, snap, i, ent, last_time, layout, tm, cfg) -> list[str]:
    out = []
    d = ent.descs
    ends = np.cumsum(d["nbytes"].astype(np.int64))
    cuts = np.searchsorted(ends, np.arange(CHUNK_BYTES, int(ends[-1]), CHUNK_BYTES), side="right")
    edges = np.unique(np.concatenate([[0], cuts, [d.size]])).tolist()
    key_type = snap.schema.field(cfg.key_column).type
    bad_crc = 0
    for a, b in zip(edges[:-1], edges[1:]):
        dd = d[a:b]
        raw = gather(snap.file(i).array, dd["loc"], dd["nbytes"])
        starts = np.concatenate([[0], np.cumsum(dd["nbytes"].astype(np.int64))])
        bad_crc += int((crc32_many(raw, starts) != dd["crc"]).sum())
        if bad_crc:
            continue
        rows = snap.codec.decode(raw, starts[:-1], dd["count"])
        counts = dd["count"].astype(np.int64)
        bucket_of_row = np.repeat(np.arange(dd.size), counts)
        dir_keys = keycodec.decode([ent.keys[k] for k in ent.bucket_key[a:b].tolist()], key_type)
        expected = dir_keys.take(pa.array(bucket_of_row))
        first = np.concatenate([[0], np.cumsum(counts)[:-1]])
        if not pc.all(pc.equal(expected, rows.column(cfg.key_column).combine_chunks())).as_py():
            out.append(f"{name}: records stored under another key's directory entry")
        exp = rows.column(cfg.exp_column).to_numpy()
        ts = rows.column(cfg.ts_column).to_numpy()
        ins = rows.column(INS_SLOT).to_numpy().astype(np.int64)
        if exp.size > 1 and ((np.diff(exp) < 0) & (bucket_of_row[1:] == bucket_of_row[:-1])).any():
            out.append(f"{name}: a bucket is not sorted by exp")
        if (exp[first] != dd["min_exp"]).any() or (exp[first + counts - 1] != dd["max_exp"]).any():
            out.append(f"{name}: a bucket's recorded exp range is wrong")
        if (exp <= last_time).any():
            out.append(f"{name}: {int((exp <= last_time).sum())} records expired at or before the last update ({last_time}) are still stored")
        if (ts > last_time).any():
            out.append(f"{name}: {int((ts > last_time).sum())} records start after the last update")
        if (exp <= ts).any():
            out.append(f"{name}: records with exp <= ts")
        if not cfg.accept_overlong and (exp - ts > cfg.max_lifetime).any():
            out.append(f"{name}: records with a lifetime over S")
        where = layout.subindex_of(ins, tm.slots(exp))
        if (where != i).any():
            out.append(f"{name}: {int((where != i).sum())} records belong to another sub-index by SPEC section 3")
        if snap.state.last_slot is not None and (ins > snap.state.last_slot).any():
            out.append(f"{name}: records with an insertion slot after the last update")
    if bad_crc:
        out.append(f"{name}: {bad_crc} buckets fail their CRC-32 check")
    return out
