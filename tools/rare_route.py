"""Chapter 17's rare route: a few RL steps of GRPO and of HARA-tok from the chapter's warm start, on
one countdown prompt with a common and a rare correct route, over several seeds.

    python tools/rare_route.py [--seeds N] [--steps N] [--out FILE]
    # default: 10 seeds, 4 steps, nbs/results/rare_route.json

Everything comes from chapter 17 (`warm_start`, `rl_step_reference`, `route_scratchpads`,
`scratchpad_logp`) and the lessons it calls; one thread, as the notebooks run. The warm start is
chapter 17's (numbers 1 to 4, 300 steps). The two likeliest correct routes of the prompt at the
warm start are its common and its rare route. Each run copies the warm start and takes
`rl_step_reference` steps (G = 8 rollouts of the prompt per step) at learning rate `LR`; GRPO and
HARA use the same seeds, so a seed's first batch is the same for both. Before the first step and
after each: log pi of each route (all its scratchpads) and the summed log-probs of the novel tokens
(where the rare route's likeliest scratchpad differs from the common route's).
tests/test_rl_lesson.py checks that a short run reproduces the file's first rows. HARA's float64
reference solves take most of the time: minutes at the defaults on one thread.
"""

import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from hara_ref.practice.cli import FlagParser  # a usage error: one line, exit code 2

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / 'nbs' / 'results' / 'rare_route.json'
COMMAND = 'python tools/rare_route.py --out nbs/results/rare_route.json'
WARM = dict(n=1000, max_number=4, p_any=0.0, steps=300, model_seed=0)  # chapter 17's warm start
PROMPT = dict(numbers=[1, 3, 2], target=6)
LR = 1e-4  # larger than the trainer's 3e-5, so that a few steps move the routes visibly
SEEDS, STEPS = 10, 4


def warm_policy():
    "Chapter 17's tokenizer and warm start."
    import torch

    from hara_ref.rlvr.countdown import countdown_demo, countdown_task
    from hara_ref.train.policy import char_tokenizer, tiny_qwen3
    from hara_ref.train.rl import warm_start

    torch.set_num_threads(1)
    tok = char_tokenizer()
    warm = tiny_qwen3(tok, seed=WARM['model_seed'])
    data = countdown_task(WARM['n'], max_number=WARM['max_number'], p_any=WARM['p_any'])
    warm_start(warm, tok, data, steps=WARM['steps'], demo=countdown_demo)
    return tok, warm


def routes(tok, warm, p) -> dict:
    "The common and the rare route: strategy, scratchpads, likeliest scratchpad; novel positions."
    import torch

    from hara_ref.rlvr.countdown import solutions
    from hara_ref.train.rl import route_scratchpads, scratchpad_logp

    found = []
    for strategy in solutions(p):
        texts = route_scratchpads(p, strategy)
        if texts:  # two-step strategies only
            lp = scratchpad_logp(warm, tok, p.prompt, texts)[0].sum(1)  # (n,)
            found.append((float(torch.logsumexp(lp, 0)), strategy, texts, texts[int(lp.argmax())]))
    found.sort(reverse=True)
    (_, s_c, t_c, best_c), (_, s_r, t_r, best_r) = found[:2]
    ids_c, ids_r = tok(best_c)['input_ids'], tok(best_r)['input_ids']
    novel = [t for t in range(len(ids_r)) if t >= len(ids_c) or ids_r[t] != ids_c[t]]
    return dict(
        common=dict(strategy=s_c, texts=t_c, text=best_c),
        rare=dict(strategy=s_r, texts=t_r, text=best_r),
        novel=novel,
    )


def measure(tok, model, p, r) -> dict:
    "log pi of each route and of the rare scratchpad's novel tokens."
    import torch

    from hara_ref.train.rl import scratchpad_logp

    out = {}
    for name in ('common', 'rare'):
        lp = scratchpad_logp(model, tok, p.prompt, r[name]['texts'])[0]  # (n, T)
        out[name] = float(torch.logsumexp(lp.sum(1), 0))
    lp = scratchpad_logp(model, tok, p.prompt, [r['rare']['text']])[0][0]  # (T,)
    out['novel'] = float(lp[r['novel']].sum())
    return out


def run(seeds, steps: int, tok=None, warm=None) -> dict:
    "The sweep: for each method and seed, the measures before the first step and after each."
    import copy

    import torch

    from hara_ref.rlvr.countdown import Countdown, countdown_reward, countdown_strategy
    from hara_ref.train.policy import pad_id
    from hara_ref.train.rl import rl_step_reference

    if warm is None:
        tok, warm = warm_policy()
    p = Countdown(tuple(PROMPT['numbers']), PROMPT['target'])
    r = routes(tok, warm, p)
    runs = {}
    for credit in ('grpo', 'hara'):
        runs[credit] = []
        for seed in seeds:
            t0 = time.perf_counter()
            m = copy.deepcopy(warm)
            opt = torch.optim.AdamW(m.parameters(), lr=LR, weight_decay=0.0)
            g = torch.Generator().manual_seed(seed)
            ms, rare, correct = [measure(tok, m, p, r)], [], []
            for _ in range(steps):
                out = rl_step_reference(m, opt, tok, [p], countdown_reward, g, credit)
                ri, rm = out['rollouts'][2:]
                texts = tok.batch_decode(torch.where(rm, ri, pad_id(tok)), skip_special_tokens=True)
                strategies = [countdown_strategy(t, p.answer) for t in texts]
                rare.append(strategies.count(r['rare']['strategy']))
                correct.append(int(out['rewards'].sum()))
                ms.append(measure(tok, m, p, r))
            log_p = {k: [x[k] for x in ms] for k in ('common', 'rare', 'novel')}
            runs[credit].append(dict(seed=seed, log_p=log_p, sampled_rare=rare, correct=correct))
            print(f"{credit} seed {seed}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    routes_out = {k: dict(strategy=r[k]['strategy'], text=r[k]['text']) for k in ('common', 'rare')}
    return dict(prompt=PROMPT, routes=routes_out, novel=r['novel'], runs=runs)


def main(argv=None) -> int:
    ap = FlagParser(prog='rare_route.py', description=__doc__.splitlines()[0])
    ap.add_argument('--seeds', type=int, default=SEEDS, help='seeds 0..N-1 (default %(default)s)')
    ap.add_argument('--steps', type=int, default=STEPS, help='RL steps (default %(default)s)')
    ap.add_argument('--out', default=str(OUT), help='the JSON file written')
    a = ap.parse_args(argv)
    if a.seeds < 2:
        ap.error(f'--seeds must be at least 2 (an interval needs two), got {a.seeds}')
    if a.steps < 1:
        ap.error(f'--steps must be at least 1, got {a.steps}')
    if not Path(a.out).parent.is_dir():
        ap.error(f'--out: no folder {Path(a.out).parent}')
    t0 = time.perf_counter()
    res = run(range(a.seeds), a.steps)
    commit = subprocess.run(
        ['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    head = dict(
        command=COMMAND,
        measured_on=f"{time.strftime('%Y-%m-%d')}, code {commit}+",
        machine=f"{platform.platform()}, one thread",
        warm=WARM,
        lr=LR,
        steps=a.steps,
        seeds=a.seeds,
        wall_s=round(time.perf_counter() - t0),
    )
    Path(a.out).write_text(json.dumps({**head, **res}, indent=1) + '\n')
    print(f"wrote {a.out}")
    return 0


if __name__ == '__main__':
    sys.exit(main())
