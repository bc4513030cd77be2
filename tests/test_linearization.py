"Property tests for hara_ref.engine.barycenters (Lemma 3.1, LFGW, the linearized barycenter)."

import math
import warnings
import ot
import pytest
import torch
from hypothesis import given, settings, strategies as st, HealthCheck
from hara_ref.ot.fgw import chain_positions, chain_structure
from hara_ref.ot.lfgw import (
    anchor_plan,
    structure_cost,
    chain_tau_bar,
    linear_cost,
    lift,
    lfgw,
    monotone_plan,
    barycenter_update,
    barycenter_cost,
    linearized_barycenter_reference,
)
from hara_ref.ot.fgw_barycenter import sq_dists
from hara_ref.engine.barycenters import linearized_barycenter, group_barycenters
from hara_ref.engine.bary_steps import feature_scales
from hara_ref.ot.fgw import normalize_features
from hara_ref.engine.sinkhorn import sinkhorn_log

SET = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
f64 = torch.float64


@SET
@given(lengths=st.lists(st.integers(2, 30), min_size=1, max_size=5), L_b=st.integers(2, 16))
def test_anchor_cost_is_closed_form(lengths, L_b):
    """Lemma 3.1: the anchor plan induces G = 2 (tau - tau_bar)^2 on every real token, to machine
    precision."""
    T = max(lengths) + 2
    mask = torch.arange(T) < torch.tensor(lengths)[:, None]  # (B, T) ragged, padded
    tau, tb = chain_positions(mask, f64), chain_tau_bar(L_b)
    # (B, T, L_b)
    G = structure_cost(chain_structure(tau), chain_structure(tb), anchor_plan(mask, L_b))
    err = ((G - linear_cost(tau, tb)) * mask.unsqueeze(-1)).abs().max()
    assert err < 1e-13


def test_anchor_cost_one_token_is_constant_shift():
    mask, tb = torch.ones(1, dtype=torch.bool), chain_tau_bar(5)
    G = structure_cost(
        chain_structure(chain_positions(mask, f64)), chain_structure(tb), anchor_plan(mask, 5)
    )
    torch.testing.assert_close(
        G - linear_cost(chain_positions(mask, f64), tb), torch.full((1, 5), 0.5, dtype=f64)
    )


def test_structure_cost_matches_four_index_definition():
    g = torch.Generator().manual_seed(0)
    C, Cb, P = (torch.rand(*s, generator=g, dtype=f64) for s in ((6, 6), (4, 4), (6, 4)))
    brute = ((C[:, :, None, None] - Cb[None, None]) ** 2 * P[None, :, None, :]).sum((1, 3))
    torch.testing.assert_close(structure_cost(C, Cb, P), brute, rtol=0, atol=1e-13)


@SET
@given(
    n=st.integers(1, 9),
    m=st.integers(2, 6),
    d=st.integers(1, 5),
    alpha=st.floats(0, 1),
    seed=st.integers(0, 10**6),
)
def test_lfgw_equals_emd2_on_lifted_points(n, m, d, alpha, seed):
    g = torch.Generator().manual_seed(seed)
    h, z = torch.randn(n, d, generator=g, dtype=f64), torch.randn(m, d, generator=g, dtype=f64)
    val, plan = lfgw(h, torch.ones(n, dtype=torch.bool), z, alpha=alpha)
    phi = lift(h, chain_positions(torch.ones(n, dtype=torch.bool), f64), alpha).numpy()
    phib = lift(z, chain_tau_bar(m), alpha).numpy()
    assert abs(float(val) - ot.emd2(ot.unif(n), ot.unif(m), ot.dist(phi, phib))) < 1e-10
    assert (plan >= 0).all() and torch.allclose(plan.sum(-1), torch.full((n,), 1 / n, dtype=f64))


