"""HARA's time per TRL step on the tiny Qwen3 that `make train` trained, the barycenter's plain
outer step against the quasi-Newton one.

    python tools/bench_trl_step.py [--model PATH] [--steps 8] [--seed 0]
                                   [--reward verifier|last-number] [--out FILE.json]

Runs `examples/grpo_hara.py` once per outer solver (`--novelty_kw '{"bary_kw": {"outer": ...}}'`:
'plain', the fixed point Z <- Φ(Z); 'lbfgs', the default of `BARY_DEFAULTS`), each in its own
subprocess on the CPU with one thread, the same seed and the same data: 8 rollouts of at most 40
tokens per prompt, 2 prompts a step, one log per step. The model defaults to the newest
`runs/*/runs/grpo+hara-tok-s0/final`; the prompts are the first 2 x steps of that run's held-out
split (`tools/qwen_states.py`'s `heldout_items`), written to a temporary JSONL file with the
target number as `answer` and the task's answer string as `problem`.

HARA solves barycenters only for prompts whose rollouts differ in outcome. The trained model ends
nearly every countdown completion with the boxed target, so the example's `accuracy` (the last
number is the answer) is 1 for nearly all of them and HARA has nothing to solve. `--reward
verifier` (the default) runs the example with `accuracy` replaced by the task's verifier (valid
steps and the boxed target, as `make train` scores them), through a few lines that load the
example and call its `main`; `--reward last-number` runs the example as it is.

The per-step metrics `hara/time`, `hara/bary_iters` and TRL's `step_time` are read from the
`log_history` of the run's last `trainer_state.json`, or, when there is none, from the log dicts
the run prints. Prints per solver the steps (and those that solved a barycenter), median and max
HARA time (all steps; steps with a barycenter) and barycenter iterations, the median step time,
and plain / lbfgs of the median HARA time; `--out` writes the rows and how they were measured.
"""

import ast
import datetime
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from hara_ref.practice.cli import FlagParser  # a usage error: one line, exit code 2

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / 'examples' / 'grpo_hara.py'
OUTERS = ('plain', 'lbfgs')
ENV = dict(HF_HUB_OFFLINE='1', TRANSFORMERS_OFFLINE='1', OMP_NUM_THREADS='1', MKL_NUM_THREADS='1')
KEYS = ('hara/time', 'hara/bary_iters', 'step_time', 'rewards/accuracy/mean')  # read per step
GENERATIONS, PER_STEP, LENGTH = 8, 16, 40  # rollouts per prompt, per step; tokens per rollout
# `python -c SHIM EXAMPLE ARGS...`: the example with `accuracy` replaced by the task's verifier
# (BENCH_TRL_REWARD='module:function', called as f(completion text, problem))
SHIM = """
import importlib, importlib.util, os, sys
from trl import GRPOConfig, TrlParser
from hara_ref import HaraConfig
path, sys.argv = sys.argv[1], sys.argv[1:]
spec = importlib.util.spec_from_file_location('grpo_hara', path)
ex = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ex)
mod, name = os.environ['BENCH_TRL_REWARD'].split(':')
verify = getattr(importlib.import_module(mod), name)
def accuracy(completions, problem, **kwargs):
    return [float(verify(ex.text(c), p)) for c, p in zip(completions, problem)]
ex.accuracy = accuracy
ex.main(*TrlParser((ex.ScriptArguments, GRPOConfig, HaraConfig)).parse_args_and_config())
"""


def as_number(v):
    "A logged value as a float: TRL prints numbers as strings ('0.4406'); None stays None."
    return None if v is None else float(v)


def step_logs(history: list) -> list:
    """The per-step entries of a TRL log history (dicts), in order: those with a `hara/time`, as
    dicts of KEYS (float, or None where the entry has no such key)."""
    rows = [h for h in history if isinstance(h, dict) and 'hara/time' in h]
    return [{k: as_number(h.get(k)) for k in KEYS} for h in rows]


def printed_logs(text: str) -> list:
    "The log dicts a TRL run printed, one a line (`{'loss': '0', ...}`), in order."
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith('{') and line.endswith('}'):
            try:
                d = ast.literal_eval(line)
            except (ValueError, SyntaxError):
                continue
            if isinstance(d, dict):
                out.append(d)
    return out


