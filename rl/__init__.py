"""The learner: it makes the agent learn from scored trajectories.

    train.py        `cuda-agent train`: recipe + dotted overrides -> one run (smoke.py: the quick one)
    recipes.py      named runs as functions returning a whole TrainConfig (config.py)
    run.py          the run's open parts: kernel env, learner ranks, engine clients, metrics
    stages.py       the plan: single_turn | rft | value | ppo, resumable at any step
    learner_client.py  the driver's handle on the ranks (torchrun, HTTP commands)
    rank.py         one learner rank: FSDP2 shard + colocated embedded engine + HTTP server
    learner.py      the rank's torch side: actor, critic, optimizers, weights out, checkpoints
    update.py       one PPO / SFT / value update over packed micro-batches (ppo.py: the math)
    models.py       actor and critic over HF models; packing.py, samples.py: the batch
    fsdp.py, checkpoint.py, weight_sync.py, metrics.py, plot.py
    engine/         the embedded generation engine behind SGLang's HTTP API
    data/           training tasks: loaders, seed crawl, composition, decontamination
    demonstrations.py, demos/   hand-written solutions driven through the real tools (RFT, smoke)

Imports point one way: rl -> rewards -> agentcore.
"""