def test_lfgw_entropic_batched_ragged():
    g = torch.Generator().manual_seed(1)
    h, z = (
        torch.randn(3, 7, 4, generator=g, dtype=f64),
        torch.randn(3, 5, 4, generator=g, dtype=f64),
    )
    mask = torch.arange(7) < torch.tensor([7, 4, 2])[:, None]
    val, plan = lfgw(h, mask, z, reg=0.5)
    for i, n in enumerate((7, 4, 2)):
        v1, _ = lfgw(h[i, :n], mask[i, :n], z[i], reg=0.5)
        assert abs(float(v1 - val[i])) < 1e-7
    assert plan[1, 4:].abs().sum() == 0


def test_sq_dists_float32_large_norm_no_nan_and_nonneg():
    x = 1e4 * torch.randn(50, 8)
    y = x[:10] + 1e-3
    D = sq_dists(x, y)
    assert torch.isfinite(D).all() and (D >= 0).all()


@SET
@given(n=st.integers(1, 12), m=st.integers(1, 12), seed=st.integers(0, 10**6))
def test_monotone_plan_marginals(n, m, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(n, generator=g, dtype=f64)
    a /= a.sum()
    b = torch.rand(m, generator=g, dtype=f64)
    b /= b.sum()
    P = monotone_plan(a, b)
    assert (P >= 0).all()
    torch.testing.assert_close(P.sum(-1), a)
    torch.testing.assert_close(P.sum(-2), b)


def _group(seed, K=5, T=14, d=6, dtype=f64):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(K, T, d, generator=g, dtype=dtype)
    lengths = torch.randint(1, T + 1, (K,), generator=g)
    return h, torch.arange(T) < lengths[:, None]


def test_barycenter_plans_meet_row_marginals_and_fixed_point():
    h, mask = _group(0)
    Z, info = linearized_barycenter(
        h, mask, L_b=6, reg=0.5, tol=1e-10, stop_thr=1e-12, inner_iter=5000, max_iter=3000
    )
    assert info['converged'] and (info['plans'] >= 0).all()
    a = mask.double() / mask.sum(-1, keepdim=True)
    torch.testing.assert_close(info['plans'].sum(-1), a, rtol=0, atol=1e-12)
    hn = torch.nn.functional.normalize(h, dim=-1) * mask.unsqueeze(-1)
    M = barycenter_cost(lift(hn, chain_positions(mask, f64), 0.25), Z, info['tau_bar'], 0.25)
    from hara_ref.engine.sinkhorn import sinkhorn_log

    P = sinkhorn_log(
        a, torch.full((6,), 1 / 6, dtype=f64), M, 0.5, stop_thr=1e-13, num_iter_max=5000
    )
    torch.testing.assert_close(barycenter_update(P, hn, info['lam']), Z, rtol=0, atol=1e-8)


def test_batched_ragged_absent_equals_one_by_one():
    groups = [_group(s, K=k) for s, k in ((1, 3), (2, 5), (3, 2))]
    H = torch.zeros(3, 5, 16, 6, dtype=f64)
    Mk = torch.zeros(3, 5, 16, dtype=torch.bool)
    for i, (h, m) in enumerate(groups):
        H[i, : h.shape[0], : h.shape[1]] = h
        Mk[i, : m.shape[0], : m.shape[1]] = m
    kw = dict(L_b=5, reg=0.5, tol=1e-10, stop_thr=1e-12, inner_iter=5000, max_iter=3000)
    Zb, ib = linearized_barycenter(H, Mk, **kw)
    for i, (h, m) in enumerate(groups):
        Z1, _ = linearized_barycenter(h, m, **kw)
        torch.testing.assert_close(Zb[i], Z1, rtol=0, atol=1e-8)
    assert ib['plans'][0, 3:].abs().sum() == 0 and ib['plans'][2, 2:].abs().sum() == 0
    assert ib['plans'].shape == (3, 5, 16, 5) and ib['token_cost'].shape == (3, 5, 16)


def test_batched_default_tol_equals_one_by_one():
    """Each group stops on its own tol: packing groups (ragged, absent rollouts) with the defaults
    changes no number."""
    groups = [_group(s, K=k) for s, k in ((1, 3), (2, 5), (3, 2), (4, 4))]
    H = torch.zeros(4, 5, 16, 6, dtype=f64)
    Mk = torch.zeros(4, 5, 16, dtype=torch.bool)
    for i, (h, m) in enumerate(groups):
        H[i, : h.shape[0], : h.shape[1]] = h
        Mk[i, : m.shape[0], : m.shape[1]] = m
    Zb, ib = linearized_barycenter(H, Mk, warn=False)
    for i, (h, m) in enumerate(groups):
        Z1, i1 = linearized_barycenter(h, m, warn=False)
        torch.testing.assert_close(Zb[i], Z1, rtol=0, atol=1e-10)
        K, T = m.shape
        torch.testing.assert_close(ib['plans'][i, :K, :T], i1['plans'], rtol=0, atol=1e-10)
        assert ib['n_iter_group'][i] == i1['n_iter']
    assert ib['n_iter'] == int(ib['n_iter_group'].max())


def test_empty_group_gives_zero_barycenter_without_nan():
    h, mask = _group(4)
    H = torch.stack([h, h])
    Mk = torch.stack([mask, torch.zeros_like(mask)])
    Z, info = linearized_barycenter(H, Mk, L_b=4, warn=False)
    assert torch.isfinite(Z).all() and Z[1].abs().sum() == 0 and torch.isfinite(info['plans']).all()


def test_weights_permutation_equivariance():
    h, mask = _group(5)
    perm = torch.tensor([3, 0, 4, 1, 2])
    kw = dict(L_b=5, reg=0.5, tol=1e-10, stop_thr=1e-12, inner_iter=5000, max_iter=3000)
    Z1, i1 = linearized_barycenter(h, mask, **kw)
    Z2, i2 = linearized_barycenter(h[perm], mask[perm], **kw)
    torch.testing.assert_close(Z1, Z2, rtol=0, atol=1e-8)
    torch.testing.assert_close(i1['plans'][perm], i2['plans'], rtol=0, atol=1e-8)


@pytest.mark.parametrize('normalize', ['unit', 'none'])
def test_float32_large_norms_no_nan(normalize):
    g = torch.Generator().manual_seed(0)
    h = 1e3 * torch.randn(2, 4, 40, 8, generator=g)  # (G, K, T, d) float32
    mask = torch.ones(2, 4, 40, dtype=torch.bool)
    mask[0, 1, 20:] = False
    mask[1, 3] = False
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        Z, info = linearized_barycenter(h, mask, L_b=8, normalize=normalize, max_iter=30)
    assert (
        Z.dtype == torch.float32 and torch.isfinite(Z).all() and torch.isfinite(info['plans']).all()
    )
    assert torch.isfinite(info['token_cost']).all()


def test_float32_matches_float64():
    h, mask = _group(6)
    Z64, _ = linearized_barycenter(
        h, mask, L_b=6, reg=0.2, tol=1e-9, stop_thr=1e-11, inner_iter=5000
    )
    Z32, _ = linearized_barycenter(h.float(), mask, L_b=6, reg=0.2, warn=False)
    assert (Z32.double() - Z64).abs().max() < 1e-3


def test_nonconvergence_warns():
    h, mask = _group(7)
    with pytest.warns(UserWarning, match='not converged'):
        linearized_barycenter(h, mask, L_b=6, max_iter=1)


def test_bad_inputs():
    h = torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match='mask shape'):
        linearized_barycenter(h, torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match='bool'):
        linearized_barycenter(h, torch.ones(2, 3))
    with pytest.raises(TypeError, match='floating'):
        linearized_barycenter(
            torch.ones(2, 3, 4, dtype=torch.long), torch.ones(2, 3, dtype=torch.bool)
        )
    with pytest.raises(ValueError, match=r'\(\.\.\., K, T, d\)'):
        linearized_barycenter(torch.randn(3, 4), torch.ones(3, dtype=torch.bool))
    hn = h.clone()
    hn[0, 1, 2] = math.nan
    with pytest.raises(ValueError, match='nan'):
        linearized_barycenter(hn, torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match='weights'):
        linearized_barycenter(
            h, torch.ones(2, 3, dtype=torch.bool), weights=torch.tensor([1.0, -1.0])
        )
    with pytest.raises(ValueError, match='alpha'):
        lift(h, torch.rand(2, 3), 1.5)
    with pytest.raises(ValueError, match='L_b must be >= 2'):
        anchor_plan(torch.ones(3, dtype=torch.bool), 1)
    with pytest.raises(ValueError, match='at least one real token'):
        anchor_plan(torch.zeros(3, dtype=torch.bool), 4)


