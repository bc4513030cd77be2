"""The exact FGW barycenter: POT cross-checks, block updates, stopping
(`hara_ref.ot.fgw_barycenter`)."""

import numpy as np
import ot
import pytest
import torch
from hypothesis import given, settings, strategies as st, HealthCheck
from hara_ref.ot.fgw import chain_structure
from hara_ref.ot.fgw_barycenter import (
    update_features,
    update_structure,
    sq_dists,
    fgw_barycenter,
    monotone_coupling,
    rollout_barycenter,
)
from hara_ref.rlvr.data import planted_stage_rollouts
from hara_ref.engine.barycenter_checks import checked_fgw_barycenter


pytestmark = pytest.mark.usefixtures('one_thread')  # tests/conftest.py


def graphs(seed, K=4, N=6):
    rng = np.random.default_rng(seed)
    Ys = [rng.normal(size=(n, 3)) for n in rng.integers(4, 10, size=K)]
    Cs = [ot.dist(x, x, metric='euclidean') for x in [rng.normal(size=(len(Y), 2)) for Y in Ys]]
    xa = rng.normal(size=(N, 2))
    return Ys, Cs, ot.dist(xa, xa)


t = lambda x: torch.tensor(x)


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_free_barycenter_matches_pot(seed):
    Ys, Cs, C0 = graphs(seed)
    X, C, _ = ot.gromov.fgw_barycenters(6, Ys, Cs, alpha=0.5, init_C=C0, log=True, tol=1e-9)
    Z, Cb = fgw_barycenter(
        [t(y) for y in Ys], [t(c) for c in Cs], L_b=6, alpha=0.5, init_C=t(C0), warmstart=False
    )
    np.testing.assert_allclose(Z.numpy(), X, atol=1e-8)
    np.testing.assert_allclose(Cb.numpy(), C, atol=1e-8)


@pytest.mark.parametrize('fixed', ['structure', 'features'])
def test_fixed_block_pot_stops_after_one_iteration_ours_continues(fixed):
    Ys, Cs, C0 = graphs(5)
    X0 = np.random.default_rng(1).normal(size=(6, 3))
    kw_pot = (
        dict(fixed_structure=True, init_C=C0)
        if fixed == 'structure'
        else dict(fixed_features=True, init_X=X0, init_C=C0)
    )
    X1, C1, log1 = ot.gromov.fgw_barycenters(6, Ys, Cs, alpha=0.5, log=True, tol=1e-9, **kw_pot)
    assert len(log1['err_feature']) == 1  # POT 0.9.7's early stop
    kw = (
        dict(fixed_structure=True, init_C=t(C0))
        if fixed == 'structure'
        else dict(fixed_features=True, init_Z=t(X0), init_C=t(C0))
    )
    Z1, Cb1, lg1 = fgw_barycenter(
        [t(y) for y in Ys],
        [t(c) for c in Cs],
        L_b=6,
        alpha=0.5,
        warmstart=False,
        max_iter=1,
        log=True,
        warn=False,
        **kw,
    )
    np.testing.assert_allclose(Z1.numpy(), X1, atol=1e-8)
    np.testing.assert_allclose(Cb1.numpy(), C1, atol=1e-8)
    Zn, Cbn, lgn = fgw_barycenter(
        [t(y) for y in Ys], [t(c) for c in Cs], L_b=6, alpha=0.5, log=True, **kw
    )
    assert lgn['n_iter'] > 1 and lgn['loss'][-1] < lg1['loss'][-1] - 1e-6 and lgn['err'][-1] <= 1e-9


def test_warm_started_objective_is_monotone():
    Ys, Cs, C0 = graphs(3, K=5)
    _, _, lg = fgw_barycenter(
        [t(y) for y in Ys], [t(c) for c in Cs], L_b=5, alpha=0.3, init_C=t(C0[:5, :5]), log=True
    )
    assert all(x >= y - 1e-10 for x, y in zip(lg['loss'], lg['loss'][1:]))


