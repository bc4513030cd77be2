"""Property, cross-check and bad-input tests for HARA's novelty and weights (chapters 12_novelty,
13_hara, 42_hara_engine) and the baselines (14_baselines)."""

import math
import re
import warnings
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st, HealthCheck

from hara_ref.engine.hara_engine import hara_advantages, reweight_advantages, REWEIGHTS
from hara_ref.engine.novelty import hara_novelty
from hara_ref.hara.novelty import relative_novelty
from hara_ref.hara.rollouts import span_ids, outcome_groups, pack_slots
from hara_ref.ot.lfgw import lifted_cost
from hara_ref.hara.baselines import entropy_weights, position_weights, token_entropy, window_starts
from hara_ref.engine.baselines import shear_weights, shear_advantages
from hara_ref.practice.commands import bench_hara_cli
from hara_ref.engine.conventions import base_advantages
from hara_ref.rlvr.data import planted_stage_rollouts
from test_hara_novelty import gauss_batch as _gauss_batch  # i.i.d. Gaussian rollouts, 4 prompts x 8

SETTINGS = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Fixed iteration counts (outer and inner, per-item Sinkhorn stopping in float64): then a rollout's
# numbers do not
# depend on which other groups share the batch, up to rounding. `group_barycenters` (chapter
# 34_barycenters) also stops each outcome group
# on its own `tol`, so packing is invariant with the defaults too
# (`test_padding_and_packing_change_nothing_default_tol`).
EXACT = dict(bary_kw=dict(max_iter=3, tol=0.0, inner_rtol=0.0, stop_thr=1e-10, inner_iter=200))
# Properties that hold at any iterate (bounds, padding) are checked on a short solve: random tiny
# batches have no
# structure and the converged barycenter takes hundreds of iterations there (chapter
# 34_barycenters), which the default-tolerance
# and convergence tests below cover.
SHORT = dict(bary_kw=dict(max_iter=30, tol=1e-3))


@st.composite
def batches(draw, max_prompts=3, max_k=5, max_T=7, d=3, min_len=1):
    """Random padded batches: P prompts x K rollouts, lengths in [min_len, T], binary rewards,
    float64."""
    P, K, T = (
        draw(st.integers(1, max_prompts)),
        draw(st.integers(2, max_k)),
        draw(st.integers(1, max_T)),
    )
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    B = P * K
    hidden = torch.randn(B, T, d, generator=g, dtype=torch.float64)
    L = torch.randint(min_len, T + 1, (B,), generator=g)
    mask = torch.arange(T) < L[:, None]
    rewards = torch.randint(0, 2, (B,), generator=g).double()
    return hidden, mask, rewards, torch.arange(P).repeat_interleave(K)