# ---------------------------------------------------------------- group_barycenters: rollouts in
# place, any order
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10**6),
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    extra=st.integers(0, 3),
)
def test_group_barycenters_flat_any_order_equals_grouped(seed, sizes, extra):
    """Rollouts flat, shuffled, with rollouts in no group (-1) and NaN padding: the same numbers as
    the grouped layout."""
    groups = [_group(seed + g, K=k) for g, k in enumerate(sizes)]
    T = max(h.shape[1] for h, _ in groups) + extra
    H = torch.zeros(len(sizes), max(sizes), T, 6, dtype=f64)
    Mk = torch.zeros(len(sizes), max(sizes), T, dtype=torch.bool)
    for i, (h, m) in enumerate(groups):
        H[i, : h.shape[0], : h.shape[1]] = h
        Mk[i, : m.shape[0], : m.shape[1]] = m
    Zg, ig = linearized_barycenter(H, Mk, L_b=5, warn=False)
    rows = [(g, k) for g in range(len(sizes)) for k in range(sizes[g])]
    # (R+1, T, d): one more rollout in no group
    h = torch.stack([H[g, k] for g, k in rows] + [torch.randn(T, 6, dtype=f64)])
    m = torch.stack([Mk[g, k] for g, k in rows] + [torch.ones(T, dtype=torch.bool)])
    gid = torch.tensor([g for g, _ in rows] + [-1])
    h[~m] = float('nan')  # padding may hold anything
    perm = torch.randperm(len(gid), generator=torch.Generator().manual_seed(seed))
    Z, info = group_barycenters(h[perm], m[perm], gid[perm], len(sizes), L_b=5, warn=False)
    # The layouts sum in different orders, so they agree to rounding, unless an inner solve's
    # stopping test falls at
    # rounding level: then one layout takes one more Newton step, and the plans differ by up to the
    # inner tolerance
    # (inner_rtol = 1e-3 of the last change of Z, itself below tol = 1e-4): 1e-8 bounds both.
    torch.testing.assert_close(Z, Zg, rtol=0, atol=1e-8)
    inv = perm.argsort()
    for r, (g, k) in enumerate(rows):
        torch.testing.assert_close(info['plans'][inv[r]], ig['plans'][g, k], rtol=0, atol=1e-8)
        torch.testing.assert_close(
            info['token_cost'][inv[r]], ig['token_cost'][g, k], rtol=0, atol=1e-8
        )
    # not in any group
    assert info['plans'][inv[-1]].abs().sum() == 0 and info['token_cost'][inv[-1]].abs().sum() == 0
    assert torch.equal(info['n_iter_group'], ig['n_iter_group'].reshape(-1))


