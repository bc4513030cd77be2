"""`tools/bench_trl_step.py` without training: its reading of TRL's per-step logs (from
`trainer_state.json` and from the printed log dicts), its summary, the reward it hands the
subprocess, and its usage errors."""

import json
import runpy
import subprocess
import sys
from pathlib import Path

from hara_ref.rlvr.countdown import countdown_reward

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / 'tools' / 'bench_trl_step.py'
tool = runpy.run_path(str(TOOL))

# two per-step entries as TRL keeps them, around a non-step entry and the run's final summary
HISTORY = [
    {'loss': 0.0, 'hara/time': 0.02, 'hara/bary_iters': 0.0, 'step_time': 0.22, 'step': 1},
    {'eval_loss': 1.0, 'step': 1},
    {'hara/time': 0.44, 'hara/bary_iters': 60.0, 'step_time': 0.63, 'step': 2},
    {'train_runtime': 0.9, 'step': 2},
]
PRINTED = """HaraGRPOTrainer: HARA on: reweight='hara-tok', kappa=1.0
{'loss': '0', 'hara/time': '0.02073', 'hara/bary_iters': '0', 'hara/reweighted_frac': None, \
'step_time': '0.224', 'rewards/accuracy/mean': '1'}
 50%|#####     | 1/2 [00:00<00:00,  4.28it/s]
{'loss': '-0.005531', 'hara/time': '0.4406', 'hara/bary_iters': '60', 'step_time': '0.634'}
{'train_runtime': '0.922', 'train_loss': '-0.002765', 'epoch': '0.25'}
{not a dict
"""


def test_step_logs_keeps_the_steps_in_order():
    logs = tool['step_logs'](HISTORY)
    assert [r['hara/time'] for r in logs] == [0.02, 0.44]
    assert [r['hara/bary_iters'] for r in logs] == [0.0, 60.0]
    assert [r['step_time'] for r in logs] == [0.22, 0.63]
    assert [r['rewards/accuracy/mean'] for r in logs] == [None, None]  # not logged: None


def test_printed_logs_read_trl_strings():
    logs = tool['step_logs'](tool['printed_logs'](PRINTED))
    assert [r['hara/time'] for r in logs] == [0.02073, 0.4406]
    assert [r['hara/bary_iters'] for r in logs] == [0.0, 60.0]
    assert [r['step_time'] for r in logs] == [0.224, 0.634]
    assert [r['rewards/accuracy/mean'] for r in logs] == [1.0, None]


def test_run_logs_prefers_the_last_checkpoint(tmp_path):
    for step, t in ((2, 0.5), (10, 0.7)):  # checkpoint-10 sorts before checkpoint-2 as text
        (tmp_path / f'checkpoint-{step}').mkdir()
        hist = [{'hara/time': t, 'hara/bary_iters': 3.0, 'step_time': 1.0}] * step
        state = tmp_path / f'checkpoint-{step}' / 'trainer_state.json'
        state.write_text(json.dumps(dict(log_history=hist)))
    logs = tool['run_logs'](tmp_path, PRINTED)
    assert len(logs) == 10 and logs[0]['hara/time'] == 0.7
    # no checkpoint: the printed log dicts
    logs = tool['run_logs'](tmp_path / 'none', PRINTED)
    assert [r['hara/time'] for r in logs] == [0.02073, 0.4406]


def test_summarize():
    logs = tool['step_logs'](
        HISTORY + [{'hara/time': 0.30, 'hara/bary_iters': 20.0, 'step_time': 0.5}]
    )
    s = tool['summarize'](logs)
    assert s['steps'] == 3 and s['bary_steps'] == 2
    assert s['hara_time_median'] == 0.30 and s['hara_time_max'] == 0.44
    assert s['hara_time_median_bary'] == (0.30 + 0.44) / 2  # the steps with a barycenter
    assert s['bary_iters_median'] == 40.0 and s['bary_iters_max'] == 60.0
    assert s['step_time_median'] == 0.5
    none = tool['summarize'](tool['step_logs'](HISTORY[:1]))  # no barycenter at all
    assert none['bary_steps'] == 0 and none['hara_time_median_bary'] is None
    assert none['bary_iters_median'] is None and none['hara_time_median'] == 0.02


def test_command_and_reward():
    cmd = tool['command']('M', 'D', 'O', 'lbfgs', 8, 3)
    assert cmd[0] == 'examples/grpo_hara.py' and (ROOT / cmd[0]).exists()
    flag = lambda k: cmd[cmd.index(k) + 1]
    assert json.loads(flag('--novelty_kw')) == {'bary_kw': {'outer': 'lbfgs'}}
    assert flag('--max_steps') == '8' and flag('--seed') == '3'
    assert flag('--per_device_train_batch_size') == '16' and flag('--num_generations') == '8'
    name = tool['reward_name'](countdown_reward)
    assert name == 'hara_ref.rlvr.countdown:countdown_reward'
    assert tool['reward_name'](lambda t, a: 1.0) is None


def run(*args):
    return subprocess.run(
        [sys.executable, str(TOOL), *args], cwd=ROOT, capture_output=True, text=True
    )


def test_usage_errors(tmp_path):
    for args, flag in (
        (['--steps', '0'], '--steps'),
        (['--seed', '-1'], '--seed'),
        (['--model', str(tmp_path)], '--model'),
        (['--out', str(tmp_path / 'no' / 'r.json')], '--out'),
        (['--reward', 'exact'], '--reward'),
    ):
        p = run(*args)
        assert p.returncode == 2 and p.stdout == '', args
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and flag in lines[0], (args, p.stderr)
    assert not (tmp_path / 'no').exists()
