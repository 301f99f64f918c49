"""A record, not a maintained tool: which half of a PPO update on log-softmax at s1 moves softmax's formula in
the softmax s3 context (SmolLM2-135M, CPU)? The failing samples pushed down, or the passing ones pushed up; and
PPO with `ppo.sft_coef` C. Variants KEEP:C (KEEP: all, neg or pos), from the 12 SFT steps or from the weights a
first run saved:  python leak_halves.py neg:0,pos:0 2   then   python leak_halves.py all:10 2 /tmp/probe39/post_sft.pt"""
import copy
import sys
import time

import torch
from transformers import AutoTokenizer

import rl.learner.update as upd
from agentcore.store import read_trajectories
from rl.learner.models import ModelConfig, build_actor, build_critic
from rl.learner.update import PPOConfig, ppo_step, sft_step
from rl.samples import sample_from_trajectory

torch.manual_seed(0)
torch.set_num_threads(2)
R = 'bench/results/smoke/h200_2026-11-29_run22/sibling_leak_cpu/rollouts'
PATH = '/root/.cache/cuda-agent/models/smollm2-135m'
tok = AutoTokenizer.from_pretrained(PATH)
DEMO_TASKS = ['fam_norm_softmax_s0', 'fam_norm_log_softmax_s0', 'fam_norm_rmsnorm_s0']
demos = [sample_from_trajectory(t) for t in read_trajectories(R + '/rft_demos.jsonl') if t.task_id in DEMO_TASKS]
group = [t for t in read_trajectories(R + '/ppo_000063.jsonl') if t.task_id == 'fam_norm_log_softmax_s1']
print('group rewards', [t.reward for t in group], flush=True)
rollouts = [sample_from_trajectory(t) for t in group]
held = {t.task_id: t for t in read_trajectories(R + '/heldout_after_rft.jsonl')}


def span(traj, needle):
    ids = list(traj.prompt_ids) + list(traj.response_ids)
    pieces = [tok.decode([i]) for i in ids]
    text, starts = '', []
    for p in pieces:
        starts.append(len(text))
        text += p
    c = text.find(needle, len(tok.decode(list(traj.prompt_ids))))
    assert c >= 0, needle
    first = max(i for i, s in enumerate(starts) if s <= c)
    last = max(i for i, s in enumerate(starts) if s < c + len(needle))
    return ids, first, last + 1


def swapped(traj, needle, other):
    """The trajectory's ids up to the needle's first token, then `other`'s tokens in its place."""
    ids, a, b = span(traj, needle)
    prefix = tok.decode(ids[a:a + 1])[: len(tok.decode(ids[a:a + 1])) - len(tok.decode(ids[a:a + 1]).lstrip())]
    alt = tok.encode(prefix + other, add_special_tokens=False)
    return ids[:a] + alt, a, a + len(alt)


SOFT, LOGS = 'expf(v - m) / s;', 'v - m - logf(s);'
probes = [('softmax_s3:own', span(held['fam_norm_softmax_s3'], SOFT)),
          ('softmax_s3:sibling', swapped(held['fam_norm_softmax_s3'], SOFT, LOGS)),
          ('log_softmax_s3:own', span(held['fam_norm_log_softmax_s3'], LOGS)),
          ('log_softmax_s3:sibling', swapped(held['fam_norm_log_softmax_s3'], LOGS, SOFT))]


def probe(actor):
    out = {}
    with torch.no_grad():
        for name, (ids, a, b) in probes:
            lp = torch.log_softmax(actor.lm(input_ids=torch.tensor([ids])).logits[0].float(), -1)
            out[name] = round(float(sum(lp[i - 1, ids[i]] for i in range(a, b))), 3)
    return out


original = upd.group_advantages


def halves(keep):
    """group_advantages with the other half's advantages zeroed: keep 'neg' or 'pos' or 'all'."""
    def wrapped(samples, by_group):
        advs = original(samples, by_group)
        out = []
        for a in advs:
            sign = float(a.sum())
            on = keep == 'all' or (keep == 'neg' and sign < 0) or (keep == 'pos' and sign > 0)
            out.append(a if on else a * 0)
        return out
    return wrapped


cfg = ModelConfig(path=PATH, gradient_checkpointing=False)
actor = build_actor(cfg, 'cpu')
critic = build_critic(cfg, 'cpu')
opt = torch.optim.AdamW(actor.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.0)
t0 = time.time()
if len(sys.argv) > 3:
    saved = torch.load(sys.argv[3])
    actor.load_state_dict(saved['actor'])
    opt.load_state_dict(saved['opt'])
    del saved
else:
    for k in range(12):
        for g in opt.param_groups:
            g['lr'] = 1e-4 * (1 - k / 12)
        m = sft_step(actor, opt, demos, PPOConfig(token_budget=8192), 'cpu')
        print('sft', k, round(m['sft_loss'], 4), round(time.time() - t0), flush=True)
    torch.save({'actor': actor.state_dict(), 'opt': opt.state_dict()}, '/tmp/probe39/post_sft.pt')
print('after sft', probe(actor), flush=True)
state = copy.deepcopy(actor.state_dict())
ostate = copy.deepcopy(opt.state_dict())
for variant in sys.argv[1].split(','):
    keep, coef = variant.split(':')[0], float(variant.split(':')[1])
    actor.load_state_dict(state)
    opt.load_state_dict(ostate)
    for g in opt.param_groups:
        g['lr'] = 1e-5
    copt = torch.optim.AdamW(critic.parameters(), lr=1e-5)
    upd.group_advantages = halves(keep)
    pcfg = PPOConfig(token_budget=8192, baseline='group', lam=1.0, sft_coef=coef)
    for step in range(int(sys.argv[2])):
        m = ppo_step(actor, critic, opt, copt, rollouts, pcfg, 'cpu', temperature=0.7,
                     demonstrations=demos if coef > 0 else ())
        print('keep', keep, 'coef', coef, 'step', step, probe(actor), 'sft_loss',
              round(m.get('sft_loss', float('nan')), 4), round(time.time() - t0), flush=True)
