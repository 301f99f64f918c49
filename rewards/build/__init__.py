"""Building a candidate workspace into a loadable extension.

A bounded pool of nvcc/g++ subprocesses (`compile_pool`) and its statistics (`compile_stats`),
the toolchain it finds (`toolchain`), the build plan and its checks on what may be compiled
(`plan`), the undefined-symbol check at link time (`linker`), compiler logs cut to what the model
needs (`compiler_log`) and loading the built .so in a fresh process (`loader`). It does not judge
the kernel: that is `verify/`.
"""
