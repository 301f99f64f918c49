"""Benchmarks of this system itself: orchestrator, compile pool, GPU queue, timing, learner,
weight sync, checkpoints, learning, and the multi-GPU node run.

Each module runs as `python -m bench.system.NAME`; `suite` runs them all and `report` writes the
report. Benchmarking checkpoints on KernelBench is `bench/kernelbench/`.
"""
