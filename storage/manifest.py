"""The commit metadata: configuration, schema, the current version and the update log, in LMDB.

Everything a reader needs to find records lives here and changes only inside an update's LMDB
write transaction, whose commit is the single point at which an update happens. Every value is
sealed (``checksum.seal``), so damage reads as a ``CorruptionError``, never as a wrong answer.

Keys (one LMDB database):

    config          ArchiveConfig (JSON), written once by ``ebb init``
    schema          the archive's Arrow schema (IPC), written by the first load, rewritten by a
                    load that adds columns
    schemas         its history (JSON): each version's column count and the update that brought it
    state           ArchiveState (JSON): last slot, update count, the live runs of each sub-index,
                    and the runs of layouts being drained after ``ebb migrate``; then a newline
                    and the root (JSON, ``seal_root``): every other entry the version needs, by
                    name and checksum, so a missing entry is corruption, never "not there yet"
    run/NAME        the RunDescriptor of run file NAME
    garbage         files and file prefixes replaced by committed updates, not yet reclaimed
    ext/NAME        a producer's progress record, committed with the update it describes
    upd/SEQ         the UpdateRecord of update SEQ (8 bytes big-endian); the last
                    ``config.update_log`` are kept
    ver/TIME        a version kept for reads as of an earlier instant (``config.retain``): its
                    time, LMDB transaction id and state (TIME: 8 bytes big-endian, offset by 2^63)
    migrations      the log of layout changes (``migrate``), oldest first
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import lmdb
import numpy as np
import pyarrow as pa

from .checksum import SEAL_HEAD_BYTES, seal, sealed_digest, unseal
from .config import ArchiveConfig
from .disk_format import FORMAT_VERSION as _FORMAT_VERSION, METADATA_PREFIX_TAGS as _PREFIX_TAGS, METADATA_TAGS as _TAGS
from .errors import CorruptionError, EbbError
from .run_descriptor import RunDescriptor
from .schema import SchemaHistory

FORMAT_VERSION = _FORMAT_VERSION  # defined in disk_format; archive and query import it from here


@dataclass
class LiveRun:
    """A run of a sub-index in the committed state: blocks ``first_live`` .. end are live."""

    name: str
    first_live: int
    records: int
    bytes: int
    blocks: int
    min_exp: int
    max_exp: int

    @staticmethod
    def of(desc: RunDescriptor, first_live: int) -> "LiveRun | None":
        """The live part of ``desc`` from block ``first_live`` on, or None if nothing is left."""
        b = desc.blocks[first_live:]
        if b.size == 0:
            return None
        return LiveRun(desc.name, first_live, int(b["rows"].sum()), int(b["length"].sum()), int(b.size),
                       int(b["min_exp"].min()), int(b["max_exp"].max()))


@dataclass
class SubIndexState:
    runs: list[LiveRun] = field(default_factory=list)

    @property
    def records(self) -> int:
        return sum(r.records for r in self.runs)

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.runs)

    @property
    def blocks(self) -> int:
        return sum(r.blocks for r in self.runs)

    @property
    def min_exp(self) -> int | None:
        return min((r.min_exp for r in self.runs), default=None)

    @property
    def max_exp(self) -> int | None:
        return max((r.max_exp for r in self.runs), default=None)


@dataclass
class DrainingLayout:
    """A layout that ``migrate`` replaced without copying. It receives no more records; each
    update drops its runs whose records have all expired, and the layout goes with its last run
    (within S of the switch). Until then reads cover it too: every record is in exactly one
    layout, because records inserted after the switch go only to the new one."""

    config: dict  # the ArchiveConfig (asdict) it was written under
    switched_after_slot: int | None  # the last update it received records from
    subindices: list[SubIndexState] = field(default_factory=list)

    @property
    def records(self) -> int:
        return sum(s.records for s in self.subindices)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.subindices)


def _subindices(raw: list[dict]) -> list[SubIndexState]:
    return [SubIndexState([LiveRun(**r) for r in s["runs"]]) for s in raw]


@dataclass
class ArchiveState:
    """The version: rewritten by every update."""

    last_slot: int | None = None  # slot of the last update; None before the first load
    update_seq: int = 0  # number of committed updates
    late_rows: int = 0
    subindices: list[SubIndexState] = field(default_factory=list)
    draining: list[DrainingLayout] = field(default_factory=list)  # newest first

    def run_names(self) -> set[str]:
        """Every run file this version references, in the current and the draining layouts."""
        return {r.name for s in self.subindices for r in s.runs} | \
            {r.name for d in self.draining for s in d.subindices for r in s.runs}

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @staticmethod
    def from_json(data: bytes) -> "ArchiveState":
        d = json.loads(bytes(data).partition(b"\n")[0])  # the stored value carries the root after it
        d["subindices"] = _subindices(d["subindices"])
        d["draining"] = [DrainingLayout(x["config"], x["switched_after_slot"], _subindices(x["subindices"]))
                         for x in d.get("draining", [])]
        return ArchiveState(**d)


def _lookup(txn: lmdb.Transaction, key: bytes):
    """``txn.get(key)``, with LMDB's own damage reports turned into a CorruptionError."""
    try:
        return txn.get(key)
    except lmdb.Error as e:
        raise CorruptionError(f"the archive's metadata is damaged (LMDB: {e})") from None


