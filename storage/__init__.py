"""ebb.storage: the on-disk archive of expiring records.

Layers, bottom to top:

- ``timemodel``, ``layout``: pure arithmetic (slots, which sub-index holds a record, plans).
- ``schema``, ``bucket_codec``, ``ranges``: how records become bytes in a bucket and back.
- ``lmdb_env``, ``keys``, ``directory``, ``manifest``: the LMDB environment that holds the
  per-sub-index directories and the manifest; one LMDB write transaction commits an update.
- ``files``, ``slot_allocator``, ``rebuild``, ``norebuild``: the bucket files and the two
  maintenance modes.
- ``validate``, ``update``, ``recovery``, ``verify``: loading a batch, crash recovery, checks.
- ``archive``: the public entry point (create, open, load, plan, stats).
"""
