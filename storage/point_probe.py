"""Point probes of a key (int64 or string), planned and executed in one native call.

A point probe is the latency-critical read: a few rows from one or two blocks of each of a
handful of runs. Through the general keyed path (``read_plan.plan``, then ``task_reader.execute``
for each task) it costs a few hundred Python calls, several times the search itself. So
``probe`` hands the runs of the snapshot to ``_point_probe.probe``
(storage/native/point_probe.c), which chooses the same blocks as ``read_plan.plan``, checks the
page sum of every page before using it as ``page_check`` does, keeps the rows valid at
``as_of``, orders them by (exp, ts) and copies them into one Arrow record batch (an Arrow C
data interface struct in a capsule that owns it). Python prepares each run's arrays once
(``RunArrays``, cached with the run's metadata) and imports the batch against the archive's
schema object. ``probe_many`` does the same for many keys in one call,
reading each block once for all the keys it holds.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np
import pyarrow as pa

# EBB_NATIVE=0 turns the native module off, as if it were not built (the test suite's fallback run)
if os.environ.get("EBB_NATIVE", "1") == "0":
    _point_probe = None
else:
    try:
        from . import _point_probe
    except ImportError:  # not built (installed without a C compiler): point probes take the planned read
        _point_probe = None
from .arrow_np import empty_table
from .disk_format import BLOCK, FILTER_BITS_UNNAMED, FILTER_UNIT_BYTES, INT_KEY, PAGE_SUM, native_constants, visible_columns
from .errors import CorruptionError, DataIOError
from .run_descriptor import RunDescriptor, parse_sealed

# reads a run file's key filters: (run name, start, end) -> its bytes [start, end), which must end
# where the file does (filters placed by the wrong bits a record would pass their sums and hide rows)
ReadFilters = Callable[[str, int, int], pa.Buffer]


def check_native_format(module, facts: dict[str, int]) -> None:
    """ImportError if ``module`` (the native probe) was compiled for other format facts than
    ``facts`` (``disk_format.native_constants``): a build left from another ebb would read
    blocks, pages or filters at the wrong offsets."""
    wrong = module.check_format(facts)
    if wrong:
        raise ImportError("ebb's native point probe was built for another on-disk format (" + "; ".join(wrong)
                          + "): rebuild it (pip install --force-reinstall --no-deps ebb, or pip install -e . in a checkout)")


if _point_probe is not None:
    check_native_format(_point_probe, native_constants())

NATIVE = _point_probe is not None  # False: no ColumnLayout, so Snapshot.probe returns None
NATIVE_STATE = "on" if NATIVE else ("off (EBB_NATIVE=0)" if os.environ.get("EBB_NATIVE") == "0"
                                      else "off (the native module is not built)")

_FIXED, _BOOL, _VARIABLE = 0, 1, 2


@dataclass(frozen=True)
class ColumnLayout:
    """How the native probe reads the stored (physical) schema: each column's kind and width,
    where the key, ts and exp columns are, how many columns it returns (the visible
    columns, ``disk_format.visible_columns``), and whether keys are text (a string key column)."""

    kinds: bytes  # int32 per column: fixed-width, bool or variable-width
    widths: bytes  # int32 bytes per value (fixed-width columns)
    key: int
    ts: int
    exp: int
    returned: int
    text_key: bool

    def accepts(self, key) -> bool:
        """Whether ``key`` is a key the native probe takes for this layout (else the planned read
        answers, or rejects it, in its own terms)."""
        return type(key) is str if self.text_key else type(key) is int and -(1 << 63) <= key < (1 << 63)

    @staticmethod
    def of(physical: pa.Schema, key: str, ts: str, exp: str) -> "ColumnLayout | None":
        """The layout, or None if the native module is missing (``NATIVE``) or the key column is
        neither int64 nor string."""
        key_type = physical.field(key).type
        if not NATIVE or key_type not in (pa.int64(), pa.string()):
            return None
        kinds, widths = [], []
        for f in physical:
            t = f.type
            var = pa.types.is_string(t) or pa.types.is_binary(t)
            kinds.append(_VARIABLE if var else _BOOL if pa.types.is_boolean(t) else _FIXED)
            widths.append(0 if var or pa.types.is_boolean(t) else t.bit_width // 8)
        i = physical.get_field_index
        return ColumnLayout(np.array(kinds, np.int32).tobytes(), np.array(widths, np.int32).tobytes(),
                            i(key), i(ts), i(exp), visible_columns(len(physical)), key_type == pa.string())


@dataclass(frozen=True)
class RunArrays:
    """What the native probe needs of a run's descriptor, as contiguous arrays."""

    first_keys: np.ndarray  # int64 per block; text keys: their UTF-8 bytes, one after another
    last_keys: np.ndarray
    blocks: np.ndarray  # run_descriptor.BLOCK entries
    sections: np.ndarray  # int64: first block of each section, then the number of blocks
    page_start: np.ndarray  # int64: index in ``sums`` of each block's first page, then the total
    sums: np.ndarray | None  # uint32 page sums (None: written without them; blocks are checked whole)
    first_at: np.ndarray | None = None  # text keys: int64 offsets of each block's first key, then the end
    last_at: np.ndarray | None = None
    # the run's key filters, read once into memory (``key_filter``: about 2 bytes a record): a
    # probe then checks a filter of every run without a system call (a map would need the file's
    # size checked first, an fstat a run); and where each block's starts in them, then the end
    filters: np.ndarray | None = None
    filter_at: np.ndarray | None = None
    run_filter_units: int = 0  # the run filter's units, at the end of ``filters`` (0: none)

    @staticmethod
    def of(desc: RunDescriptor, sums: np.ndarray | None, read_filters: ReadFilters | None = None) -> "RunArrays":
        """The arrays of run ``desc`` with its page ``sums``, and its key filters if it has them
        and ``read_filters`` is given."""
        if desc.first_keys and type(desc.first_keys[0]) is str:
            (first, first_at), (last, last_at) = _packed(desc.first_keys), _packed(desc.last_keys)
        else:
            first, last, first_at, last_at = (np.array(desc.first_keys, np.int64), np.array(desc.last_keys, np.int64),
                                              None, None)
        return RunArrays._of_blocks(desc.name, desc.blocks, first, last, first_at, last_at, sums, desc.filter_offset,
                                    desc.filter_bits, desc.run_filter_units, read_filters)

    @staticmethod
    def from_value(value: bytes, name: str, what: str, read_filters: ReadFilters) -> "RunArrays | None":
        """The arrays of run ``name`` straight from its sealed descriptor ``value`` as stored, without
        a ``RunDescriptor``: the keys, blocks and page sums are views of it. A reader preparing
        the runs a commit added does this on the first probe of their version, so it is kept
        short. None for string keys (``of`` then). CorruptionError naming ``what`` if damaged."""
        value = bytes(value)  # the arrays view it: not a buffer that lives only as long as a transaction
        body, head, blocks, pos, end = parse_sealed(value, name, what)
        if head["keys"] != "int":
            return None
        n = head["n"]
        keys = np.frombuffer(body, INT_KEY, 2 * n, pos)
        sums = np.frombuffer(body, PAGE_SUM, (len(body) - end) // PAGE_SUM.itemsize, end) if "page" in head else None
        return RunArrays._of_blocks(name, blocks, keys[:n], keys[n:], None, None, sums, head.get("filter"),
                                    head.get("filter_bits", FILTER_BITS_UNNAMED), head.get("run_filter", 0), read_filters)

    @staticmethod
    def _of_blocks(name: str, blocks: np.ndarray, first: np.ndarray, last: np.ndarray, first_at: np.ndarray | None,
                   last_at: np.ndarray | None, sums: np.ndarray | None, filter_offset: int | None, filter_bits: int,
                   run_filter_units: int, read_filters: ReadFilters | None) -> "RunArrays":
        """The arrays of a run's ``blocks`` (BLOCK entries) and keys, with what the native code
        derives from the blocks (``_point_probe.block_arrays``) and the key filters it says
        where to read, then the run filter of ``run_filter_units`` units."""
        use_filters = filter_offset is not None and read_filters is not None
        sections, page_start, filter_at = _point_probe.block_arrays(blocks, filter_bits if use_filters else 0)
        filters = None
        if filter_at is not None:
            filter_at = np.frombuffer(filter_at, np.int64)
            end = filter_offset + int(filter_at[-1]) + run_filter_units * FILTER_UNIT_BYTES
            filters = np.frombuffer(read_filters(name, filter_offset, end), np.uint8)
        else:
            run_filter_units = 0
        return RunArrays(first, last, blocks, np.frombuffer(sections, np.int64), np.frombuffer(page_start, np.int64), sums,
                         first_at, last_at, filters, filter_at, run_filter_units)

    @staticmethod
    def build(first_keys: list | tuple, last_keys: list | tuple, blocks: np.ndarray, sums: np.ndarray | None,
              filters: pa.Buffer | None, filter_at: np.ndarray | None) -> "RunArrays":
        """The arrays of blocks ``blocks`` (BLOCK entries) with their first and last keys, their
        key ``filters`` and where each block's starts in them, then the end."""
        sections, page_start, _ = _point_probe.block_arrays(blocks, 0)
        kept = (None, None) if filters is None else (np.frombuffer(filters, np.uint8), np.asarray(filter_at, np.int64))
        derived = (blocks, np.frombuffer(sections, np.int64), np.frombuffer(page_start, np.int64), sums)
        if first_keys and type(first_keys[0]) is str:
            (first, first_at), (last, last_at) = _packed(list(first_keys)), _packed(list(last_keys))
            return RunArrays(first, last, *derived, first_at, last_at, *kept)
        return RunArrays(np.array(first_keys, np.int64), np.array(last_keys, np.int64), *derived, None, None, *kept)

    @functools.cached_property
    def native_args(self) -> tuple:
        """The arrays in the order ``_point_probe.prepared_run`` takes them, after a run's map."""
        return (self.first_keys, self.last_keys, self.blocks, self.sections, self.page_start, self.sums, self.first_at,
                self.last_at, self.filter_at, self.filters, self.run_filter_units)

    @functools.cached_property
    def nbytes(self) -> int:
        return 200 + sum(a.nbytes for a in self.native_args[:-1] if a is not None)  # the arrays, not the count


def _packed(keys: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Strings as their UTF-8 bytes one after another, and the int64 offset of each, then the end
    (per block of a run, not per record; ``pyarrow.array`` would import pandas on first use)."""
    encoded = [k.encode() for k in keys]
    at = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum([len(b) for b in encoded], out=at[1:])
    return np.frombuffer(b"".join(encoded), np.uint8), at


class RunToProbe(NamedTuple):
    """A run of the snapshot, with where it is for messages and read statistics."""

    subindex: int  # 0-based
    where: str  # "sub-index I3" (or "... of draining layout 1")
    name: str


class PreparedRun(NamedTuple):
    """A run ready for run sets: its mapped file, and the native handle that holds its map and
    arrays (``_point_probe.prepared_run``). Each version that keeps the run reuses it
    (``read_state.ReadState.prepared_runs``), so a new version costs a lookup a run it kept."""

    run: RunToProbe
    source: object  # files.MappedSource: the native code checks the file's size through its descriptor
    handle: object
    nbytes: int  # of its arrays

    @staticmethod
    def of(run: RunToProbe, source, arrays: RunArrays) -> "PreparedRun":
        return PreparedRun(run, source, _point_probe.prepared_run(*source.native(), *arrays.native_args), arrays.nbytes)


@dataclass(frozen=True)
class ProbeRuns:
    """The runs point probes of one version search, ready for the native code, which holds their
    arrays and maps (``_point_probe.run_set``) for as long as this lives. ``prepared`` keeps each
    run's ``files.MappedSource`` open too: the native code checks the file's size through its
    descriptor, which must not be closed (and its number reused) while a probe runs."""

    prepared: list[PreparedRun]
    native: object  # the run set capsule
    empty: pa.Table  # a probe's answer when no row matches (most keys' in an archive of many keys)

    @property
    def sources(self) -> list:
        return [p.source for p in self.prepared]

    @staticmethod
    def of(prepared: list[PreparedRun], live: list[tuple[int, int]], layout: ColumnLayout,
           schema: pa.Schema) -> "ProbeRuns":
        """``prepared`` runs with (max_exp, first_live) of each in this version, for ``schema``
        (the archive schema), stored as ``layout`` says."""
        native = _point_probe.run_set([p.handle for p in prepared], live, layout.kinds, layout.widths, layout.key,
                                      layout.ts, layout.exp, layout.returned)
        return ProbeRuns(prepared, native, empty_table(schema))


class PreparedProbe(NamedTuple):
    """One version's prepared point probes (``Snapshot.prepared_probe``): what ``probe`` needs
    to answer as of that version's ``time`` or later, without its snapshot, in one call."""

    runs: ProbeRuns
    accepts: Callable[[object], bool]  # ``ColumnLayout.accepts``: keys the native probe takes
    time: int  # the version's time
    schema: pa.Schema  # the archive schema
    what: str  # names the archive in errors


def probe(runs: ProbeRuns, key: int | str, as_of: int, schema: pa.Schema,
          what: str) -> tuple[pa.Table, list[tuple[int, int, int]]]:
    """The records of ``key`` valid at ``as_of`` in ``runs``, ordered by (exp, ts), as a table of
    ``schema`` (the archive schema); and (sub-index, blocks, bytes) of each run searched.
    CorruptionError naming ``what`` and the run if a block is damaged, DataIOError if its file
    cannot be read."""
    return _result(runs, schema, what, _point_probe.probe, runs.native, key, as_of)


def probe_many(runs: ProbeRuns, keys: np.ndarray, as_of: int, schema: pa.Schema,
               what: str) -> tuple[pa.Table, list[tuple[int, int, int]]]:
    """``probe`` of every key of ``keys`` (int64, or str for a string key column; ascending,
    without repeats) in one native call, which decodes each block and checks each page once for
    all the keys it holds: the records ordered by (key, exp, ts), and each run's blocks
    searched, each block counted once."""
    if keys.dtype == np.int64:
        return _result(runs, schema, what, _point_probe.probe_many, runs.native, keys, as_of)
    data, at = _packed(keys.tolist())
    return _result(runs, schema, what, _point_probe.probe_many, runs.native, at, as_of, data)


def _result(runs: ProbeRuns, schema: pa.Schema, what: str, call, *args) -> tuple[pa.Table, list[tuple[int, int, int]]]:
    try:
        capsule, visited, address = call(*args)
    except _point_probe.BlockError as e:
        i, offset, msg, errnum = e.args
        run = runs.prepared[i].run
        msg = f"{what}, {run.where}, run {run.name}, block at byte {offset}: {msg}"
        raise (DataIOError(errnum, msg) if errnum else CorruptionError(msg)) from None
    searched = [(runs.prepared[i].run.subindex, b, z) for i, b, z in visited]
    if capsule is None:
        return runs.empty, searched
    # moves the batch out of the struct ``capsule`` owns (which then frees only the struct), against
    # the schema object at hand: no schema exported and parsed again per probe
    batch = pa.RecordBatch._import_from_c(address, schema)
    del capsule
    return pa.Table.from_batches([batch]), searched


def probe_task(task, files, physical: pa.Schema, key: str, ts: str, exp: str, what: str) -> pa.Table:
    """The rows of ``task`` (a ``read_plan.ReadTask`` of a batch probe: ``task.batch``), its keys
    searched by ``probe_many`` in one native call over the task's blocks of its run, which
    ``files`` (``OpenFiles``) holds: for a process with only the data files (a Spark executor).
    The archive schema's columns; ordered by (key, exp, ts)."""
    batch = task.batch
    blocks = np.array([tuple(e) for e in task.blocks], BLOCK)
    sums = np.frombuffer(b"".join(task.page_sums), PAGE_SUM)
    filters = None
    if batch.filter_at is not None:
        filters = files.source(task.file, sequential=False).read(batch.filter_offset, batch.filter_bytes,
                                                                 f"{what}, run {task.file}, key filters")
    arrays = RunArrays.build(batch.first_keys, batch.last_keys, blocks, sums, filters, batch.filter_at)
    layout = ColumnLayout.of(physical, key, ts, exp)
    schema = pa.schema(list(physical)[:visible_columns(len(physical))])
    prepared = PreparedRun.of(RunToProbe(task.subindex, task.where, task.file), files.mapped(task.file), arrays)
    runs = ProbeRuns.of([prepared], [(int(blocks["max_exp"].max()), 0)], layout, schema)
    keys = [lo for lo, _ in task.key_ranges]
    keys = np.array(keys, object) if layout.text_key else np.array(keys, np.int64)
    return probe_many(runs, keys, task.as_of, schema, what)[0]