def _get(txn: lmdb.Transaction, key: bytes, what: str) -> memoryview | None:
    """The payload of the entry at ``key``, or None if the version has none (CorruptionError if
    its root names it: ``_absent``)."""
    raw = _lookup(txn, key)
    if raw is None:
        _absent(txn, key, what)
        return None
    return _unseal(key, raw, what)


def _tag(key: bytes) -> bytes | None:
    """The tag sealed into the value at ``key`` (None: not a key ebb writes)."""
    return _TAGS.get(key) or _PREFIX_TAGS.get(key[:4])


def _seal(key: bytes, payload: bytes) -> bytes:
    return seal(_tag(key), key, payload)


def _unseal(key: bytes, value, what: str) -> memoryview:
    return unseal(_tag(key), key, value, what)


def _sealed(txn, key: bytes, what: str) -> bytes:
    """A required value as stored, still sealed (a cache key for the parsed value)."""
    raw = _lookup(txn, key)
    if raw is None:
        raise CorruptionError(f"the archive's metadata has no {what}: it is damaged")
    return bytes(raw)


# -- the root: what a version must hold ------------------------------------------------------
# Every commit ends with ``seal_root``, which appends to the state value (read first by every
# reader and writer, and itself required) the checksum of each other single entry the version
# holds, the newest update record and the newest kept version. A key whose bits flip no longer
# matches its seal, so it reads as absent: the root turns that absence into a CorruptionError.
# Entries found are checked by their own seals, so reads pay for the root only on an absence.

_ROOT_KEYS = (b"config", b"schema", b"schemas", b"garbage", b"migrations")


def seal_root(txn) -> None:
    """Rewrites the state value of the open write transaction ``txn`` with the root of the
    version it is about to commit (call last, right before the commit)."""
    keys = {k.decode(): sealed_digest(v) for k in _ROOT_KEYS if (v := _lookup(txn, k)) is not None}
    cur = txn.cursor()
    if cur.set_range(b"ext/"):
        for k, v in cur.iternext():
            if not bytes(k).startswith(b"ext/"):
                break
            try:
                name = bytes(k).decode()
            except UnicodeDecodeError:  # ebb writes UTF-8 names only: a damaged key
                raise CorruptionError(f"a metadata key {bytes(k)!r} is damaged (not UTF-8)") from None
            keys[name] = sealed_digest(v)
    root = {"keys": keys, "upd": _last_seq(txn), "ver": _newest_kept_time(txn)}
    body = bytes(_unseal(b"state", read_state_bytes(txn), "archive state")).partition(b"\n")[0]
    txn.put(b"state", _seal(b"state", body + b"\n" + json.dumps(root, separators=(",", ":")).encode()))


def read_root(txn) -> dict | None:
    """The root of ``txn``'s version; None for one committed before roots existed (format 2
    archives written by earlier ebb: what must exist is then what is there)."""
    _, _, root = bytes(_unseal(b"state", read_state_bytes(txn), "archive state")).partition(b"\n")
    if not root:
        return None
    try:
        return json.loads(root)
    except ValueError:
        raise CorruptionError("the archive's metadata root cannot be decoded: its metadata is damaged") from None


def _absent(txn, key: bytes, what: str) -> None:
    """CorruptionError if the root of ``txn``'s version names ``key``, which it lacks."""
    root = read_root(txn)
    if root is not None and key.decode(errors="replace") in root["keys"]:
        raise CorruptionError(f"the archive's metadata lost its {what}: it is damaged")


