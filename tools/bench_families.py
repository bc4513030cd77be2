"""HARA's cost and precision on each family of hidden states, the plain outer step against the
quasi-Newton one, measured side by side in one run.

    python tools/bench_families.py [--shapes 16x256x512 ...] [--ranks 4 8 16 64] [--repeat 3]
                                    [--out FILE.json]

For each family (chapter 01's `hidden_family`: planted stages, isotropic, low rank + 5 % noise) and
each shape B x T x d (one prompt of B rollouts, half correct), and for the real hidden states of the
tiny Qwen3 that `make train` trained (`nbs/results/qwen_states.pt`, `tools/qwen_states.py`: 8
held-out prompts x 16 rollouts, their own rewards), and for each outer solver of the
barycenter (`bary_kw=dict(outer=...)`: 'plain', the fixed point Z <- Φ(Z); 'lbfgs', the default),
`hara_advantages` at its defaults on one thread: its time (the median of `repeat` calls, the two
solvers' calls alternating, each call's time kept too) and the part of it spent in the barycenter
(`group_barycenters` with its final plans; the rest is the features, the medians and the
weights), the barycenter iterations (plan
solves) of each outcome group, whether a group met the cap, each group's objective F and residual
max|Φ(Z) - Z|, and how far its weights are from a 100x tighter solve by the same solver (barycenter
tolerance 100x smaller, final plans 100x tighter, cap raised), which continues the same iteration
from where the default stopped: the solve that certifies the default's answer. The two solvers
may stop at different stationary points of the objective: each row also gives their weights'
distance and the objective's relative difference per group. All calls run in one process.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import subprocess
import time
import warnings
from pathlib import Path

import torch

import hara_ref
import hara_ref.engine.novelty as novelty
from hara_ref.engine.novelty import BARY_DEFAULTS, PLAN_DEFAULTS
from hara_ref.rlvr.data import hidden_family

ROOT = Path(__file__).resolve().parent.parent
QWEN = ROOT / 'nbs' / 'results' / 'qwen_states.pt'  # the tiny Qwen3's states, 8 prompts x 16


def batch(family: str, B: int, T: int, d: int, rank: int, seed: int = 0) -> tuple:
    "One prompt of B rollouts of T tokens, half of them correct: hidden, mask, rewards, group ids."
    hidden = hidden_family(family, B, T, d, rank=rank, seed=seed, dtype=torch.float32)  # (B, T, d)
    mask = torch.ones(B, T, dtype=torch.bool)  # (B, T)
    rewards = (torch.arange(B) < B // 2).float()  # (B,)
    return hidden, mask, rewards, torch.zeros(B, dtype=torch.long)


def weights(rw) -> torch.Tensor:
    return rw.weights.double()  # (B, T)


def call(h, m, r, g, outer: str, tight: bool = False, parts: dict | None = None) -> tuple:
    """One `hara_advantages` call: seconds, its result, the warnings it raised; with `parts`, also
    the seconds spent in the barycenter (`group_barycenters`, its final plans included) go there
    as parts['barycenter']: the rest of the call (features, medians, weights) is the difference."""
    kw = dict(bary_kw=dict(outer=outer))
    inner, spent = novelty.group_barycenters, []

    def timed_barycenters(*a, **k):
        t0 = time.perf_counter()
        out = inner(*a, **k)
        spent.append(time.perf_counter() - t0)
        return out

    if tight:
        kw['bary_kw'].update(
            tol=BARY_DEFAULTS['tol'] / 100, max_iter=20 * BARY_DEFAULTS['max_iter']
        )
        kw['plan_kw'] = dict(stop_thr=PLAN_DEFAULTS['stop_thr'] / 100)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        if parts is not None:
            novelty.group_barycenters = timed_barycenters
        try:
            t = time.perf_counter()
            _, rw = hara_ref.hara_advantages(h, m, r, g, **kw)
            secs = time.perf_counter() - t
        finally:
            novelty.group_barycenters = inner
    if parts is not None:
        parts['barycenter'] = sum(spent)
    return secs, rw, sorted({str(w.message)[:80] for w in caught})


def qwen_batch(path: Path) -> tuple:
    "The tiny Qwen3's hidden states (`tools/qwen_states.py`): hidden, mask, rewards, prompt ids."
    x = torch.load(path)
    return x['hidden'].float(), x['mask'], x['rewards'], x['prompt_ids']


def row(
    family: str, B: int, T: int, d: int, rank: int, tight_plain: bool = True, repeat: int = 1
) -> dict:
    "One batch: `repeat` timed calls of each outer step, alternating; the tight solves once."
    if family == 'qwen-tiny':
        h, m, r, g = qwen_batch(QWEN)
        B, T, d = h.shape
    else:
        h, m, r, g = batch(family, B, T, d, rank)
    out = dict(family=family if family != 'lowrank' else f'lowrank-{rank}', shape=f'{B}x{T}x{d}')
    # outer: [(seconds, result, warnings, {'barycenter': seconds})] in call order
    timed = {'plain': [], 'lbfgs': []}
    for _ in range(repeat):
        for outer in timed:
            parts = {}
            timed[outer].append((*call(h, m, r, g, outer, parts=parts), parts))
    for outer, calls in timed.items():
        _, rw, warned, _ = calls[0]  # the same iterations and weights every time (deterministic)
        nov = rw.novelty
        iters = [int(x) for x in nov.bary_iters_group]
        res = dict(
            seconds=round(statistics.median_low(c[0] for c in calls), 3),  # a measured call
            seconds_each=[round(c[0], 3) for c in calls],
            # the seconds of those calls spent in the barycenter, their median
            barycenter_seconds=round(statistics.median_low(c[3]['barycenter'] for c in calls), 3),
            barycenter_each=[round(c[3]['barycenter'], 3) for c in calls],
            iterations=iters,
            at_cap=[i >= BARY_DEFAULTS['max_iter'] for i in iters],
            objective=[float(x) for x in nov.bary_objective],
            residual=[float(x) for x in nov.bary_residual],
            warned=warned,
        )
        if outer == 'lbfgs' or tight_plain:
            _, rw_t, _ = call(h, m, r, g, outer, tight=True)
            res.update(
                tight_iterations=[int(x) for x in rw_t.novelty.bary_iters_group],
                weight_gap=float((weights(rw) - weights(rw_t)).abs().max()),
            )
        out[outer], out[outer + '_weights'] = res, weights(rw)
    wp, wl = out.pop('plain_weights'), out.pop('lbfgs_weights')
    out['weights_apart'] = float((wp - wl).abs().max())  # the two stationary points' weights
    Fp, Fl = out['plain']['objective'], out['lbfgs']['objective']
    out['objective_change'] = [(b - a) / abs(a) for a, b in zip(Fp, Fl)]  # relative, per group
    out['solves_ratio'] = sum(out['plain']['iterations']) / sum(out['lbfgs']['iterations'])
    out['time_ratio'] = out['plain']['seconds'] / out['lbfgs']['seconds']
    return out


def show(r: dict) -> None:
    p, q = r['plain'], r['lbfgs']
    gap = lambda x: f"{x['weight_gap']:.1e}" if 'weight_gap' in x else '-'
    print(
        f"{r['family']:12s} {r['shape']:>12s} plain {p['seconds']:7.2f} s {p['iterations']} "
        f"cap {any(p['at_cap'])} gap {gap(p)} | lbfgs {q['seconds']:6.2f} s {q['iterations']} "
        f"cap {any(q['at_cap'])} gap {gap(q)} | {r['solves_ratio']:.1f}x solves, "
        f"{r['time_ratio']:.1f}x time, F {max(r['objective_change']):+.2%}, "
        f"weights apart {r['weights_apart']:.1e}",
        flush=True,
    )


def provenance(script: str, argv) -> dict:
    "How a run was made: its command, code (+: with changes not committed), machine, threads, date."
    git = lambda *a: subprocess.run(['git', *a], cwd=ROOT, capture_output=True, text=True).stdout
    code = git('rev-parse', '--short', 'HEAD').strip()
    code += '+' if git('status', '--porcelain', '--untracked-files=no').strip() else ''
    cpu = [x for x in Path('/proc/cpuinfo').read_text().splitlines() if 'model name' in x]
    return dict(
        command=' '.join([f'python {script}', *(argv or sys.argv[1:])]),
        code=code,
        machine=(cpu[0].split(':', 1)[1].strip() if cpu else platform.machine())
        + f', {os.cpu_count()} cores',
        threads=1,
        measured_on=time.strftime('%Y-%m-%d'),
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--shapes', nargs='+', default=['16x256x512'], help='B x T x d of each batch')
    p.add_argument('--ranks', nargs='+', type=int, default=[4, 8, 16, 64], help="'lowrank' ranks")
    p.add_argument('--no-tight-plain', action='store_true', help="no tight solve of 'plain'")
    p.add_argument('--repeat', type=int, default=3, help='timed calls of each outer step (median)')
    p.add_argument('--out', type=Path, help='write the rows and how they were measured (JSON)')
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for shape in a.shapes:
        B, T, d = (int(x) for x in shape.split('x'))
        cases = [('planted', 16), ('isotropic', 16)] + [('lowrank', k) for k in a.ranks]
        for family, rank in cases:
            rows.append(row(family, B, T, d, rank, not a.no_tight_plain, a.repeat))
            show(rows[-1])
    if QWEN.exists():  # the real hidden states of the trained tiny Qwen3, at their own shape
        rows.append(row('qwen-tiny', 0, 0, 0, 0, not a.no_tight_plain, a.repeat))
        show(rows[-1])
    if a.out:
        meta = provenance('tools/bench_families.py', argv)
        # repeat: timed calls of each outer step, 'seconds' their median
        a.out.write_text(json.dumps(dict(meta, repeat=a.repeat, rows=rows), indent=1) + '\n')


if __name__ == '__main__':
    main()
