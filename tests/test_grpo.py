"""Property tests, trainer cross-checks and failure cases for hara_ref.rlvr.grpo (chapter 04_grpo)
and hara_ref.engine.conventions (chapter 39_trainer_conventions).

The numpy functions below re-implement, independently of hara_ref, the formulas read in TRL
`trl/trainer/grpo_trainer.py` (`_generate_and_score_completions`, `_compute_loss`) and verl
`verl/trainer/ppo/core_algos.py` (`compute_grpo_outcome_advantage`,
`compute_rloo_outcome_advantage`, `compute_policy_loss_vanilla`, `agg_loss`, `kl_penalty`).
"""

import math
from collections import defaultdict

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st, HealthCheck

from hara_ref.rlvr.grpo import (
    masked_mean,
    group_stats,
    group_advantages,
    token_advantages,
    k3_kl,
    clipped_token_loss,
)
from hara_ref.engine.conventions import (
    AGG_MODES,
    trainer_advantages,
    trl_advantages,
    verl_advantages,
    base_advantages,
    aggregate_loss,
    ppo_clip_loss,
    dynamic_sampling_mask,
    overlong_penalty,
)

SET = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
f64 = torch.float64

# ---------------------------------------------------------------- numpy reference implementations


def np_trl_advantages(r, G, scale_rewards='group'):
    """TRL: rewards.view(-1, G); group mean; unbiased std per group or over the batch; / (std +
    1e-4)."""
    r = np.asarray(r, dtype=np.float64)
    grp = r.reshape(-1, G)
    mean = np.repeat(grp.mean(1), G)
    if scale_rewards in ('group', 'none'):
        std = np.repeat(grp.std(1, ddof=1), G) if G > 1 else np.zeros_like(r)
    else:
        std = np.full_like(r, r.std(ddof=1) if r.size > 1 else 0.0)
    adv = r - mean
    return adv / (std + 1e-4) if scale_rewards != 'none' else adv


def np_verl_grpo(r, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True):
    """verl compute_grpo_outcome_advantage: group of one -> mean 0, std 1, both float32 tensors
    (`torch.tensor(0.0)`, `torch.tensor(1.0)`), so its std + epsilon is a float32 sum."""
    r = np.asarray(r, dtype=np.float64)
    out = r.copy()
    by = defaultdict(list)
    for i, g in enumerate(index):
        by[g].append(r[i])
    mean = {g: (0.0 if len(v) == 1 else np.mean(v)) for g, v in by.items()}
    one = np.float32(1.0)
    den = {
        g: (one + np.float32(epsilon) if len(v) == 1 else np.std(v, ddof=1) + epsilon)
        for g, v in by.items()
    }
    for i, g in enumerate(index):
        out[i] = (r[i] - mean[g]) / den[g] if norm_adv_by_std_in_grpo else r[i] - mean[g]
    return out


def np_verl_rloo(r, index):
    """verl compute_rloo_outcome_advantage: n/(n-1) (r - mean); a group of one is left unchanged."""
    r = np.asarray(r, dtype=np.float64)
    out = r.copy()
    by = defaultdict(list)
    for i, g in enumerate(index):
        by[g].append(r[i])
    for i, g in enumerate(index):
        n = len(by[g])
        if n > 1:
            out[i] = r[i] * n / (n - 1) - np.mean(by[g]) * n / (n - 1)
    return out


