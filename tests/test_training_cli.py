"""`hara-ref train` end to end on tiny configurations: a local checkpoint + MATH-style data, and the built-in default path."""
import json, os, warnings
from pathlib import Path
import pytest, torch

os.environ.setdefault('HF_HUB_OFFLINE', '1'); os.environ.setdefault('TRANSFORMERS_OFFLINE', '1'); os.environ.setdefault('MPLBACKEND', 'Agg')
from hara_ref.policy import char_tokenizer, tiny_qwen3, save_policy, load_policy
from hara_ref.rl import read_jsonl
from hara_ref.cli import train_cli

TINY = ['--steps', '2', '--seeds', '1', '-G', '2', '--prompts-per-step', '2', '--max-new-tokens', '6', '--eval-every', '1',
        '--eval-prompts', '2', '--eval-samples', '2', '--workers', '1', '--threads', '1']


@pytest.fixture()
def ckpt_and_data(tmp_path):
    tok = char_tokenizer()
    save_policy(tiny_qwen3(tok, hidden_size=32, seed=0), tok, tmp_path / 'tiny-qwen3')
    rows = [dict(problem=f"What is {a}+{b}?", solution=f"It is $\\boxed{{{a + b}}}$.") for a, b in [(1, 1), (2, 3), (4, 4), (7, 1), (5, 5), (9, 0)]]
    rows.append(dict(problem='Write one half.', answer='\\frac{1}{2}'))
    (tmp_path / 'math.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
    return tmp_path / 'tiny-qwen3', tmp_path / 'math.jsonl'


def _check_run_folder(out, names):
    assert (out / 'summary.json').exists() and (out / 'curves.png').stat().st_size > 1000
    s = json.loads((out / 'summary.json').read_text())
    assert sorted(v['variant'] for v in s['variants']) == sorted({n.rsplit('-s', 1)[0] for n in names})
    for n in names:
        rows = read_jsonl(out / 'runs' / n / 'metrics.jsonl')
        assert [r['step'] for r in rows if r['kind'] == 'train'] == [1, 2]
        t = [r for r in rows if r['kind'] == 'train'][0]
        for k in ('reward', 'entropy', 'length', 'clip_frac', 'zero_std_frac', 'w_mean', 'w_std', 't_gen', 't_reward', 't_hara', 't_update', 't_step'):
            assert k in t, k
        assert (out / 'runs' / n / 'final' / 'config.json').exists()


def test_local_checkpoint_and_math_data(ckpt_and_data, tmp_path, capsys):
    ckpt, data = ckpt_and_data
    out = tmp_path / 'run'
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        rc = train_cli(['--model', str(ckpt), '--data', str(data), '--out', str(out), '--reweight', 'none,hara-tok'] + TINY)
    assert rc == 0
    _check_run_folder(out, ['grpo-s0', 'grpo+hara-tok-s0'])
    assert 'pass@2' in capsys.readouterr().out
    assert not (out / 'sft').exists()  # a given model is not warm-started


def test_dapo_bf16_entropy_baseline(ckpt_and_data, tmp_path):
    ckpt, data = ckpt_and_data
    out = tmp_path / 'run'
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        rc = train_cli(['--model', str(ckpt), '--data', str(data), '--out', str(out), '--method', 'dapo', '--dtype', 'bf16',
                        '--reweight', 'entropy', '--gradient-checkpointing'] + TINY)
    assert rc == 0
    _check_run_folder(out, ['dapo+entropy-s0'])
    assert load_policy(out / 'runs' / 'dapo+entropy-s0' / 'final', dtype='bf16')[0].dtype == torch.bfloat16


def test_builtin_default_path_two_workers(tmp_path):
    """The no-argument path in miniature: SFT once, then GRPO and HARA-tok over 2 seeds in 2 worker processes, then resume."""
    out = tmp_path / 'run'
    argv = ['--out', str(out), '--sft-steps', '3', '--hidden-size', '32', '--max-value', '9', '--steps', '2', '--seeds', '2', '-G', '2',
            '--prompts-per-step', '2', '--max-new-tokens', '8', '--eval-every', '1', '--eval-prompts', '2', '--eval-samples', '2',
            '--workers', '2', '--threads', '1']
    assert train_cli(argv) == 0
    names = ['grpo-s0', 'grpo-s1', 'grpo+hara-tok-s0', 'grpo+hara-tok-s1']
    _check_run_folder(out, names)
    assert (out / 'sft' / 'config.json').exists()
    before = {n: read_jsonl(out / 'runs' / n / 'metrics.jsonl') for n in names}
    assert train_cli(argv + ['--resume']) == 0  # finished runs: resume re-evaluates only, nothing changes
    after = {n: read_jsonl(out / 'runs' / n / 'metrics.jsonl') for n in names}
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith('t_')} for r in rows]
    assert all(strip(before[n]) == strip(after[n]) for n in names)
