"""The trainer: it makes the agent learn from scored trajectories.

    train.py        `cuda-agent train`: recipe + dotted overrides -> one run, and the training loop
    smoke.py        `cuda-agent smoke`: the quick end-to-end run (recipe smoke, or smoke_cpu)
    recipes.py      named runs as functions returning a whole TrainConfig (config.py)
    run.py          the run's open parts: kernel env, learner ranks, engine clients, workspaces
    stages.py       the parts of a step: stage plan, rollouts, samples, update, weight sync, checkpoint
    learner_client.py  the driver's handle on the learner ranks (torchrun, HTTP commands)
    learner/        the rank processes: FSDP2 actor and critic, updates, PPO math, checkpoints,
                    and the driver <-> rank messages (learner/protocol.py)
    samples.py      the learner's unit, built from a trajectory; selection.py: rft's filter
    single_turn.py  the warm-up stage's one-reply protocol; scoring.py: scores off the real env
    weight_sync.py  new weights -> engines; metrics.py, plot.py: the step's figures and curves
    engine/         the embedded generation engine behind SGLang's HTTP API
    data/           training tasks: loaders, seed crawl, composition, decontamination
    demonstrations.py, demos/   hand-written solutions driven through the real tools (RFT, smoke)

Imports point one way: rl -> rewards -> agentcore.
"""
