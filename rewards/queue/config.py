"""The GPU queue's configuration: GPUs and their lanes, sandbox, worker interpreter and limits.

Its own module so that the queue (`rewards.queue.gpu_queue`) and the worker's command line
(`rewards.queue.worker_command`) both import it without importing each other.
"""

from __future__ import annotations

import os
import sys

from msgspec import Struct

from rewards.queue.jobs import SHARED_KINDS, STAGED_KINDS

_SECRETS = (
    "~/.ssh ~/.aws ~/.netrc ~/.git-credentials ~/.docker ~/.config/gcloud ~/.kaggle ~/.cache/huggingface"
)
SECRET_PATHS = tuple(os.path.expanduser(p) for p in _SECRETS.split())  # workers may run as root


class GpuQueueConfig(Struct, frozen=True, kw_only=True):
    gpus: tuple[int, ...] = ()
    """GPU indices, `lanes_per_gpu` lanes each; empty: every GPU torch sees, counted in a subprocess."""
    lanes_per_gpu: int = 1
    """Worker processes per GPU. Above 1, jobs of `shared_kinds` (verification) run beside each
    other on a GPU, and every other kind (timing) waits until its GPU is idle and has it alone.
    Each lane's jobs use the GPU's memory at once: several verifications of GiB-sized inputs may
    not fit together."""
    shared_kinds: tuple[str, ...] = SHARED_KINDS
    """Job kinds that time nothing and may share a GPU; the others have their GPU to themselves."""
    staged_kinds: tuple[str, ...] = STAGED_KINDS
    """Timing kinds that build what they time beside the shared jobs and have their GPU alone only
    from when their handler asks (`JobContext.gpu_alone`), not with `fork_per_job` (a forked job
    cannot reach the channel): there they have it alone from the start."""
    sandbox: bool = False
    """Run each worker inside bubblewrap: the host filesystem read-only, a private read-only
    /tmp, only the lane's scratch dir (and `writable_paths`) writable, `hidden_paths` covered, no
    network, private pid/ipc/uts/user namespaces, the GPU device nodes bound, a filtered
    environment. A worker keeps one sandbox for its lifetime, so per-job inputs travel in
    `Job.files` rather than as bind mounts."""
    bwrap_path: str = "bwrap"
    """The bubblewrap binary, a name on PATH or a path."""
    hidden_paths: tuple[str, ...] = SECRET_PATHS
    """Paths the sandbox covers (add the tasks' reference dir and the workspaces root)."""
    scratch_root: str = ""
    """Parent of the per-lane scratch dirs; empty: a temp dir the queue makes and removes."""
    job_default_deadline_s: float = 600.0
    """Watchdog deadline of a job that sets none."""
    worker_start_timeout_s: float = 120.0
    """How long a fresh worker may take to import its preloads and report ready."""
    python: str = sys.executable
    """The interpreter that runs `rewards.queue.worker`."""
    fork_per_job: bool = False
    """The worker forks a fresh child per job (a zygote) instead of running jobs itself."""
    compile_threads: int = 1
    """Inductor's compile processes per job (TORCHINDUCTOR_COMPILE_THREADS). Above 1 only with
    `fork_per_job`: a long-lived worker would keep the pool's pipe to processes that the
    sandbox's stray reaper kills after each job; a forked child's pool goes with the child."""
    cpu_threads: int = 1
    """torch's CPU threads in each worker and its children (OMP_NUM_THREADS and MKL_NUM_THREADS,
    unless the host environment sets them). The lanes of a machine share its cores and their CPU
    work is small (a verdict's sample statistics); at torch's default of one thread per core,
    every lane's idle OpenMP threads spin on the cores the others need, and a judged comparison
    that takes 15 ms alone took 400 ms with four lanes at once."""
    preload: tuple[str, ...] = ()
    """Modules a worker imports once at start, e.g. ("torch",); importing must not init CUDA."""
    handlers: dict[str, str] = {}
    """Extra job kinds, "kind" -> "module:function", over `rewards.queue.jobs.HANDLERS`."""
    file_size_mib: int = 4096
    """Largest file candidate code may write in a sandboxed job (RLIMIT_FSIZE), in MiB. The
    trusted side may write larger ones where the task needs it (the reference's weights)."""
    env: dict[str, str] = {}
    """Extra environment of the workers, over the defaults of `worker_env` (e.g. a persistent
    Inductor cache for a queue that runs trusted reference code only)."""
    gpu_locks: bool = True
    """Also take the machine-wide lock of each job's GPU (`rewards.queue.gpu_lock`): a timing job
    then has its GPU alone from the jobs of every other GPU queue of the machine too, not only
    from this queue's."""
    gpu_lock_dir: str = ""
    """The lock files' directory; empty: $CUDA_AGENT_GPU_LOCKS, else <tmp>/cuda-agent-gpu-locks."""
    writable_paths: tuple[str, ...] = ()
    """Host directories a sandboxed worker may write besides its scratch (made if missing). Never
    one that a candidate's job may write to and a later job trusts."""


__all__ = ["SECRET_PATHS", "GpuQueueConfig"]