def _last_seq(txn) -> int | None:
    cur = txn.cursor()
    found = cur.prev() if cur.set_range(b"upd0") else cur.last()  # "0" sorts right after "/"
    return int.from_bytes(bytes(cur.key())[4:], "big") if found and bytes(cur.key()).startswith(b"upd/") else None


def _newest_kept_time(txn) -> int | None:
    cur = txn.cursor()
    found = cur.set_range(b"ver0") and cur.prev() or cur.last()  # "0" sorts right after "/"
    return _kept_head(cur.key(), cur.value())["time"] if found and bytes(cur.key()).startswith(b"ver/") else None


def read_config_bytes(txn) -> bytes:
    return _sealed(txn, b"config", "configuration")


# what decoding a value that passed its seal raises if the value is malformed anyway (a writer's
# bug); OSError: pyarrow's IPC reader reports a malformed stream so, though it reads memory here
_MALFORMED = (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError, OverflowError, OSError,
              pa.ArrowException)


def _decoded(decode, payload: bytes, what: str):
    """``decode(payload)``, a value that passed its seal; CorruptionError if it is malformed."""
    try:
        return decode(payload)
    except CorruptionError:
        raise
    except _MALFORMED + (EbbError,) as e:
        raise CorruptionError(f"the archive's {what} cannot be decoded ({type(e).__name__}): its metadata is damaged") \
            from None


def parse_config(raw: bytes) -> ArchiveConfig:
    return _decoded(ArchiveConfig.from_json, bytes(_unseal(b"config", raw, "configuration")), "configuration")


def write_config(txn, cfg: ArchiveConfig) -> None:
    txn.put(b"config", _seal(b"config", cfg.to_json()))


def read_state_bytes(txn) -> bytes:
    return _sealed(txn, b"state", "state")


def parse_state(raw: bytes) -> ArchiveState:
    return _decoded(ArchiveState.from_json, bytes(_unseal(b"state", raw, "archive state")), "state")


def read_state(txn) -> ArchiveState:
    return parse_state(read_state_bytes(txn))


def write_state(txn, state: ArchiveState) -> None:
    txn.put(b"state", _seal(b"state", state.to_json()))


def read_schema_bytes(txn) -> tuple[bytes, bytes] | None:
    """The schema and its history as stored, still sealed (a cache key for the parsed history);
    None before the first load."""
    raw = _lookup(txn, b"schema")
    if raw is None:
        _absent(txn, b"schema", "schema")
        return None
    history = _lookup(txn, b"schemas")
    if history is None:
        _absent(txn, b"schemas", "schema history")
    return bytes(raw), b"" if history is None else bytes(history)


def parse_schema_history(raw: tuple[bytes, bytes]) -> SchemaHistory:
    schema_raw, history_raw = raw
    payload = bytes(_unseal(b"schema", schema_raw, "schema"))
    schema = _decoded(lambda b: pa.ipc.read_schema(pa.py_buffer(b)), payload, "schema")
    history = bytes(_unseal(b"schemas", history_raw, "schema history")) if history_raw else None
    return _decoded(lambda h: SchemaHistory.from_json(schema, h), history, "schema history")


def read_schema_history(txn) -> SchemaHistory | None:
    """The archive schema and its history, or None before the first load."""
    raw = read_schema_bytes(txn)
    return None if raw is None else parse_schema_history(raw)


def write_schema_history(txn, history: SchemaHistory) -> None:
    txn.put(b"schema", _seal(b"schema", history.schema.serialize().to_pybytes()))
    txn.put(b"schemas", _seal(b"schemas", history.to_json()))


def read_run_value(txn, name: str) -> bytes:
    """The sealed descriptor of run ``name`` as stored (``RunDescriptor.from_bytes`` parses it)."""
    raw = _lookup(txn, RunDescriptor.key(name))
    if raw is None:
        raise CorruptionError(f"the archive's metadata has no descriptor for run {name}: it is damaged")
    return raw


def read_run(txn, name: str, with_sums: bool = True) -> RunDescriptor:
    """The descriptor of run ``name``, with or without its page sums (see ``read_page_sums``)."""
    return RunDescriptor.from_bytes(read_run_value(txn, name), name, f"descriptor of run {name}", with_sums)


