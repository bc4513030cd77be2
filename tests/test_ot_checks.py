"""The OT input checks and their checked twins (chapter 36_ot_checks, module
`hara_ref.engine.ot_checks`): equal to the lessons' functions on valid input, and every refusal
reachable from the engine, word for word."""

import warnings
import numpy as np
import pytest
import torch

from hara_ref.ot.entropic import sinkhorn_reference, semidual_reference
from hara_ref.ot.fgw import fgw, fgw2, chain_structure, normalize_features, rollout_pair
from hara_ref.engine.ot_checks import (
    checked_sinkhorn_reference,
    checked_semidual_reference,
    checked_fgw,
    checked_normalize_features,
    feature_norms,
)
from hara_ref.engine.sinkhorn import sinkhorn_log
from hara_ref.engine.newton import semidual_newton
from hara_ref.rlvr.data import planted_stage_rollouts

pytestmark = pytest.mark.usefixtures('one_thread')  # tests/conftest.py


def problem(seed, n=7, m=5, dtype=torch.float64):
    "A random entropic OT problem: weights of sum 1 (one zero source weight) and a cost of order 1."
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(n, generator=g, dtype=dtype)
    a[0] = 0.0
    b = torch.rand(m, generator=g, dtype=dtype) + 0.1
    M = torch.rand(n, m, generator=g, dtype=dtype)
    return a / a.sum(), b / b.sum(), M


@pytest.mark.parametrize('seed', [0, 1, 2])
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_checked_reference_solvers_equal_the_lessons(seed, dtype):
    a, b, M = problem(seed, dtype=dtype)
    for checked, lesson in (
        (checked_sinkhorn_reference, sinkhorn_reference),
        (checked_semidual_reference, semidual_reference),
    ):
        P, lg = checked(a, b, M, 0.1, log=True)
        P_ref, lg_ref = lesson(a, b, M, 0.1, log=True)
        assert torch.equal(P, P_ref) and lg == lg_ref


def test_checked_reference_solvers_convert_numpy():
    a, b, M = problem(3)
    P = checked_sinkhorn_reference(a.numpy(), b.numpy(), M.numpy(), np.float64(0.1))[0]
    assert torch.equal(P, sinkhorn_reference(a, b, M, 0.1)[0])
    P = checked_semidual_reference(a.numpy(), b.numpy(), M.numpy(), 0.1)[0]
    assert torch.equal(P, semidual_reference(a, b, M, 0.1)[0])


def test_checked_reference_solvers_warn_as_the_lessons():
    a, b, M = problem(4)
    with pytest.warns(UserWarning, match='sinkhorn_reference: stopped at num_iter_max=1'):
        checked_sinkhorn_reference(a, b, M, 0.01, num_iter_max=1)
    with pytest.warns(UserWarning, match='semidual_reference: stopped at max_iter=1'):
        checked_semidual_reference(a, b, M, 0.01, max_iter=1)


@pytest.mark.parametrize(
    'change, msg',
    [
        (dict(b=lambda b: 2 * b), r'b sums in \[2, 2\]'),
        (dict(M=lambda M: M[:, :-1]), 'shape mismatch'),
        (dict(M=lambda M: M * float('nan')), 'M contains nan or inf'),
        (dict(a=lambda a: a.float()), 'dtype mismatch'),
        (dict(a=lambda a: a[:0], M=lambda M: M[:0]), 'empty problem'),
        (dict(reg=lambda r: 0.0), 'reg must be a finite float > 0, got 0.0'),
        (dict(reg=lambda r: True), 'reg must be a real number'),
    ],
)
def test_the_engine_and_the_checked_twins_give_the_same_errors(change, msg):
    "Every refusal of a reference solver is reachable from its twin and from the batched solvers."
    x = dict(zip('abM', problem(5)), reg=0.1)
    x.update({k: f(x[k]) for k, f in change.items()})
    args = (x['a'], x['b'], x['M'], x['reg'])
    for solve in (
        checked_sinkhorn_reference,
        checked_semidual_reference,
        sinkhorn_log,
        semidual_newton,
    ):
        with pytest.raises((ValueError, TypeError), match=msg):
            solve(*args)


def test_caps_are_checked_under_each_solvers_name():
    a, b, M = problem(6)
    with pytest.raises(ValueError, match='num_iter_max must be an integer >= 1, got 0'):
        checked_sinkhorn_reference(a, b, M, 0.1, num_iter_max=0)
    with pytest.raises(ValueError, match='max_iter must be an integer >= 1, got 0'):
        checked_semidual_reference(a, b, M, 0.1, max_iter=0)
    with pytest.raises(ValueError, match='max_iter must be an integer >= 1, got 0'):
        checked_fgw(M, chain_structure(torch.rand(7).double()), chain_structure(b), max_iter=0)


