"""`hara-ref train` end to end on tiny configurations: a local checkpoint + MATH-style data, and the
built-in default path."""

import json
import os
import warnings
import pytest
import torch

os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('TRANSFORMERS_OFFLINE', '1')
os.environ.setdefault('MPLBACKEND', 'Agg')
from hara_ref.train.policy import char_tokenizer, tiny_qwen3
from hara_ref.trainer.loop import save_policy, load_policy, read_jsonl
from hara_ref.practice.cli import train_cli


@pytest.fixture
def tiny(tiny_flags):
    """Tiny runs of a given checkpoint (no SFT start, so no policy or task flags), G = 2, 2 prompts
    per step, 6 new tokens."""
    return tiny_flags(
        sft_steps=None,
        hidden_size=None,
        max_value=None,
        G=2,
        prompts_per_step=2,
        max_new_tokens=6,
    )


@pytest.fixture()
def ckpt_and_data(tmp_path):
    tok = char_tokenizer()
    save_policy(tiny_qwen3(tok, hidden_size=32, seed=0), tok, tmp_path / 'tiny-qwen3')
    rows = [
        dict(problem=f"What is {a}+{b}?", solution=f"It is $\\boxed{{{a + b}}}$.")
        for a, b in [(1, 1), (2, 3), (4, 4), (7, 1), (5, 5), (9, 0), (3, 0)]  # 3+0: held out
    ]
    rows.append(dict(problem='Write one half.', answer='\\frac{1}{2}'))
    (tmp_path / 'math.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
    return tmp_path / 'tiny-qwen3', tmp_path / 'math.jsonl'


def _check_run_folder(out, names):
    assert (out / 'summary.json').exists() and (out / 'curves.png').stat().st_size > 1000
    s = json.loads((out / 'summary.json').read_text())
    assert sorted(v['variant'] for v in s['variants']) == sorted(
        {n.rsplit('-s', 1)[0] for n in names}
    )
    for n in names:
        rows = read_jsonl(out / 'runs' / n / 'metrics.jsonl')
        assert [r['step'] for r in rows if r['kind'] == 'train'] == [1, 2]
        t = [r for r in rows if r['kind'] == 'train'][0]
        for k in (
            'reward',
            'entropy',
            'length',
            'clip_frac',
            'zero_std_frac',
            'w_mean',
            'w_std',
            't_gen',
            't_reward',
            't_hara',
            't_update',
            't_step',
        ):
            assert k in t, k
        assert (out / 'runs' / n / 'final' / 'config.json').exists()


def test_local_checkpoint_and_math_data(ckpt_and_data, tmp_path, capsys, tiny):
    """A run from a local checkpoint and data file, called in this process: it leaves the process's
    torch threads, denormals and progress bars as it found them."""
    from transformers.utils import logging as hf_logging

    ckpt, data = ckpt_and_data
    out = tmp_path / 'run'
    threads, bars = torch.get_num_threads(), hf_logging.is_progress_bar_enabled()
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        rc = train_cli(
            [
                '--model',
                str(ckpt),
                '--data',
                str(data),
                '--out',
                str(out),
                '--reweight',
                'none,hara-tok',
            ]
            + tiny
            + ['--threads', str(threads + 1)]  # not this process's count
        )
    assert rc == 0
    assert torch.get_num_threads() == threads
    assert hf_logging.is_progress_bar_enabled() == bars
    assert (torch.tensor([1e-40]) * 1.0).item() > 0  # a float32 denormal is kept
    _check_run_folder(out, ['grpo-s0', 'grpo+hara-tok-s0'])
    assert 'pass@2' in capsys.readouterr().out
    assert not (out / 'sft').exists()  # a given model is not warm-started


def test_dapo_bf16_entropy_baseline(ckpt_and_data, tmp_path, tiny):
    ckpt, data = ckpt_and_data
    out = tmp_path / 'run'
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        rc = train_cli(
            [
                '--model',
                str(ckpt),
                '--data',
                str(data),
                '--out',
                str(out),
                '--method',
                'dapo',
                '--dtype',
                'bf16',
                '--reweight',
                'entropy',
                '--gradient-checkpointing',
            ]
            + tiny
        )
    assert rc == 0
    _check_run_folder(out, ['dapo+entropy-s0'])
    assert (
        load_policy(out / 'runs' / 'dapo+entropy-s0' / 'final', dtype='bf16')[0].dtype
        == torch.bfloat16
    )


def test_builtin_default_path_two_workers(tmp_path, tiny_flags):
    """The no-argument path in miniature: SFT once, then GRPO and HARA-tok over 2 seeds in 2 worker
    processes, then resume."""
    out = tmp_path / 'run'
    # the built-in policy and task, 2 seeds in 2 workers
    flags = tiny_flags(sft_steps=3, seeds=2, G=2, prompts_per_step=2, workers=2)
    argv = ['--out', str(out)] + flags
    assert train_cli(argv) == 0
    names = ['grpo-s0', 'grpo-s1', 'grpo+hara-tok-s0', 'grpo+hara-tok-s1']
    _check_run_folder(out, names)
    assert (out / 'sft' / 'config.json').exists()
    before = {n: read_jsonl(out / 'runs' / n / 'metrics.jsonl') for n in names}
    assert train_cli(argv + ['--resume']) == 0  # finished runs: left as they are
    after = {n: read_jsonl(out / 'runs' / n / 'metrics.jsonl') for n in names}
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith('t_')} for r in rows]
    assert all(strip(before[n]) == strip(after[n]) for n in names)


