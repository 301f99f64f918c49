"""A record, not a maintained tool: does a PPO update on log-softmax at s1 move softmax's formula in the softmax s3 context (SmolLM2-135M, CPU)? See README.md here."""
import sys, time, copy
import torch
from agentcore.store import read_trajectories
from rl.learner.models import ModelConfig, build_actor, build_critic
from rl.learner.update import PPOConfig, ppo_step, sft_step
from rl.samples import sample_from_trajectory
import msgspec
from transformers import AutoTokenizer

torch.manual_seed(0)
torch.set_num_threads(2)
R = sys.argv[5] if len(sys.argv) > 5 else 'bench/results/smoke/h200_2026-11-29_run22/sibling_leak_cpu/rollouts'
PATH = '/root/.cache/cuda-agent/models/smollm2-135m'
tok = AutoTokenizer.from_pretrained(PATH)
DEMO_TASKS = sys.argv[1].split(',')
demos = [sample_from_trajectory(t) for t in read_trajectories(R + '/rft_demos.jsonl') if t.task_id in DEMO_TASKS]
print('demos', [len(s.token_ids) for s in demos], flush=True)
group = [t for t in read_trajectories(R + '/ppo_000063.jsonl') if t.task_id == 'fam_norm_log_softmax_s1']
print('group rewards', [t.reward for t in group])
rollouts = [sample_from_trajectory(t) for t in group]
held = {t.task_id: t for t in read_trajectories(R + '/heldout_after_rft.jsonl')}

def span(traj, needle):
    ids = list(traj.prompt_ids) + list(traj.response_ids)
    pieces = [tok.decode([i]) for i in ids]
    text, starts = '', []
    for p in pieces:
        starts.append(len(text)); text += p
    c = text.find(needle, len(tok.decode(list(traj.prompt_ids))))
    assert c >= 0, needle
    first = max(i for i, s in enumerate(starts) if s <= c)
    last = max(i for i, s in enumerate(starts) if s < c + len(needle))
    return ids, first, last + 1

PROBES = [('softmax_s3', held['fam_norm_softmax_s3'], 'expf(v - m) / s;'),
          ('log_softmax_s3', held['fam_norm_log_softmax_s3'], 'v - m - logf(s);')]
probes = [(name, *span(t, needle)) for name, t, needle in PROBES]

def probe(actor):
    out = {}
    with torch.no_grad():
        for name, ids, a, b in probes:
            x = torch.tensor([ids])
            logits = actor.lm(input_ids=x).logits[0].float()
            lp = torch.log_softmax(logits, -1)
            out[name] = round(float(sum(lp[i - 1, ids[i]] for i in range(a, b))), 4)
    return out

cfg = ModelConfig(path=PATH, gradient_checkpointing=False)
actor = build_actor(cfg, 'cpu')
critic = build_critic(cfg, 'cpu')
print('base', probe(actor), flush=True)
opt = torch.optim.AdamW(actor.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.0)
t0 = time.time()
for k in range(int(sys.argv[2])):
    for g in opt.param_groups: g['lr'] = 1e-4 * (1 - k / int(sys.argv[2]))
    m = sft_step(actor, opt, demos, PPOConfig(token_budget=8192), 'cpu')
    print('sft', k, round(m['sft_loss'], 4), round(time.time() - t0), flush=True)
print('after sft', probe(actor), flush=True)
state = copy.deepcopy(actor.state_dict()); ostate = copy.deepcopy(opt.state_dict())
for coef in [float(c) for c in sys.argv[3].split(',')]:
    actor.load_state_dict(state); opt.load_state_dict(ostate)
    for g in opt.param_groups: g['lr'] = 1e-5
    copt = torch.optim.AdamW(critic.parameters(), lr=1e-5)
    pcfg = PPOConfig(token_budget=8192, baseline='group', lam=1.0, sft_coef=coef)
    for step in range(int(sys.argv[4])):
        m = ppo_step(actor, critic, opt, copt, rollouts, pcfg, 'cpu', temperature=0.7,
                     demonstrations=demos if coef > 0 else ())
        print('coef', coef, 'step', step, probe(actor), 'sft_loss', round(m.get('sft_loss', float('nan')), 4), flush=True)