def np_verl_policy_loss(
    old, logp, adv, mask, clip_low, clip_high, clip_ratio_c, agg, max_len=None, dual=True
):
    """verl 0.9.1 compute_policy_loss_vanilla + agg_loss: the seq-mean modes average over the rows
    with a token (`seq_mask`), and seq-mean-token-sum-norm divides that mean by L."""
    nak = np.clip(logp - old, -20, 20)
    ratio = np.exp(nak)
    l1 = -adv * ratio
    l2 = -adv * np.clip(ratio, 1 - clip_low, 1 + clip_high)
    c1 = np.maximum(l1, l2)
    if dual:
        c2 = np.minimum(-adv * clip_ratio_c, c1)
        pg = np.where(adv < 0, c2, c1)
    else:
        pg = c1
    m = mask.astype(np.float64)
    rows = (m.sum(-1) > 0).sum()  # verl's seq_mask: rows with a token
    if agg == 'token-mean':
        return (pg * m).sum() / m.sum()
    if agg == 'seq-mean-token-sum':
        return (pg * m).sum(-1).sum() / rows
    if agg == 'seq-mean-token-mean':
        return ((pg * m).sum(-1) / np.maximum(m.sum(-1), 1)).sum() / rows
    L = mask.shape[-1] if max_len is None else max_len
    return (pg * m).sum(-1).sum() / rows / L


def np_trl_loss(
    old,
    logp,
    adv,
    mask,
    eps_low,
    eps_high,
    loss_type,
    max_completion_length=None,
    beta=0.0,
    ref=None,
):
    """TRL _compute_loss: coef_1 = exp(logp - old), -min(coef_1 A, clamp(coef_1) A) (+ beta k3)."""
    c1 = np.exp(logp - old)
    c2 = np.clip(c1, 1 - eps_low, 1 + eps_high)
    ptl = -np.minimum(c1 * adv, c2 * adv)
    if beta != 0.0:
        ptl = ptl + beta * (np.exp(ref - logp) - (ref - logp) - 1)
    m = mask.astype(np.float64)
    if loss_type == 'grpo':
        return ((ptl * m).sum(-1) / np.maximum(m.sum(-1), 1.0)).mean()
    if loss_type == 'bnpo':
        return (ptl * m).sum() / max(m.sum(), 1.0)
    if loss_type == 'dr_grpo':
        return (ptl * m).sum() / (ptl.shape[0] * max_completion_length)
    raise ValueError(loss_type)


# ---------------------------------------------------------------- strategies


@st.composite
def grouped_rewards(draw, binary=None, min_size=1, max_size=24):
    B = draw(st.integers(min_size, max_size))
    binary = draw(st.booleans()) if binary is None else binary
    el = st.sampled_from([0.0, 1.0]) if binary else st.floats(-10, 10, allow_nan=False, width=64)
    r = draw(st.lists(el, min_size=B, max_size=B))
    g = draw(st.lists(st.integers(0, 4), min_size=B, max_size=B))
    return torch.tensor(r, dtype=f64), torch.tensor(g)


@st.composite
def contiguous_groups(draw):
    G = draw(st.integers(2, 6))
    P = draw(st.integers(1, 5))
    r = draw(
        st.lists(
            st.one_of(st.sampled_from([0.0, 1.0]), st.floats(-5, 5, width=64)),
            min_size=P * G,
            max_size=P * G,
        )
    )
    return np.array(r), G


# ---------------------------------------------------------------- group advantages: properties


@SET
@given(
    rg=grouped_rewards(),
    method=st.sampled_from(['grpo', 'drgrpo', 'rloo']),
    scale=st.sampled_from(['group', 'batch', 'none']),
)
def test_group_mean_zero(rg, method, scale):
    r, g = rg
    adv = trainer_advantages(r, g, method, scale=scale)
    assert torch.isfinite(adv).all()
    # sum_i (r_i - mean_g) is 0 up to rounding; GRPO then divides by (std + eps) >= eps = 1e-6
    amplify = 1e6 if method == 'grpo' and scale != 'none' else 1.0
    for k in g.unique():
        sel = g == k
        assert abs(adv[sel].sum().item()) <= 1e-12 * amplify * (1 + r[sel].abs().sum().item())