@pytest.mark.parametrize('alpha', [0.0, 0.25, 0.9])
def test_checked_fgw_equals_fgw(alpha):
    pr = planted_stage_rollouts(K=2, seed=1, p_skip=0.2, p_repeat=0.2)
    M, C1, C2 = rollout_pair(pr.hidden, pr.mask, 0, 1)
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # neither warns at the default cap
        P, lg = checked_fgw(M, C1, C2, alpha=alpha, log=True)
        P_ref, lg_ref = fgw(M, C1, C2, alpha=alpha, log=True)
    assert torch.equal(P, P_ref) and lg == lg_ref
    n, m = M.shape
    p = torch.full((n,), 1 / n, dtype=M.dtype)  # (n,) given weights: the same as the defaults
    q = torch.rand(m, dtype=M.dtype) + 0.5
    q = q / q.sum()  # (m,)
    G0 = p[:, None] * q[None, :]  # (n, m) a given start
    P = checked_fgw(M, C1, C2, p, q, alpha, G0, max_iter=50)
    assert torch.equal(P, fgw(M, C1, C2, p, q, alpha, G0, max_iter=50))
    assert fgw2(M, C1, C2, p, q, alpha) == fgw2(M, C1, C2, p, q, alpha, G0=G0)


def test_checked_fgw_refuses_a_start_outside_the_polytope():
    pr = planted_stage_rollouts(K=2, seed=1)
    M, C1, C2 = rollout_pair(pr.hidden, pr.mask, 0, 1)
    with pytest.raises(ValueError, match=r'G0 must be a plan in Pi\(p, q\) of shape'):
        checked_fgw(M, C1, C2, G0=torch.ones_like(M))


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
@pytest.mark.parametrize('how', ['unit', 'mean_norm', 'none'])
def test_checked_normalisation_equals_the_lessons_in_range(dtype, how):
    g = torch.Generator().manual_seed(0)
    h = 50 * torch.randn(4, 9, 6, generator=g, dtype=dtype)  # (N, T, d)
    mask = torch.arange(9) < torch.tensor([[9], [4], [1], [0]])  # (N, T), an empty rollout
    h = h * mask[..., None]  # padding rows exactly zero
    assert torch.equal(checked_normalize_features(h, how, mask), normalize_features(h, how, mask))
    assert torch.equal(checked_normalize_features(h, how), normalize_features(h, how))


def test_the_lessons_plain_norm_underflows_the_checked_one_does_not():
    tiny = torch.tensor([[3e-25, 4e-25]])  # (T, d) float32: the squares underflow
    assert torch.equal(normalize_features(tiny), tiny)  # plain norm 0: the row is left as it is
    torch.testing.assert_close(checked_normalize_features(tiny), torch.tensor([[0.6, 0.8]]))
    h, norms = feature_norms(tiny)
    assert torch.equal(h, tiny * 2.0**81)  # its largest entry brought into [1/2, 1): exact
    assert norms.item() == pytest.approx(5e-25 * 2.0**81, rel=1e-6)
    with pytest.raises(ValueError, match="how must be 'unit', 'none' or 'mean_norm', got 'l1'"):
        checked_normalize_features(tiny, 'l1')


def _one_and_batched(a, b, M):
    "The problem (a, b, M) with a leading batch dimension on each input in turn, and on all."
    two = lambda x: x.expand(2, *x.shape)  # noqa: E731
    return [(two(a), b, M), (a, two(b), M), (a, b, two(M)), (a[None], b[None], M[None])]


@pytest.mark.parametrize('solve', [checked_sinkhorn_reference, checked_semidual_reference])
def test_checked_twins_take_one_problem_with_mass(solve):
    """The lessons' solvers take one problem: a batch, which `check_ot_inputs` accepts for the
    engine, and an all-zero `a` (the engine's absent item) are refused by the twins, by name."""
    a, b, M = problem(7)
    for args in _one_and_batched(a, b, M):
        with pytest.raises(ValueError, match=r'one problem: a \(n,\), b \(m,\), M \(n, m\)'):
            solve(*args, 0.1)
    with pytest.raises(ValueError, match='a is all zero'):
        solve(torch.zeros_like(a), b, M, 0.1)


@pytest.mark.parametrize('bad', [float('nan'), -1e-9, float('-inf'), 'tight', None, True])
def test_checked_twins_refuse_a_tolerance_that_is_not_one(bad):
    "nan, a negative value or a non-number as a stopping tolerance is refused under its own name."
    a, b, M = problem(8)
    with pytest.raises((ValueError, TypeError), match='tol must be a number >= 0'):
        checked_semidual_reference(a, b, M, 0.1, tol=bad)
    with pytest.raises((ValueError, TypeError), match='stop_thr must be a number >= 0'):
        checked_sinkhorn_reference(a, b, M, 0.1, stop_thr=bad)
    pr = planted_stage_rollouts(K=2, seed=1)
    Mf, C1, C2 = rollout_pair(pr.hidden, pr.mask, 0, 1)
    for key in ('tol_rel', 'tol_abs'):
        with pytest.raises((ValueError, TypeError), match=f'{key} must be a number >= 0'):
            checked_fgw(Mf, C1, C2, **{key: bad})


