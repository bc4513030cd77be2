"""Chain graphs, the FGW objective and solver: properties, POT cross-checks, limits, failure cases
(`hara_ref.ot.fgw`)."""

import numpy as np
import ot
import pytest
import torch
from hypothesis import given, settings, strategies as st, HealthCheck
from hara_ref.ot.fgw import (
    chain_positions,
    chain_structure,
    normalize_features,
    chain_graph,
    gw_objective,
    fgw_objective,
    gw_gradient,
    fgw_line_search,
    fgw,
    fgw2,
    rollout_pair,
)
from hara_ref.engine.ot_checks import checked_fgw
from hara_ref.rlvr.data import planted_stage_rollouts

SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


pytestmark = pytest.mark.usefixtures('one_thread')  # tests/conftest.py


def instance(seed, n, m):
    "Random FGW instance (numpy float64): metric structures, features, Dirichlet weights, alpha."
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(n, 2)), rng.normal(size=(m, 2))
    C1, C2 = ot.dist(x, x, metric='euclidean'), ot.dist(y, y, metric='euclidean')
    M = ot.dist(rng.normal(size=(n, 3)), rng.normal(size=(m, 3)))
    return M, C1, C2, rng.dirichlet(np.ones(n)), rng.dirichlet(np.ones(m)), float(rng.random())


@SETTINGS
@given(rows=st.lists(st.lists(st.booleans(), min_size=6, max_size=6), min_size=1, max_size=4))
def test_chain_positions_properties(rows):
    mask = torch.tensor(rows)
    tau = chain_positions(mask, torch.float64)
    assert tau.shape == mask.shape and (tau[~mask] == 0).all() and ((tau >= 0) & (tau <= 1)).all()
    for r, t in zip(mask, tau):
        real = t[r]
        if len(real) == 1:
            assert real.item() == 0.5
        elif len(real) > 1:
            assert real[0] == 0 and real[-1] == 1 and (real.diff() > 0).all()
            torch.testing.assert_close(
                real.diff(), torch.full((len(real) - 1,), 1 / (len(real) - 1), dtype=torch.float64)
            )


@SETTINGS
@given(tau=st.lists(st.floats(0, 1), min_size=1, max_size=10))
def test_chain_structure_is_a_metric(tau):
    C = chain_structure(torch.tensor(tau, dtype=torch.float64))
    assert (C == C.T).all() and (C.diagonal() == 0).all() and (C >= 0).all()
    # C[t,s] <= C[t,k] + C[k,s]
    assert (C[:, :, None] <= C[:, None, :] + C.T[None, :, :] + 1e-12).all()


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_normalize_features(dtype):
    h = 100 * torch.randn(3, 7, 5, dtype=dtype)
    h[0, 4:] = 0
    u = normalize_features(h)
    assert u.dtype == dtype and torch.isfinite(u).all() and (u[0, 4:] == 0).all()
    torch.testing.assert_close(
        u[h.norm(dim=-1) > 0].norm(dim=-1), torch.ones(int((h.norm(dim=-1) > 0).sum()), dtype=dtype)
    )
    assert normalize_features(h, 'none') is h
    mask = h.norm(dim=-1) > 0
    mn = normalize_features(h, 'mean_norm', mask=mask)
    torch.testing.assert_close(mn[0][mask[0]].norm(dim=-1).mean(), torch.tensor(1.0, dtype=dtype))
    with pytest.raises(ValueError, match='how must be'):
        normalize_features(h, 'l1')


def test_chain_graph_shapes_and_errors():
    pr = planted_stage_rollouts(K=3, seed=0)
    g = chain_graph(pr.hidden, pr.mask)
    T = pr.mask.shape[1]
    assert g['h'].shape == pr.hidden.shape and g['C'].shape == (3, T, T)
    torch.testing.assert_close(g['p'].sum(-1), torch.ones(3, dtype=torch.float64))
    with pytest.raises(ValueError, match='shape mismatch'):
        chain_graph(pr.hidden, pr.mask[:, :-1])
    with pytest.raises(TypeError, match='bool'):
        chain_positions(pr.mask.long())


@SETTINGS
@given(seed=st.integers(0, 10**6), n=st.integers(1, 6), m=st.integers(1, 6))
def test_gw_objective_matches_four_index_sum(seed, n, m):
    g = torch.Generator().manual_seed(seed)
    P = torch.rand(n, m, generator=g, dtype=torch.float64)
    C1, C2 = (
        torch.rand(n, n, generator=g, dtype=torch.float64),
        torch.rand(m, m, generator=g, dtype=torch.float64),
    )
    brute = (
        (C1[:, None, :, None] - C2[None, :, None, :]) ** 2
        * P[:, :, None, None]
        * P[None, None, :, :]
    ).sum()
    torch.testing.assert_close(gw_objective(P, C1, C2), brute, atol=1e-12, rtol=1e-12)


@SETTINGS
@given(seed=st.integers(0, 10**6), n=st.integers(2, 25), m=st.integers(2, 25))
def test_fgw_agrees_with_pot(seed, n, m):
    M, C1, C2, p, q, alpha = instance(seed, n, m)
    plan, lg = fgw(*map(torch.tensor, (M, C1, C2, p, q)), alpha=alpha, log=True)
    ref = ot.gromov.fused_gromov_wasserstein2(M, C1, C2, p, q, alpha=alpha)
    assert abs(lg['fgw_dist'] - float(ref)) < 1e-8
    assert (plan >= 0).all()
    torch.testing.assert_close(plan.sum(1), torch.tensor(p), atol=1e-9, rtol=0)
    torch.testing.assert_close(plan.sum(0), torch.tensor(q), atol=1e-9, rtol=0)
    np.testing.assert_allclose(
        float(fgw_objective(plan, *map(torch.tensor, (M, C1, C2)), alpha)),
        lg['fgw_dist'],
        atol=1e-10,
    )
    # Frank-Wolfe with exact line search never goes up
    assert all(x >= y - 1e-12 for x, y in zip(lg['loss'], lg['loss'][1:]))