@SET
@given(
    rg=grouped_rewards(),
    method=st.sampled_from(['grpo', 'drgrpo', 'rloo']),
    singleton=st.sampled_from(['zero', 'verl']),
    seed=st.integers(0, 10**6),
)
def test_permutation_equivariance(rg, method, singleton, seed):
    r, g = rg
    perm = torch.randperm(len(r), generator=torch.Generator().manual_seed(seed))
    a = trainer_advantages(r, g, method, singleton=singleton)
    b = trainer_advantages(r[perm], g[perm], method, singleton=singleton)
    torch.testing.assert_close(b, a[perm], rtol=1e-12, atol=1e-12)
    # relabelling the groups (ints -> strings, other order) changes nothing
    c = trainer_advantages(r, [f'prompt-{9 - int(x)}' for x in g], method, singleton=singleton)
    torch.testing.assert_close(c, a, rtol=1e-12, atol=1e-12)


@SET
@given(rg=grouped_rewards(binary=False), a=st.floats(0.1, 10), b=st.floats(-5, 5))
def test_grpo_affine_invariance(rg, a, b):
    r, g = rg
    x = group_advantages(r, g, 'grpo', eps=0.0)
    y = group_advantages(a * r + b, g, 'grpo', eps=0.0)
    _, sd, _ = group_stats(r, g)
    ok = torch.nan_to_num(sd, nan=0.0) > 1e-6  # groups with real spread (others are ~0 in both)
    torch.testing.assert_close(y[ok], x[ok], rtol=1e-6, atol=1e-6)


@SET
@given(
    rg=grouped_rewards(),
    method=st.sampled_from(['grpo', 'drgrpo', 'rloo']),
    eps=st.sampled_from([0.0, 1e-6, 1e-4]),
)
def test_lesson_advantages_are_the_engines_at_its_defaults(rg, method, eps):
    r, g = rg
    assert torch.equal(group_advantages(r, g, method, eps), trainer_advantages(r, g, method, eps))
    assert torch.equal(
        group_advantages(r.float(), g, method), trainer_advantages(r.float(), g, method)
    )
    for m in ('grpo', 'drgrpo', 'dapo', 'rloo'):
        assert torch.equal(group_advantages(r, g, m), base_advantages(r, g, m))


@SET
@given(rg=grouped_rewards())
def test_rloo_is_leave_one_out(rg):
    r, g = rg
    adv = group_advantages(r, g, 'rloo')
    for i in range(len(r)):
        others = [r[j].item() for j in range(len(r)) if g[j] == g[i] and j != i]
        want = r[i].item() - np.mean(others) if others else 0.0
        assert adv[i].item() == pytest.approx(want, abs=1e-9)


@SET
@given(rg=grouped_rewards())
def test_group_stats_match_numpy(rg):
    r, g = rg
    mean, std, cnt = group_stats(r, g)
    for i in range(len(r)):
        v = r[g == g[i]].numpy()
        assert mean[i].item() == pytest.approx(v.mean(), abs=1e-9)
        assert cnt[i].item() == len(v)
        if len(v) > 1:
            assert std[i].item() == pytest.approx(v.std(ddof=1), abs=1e-9)
        else:
            assert math.isnan(std[i].item())


# ---------------------------------------------------------------- the two trainers, against numpy


@SET
@given(cg=contiguous_groups(), scale=st.sampled_from(['group', 'batch', 'none']))
def test_trl_advantages_match_numpy(cg, scale):
    r, G = cg
    gid = torch.arange(len(r) // G).repeat_interleave(G)
    ours = trl_advantages(torch.tensor(r), gid, scale_rewards=scale).numpy()
    np.testing.assert_allclose(ours, np_trl_advantages(r, G, scale), rtol=1e-10, atol=1e-10)


def test_trl_bool_scale_rewards():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=f64)
    g = torch.tensor([0, 0, 1, 1])
    torch.testing.assert_close(trl_advantages(r, g, True), trl_advantages(r, g, 'group'))
    torch.testing.assert_close(trl_advantages(r, g, False), trl_advantages(r, g, 'none'))


