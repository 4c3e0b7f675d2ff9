"""ebb.indexer.advisor: the layout advisor, which predicts what each candidate layout would cost
a workload on this machine (seconds per update, probe and scan, disk bytes) and ranks them
(docs/advisor.md). ``ebb advise`` shows the ranking; ``layout = "auto"`` in a job takes its first.

It sits in the indexer because the scheduler asks it for ``auto``'s layout; it reads the engine
only through storage's and query's public names, and imports nothing of ebb.tools when it is
imported (``ebb advise --workload`` and ``--calibrate`` use the benchmark's workloads and
measurement when they run). Importing this package imports none of its modules.

- ``layout_sim``: the counts: what the engine does, in expected numbers, for a workload under a layout.
- ``cost_model``: counts times machine constants; the candidate layouts, predicted and ranked for a mix of reads.
- ``workload_profile``: the statistics the model needs, from a job and a sample of its landed events, or an archive.
- ``calibrate``: the machine constants, measured by micro-benchmarks of ebb's storage code.
- ``auto``: the advisor as the rest of ebb uses it: the stored calibration, and what ``layout = "auto"`` picks.
- ``bench``: the advisor beside ``ebb bench``: a benchmark workload's statistics and schedule, a recorded run.
- ``advise_cmd``: ``ebb advise``: its arguments, the workload it is asked about, and its report.
"""
