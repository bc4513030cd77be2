"""Property tests, cross-checks and failure cases for hara_ref.methods.hp_rlvr (chapter
50_hp_rlvr): hindsight weights, historical baseline, the trainer step."""

import math
import os
import re
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st, HealthCheck
from scipy.spatial.distance import jensenshannon

os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('MPLBACKEND', 'Agg')
from hara_ref.methods.hp_rlvr import HOOKS
from hara_ref.methods.hp_rlvr import (
    hindsight_weights,
    history_baseline,
    update_history,
    hindsight_credit,
    hindsight_context,
    response_logits,
    hp_rlvr_step,
)
from hara_ref.practice.commands import hp_variants, compare_hp_cli
from hara_ref.train.policy import char_tokenizer, tiny_qwen3
from hara_ref.engine.verifier import rounding_tol
from hara_ref.trainer.step import TrainConfig, rl_step
from hara_ref.trainer.loop import read_jsonl, load_trainer_state
from hara_ref.practice.cli import train_cli, train_parser, configs_from_args


SET = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def logits(seed, B, T, V, scale=3.0, dtype=torch.float64):
    return torch.randn(B, T, V, generator=torch.Generator().manual_seed(seed), dtype=dtype) * scale


@pytest.mark.float32
@SET
@given(
    seed=st.integers(0, 10**6),
    B=st.integers(1, 3),
    T=st.integers(1, 5),
    V=st.integers(2, 40),
    scale=st.sampled_from([0.1, 3.0, 30.0]),
)
def test_weights_bounded_symmetric_and_match_scipy(seed, B, T, V, scale):
    p, q = logits(seed, B, T, V, scale), logits(seed + 1, B, T, V, scale)
    mask = torch.ones(B, T, dtype=torch.bool)
    w = hindsight_weights(p, q, mask)  # (B, T)
    assert ((w >= 0) & (w <= 1)).all()
    assert torch.equal(w, hindsight_weights(q, p, mask))
    # scipy returns sqrt(JSD)
    ref = (
        jensenshannon(torch.softmax(p, -1).numpy(), torch.softmax(q, -1).numpy(), axis=-1, base=2)
        ** 2
    )
    np.testing.assert_allclose(w.numpy(), ref, atol=1e-10)
    # same distribution: 0
    assert torch.allclose(hindsight_weights(p, p + 5.0, mask), torch.zeros_like(w), atol=1e-12)
    w32 = hindsight_weights(p.float(), q.float(), mask).double()  # (B, T)
    tol = rounding_tol(p.abs().max() + q.abs().max(), n=V)  # float32 log-softmax over V logits
    assert torch.allclose(w32, w, rtol=0, atol=tol)  # float32 agrees, to its rounding


@SET
@given(seed=st.integers(0, 10**6), V=st.integers(2, 30), split=st.floats(0.1, 0.9))
def test_disjoint_supports_give_one(seed, V, split):
    k = max(1, min(V - 1, int(split * V)))
    p, q = logits(seed, 2, 3, V), logits(seed + 7, 2, 3, V)
    p[..., k:] = -math.inf
    q[..., :k] = -math.inf
    w = hindsight_weights(p, q, torch.ones(2, 3, dtype=torch.bool))
    assert torch.allclose(w, torch.ones_like(w), atol=1e-12) and torch.isfinite(w).all()


def test_padding_and_dtypes():
    p, q = logits(0, 2, 4, 9), logits(1, 2, 4, 9)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]]).bool()
    w = hindsight_weights(p, q, mask)
    # garbage on padding only
    p2 = p.clone()
    p2[0, 2:] = float('nan')
    q2 = q.clone()
    q2[0, 3] = math.inf
    assert torch.equal(hindsight_weights(p2, q2, mask), w) and (w[0, 2:] == 0).all()
    assert hindsight_weights(p.bfloat16(), q.bfloat16(), mask).dtype == torch.float32
    assert (
        hindsight_weights(p.float(), q.float(), mask).dtype == torch.float32
        and w.dtype == torch.float64
    )


