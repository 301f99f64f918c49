"""The learner processes: one rank per GPU, holding the FSDP2-sharded actor and critic.

    rank.py           the rank process and its HTTP routes (`python -m rl.learner.rank`)
    actor_critic.py   the rank's torch side: models, optimizers, weights out, checkpoints
    update.py, ppo.py one PPO / SFT / value update over packed micro-batches, and the math
    packing.py        samples into micro-batches under a token budget
    models.py, attention.py   actor and critic over HF models, varlen attention
    fsdp.py, perf.py  sharding and activation checkpointing; FLOPs and MFU
    checkpoint.py, checkpoint_files.py, hf_export.py   resumable checkpoints and HF exports

The driver's side of the protocol is `rl/learner_client.py`; the messages are in `protocol.py`.
"""
