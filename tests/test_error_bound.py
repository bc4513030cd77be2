"Property tests for hara_ref.ot.error_bound (Theorem 3.2)."

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st, HealthCheck
from hara_ref.ot.fgw import chain_positions, chain_structure, fgw_objective
from hara_ref.ot.lfgw import chain_tau_bar, monotone_plan
from hara_ref.ot.fgw_barycenter import sq_dists
from hara_ref.ot.error_bound import (
    gw_term,
    lin_term,
    order_reversing_R,
    order_reversing_R_naive,
    order_reversing_mass,
    lfgw_objective,
    random_plans,
    bound_study,
    random_instance,
    solve_instance,
    position_mean_gap,
    linearization_gap,
    check_weights,
)
from hara_ref.engine.verifier import rounding_tol

SET = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
f64 = torch.float64


def _plans(B, n, m, seed, V=3):
    g = torch.Generator().manual_seed(seed)
    return random_plans(
        torch.full((B, n), 1 / n, dtype=f64), torch.full((B, m), 1 / m, dtype=f64), V, g
    ), g


@SET
@given(
    n=st.integers(1, 10),
    m=st.integers(1, 8),
    V=st.integers(1, 4),
    alpha=st.floats(0, 1),
    seed=st.integers(0, 10**6),
)
def test_identity_on_random_plans(n, m, V, alpha, seed):
    "GW = 2 Lin - 4 R and F_lin - F = 4 alpha R at every feasible plan (uniform weights on chains)."
    plan, g = _plans(64, n, m, seed, V)
    tau = chain_positions(torch.ones(64, n, dtype=torch.bool), f64)
    tb = chain_tau_bar(m).expand(64, m)
    R = order_reversing_R(plan, tau, tb)
    assert (gw_term(plan, tau, tb) - (2 * lin_term(plan, tau, tb) - 4 * R)).abs().max() < 1e-12
    M = sq_dists(
        torch.randn(64, n, 3, generator=g, dtype=f64), torch.randn(64, m, 3, generator=g, dtype=f64)
    )
    F = fgw_objective(plan, M, chain_structure(tau), chain_structure(tb), alpha)
    assert (lfgw_objective(plan, M, tau, tb, alpha) - F - 4 * alpha * R).abs().max() < 1e-12
    assert (R >= -1e-15).all() and (R <= order_reversing_mass(plan, tau, tb) + 1e-15).all()


@SET
@given(n=st.integers(1, 8), m=st.integers(1, 7), seed=st.integers(0, 10**6), shuffle=st.booleans())
def test_prefix_sums_match_definition(n, m, seed, shuffle):
    "R in O(n m) equals the O(n^2 m^2) definition, also for unsorted (distinct) positions."
    g = torch.Generator().manual_seed(seed)
    # any non-negative matrix, not only couplings
    plan = torch.rand(16, n, m, generator=g, dtype=f64)
    tau = (
        torch.rand(16, n, generator=g, dtype=f64)
        if shuffle
        else chain_positions(torch.ones(16, n, dtype=torch.bool), f64)
    )
    tb = torch.rand(16, m, generator=g, dtype=f64) if shuffle else chain_tau_bar(m).expand(16, m)
    assert (
        order_reversing_R(plan, tau, tb) - order_reversing_R_naive(plan, tau, tb)
    ).abs().max() < 1e-12
    x = tau[:, :, None] - tau[:, None, :]
    y = tb[:, :, None] - tb[:, None, :]
    rev = (x[:, :, None, :, None] * y[:, None, :, None, :] < 0).to(f64)
    rho = torch.einsum('btjsk,btj,bsk->b', rev, plan, plan)
    assert (order_reversing_mass(plan, tau, tb) - rho).abs().max() < 1e-12


@SET
@given(n=st.integers(1, 40), m=st.integers(1, 40))
def test_monotone_plans_have_zero_R(n, m):
    P = monotone_plan(torch.full((n,), 1 / n, dtype=f64), torch.full((m,), 1 / m, dtype=f64))
    tau, tb = chain_positions(torch.ones(n, dtype=torch.bool), f64), chain_tau_bar(m)
    # rounding of the cumsums only
    assert (
        float(order_reversing_R(P, tau, tb)) < 1e-15
        and float(order_reversing_mass(P, tau, tb)) < 1e-15
    )


def test_padding_rows_do_not_matter():
    plan, _ = _plans(8, 6, 4, 0)
    tau = chain_positions(torch.ones(8, 6, dtype=torch.bool), f64)
    padded = torch.cat([plan, torch.zeros(8, 3, 4, dtype=f64)], 1)
    tau_p = torch.cat([tau, torch.zeros(8, 3, dtype=f64)], 1)
    torch.testing.assert_close(
        order_reversing_R(padded, tau_p, chain_tau_bar(4)),
        order_reversing_R(plan, tau, chain_tau_bar(4)),
    )