def planted_pair(sub=3, seed=0, K=16):
    """16 planted rollouts, 8 correct / 8 wrong; rollout 2 (correct) and 11 (wrong) carry a novel
    stage."""
    p, q = (
        planted_stage_rollouts(K=K, substitute=(2, sub), seed=seed),
        planted_stage_rollouts(K=K, substitute=(11, sub), seed=seed),
    )
    hidden, stages = p.hidden.clone(), p.stages.clone()
    hidden[11], stages[11] = q.hidden[11], q.stages[11]
    bnd = torch.zeros_like(p.mask)
    bnd[:, 1:] = stages[:, 1:] != stages[:, :-1]
    return (
        hidden,
        p.mask,
        (torch.arange(K) < K // 2).double(),
        torch.zeros(K, dtype=torch.long),
        stages,
        bnd,
    )


GRAN = [dict(granularity='seq'), dict(granularity='tok'), dict(granularity='span', span_len=2)]


# ---------------------------------------------------------------- properties
@SETTINGS
@given(batches(), st.sampled_from(['grpo', 'drgrpo', 'dapo']), st.sampled_from(range(3)))
def test_kappa_zero_is_base_exactly(b, base, gi):
    hidden, mask, rewards, gid = b
    adv, rw = hara_advantages(hidden, mask, rewards, gid, base=base, kappa=0.0, **GRAN[gi])
    A = base_advantages(rewards, gid, method=base)
    assert torch.equal(adv, A[:, None] * mask)
    assert torch.equal(rw.weights, torch.ones_like(rw.weights))


@SETTINGS
@given(
    batches(),
    st.floats(0.0, 3.0),
    st.floats(0.0, 1.0),
    st.floats(1.0, 4.0),
    st.sampled_from(range(3)),
)
def test_weights_in_range(b, kappa, w_min, w_max, gi):
    hidden, mask, rewards, gid = b
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', RuntimeWarning)  # the short solve's cap
        adv, rw = hara_advantages(
            hidden, mask, rewards, gid, kappa=kappa, w_min=w_min, w_max=w_max, **GRAN[gi], **SHORT
        )
    w = rw.weights[mask]
    assert ((w >= w_min) & (w <= w_max)).all() and torch.isfinite(adv).all()
    assert torch.equal(adv, rw.base[:, None] * rw.weights * mask)


@SETTINGS
@given(batches(), st.integers(0, 1000), st.sampled_from(range(3)))
def test_permutation_equivariance(b, seed, gi):
    hidden, mask, rewards, gid = b
    perm = torch.randperm(len(rewards), generator=torch.Generator().manual_seed(seed))
    adv, rw = hara_advantages(hidden, mask, rewards, gid, **GRAN[gi], **EXACT)
    adv_p, rw_p = hara_advantages(
        hidden[perm], mask[perm], rewards[perm], gid[perm], **GRAN[gi], **EXACT
    )
    torch.testing.assert_close(adv_p, adv[perm], atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(rw_p.novelty.n_tok, rw.novelty.n_tok[perm], atol=1e-9, rtol=1e-9)


@SETTINGS
@given(batches(max_prompts=2), batches(max_prompts=2), st.integers(1, 4), st.sampled_from(range(3)))
def test_padding_and_packing_change_nothing(b1, b2, extra, gi):
    (h1, m1, r1, g1), (h2, m2, r2, g2) = b1, b2
    a1, _ = hara_advantages(h1, m1, r1, g1, **GRAN[gi], **EXACT)
    a2, _ = hara_advantages(h2, m2, r2, g2, **GRAN[gi], **EXACT)
    T = max(h1.shape[1], h2.shape[1]) + extra
    pad = lambda h, m: (
        torch.cat([h, torch.randn(h.shape[0], T - h.shape[1], h.shape[2], dtype=h.dtype)], 1),
        torch.cat([m, torch.zeros(m.shape[0], T - m.shape[1], dtype=torch.bool)], 1),
    )
    (H1, M1), (H2, M2) = pad(h1, m1), pad(h2, m2)
    a, _ = hara_advantages(
        torch.cat([H1, H2]),
        torch.cat([M1, M2]),
        torch.cat([r1, r2]),
        torch.cat([g1, g2 + 100]),
        **GRAN[gi],
        **EXACT,
    )
    torch.testing.assert_close(a[: len(r1), : h1.shape[1]], a1, atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(a[len(r1) :, : h2.shape[1]], a2, atol=1e-9, rtol=1e-9)
    assert (a[: len(r1), h1.shape[1] :] == 0).all() and (a[len(r1) :, h2.shape[1] :] == 0).all()


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches(max_prompts=2, max_k=3, max_T=5),
    batches(max_prompts=2, max_k=3, max_T=5),
    st.integers(1, 4),
    st.sampled_from(range(3)),
)
def test_padding_and_packing_change_nothing_default_tol(b1, b2, extra, gi):
    """With the default tolerance-based stopping too: each outcome group stops on its own tol
    (`group_barycenters`)."""
    (h1, m1, r1, g1), (h2, m2, r2, g2) = b1, b2
    a1, _ = hara_advantages(h1, m1, r1, g1, **GRAN[gi])
    a2, _ = hara_advantages(h2, m2, r2, g2, **GRAN[gi])
    T = max(h1.shape[1], h2.shape[1]) + extra
    pad = lambda h, m: (
        torch.cat([h, torch.randn(h.shape[0], T - h.shape[1], h.shape[2], dtype=h.dtype)], 1),
        torch.cat([m, torch.zeros(m.shape[0], T - m.shape[1], dtype=torch.bool)], 1),
    )
    (H1, M1), (H2, M2) = pad(h1, m1), pad(h2, m2)
    a, _ = hara_advantages(
        torch.cat([H1, H2]),
        torch.cat([M1, M2]),
        torch.cat([r1, r2]),
        torch.cat([g1, g2 + 100]),
        **GRAN[gi],
    )
    torch.testing.assert_close(a[: len(r1), : h1.shape[1]], a1, atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(a[len(r1) :, : h2.shape[1]], a2, atol=1e-9, rtol=1e-9)


@SETTINGS
@given(batches(), st.sampled_from(['grpo', 'drgrpo', 'dapo']), st.sampled_from(range(3)))
def test_all_same_outcome_keeps_zero_advantage(b, base, gi):
    hidden, mask, rewards, gid = b
    for r in (torch.zeros_like(rewards), torch.ones_like(rewards)):
        adv, _ = hara_advantages(hidden, mask, r, gid, base=base, **GRAN[gi])
        assert torch.equal(adv, torch.zeros_like(adv))


@SETTINGS
@given(batches(max_prompts=1, max_k=4), st.sampled_from(range(3)))
def test_identical_rollouts_identical_weights(b, gi):
    hidden, mask, rewards, gid = b
    hidden, mask = hidden.clone(), mask.clone()
    # rollout 1 is a copy of rollout 0
    hidden[1], mask[1], rewards[1] = hidden[0], mask[0], rewards[0]
    _, rw = hara_advantages(hidden, mask, rewards, gid, **GRAN[gi], **EXACT)
    torch.testing.assert_close(rw.weights[1], rw.weights[0], atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize('K', [2, 5])
def test_group_of_identical_rollouts_has_sequence_weight_one(K):
    h = torch.randn(1, 6, 4, dtype=torch.float64).expand(2 * K, -1, -1)
    mask = torch.ones(2 * K, 6, dtype=torch.bool)
    rewards = (torch.arange(2 * K) < K).double()
    adv, rw = hara_advantages(
        h, mask, rewards, torch.zeros(2 * K, dtype=torch.long), granularity='seq'
    )
    torch.testing.assert_close(rw.weights, torch.ones_like(rw.weights), atol=1e-9, rtol=0)
    torch.testing.assert_close(
        adv,
        base_advantages(rewards, torch.zeros(2 * K, dtype=torch.long))[:, None].expand(-1, 6),
        atol=1e-9,
        rtol=0,
    )


@pytest.mark.parametrize('seed,sub', [(0, 3), (1, 2)])
def test_novel_span_push_and_penalty(seed, sub):
    hidden, mask, rewards, gid, stages, bnd = planted_pair(sub, seed)
    novel = stages == 6
    for kw in (dict(granularity='span', boundaries=bnd), dict(granularity='tok')):
        adv, rw = hara_advantages(hidden, mask, rewards, gid, **kw)
        A = rw.base
        # correct novel span: larger push than the base; wrong novel span: smaller penalty
        assert (adv[2][novel[2]] > A[2]).all() and (adv[11][novel[11]].abs() < A[11].abs()).all()
    _, rw = hara_advantages(hidden, mask, rewards, gid, granularity='span', boundaries=bnd)
    for i in (2, 11):  # the largest relative novelty is on exactly the substituted span
        assert novel[i, rw.x[i].argmax()] and (
            rw.x[i][novel[i]].min() > rw.x[i][mask[i] & ~novel[i]].max()
        )


def test_deterministic_and_dtypes_agree():
    hidden, mask, rewards, gid, _, bnd = planted_pair()
    kw = dict(bary_kw=dict(max_iter=5, tol=0.0))
    a64, _ = hara_advantages(hidden, mask, rewards, gid, **kw)
    assert torch.equal(a64, hara_advantages(hidden, mask, rewards, gid, **kw)[0])
    a32, rw32 = hara_advantages(hidden.float(), mask, rewards.float(), gid, **kw)
    assert a32.dtype == torch.float32 and a64.dtype == torch.float64
    # float32 values, float64 solves: only the last float32 steps round (w <= 2, |A| <= 3)
    h32 = hidden.float().double()
    a64r, _ = hara_advantages(h32, mask, rewards, gid, **kw)
    torch.testing.assert_close(a32.double(), a64r, atol=16 * EPS32 * 6, rtol=0)


EPS32 = torch.finfo(torch.float32).eps


def structureless(P=4, G=4, T=64, d=64, seed=0):
    """P prompts x G rollouts of Gaussian hidden states (rounded to float32), ragged lengths, half
    of each prompt correct: no stage structure, the barycenter iteration's slowest case."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(P * G, T, d, generator=g, dtype=torch.float64).float().double()
    L = torch.randint(T // 2, T + 1, (P * G,), generator=g)
    r = torch.tensor(([1.0] * (G // 2) + [0.0] * (G - G // 2)) * P, dtype=torch.float64)
    return h, torch.arange(T)[None] < L[:, None], r, torch.arange(P).repeat_interleave(G)


@pytest.mark.parametrize('data', ['planted', 'structureless'])
def test_float32_weights_equal_float64(data):
    """On the same float32 values, float32 and float64 inputs give the same weights: the solves run
    in float64 (`compute_dtype`), only the last weight steps round in float32 (w <= 2)."""
    if data == 'planted':
        h, m, r, g, _, _ = planted_pair()
        h = h.float().double()
    else:
        h, m, r, g = structureless()
    _, rw64 = hara_advantages(h, m, r, g)
    _, rw32 = hara_advantages(h.float(), m, r.float(), g)
    assert rw32.weights.dtype == torch.float32 and rw64.notes == rw32.notes == []
    err = float((rw32.weights.double() - rw64.weights).abs().max())
    assert err <= 16 * EPS32 * 2, err
    assert float((rw64.weights - 1).abs().max()) > 0.05  # weights that moved
    # every barycenter met tol: its estimated distance to the fixed point is in the record
    nv = rw64.novelty
    assert nv.bary_error.shape == (len(nv.slots),) and (nv.bary_error < 1e-5).all()


def test_float32_solves_name_the_groups_at_the_rounding_floor():
    """`compute_dtype=None`: the solves run in float32, and on structureless rollouts the groups
    stop at float32's rounding floor before `tol`; the record names them, with a warning."""
    h, m, r, g = structureless()
    with pytest.warns(RuntimeWarning, match='stopped at the rounding floor of torch.float32'):
        _, rw = hara_advantages(h.float(), m, r.float(), g, compute_dtype=None)
    assert 'of 8 outcome groups stopped at the rounding floor of torch.float32' in rw.notes[-1]
    assert rw.novelty.barycenters.dtype == torch.float32


# ---------------------------------------------------------------- the pieces, cross-checked
def test_contributions_sum_to_entropic_cost_and_match_pot():
    """Default call: final plans against the returned barycenter; each rollout's token contributions
    sum to its entropic LFGW (POT, relative 1e-4)."""
    ot = pytest.importorskip('ot')
    hidden, mask, rewards, gid = _gauss_batch(0)
    nov = hara_novelty(hidden, mask, rewards, gid)
    from hara_ref.ot.fgw import chain_positions, normalize_features

    for g, k in ((0, 0), (1, 1), (3, 2)):
        i = int(nov.slots[g, k])
        L = int(mask[i].sum())
        h = normalize_features(hidden[i, :L], how='unit')
        tau = chain_positions(mask[i : i + 1, :L], torch.float64)[0]
        M = lifted_cost(h, tau, nov.barycenters[g], nov.tau_bar, 0.25)
        P = ot.sinkhorn(
            np.full(L, 1 / L),
            np.full(32, 1 / 32),
            M.numpy(),
            0.05,
            method='sinkhorn_log',
            stopThr=1e-12,
            numItermax=20000,
        )
        lfgw = float((P * M.numpy()).sum())
        assert abs(nov.contrib[i, :L].sum().item() - lfgw) <= 1e-4 * lfgw
        np.testing.assert_allclose(
            nov.contrib[i, :L].numpy(), (P * M.numpy()).sum(1), rtol=1e-3, atol=1e-7
        )
        assert abs(nov.n_seq[i].item() - lfgw) <= 1e-4 * lfgw  # N_i = sum_t c_t


def test_relative_novelty_group_mean_is_one():
    hidden, mask, rewards, gid, _, _ = planted_pair()
    nov = hara_novelty(hidden, mask, rewards, gid)
    x = relative_novelty(nov.n_tok, mask, nov.og)
    for g in nov.og.unique():
        sel = nov.og == g
        torch.testing.assert_close(
            (x[sel] * mask[sel]).sum() / mask[sel].sum(), torch.tensor(1.0, dtype=x.dtype)
        )
        torch.testing.assert_close(
            relative_novelty(nov.n_seq, mask, nov.og)[sel].mean(), torch.tensor(1.0, dtype=x.dtype)
        )


def test_table2_metrics():
    hidden, mask, rewards, gid, stages, _ = planted_pair()
    for metric in ('fgw', 'w', 'gw', 'embed'):
        nov = hara_novelty(hidden, mask, rewards, gid, metric=metric, bary_kw=dict(max_iter=5))
        assert torch.isfinite(nov.n_tok).all() and (nov.n_tok >= 0).all()
    # GW (alpha = 1) after the anchor linearization sees positions only: equal lengths -> equal
    # novelty
    h = torch.randn(4, 5, 3, dtype=torch.float64)
    nov = hara_novelty(
        h,
        torch.ones(4, 5, dtype=torch.bool),
        torch.ones(4, dtype=torch.float64),
        torch.zeros(4, dtype=torch.long),
        metric='gw',
    )
    torch.testing.assert_close(nov.n_seq, nov.n_seq[:1].expand(4))


def test_outcome_groups_and_packing():
    og, sizes = outcome_groups(torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([3, 3, 3, 1]))
    assert og.tolist() == [2, 1, 2, 0] and sizes.tolist() == [1, 1, 2]
    assert pack_slots(og, torch.ones(4, dtype=torch.bool)).tolist() == [[3, -1], [1, -1], [0, 2]]


def test_outcomes_make_the_groups_rewards_the_advantages():
    """`outcomes=` groups by the labels given, the base advantages still come from the rewards:
    the same as the oracle on the labels with the rewards' advantages given."""
    g = torch.Generator().manual_seed(0)
    h, L = torch.randn(16, 7, 4, generator=g, dtype=torch.float64), torch.randint(2, 8, (16,))
    m, gid = torch.arange(7) < L[:, None], torch.arange(16) // 8
    acc = (torch.rand(16, generator=g) < 0.5).double()  # (B,) correctness
    r = acc + 0.5 * torch.rand(16, generator=g, dtype=torch.float64)  # (B,) + a format score
    kw = dict(bary_kw=dict(max_iter=3, inner_iter=50), plan_kw=dict(num_iter_max=50))
    A = base_advantages(r, gid, method='grpo')
    want, rw_want = hara_advantages(h, m, acc, gid, advantages=A, **kw)
    for o in (acc, acc.bool(), acc.long(), acc.numpy() * 3 - 1):  # any numeric or bool labels
        got, rw = hara_advantages(h, m, r, gid, outcomes=o, **kw)
        assert (got - want).abs().max() == 0 and torch.equal(rw.base, A)
        assert torch.equal(rw.novelty.og, rw_want.novelty.og)
    assert (rw.weights[m] != 1).double().mean() > 0.5  # the weights moved
    # by the summed reward every rollout is alone: nothing moves, and the notes say why
    _, rw0 = hara_advantages(h, m, r, gid, **kw)
    assert (rw0.weights == 1).all() and 'every rollout is alone' in ' '.join(rw0.notes)
    nov = hara_novelty(h, m, r, gid, outcomes=acc.bool(), **kw)
    assert torch.equal(nov.og, hara_novelty(h, m, acc, gid, **kw).og)
    with pytest.raises(ValueError, match=r'^outcomes must have shape \(B,\) = \(16,\)'):
        hara_advantages(h, m, r, gid, outcomes=acc[:4])
    with pytest.raises(ValueError, match='^outcomes contain NaN/Inf'):
        hara_novelty(h, m, r, gid, outcomes=acc * math.nan)
    with pytest.raises(TypeError, match='^outcomes must be real or bool'):
        hara_novelty(h, m, r, gid, outcomes=acc.to(torch.complex64))


def test_spans():
    mask = torch.tensor([[True] * 4 + [False] * 2])
    assert span_ids(mask, span_len=3).tolist() == [[0, 0, 0, 1, 0, 0]]
    # a boundary on token 0 and on padding is harmless
    bnd = torch.tensor([[True, False, True, False, True, True]])
    assert span_ids(mask, boundaries=bnd).tolist() == [[0, 0, 1, 1, 0, 0]]


# ---------------------------------------------------------------- baselines
def test_shear():
    # four planted rollouts of one prompt, 0 and 2 correct; rollout 2 carries a novel stage (6)
    p = planted_stage_rollouts(K=4, substitute=(2, 3), seed=0)
    hidden, mask, gid = p.hidden, p.mask, torch.zeros(4, dtype=torch.long)
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    assert (~mask).any()  # ragged: padding is checked below
    w1 = shear_weights(hidden, mask, rewards, gid, width=4, stride=2)
    assert torch.isfinite(w1).all() and (w1[mask] >= 0).all() and (w1[~mask] == 1).all()
    # a correct rollout's novel stage (no wrong rollout has it) is far from every wrong rollout: its
    # weight peaks there
    nv = p.stages[2] == 6  # windows overlap, so the neighbours of the novel stage share its maximum
    assert nv.any() and (
        w1[2][nv].max() == w1[2][mask[2]].max() and w1[2][nv].mean() > w1[2][mask[2] & ~nv].mean()
    )
    # no opposing group
    assert torch.equal(
        shear_weights(hidden, mask, torch.ones_like(rewards), gid), torch.ones_like(w1)
    )
    w = shear_weights(hidden, mask, rewards, gid)
    adv, rw = shear_advantages(hidden, mask, rewards, gid)
    assert torch.equal(rw.weights, w)
    torch.testing.assert_close(adv, rw.base[:, None] * w * mask)
    assert window_starts(10, 4, 3) == [0, 3, 6] and window_starts(11, 4, 3) == [0, 3, 6, 7]


def test_entropy_and_position():
    g = torch.Generator().manual_seed(0)
    H = torch.rand(4, 50, generator=g, dtype=torch.float64)
    mask = torch.arange(50) < torch.tensor([50, 40, 30, 20])[:, None]
    w = entropy_weights(H, mask, rho=0.2)
    assert int(w[mask].sum()) == math.ceil(0.2 * int(mask.sum()))
    assert H[mask][w[mask] == 1].min() >= H[mask][w[mask] == 0].max()
    p = position_weights(mask, lam=0.9)
    assert torch.allclose(p[1, 39], torch.tensor(1.0, dtype=torch.float64)) and torch.allclose(
        p[1, 0], torch.tensor(0.9**39, dtype=torch.float64)
    )
    logits = torch.randn(2, 3, 7, dtype=torch.float64)
    torch.testing.assert_close(
        token_entropy(logits), torch.distributions.Categorical(logits=logits).entropy()
    )


def test_reweight_dispatch():
    hidden, mask, rewards, gid, _, bnd = planted_pair()
    H = torch.rand(mask.shape, dtype=torch.float64)
    A = base_advantages(rewards, gid)
    for m in REWEIGHTS:
        adv, rw = reweight_advantages(m, hidden, mask, rewards, gid, logits_entropy=H)
        assert (
            adv.shape == mask.shape
            and torch.isfinite(adv).all()
            and rw.method.startswith(m.split('-')[0])
        )
    assert torch.equal(
        reweight_advantages('none', hidden, mask, rewards, gid)[0], A[:, None] * mask
    )
    assert (
        reweight_advantages('hara-tok', hidden, mask, rewards, gid, boundaries=bnd)[1].method
        == 'hara-span'
    )
    given_A = torch.linspace(-1, 1, 16, dtype=torch.float64)
    adv, rw = reweight_advantages('position', None, mask, rewards, gid, advantages=given_A)
    assert torch.equal(rw.base, given_A)
    with pytest.raises(ValueError, match='unknown method'):
        reweight_advantages('ppo', hidden, mask, rewards, gid)
    with pytest.raises(ValueError, match='logits_entropy'):
        reweight_advantages('entropy', hidden, mask, rewards, gid)


# ---------------------------------------------------------------- bad input
def _ok():
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(4, 5, 3, generator=g, dtype=torch.float64),
        torch.ones(4, 5, dtype=torch.bool),
        torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64),
        torch.zeros(4, dtype=torch.long),
    )


@pytest.mark.parametrize('bad', [float('nan'), float('inf'), -float('inf')])
def test_nonfinite_hidden_raises(bad):
    h, m, r, g = _ok()
    h[2, 3, 1] = bad
    with pytest.raises(ValueError, match=r'NaN/Inf on real tokens \(first at rollout 2, token 3\)'):
        hara_advantages(h, m, r, g)
    m[2, 3:] = False  # the same value on padding is fine
    assert torch.isfinite(hara_advantages(h, m, r, g)[0]).all()


def test_empty_and_single_token_rollouts():
    h, m, r, g = _ok()
    m[0] = False
    m[1, 1:] = False  # rollout 0 empty, rollout 1 one token
    adv, rw = hara_advantages(h, m, r, g)
    assert torch.isfinite(adv).all() and (adv[0] == 0).all() and not rw.novelty.computed[0]
    assert rw.base[0] != 0  # the empty rollout's reward still counts in the base advantage
    m[:] = False
    m[:, 0] = True  # every rollout one token long
    assert torch.isfinite(hara_advantages(h, m, r, g)[0]).all()
    m[:] = False  # every rollout empty
    adv, _ = hara_advantages(h, m, r, g)
    assert torch.equal(adv, torch.zeros_like(adv))


def test_mask_with_holes_raises():
    h, m, r, g = _ok()
    m[1, 2] = False
    with pytest.raises(ValueError, match='holes'):
        hara_advantages(h, m, r, g)
    m = torch.ones(4, 5, dtype=torch.bool)
    m[0, 0] = False  # left padding
    with pytest.raises(ValueError, match='prefix'):
        hara_advantages(h, m, r, g)


def test_mismatched_shapes_raise():
    h, m, r, g = _ok()
    with pytest.raises(ValueError, match='rewards must have shape'):
        hara_advantages(h, m, r[:3], g)
    with pytest.raises(ValueError, match='group_ids must have shape'):
        hara_advantages(h, m, r, g[:2])
    with pytest.raises(ValueError, match='mask must have shape'):
        hara_advantages(h, m[:, :4], r, g)
    with pytest.raises(TypeError, match='integer prompt ids'):
        hara_advantages(h, m, r, g.double())
    with pytest.raises(ValueError, match=r'\(B, T, d\)'):
        hara_advantages(h[0], m, r, g)
    with pytest.raises(ValueError, match='advantages must have shape'):
        hara_advantages(h, m, r, g, advantages=torch.zeros(3))
    with pytest.raises(ValueError, match='granularity'):
        hara_advantages(h, m, r, g, granularity='word')
    with pytest.raises(ValueError, match='span_len or boundaries'):
        hara_advantages(h, m, r, g, granularity='span')
    with pytest.raises(ValueError, match='metric'):
        hara_advantages(h, m, r, g, metric='kl')
    with pytest.raises(ValueError, match='w_min'):
        hara_advantages(h, m, r, g, w_min=1.5)
    with pytest.raises(ValueError, match='reference'):
        hara_advantages(h, m, r, g, reference='median')


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_half_precision_is_upcast(dtype):
    h, m, r, g = _ok()
    adv, rw = hara_advantages(h.to(dtype), m, r, g)
    assert adv.dtype == torch.float32 and torch.isfinite(adv).all()
    assert rw.notes[0] == f'hidden upcast from {dtype} to torch.float32'


@pytest.mark.skipif(not torch.cuda.is_available(), reason='no CUDA device')
def test_cuda_matches_cpu():
    hidden, mask, rewards, gid, _, _ = planted_pair()
    a_cpu, _ = hara_advantages(hidden, mask, rewards, gid, **EXACT)
    a_gpu, _ = hara_advantages(hidden.cuda(), mask.cuda(), rewards.cuda(), gid.cuda(), **EXACT)
    assert a_gpu.device.type == 'cuda'
    torch.testing.assert_close(a_gpu.cpu(), a_cpu, atol=1e-6, rtol=1e-6)
    a32, _ = hara_advantages(hidden.float().cuda(), mask.cuda(), rewards.float().cuda(), gid.cuda())
    assert a32.dtype == torch.float32 and torch.isfinite(a32).all()


# ---------------------------------------------------------------- speed benchmark (smoke)
def test_bench_quick(capsys):
    assert bench_hara_cli(['--quick']) == 0
    out = capsys.readouterr().out
    for key in (
        'batch: 2 prompts x 8 rollouts',
        'hara_advantages (tok):',
        'lower bound, one h @ Z^T per rollout:',
        'ratio:',
    ):
        assert key in out, out
    ratio = float(out.split('ratio:')[1].split()[0])
    assert ratio > 0 and math.isfinite(ratio)


# the oracle solved as tightly as the reference: barycenter to 1e-11 with exact plans at every
# iteration (inner_rtol=0: on random features the loosely solved, warm-started plans of the
# defaults can lead the barycenter iteration to another of its fixed points), plans and median to
# 1e-13
TIGHT = dict(
    bary_kw=dict(tol=1e-11, max_iter=5000, stop_thr=1e-13, inner_rtol=0.0, inner_iter=500),
    plan_kw=dict(stop_thr=1e-13),
    median_kw=dict(tol=1e-13),
)


def reference_demo():
    "Chapter 13's one-prompt demo: 4 correct, 4 wrong; rollout 1's third stage is novel (stage 4)."
    return planted_stage_rollouts(
        K=8, n_stages=4, d=8, stage_len=(3, 5), noise=0.1, seed=0, substitute=(1, 2)
    )


def kuhn_excess(P: torch.Tensor, m: torch.Tensor) -> tuple:
    """Kuhn's optimality condition for the geometric median m (N, D) of the points P (N, K, D):
    (‖pull(m)‖ - mult(m), its rounding bound), each (N,). mult(m) members sit at m (to 16 x the
    dtype's rounding of the points' scale), pull(m) is the sum of the unit vectors from m to the
    others; the median has ‖pull‖ <= mult (off the data: a zero gradient). m is known to its
    rounding, 16 eps ‖m‖, which turns the unit vector to y_k by up to that over ‖y_k - m‖."""
    eps, tiny = torch.finfo(P.dtype).eps, torch.finfo(P.dtype).tiny
    diff = P - m[:, None]  # (N, K, D) y_k - m
    dist = torch.linalg.vector_norm(diff, dim=-1)  # (N, K)
    at = dist <= 16 * eps * torch.linalg.vector_norm(P, dim=-1).amax(-1, keepdim=True)  # (N, K)
    pull = (diff / dist.clamp_min(tiny)[..., None] * (~at)[..., None]).sum(1)  # (N, D)
    rnd = 16 * eps * torch.linalg.vector_norm(m, dim=-1, keepdim=True)  # (N, 1)
    bound = (rnd / dist.clamp_min(tiny) * ~at).sum(-1) + 16 * P.shape[1] * eps  # (N,)
    return torch.linalg.vector_norm(pull, dim=-1) - at.sum(-1), bound


@pytest.mark.parametrize('case', ['planted', 'random', 'shared prefixes'])
def test_hara_reference_equals_the_oracle(case, monkeypatch):
    """The one-screen reference at the oracle's settings (eps = 0.05) and the batched oracle solved
    as tightly give the same advantages to 1e-8 (float64) where its median converges. Shared
    prefixes and a duplicate (what a real policy samples) put members on top of each other: there
    the reference's plain Weiszfeld iteration (chapter 11) stops at its cap and says so in its info,
    4e-5 short in the advantages, while the engine's twin (chapter 38) meets Kuhn's optimality
    condition at every node, to the rounding of float64, where the lesson's medians do not."""
    from hara_ref.engine import checks
    from hara_ref.hara import weights
    from hara_ref.hara.weights import hara_reference, ORACLE_DEFAULTS

    assert ORACLE_DEFAULTS['reg'] == 0.05 and ORACLE_DEFAULTS['L_b'] == 32
    if case == 'planted':  # at every default, L_b = 32 included
        pr = reference_demo()
        h, m, kw = pr.hidden, pr.mask, {}
    else:  # Gaussian features, ragged lengths; L_b = 8 keeps it fast
        g = torch.Generator().manual_seed(1)
        h = torch.randn(6, 6, 4, generator=g, dtype=torch.float64)  # (G, T, d)
        m, kw = torch.arange(6) < torch.randint(2, 7, (6,), generator=g)[:, None], dict(L_b=8)
    if case == 'shared prefixes':
        g = torch.Generator().manual_seed(1)
        h = torch.randn(8, 7, 4, generator=g, dtype=torch.float64)  # (G, T, d)
        h[1:4, :3] = h[0, :3]  # three wrong rollouts share the first one's first three tokens
        h[5], h[6, :5] = h[4], h[4, :5]  # a duplicate and a shared prefix among the correct ones
        m = torch.arange(7) < torch.tensor([7, 6, 7, 5, 7, 7, 6, 7])[:, None]
        kw = dict(L_b=8, median_iter=200)  # chapter 11's cap, where plain Weiszfeld stalls here
        h = torch.cat([h[4:], h[:4]])  # (G, T, d) the correct ones first
        m = torch.cat([m[4:], m[:4]])
    G, gid = len(h), torch.zeros(len(h), dtype=torch.long)
    r = (torch.arange(G) < G // 2).double()  # (G,) half correct
    calls, lesson = [], weights.group_geometric_median

    def recorded(y, og, member, **mkw):  # the reference's medians: stage versions in, info out
        med, info = lesson(y, og, member, **mkw)
        calls.append((y, og, member, mkw, med, info))
        return med, info

    monkeypatch.setattr(weights, 'group_geometric_median', recorded)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        ref, rec = hara_reference(h, m, r, **kw)  # (G, T)
    kw.pop('median_iter', None)  # the reference's setting, not the oracle's
    fast = hara_advantages(h, m, r, gid, **kw, **TIGHT)[0]
    gap = float((ref - fast).abs().max())
    assert len(calls) == 2  # one median per outcome group
    stalled = [not c[-1]['converged'] for c in calls]  # the lesson's loop at its cap
    # the reference warns of a stalled median, in its record and as a warning, and of nothing else
    assert rec['median_converged'] == (not any(stalled))
    assert [str(w.message) for w in caught] == (
        ["hara_reference: Weiszfeld's median stopped at its cap"] if any(stalled) else []
    )
    if case == 'shared prefixes':  # measured: 4.3e-5, both groups stalled
        assert 1e-6 < gap < 1e-4 and all(stalled)
    else:  # measured: 1.5e-12 (planted: one of 32 nodes at the cap), 7.3e-12
        assert gap < 1e-8
    short = 0.0  # the farthest the lesson's median is from the twin's
    for y, og, member, mkw, med, info in calls:  # the engine's twin on the same stage versions
        twin, twin_info = checks.group_geometric_median(y, og, member, **mkw)  # (K, L_b, d+1)
        excess, bound = kuhn_excess(y.movedim(0, 1), twin[0])  # (L_b,) each
        assert twin_info['converged'] and (excess <= bound).all(), (excess, bound)
        short = max(short, float((med - twin).norm(dim=-1).max()))
        if case == 'shared prefixes':  # the check can fail: the stalled lesson's medians fail it
            excess, bound = kuhn_excess(y.movedim(0, 1), med[0])
            assert (excess > bound).any()
    if case == 'shared prefixes':
        assert 1e-5 < short < 1e-3  # measured: 2.2e-4
    if case == 'planted':  # the oracle's defaults are near the same fixed point
        assert float((hara_advantages(h, m, r, gid)[0] - ref).abs().max()) < 1e-5
    A = base_advantages(r, gid)  # (G,)
    # the weights are not all 1: a check that can fail
    assert float((ref / A[:, None] - 1)[m].abs().max()) > 1e-3
    torch.testing.assert_close(ref, A[:, None] * rec['w'] * m)


def novel_correct_and_wrong():
    "Chapter 13's prompt: rollouts 0-3 correct, 4-7 wrong; rollouts 1 and 5 carry a novel stage."
    kw = dict(K=8, n_stages=4, d=8, stage_len=(3, 5), noise=0.1, seed=0)
    p1, p5 = (planted_stage_rollouts(**kw, substitute=(i, 2)) for i in (1, 5))
    hidden, stages = p1.hidden.clone(), p1.stages.clone()
    hidden[5], stages[5] = p5.hidden[5], p5.stages[5]
    return hidden, p1.mask, (torch.arange(8) < 4).double(), stages


def test_hara_reference_seq_equals_the_oracle_and_tok_stays_on_the_novel_stages():
    """HARA-seq of the one-screen reference (x_i = the mean of x over the rollout) is the oracle's
    granularity='seq' to 1e-8; HARA-tok clips exactly the novel stages (up for the correct rollout,
    down for the wrong one) and leaves every other token within 0.2 of 1."""
    from hara_ref.hara.weights import hara_reference

    h, m, r, stages = novel_correct_and_wrong()
    gid = torch.zeros(8, dtype=torch.long)
    seq, rec_seq = hara_reference(h, m, r, granularity='seq', L_b=8)
    fast = hara_advantages(h, m, r, gid, granularity='seq', L_b=8, **TIGHT)[0]
    assert float((seq - fast).abs().max()) < 1e-8
    assert (rec_seq['w'][m] == rec_seq['w'][:, :1].expand_as(m)[m]).all()  # one weight per rollout
    _, rec = hara_reference(h, m, r)
    novel = stages == 4  # (8, T)
    assert (rec['w'][1][novel[1]] == 2).all() and (rec['w'][5][novel[5]] == 0.5).all()
    assert float((rec['w'] - 1).abs()[m & ~novel].max()) < 0.2


def test_hara_reference_lifts_the_novel_stage_and_a_group_of_two_evenly():
    """Four rollouts per outcome group: the novel stage of rollout 1 gets the clip, the rest stays
    near 1. Two per group: the median is the midpoint, both members have the same stage novelty."""
    from hara_ref.hara.weights import hara_reference

    pr = reference_demo()
    r = (torch.arange(8) < 4).double()  # (8,)
    _, rec = hara_reference(pr.hidden, pr.mask, r)
    novel = pr.stages == 4  # (8, T)
    assert (rec['w'][1][novel[1]] == 2).all()
    assert float((rec['w'] - 1).abs()[pr.mask & ~novel].max()) < 0.2
    two = torch.tensor([0, 1, 4, 5])
    _, rec2 = hara_reference(pr.hidden[two], pr.mask[two], r[two])
    torch.testing.assert_close(rec2['nu'][0], rec2['nu'][1], atol=1e-12, rtol=0)
    assert float(rec2['nu'][0].max()) > 0.1  # they differ (the novel stage), equally
    assert float(rec2['x'][0].max()) > 2 and float(rec2['x'][1].max()) > 2


def worked_example(K=16):
    """Chapter 13's worked example: 16 planted rollouts of one prompt, 0-7 correct; rollouts 2 and
    11 carry a novel stage (6) at their 4th visit."""
    p = planted_stage_rollouts(K=K, substitute=(2, 3), seed=0)
    q = planted_stage_rollouts(K=K, substitute=(11, 3), seed=0)
    hidden, stages = p.hidden.clone(), p.stages.clone()  # (K, T, d), (K, T)
    hidden[11], stages[11] = q.hidden[11], q.stages[11]
    return hidden, p.mask, (torch.arange(K) < K // 2).double(), stages


def test_shear_shrinks_every_advantage_on_the_worked_example():
    """What chapter 14 says of SHEAR on the worked example (and checks there on all 16 rollouts):
    its weight is the span distance itself, below 1 on every token (every advantage shrinks),
    largest in a rollout with the novel stage. Here on rollouts 0-3 and 8-11: both novel stages."""
    hidden, mask, rewards, _ = worked_example()
    sub = torch.tensor([0, 1, 2, 3, 8, 9, 10, 11])  # rollouts 2 and 11 carry the novel stage
    hidden, mask, rewards = hidden[sub], mask[sub], rewards[sub]
    _, rs = shear_advantages(hidden, mask, rewards, torch.zeros(8, dtype=torch.long))
    w = rs.weights[mask]  # (N,) real tokens
    assert float(w.max()) < 1 and float(w.mean()) < 0.5
    assert int(sub[torch.where(mask, rs.weights, 0.0).amax(-1).argmax()]) in (2, 11)


def test_worked_example_weights_stay_near_one_off_the_novel_stages():
    """Chapter 42's worked example, per token: the 14 rollouts without a novel stage stay within
    0.15 of 1; rollouts 2 and 11 get the clip on their novel stage."""
    hidden, mask, rewards, stages = worked_example()
    _, rw = hara_advantages(hidden, mask, rewards, torch.zeros(16, dtype=torch.long))
    novel, plain = stages == 6, torch.ones(16, dtype=torch.bool)  # (K, T), (K,)
    plain[[2, 11]] = False
    assert float((rw.weights[plain] - 1).abs()[mask[plain]].max()) < 0.15
    assert (rw.weights[2][novel[2]] == 2).all() and (rw.weights[11][novel[11]] == 0.5).all()


# ---------------------------------------------------------------- one meaning per option


def _three_prompts():
    "Three prompts of four rollouts, interleaved, with ragged masks and mixed rewards."
    g = torch.Generator().manual_seed(3)
    h = torch.randn(12, 6, 4, generator=g, dtype=torch.float64)
    m = torch.arange(6) < torch.tensor([6, 3, 5, 2, 6, 4, 1, 6, 5, 3, 6, 2])[:, None]
    r = torch.tensor([1.0, 0, 1, 0, 0.5, 1, 0, 0, 1, 1, 0, 0.5], dtype=torch.float64)
    ids = torch.tensor([7, 3, 9, 7, 3, 9, 7, 3, 9, 7, 3, 9])  # not in order of appearance
    return h, m, r, ids


def test_string_prompt_ids_equal_integer_ids():
    "verl's prompt ids are uuid strings: every method reads them as group_advantages does."
    import uuid

    h, m, r, ids = _three_prompts()
    names = {7: str(uuid.uuid4()), 3: str(uuid.uuid4()), 9: str(uuid.uuid4())}
    as_str = [names[int(i)] for i in ids]
    as_obj = np.array(as_str, dtype=object)  # verl's non-tensor batch holds numpy object arrays
    as_uuid = [uuid.UUID(s) for s in as_str]
    kws = {
        meth: dict(logits_entropy=h[..., 0].abs()) if meth == 'entropy' else {}
        for meth in REWEIGHTS
    }
    # the integer ids' answers once, each compared with the three other kinds of ids (recomputing
    # them for each kind tripled the test's HARA solves)
    by_int = [hara_advantages(h, m, r, ids, **gran) for gran in GRAN]
    n_tok = hara_novelty(h, m, r, ids).n_tok
    adv = {meth: reweight_advantages(meth, h, m, r, ids, **kws[meth])[0] for meth in REWEIGHTS}
    for other in (as_str, as_obj, as_uuid):
        for gran, (a, rw) in zip(GRAN, by_int):
            b, rw_s = hara_advantages(h, m, r, other, **gran)
            assert torch.equal(a, b), gran
            assert torch.equal(rw.weights, rw_s.weights)
        assert torch.equal(n_tok, hara_novelty(h, m, r, other).n_tok)
        for method in REWEIGHTS:
            a = reweight_advantages(method, h, m, r, other, **kws[method])[0]
            assert torch.equal(adv[method], a), method
    # the advantages are not all zero: the check compares real numbers
    assert hara_advantages(h, m, r, as_str)[0].abs().max() > 0.1
    with pytest.raises(ValueError, match='group_ids has 11 entries for 12 rewards'):
        hara_advantages(h, m, r, as_str[:11])


@pytest.mark.parametrize(
    'kw, msg',
    [
        (
            dict(granularity='tok', span_len=3),
            "span_len applies only to granularity='span', got 'tok'",
        ),
        (
            dict(granularity='seq', span_len=3),
            "span_len applies only to granularity='span', got 'seq'",
        ),
        (dict(granularity='seq', boundaries=True), "boundaries applies only to granularity='span'"),
        (
            dict(granularity='span', span_len=2, boundaries=True),
            'span_len and boundaries both give the spans: pass one of them',
        ),
    ],
)
def test_an_option_that_cannot_apply_is_refused_by_name(kw, msg):
    h, m, r, g = _ok()
    if kw.get('boundaries') is True:
        kw = dict(kw, boundaries=torch.zeros(4, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=re.escape(msg)):
        hara_advantages(h, m, r, g, **kw)


def test_an_option_given_twice_is_refused_by_name():
    h, m, r, g = _ok()
    for method in ('hara-seq', 'hara-tok'):
        with pytest.raises(ValueError, match=f"granularity is given by method '{method}'"):
            reweight_advantages(method, h, m, r, g, granularity='seq')
    with pytest.raises(ValueError, match="method 'none' takes no options, got span_len"):
        reweight_advantages('none', h, m, r, g, span_len=2)
    # the spans of 'hara-tok' still come from span_len or boundaries
    a, rw = reweight_advantages('hara-tok', h, m, r, g, span_len=2)
    assert rw.method == 'hara-span'
    assert torch.equal(a, hara_advantages(h, m, r, g, granularity='span', span_len=2)[0])


def test_rewards_keep_their_dtype():
    """float64 rewards 1 and 1 + 5e-8 are two outcomes even next to float32 hidden states: the
    outcome groups and the base advantages are the float64 hidden states' ones."""
    g = torch.Generator().manual_seed(0)
    h64, m = torch.randn(4, 3, 2, generator=g, dtype=torch.float64), torch.ones(4, 3, dtype=bool)
    r64, gid = (
        torch.tensor([1.0, 1 + 5e-8, 0.0, 1.0], dtype=torch.float64),
        torch.tensor([0, 0, 1, 1]),
    )
    _, rw64 = hara_advantages(h64, m, r64, gid)
    adv32, rw32 = hara_advantages(h64.float(), m, r64, gid)
    assert rw32.novelty.og.tolist() == rw64.novelty.og.tolist() == [0, 1, 2, 3]
    assert rw32.base.dtype == adv32.dtype == torch.float32
    assert rw32.base[0] < -0.02 and rw32.base[1] > 0.02  # ±0.024 = ±2.5e-8 / (std + 1e-6)
    assert torch.equal(rw32.base, rw64.base.float())
    assert torch.equal(rw32.base, base_advantages(r64, gid).float())
    for method in ('none', 'position', 'shear'):  # the baselines read the same base advantages
        kw = dict(width=2, stride=1) if method == 'shear' else {}
        rw = reweight_advantages(method, h64.float(), m, r64, gid, **kw)[1]
        assert torch.equal(rw.base, rw32.base), method


@pytest.mark.parametrize(
    'lengths, rewards',
    [
        ([6, 4, 0, 5, 3, 6], [1, 1, 1, 0, 0, 0]),  # one empty member among three
        ([5, 0, 6, 4, 3], [1, 1, 0, 0, 0]),  # a group of two, one empty: one member left
        ([0, 0, 5, 4, 6], [1, 1, 0, 0, 0]),  # a group with no token at all
        ([0, 6, 5, 0, 0, 4, 6], [1, 1, 1, 0, 0, 0, 0]),  # empty members in both groups
    ],
)
def test_hara_reference_leaves_empty_rollouts_out_as_the_oracle(lengths, rewards, monkeypatch):
    """An empty rollout (no token) takes no part in its group (hara_math §6): a group is computed
    when it has two non-empty rollouts, from those alone; the reference equals the oracle solved as
    tightly, to 1e-8 where its plain Weiszfeld median (chapter 11) converges, to 1e-5 where that
    stops at its cap and says so, in its record and as a warning (measured: 1.7e-6 on the group of
    three of [0, 0, 5, 4, 6])."""
    from hara_ref.hara import weights
    from hara_ref.hara.weights import hara_reference

    infos, lesson = [], weights.group_geometric_median

    def recorded(*a, **k):  # the reference's medians: their info
        med, info = lesson(*a, **k)
        infos.append(info)
        return med, info

    monkeypatch.setattr(weights, 'group_geometric_median', recorded)

    g = torch.Generator().manual_seed(3)
    G = len(lengths)
    h = torch.randn(G, 6, 4, generator=g, dtype=torch.float64)  # (G, T, d)
    m = torch.arange(6) < torch.tensor(lengths)[:, None]  # (G, T)
    r = torch.tensor(rewards, dtype=torch.float64)  # (G,)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')  # no nan; a stalled median is said, nothing else
        ref, rec = hara_reference(h, m, r, L_b=8)  # (G, T)
    fast = hara_advantages(h, m, r, torch.zeros(G, dtype=torch.long), L_b=8, **TIGHT)[0]
    stalled = not all(info['converged'] for info in infos)
    assert rec['median_converged'] == (not stalled) and len(caught) == int(stalled)
    assert float((ref - fast).abs().max()) < (1e-5 if stalled else 1e-8), stalled
    assert torch.isfinite(rec['w']).all() and torch.isfinite(rec['x']).all()
    A = base_advantages(r, torch.zeros(G, dtype=torch.long))  # (G,)
    for out in torch.unique(r):  # a group with two non-empty members is reweighted, no other
        members = (r == out) & m.any(-1)  # (G,)
        moved = float((rec['w'][members] - 1).abs().max()) if members.any() else 0.0
        assert (moved > 1e-3) == (int(members.sum()) >= 2), (out, moved)
    assert (rec['w'][~m.any(-1)] == 1).all() and (ref[~m] == 0).all()
    torch.testing.assert_close(ref, A[:, None] * rec['w'] * m)
