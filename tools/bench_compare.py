"""Time HARA on two or more checkouts side by side, in one run on one machine.

Each round runs every checkout once, in turn, in a fresh process (its own `hara_ref` on PYTHONPATH):
`tools/bench_hara_small.py` (the small batch: 8 rollouts x 12 tokens, d = 16, two outcome groups of
4; fastest of N calls) and, with --paper, `hara-ref bench hara --threads 1` (the paper's batch: 16 x
16 rollouts, L = 1024, d = 1024). Alternating the checkouts spreads a drift of the machine's speed
over all of them; each time reported is the fastest over the rounds, and the ratio is to the first
checkout. Each row also keeps every round's ratio to the first checkout in the same round (a
paired ratio: its spread is the machine's noise). The scripts run from this checkout, so an old
checkout needs only `hara_advantages` and its `bench hara` command.

    python tools/bench_compare.py OLD NEW [--rounds 3] [--paper] [--out results.json]
"""

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CLI = 'import sys; from hara_ref.practice.cli import main; sys.exit(main(sys.argv[1:]))'


def run(checkout: Path, args: list) -> str:
    "Output of `python args` with `checkout`'s hara_ref first on the path, one thread."
    env = dict(os.environ, PYTHONPATH=str(checkout), OMP_NUM_THREADS='1', MKL_NUM_THREADS='1')
    env.update(HF_HUB_OFFLINE='1', TRANSFORMERS_OFFLINE='1')
    out = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{checkout}: {' '.join(args)} failed:\n{out.stderr[-2000:]}")
    return out.stdout


def small(checkout: Path, n: int) -> tuple:
    "Fastest of n `hara_advantages` calls on the small batch: (seconds, barycenter iterations)."
    out = run(checkout, [str(HERE / 'bench_hara_small.py'), str(n)])
    t = float(re.search(r'runs ([\d.]+) s', out).group(1))
    return t, int(re.search(r'barycenter iterations: (\d+)', out).group(1))


def paper(checkout: Path, extra: list) -> tuple:
    "`bench hara --threads 1 [extra]`: (seconds, barycenter iterations)."
    out = run(checkout, ['-c', CLI, 'bench', 'hara', '--threads', '1', *extra])
    t = float(re.search(r'hara_advantages \(tok\): ([\d.]+) s', out).group(1))
    return t, int(re.search(r'barycenter iterations: (\d+)', out).group(1))


def commit(checkout: Path) -> str:
    "Short commit of a checkout (+ if it has uncommitted changes)."
    git = ['git', '-C', str(checkout)]
    sha = subprocess.run(git + ['rev-parse', '--short', 'HEAD'], capture_output=True, text=True)
    dirty = subprocess.run(git + ['status', '--porcelain', '--', 'hara_ref'], capture_output=True)
    return sha.stdout.strip() + ('+' if dirty.stdout.strip() else '')


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('checkouts', nargs='+', type=Path, help='checkout roots; the first is the base')
    p.add_argument('--rounds', type=int, default=3)
    p.add_argument('--calls', type=int, default=20, help='small-batch calls per round')
    p.add_argument('--paper', action='store_true', help="also time `bench hara`'s batch")
    p.add_argument('--prompts', type=int, help="`bench hara --prompts` (default: the paper's 16)")
    p.add_argument('--paper-rounds', type=int, help='rounds of `bench hara` (default: --rounds)')
    p.add_argument('--out', type=Path, help='write the results as JSON here')
    a = p.parse_args(argv)
    if a.rounds < 1 or a.calls < 1:
        p.error('--rounds and --calls must be at least 1')
    paper_rounds = a.rounds if a.paper_rounds is None else a.paper_rounds
    if not 1 <= paper_rounds <= a.rounds:
        p.error(f"--paper-rounds must be in [1, --rounds = {a.rounds}], got {paper_rounds}")
    names = [f"code {commit(c)}" for c in a.checkouts]
    if len(set(names)) < len(names):
        names = [f"{n} ({c})" for n, c in zip(names, a.checkouts)]
    if len(set(names)) < len(names):  # the same checkout more than once
        names = [f"{n} #{k + 1}" for k, n in enumerate(names)]
    t_small = {n: [] for n in names}
    t_paper = {n: [] for n in names}
    for r in range(a.rounds):
        for c, n in zip(a.checkouts, names):
            t_small[n].append(small(c, a.calls))
            timed = a.paper and r < paper_rounds
            if timed:
                t_paper[n].append(paper(c, ['--prompts', str(a.prompts)] if a.prompts else []))
            print(f"round {r + 1}: {n}: small {t_small[n][-1][0]:.4f} s", end='')
            print(f", bench hara {t_paper[n][-1][0]:.2f} s" if timed else '', flush=True)
    base = names[0]
    rows = []
    for n in names:
        row = dict(checkout=n)
        row['small_s'], row['small_iters'] = min(t_small[n])
        row['small_ratio'] = row['small_s'] / min(t_small[base])[0]
        row['small_round_ratios'] = [t / b for (t, _), (b, _) in zip(t_small[n], t_small[base])]
        if a.paper:
            row['paper_s'], row['paper_iters'] = min(t_paper[n])
            row['paper_ratio'] = row['paper_s'] / min(t_paper[base])[0]
            row['paper_round_ratios'] = [t / b for (t, _), (b, _) in zip(t_paper[n], t_paper[base])]
        rows.append(row)
        print(json.dumps(row))
    if a.out:
        how = dict(
            command='python tools/bench_compare.py ' + ' '.join(argv or sys.argv[1:]),
            measured_on=datetime.date.today().isoformat(),
            machine=f"{platform.platform()}, {os.cpu_count()} CPUs",
            threads='1 thread (OMP_NUM_THREADS=1, MKL_NUM_THREADS=1), one process at a time',
        )
        res = how | dict(rounds=a.rounds, calls=a.calls, rows=rows)
        if a.paper:
            res |= dict(paper_rounds=paper_rounds, prompts=a.prompts or 16)
        a.out.write_text(json.dumps(res, indent=1))


if __name__ == '__main__':
    main()