def test_float32_large_no_nan():
    P = monotone_plan(torch.full((4096,), 1 / 4096), torch.full((32,), 1 / 32)).flip(-1)
    R = order_reversing_R(
        P,
        chain_positions(torch.ones(4096, dtype=torch.bool), torch.float32),
        chain_tau_bar(32, torch.float32),
    )
    R64 = order_reversing_R(
        P.double(), chain_positions(torch.ones(4096, dtype=torch.bool), f64), chain_tau_bar(32)
    )
    assert torch.isfinite(R) and abs(float(R) - float(R64)) < 1e-4


def test_bound_on_random_instances():
    "0 <= LFGW* - FGW <= 4 alpha R(T) <= 4 alpha rho(T); certificate F(T_lin) <= LFGW*."
    res = bound_study(n_instances=400, seed=1)
    assert res['gap'].min() >= -1e-12
    assert res['slack'].min() >= -1e-12
    assert (res['R'] - res['rho']).max() <= 1e-12
    assert (res['F_T_lin'] - res['lfgw']).max() <= 1e-12
    # order-preserving optimum: linearization exact
    assert np.abs(res['gap'][res['R'] < 1e-14]).max() < 1e-12


def test_solve_instance_values():
    rng = np.random.default_rng(3)
    M, tau, tb = random_instance(rng)
    s = solve_instance(M, tau, tb, 0.25, rng)
    assert s['fgw'] <= s['F_lin_plan'] + 1e-12 <= s['lfgw'] + 2e-12


def test_bad_inputs():
    with pytest.raises(ValueError, match='shape mismatch'):
        order_reversing_R(torch.rand(3, 4), torch.rand(3), torch.rand(5))
    with pytest.raises(ValueError, match='negative'):
        order_reversing_mass(-torch.rand(3, 4), torch.rand(3), torch.rand(4))
    with pytest.raises(ValueError, match='nan'):
        order_reversing_R(torch.full((3, 4), float('nan')), torch.rand(3), torch.rand(4))
    with pytest.raises(TypeError, match='floating'):
        order_reversing_R(torch.rand(3, 4), torch.arange(3), torch.rand(4))


# ---- beyond the premise: any weights, any mass
# -------------------------------------------------------------------


def _weighted_plans(B, n, m, mass, seed, dtype=f64):
    "Plans of Pi(a, b) for Dirichlet weights a, b of total `mass`, with a, b."
    g = torch.Generator().manual_seed(seed)
    a, b = (
        -torch.rand(B, n, generator=g, dtype=f64).log(),
        -torch.rand(B, m, generator=g, dtype=f64).log(),
    )
    a, b = mass * a / a.sum(-1, keepdim=True), mass * b / b.sum(-1, keepdim=True)
    return random_plans(a, b, 3, g).to(dtype), a.to(dtype), b.to(dtype), g


@SET
@given(
    n=st.integers(1, 9),
    m=st.integers(1, 8),
    mass=st.floats(0.05, 4),
    alpha=st.floats(0, 1),
    chain=st.booleans(),
    seed=st.integers(0, 10**6),
)
def test_general_identity(n, m, mass, alpha, chain, seed):
    """GW = 2 s Lin - 4R - 2 m^2 and F_lin - F = 4 alpha R + 2 alpha m^2 + 2 alpha (1 - s) Lin at
    every plan (64 per example)."""
    plan, a, b, g = _weighted_plans(64, n, m, mass, seed)
    tau = (
        chain_positions(torch.ones(64, n, dtype=torch.bool), f64)
        if chain
        else 2 * torch.rand(64, n, generator=g, dtype=f64) - 0.5
    )
    tb = chain_tau_bar(m).expand(64, m) if chain else torch.rand(64, m, generator=g, dtype=f64)
    mT, R, lin, gw = (
        position_mean_gap(plan, tau, tb),
        order_reversing_R(plan, tau, tb),
        lin_term(plan, tau, tb),
        gw_term(plan, tau, tb),
    )
    # m from the given marginals
    torch.testing.assert_close(mT, (a * tau).sum(-1) - (b * tb).sum(-1), rtol=0, atol=1e-13)
    torch.testing.assert_close(
        gw, 2 * mass * lin - 4 * R - 2 * mT**2, rtol=0, atol=1e-12 * (1 + mass) ** 2
    )
    M = sq_dists(
        torch.randn(64, n, 3, generator=g, dtype=f64), torch.randn(64, m, 3, generator=g, dtype=f64)
    )
    F = fgw_objective(plan, M, chain_structure(tau), chain_structure(tb), alpha)
    D = linearization_gap(plan, tau, tb, alpha)
    torch.testing.assert_close(
        lfgw_objective(plan, M, tau, tb, alpha) - F, D, rtol=0, atol=1e-12 * (1 + mass) ** 2
    )
    if mass == 1:
        assert (D >= 2 * alpha * mT**2 - 1e-14).all()