def test_checked_twins_take_tolerances_as_any_real_scalar():
    a, b, M = problem(9)
    P = checked_semidual_reference(a, b, M, 0.1, tol=np.float32(0.0))[0]  # 0: the dtype's floor
    assert torch.equal(P, semidual_reference(a, b, M, 0.1, tol=0.0)[0])
    P = checked_sinkhorn_reference(a, b, M, 0.1, stop_thr=torch.tensor(1e-9))[0]
    assert torch.equal(P, sinkhorn_reference(a, b, M, 0.1, stop_thr=1e-9)[0])


@pytest.mark.parametrize('n, m', [(1, 2), (1, 5), (4, 3), (9, 6)])
def test_checked_twins_meet_a_tight_threshold_on_totals_off_1_within_the_tolerance(n, m):
    """Weights whose totals are within float64's tolerance of 1 (1e-7) but not 1 to rounding
    (float64 weights normalised in float32 are 3e-8 off): no plan has both marginals, and the
    lessons stop near |sum a - sum b| (2.1e-8 for one source point). The twins solve the problem of
    the weights divided by their totals, to 1e-12."""
    for seed in range(6):
        g = torch.Generator().manual_seed(seed)
        a = torch.rand(n, generator=g, dtype=torch.float64) + 0.1  # (n,)
        b = torch.rand(m, generator=g, dtype=torch.float64) + 0.1  # (m,)
        off = 1e-8 + 8e-8 * torch.rand(2, generator=g, dtype=torch.float64)  # within 1e-7
        a, b = a / a.sum() * (1 + off[0]), b / b.sum() * (1 - off[1])  # totals 1 + off, 1 - off
        M = torch.rand(n, m, generator=g, dtype=torch.float64)  # (n, m)
        assert abs(float(a.sum() - b.sum())) > 1e-8  # the case is exercised
        for solve, lesson, kw in (
            (checked_semidual_reference, semidual_reference, dict(tol=1e-12)),
            (checked_sinkhorn_reference, sinkhorn_reference, dict(stop_thr=1e-12)),
        ):
            with warnings.catch_warnings():
                warnings.simplefilter('error')  # converged: no ConvergenceWarning
                P, lg = solve(a, b, M, 0.05, log=True, **kw)
            assert lg['converged'] and lg['err'] < 1e-12, (seed, lg)
            P_ref, lg_ref = lesson(a / a.sum(), b / b.sum(), M, 0.05, log=True, **kw)
            assert torch.equal(P, P_ref) and lg == lg_ref
    a1, b1 = torch.ones(1, dtype=torch.float64), torch.tensor([1.0, 2.0])  # (1,), (2,)
    b1 = (b1 / b1.sum()).double()  # 1/3, 2/3 normalised in float32: total 1 + 3.0e-8
    M1 = torch.tensor([[0.0, 1.0]], dtype=torch.float64)  # (1, 2)
    with pytest.warns(UserWarning, match='marginal error 2.1'):  # the lesson: 2.1e-8 at its cap
        semidual_reference(a1, b1, M1, 0.05, tol=1e-12)
    lg = checked_semidual_reference(a1, b1, M1, 0.05, tol=1e-12, log=True)[1]
    assert lg['converged'] and lg['err'] < 1e-12


@pytest.mark.parametrize('how', ['mean_norm', 'unit'])
@pytest.mark.parametrize(
    'dtype, e_real, e_pad',
    [
        (torch.float32, 0, 0),
        (torch.float32, 0, -100),
        (torch.float32, -130, -130),
        (torch.float32, 110, 110),
        (torch.float64, 0, -1000),
        (torch.float64, -1060, -1060),
        (torch.float64, 1000, 1000),
    ],
)
def test_checked_normalisation_is_the_lessons_on_padding_rows_too(how, dtype, e_real, e_pad):
    """Rows off the mask that are not zero are scaled as the lesson scales them (by their
    rollout's mean norm for 'mean_norm'), at any scale of the real rows and of the padding: the
    features of h * 2^e are those of h, with the padding's own factor kept."""
    g = torch.Generator().manual_seed(2)
    h = torch.randint(-8, 9, (3, 6, 4), generator=g).to(dtype)  # (N, T, d) integers: exact
    h[..., 0] = h[..., 0].abs() + 1  # no zero row
    mask = torch.arange(6) < torch.tensor([[6], [4], [2]])  # (N, T), padding rows not zero
    two = lambda k: torch.tensor(2.0**k, dtype=dtype)  # noqa: E731
    hs = h * torch.where(mask, two(e_real), two(e_pad))[..., None]  # (N, T, d)
    got = checked_normalize_features(hs, how, mask)  # (N, T, d)
    if e_real == e_pad == 0:  # in range: the lesson's numbers, bit for bit
        assert torch.equal(got, normalize_features(hs, how, mask))
    ref = normalize_features(h, how, mask)  # (N, T, d) the lesson's at a scale it can hold
    if how == 'mean_norm':  # the padding keeps its factor relative to the real rows
        ref = ref * torch.where(mask, two(0), two(e_pad - e_real))[..., None]
    scale = torch.where(mask, two(0), ref.abs().amax(-1))[..., None]  # (N, T, 1) per-row size
    tol = 4 * torch.finfo(dtype).eps  # features of norm a few, each to its own size
    assert float(((got - ref).abs() / scale.clamp_min(torch.finfo(dtype).tiny)).max()) <= tol