@pytest.mark.parametrize(
    'flags, msg',
    [
        (['--seeds', '0,0'], '--seeds lists 0 more than once'),
        (['--reweight', 'none,none'], '--reweight lists none'),
    ],
)
def test_duplicate_seeds_or_variants_refused_before_any_work(
    ckpt_and_data, tmp_path, capsys, flags, msg, tiny
):
    ckpt, data = ckpt_and_data
    out = tmp_path / 'run'
    argv = ['--model', str(ckpt), '--data', str(data), '--out', str(out)] + tiny + flags
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        rc = train_cli(argv + ['--workers', '2'])
    assert rc == 2 and msg in capsys.readouterr().err
    assert not out.exists()


@pytest.fixture()
def finished(ckpt_and_data, tmp_path, tiny):
    "A finished one-run experiment (a local checkpoint, MATH-style data) and its flags."
    ckpt, data = ckpt_and_data
    out = tmp_path / 'run'
    argv = ['--model', str(ckpt), '--data', str(data), '--out', str(out), '--reweight', 'none']
    argv += tiny
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        assert train_cli(argv) == 0
    return out, argv


def _snapshot(out):
    files = [p for p in sorted(out.rglob('*')) if p.is_file() and p.suffix in ('.json', '.jsonl')]
    return {p.relative_to(out): p.read_bytes() for p in files}


def test_fresh_run_into_a_folder_with_results_refused(finished, capsys):
    out, argv = finished
    before = _snapshot(out)
    assert train_cli(argv) == 2
    assert 'already holds an experiment' in capsys.readouterr().err and _snapshot(out) == before


def test_resume_with_changed_flags_refused_unless_allowed(finished, capsys):
    out, argv = finished
    before = _snapshot(out)
    capsys.readouterr()
    assert train_cli(argv + ['--resume', '--lr', '1e-4', '--eval-samples', '3']) == 2
    err = capsys.readouterr().err
    assert '--eval-samples 2 -> 3' in err and '--lr 3e-05 -> 0.0001' in err
    assert '--allow-config-change' in err
    assert _snapshot(out) == before  # config.json not rewritten, nothing run
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        assert train_cli(argv + ['--resume', '--steps', '3', '--allow-config-change']) == 0
    said = 'grpo-s0: 2 of 3 steps in metrics.jsonl, checkpoint of step 2: continues from step 2'
    assert said in capsys.readouterr().out
    assert json.loads((out / 'config.json').read_text())['train']['steps'] == 3
    rows = read_jsonl(out / 'runs' / 'grpo-s0' / 'metrics.jsonl')
    assert [r['step'] for r in rows if r['kind'] == 'train'] == [1, 2, 3]


