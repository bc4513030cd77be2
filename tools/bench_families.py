"""HARA's cost and precision on each family of hidden states, measured side by side in one run.

    python tools/bench_families.py [--shapes 16x128x256 ...] [--ranks 8 16] [--out FILE.json]

For each family (chapter 01's `hidden_family`: planted stages, isotropic, low rank + 5 % noise) and
each shape B x T x d (one prompt of B rollouts, half correct), one `hara_advantages` call at its
defaults on one thread: its time, the barycenter iterations of each outcome group, whether a group
met the cap, and how far its weights are from a 100x tighter solve (barycenter and plan tolerances
both 100x smaller, caps raised), the solve that certifies the default's answer. All rows are
measured in one process, one after the other, on the same code.
"""

import argparse
import json
import os
import platform
import sys
import subprocess
import time
import warnings
from pathlib import Path

import torch

import hara_ref
from hara_ref.engine.novelty import BARY_DEFAULTS, PLAN_DEFAULTS
from hara_ref.rlvr.data import hidden_family

ROOT = Path(__file__).resolve().parent.parent


def batch(family: str, B: int, T: int, d: int, rank: int, seed: int = 0) -> tuple:
    "One prompt of B rollouts of T tokens, half of them correct: hidden, mask, rewards, group ids."
    hidden = hidden_family(family, B, T, d, rank=rank, seed=seed, dtype=torch.float32)  # (B, T, d)
    mask = torch.ones(B, T, dtype=torch.bool)  # (B, T)
    rewards = (torch.arange(B) < B // 2).float()  # (B,)
    return hidden, mask, rewards, torch.zeros(B, dtype=torch.long)


def weights(rw) -> torch.Tensor:
    return rw.weights.double()  # (B, T)


def row(family: str, B: int, T: int, d: int, rank: int) -> dict:
    h, m, r, g = batch(family, B, T, d, rank)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        t = time.perf_counter()
        _, rw = hara_ref.hara_advantages(h, m, r, g)
        secs = time.perf_counter() - t
    tight = dict(
        bary_kw=dict(tol=BARY_DEFAULTS['tol'] / 100, max_iter=20 * BARY_DEFAULTS['max_iter']),
        plan_kw=dict(stop_thr=PLAN_DEFAULTS['stop_thr'] / 100),
    )
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        _, rw_t = hara_ref.hara_advantages(h, m, r, g, **tight)
    iters = [int(x) for x in rw.novelty.bary_iters_group]
    return dict(
        family=family if family != 'lowrank' else f'lowrank-{rank}',
        shape=f'{B}x{T}x{d}',
        seconds=round(secs, 3),
        iterations=iters,
        at_cap=[i >= BARY_DEFAULTS['max_iter'] for i in iters],
        tight_iterations=[int(x) for x in rw_t.novelty.bary_iters_group],
        weight_gap=float((weights(rw) - weights(rw_t)).abs().max()),
        warned=sorted({str(w.message)[:80] for w in caught}),
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--shapes', nargs='+', default=['16x128x256'], help='B x T x d of each batch')
    p.add_argument('--ranks', nargs='+', type=int, default=[8, 16], help="'lowrank' ranks")
    p.add_argument('--out', type=Path, help='write the rows and how they were measured (JSON)')
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for shape in a.shapes:
        B, T, d = (int(x) for x in shape.split('x'))
        cases = [("planted", 16), ("isotropic", 16)] + [("lowrank", k) for k in a.ranks]
        for family, rank in cases:
            rows.append(row(family, B, T, d, rank))
            r = rows[-1]
            print(
                f"{r['family']:12s} {r['shape']:>12s} {r['seconds']:8.2f} s  iterations "
                f"{r['iterations']} (cap: {any(r['at_cap'])}), 100x tighter solve "
                f"{r['tight_iterations']}: weights {r['weight_gap']:.1e} apart",
                flush=True,
            )
    if a.out:
        code = subprocess.run(
            ['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        cpu = [x for x in Path('/proc/cpuinfo').read_text().splitlines() if 'model name' in x]
        meta = dict(
            command=' '.join(['python tools/bench_families.py', *(argv or sys.argv[1:])]),
            code=code,
            machine=(cpu[0].split(':', 1)[1].strip() if cpu else platform.machine())
            + f', {os.cpu_count()} cores',
            threads=1,
            measured_on=time.strftime('%Y-%m-%d'),
        )
        a.out.write_text(json.dumps(dict(meta, rows=rows), indent=1) + '\n')


if __name__ == '__main__':
    main()
