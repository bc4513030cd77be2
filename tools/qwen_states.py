"""Real hidden states of the tiny Qwen3 that `make train` trained, on held-out prompts: a small
fixture for benchmarks of HARA's barycenter.

    python tools/qwen_states.py [--run DIR | --checkpoint PATH] [--prompts 8] [--samples 16]
                                [--seed 0] [--out nbs/results/qwen_states.pt]

The checkpoint defaults to the newest `runs/*/runs/grpo+hara-tok-s0/final` (`--run DIR`: that
run's). Rollouts are drawn as the trainer draws them (chapter 44's `sample_prompts`, with the run's
`temperature`, `max_new_tokens` and `max_prompt_len` from its `train_config.json`), scored with the
task's verifier (`rewards_of`), and their hidden states are the ones the trainer gives HARA:
`policy_forward(..., hidden_layer)` on the response tokens, with the response mask. The prompts are
the first `--prompts` of the run's held-out evaluation split (`experiment_items`), never a training
prompt. The file holds a dict: hidden (B, T, d) float16 (zero on padding), mask (B, T) bool,
response_ids (B, T) long, rewards (B,) float32, prompt_ids (B,) long (rollout b answers prompt
b // samples) and meta.
Offline, on the CPU, from local paths only.
"""

import datetime
import json
import os
import sys
from pathlib import Path
from hara_ref.practice.cli import FlagParser  # a usage error: one line, exit code 2

for _k, _v in dict(HF_HUB_OFFLINE='1', TRANSFORMERS_OFFLINE='1').items():
    os.environ.setdefault(_k, _v)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / 'nbs' / 'results' / 'qwen_states.pt'
VARIANT = 'grpo+hara-tok-s0'  # the run whose `final/` checkpoint is read by default
MAX_BYTES = 1_500_000  # the committed fixture stays under this size


def newest_checkpoint(root=ROOT / 'runs', variant: str = VARIANT) -> Path:
    "The newest `root/*/runs/<variant>/final` (by run folder name), or a FileNotFoundError."
    found = sorted(Path(root).glob(f'*/runs/{variant}/final'))
    if not found:
        raise FileNotFoundError(f"no {root}/*/runs/{variant}/final checkpoint: run `make train`")
    return found[-1]


def run_settings(checkpoint) -> tuple:
    """The run's training settings (a `TrainConfig`) and experiment settings (a dict), read from
    `train_config.json` beside `checkpoint` and the experiment's `config.json` two folders up; the
    defaults (built-in countdown task) where a file is missing."""
    from hara_ref.trainer.step import TrainConfig

    ckpt = Path(checkpoint)
    tc, ex = ckpt.parent / 'train_config.json', ckpt.parent.parent.parent / 'config.json'
    train = TrainConfig(**json.loads(tc.read_text())) if tc.exists() else TrainConfig()
    exp = json.loads(ex.read_text())['experiment'] if ex.exists() else dict(task='countdown')
    return train, exp


def heldout_items(exp: dict, n: int, eval_prompts: int = 100) -> tuple:
    """The first `n` of the experiment's `eval_prompts` held-out items and the task's reward; a
    ValueError when there are fewer, or when one is also a training prompt."""
    from hara_ref.trainer.experiment import ExperimentConfig, experiment_items

    keep = ('task', 'n_terms', 'max_value', 'sft_shuffle', 'data', 'heldout_frac')
    ex = ExperimentConfig(out='unused', **{k: v for k, v in exp.items() if k in keep})
    train, held, reward_fn = experiment_items(ex, max(eval_prompts, n))
    if len(held) < n:
        raise ValueError(f"--prompts {n}: the held-out split has only {len(held)} prompts")
    items, seen = held[:n], {it['prompt'] for it in train}
    if any(it['prompt'] in seen for it in items):
        raise ValueError('a held-out prompt is also a training prompt')
    return items, reward_fn


def collect_states(model, tokenizer, items: list, samples: int, cfg, reward_fn, seed: int = 0):
    """`samples` rollouts of each item, drawn and scored as the trainer does, with the hidden states
    it gives HARA (`cfg.hidden_layer`): a dict of hidden (B, T, d) float16 (zero on padding), mask
    (B, T) bool, response_ids (B, T) long (padding: the pad id), rewards (B,) float32, prompt_ids
    (B,) long, with B = len(items) * samples; rollout b answers items[b // samples]."""
    import torch

    from hara_ref.train.policy import pad_id, policy_forward
    from hara_ref.train.sft import rewards_of
    from hara_ref.trainer.step import sample_prompts

    prompts = [it['prompt'] for it in items for _ in range(samples)]
    answers = [it['answer'] for it in items for _ in range(samples)]
    gen = torch.Generator(device=model.device).manual_seed(seed)
    pi, pm, ri, rm = sample_prompts(model, tokenizer, prompts, cfg, gen)  # (B, P), (B, T)
    rewards = rewards_of(tokenizer, ri, rm, answers, reward_fn)[0]  # (B,)
    with torch.no_grad():
        hidden = policy_forward(model, pi, pm, ri, rm, cfg.hidden_layer)[2]  # (B, T, d)
    hidden = torch.where(rm[..., None], hidden.float(), 0.0).to(torch.float16)  # (B, T, d)
    return dict(
        hidden=hidden.cpu(),
        mask=rm.bool().cpu(),
        response_ids=torch.where(rm, ri, pad_id(tokenizer)).cpu(),
        rewards=rewards.float().cpu(),
        prompt_ids=torch.arange(len(items)).repeat_interleave(samples),
    )