def test_final_sinkhorn_gives_the_exact_plans_to_the_returned_barycenter():
    h, mask = _group(8)
    Z, info = group_barycenters(
        h,
        mask,
        torch.zeros(len(h), dtype=torch.long),
        L_b=6,
        reg=0.2,
        max_iter=5,
        warn=False,
        final_plans_kw=dict(stop_thr=1e-12, num_iter_max=5000),
    )
    hn = normalize_features(h, 'unit') * mask.unsqueeze(-1)
    # (K, T, L_b)
    M = barycenter_cost(lift(hn, chain_positions(mask, f64), 0.25), Z[0], info['tau_bar'], 0.25)
    a = mask.double() / mask.sum(-1, keepdim=True)
    P, lg = sinkhorn_log(
        a, torch.full((6,), 1 / 6, dtype=f64), M, 0.2, stop_thr=1e-12, num_iter_max=5000, log=True
    )
    assert lg['converged'].all()
    torch.testing.assert_close(info['plans'], P, rtol=0, atol=1e-9)
    torch.testing.assert_close(info['token_cost'], (P * M).sum(-1), rtol=0, atol=1e-9)
    assert info['final_plans_iters'] > 0


@pytest.mark.parametrize('how', ['unit', 'none', 'mean_norm'])
def test_feature_scales_match_normalize_features(how):
    h, mask = _group(9)
    _, s, hh = feature_scales(h, mask, how)
    hn = normalize_features(h, how, mask) * mask.unsqueeze(-1)
    torch.testing.assert_close(s.unsqueeze(-1) * h, hn, rtol=0, atol=1e-14)
    torch.testing.assert_close(hh, (hn**2).sum(-1), rtol=0, atol=1e-14)