def test_block_updates_are_minimisers():
    "For fixed plans, the closed-form Z and C-bar have zero gradient of the barycenter objective."
    Ys, Cs, _ = graphs(4, K=3, N=5)
    b = torch.full((5,), 0.2, dtype=torch.float64)
    plans = [
        t(ot.emd(ot.unif(len(y)), b.numpy(), np.random.default_rng(i).random((len(y), 5))))
        for i, y in enumerate(Ys)
    ]
    hs, Cs_ = [t(y) for y in Ys], [t(c) for c in Cs]
    Z = update_features(plans, hs, [1 / 3] * 3, b).requires_grad_()
    Cb = update_structure(plans, Cs_, [1 / 3] * 3, b).requires_grad_()
    from hara_ref.ot.fgw import fgw_objective

    obj = sum(fgw_objective(P, sq_dists(h, Z), C, Cb, 0.4) for P, h, C in zip(plans, hs, Cs_)) / 3
    obj.backward()
    assert Z.grad.abs().max() < 1e-12 and Cb.grad.abs().max() < 1e-12


def test_copies_give_the_graph_back():
    g = torch.Generator().manual_seed(0)
    H = torch.randn(5, 3, generator=g, dtype=torch.float64)
    C = chain_structure(torch.linspace(0, 1, 5, dtype=torch.float64))
    Z, Cb = fgw_barycenter([H] * 3, [C] * 3, L_b=5, init_Z=H + 0.01)
    torch.testing.assert_close(Z, H, atol=1e-8, rtol=0)
    torch.testing.assert_close(Cb, C, atol=1e-8, rtol=0)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 40), m=st.integers(1, 40), seed=st.integers(0, 1000))
def test_monotone_coupling_marginals_and_order(n, m, seed):
    rng = np.random.default_rng(seed)
    p, b = t(rng.dirichlet(np.ones(n))), t(rng.dirichlet(np.ones(m)))
    P = monotone_coupling(p, b)
    assert (P >= 0).all()
    torch.testing.assert_close(P.sum(1), p, atol=1e-12, rtol=0)
    torch.testing.assert_close(P.sum(0), b, atol=1e-12, rtol=0)
    rows, cols = torch.nonzero(P > 1e-15, as_tuple=True)
    assert (cols.diff() >= 0).all()  # support is a monotone staircase
    # optimal for the 1-D convex cost (tau - tau_bar)^2
    tau, tb = (
        np.linspace(0, 1, n) if n > 1 else np.array([0.5]),
        np.linspace(0, 1, m) if m > 1 else np.array([0.5]),
    )
    assert (
        float((P * t((tau[:, None] - tb[None]) ** 2)).sum())
        <= ot.emd2(p.numpy(), b.numpy(), (tau[:, None] - tb[None]) ** 2) + 1e-10
    )


def test_bad_input():
    Ys, Cs, C0 = graphs(0)
    with pytest.raises(ValueError, match='as many structures'):
        fgw_barycenter([t(y) for y in Ys], [t(c) for c in Cs[:-1]], L_b=4)
    with pytest.raises(ValueError, match='needs init_Z'):
        fgw_barycenter([t(y) for y in Ys], [t(c) for c in Cs], L_b=4, fixed_features=True)
    pr = planted_stage_rollouts(K=2, seed=0)
    with pytest.raises(ValueError, match='structure must be'):
        rollout_barycenter(pr.hidden, pr.mask, structure='tree')


def test_float32_rollouts():
    pr = planted_stage_rollouts(K=4, seed=0, dtype=torch.float32)
    Z, Cb, lg = rollout_barycenter(pr.hidden, pr.mask, L_b=8, max_iter=5)
    assert Z.dtype == torch.float32 and torch.isfinite(Z).all() and torch.isfinite(Cb).all()
    assert all(torch.isfinite(P).all() and (P >= 0).all() for P in lg['plans'])


# --- bad input: each used to crash with an unrelated message (IndexError, a shape error deep in
# fgw) or give a wrong Z


def small_group(seed=0, K=3, d=3):
    g = torch.Generator().manual_seed(seed)
    hs = [torch.randn(n, d, generator=g, dtype=torch.float64) for n in (5, 7, 6)[:K]]
    Cs = [chain_structure(torch.linspace(0, 1, len(h), dtype=torch.float64)) for h in hs]
    return hs, Cs


