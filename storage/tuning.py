"""Tuning: every value that sets how much ebb reads, writes or holds at a time, in one place.

Any of these may change freely: no byte on disk depends on them, and archives written under other
values read the same (a run's block sizes are in its descriptor). Facts of the on-disk format,
whose change needs a format version bump, are in ``disk_format``; limits on what ``ebb init``
accepts are in ``config``.
"""

from __future__ import annotations

# -- blocks ---------------------------------------------------------------------------------------------
# The block size of an archive made without --block-bytes (kept in its configuration, so a change
# only affects new archives). Measured at 32/128/256/512/1024 KiB: probe 0.66/0.84/0.84/1.07/1.44 ms,
# scan 0.95/0.35/0.25/0.19/0.17 s; 512 KiB keeps most of the scan speed for a probe within 2x.
DEFAULT_BLOCK_BYTES = 512 << 10
# Rebuild and NoRebuild runs use the same block size. NoRebuild's used to be 8 times smaller, because a
# probe read one whole block in every run; the native probe reads only the key's pages of a block, and
# the small blocks cost NoRebuild 2x2 scans 2.9x and updates 1.4x on many-keys (measured 2026-11-26).
# The price: cold NoRebuild probes of keys with a few rows in every run read more, scattered, ranges
# (thesis-small 174 ms against 60; docs/io.md).

# -- reads ----------------------------------------------------------------------------------------------
# The largest single read of adjacent blocks (scans and Rebuild's merge; a larger block is read alone):
# a few ms of sequential transfer, so each request's fixed cost is small, while what a stream holds stays small.
SPAN_BYTES = 8 << 20
# The most a scan task (one Spark partition) reads: many tasks for parallelism, each long enough that
# its fixed cost (a task, opening a run) stays small.
SCAN_TASK_BYTES = 64 << 20
# A range probe whose planned blocks total at most this is read whole and sorted once, 2-4x faster than
# the streamed merge; a larger one streams, in memory bounded by its plan (query/flight_server.py).
WHOLE_RANGE_BYTES = 8 << 20
# A streamed range gathers its sorted rows into output batches of about this size, not one per merge
# round (a round may emit a handful of rows, and every batch has a fixed cost downstream).
RANGE_OUT_BYTES = 1 << 20
# Run files a process keeps open (files.OpenFiles, files.open_files_limit): half the process's descriptor
# limit, which ebb raises toward its hard limit first, as Go's runtime does, between these two. The native
# point probe maps every run of a version at once and takes at most half of them; a version with more runs
# (many sub-indices, a long NoRebuild history) is probed by the planned read, about 25x slower (a D-exp25
# thesis-small archive of 310 runs: 108 ms against 4.3 ms). 512 fits the usual soft limit of 1024 with room
# for sockets and LMDB; 8192 maps stay far below vm.max_map_count's default of 65530.
OPEN_FILES_MIN = 512
OPEN_FILES_MAX = 8192
# A replaced version's maps are unmapped this much at a time (files.MappedSource.drop_pages): each step
# holds the process's memory-map lock, which every page fault of every other thread waits for.
DROP_STEP_BYTES = 2 << 20
# ... after this long (files.RELEASER): the request that switched versions maps the new runs meanwhile,
# without waiting for that lock or the GIL (its first probe took about 8% longer with no wait).
RELEASE_DELAY_S = 0.05
# The most run bytes a process maps in ahead of its probes (files.RELEASER, MappedSource.map_resident): only
# pages already in the page cache, each costing the process 8 bytes of page table (4 GiB: 8 MiB of them).
MAP_RESIDENT_BYTES = 4 << 30

# -- metadata -------------------------------------------------------------------------------------------
# Parsed run metadata an archive keeps across snapshots (metadata_cache): bounded in bytes so memory does
# not grow with the archive; LevelDB's block cache is 8 MB, RocksDB's 32 MB, and ours holds only metadata:
# descriptors (~80 bytes a block), page sums (4 bytes a 4 KiB page) and the point probes' key filters
# (~2 bytes a record), which a run set must hold whole to be kept: 16 MiB holds those of ~8M records.
METADATA_CACHE_BYTES = 16 << 20

# -- batch probes ----------------------------------------------------------------------------------------
# A planned probe of at least this many keys (a Spark source's pushed IN list) becomes one task a run that
# the native batch probe executes, each block read once for all its keys; fewer keys are planned key by key
# (only the blocks whose key range holds one), which reads less for a handful of keys.
BATCH_PROBE_KEYS = 64
# A metadata file (index/data.mdb) up to this size (about 50 GB live) is read ahead whole when opened,
# so a cold start finds the state and run descriptors in memory by its first read (lmdb_env).
METADATA_READ_AHEAD_BYTES = 64 << 20
# LMDB's map: address space only (the file grows as used); 64 GiB holds millions of runs. The
# environment variable EBB_MAP_SIZE overrides it (docs/operations.md).
LMDB_MAP_SIZE = 1 << 36
# LMDB reader slots: read transactions open at once over all processes of one archive (the Flight
# server's concurrent streams, local Spark tasks, CLI reads); a slot costs 64 bytes of the lock file.
LMDB_MAX_READERS = 512

# -- updates --------------------------------------------------------------------------------------------
# Rebuild merges a sub-index's old records with the update's new ones this much (of stored blocks) at a
# time: an update holds its new records plus one chunk, whatever the sub-index's size.
MERGE_CHUNK_BYTES = 32 << 20
# Live bytes of a Rebuild sub-index one task rewrites (partitioned_update): small enough that a
# thesis-large update (7 touched sub-indices of ~300 MB) gives every core several parts, large enough that a
# part's fixed cost (a task, a file, an fsync) stays small beside its I/O.
PART_BYTES = 128 << 20