def test_premise_is_the_special_case():
    "Uniform weights on chains: m = 0 and Err = 4 alpha R exactly as the paper states."
    plan, _ = _plans(256, 7, 5, 3)
    tau = chain_positions(torch.ones(256, 7, dtype=torch.bool), f64)
    tb = chain_tau_bar(5)
    assert position_mean_gap(plan, tau, tb).abs().max() < 1e-15
    torch.testing.assert_close(
        linearization_gap(plan, tau, tb, 0.3),
        4 * 0.3 * order_reversing_R(plan, tau, tb),
        rtol=0,
        atol=1e-15,
    )


def test_premise_formula_is_wrong_outside_it():
    """With Dirichlet weights the premise formula 2 Lin - 4R misses 2 m^2, which is large on some
    plans."""
    plan, a, b, _ = _weighted_plans(512, 6, 4, 1.0, 7)
    tau = chain_positions(torch.ones(512, 6, dtype=torch.bool), f64)
    tb = chain_tau_bar(4)
    err = gw_term(plan, tau, tb) - (
        2 * lin_term(plan, tau, tb) - 4 * order_reversing_R(plan, tau, tb)
    )
    torch.testing.assert_close(err, -2 * position_mean_gap(plan, tau, tb) ** 2, rtol=0, atol=1e-14)
    assert err.min() < -0.05


def test_plans_off_their_marginals():
    """A plan perturbed off Pi(a, b) (as an entropic plan is): m and s come from the plan itself,
    Err stays exact."""
    plan, a, b, g = _weighted_plans(128, 8, 6, 1.0, 11)
    # marginals off by up to 1 %
    plan = plan * (1 + 1e-2 * torch.rand(plan.shape, generator=g, dtype=f64))
    tau = chain_positions(torch.ones(128, 8, dtype=torch.bool), f64)
    tb = chain_tau_bar(6)
    M = sq_dists(
        torch.randn(128, 8, 2, generator=g, dtype=f64),
        torch.randn(128, 6, 2, generator=g, dtype=f64),
    )
    F = fgw_objective(plan, M, chain_structure(tau), chain_structure(tb), 0.25)
    torch.testing.assert_close(
        lfgw_objective(plan, M, tau, tb, 0.25) - F,
        linearization_gap(plan, tau, tb, 0.25),
        rtol=0,
        atol=1e-14,
    )
    own = (plan.sum(-1) * tau).sum(-1) - (plan.sum(-2) * tb).sum(-1)
    torch.testing.assert_close(position_mean_gap(plan, tau, tb), own, rtol=0, atol=1e-15)
    # the intended marginals would give another m
    assert ((a * tau).sum(-1) - (b * tb).sum(-1) - own).abs().max() > 1e-5


def test_general_identity_float32():
    "float32: the general identity holds to float32 rounding; values agree with float64."
    plan64, a, b, g = _weighted_plans(256, 12, 8, 1.7, 5)
    tau, tb = (
        torch.rand(256, 12, generator=g, dtype=f64),
        torch.rand(256, 8, generator=g, dtype=f64),
    )
    plan, t32, tb32 = plan64.float(), tau.float(), tb.float()
    gw, lin = gw_term(plan, t32, tb32), lin_term(plan, t32, tb32)
    rhs = (
        2 * plan.sum((-2, -1)) * lin
        - 4 * order_reversing_R(plan, t32, tb32)
        - 2 * position_mean_gap(plan, t32, tb32) ** 2
    )
    tol = rounding_tol(1.0, n=12 * 8)  # relative to 1 + |value|: sums over the n x m plan entries
    assert gw.dtype == torch.float32 and ((gw - rhs).abs() / (1 + gw.abs())).max() < tol
    D32, D64 = linearization_gap(plan, t32, tb32, 0.25), linearization_gap(plan64, tau, tb, 0.25)
    assert D32.dtype == torch.float32 and ((D32.double() - D64).abs() / (1 + D64.abs())).max() < tol


