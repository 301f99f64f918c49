"""The GPU job queue: one lane per GPU, each a long-lived worker process, sandboxed.

`gpu_queue` is the async client the orchestrator holds (submit, deadlines, restarts,
statistics), `config` its settings, `lanes` the per-GPU dispatch, `jobs` the job Structs and the
handler table, `worker` and `worker_command` the worker process and its command line, `zygote`
and `zygote_server` a pre-loaded fork server for the candidate children. What runs inside a job
(verification, timing) lives in `verify/` and `timing/`.
"""
