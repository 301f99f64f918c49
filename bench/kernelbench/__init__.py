"""`cuda-agent bench --suite kernelbench`: the agent (or a replayed solution set) on KernelBench.

Modules: `problems` (which problems run), `replay` (a scripted policy that submits given
solutions through the agent's tools), `wrappers` (reference-wrapping solutions every evaluator
must reject), `candidates` (the best candidate of a trajectory and its final evaluation), `config`
(`BenchConfig`), `run` (`run_benchmark`: rollouts, scoring, `records.jsonl`), `run_stats` (how a
run used the machine), `recheck` (a second, independent measurement of the baselines), `cli` (the
command line). The metrics, the report and the checkpoint watcher live beside them (`metrics`,
`report`, `watch`).
"""
