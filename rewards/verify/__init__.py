"""Correctness and the dynamic anti-hacking checks, run on a GPU.

`verifier` is the trusted side (the queue handler and `verify_workspace`); `trials` its trial
loop; `candidate` the child process that runs the candidate's code; `wire` and `phases` what
passes between them. `inputs` draws the hidden inputs, `compare` and `judge` decide, `probes`,
`audit` and `precision` catch replay, decoys, precision games and the like. No timing here:
that is `timing/`.
"""