def participation_ratio(hidden, mask) -> float:
    "sum(eig)^2 / sum(eig^2) of the covariance of the (B, T, d) hidden states' real tokens."
    import torch

    x = hidden[mask].double()  # (N, d)
    x = x - x.mean(0)
    eig = torch.linalg.eigvalsh(x.T @ x / max(len(x) - 1, 1)).clamp(min=0)  # (d,)
    return float(eig.sum() ** 2 / (eig**2).sum())


def summary(states: dict) -> str:
    "B, the range of response lengths, d, the participation ratio, the correct share per prompt."
    h, m, r, p = states['hidden'], states['mask'], states['rewards'], states['prompt_ids']
    L, n = m.sum(1), int(p.max()) + 1
    share = [round(float(r[p == i].mean()), 3) for i in range(n)]
    return (
        f"B={h.shape[0]} ({n} prompts x {h.shape[0] // n} samples), T={h.shape[1]}, "
        f"lengths {int(L.min())}..{int(L.max())}, d={h.shape[2]}, "
        f"participation ratio {participation_ratio(h, m):.2f}, correct {float(r.mean()):.3f}\n"
        f"correct share per prompt: {share}"
    )


def parse(argv=None):
    "The command line, checked before any work: a usage error exits 2, one line naming the flag."
    ap = FlagParser(description=__doc__.splitlines()[0])
    where = ap.add_mutually_exclusive_group()
    where.add_argument('--run', help=f"a `make train` run folder: reads runs/{VARIANT}/final")
    where.add_argument('--checkpoint', help='a save_pretrained folder (default: newest run)')
    ap.add_argument('--prompts', type=int, default=8, help='held-out prompts')
    ap.add_argument('--samples', type=int, default=16, help='rollouts per prompt')
    ap.add_argument('--seed', type=int, default=0, help='sampling seed')
    ap.add_argument('--out', default=str(OUT.relative_to(ROOT)), help='the .pt file to write')
    a = ap.parse_args(argv)
    for flag in ('prompts', 'samples'):
        if getattr(a, flag) < 1:
            ap.error(f"--{flag} must be at least 1, got {getattr(a, flag)}")
    if a.seed < 0:
        ap.error(f"--seed must be >= 0, got {a.seed}")
    if a.run is not None:
        if not Path(a.run).is_dir():
            ap.error(f"--run {a.run}: no such folder")
        a.checkpoint = str(Path(a.run) / 'runs' / VARIANT / 'final')
        if not (Path(a.checkpoint) / 'config.json').exists():
            ap.error(f"--run {a.run}: no checkpoint {a.checkpoint}/config.json")
    elif a.checkpoint is not None and not (Path(a.checkpoint) / 'config.json').exists():
        ap.error(f"--checkpoint {a.checkpoint}: no config.json there")
    if not Path(a.out).resolve().parent.is_dir():
        ap.error(f"--out {a.out}: its folder does not exist")
    return a


def main(argv=None) -> int:
    a = parse(argv)
    import torch
    import transformers

    from hara_ref.trainer.loop import load_policy

    torch.set_num_threads(1)
    ckpt = Path(a.checkpoint) if a.checkpoint else newest_checkpoint()
    cfg, exp = run_settings(ckpt)
    try:
        items, reward_fn = heldout_items(exp, a.prompts, cfg.eval_prompts)
    except ValueError as e:  # too many --prompts: a usage error, found before anything is written
        sys.stderr.write(f"qwen_states.py: {e}\n")
        return 2
    model, tok = load_policy(ckpt, 'cpu', 'fp32')
    states = collect_states(model.eval(), tok, items, a.samples, cfg, reward_fn, a.seed)
    try:
        shown = str(ckpt.resolve().relative_to(ROOT))
    except ValueError:
        shown = str(ckpt)
    states['meta'] = dict(
        checkpoint=shown,
        command=' '.join(
            ['python tools/qwen_states.py', *(sys.argv[1:] if argv is None else argv)]
        ),
        seed=a.seed,
        layer=cfg.hidden_layer,
        temperature=cfg.temperature,
        max_new_tokens=cfg.max_new_tokens,
        task=exp.get('task'),
        split=f"held out: the first {a.prompts} of experiment_items' held-out prompts (the "
        f"trainer evaluates on the first {cfg.eval_prompts})",
        prompts=[it['prompt'] for it in items],
        answers=[str(it['answer']) for it in items],
        torch=str(torch.__version__),
        transformers=str(transformers.__version__),
        date=datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC'),
    )
    torch.save(states, a.out)
    size = Path(a.out).stat().st_size
    print(summary(states))
    print(f"wrote {a.out}: {size} bytes")
    if size > MAX_BYTES:
        print(f"{a.out} is over {MAX_BYTES} bytes: rerun with fewer --prompts", file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