def run_logs(out_dir: Path, stdout: str) -> list:
    "The run's per-step metrics: its last checkpoint's `trainer_state.json`, else its stdout."
    states = sorted(
        out_dir.glob('checkpoint-*/trainer_state.json'),
        key=lambda p: int(p.parent.name.split('-')[-1]),
    )
    if states:
        return step_logs(json.loads(states[-1].read_text())['log_history'])
    return step_logs(printed_logs(stdout))


def summarize(logs: list) -> dict:
    """Steps and those with a barycenter (`hara/bary_iters` > 0); median and max of HARA's time
    (all steps; steps with a barycenter); median and max of the barycenter iterations (steps with a
    barycenter); median step time. None where there is nothing to take it over."""
    t = [r['hara/time'] for r in logs]
    tb = [r['hara/time'] for r in logs if (r['hara/bary_iters'] or 0) > 0]
    it = [r['hara/bary_iters'] for r in logs if (r['hara/bary_iters'] or 0) > 0]
    st = [r['step_time'] for r in logs if r['step_time'] is not None]
    return dict(
        steps=len(logs),
        bary_steps=len(tb),
        hara_time_median=statistics.median(t) if t else None,
        hara_time_max=max(t) if t else None,
        hara_time_median_bary=statistics.median(tb) if tb else None,
        bary_iters_median=statistics.median(it) if it else None,
        bary_iters_max=max(it) if it else None,
        step_time_median=statistics.median(st) if st else None,
    )


def command(model: str, data: str, out_dir: str, outer: str, steps: int, seed: int) -> list:
    "The example's command line for one outer solver."
    return [
        *(str(EXAMPLE.relative_to(ROOT)), '--model_name_or_path', model, '--dataset_path', data),
        *('--output_dir', out_dir, '--max_steps', str(steps), '--seed', str(seed)),
        *('--num_generations', str(GENERATIONS), '--per_device_train_batch_size', str(PER_STEP)),
        *('--max_completion_length', str(LENGTH), '--logging_steps', '1'),
        *('--report_to', 'none', '--use_cpu', 'true', '--bf16', 'false'),
        *('--novelty_kw', json.dumps(dict(bary_kw=dict(outer=outer)))),
    ]


def parse(argv=None):
    "The command line, checked before any work: a usage error exits 2, one line naming the flag."
    ap = FlagParser(description=__doc__.splitlines()[0])
    ap.add_argument('--model', help='a save_pretrained folder (default: the newest trained run)')
    ap.add_argument('--steps', type=int, default=8, help='TRL steps per solver')
    ap.add_argument('--seed', type=int, default=0, help="TRL's seed")
    ap.add_argument(
        '--reward',
        choices=('verifier', 'last-number'),
        default='verifier',
        help="HARA's outcomes: the task's verifier, or the example's own `accuracy`",
    )
    ap.add_argument('--out', help='write the rows and how they were measured (JSON)')
    a = ap.parse_args(argv)
    if a.steps < 1:
        ap.error(f"--steps must be at least 1, got {a.steps}")
    if a.seed < 0:
        ap.error(f"--seed must be >= 0, got {a.seed}")
    if a.model is not None and not (Path(a.model) / 'config.json').exists():
        ap.error(f"--model {a.model}: no config.json there")
    if a.out is not None and not Path(a.out).resolve().parent.is_dir():
        ap.error(f"--out {a.out}: its folder does not exist")
    return a


def shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def show(outer: str, s: dict) -> None:
    f = lambda x, fmt: '-' if x is None else format(x, fmt)
    print(
        f"{outer:6s} {s['steps']} steps ({s['bary_steps']} with a barycenter) | hara/time median "
        f"{f(s['hara_time_median'], '.3f')} s (with a barycenter "
        f"{f(s['hara_time_median_bary'], '.3f')} s), max {f(s['hara_time_max'], '.3f')} s | "
        f"bary_iters (with one) median {f(s['bary_iters_median'], 'g')}, "
        f"max {f(s['bary_iters_max'], 'g')} "
        f"| step_time median {f(s['step_time_median'], '.3f')} s",
        flush=True,
    )


def ratio(rows: list, key: str):
    "plain / lbfgs of `key` (None: either is missing or zero)."
    tp, tl = (r[key] for r in rows)
    return tp / tl if tp is not None and tl else None


