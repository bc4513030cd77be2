"""The committed fixture `nbs/results/qwen_states.pt` (real hidden states of the tiny Qwen3 that
`make train` trained, made by `tools/qwen_states.py`): it loads, its shapes and values agree, its
rewards are the countdown verifier's, and HARA's oracle runs on it; and the tool itself still runs
on a tiny random Qwen3, so it cannot rot while no trained run is at hand."""

import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hara_ref
from hara_ref.rlvr.countdown import builtin_task
from hara_ref.train.policy import char_tokenizer, tiny_qwen3
from hara_ref.train.sft import rewards_of
from hara_ref.trainer.loop import load_policy, save_policy

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / 'tools' / 'qwen_states.py'
FIXTURE = ROOT / 'nbs' / 'results' / 'qwen_states.pt'
tool = runpy.run_path(str(TOOL))


@pytest.fixture(scope='module')
def states():
    return torch.load(FIXTURE)  # weights_only: plain tensors, strings and numbers


def check_states(s: dict, n_prompts: int, samples: int, d: int):
    "The shapes, dtypes and values every file the tool writes must have."
    B = n_prompts * samples
    h, m, r, p, ids = s['hidden'], s['mask'], s['rewards'], s['prompt_ids'], s['response_ids']
    assert h.dtype == torch.float16 and m.dtype == torch.bool and r.dtype == torch.float32
    assert p.dtype == torch.long and ids.dtype == torch.long
    T = h.shape[1]
    assert h.shape == (B, T, d) and m.shape == (B, T) and ids.shape == (B, T) and r.shape == (B,)
    assert torch.isfinite(h).all()
    assert (h[~m] == 0).all() and (h[m].abs().amax(-1) > 0).all()  # zero exactly on padding
    L = m.sum(1)  # (B,) response lengths: every row non-empty, the mask a prefix of its row
    assert (L >= 1).all() and L.max() == T
    assert torch.equal(m, torch.arange(T) < L[:, None])
    assert set(r.tolist()) <= {0.0, 1.0}
    assert torch.equal(p, torch.arange(n_prompts).repeat_interleave(samples))


def test_fixture_shapes_and_meta(states):
    meta = states['meta']
    n, S = len(meta['prompts']), 16
    check_states(states, n, S, d=96)  # `make train`'s tiny Qwen3 has d = 96
    assert FIXTURE.stat().st_size < 1_500_000
    assert meta['layer'] == -1 and meta['seed'] == 0 and meta['task'] == 'countdown'
    for k in ('checkpoint', 'command', 'torch', 'transformers', 'date'):
        assert isinstance(meta[k], str) and meta[k], k
    assert states['mask'].sum(1).max() <= meta['max_new_tokens']


def test_fixture_prompts_are_held_out_and_rewards_are_the_verifiers(states):
    "The prompts are not training prompts, and decoding the responses gives the stored rewards."
    meta, task = states['meta'], builtin_task('countdown')
    train = {p.prompt for p in task.problems(4000, 'train', 0)}  # `experiment_items`' train split
    assert not set(meta['prompts']) & train
    answers = [a for a in meta['answers'] for _ in range(16)]
    r = rewards_of(char_tokenizer(), states['response_ids'], states['mask'], answers, task.reward)
    assert torch.equal(r[0], states['rewards'])
    assert 0 < states['rewards'].mean() < 1  # some rollouts right, some wrong


def test_fixture_runs_hara(states):
    "HARA's oracle on the fixture: finite advantages, zero on padding and where a group agrees."
    h, m, r, p = (states[k] for k in ('hidden', 'mask', 'rewards', 'prompt_ids'))
    A, rec = hara_ref.hara_advantages(h.double(), m, r, p)  # (B, T)
    assert A.shape == m.shape and torch.isfinite(A).all()
    assert (A[~m] == 0).all()
    base = rec.base  # (B,) GRPO's advantages
    agree = torch.tensor([r[p == i].min() == r[p == i].max() for i in p.tolist()])  # (B,)
    assert agree.any() and (~agree).any()  # the fixture has both kinds of group
    assert (A[agree] == 0).all()
    # a weight in [w_min, w_max] = [0.5, 2] scales each token's base advantage
    ratio = A[~agree][m[~agree]] / base[~agree][:, None].expand_as(A[~agree])[m[~agree]]
    assert ratio.min() >= 0.5 - 1e-9 and ratio.max() <= 2 + 1e-9 and ratio.std() > 0


def test_participation_ratio_known_spectrum():
    "Tokens +-a e1, +-b e2 give eigenvalues in ratio a^2 : b^2; padding tokens are ignored."
    a, b = 1.0, 2.0
    x = torch.zeros(1, 6, 4)
    x[0, 0, 0], x[0, 1, 0], x[0, 2, 1], x[0, 3, 1] = a, -a, b, -b
    x[0, 4:] = 100.0  # padding
    m = torch.tensor([[True] * 4 + [False] * 2])
    pr = tool['participation_ratio'](x, m)
    assert pr == pytest.approx((a**2 + b**2) ** 2 / (a**4 + b**4), rel=1e-12)  # 25 / 17


def test_tool_runs_on_tiny_random_qwen3(tmp_path):
    "The whole tool, on a tiny random Qwen3 saved to a folder (no run: the built-in countdown)."
    tok = char_tokenizer()
    save_policy(tiny_qwen3(tok, hidden_size=32, seed=0), tok, tmp_path / 'm')
    out = tmp_path / 's.pt'
    args = ['--checkpoint', str(tmp_path / 'm'), '--prompts', '2', '--samples', '3']
    assert tool['main']([*args, '--out', str(out)]) == 0
    s = torch.load(out)
    check_states(s, 2, 3, d=32)
    assert s['meta']['checkpoint'] == str(tmp_path / 'm') and len(s['meta']['prompts']) == 2
    # the stored states are the model's last layer at the response tokens, row by row
    model, _ = load_policy(tmp_path / 'm')
    for b in (0, 5):
        L = int(s['mask'][b].sum())
        prompt = tok(s['meta']['prompts'][b // 3], add_special_tokens=False)
        prompt = [tok.bos_token_id] + prompt['input_ids']
        ids = torch.tensor([prompt + s['response_ids'][b, :L].tolist()])
        with torch.no_grad():
            want = model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0, -L:]
        got = s['hidden'][b, :L].float()
        # float16 storage: a relative rounding of 2^-11 on each entry
        assert torch.allclose(got, want, rtol=2**-10, atol=1e-3 * float(want.abs().max()))


def test_usage_error_names_the_flag(tmp_path):
    out = tmp_path / 's.pt'
    cmd = [sys.executable, str(TOOL), '--prompts', '0', '--out', str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 2 and not out.exists()
    assert res.stderr.count('\n') == 1 and '--prompts' in res.stderr
