"""When the quasi-Newton outer step should take over from the plain one: the barycenter's solves
and objective at each value of `LBFGS['switch']`, measured side by side in one run.

    python tools/bench_switch.py [--shape 16x256x512] [--ranks 4 8 16 32] [--seeds 0 1 2]
                                 [--switches 0.01 0.03 0.1 0.3] [--out FILE.json]

`group_barycenters(outer='lbfgs')` takes plain steps Z <- Φ(Z) until the residual falls below
`switch` (or for `plain_steps` steps), then L-BFGS (chapter 33). For every low-rank batch (rank x
seed, one prompt of B rollouts, half correct, chapter 01's `hidden_family`), for planted and
isotropic states and for the tiny Qwen3's real states (`nbs/results/qwen_states.pt`), one
`hara_advantages` call at its defaults on one thread with the plain outer step, then one with
the quasi-Newton step at each `switch`: the plan solves of each outcome group, whether a group
met the cap, and each group's objective relative to the plain step's (negative: a lower
stationary point). The summary gives, per `switch`, the solves over all batches and the mean and
largest relative objective.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

from hara_ref.engine.bary_steps import LBFGS, lbfgs_settings
from hara_ref.engine.novelty import BARY_DEFAULTS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_families import QWEN, batch, call, provenance, qwen_batch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def solve(h, m, r, g, outer: str) -> dict:
    "One `hara_advantages` call (`bench_families.call`): seconds, solves, objective, caps, warned."
    secs, rw, warned = call(h, m, r, g, outer)
    its = [int(x) for x in rw.novelty.bary_iters_group]
    return dict(
        seconds=round(secs, 3),
        solves=its,
        at_cap=[i >= BARY_DEFAULTS['max_iter'] for i in its],
        objective=[float(x) for x in rw.novelty.bary_objective.double()],
        warned=warned,
    )


def instance(name: str, data: tuple, switches: list) -> dict:
    "The plain step, then the quasi-Newton step at each switch, on one batch."
    out = dict(name=name, plain=solve(*data, 'plain'), lbfgs={})
    F0 = out['plain']['objective']
    for sw in switches:
        with lbfgs_settings(switch=sw):
            res = solve(*data, 'lbfgs')
        res['objective_change'] = [(b - a) / abs(a) for a, b in zip(F0, res['objective'])]
        out['lbfgs'][str(sw)] = res
    return out


def summary(rows: list, switches: list) -> dict:
    "Per switch: solves over all batches, mean and largest relative objective, caps."
    out = {'plain': dict(solves=sum(sum(r['plain']['solves']) for r in rows))}
    out['plain']['at_cap'] = sum(sum(r['plain']['at_cap']) for r in rows)
    for sw in map(str, switches):
        ch = [x for r in rows for x in r['lbfgs'][sw]['objective_change']]
        out[sw] = dict(
            solves=sum(sum(r['lbfgs'][sw]['solves']) for r in rows),
            at_cap=sum(sum(r['lbfgs'][sw]['at_cap']) for r in rows),
            objective_mean=sum(ch) / len(ch),
            objective_max=max(ch),
            groups=len(ch),
        )
    return out


def show(r: dict) -> None:
    p = r['plain']
    parts = [f"{r['name']:14s} plain {sum(p['solves']):5d}{' CAP' if any(p['at_cap']) else ''}"]
    for sw, q in r['lbfgs'].items():
        ch = q['objective_change']
        parts.append(f"{sw}: {sum(q['solves']):4d} F {sum(ch) / len(ch):+.1e}")
    print(' | '.join(parts), flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--shape', default='16x256x512', help='B x T x d of each batch')
    p.add_argument('--ranks', nargs='+', type=int, default=[4, 8, 16, 32])
    p.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2])
    p.add_argument('--switches', nargs='+', type=float, default=[0.01, 0.03, 0.1, 0.3])
    p.add_argument('--out', type=Path, help='write the rows, the summary and how (JSON)')
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    B, T, d = (int(x) for x in a.shape.split('x'))
    cases = [(f'lowrank-{k} s{s}', ('lowrank', k, s)) for k in a.ranks for s in a.seeds]
    cases += [('planted', ('planted', 16, 0)), ('isotropic', ('isotropic', 16, 0))]
    rows = []
    for name, (fam, rank, seed) in cases:
        rows.append(instance(name, batch(fam, B, T, d, rank, seed=seed), a.switches))
        show(rows[-1])
    if QWEN.exists():
        rows.append(instance('qwen-tiny', qwen_batch(QWEN), a.switches))
        show(rows[-1])
    summ = summary(rows, a.switches)
    print(f"plain: {summ['plain']['solves']} solves, {summ['plain']['at_cap']} groups at the cap")
    for sw in map(str, a.switches):
        s = summ[sw]
        print(
            f"switch {sw:>5s}: {s['solves']} solves, {s['at_cap']} at the cap, objective against "
            f"plain mean {s['objective_mean']:+.2e}, largest {s['objective_max']:+.2e} "
            f"({s['groups']} groups)"
        )
    if a.out:
        record = dict(
            provenance('tools/bench_switch.py', argv),
            shape=a.shape,
            default_switch=LBFGS['switch'],
            rows=rows,
            summary=summ,
        )
        a.out.write_text(json.dumps(record, indent=1) + '\n')


if __name__ == '__main__':
    main()
