"""The record each update leaves in the archive's update log: what it touched and what it cost."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class UpdateRecord:
    seq: int
    time: int
    slot: int
    kind: str  # "bulk" | "periodic"
    slots_processed: list[int]  # [first, last] deletion slots run by this update; [] for the bulk load
    input_rows: int
    inserted: int
    deleted: int
    dropped_expired: int  # records already expired when loaded (not stored)
    late_rows: int  # late events the producer dropped for this update
    planned_insert_into: list[int]  # 1-based sub-indices docs/spec.md section 3 allows inserting into
    planned_delete_from: list[int]  # 1-based sub-indices that may hold records expiring now
    subindices_touched: list[int]  # 1-based sub-indices whose runs changed
    subindices_read: list[int]
    subindices_written: list[int]
    blocks_read: int
    bytes_read: int
    blocks_written: int
    bytes_written: int
    per_subindex: list[dict] = field(default_factory=list)
    drained_runs: int = 0  # runs of layouts being drained after a migration, dropped wholly expired
    drained_records: int = 0
    os_rchar: int = 0  # the process's /proc/self/io deltas over the update
    os_wchar: int = 0
    os_read_bytes: int = 0
    os_write_bytes: int = 0
    wall_seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)