def test_bound_beyond_premise_mass_one():
    """Dirichlet weights, mass 1: 2 alpha m^2 <= gap <= 4 alpha R + 2 alpha m^2 on 1000 instances;
    the paper's bound fails."""
    res = bound_study(n_instances=1000, seed=2, weights='dirichlet')
    assert res['slack'].min() >= -1e-12 and res['lower_slack'].min() >= -1e-12
    np.testing.assert_allclose(
        res['upper'], 4 * 0.25 * res['R'] + 2 * 0.25 * res['m'] ** 2, rtol=0, atol=1e-12
    )
    assert (res['gap'] >= 2 * 0.25 * res['m'] ** 2 - 1e-12).all() and res['gap'].min() >= -1e-12
    # the premise's bound is broken by more than 0.1
    assert (4 * 0.25 * res['R'] - res['gap']).min() < -0.1
    assert (res['F_T_lin'] <= res['lfgw'] + 1e-12).all()  # certificate still holds at mass 1


@pytest.mark.parametrize('mass', [0.5, 2.0])
def test_bound_beyond_premise_other_mass(mass):
    "Mass != 1: Err(T_lin) <= gap <= Err(T_hat) still holds; for mass 2 the gap goes negative."
    res = bound_study(n_instances=300, seed=3, weights='dirichlet', mass=mass)
    assert res['slack'].min() >= -1e-12 and res['lower_slack'].min() >= -1e-12
    assert (res['fgw'] <= res['F_T_lin'] + 1e-12).all()  # F(T_lin) >= best FGW value, always
    if mass > 1:
        assert res['gap'].min() < -0.05
    else:
        assert res['gap'].min() > 0  # s < 1: Err >= 2 alpha (1 - s) Lin > 0


def test_solve_instance_weights():
    rng = np.random.default_rng(4)
    M, tau, tb = random_instance(rng)
    a, b = rng.dirichlet(np.ones(M.shape[0])), rng.dirichlet(np.ones(M.shape[1]))
    s = solve_instance(M, tau, tb, 0.25, rng, a, b)
    np.testing.assert_allclose(s['plan'].sum(1), a, atol=1e-12)
    np.testing.assert_allclose(s['plan'].sum(0), b, atol=1e-12)
    assert (
        abs(s['m'] - (a @ tau - b @ tb)) < 1e-15
        and s['delta_lin'] <= s['lfgw'] - s['fgw'] + 1e-12 <= s['delta_plan'] + 2e-12
    )


def test_bad_inputs_beyond_premise():
    a, b = torch.full((2, 3), 1 / 3, dtype=f64), torch.full((2, 4), 1 / 4, dtype=f64)
    with pytest.raises(ValueError, match='different totals'):
        random_plans(a, 2 * b)
    with pytest.raises(ValueError, match='negative'):
        random_plans(-a, -b)
    with pytest.raises(ValueError, match='nan'):
        random_plans(a * float('nan'), b)
    with pytest.raises(ValueError, match='batch shapes'):
        check_weights(a, b[:1])
    with pytest.raises(TypeError, match='floating'):
        random_plans(torch.ones(2, 3, dtype=torch.long), b)
    M, tau, tb = random_instance(np.random.default_rng(0))
    with pytest.raises(ValueError, match='different totals'):
        solve_instance(M, tau, tb, a=np.ones(M.shape[0]), b=np.ones(M.shape[1]) / M.shape[1])
    with pytest.raises(ValueError, match='expected'):
        solve_instance(M, tau, tb, a=np.ones(M.shape[0] + 1))
    with pytest.raises(ValueError, match="'uniform' or 'dirichlet'"):
        bound_study(2, weights='random')
    with pytest.raises(ValueError, match='mass must be'):
        bound_study(2, mass=0.0)
    with pytest.raises(ValueError, match='alpha must be'):
        linearization_gap(
            a[0, :, None] * b[0], torch.rand(3, dtype=f64), torch.rand(4, dtype=f64), -0.1
        )
    with pytest.raises(ValueError, match='negative'):
        position_mean_gap(
            -torch.ones(3, 4, dtype=f64), torch.rand(3, dtype=f64), torch.rand(4, dtype=f64)
        )


def test_scalar_types_accepted():
    "alpha and mass may be numpy or one-element torch scalars; anything else is refused."
    T, one, zero = torch.ones(1, 1, dtype=f64), torch.ones(1, dtype=f64), torch.zeros(1, dtype=f64)
    for alpha in (0.25, np.float32(0.25), torch.tensor(0.25, dtype=f64)):
        # 2 alpha m^2 with m = 1
        assert abs(float(linearization_gap(T, one, zero, alpha)) - 0.5) < 1e-7
    for bad in ('0.25', None, torch.tensor([0.25, 0.5]), float('nan')):
        with pytest.raises(ValueError, match='alpha must be'):
            linearization_gap(T, one, zero, bad)
    assert bound_study(3, mass=np.float64(2.0), weights='dirichlet')['gap'].shape == (3,)
