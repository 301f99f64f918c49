"""Static rules: what a candidate's sources may contain, decided without running them.

`checks.check_workspace` reads model_new.py (`python`, `pyexpr`, `pyfacts`, `pyscope`: an `ast`
walk) and the kernel sources (`cpp`: a comment- and string-stripping lexer); `policy` holds the
tables of what is allowed; `lint` runs them over a solution or a folder of them without building
(`cuda-agent eval --static-only`). These rules make the obvious cheats cheap to reject; they
prove nothing, which is why `verify/` runs the dynamic checks on the GPU.
"""