@pytest.mark.parametrize(
    'bad, msg',
    [
        (lambda hs, Cs: dict(hs=[], Cs=[]), 'no rollouts'),
        (lambda hs, Cs: dict(hs=hs[:2] + [hs[2][:, :2]], Cs=Cs), 'feature size'),
        (lambda hs, Cs: dict(hs=hs, Cs=Cs[:2] + [Cs[1]]), 'Cs[2] has shape'),
        (
            lambda hs, Cs: dict(hs=hs[:2] + [hs[2][:0]], Cs=Cs[:2] + [Cs[2][:0, :0]]),
            'hs[2] is empty',
        ),
        (lambda hs, Cs: dict(hs=hs[:2] + [hs[2].float()], Cs=Cs), 'dtype mismatch'),
        (
            lambda hs, Cs: dict(hs=hs, Cs=Cs, lambdas=[0.5, 0.6, -0.1]),
            'lambdas must be non-negative',
        ),
        (
            lambda hs, Cs: dict(hs=hs, Cs=Cs, lambdas=[0.5, float('nan'), 0.5]),
            'lambdas must be finite',
        ),
        (lambda hs, Cs: dict(hs=hs, Cs=Cs, lambdas=[0.0, 0.0, 0.0]), 'lambdas sum to 0'),
        (lambda hs, Cs: dict(hs=hs, Cs=Cs, lambdas=[0.5, 0.5]), 'lambdas has 2 entries'),
        (lambda hs, Cs: dict(hs=hs, Cs=Cs, L_b=0), 'L_b must be'),
        (
            lambda hs, Cs: dict(
                hs=hs, Cs=Cs, L_b=4, b=torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64)
            ),
            'b must be positive',
        ),
        (lambda hs, Cs: dict(hs=hs, Cs=Cs, ps=[None] * 2), 'ps has 2 entries'),
    ],
)
def test_bad_barycenter_input(bad, msg):
    hs, Cs = small_group()
    kw = {'L_b': 4, **bad(hs, Cs)}
    with pytest.raises((ValueError, TypeError), match=msg.replace('[', r'\[').replace(']', r'\]')):
        checked_fgw_barycenter(**kw)


def test_lambdas_are_normalised():
    """Weights that do not sum to 1 are divided by their sum: the minimiser of sum_i lambda_i FGW_i
    does not change under scaling."""
    hs, Cs = small_group()
    lam = [0.2, 0.3, 0.5]
    Z1, C1, lg1 = fgw_barycenter(hs, Cs, L_b=4, lambdas=lam, log=True)
    Z2, C2, lg2 = fgw_barycenter(hs, Cs, L_b=4, lambdas=[4 * x for x in lam], log=True)
    torch.testing.assert_close(Z2, Z1, atol=1e-12, rtol=0)
    torch.testing.assert_close(C2, C1, atol=1e-12, rtol=0)
    assert lg2['loss'] == pytest.approx(lg1['loss'], abs=1e-12)
    Z3 = fgw_barycenter(hs, Cs, L_b=4, lambdas=np.array([1.0, 1.0, 1.0]))[0]
    torch.testing.assert_close(Z3, fgw_barycenter(hs, Cs, L_b=4)[0], atol=1e-12, rtol=0)


def test_numpy_inputs():
    hs, Cs = small_group()
    Z, C = checked_fgw_barycenter(
        [h.numpy() for h in hs],
        [c.numpy() for c in Cs],
        L_b=4,
        b=np.full(4, 0.25),
        init_Z=np.zeros((4, 3)),
    )
    Zt, Ct = fgw_barycenter(hs, Cs, L_b=4)
    assert isinstance(Z, torch.Tensor)
    torch.testing.assert_close(Z, Zt, atol=0, rtol=0)
    torch.testing.assert_close(C, Ct, atol=0, rtol=0)
    pr = planted_stage_rollouts(K=3, seed=1)
    Zn = rollout_barycenter(pr.hidden.numpy(), pr.mask.numpy(), L_b=6, max_iter=3, warn=False)[0]
    torch.testing.assert_close(
        Zn, rollout_barycenter(pr.hidden, pr.mask, L_b=6, max_iter=3, warn=False)[0], atol=0, rtol=0
    )


def test_cap_reported_in_log_and_warning():
    pr = planted_stage_rollouts(K=4, seed=0)
    with pytest.warns(UserWarning, match='fgw_barycenter: stopped after 2 outer iterations'):
        _, _, lg = rollout_barycenter(pr.hidden, pr.mask, L_b=8, max_iter=2)
    assert lg['n_iter'] == 2 and not lg['converged'] and lg['err'][-1] > 1e-9
    _, _, lg = rollout_barycenter(pr.hidden, pr.mask, L_b=8, max_iter=2, warn=False)
    assert not lg['converged']
    Z, C, lg = fgw_barycenter(*small_group(), L_b=4, log=True)
    assert lg['converged'] and lg['n_iter'] < 100
