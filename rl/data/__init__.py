"""Training-task data: loaders, seed operators, compositions and KernelBench decontamination.

Flow: `seeds` (torch ops as one-op tasks) -> `compose` (chains of 1-5 ops) -> runtime filters
(GPU, later) -> `similarity.decontaminate` against KernelBench L1-3 -> a dataset file that
`loaders.load_dataset_jsonl` reads back. `loaders` also reads KernelBench and Ops-6K parquet.
"""
