"""Benchmarks of this system itself: orchestrator, compile pool, GPU queue, timing, learner,
weight sync, checkpoints, learning, and the multi-GPU node run.

Each module runs as `python -m bench.system.NAME`; `suite` runs them all and `report` writes the
report. `job_phases` reads where a run's verification and profile jobs spent their seconds from its
rollout files; `judge_reads` counts the host reads (each a GPU sync) of the judge's comparisons with
`host_reads`. Benchmarking checkpoints on KernelBench is `bench/kernelbench/`.
"""
