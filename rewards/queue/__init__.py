"""The GPU job queue: lanes of long-lived, sandboxed worker processes, one or more per GPU.

`gpu_queue` is the async client the orchestrator holds (submit, deadlines, restarts,
statistics), `config` its settings, `lanes` the dispatch (timing jobs alone on their GPU,
verification sharing it), `jobs` the job Structs and the handler table, `worker` and
`worker_command` the worker process and its command line, `zygote` and `zygote_server` a
pre-loaded fork server for the candidate children. What runs inside a job (verification,
timing) lives in `verify/` and `timing/`.
"""
