"""How fast: CUDA-event timing of candidates and of the eager and torch.compile baselines.

`sampling` is the pure sampling loop and its config, `stats` the statistics, `gpu_timer` the
CuPy/NVML half that runs on a GPU, `clocks` the SM clocks, `baselines` the cached eager and
compile times, `paired` and `paired_timer` the paired timing of the final evaluation (candidate,
eager and torch.compile in rotated rounds of one process: its pure and its GPU half), `profile`
and `profile_child` the profile job (trusted side, candidate child).
It does not check correctness: a subject is timed only after `verify/` accepted it.
"""