@SET
@given(rg=grouped_rewards(), norm=st.booleans())
def test_verl_advantages_match_numpy(rg, norm):
    r, g = rg
    ours = verl_advantages(r, g, norm_adv_by_std_in_grpo=norm).numpy()
    np.testing.assert_allclose(
        ours,
        np_verl_grpo(r.numpy(), g.tolist(), norm_adv_by_std_in_grpo=norm),
        rtol=1e-10,
        atol=1e-10,
    )
    np.testing.assert_allclose(
        verl_advantages(r, g, adv_estimator='rloo').numpy(),
        np_verl_rloo(r.numpy(), g.tolist()),
        rtol=1e-10,
        atol=1e-10,
    )


@SET
@given(
    B=st.integers(1, 6),
    T=st.integers(1, 6),
    seed=st.integers(0, 10**6),
    agg=st.sampled_from(AGG_MODES),
    dual=st.booleans(),
    max_len=st.one_of(st.none(), st.integers(1, 10)),
    per_token_adv=st.booleans(),
)
def test_policy_loss_matches_verl_numpy(B, T, seed, agg, dual, max_len, per_token_adv):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=f64) * 3
    logp = old + torch.randn(B, T, generator=g, dtype=f64) * 0.6
    adv = (
        torch.randn(B, T, generator=g, dtype=f64)
        if per_token_adv
        else torch.randn(B, generator=g, dtype=f64)
    )
    mask = torch.rand(B, T, generator=g) < 0.7
    mask[0, 0] = True
    A = adv if per_token_adv else adv[:, None].expand(B, T)
    A = torch.where(mask, A, torch.zeros_like(A))  # verl/TRL carry A * mask into the loss
    want = np_verl_policy_loss(
        old.numpy(), logp.numpy(), A.numpy(), mask.numpy(), 0.2, 0.28, 3.0, agg, max_len, dual
    )
    got, stats = ppo_clip_loss(
        logp,
        old,
        adv,
        mask,
        0.2,
        0.28,
        dual_clip=3.0 if dual else None,
        agg=agg,
        max_len=max_len,
        empty_rows='skip',
    )
    assert got.item() == pytest.approx(want, rel=1e-10, abs=1e-12)
    assert 0.0 <= stats['clip_frac'] <= 1.0


@SET
@given(
    B=st.integers(1, 6),
    T=st.integers(1, 6),
    seed=st.integers(0, 10**6),
    loss_type=st.sampled_from(['grpo', 'bnpo', 'dr_grpo']),
    beta=st.sampled_from([0.0, 0.04]),
)
def test_policy_loss_matches_trl_numpy(B, T, seed, loss_type, beta):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=f64) * 3
    logp = old + torch.randn(B, T, generator=g, dtype=f64) * 0.3
    ref = old + torch.randn(B, T, generator=g, dtype=f64) * 0.3
    adv = torch.randn(B, generator=g, dtype=f64)
    mask = torch.rand(B, T, generator=g) < 0.7
    mask[-1, 0] = True
    L = T + 3
    agg = {
        'grpo': 'seq-mean-token-mean',
        'bnpo': 'token-mean',
        'dr_grpo': 'seq-mean-token-sum-norm',
    }[loss_type]
    want = np_trl_loss(
        old.numpy(),
        logp.numpy(),
        adv.numpy()[:, None],
        mask.numpy(),
        0.2,
        0.28,
        loss_type,
        L,
        beta,
        ref.numpy(),
    )
    got, _ = ppo_clip_loss(
        logp,
        old,
        adv,
        mask,
        0.2,
        0.28,
        ref_logp=ref if beta else None,
        beta=beta,
        agg=agg,
        max_len=L,
    )
    assert got.item() == pytest.approx(want, rel=1e-10, abs=1e-12)


# ---------------------------------------------------------------- loss: gradients and KL