def test_resume_of_finished_run_without_checkpoint_reports_it_complete(finished, capsys):
    import shutil

    out, argv = finished
    run = out / 'runs' / 'grpo-s0'
    shutil.rmtree(run / 'ckpt')
    before = (run / 'metrics.jsonl').read_bytes()
    capsys.readouterr()
    assert train_cli(argv + ['--resume']) == 0
    said = 'grpo-s0: complete, 2 of 2 steps and the final evaluation in metrics.jsonl: left as is'
    assert said in capsys.readouterr().out
    assert (run / 'metrics.jsonl').read_bytes() == before and not (run / 'ckpt').exists()


@pytest.mark.parametrize(
    'name, msg',
    [
        ('start_eval.json', 'evaluates the start again'),
        ('config.json', 'move it aside to resume with the current settings'),
        ('runs/grpo-s0/train_config.json', 'restore it, or move'),
    ],
)
def test_resume_names_a_damaged_json_file(finished, capsys, name, msg):
    out, argv = finished
    f = out / name
    f.write_text(f.read_text()[:20])
    assert train_cli(argv + ['--resume']) == 2
    err = capsys.readouterr().err
    assert f"{f} is damaged" in err and msg in err, err


def test_run_threads_gives_back_what_it_found():
    "Thread count, denormal flushing (on or off) and progress bars come back after the block."
    from transformers.utils import logging as hf_logging
    from hara_ref.trainer.experiment import run_threads, flushes_denormals

    threads, bars = torch.get_num_threads(), hf_logging.is_progress_bar_enabled()
    for flush, bar in ((True, True), (False, False), (False, True)):
        torch.set_flush_denormal(flush)
        hf_logging.enable_progress_bar() if bar else hf_logging.disable_progress_bar()
        with run_threads(threads + 1):
            assert torch.get_num_threads() == threads + 1 and flushes_denormals()
            assert not hf_logging.is_progress_bar_enabled()
        assert torch.get_num_threads() == threads and flushes_denormals() == flush
        assert hf_logging.is_progress_bar_enabled() == bar
    hf_logging.enable_progress_bar() if bars else hf_logging.disable_progress_bar()


# each flag value `hara-ref train` refuses before any work, and the start of its one-line message
# ('{tmp}': the test's folder)
BAD_FLAGS = [
    (['--workers', '0'], '--workers must be an integer >= 1, got 0'),
    (['--threads', '0'], '--threads must be an integer >= 1, got 0'),
    (['--heldout-frac', '1.0'], '--heldout-frac must be a finite real number in (0, 1), got 1.0'),
    (['--minibatches', '100'], '--minibatches 100 > the 64 rollouts of a step'),
    (['--sft-steps', '-5'], '--sft-steps must be an integer >= 0, got -5'),
    (['--hidden-layer', '99'], '--hidden-layer 99 does not exist: the model has 2 layers'),
    (['--lr', 'nan'], '--lr must be a finite real number > 0, got nan'),
    (['--clip-eps-low', '1.5'], '--clip-eps-low must be a finite real number in [0, 1), got 1.5'),
    (['--beta', '-1'], '--beta must be a finite real number >= 0, got -1.0'),
    (['--max-prompt-len', '1'], '--max-prompt-len 1 cannot hold the prompts: the longest has 10'),
    (['--n-terms', '0'], '--n-terms must be an integer >= 2, got 0'),
    (['--out', '{tmp}/a-file'], '--out {tmp}/a-file is a file, not a folder'),
    (['--out', '{tmp}/a-file/run'], '--out {tmp}/a-file/run: {tmp}/a-file is a file, not a folder'),
    (['--out', '/proc/hara-ref-run'], '--out /proc/hara-ref-run is under /proc, a system folder'),
    (['--out', '/dev/null/run'], '--out /dev/null/run is under /dev, a system folder'),
]