def read_page_sums(txn, name: str) -> np.ndarray | None:
    """The page sums of run ``name`` (None: written without them)."""
    return RunDescriptor.sums_from_bytes(read_run_value(txn, name), name, f"descriptor of run {name}")


def write_run(txn, desc: RunDescriptor) -> None:
    if desc.paged and desc.sums is None:  # would store the run as if written without page sums
        raise ValueError(f"the descriptor of run {desc.name} was read without its page sums; store the writer's")
    txn.put(RunDescriptor.key(desc.name), desc.to_bytes())


def delete_run(txn, name: str) -> None:
    txn.delete(RunDescriptor.key(name))


def read_garbage(txn) -> list[list]:
    """Space replaced by committed updates: [file name, txn that replaced it, end or None]; end
    is the byte offset below which the file's blocks are dead (None: the whole file)."""
    raw = _get(txn, b"garbage", "garbage list")
    return json.loads(bytes(raw)) if raw is not None else []


def write_garbage(txn, garbage: list[list]) -> None:
    txn.put(b"garbage", _seal(b"garbage", json.dumps(garbage).encode()))


def read_checkpoint(txn, name: str) -> bytes | None:
    """A producer's progress record (e.g. the scheduler's), committed with its last update."""
    raw = _get(txn, b"ext/" + name.encode(), f"checkpoint {name!r}")
    return None if raw is None else bytes(raw)


def write_checkpoint(txn, name: str, value: bytes) -> None:
    key = b"ext/" + name.encode()
    txn.put(key, _seal(key, value))


def read_migrations(txn) -> list[dict]:
    """The log of layout changes, oldest first."""
    raw = _get(txn, b"migrations", "migration log")
    return json.loads(bytes(raw)) if raw is not None else []


def write_migrations(txn, log: list[dict]) -> None:
    txn.put(b"migrations", _seal(b"migrations", json.dumps(log).encode()))


def append_update_record(txn, seq: int, record: dict) -> None:
    key = b"upd/" + seq.to_bytes(8, "big")
    txn.put(key, _seal(key, json.dumps(record).encode()))


def read_update_records(txn, last: int | None = None) -> list[dict]:
    """The update log, oldest first (the last ``last`` records if given)."""
    cur = txn.cursor()
    out, seqs = [], []
    if cur.set_range(b"upd/"):
        for k, v in cur.iternext():
            if not k.startswith(b"upd/"):
                break
            seqs.append(int.from_bytes(k[4:], "big"))
            out.append(json.loads(bytes(_unseal(bytes(k), v, f"update record {seqs[-1]}"))))
    # records are kept contiguous up to the newest, which the root names: a gap or a missing
    # newest one is a key that lost its bits
    root = read_root(txn)
    gap = bool(seqs) and seqs != list(range(seqs[0], seqs[0] + len(seqs)))
    if root is not None and (gap or (seqs[-1] if seqs else None) != root["upd"]):
        raise CorruptionError("the archive's update log lost records: its metadata is damaged")
    return out if last is None else out[-last:] if last else []


def _trim(txn, prefix: bytes, below: bytes) -> None:
    """Deletes every key that starts with ``prefix`` and sorts before ``prefix + below``."""
    cur = txn.cursor()
    if not cur.set_range(prefix):
        return
    while cur.key().startswith(prefix) and cur.key() < prefix + below:
        if not cur.delete():
            break


def trim_update_records(txn, seq: int, keep: int) -> None:
    """Keeps only the update records of the last ``keep`` updates (``seq`` the newest)."""
    if seq > keep:
        _trim(txn, b"upd/", (seq - keep + 1).to_bytes(8, "big"))


@dataclass(frozen=True)
class KeptVersion:
    """A committed version kept for reads as of an instant before the last update."""

    time: int  # its update's time: the version is current from it until the next update's
    txn: int  # the LMDB transaction that committed it (garbage it replaced waits for it)
    state: ArchiveState


def _time_key(t: int) -> bytes:
    return b"ver/" + (t + (1 << 63)).to_bytes(8, "big")


def _kept(k: bytes, v) -> KeptVersion:
    head, _, body = bytes(_unseal(bytes(k), v, "kept version")).partition(b"\n")
    h = json.loads(head)
    return KeptVersion(h["time"], h["txn"], ArchiveState.from_json(body))


def _kept_head(k: bytes, v) -> dict:
    """The head of a kept version: its time, txn and (since roots) the time of the one before."""
    head = bytes(_unseal(bytes(k), v, "kept version")).partition(b"\n")[0]
    return json.loads(head)