@SET
@given(
    B=st.integers(1, 5),
    T=st.integers(1, 6),
    V=st.integers(2, 6),
    seed=st.integers(0, 10**6),
    agg=st.sampled_from(AGG_MODES),
    dual=st.booleans(),
)
def test_gradient_at_ratio_one_is_reinforce(B, T, V, seed, agg, dual):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=g, dtype=f64, requires_grad=True)
    tok = torch.randint(0, V, (B, T), generator=g)
    mask = torch.rand(B, T, generator=g) < 0.7
    mask[0, -1] = True
    adv = torch.randn(B, generator=g, dtype=f64)
    lp = lambda: torch.log_softmax(logits, -1).gather(-1, tok[..., None]).squeeze(-1)
    l = lp()
    (g1,) = torch.autograd.grad(
        ppo_clip_loss(
            l, l.detach(), adv, mask, 0.2, 0.28, dual_clip=3.0 if dual else None, agg=agg, max_len=9
        )[0],
        logits,
    )
    (g2,) = torch.autograd.grad(aggregate_loss(-adv[:, None] * lp(), mask, agg, max_len=9), logits)
    torch.testing.assert_close(g1, g2, rtol=1e-12, atol=1e-14)


@SET
@given(
    n=st.integers(1, 30),
    seed=st.integers(0, 10**6),
    eps_low=st.floats(0.05, 0.5),
    eps_high=st.floats(0.05, 0.5),
    c=st.one_of(st.none(), st.floats(1.6, 5.0)),
)
def test_sign_aware_clipping(n, seed, eps_low, eps_high, c):
    g = torch.Generator().manual_seed(seed)
    rho = torch.exp(torch.randn(n, generator=g, dtype=f64) * 0.8)
    A = torch.randn(n, generator=g, dtype=f64)
    lp = rho.log()[None].clone().requires_grad_()
    ppo_clip_loss(
        lp,
        torch.zeros_like(lp),
        A[None],
        torch.ones(1, n, dtype=torch.bool),
        eps_low,
        eps_high,
        dual_clip=c,
        agg='token-mean',
    )[0].backward()
    clipped = ((A > 0) & (rho > 1 + eps_high)) | ((A < 0) & (rho < 1 - eps_low))
    if c is not None:
        clipped |= (A < 0) & (rho > c)
    want = torch.where(clipped, torch.zeros_like(rho), -A * rho / n)
    torch.testing.assert_close(lp.grad[0], want, rtol=1e-12, atol=1e-15)
    assert torch.equal(lp.grad[0] == 0, clipped | (A == 0))


@SET
@given(seed=st.integers(0, 10**6), clamp=st.booleans())
def test_k3_nonnegative_zero_at_equal(seed, clamp):
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(50, generator=g, dtype=f64) * 4, torch.randn(50, generator=g, dtype=f64) * 4
    assert (k3_kl(a, b, clamp) >= 0).all()
    assert torch.equal(k3_kl(a, a, clamp), torch.zeros_like(a))
    if not clamp:
        torch.testing.assert_close(k3_kl(a, b), torch.exp(b - a) - (b - a) - 1)


def test_k3_verl_clamp():
    out = k3_kl(torch.tensor([0.0]), torch.tensor([30.0]), clamp=True)
    assert out.item() == 10.0  # verl clamps k3 to [-10, 10]
    assert torch.isfinite(k3_kl(torch.tensor([0.0]), torch.tensor([1000.0]), clamp=True)).all()


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_float32_float64_agree_and_finite(dtype):
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(8, 12, generator=g, dtype=f64) * 5
    logp = old + torch.randn(8, 12, generator=g, dtype=f64) * 0.5
    ref = old + 0.1
    mask = torch.rand(8, 12, generator=g) < 0.8
    adv = group_advantages(
        torch.tensor([1.0, 0, 0, 1, 1, 1, 0, 0], dtype=f64), [0, 0, 0, 0, 1, 1, 1, 1]
    )
    out = {}
    for dt in (dtype, f64):
        l, s = ppo_clip_loss(
            logp.to(dt),
            old.to(dt),
            adv.to(dt),
            mask,
            0.2,
            0.28,
            3.0,
            ref.to(dt),
            0.05,
            'token-mean',
        )
        assert l.dtype == dt and torch.isfinite(l)
        out[dt] = l.item()
    assert out[dtype] == pytest.approx(out[f64], rel=1e-5)
    assert group_advantages(torch.tensor([1.0, 0, 1], dtype=dtype), [0, 0, 0]).dtype == dtype