def test_feature_scales_float32_norm_overflow():
    h = torch.full((1, 3, 4), 3e38)  # finite float32 entries whose norm overflows float32
    _, s, hh = feature_scales(h, torch.ones(1, 3, dtype=torch.bool))
    assert torch.isfinite(s).all() and (s > 0).all()
    torch.testing.assert_close(hh, torch.ones(1, 3), rtol=1e-5, atol=0)


def test_group_barycenters_bad_input():
    h, mask = _group(10)
    g = torch.zeros(len(h), dtype=torch.long)
    with pytest.raises(ValueError, match='group must be an integer tensor'):
        group_barycenters(h, mask, g.double())
    with pytest.raises(ValueError, match='group must be an integer tensor'):
        group_barycenters(h, mask, g[:-1])
    with pytest.raises(ValueError, match='< n_groups'):
        group_barycenters(h, mask, g + 2, n_groups=2)
    with pytest.raises(ValueError, match='mask must be bool'):
        group_barycenters(h, mask.double(), g)
    with pytest.raises(ValueError, match='alpha'):
        group_barycenters(h, mask, g, alpha=2.0)
    hb = h.clone()
    hb[0, 0, 0] = float('inf')
    with pytest.raises(ValueError, match='nan or inf on real tokens'):
        group_barycenters(hb, mask, g)
    with pytest.raises(ValueError, match='weights'):
        group_barycenters(h, mask, g, weights=-torch.ones(len(h)))


@pytest.mark.parametrize('n_groups', [None, 0])
def test_group_barycenters_with_no_group_returns_no_barycenter(n_groups):
    "Every rollout outside every group (-1): no barycenter, zero costs, nothing to converge."
    h, mask = _group(4)
    Z, info = group_barycenters(h, mask, torch.full((len(h),), -1), n_groups, final_plans_kw={})
    assert Z.shape == (0, 32, h.shape[-1])
    assert info['n_iter'] == 0 and info['converged'] and info['final_unconverged'] == 0
    assert (info['token_cost'] == 0).all() and (info['plans'] == 0).all()


def test_group_barycenters_reports_its_tolerance_and_rounding_floor():
    "A tol below the dtype's resolution is not silently ignored: info says what the stop was."
    from hara_ref.engine.barycenters import group_barycenters

    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        h = torch.randn(4, 12, 6, generator=g, dtype=dtype)  # (N, T, d)
        m = torch.ones(4, 12, dtype=torch.bool)  # (N, T)
        _, info = group_barycenters(h, m, torch.zeros(4, dtype=torch.long), L_b=4, tol=1e-12)
        eps = torch.finfo(dtype).eps
        assert info['tol'] == max(1e-12, 100 * eps) and info['rounding_floor'] == 1000 * eps


