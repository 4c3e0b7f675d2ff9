"""Changing an archive's layout while it is in use (``ebb migrate``).

**Draining** (the default) uses the fact that every record expires within S. The switch is one
metadata commit: the current layout's runs move, untouched, into a draining layout (see
``drain``), and the configuration names the new layout, whose sub-indices start empty. From the
next update on, records go only to the new layout, and each update drops the draining layout's
runs once all their records have expired, so it is gone within S having cost no byte of I/O.
Reads cover both meanwhile; a record is in exactly one of them, so none is returned twice.

**Copying** (``copy=True``, for comparison) reads every live record of every layout and writes
it into the new one at once, each record placed by its stored insertion slot and its
expiration slot (docs/spec.md section 3), so the new layout holds what it would hold had it
been used from the start. It reads and writes all the live data and holds it in memory.

Both are writers of ``write_sequence``, as an update is: they hold the writer lock, so a
migration falls between two updates of a running ``ebb run``, whose next update reads the new
configuration; and they are all-or-nothing: new files are made durable first, and the LMDB
commit is the switch.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from typing import Callable

import pyarrow as pa

from .block_format import INS_SLOT, older_physical, physical_schema
from .commit import stage_migration
from .config import ArchiveConfig, check_config
from .errors import ConfigError
from .faults import crash_point
from .iostats import delta as io_delta, proc_io
from .maintenance import MaintenanceContext, SubIndexChange, norebuild, rebuild
from .manifest import ArchiveState, DrainingLayout, SubIndexState, read_schema_history, read_state
from .read_plan import Scan, plan
from .schema import widen
from .task_reader import read_blocks
from .update import descriptor_reader
from .update_plan import place
from .write_sequence import Staged, Writer, durable, run

# what a migration may change; everything else (time model, columns, block size) stays
LAYOUT_FIELDS = ("layout", "partitioning", "split", "G", "E", "n_wave", "mode", "seed", "section_slots")


@dataclass
class Migration:
    """The record of one layout change (kept in the archive's migration log)."""

    method: str  # "drain" | "copy"
    from_layout: str
    to_layout: str
    after_update: int  # the switch follows this update (its sequence number)
    after_slot: int | None
    drained_by: int | None  # drain: time by which the old layout's last record has expired
    records_left_draining: int  # drain: records that stay in the old layout until they expire
    records_copied: int  # copy: live records written into the new layout
    bytes_read: int
    bytes_written: int
    blocks_written: int
    os_read_bytes: int = 0
    os_write_bytes: int = 0
    wall_seconds: float = 0.0


def target_config(current: ArchiveConfig, **layout) -> ArchiveConfig:
    """``current`` with the layout settings given in ``layout`` (keys of LAYOUT_FIELDS), checked.
    A setting not given (or None) keeps its current value if the kind of layout stays, else takes
    ``ebb init``'s default. ConfigError if the result is invalid or equals ``current``."""
    unknown = set(layout) - set(LAYOUT_FIELDS)
    if unknown:
        raise ConfigError(f"migrate cannot change {', '.join(sorted(unknown))}")
    kind = layout.get("layout") or current.layout
    mode = layout.get("mode") or current.mode
    same_kind = kind == current.layout
    fields = {f: layout[f] for f in LAYOUT_FIELDS if layout.get(f) is not None}
    for name, flags, other in (("doubly", ("n_wave", "split"), "--n/--split are for wave indices; a doubly "
                                "partitioned index takes --G, --E and --partitioning"),
                               ("wave", ("G", "E", "partitioning"), "--G/--E/--partitioning are for doubly "
                                "partitioned indices; a wave index takes --n and --split")):
        if kind == name and any(f in fields for f in flags):
            raise ConfigError(other)
    base = replace(current, layout=kind, mode=mode)
    if kind == "doubly":
        G = fields.get("G", current.G if same_kind else None)
        E = fields.get("E", current.E if same_kind else None)
        part = fields.get("partitioning", current.partitioning if same_kind else "round-robin")
        seed = fields.get("seed", current.seed if same_kind and part == current.partitioning else 0)
        base = replace(base, G=G if G is not None else 2, E=E if E is not None else 2, partitioning=part,
                       n_wave=1, split="insertion", seed=seed)
    else:
        n = fields.get("n_wave", current.n_wave if same_kind else None)
        split = fields.get("split", current.split if same_kind else "insertion")
        base = replace(base, G=1, E=1, n_wave=n if n is not None else 4, split=split,
                       partitioning="round-robin", seed=0)
    wide = fields.get("section_slots", current.section_slots)
    if "section_slots" not in fields and wide > 1 and not (mode == "norebuild" and (
            base.layout == "wave" and base.split == "insertion" or base.layout == "doubly" and base.E == 1)):
        wide = 1  # kept only where the new layout can have sections wider than a slot
    new = check_config(replace(base, section_slots=wide))
    if all(getattr(new, f) == getattr(current, f) for f in LAYOUT_FIELDS):
        raise ConfigError(f"the archive already has this layout ({current.layout_obj.describe()}, {current.mode_text})")
    return new


def migrate(archive, target: ArchiveConfig, copy: bool = False, wait_s: float = 0.0,
            progress: Callable[[str], None] | None = None) -> dict:
    """Switches ``archive`` to the layout of ``target`` (from ``target_config``), by draining
    or, with ``copy``, by copying the live records. Waits up to ``wait_s`` for a running update.
    Returns the Migration record. All-or-nothing: on any error the archive is unchanged."""
    return run(archive, _Switch(target, copy, progress), wait_s)


class _Switch(Writer):
    """The layout switch, as ``write_sequence.run`` drives it."""

    def __init__(self, target: ArchiveConfig, copy: bool, progress):
        self.target, self.copy, self.progress = target, copy, progress

    def write(self, archive, txn, created: list[str]) -> Staged:
        t0, io0 = time.perf_counter(), proc_io()
        current, target = archive.reads.config(txn), self.target
        if any(getattr(current, f) != getattr(target, f) for f in asdict(current) if f not in LAYOUT_FIELDS):
            raise ConfigError("a migration changes only the layout; the time model, columns and block size stay")
        state = read_state(txn)
        rec = Migration(
            method="copy" if self.copy else "drain", from_layout=_describe(current), to_layout=_describe(target),
            after_update=state.update_seq, after_slot=state.last_slot, drained_by=None, records_left_draining=0,
            records_copied=0, bytes_read=0, bytes_written=0, blocks_written=0)
        if self.copy:
            new_runs, dropped = self._copied(archive, txn, state, created, rec)
        else:
            new_runs, dropped = self._drained(current, state, rec)
        durable(archive.data_dir, created)
        crash_point("migrate.runs_written")
        for k, v in io_delta(io0, proc_io()).items():
            if hasattr(rec, k):
                setattr(rec, k, v)
        rec.wall_seconds = round(time.perf_counter() - t0, 6)
        stage_migration(txn, target, state, new_runs, dropped, asdict(rec))
        crash_point("migrate.before_commit")
        return Staged(asdict(rec), new_runs)

    def _copied(self, archive, txn, state: ArchiveState, created: list[str], rec: Migration) -> tuple[list, list[str]]:
        """Copying: the new layout holds every live record, and every old run is dropped.
        Returns (the new runs, the dropped ones)."""
        subs = [SubIndexState() for _ in range(self.target.n)]
        changes = _copy(archive, txn, state, self.target, created, rec, self.progress)
        for ch in changes:
            subs[ch.i] = SubIndexState(ch.runs)
        dropped = sorted(state.run_names())
        state.subindices, state.draining = subs, []
        return [d for ch in changes for d in ch.new_runs], dropped

    def _drained(self, current: ArchiveConfig, state: ArchiveState, rec: Migration) -> tuple[list, list[str]]:
        """Draining: the current layout's runs move, untouched, into a draining layout, and the
        new layout starts empty. Nothing is written or dropped."""
        if any(s.runs for s in state.subindices):
            state.draining.insert(0, DrainingLayout(asdict(current), state.last_slot, list(state.subindices)))
        rec.records_left_draining = sum(d.records for d in state.draining)
        rec.drained_by = max((r.max_exp for d in state.draining for s in d.subindices for r in s.runs), default=None)
        state.subindices = [SubIndexState() for _ in range(self.target.n)]
        return [], []

    def committed(self, record: dict) -> None:
        crash_point("migrate.after_commit")


def _copy(archive, txn, state: ArchiveState, target: ArchiveConfig, created: list[str], rec: Migration,
          progress) -> list[SubIndexChange]:
    """Writes every record of ``state`` live after its last update into ``target``'s layout."""
    schemas = read_schema_history(txn)
    if schemas is None or state.last_slot is None:
        return []
    cfg = archive.reads.config(txn)
    at = cfg.time.time_of(state.last_slot)
    descriptor = descriptor_reader(archive, txn)
    phys = physical_schema(schemas.schema)
    batches = []
    tasks = plan(state, descriptor, Scan(), at, schemas)
    for n, task in enumerate(tasks, 1):
        if progress:
            progress(f"reading {task.where}, run {task.file} ({n}/{len(tasks)} read tasks)")
        source = archive.open_files.source(task.file, sequential=True)
        stored = phys if task.columns is None else older_physical(phys, task.columns)
        for _, batch in read_blocks(source, task.blocks, stored, f"archive {archive.path}, {task.where}"):
            exp = batch.column(cfg.exp_column).to_numpy()
            batch = batch.filter(pa.array(exp > at)) if (exp <= at).any() else batch
            batches.append(widen(batch, phys))
        rec.bytes_read += task.bytes
    rows = pa.Table.from_batches(batches, phys)
    tm = cfg.time
    exp = rows.column(cfg.exp_column).to_numpy()
    k_exp = tm.slots(exp)
    sub = target.layout_obj.subindex_of(rows.column(INS_SLOT).to_numpy(), k_exp)
    rows, exp_slots, cuts = place(target, rows, exp, target.section_slot(k_exp), sub)
    ctx = MaintenanceContext(target, schemas, archive.data_dir, archive.open_files, descriptor, state.update_seq, created)
    changes = []
    for i in range(target.n):
        a, b = int(cuts[i]), int(cuts[i + 1])
        if a == b:
            continue
        if progress:
            progress(f"writing I{i + 1} of the new layout ({b - a} records)")
        part = rows.slice(a, b - a)
        if target.mode == "rebuild":
            ch = rebuild(ctx, i, SubIndexState(), part, None)
        else:
            ch = norebuild(ctx, i, SubIndexState(), part, exp_slots[a:b], None)
        changes.append(ch)
        rec.records_copied += ch.inserted
        rec.bytes_written += ch.bytes_written
        rec.blocks_written += ch.blocks_written
    return changes


def _describe(cfg: ArchiveConfig) -> str:
    return f"{cfg.layout_obj.describe()}, {cfg.mode_text}"