@pytest.mark.parametrize(
    'args,msg',
    [
        ((logits(0, 2, 3, 5), logits(0, 2, 3, 6), torch.ones(2, 3)), 'both be (B, T, V)'),
        ((logits(0, 2, 3, 5)[0], logits(0, 2, 3, 5)[0], torch.ones(3)), 'both be (B, T, V)'),
        ((logits(0, 2, 3, 5), logits(0, 2, 3, 5), torch.ones(2, 4)), 'does not match logits'),
        ((logits(0, 2, 3, 5), logits(0, 2, 3, 5), torch.zeros(2, 3)), 'mask is empty'),
        (
            (
                logits(0, 2, 3, 5).index_fill(2, torch.tensor([1]), float('nan')),
                logits(0, 2, 3, 5),
                torch.ones(2, 3),
            ),
            'causal logits contain NaN',
        ),
        (
            (
                logits(0, 2, 3, 5),
                logits(0, 2, 3, 5).index_fill(2, torch.tensor([1]), math.inf),
                torch.ones(2, 3),
            ),
            'hindsight logits contain NaN or +inf',
        ),
        ((torch.full((1, 2, 3), -math.inf), torch.zeros(1, 2, 3), torch.ones(1, 2)), 'all -inf'),
    ],
)
def test_bad_logits(args, msg):
    with pytest.raises(ValueError, match=re.escape(msg)):
        hindsight_weights(*args)


def test_baseline_history():
    h = {}
    assert history_baseline(h, ['a'], default=0.25).tolist() == [0.25]
    update_history(h, ['a', 'b', 'a'], torch.tensor([1.0, 0.0, 0.0]))
    assert history_baseline(h, ['a', 'b', 'c']).tolist() == [0.5, 0.0, 1 / 3]
    update_history(h, ['c'], [1.0])
    # c has history now; d gets the global mean 2/4
    assert history_baseline(h, ['c', 'd']).tolist() == [1.0, 0.5]
    with pytest.raises(ValueError, match='must be finite'):
        update_history(h, ['a'], [float('nan')])
    with pytest.raises(ValueError, match='2 keys for 1 rewards'):
        update_history(h, ['a', 'b'], [1.0])


