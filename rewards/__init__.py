"""The reward: is this kernel real, is it correct, and how fast is it.

    env.py, evaluate.py   the agent's tools (compile, verify, profile) and the final evaluation
    reward.py, verdict.py the milestone reward and the result Structs every part returns
    eval_cmd.py           `cuda-agent eval`: one solution, judged the way the trainer judges it
    build/     compiling a workspace: the nvcc pool, toolchain, link check, loading the .so
    static/    rules read from the sources without running them (model_new.py and C++)
    inline/    single-file solutions (`load_inline`) turned into a workspace build
    queue/     the GPU job queue: sandboxed worker processes, one lane (or more) per GPU
    verify/    correctness and the dynamic anti-hacking checks, in a candidate child process
    timing/    CUDA-event timing, eager and torch.compile baselines, the profile job

What the rules are and why: rewards/README.md. The trusted side (env, evaluate, reward, the
queue client and the compile pool) never imports torch; GPU work runs in queue workers.
"""