# ---------------------------------------------------------------- aggregation, masks, DAPO


def test_aggregation_hand_example():
    L = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    m = torch.tensor([[1, 1, 0], [1, 1, 1]]).bool()
    want = {
        'token-mean': 3.6,
        'seq-mean-token-mean': 3.25,
        'seq-mean-token-sum': 9.0,
        'seq-mean-token-sum-norm': 3.0,
    }
    for agg, v in want.items():
        assert aggregate_loss(L, m, agg).item() == pytest.approx(v)
    assert aggregate_loss(L, m, 'seq-mean-token-sum-norm', max_len=4).item() == pytest.approx(2.25)


def test_masked_mean_and_token_advantages():
    x = torch.tensor([[1.0, float('inf')], [3.0, 5.0]])
    m = torch.tensor([[1, 0], [1, 1]]).bool()
    assert masked_mean(x, m).item() == pytest.approx(3.0)
    assert masked_mean(x, m, dim=0).tolist() == [2.0, 5.0]
    ta = token_advantages(torch.tensor([1.5, -2.0]), m)
    assert ta.tolist() == [[1.5, 0.0], [-2.0, -2.0]]
    # a row with an empty mask gets zeros (documented value)
    assert token_advantages(
        torch.tensor([1.5, -2.0]), torch.tensor([[0, 0], [1, 0]]).bool()
    ).tolist() == [[0.0, 0.0], [-2.0, 0.0]]


@SET
@given(rg=grouped_rewards())
def test_dynamic_sampling_mask(rg):
    r, g = rg
    keep = dynamic_sampling_mask(r, g)
    for i in range(len(r)):
        v = r[g == g[i]]
        assert keep[i].item() == bool(v.max() > v.min())
    # kept groups are exactly those with a non-zero GRPO advantage somewhere (for 0/1 rewards)
    if set(r.tolist()) <= {0.0, 1.0}:
        adv = group_advantages(r, g)
        for k in g.unique():
            sel = g == k
            assert bool(keep[sel].all()) == bool((adv[sel] != 0).any())


@SET
@given(Lmax=st.integers(2, 100), data=st.data())
def test_overlong_penalty(Lmax, data):
    Lc = data.draw(st.integers(1, Lmax))
    Ls = torch.arange(0, Lmax + 5)
    p = overlong_penalty(Ls, Lmax, Lc)
    assert ((p <= 0) & (p >= -1)).all()
    assert (p[1:] <= p[:-1] + 1e-12).all()  # non-increasing in length
    assert (p[Ls <= Lmax - Lc] == 0).all() and (p[Ls > Lmax] == -1).all()
    mid = (Ls > Lmax - Lc) & (Ls <= Lmax)
    torch.testing.assert_close(p[mid], ((Lmax - Lc) - Ls[mid].to(p.dtype)) / Lc)


# ---------------------------------------------------------------- failure cases