@SET
@given(r=st.lists(st.sampled_from([0.0, 1.0]), min_size=1, max_size=6), seed=st.integers(0, 100))
def test_zero_credit_when_reward_equals_baseline(r, seed):
    w = torch.rand(len(r), 5, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    A = hindsight_credit(torch.tensor(r), torch.tensor(r), w)
    assert (A == 0).all()
    b = torch.full((len(r),), 0.5)
    A = hindsight_credit(torch.tensor(r), b, w)
    assert torch.equal(
        torch.sign(A), torch.sign(torch.tensor(r) - 0.5)[:, None].expand_as(A).double() * (w > 0)
    )
    assert (A.abs() <= 0.5).all()  # bounded: |r - b| w with w in [0, 1]


@pytest.mark.float32
def test_hindsight_context_and_logits():
    assert hindsight_context('2+2=', '4', 0.0) == '2+2=4\nverifier: wrong\n2+2='
    tok = char_tokenizer()
    net = tiny_qwen3(tok, hidden_size=32, seed=0).eval()
    ids = tok('1+1=', add_special_tokens=False)['input_ids']
    pi = torch.tensor([[tok.bos_token_id] + ids])
    ri = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        # (1, 3, V)
        lg = response_logits(
            net,
            pi,
            torch.ones_like(pi, dtype=torch.bool),
            ri,
            torch.ones_like(ri, dtype=torch.bool),
        )
        # plain causal scoring, no padding
        full = net(input_ids=torch.cat([pi, ri], 1)).logits[:, pi.shape[1] - 1 : -1]
    # another batch shape: other sums
    tol = rounding_tol(full.abs().max(), n=net.config.intermediate_size)
    assert lg.shape == (1, 3, len(tok)) and torch.allclose(lg, full.float(), rtol=0, atol=tol)


def test_grpo_zero_gradient_records_and_hp_rlvr_not():
    """All rewards 0: every GRPO group has zero spread, so every gradient record is 0; HP-RLVR's
    first step has r - b = -1/2 != 0."""
    tok = char_tokenizer()
    items = [dict(prompt=f"{a}+{b}=", answer='never') for a, b in [(1, 2), (3, 4)]]
    reward = lambda text, ans: 0.0
    net = tiny_qwen3(tok, hidden_size=32, seed=0)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    st_g = rl_step(
        net,
        opt,
        tok,
        items,
        TrainConfig(group_size=2, max_new_tokens=5),
        reward,
        torch.Generator().manual_seed(0),
    )
    assert (
        st_g['zero_grad_frac'] == 1.0 and st_g['grad_norm'] == 0.0 and st_g['zero_std_frac'] == 1.0
    )
    mem = {}
    cfg_h = TrainConfig(method="hp-rlvr", group_size=1, max_new_tokens=5)
    st_h = rl_step(
        net,
        opt,
        tok,
        items,
        cfg_h,
        reward,
        torch.Generator().manual_seed(0),
        memory=mem,
        hooks=HOOKS,
    )
    assert st_h['zero_grad_frac'] == 0.0 and st_h['grad_norm'] > 0 and st_h['zero_std_frac'] == 0.0
    assert (
        mem['hp_history']['count'] == 2
        and history_baseline(mem['hp_history'], ['1+2=']).item() == 0.0
    )
    st_h2 = hp_rlvr_step(
        net,
        opt,
        tok,
        items,
        TrainConfig(method='hp-rlvr', group_size=1, max_new_tokens=5),
        reward,
        torch.Generator().manual_seed(1),
        memory=mem,
    )
    # now r = b = 0 everywhere: no credit at all
    assert st_h2['zero_std_frac'] == 1.0 and st_h2['zero_grad_frac'] == 1.0


def test_step_scores_in_chunks_never_full_logits(monkeypatch):
    """The step reads hidden states and forms logits a chunk at a time: it never asks for the (B, T,
    V) logits."""
    import hara_ref.methods.hp_rlvr as hp

    def full_logits(*a, **k):
        raise AssertionError('hp_rlvr_step built the full (B, T, V) logits')

    monkeypatch.setattr(hp, 'response_logits', full_logits)
    tok = char_tokenizer()
    items = [dict(prompt=f"{a}+{b}=", answer=str(a + b)) for a, b in [(1, 2), (3, 4)]]
    net = tiny_qwen3(tok, hidden_size=32, seed=0)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    st_ = hp_rlvr_step(
        net,
        opt,
        tok,
        items,
        TrainConfig(method='hp-rlvr', group_size=1, max_new_tokens=5),
        lambda text, ans: float('3' in text),
        torch.Generator().manual_seed(0),
        memory={},
    )
    assert 0 <= st_['w_min'] <= st_['w_max'] <= 1 and math.isfinite(st_['entropy'])


def test_cli_flags():
    ex, cfg = configs_from_args(train_parser().parse_args(['--method', 'hp-rlvr']))
    assert cfg.group_size == 1 and ex.reweights == ('none',)
    for argv, msg in [
        (['--method', 'hp-rlvr', '-G', '4'], 'one rollout per prompt'),
        (['--method', 'hp-rlvr', '--reweight', 'hara-tok'], 'own token credit'),
    ]:
        with pytest.raises(ValueError, match=msg):
            configs_from_args(train_parser().parse_args(argv))
    v, roll = hp_variants(TrainConfig(group_size=8, prompts_per_step=8))
    assert roll == {'grpo-G8': 64, 'hp-rlvr-P8': 8, 'hp-rlvr-P64': 64}
    assert (
        v['hp-rlvr-P64'].prompts_per_step == 64
        and v['hp-rlvr-P8'].group_size == 1
        and v['grpo-G8'].method == 'grpo'
    )


@pytest.fixture
def tiny(tiny_flags):
    "Tiny runs of this chapter, without --steps: each test gives its own."
    return tiny_flags(steps=None)


def test_train_cli_hp_rlvr_and_resume(tmp_path, tiny):
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        assert (
            train_cli(['--out', str(tmp_path), '--method', 'hp-rlvr', '--steps', '2'] + tiny) == 0
        )
        run = tmp_path / 'runs' / 'hp-rlvr-s0'
        # the reward history is in the checkpoint
        assert load_trainer_state(run)['memory']['hp_history']['count'] == 2 * 3
        more = ['--steps', '3', '--resume', '--allow-config-change']  # one step more than planned
        assert train_cli(['--out', str(tmp_path), '--method', 'hp-rlvr'] + more + tiny) == 0
    # resumed with its history, one more step
    assert load_trainer_state(run)['memory']['hp_history']['count'] == 3 * 3
    rows = [r for r in read_jsonl(run / 'metrics.jsonl') if r['kind'] == 'train']
    assert [r['step'] for r in rows] == [1, 2, 3]
    for r in rows:
        assert 0 <= r['w_min'] <= r['w_mean'] <= r['w_max'] <= 1 and r['n_updates'] == 4


def test_compare_hp_cli(tmp_path, tiny):
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        assert compare_hp_cli(['--out', str(tmp_path), '--steps', '1', '-G', '2'] + tiny) == 0
    table = (tmp_path / 'compare.md').read_text()
    for v, n in (('grpo-G2', 6), ('hp-rlvr-P3', 3), ('hp-rlvr-P6', 6)):
        assert f"| {v} | {n} |" in table