@pytest.mark.float32
def test_group_barycenters_reports_groups_stopped_at_the_rounding_floor():
    "A group stopped by the rounding floor, not by tol, is named, with its estimated distance."
    from hara_ref.engine.barycenters import group_barycenters

    g = torch.Generator().manual_seed(0)
    group = torch.tensor([0, 0, 1, 1])  # (N,) two groups
    for dtype, tol, floor in ((torch.float32, 1e-12, True), (torch.float64, 1e-4, False)):
        h = torch.randn(4, 12, 6, generator=g, dtype=dtype)  # (N, T, d)
        m = torch.ones(4, 12, dtype=torch.bool)  # (N, T)
        _, info = group_barycenters(h, m, group, L_b=4, tol=tol)
        assert info['converged'] and info['at_rounding_floor'].tolist() == [floor, floor]
        err = info['fixed_point_error']  # (Y,)
        # float32: 100 eps = 1.2e-5 asked, the floor stops both groups above it; float64: tol met
        assert bool((err >= info['tol']).all()) if floor else bool((err < tol).all())


def test_reference_barycenter_at_hara_eps_is_the_fixed_point_of_group_barycenters():
    """At HARA's eps = 0.05, on planted rollouts (stage-structured costs), the reference iteration
    (Newton plans) converges with no warning, to the barycenter `group_barycenters` reaches when its
    plans are solved exactly at every iteration."""
    from hara_ref.rlvr.data import planted_stage_rollouts

    pr = planted_stage_rollouts(K=4, n_stages=4, d=8, stage_len=(3, 5), noise=0.1, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        Z_ref, _, lg = linearized_barycenter_reference(
            pr.hidden, pr.mask, L_b=16, reg=0.05, tol=1e-12, log=True
        )
    assert lg['converged']
    Z, info = group_barycenters(
        pr.hidden,
        pr.mask,
        torch.zeros(4, dtype=torch.long),
        L_b=16,
        reg=0.05,
        tol=1e-11,
        max_iter=5000,
        stop_thr=1e-13,
        inner_rtol=0.0,
        inner_iter=500,
    )
    assert info['converged'] and float((Z[0] - Z_ref).abs().max()) < 1e-8


def test_lfgw_keeps_surplus_tokens_nearer_their_place_than_fgw():
    """Chapters 06 and 08's pair of planted rollouts: at alpha = 0.25 the FGW plan sends some of
    rollout 0's first-stage tokens to rollout 1's stage 4 (a stage rollout 0 skips); the anchor's
    position term keeps the LFGW plan's share of that far smaller."""
    from hara_ref.ot.fgw import fgw, rollout_pair
    from hara_ref.rlvr.data import planted_stage_rollouts

    pr = planted_stage_rollouts(K=2, seed=1, p_skip=0.2, p_repeat=0.2)
    M01, C0, C1 = rollout_pair(pr.hidden, pr.mask, 0, 1)
    hn = normalize_features(pr.hidden, how='unit')
    P_fgw = fgw(M01, C0, C1, alpha=0.25)
    P_lin = lfgw(hn[:1], pr.mask[:1], hn[1][pr.mask[1]][None], alpha=0.25)[1][0][pr.mask[0]]
    s0, s1 = pr.stages[0][pr.mask[0]], pr.stages[1][pr.mask[1]]
    assert 4 not in s0.tolist() and 4 in s1.tolist()
    far = lambda P: float(P[s0 == 0][:, s1 == 4].sum())
    assert far(P_fgw) > 0.03 and far(P_lin) < far(P_fgw) / 3