def reward_name(fn) -> str | None:
    "'module:function' of a reward function a subprocess can import, or None."
    mod, name = getattr(fn, '__module__', None), getattr(fn, '__qualname__', '')
    if not mod or not name.isidentifier():
        return None
    try:
        return f"{mod}:{name}" if getattr(importlib.import_module(mod), name) is fn else None
    except (ImportError, AttributeError):
        return None


def main(argv=None) -> int:
    a = parse(argv)
    sys.path.insert(0, str(ROOT / 'tools'))
    import qwen_states

    model = Path(a.model) if a.model else qwen_states.newest_checkpoint()
    cfg, exp = qwen_states.run_settings(model)
    n = 2 * a.steps  # PER_STEP // GENERATIONS prompts a step, none seen twice
    try:
        items, reward_fn = qwen_states.heldout_items(exp, n, cfg.eval_prompts)
    except ValueError as e:  # more steps than held-out prompts
        sys.stderr.write(f"bench_trl_step.py: --steps {a.steps}: {e}\n")
        return 2
    env = {**os.environ, **ENV}
    if a.reward == 'verifier':
        env['BENCH_TRL_REWARD'] = reward_name(reward_fn)
        if env['BENCH_TRL_REWARD'] is None:
            sys.stderr.write(
                f"bench_trl_step.py: --reward verifier: the task's reward {reward_fn!r} cannot "
                "be imported by name; use --reward last-number\n"
            )
            return 2
    outcome = env.get('BENCH_TRL_REWARD', "the example's accuracy (last number == answer)")
    print(
        f"model {shown(model)} ({exp.get('task')} task, {n} held-out prompts; outcomes: {outcome})",
        flush=True,
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / 'prompts.jsonl'
        with data.open('w') as f:
            for it in items:  # the prompt as the trainer encodes it: <bos> first
                target = str(it['problem'].target) if 'problem' in it else str(it['answer'])
                row = dict(prompt='<bos>' + it['prompt'], answer=target, problem=it['answer'])
                print(json.dumps(row), file=f)
        for outer in OUTERS:
            out_dir = Path(tmp) / outer
            cmd = command(str(model.resolve()), str(data), str(out_dir), outer, a.steps, a.seed)
            shim = ['-c', SHIM] if a.reward == 'verifier' else []
            p = subprocess.run(
                [sys.executable, *shim, *cmd], cwd=ROOT, env=env, capture_output=True, text=True
            )
            if p.returncode != 0:
                sys.stderr.write(p.stderr[-3000:])
                sys.stderr.write(f"bench_trl_step.py: the '{outer}' run exited {p.returncode}\n")
                return 1
            logs = run_logs(out_dir, p.stdout)
            if not logs:
                sys.stderr.write(f"bench_trl_step.py: the '{outer}' run logged no hara/time\n")
                return 1
            rows.append(dict(outer=outer, **summarize(logs), per_step=logs))
            show(outer, rows[-1])
    r_all, r_bary = ratio(rows, 'hara_time_median'), ratio(rows, 'hara_time_median_bary')
    f = lambda x: '-' if x is None else f'{x:.2f}'
    print(f"plain / lbfgs, median hara/time: {f(r_all)} (steps with a barycenter: {f(r_bary)})")
    if a.out:
        code = subprocess.run(
            ['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        cpu = [x for x in Path('/proc/cpuinfo').read_text().splitlines() if 'model name' in x]
        example = command('MODEL', 'DATA', 'OUT', 'OUTER', a.steps, a.seed)
        meta = dict(
            command=' '.join(['python tools/bench_trl_step.py', *(argv or sys.argv[1:])]),
            example=' '.join(['python', *(['-c', 'SHIM'] if a.reward == 'verifier' else [])])
            + ' '
            + ' '.join(example),
            code=code,
            machine=(cpu[0].split(':', 1)[1].strip() if cpu else platform.machine())
            + f', {os.cpu_count()} cores',
            threads=1,
            measured_on=datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC'),
            model=shown(model),
            data=f"the first {n} of the {exp.get('task')} task's held-out prompts "
            "(experiment_items); answer: the target number, problem: the task's answer string",
            outcomes=outcome,
            prompts=[it['prompt'] for it in items],
            ratio_plain_lbfgs=r_all,
            ratio_plain_lbfgs_bary=r_bary,
        )
        Path(a.out).write_text(json.dumps(dict(meta, rows=rows), indent=1) + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
