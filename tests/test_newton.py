"""Property tests, cross-checks (reference, `sinkhorn_log`, POT) and failure cases for
`hara_ref.engine.newton` (semi-dual Newton)."""

import math
import warnings
import numpy as np
import ot
import pytest
import torch
from hypothesis import given, settings, strategies as st, HealthCheck
from hara_ref.ot.entropic import semidual_reference
from hara_ref.engine.newton import (
    semidual_newton,
    semidual_point,
    semidual_plan,
    semidual_hessian,
    newton_direction,
)
from hara_ref.engine.sinkhorn import sinkhorn_log, SinkhornConvergenceWarning
from hara_ref.rlvr.data import planted_stage_rollouts

# the same random problems; one torch thread (autouse fixture)
from test_sinkhorn import problem, ragged_problem

pytestmark = pytest.mark.usefixtures('one_thread')  # tests/conftest.py

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def planted(K=3, L=96, m=16, seed=0):
    """Block-structured costs: unit-norm planted rollouts to m of their own tokens, plus a small
    position term."""
    h = torch.nn.functional.normalize(
        planted_stage_rollouts(K=K, n_stages=6, d=16, stage_len=(L // 8, L // 5), seed=seed).hidden[
            :, :L
        ],
        dim=-1,
    )
    tau, tb = (
        torch.linspace(0, 1, h.shape[1], dtype=h.dtype),
        torch.linspace(0, 1, m, dtype=h.dtype),
    )
    M = (
        torch.cdist(h, h[0, :: h.shape[1] // m][:m].expand(K, -1, -1)) ** 2
        + 0.5 * (tau[:, None] - tb[None]) ** 2
    )
    return (
        torch.full((K, h.shape[1]), 1 / h.shape[1], dtype=h.dtype),
        torch.full((m,), 1 / m, dtype=h.dtype),
        M,
    )


@SETTINGS
@given(
    seed=st.integers(0, 10**6),
    B=st.integers(1, 3),
    n=st.integers(1, 20),
    m=st.integers(1, 12),
    reg=st.sampled_from([0.05, 0.1, 0.5]),
)
def test_equals_pot_and_sinkhorn(seed, B, n, m, reg):
    a, b, M = problem(seed, B, n, m)
    plan, lg = semidual_newton(a, b, M, reg, stop_thr=1e-11, log=True)
    assert lg['converged'].all() and lg['n_iter'] <= 40
    torch.testing.assert_close(plan.sum(-1), a, atol=1e-15, rtol=0)  # rows exact by construction
    assert ((plan.sum(-2) - b).norm(dim=-1) < 1e-11).all()
    torch.testing.assert_close(
        plan, sinkhorn_log(a, b, M, reg, stop_thr=1e-12, num_iter_max=100000), atol=1e-10, rtol=0
    )
    for i in range(B):
        ref = ot.sinkhorn(
            a[i].numpy(),
            b[i].numpy(),
            M[i].numpy(),
            reg,
            method='sinkhorn_log',
            numItermax=100000,
            stopThr=1e-12,
        )
        np.testing.assert_allclose(plan[i].numpy(), ref, atol=1e-10, rtol=0)


@SETTINGS
@given(
    seed=st.integers(0, 10**6),
    n=st.integers(1, 30),
    m=st.integers(2, 16),
    reg=st.sampled_from([0.02, 0.05, 0.2]),
)
def test_batched_equals_reference(seed, n, m, reg):
    a, b, M = problem(seed, 1, n, m)
    P, lg = semidual_reference(a[0], b[0], M[0], reg, tol=1e-12, warn=False, log=True)
    assert lg['converged'], lg
    # both stop at a marginal error of 1e-12; their plans differ by that error times the
    # conditioning of the semi-dual
    # Hessian, which reached 1.0e-9 on a 25 x 4 problem at reg 0.05: 1e-8 leaves that factor 10
    torch.testing.assert_close(
        semidual_newton(a, b, M, reg, stop_thr=1e-12)[0], P, atol=1e-8, rtol=0
    )


def test_both_meet_a_tight_threshold_on_an_ill_conditioned_problem():
    """A node weight of 0.004 (H nearly singular): the reference (Armijo with J's rounding allowed
    for) and the batched solver (Sinkhorn fallback) both meet 1e-12, on POT's plan."""
    a, b, M = problem(353, 1, 3, 9)  # (1, 3), (1, 9), (1, 3, 9)
    P_ref, ref = semidual_reference(a[0], b[0], M[0], 0.05, tol=1e-12, warn=False, log=True)
    assert ref['converged'] and ref['err'] < 1e-12, ref
    plan, lg = semidual_newton(a, b, M, 0.05, stop_thr=1e-12, log=True)
    assert lg['converged'].all() and lg['err'].max() < 1e-12
    pot = ot.sinkhorn(
        a[0].numpy(),
        b[0].numpy(),
        M[0].numpy(),
        0.05,
        method='sinkhorn_log',
        numItermax=200000,
        stopThr=1e-14,
    )
    np.testing.assert_allclose(plan[0].numpy(), pot, atol=1e-12, rtol=0)
    np.testing.assert_allclose(P_ref.numpy(), pot, atol=1e-12, rtol=0)


def test_planted_where_sinkhorn_crawls():
    """Block-structured costs: Newton converges in a few dozen steps; Sinkhorn (its fastest setting)
    is slower by orders of magnitude."""
    a, b, M = planted()
    plan, lg = semidual_newton(a, b, M, 0.05, stop_thr=1e-10, log=True)
    assert lg['converged'].all() and lg['n_iter'] <= 40, lg['n_iter_item']
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        sk, ls = sinkhorn_log(a, b, M, 0.05, stop_thr=1e-10, num_iter_max=4000, omega=1.9, log=True)
    assert ls['n_iter'] > 50 * lg['n_iter']
    for i in range(len(a)):
        torch.testing.assert_close(
            plan[i], semidual_reference(a[i], b, M[i], 0.05, tol=1e-11)[0], atol=1e-9, rtol=0
        )


@SETTINGS
@given(
    seed=st.integers(0, 10**6),
    lens=st.lists(st.integers(1, 15), min_size=1, max_size=4),
    mlens=st.lists(st.integers(1, 8), min_size=4, max_size=4),
)
def test_padding_changes_nothing_not_even_the_steps(seed, lens, mlens):
    """Padding rows and columns: the same plan, exact zeros, and the same number of Newton steps as
    the unpadded problem."""
    a, b, M = ragged_problem(seed, lens, mlens)
    plan, lg = semidual_newton(a, b, M, 0.05, stop_thr=1e-11, log=True)
    for i, (L, Lm) in enumerate(zip(lens, mlens)):
        single, l1 = semidual_newton(
            a[i, :L], b[i, :Lm], M[i, :L, :Lm], 0.05, stop_thr=1e-11, log=True
        )
        torch.testing.assert_close(plan[i, :L, :Lm], single, atol=1e-13, rtol=0)
        assert (plan[i, L:] == 0).all() and (plan[i, :, Lm:] == 0).all()
        assert int(lg['n_iter_item'][i]) == l1['n_iter'], (lg['n_iter_item'], l1['n_iter'])


def test_chunks_change_nothing():
    """40 ragged problems (and an absent one) solved one at a time, 16 at a time and all at once:
    the same plans, log and steps. With m = 8, every (n, 8) float64 matrix starts on a 64-byte
    boundary wherever it sits in a chunk, so the BLAS rounds it alike: equal bit for bit. With m = 7
    the BLAS may round a product by its alignment (as it does when the batch is reordered): equal to
    rounding, with the same steps."""
    rng = np.random.default_rng(0)
    lens = rng.integers(1, 31, 40).tolist()
    for m_max, exact in ((8, True), (7, False)):
        a, b, M = ragged_problem(1, lens, [m_max] + rng.integers(1, m_max + 1, 39).tolist())
        a[5] = 0  # an absent item
        out = {
            chunk: semidual_newton(a, b, M, 0.05, stop_thr=1e-11, log=True, chunk=chunk)
            for chunk in (1, 16, 40)
        }
        plan, lg = out[40]
        assert lg['converged'].all() and len(set(lg['n_iter_item'].tolist())) > 1
        for chunk in (1, 16):
            plan_c, lg_c = out[chunk]
            assert torch.equal(lg_c['n_iter_item'], lg['n_iter_item'])
            if exact:
                assert torch.equal(plan_c, plan)
                for k in ('err', 'log_u', 'log_v', 'converged', 'stop_thr'):
                    assert torch.equal(lg_c[k].nan_to_num(), lg[k].nan_to_num()), k
            else:
                torch.testing.assert_close(plan_c, plan, atol=1e-13, rtol=0)


@pytest.mark.parametrize('seed', range(4))
def test_plan_and_hessian_equal_the_single_pass(seed):
    """`semidual_plan` then `semidual_hessian` give the single-pass evaluation's T, log u, c, J and
    H bit for bit (a padding row and a padding column included)."""
    g = torch.Generator().manual_seed(seed)
    P, n, m = 3, 11 + seed, 5 + 3 * seed
    a, b, M = problem(seed, P, n, m)
    a[0, -1], b[1, -1] = 0.0, 0.0  # padding (the weights no longer sum to 1; not needed here)
    log_v = torch.randn(P, m, generator=g, dtype=torch.float64).masked_fill(b == 0, -math.inf)
    logK = -M / 0.1
    # the single pass: every quantity, H included, from one evaluation
    E = logK + log_v.unsqueeze(-2)
    mx = E.amax(-1, keepdim=True)
    E = E.sub_(mx).exp_()
    s = E.sum(-1, keepdim=True)
    T = E * (a.unsqueeze(-1) / s)
    lse = (mx + s.log()).squeeze(-1).masked_fill_(a == 0, 0.0)
    c = T.sum(-2)
    J = (b * log_v.masked_fill(b == 0, 0.0)).sum(-1) - (a * lse).sum(-1)
    H = torch.diag_embed(c) - (T.transpose(-1, -2) / s.transpose(-1, -2)) @ E
    single = (T, a.log() - lse, c, J, H)
    T2, log_u2, c2, J2, E2, s2 = semidual_plan(logK, a, b, log_v)
    split = (T2, log_u2, c2, J2, semidual_hessian(T2, c2, E2, s2))
    for x, y in zip(single, split):
        assert torch.equal(x, y)
    for x, y in zip(single, semidual_point(logK, a, b, log_v)):
        assert torch.equal(x, y)


def test_absent_item_and_empty_batch():
    a, b, M = problem(0, 3, 5, 4)
    a[1] = 0
    plan, lg = semidual_newton(a, b, M, 0.1, log=True)
    assert (plan[1] == 0).all() and lg['converged'].all()
    torch.testing.assert_close(plan[0], semidual_newton(a[0], b[0], M[0], 0.1), atol=1e-14, rtol=0)
    assert semidual_newton(a[:0], b[:0], M[:0], 0.1).shape == (0, 5, 4)


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision_inputs(dtype):
    """Solved in float64, returned in the input dtype, stopped at that dtype's floor; equal to the
    float64 solve of the same (rounded) problem."""
    a, b, M = planted()
    a, b, M = a.to(dtype), b.to(dtype), M.to(dtype)
    P, lg = semidual_newton(a, b, M, 0.05, log=True)
    assert (
        P.dtype == dtype
        and lg['converged'].all()
        and lg['log_v'].dtype == (dtype if dtype == torch.float32 else torch.float32)
    )
    assert float(lg['stop_thr'].min()) > 1e-9  # the dtype's rounding floor, not 1e-9
    # the renormalised weights it solved with
    a64, b64 = a.double() / a.double().sum(-1, keepdim=True), b.double() / b.double().sum()
    P64 = semidual_newton(a64, b64, M.double(), 0.05, stop_thr=1e-12)
    # rounding of the result, plus what stopping at the dtype's floor leaves (a marginal error below
    # stop_thr)
    assert float((P.double() - P64).abs().max()) <= 4 * torch.finfo(dtype).eps * float(
        P64.max()
    ) + float(lg['stop_thr'].max())


def test_warm_start_and_per_item_thresholds():
    a, b, M = problem(1, 4, 12, 6)
    P, lg = semidual_newton(a, b, M, 0.05, stop_thr=1e-12, log=True)
    P2, l2 = semidual_newton(a, b, M, 0.05, stop_thr=1e-12, log=True, log_v0=lg['log_v'])
    assert l2['n_iter'] == 0 and torch.equal(P, P2)
    thr = torch.tensor([1e-2, 1e-4, 1e-8, 1e-12], dtype=torch.float64)
    _, l3 = semidual_newton(a, b, M, 0.05, stop_thr=thr, log=True)
    assert (l3['err'] < thr).all()
    for i in range(4):
        _, l1 = semidual_newton(a[i], b[i], M[i], 0.05, stop_thr=float(thr[i]), log=True)
        assert l1['n_iter'] == int(l3['n_iter_item'][i])


def test_cap_is_reported():
    a, b, M = planted()
    with pytest.warns(SinkhornConvergenceWarning, match='did not converge in 1 steps'):
        _, lg = semidual_newton(a, b, M, 0.05, num_iter_max=1, log=True)
    assert not lg['converged'].all()


def test_gradient_and_hessian_are_derivatives():
    a, b, M = problem(3, 1, 9, 5)
    ell = torch.randn(1, 5, dtype=torch.float64)
    J = lambda l: (b[0] * l).sum() - (a[0] * torch.logsumexp(-M[0] / 0.2 + l, 1)).sum()
    T, log_u, c, Jv, H = semidual_point(-M / 0.2, a, b, ell)
    torch.testing.assert_close(
        torch.autograd.functional.jacobian(J, ell[0]), (b - c)[0], atol=1e-12, rtol=0
    )
    torch.testing.assert_close(
        torch.autograd.functional.hessian(J, ell[0]), -H[0], atol=1e-12, rtol=0
    )
    d, g = newton_direction(H, c, b)
    # the step solves H d = b - c (b - c is orthogonal to 1; up to the 1e-12 ridge)
    torch.testing.assert_close(H[0] @ d[0], g[0], atol=1e-10, rtol=0)


@pytest.mark.parametrize(
    'kw,msg',
    [
        (dict(num_iter_max=0), 'num_iter_max'),
        (dict(num_iter_max=2.5), 'num_iter_max'),
        (dict(reg=0.0), 'reg'),
        (dict(reg=float('nan')), 'reg'),
        (dict(log_v0=torch.full((4,), math.nan)), 'log_v0'),
        (dict(stop_thr=-1.0), 'stop_thr'),
        (dict(chunk=0), 'chunk'),
    ],
)
def test_bad_input(kw, msg):
    a, b, M = problem(0, 2, 5, 4)
    reg = kw.pop('reg', 0.1)
    with pytest.raises(ValueError, match=msg):
        semidual_newton(a, b, M, reg, **kw)


def test_bad_marginals_and_costs():
    a, b, M = problem(0, 2, 5, 4)
    with pytest.raises(ValueError, match='normalised'):
        semidual_newton(2 * a, b, M, 0.1)
    M2 = M.clone()
    M2[0, 0, 0] = math.inf
    with pytest.raises(ValueError, match='nan or inf'):
        semidual_newton(a, b, M2, 0.1)
    with pytest.raises(ValueError, match='empty problem'):
        semidual_newton(a[:, :0], b, M[:, :0], 0.1)
