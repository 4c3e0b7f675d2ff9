"""ebb.storage: the on-disk archive of expiring records (format version 2, docs/format.md).

Layers, bottom to top:

- ``errors``, ``config``, ``timemodel``, ``layout``: the error hierarchy, the checked
  configuration, and pure arithmetic (slots, which sub-index holds a record).
- ``schema``, ``checksum``, ``block_format``, ``run_descriptor``, ``run_writer``, ``files``: how
  records become checksummed blocks in immutable run files, and how those are read.
- ``lmdb_env``, ``page_walk``, ``manifest``: the commit metadata, its pages checked before LMDB
  walks them and its entries named by a sealed root; one LMDB write transaction commits an update.
- ``validate``, ``update_plan``, ``maintenance``, ``commit``, ``update``: one update, as a pure
  plan, maintenance of the touched sub-indices, and the commit.
- ``read_plan``, ``task_reader``, ``snapshot``: read planning and the execution of read tasks.
- ``recovery``, ``verify``, ``faults``: crash recovery and space reclamation, checks, fault injection.
- ``archive``: the public entry point (create, open, load, plan, stats, snapshot).
"""
