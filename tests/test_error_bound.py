"Property tests for hara_ref.error_bound (Theorem 3.2)."
import numpy as np, pytest, torch
from hypothesis import given, settings, strategies as st, HealthCheck
from hara_ref.fgw import chain_positions, chain_structure, fgw_objective
from hara_ref.linearization import chain_tau_bar, sq_dists, monotone_plan
from hara_ref.error_bound import (gw_term, lin_term, order_reversing_R, order_reversing_R_naive, order_reversing_mass,
                                  lfgw_objective, random_plans, bound_study, random_instance, solve_instance)

SET = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
f64 = torch.float64

def _plans(B, n, m, seed, V=3):
    g = torch.Generator().manual_seed(seed)
    return random_plans(torch.full((B, n), 1 / n, dtype=f64), torch.full((B, m), 1 / m, dtype=f64), V, g), g

@SET
@given(n=st.integers(1, 10), m=st.integers(1, 8), V=st.integers(1, 4), alpha=st.floats(0, 1), seed=st.integers(0, 10**6))
def test_identity_on_random_plans(n, m, V, alpha, seed):
    "GW = 2 Lin - 4 R and F_lin - F = 4 alpha R at every feasible plan (uniform weights on chains)."
    plan, g = _plans(64, n, m, seed, V)
    tau = chain_positions(torch.ones(64, n, dtype=torch.bool), f64); tb = chain_tau_bar(m).expand(64, m)
    R = order_reversing_R(plan, tau, tb)
    assert (gw_term(plan, tau, tb) - (2 * lin_term(plan, tau, tb) - 4 * R)).abs().max() < 1e-12
    M = sq_dists(torch.randn(64, n, 3, generator=g, dtype=f64), torch.randn(64, m, 3, generator=g, dtype=f64))
    F = fgw_objective(plan, M, chain_structure(tau), chain_structure(tb), alpha)
    assert (lfgw_objective(plan, M, tau, tb, alpha) - F - 4 * alpha * R).abs().max() < 1e-12
    assert (R >= -1e-15).all() and (R <= order_reversing_mass(plan, tau, tb) + 1e-15).all()

@SET
@given(n=st.integers(1, 8), m=st.integers(1, 7), seed=st.integers(0, 10**6), shuffle=st.booleans())
def test_prefix_sums_match_definition(n, m, seed, shuffle):
    "R in O(n m) equals the O(n^2 m^2) definition, also for unsorted (distinct) positions."
    g = torch.Generator().manual_seed(seed)
    plan = torch.rand(16, n, m, generator=g, dtype=f64)  # any non-negative matrix, not only couplings
    tau = torch.rand(16, n, generator=g, dtype=f64) if shuffle else chain_positions(torch.ones(16, n, dtype=torch.bool), f64)
    tb = torch.rand(16, m, generator=g, dtype=f64) if shuffle else chain_tau_bar(m).expand(16, m)
    assert (order_reversing_R(plan, tau, tb) - order_reversing_R_naive(plan, tau, tb)).abs().max() < 1e-12
    x = tau[:, :, None] - tau[:, None, :]; y = tb[:, :, None] - tb[:, None, :]
    rev = (x[:, :, None, :, None] * y[:, None, :, None, :] < 0).to(f64)
    rho = torch.einsum('btjsk,btj,bsk->b', rev, plan, plan)
    assert (order_reversing_mass(plan, tau, tb) - rho).abs().max() < 1e-12

@SET
@given(n=st.integers(1, 40), m=st.integers(1, 40))
def test_monotone_plans_have_zero_R(n, m):
    P = monotone_plan(torch.full((n,), 1 / n, dtype=f64), torch.full((m,), 1 / m, dtype=f64))
    tau, tb = chain_positions(torch.ones(n, dtype=torch.bool), f64), chain_tau_bar(m)
    assert float(order_reversing_R(P, tau, tb)) < 1e-15 and float(order_reversing_mass(P, tau, tb)) < 1e-15  # rounding of the cumsums only

def test_padding_rows_do_not_matter():
    plan, _ = _plans(8, 6, 4, 0)
    tau = chain_positions(torch.ones(8, 6, dtype=torch.bool), f64)
    padded = torch.cat([plan, torch.zeros(8, 3, 4, dtype=f64)], 1); tau_p = torch.cat([tau, torch.zeros(8, 3, dtype=f64)], 1)
    torch.testing.assert_close(order_reversing_R(padded, tau_p, chain_tau_bar(4)), order_reversing_R(plan, tau, chain_tau_bar(4)))

def test_float32_large_no_nan():
    P = monotone_plan(torch.full((4096,), 1 / 4096), torch.full((32,), 1 / 32)).flip(-1)
    R = order_reversing_R(P, chain_positions(torch.ones(4096, dtype=torch.bool), torch.float32), chain_tau_bar(32, torch.float32))
    R64 = order_reversing_R(P.double(), chain_positions(torch.ones(4096, dtype=torch.bool), f64), chain_tau_bar(32))
    assert torch.isfinite(R) and abs(float(R) - float(R64)) < 1e-4

def test_bound_on_random_instances():
    "0 <= LFGW* - FGW <= 4 alpha R(T) <= 4 alpha rho(T); certificate F(T_lin) <= LFGW*."
    res = bound_study(n_instances=400, seed=1)
    assert res['gap'].min() >= -1e-12
    assert res['slack'].min() >= -1e-12
    assert (res['R'] - res['rho']).max() <= 1e-12
    assert (res['F_T_lin'] - res['lfgw']).max() <= 1e-12
    assert np.abs(res['gap'][res['R'] < 1e-14]).max() < 1e-12  # order-preserving optimum: linearization exact

def test_solve_instance_values():
    rng = np.random.default_rng(3)
    M, tau, tb = random_instance(rng)
    s = solve_instance(M, tau, tb, 0.25, rng)
    assert s['fgw'] <= s['F_lin_plan'] + 1e-12 <= s['lfgw'] + 2e-12

def test_bad_inputs():
    with pytest.raises(ValueError, match='shape mismatch'): order_reversing_R(torch.rand(3, 4), torch.rand(3), torch.rand(5))
    with pytest.raises(ValueError, match='negative'): order_reversing_mass(-torch.rand(3, 4), torch.rand(3), torch.rand(4))
    with pytest.raises(ValueError, match='nan'): order_reversing_R(torch.full((3, 4), float('nan')), torch.rand(3), torch.rand(4))
    with pytest.raises(TypeError, match='floating'): order_reversing_R(torch.rand(3, 4), torch.arange(3), torch.rand(4))