def keep_version(txn, time: int, state: ArchiveState, retain: int) -> None:
    """Records ``state`` as the version current from ``time`` (committed by ``txn``), and drops
    the kept versions that no instant of the last ``retain`` chronons needs: those older than the
    version that was current at ``time - retain``. Each names the one before it (``prev``), so
    a lost one is found (``kept_version_at``)."""
    key = _time_key(time)
    cur = txn.cursor()
    prev = _kept_head(cur.key(), cur.value())["time"] if _seek_at(cur, time - 1) else None
    head = json.dumps({"time": time, "txn": txn.id(), "prev": prev}).encode()
    txn.put(key, _seal(key, head + b"\n" + state.to_json()))
    cur = txn.cursor()
    if _seek_at(cur, time - retain):
        _trim(txn, b"ver/", bytes(cur.key())[4:])


def _seek_at(cur, t: int) -> bool:
    """Puts ``cur`` on the newest kept version with time <= ``t``; False if there is none."""
    found = cur.prev() if cur.set_range(_time_key(t + 1)) else cur.last()
    return found and bytes(cur.key()).startswith(b"ver/")


def kept_version_at(txn, t: int) -> KeptVersion | None:
    """The kept version current at instant ``t`` (the newest with time <= t), or None.
    CorruptionError if the root or the next version's ``prev`` shows a newer one was lost (its
    state would otherwise be read as of instants it does not cover)."""
    cur = txn.cursor()
    if not _seek_at(cur, t):
        return None
    found = _kept(cur.key(), cur.value())
    if cur.next() and bytes(cur.key()).startswith(b"ver/"):
        after = _kept_head(cur.key(), cur.value()).get("prev", found.time)  # absent: kept before roots
    else:
        root = read_root(txn)
        after = found.time if root is None else root["ver"]
    if after != found.time:
        raise CorruptionError(f"the archive's metadata lost the version kept for instant {after}: it is damaged")
    return found


def oldest_kept_version(txn) -> KeptVersion | None:
    """The oldest version kept for reads as of earlier instants, or None if none is kept."""
    cur = txn.cursor()
    if not cur.set_range(b"ver/") or not cur.key().startswith(b"ver/"):
        return None
    return _kept(cur.key(), cur.value())


def check_all(txn) -> list[str]:
    """Problems with any metadata entry: every key must be one ebb writes, every value must
    pass its checksum, and every entry the root names must be there with the checksum it names
    (``verify`` runs this over the whole committed version)."""
    problems = []
    try:
        problems += _check_root(txn)
        for k, v in txn.cursor().iternext():
            k = bytes(k)
            if _tag(k) is None:
                problems.append(f"metadata: unknown key {k[:40]!r}")
                continue
            try:
                _unseal(k, v, f"metadata entry {k[:40]!r}")
            except CorruptionError as e:
                problems.append(str(e))
    except lmdb.Error as e:
        problems.append(f"the archive's metadata is damaged (LMDB: {e})")
    return problems


def _check_root(txn) -> list[str]:
    """Problems with the root: an entry it names that is missing or holds another value, a gap
    in the update log or the newest record missing, a kept version lost from the chain."""
    try:
        root = read_root(txn)
    except CorruptionError as e:
        return [str(e)]
    if root is None:
        return []
    out = []
    for name, digest in root["keys"].items():
        raw = _lookup(txn, name.encode())
        if raw is None:
            out.append(f"metadata: {name!r}, named by the root, is missing")
        elif len(raw) < SEAL_HEAD_BYTES or sealed_digest(raw) != digest:
            out.append(f"metadata: {name!r} is not the value the root names")
    try:
        read_update_records(txn)
    except CorruptionError as e:
        out.append(str(e))
    cur, times = txn.cursor(), []
    if cur.set_range(b"ver/"):
        for k, v in cur.iternext():
            if not bytes(k).startswith(b"ver/"):
                break
            try:
                times.append(_kept_head(k, v))
            except CorruptionError:
                times.append(None)  # check_all reports the value itself
    heads = [h for h in times if h is not None]
    links = [b.get("prev", a["time"]) == a["time"] for a, b in zip(heads, heads[1:])]
    if not all(links) or (heads[-1]["time"] if heads else None) != root["ver"] and None not in times:
        out.append("metadata: a version kept for earlier instants is missing")
    return out