@pytest.mark.parametrize('flags, msg', BAD_FLAGS, ids=[' '.join(f) for f, _ in BAD_FLAGS])
def test_bad_flag_refused_before_any_work(tmp_path, capsys, flags, msg):
    "rc 2, one line on stderr naming the flag, and no run folder: nothing was written."
    (tmp_path / 'a-file').write_text('not a folder')
    flags = [f.replace('{tmp}', str(tmp_path)) for f in flags]
    argv = flags if '--out' in flags else ['--out', str(tmp_path / 'run'), *flags]
    assert train_cli(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith('hara-ref train: error: ' + msg.replace('{tmp}', str(tmp_path))), err
    assert err.count('\n') == 1 and flags[0] in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ['a-file']
    assert (tmp_path / 'a-file').read_text() == 'not a folder'
    assert not os.path.exists(flags[1]) or flags[1].endswith('a-file')


@pytest.mark.parametrize('side', ['train', 'held-out'])
def test_data_with_an_empty_split_refused(ckpt_and_data, tmp_path, capsys, tiny, side):
    """A data file whose prompts all miss the held-out hash (or all hit it) is refused with the
    reason, before any work: the held-out set never falls back to a training prompt."""
    from hara_ref.rlvr.data import is_heldout
    from hara_ref.train.sft import load_jsonl

    ckpt, data = ckpt_and_data
    held = [is_heldout(it['prompt'], 0.1) for it in load_jsonl(data)]
    assert held.count(True) == 1  # the fixture's 8 prompts: one held out
    lines = [line for line, h in zip(data.read_text().splitlines(), held) if h == (side != 'train')]
    one = tmp_path / 'one-side.jsonl'
    one.write_text('\n'.join(lines) + '\n')
    out = tmp_path / 'run'
    argv = ['--model', str(ckpt), '--data', str(one), '--out', str(out)] + tiny
    assert train_cli(argv) == 2
    n, none = len(lines), 'held-out' if side == 'train' else 'training'
    said = (
        f"hara-ref train: error: --data {one}: {0 if side == 'train' else n} of its {n} prompts "
        "fall in the held-out share --heldout-frac 0.1 (a hash of the prompt decides), leaving no "
        f"{none} prompt: add prompts, or {'raise' if side == 'train' else 'lower'} --heldout-frac\n"
    )
    assert capsys.readouterr().err == said
    assert not out.exists()


def test_resume_checks_the_checkpoint_tokenizer_before_any_write(finished, capsys):
    """A run's checkpoint without its tokenizer.json: the resume is refused naming that file, and
    nothing (config.json, train_config.json, metrics) is rewritten."""
    out, argv = finished
    run = out / 'runs' / 'grpo-s0'
    rows = (run / 'metrics.jsonl').read_text().splitlines(keepends=True)
    assert json.loads(rows[-1])['kind'] == 'eval' and json.loads(rows[-1])['step'] == 2
    (run / 'metrics.jsonl').write_text(''.join(rows[:-1]))  # stopped before its final evaluation
    (run / 'ckpt' / 'tokenizer.json').unlink()
    before = _snapshot(out)
    capsys.readouterr()
    assert train_cli(argv + ['--resume']) == 2
    err = capsys.readouterr().err
    assert f"{run / 'ckpt' / 'tokenizer.json'} is missing (no tokenizer)" in err, err
    assert _snapshot(out) == before


def test_data_that_is_not_utf8_is_named(ckpt_and_data, tmp_path, capsys, tiny):
    "A `--data` file in another encoding: the one line names the file and where it stops reading."
    ckpt, data = ckpt_and_data
    latin = tmp_path / 'latin1.jsonl'
    latin.write_bytes(data.read_bytes() + '{"problem": "Café?", "answer": "1"}\n'.encode('latin-1'))
    out = tmp_path / 'run'
    argv = ['--model', str(ckpt), '--data', str(latin), '--out', str(out)] + tiny
    assert train_cli(argv) == 2
    err = capsys.readouterr().err
    start = f"hara-ref train: error: --data {latin}: not UTF-8 text (invalid continuation byte at "
    assert err.startswith(start) and err.count('\n') == 1, err
    assert not out.exists()