def test_fgw_same_start_same_local_optimum_as_pot():
    M, C1, C2, p, q, _ = instance(11, 15, 12)
    G0 = ot.emd(p, q, np.random.default_rng(0).random((15, 12)))  # a random vertex of Pi(p, q)
    for alpha in (0.25, 0.9):
        ours = fgw2(*map(torch.tensor, (M, C1, C2, p, q)), alpha=alpha, G0=torch.tensor(G0))
        assert (
            abs(
                ours
                - float(ot.gromov.fused_gromov_wasserstein2(M, C1, C2, p, q, alpha=alpha, G0=G0))
            )
            < 1e-8
        )


def test_limits_alpha_0_and_1():
    M, C1, C2, p, q, _ = instance(3, 14, 9)
    args = list(map(torch.tensor, (M, C1, C2, p, q)))
    assert abs(fgw2(*args, alpha=0.0) - ot.emd2(p, q, M)) < 1e-12
    assert abs(fgw2(*args, alpha=1.0) - float(ot.gromov.gromov_wasserstein2(C1, C2, p, q))) < 1e-8


def test_nonconvexity_two_starts_two_optima():
    pr = planted_stage_rollouts(K=2, seed=1, p_skip=0.2, p_repeat=0.2)
    M, C1, C2 = rollout_pair(pr.hidden, pr.mask, 0, 1)
    tau0, tau1 = (
        torch.linspace(0, 1, M.shape[0], dtype=torch.float64),
        torch.linspace(0, 1, M.shape[1], dtype=torch.float64),
    )
    G_rev = torch.tensor(
        ot.emd(
            ot.unif(M.shape[0]),
            ot.unif(M.shape[1]),
            ((tau0[:, None] - (1 - tau1[None])) ** 2).numpy(),
        )
    )
    assert fgw2(M, C1, C2, alpha=0.9, G0=G_rev) > fgw2(M, C1, C2, alpha=0.9) + 1e-2


@SETTINGS
@given(seed=st.integers(0, 10**6))
def test_line_search_is_exact(seed):
    M, C1, C2, p, q, alpha = instance(seed, 6, 5)
    M, C1, C2 = map(torch.tensor, (M, C1, C2))
    G = torch.tensor(np.outer(p, q))
    D = torch.tensor(ot.emd(p, q, np.random.default_rng(seed).random((6, 5)))) - G
    gamma, change = fgw_line_search(G, D, M, C1, C2, alpha)
    f = lambda g: float(fgw_objective(G + g * D, M, C1, C2, alpha))
    assert abs(f(gamma) - f(0.0) - change) < 1e-12
    assert all(f(gamma) <= f(g) + 1e-12 for g in np.linspace(0, 1, 21))


def test_gw_gradient_matches_autograd():
    M, C1, C2, p, q, _ = instance(5, 5, 4)
    C1, C2 = torch.tensor(C1), torch.tensor(C2)
    P = torch.tensor(np.outer(p, q), requires_grad=True)
    gw_objective(P, C1, C2).backward()
    # autograd also differentiates the marginals; on Pi(p, q) the two gradients differ by row/column
    # constants only
    diff = P.grad - gw_gradient(P.detach(), C1, C2, torch.tensor(p), torch.tensor(q))
    torch.testing.assert_close(
        diff - diff.mean(1, keepdim=True) - diff.mean(0, keepdim=True) + diff.mean(),
        torch.zeros_like(diff),
        atol=1e-12,
        rtol=0,
    )


def test_float32_inputs():
    pr = planted_stage_rollouts(K=2, seed=0, dtype=torch.float32)
    M, C1, C2 = rollout_pair(pr.hidden, pr.mask, 0, 1)
    plan = fgw(M, C1, C2)
    assert plan.dtype == torch.float32 and torch.isfinite(plan).all()
    M64, C164, C264 = M.double(), C1.double(), C2.double()
    assert (
        abs(float(fgw_objective(plan.double(), M64, C164, C264, 0.25)) - fgw2(M64, C164, C264))
        < 1e-4
    )


@pytest.mark.parametrize(
    'mutate, msg',
    [
        (lambda M, C1, C2: (M, C1, C2 + torch.triu(torch.ones_like(C2), 1)), 'symmetric'),
        (lambda M, C1, C2: (M[:, :-1], C1, C2), 'shape mismatch'),
        (lambda M, C1, C2: (M, C1 * float('nan'), C2), 'nan'),
        (lambda M, C1, C2: (M[None], C1, C2), 'one pair'),
        (lambda M, C1, C2: (M, C1.float(), C2), 'dtype mismatch'),
    ],
)
def test_bad_input(mutate, msg):
    "`fgw` takes a well-posed problem; its checked twin refuses a bad one with a message."
    M, C1, C2, *_ = instance(0, 4, 3)
    with pytest.raises((ValueError, TypeError), match=msg):
        checked_fgw(*mutate(*map(torch.tensor, (M, C1, C2))))


def test_bad_alpha_and_weights():
    M, C1, C2, p, q, _ = instance(0, 4, 3)
    args = list(map(torch.tensor, (M, C1, C2)))
    with pytest.raises(ValueError, match='alpha'):
        checked_fgw(*args, alpha=-0.1)
    with pytest.raises(ValueError, match='normalised'):
        checked_fgw(*args, p=torch.tensor(2 * p), q=torch.tensor(q))