@pytest.mark.parametrize(
    'bad, msg',
    [
        (lambda: trainer_advantages(torch.tensor([1.0, float('nan')]), [0, 0]), 'NaN'),
        (lambda: group_advantages(torch.tensor([1.0, float('inf')]), [0, 0]), 'finite'),
        (lambda: group_advantages(torch.tensor([1.0, 0.0]), [0, 0], 'ppo'), 'method must be'),
        (lambda: trainer_advantages(torch.tensor([1.0, float('inf')]), [0, 0]), 'inf'),
        (
            lambda: trainer_advantages(torch.tensor([1.0, 0.0]), [0, 0, 1]),
            '3 entries for 2 rewards',
        ),
        (
            lambda: trainer_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0, 1])),
            'group_ids must be (2,)',
        ),
        (
            lambda: trainer_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])),
            'integer ids',
        ),
        (lambda: trainer_advantages(torch.zeros(2, 2), [0, 0]), '1-D'),
        (lambda: trainer_advantages(torch.zeros(0), []), 'non-empty'),
        (
            lambda: trainer_advantages(torch.tensor([1.0, 0.0, 1.0]), [0, 0, 1], singleton='raise'),
            'groups of size 1',
        ),
        (lambda: trainer_advantages(torch.tensor([1.0, 0.0]), [0, 0], 'ppo'), 'method must be'),
        (
            lambda: trainer_advantages(torch.tensor([1.0, 0.0]), [0, 0], scale='global'),
            'scale must be',
        ),
        (lambda: trainer_advantages(torch.tensor([1.0, 0.0]), [0, 0], eps=-1.0), 'eps must be'),
        (
            lambda: verl_advantages(torch.tensor([1.0, 0.0]), [0, 0], adv_estimator='gae'),
            'adv_estimator',
        ),
        (lambda: base_advantages(torch.tensor([1.0, 0.0]), [0, 0], 'ppo'), 'method must be'),
        (lambda: token_advantages(torch.ones(3), torch.ones(2, 2)), 'need advantages (B,)'),
        (lambda: masked_mean(torch.ones(2, 2), torch.zeros(2, 2)), 'mask is empty'),
        (
            lambda: aggregate_loss(torch.ones(2, 2), torch.zeros(2, 2), 'token-mean'),
            'mask is empty',
        ),
        (
            lambda: aggregate_loss(torch.ones(2, 2), torch.ones(2, 3), 'token-mean'),
            'same (B, T) shape',
        ),
        (
            lambda: aggregate_loss(
                torch.ones(2, 2), torch.ones(2, 2), 'seq-mean-token-sum-norm', max_len=0
            ),
            'max_len must be positive',
        ),
        (
            lambda: ppo_clip_loss(
                torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.zeros(2, 3)
            ),
            'mask is empty',
        ),
        (
            lambda: ppo_clip_loss(
                torch.zeros(2, 3), torch.zeros(3, 3), torch.zeros(2), torch.ones(2, 3)
            ),
            'old_logp (3, 3)',
        ),
        (
            lambda: ppo_clip_loss(
                torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 2), torch.ones(2, 3)
            ),
            'advantages must be',
        ),
        (
            lambda: ppo_clip_loss(
                torch.zeros(2, 3),
                torch.zeros(2, 3),
                torch.zeros(2),
                torch.ones(2, 3),
                ref_logp=torch.zeros(2, 2),
                beta=1.0,
            ),
            'ref_logp (2, 2)',
        ),
        (
            lambda: ppo_clip_loss(
                torch.zeros(2, 3),
                torch.full((2, 3), float('nan')),
                torch.zeros(2),
                torch.ones(2, 3),
            ),
            'NaN',
        ),
        (
            lambda: ppo_clip_loss(
                torch.zeros(2, 3),
                torch.zeros(2, 3),
                torch.zeros(2),
                torch.ones(2, 3),
                clip_eps_low=1.0,
            ),
            'clip_eps_low',
        ),
        (
            lambda: ppo_clip_loss(
                torch.zeros(2, 3),
                torch.zeros(2, 3),
                torch.zeros(2),
                torch.ones(2, 3),
                dual_clip=1.0,
            ),
            'dual_clip must be > 1',
        ),
        (
            lambda: ppo_clip_loss(
                torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3), beta=-1.0
            ),
            'beta must be >= 0',
        ),
        (lambda: k3_kl(torch.zeros(2), torch.zeros(3)), 'differ in shape'),
        (lambda: dynamic_sampling_mask(torch.tensor([0.0, float('nan')]), [0, 0]), 'NaN'),
        (lambda: overlong_penalty([3, 4], 10, 11), '0 < cache_len <= max_len'),
        (lambda: overlong_penalty([-1], 10, 2), 'non-negative'),
    ],
)
def test_bad_input(bad, msg):
    with pytest.raises((ValueError, TypeError)) as e:
        bad()
    assert msg in str(e.value)


@SET
@given(
    B=st.integers(1, 5),
    T=st.integers(1, 6),
    seed=st.integers(0, 10**6),
    clip=st.sampled_from([(0.2, 0.2), (0.2, 0.28), (0.1, 0.5)]),
    beta=st.sampled_from([0.0, 0.04]),
)
def test_lesson_loss_is_the_engines_at_its_settings(B, T, seed, clip, beta):
    g = torch.Generator().manual_seed(seed)
    lp = -3 * torch.rand(B, T, generator=g, dtype=f64)
    old = lp + 0.5 * torch.randn(B, T, generator=g, dtype=f64)
    ref = lp + 0.3 * torch.randn(B, T, generator=g, dtype=f64)
    m = torch.rand(B, T, generator=g) < 0.7
    m[0, 0] = True
    A = torch.randn(B, generator=g, dtype=f64)
    x1, x2 = lp.clone().requires_grad_(), lp.clone().requires_grad_()
    eng = ppo_clip_loss(x1, old, A, m, *clip, ref_logp=ref, beta=beta)[0]
    les = clipped_token_loss(x2, old, token_advantages(A, m), m, *clip, ref, beta)
    eng.backward()
    les.backward()
    torch.testing.assert_close(les, eng, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(x2.grad, x1.grad, rtol=1e-13, atol=1e-13)


def test_nan_at_padding_never_leaks():
    logp = torch.tensor([[-1.0, float('nan'), float('-inf')]], requires_grad=True)
    m = torch.tensor([[True, False, False]])
    loss, stats = ppo_clip_loss(
        logp,
        torch.tensor([[-1.2, float('nan'), 0.0]]),
        torch.tensor([1.0]),
        m,
        ref_logp=torch.tensor([[-1.0, float('nan'), 3.0]]),
        beta=0.1,
        agg='token-mean',
    )
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert logp.grad[0, 1:].abs().sum() == 0
    assert all(math.isfinite(v) for v in stats.values())


def test_verl_singleton_constants_are_float32():
    "verl's group of one: (r - torch.tensor(0.0)) / (torch.tensor(1.0) + eps), float32 constants."
    r, g = torch.tensor([2.0, 1.0, 0.0], dtype=f64), [7, 8, 8]
    for eps in (1e-6, 1e-3):
        den = float(torch.tensor(1.0, dtype=torch.float32) + eps)
        assert verl_advantages(r, g, epsilon=eps)[0].item() == 2.0 / den != 2.0 / (1 + eps)
    assert verl_advantages(r, g, norm_adv_by_std_in_grpo=False)[0].item() == 2.0  # no constant
    assert verl_advantages(r, g, adv_estimator='rloo')[0].item() == 2.0


def test_empty_rows_count_or_skip():
    L = torch.tensor([[1.0, 2.0], [5.0, 5.0]], dtype=f64)
    m = torch.tensor([[True, True], [False, False]])
    assert aggregate_loss(L, m, 'seq-mean-token-mean').item() == 0.75
    assert aggregate_loss(L, m, 'seq-mean-token-mean', empty_rows='skip').item() == 1.5
    assert aggregate_loss(L, m, 'seq-mean-token-sum', empty_rows='skip').item() == 3.0
    assert aggregate_loss(L, m, 'seq-mean-token-sum-norm', empty_rows='skip').item() == 1.5
    assert aggregate_loss(L, m, 'token-mean', empty_rows='skip').item() == 1.5
    with pytest.raises(ValueError, match="empty_rows must be 'count' or 'skip', got 'drop'"):
        aggregate_loss(L, m, empty_rows='drop')
