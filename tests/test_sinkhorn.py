"""Property tests, POT cross-checks and failure cases for `hara_ref.engine.sinkhorn` (batched
log-domain Sinkhorn)."""

import warnings
import numpy as np
import ot
import pytest
import torch
from hypothesis import given, settings, strategies as st, HealthCheck
from hara_ref.engine.sinkhorn import sinkhorn_log, sinkhorn_log2, SinkhornConvergenceWarning
from hara_ref.ot.entropic import sinkhorn_naive

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


pytestmark = pytest.mark.usefixtures('one_thread')  # tests/conftest.py


def problem(seed, B, n, m, dtype=torch.float64, scale=1.0):
    "Random batched problem with Dirichlet weights and costs in [0, 2*scale]."
    rng = np.random.default_rng(seed)
    a = torch.tensor(rng.dirichlet(np.ones(n), size=B), dtype=dtype)
    b = torch.tensor(rng.dirichlet(np.ones(m), size=B), dtype=dtype)
    M = torch.tensor(2 * scale * rng.random((B, n, m)), dtype=dtype)
    return a, b, M


def ragged_problem(seed, lens, mlens):
    """A batch of problems with L real rows and Lm real columns each (Dirichlet weights, zero
    padding), costs in [0, 1]."""
    B, n, m = len(lens), max(lens), max(mlens[: len(lens)])
    rng = np.random.default_rng(seed)
    a, b = torch.zeros(B, n, dtype=torch.float64), torch.zeros(B, m, dtype=torch.float64)
    M = torch.tensor(rng.random((B, n, m)), dtype=torch.float64)
    for i, (L, Lm) in enumerate(zip(lens, mlens)):
        a[i, :L] = torch.tensor(rng.dirichlet(np.ones(L)))
        b[i, :Lm] = torch.tensor(rng.dirichlet(np.ones(Lm)))
    return a, b, M


@SETTINGS
@given(
    seed=st.integers(0, 10**6),
    B=st.integers(1, 3),
    n=st.integers(1, 20),
    m=st.integers(1, 20),
    reg=st.sampled_from([0.05, 0.1, 0.5]),
)
def test_plan_properties_and_pot(seed, B, n, m, reg):
    a, b, M = problem(seed, B, n, m)
    plan, lg = sinkhorn_log(a, b, M, reg, log=True, num_iter_max=5000)
    assert plan.shape == (B, n, m) and (plan >= 0).all() and torch.isfinite(plan).all()
    torch.testing.assert_close(plan.sum(-1), a, atol=1e-12, rtol=0)  # exact after the last u-update
    assert lg['converged'].all()
    assert ((plan.sum(-2) - b).norm(dim=-1) < 1e-9).all()  # column marginal within stop_thr
    for i in range(B):
        ref = ot.sinkhorn(
            a[i].numpy(), b[i].numpy(), M[i].numpy(), reg, method='sinkhorn_log', numItermax=5000
        )
        np.testing.assert_allclose(plan[i].numpy(), ref, atol=1e-10, rtol=0)


@SETTINGS
@given(
    seed=st.integers(0, 10**6),
    lens=st.lists(st.integers(1, 15), min_size=1, max_size=4),
    mlens=st.lists(st.integers(1, 8), min_size=4, max_size=4),
)
def test_ragged_batch_equals_one_by_one(seed, lens, mlens):
    a, b, M = ragged_problem(seed, lens, mlens)
    plan = sinkhorn_log(a, b, M, 0.1, num_iter_max=5000)
    for i, (L, Lm) in enumerate(zip(lens, mlens)):
        single = sinkhorn_log(a[i, :L], b[i, :Lm], M[i, :L, :Lm], 0.1, num_iter_max=5000)
        torch.testing.assert_close(plan[i, :L, :Lm], single, atol=1e-13, rtol=0)
        assert (plan[i, L:] == 0).all() and (plan[i, :, Lm:] == 0).all()


@SETTINGS
@given(
    seed=st.integers(0, 10**6),
    B=st.integers(2, 4),
    omega=st.sampled_from([1.0, 1.9, 'auto']),
    warm=st.booleans(),
)
def test_per_item_settings_batch_equals_one_by_one(seed, B, omega, warm):
    """Per-item stop_thr, a problem whose cost range disables relaxation, warm starts that fail for
    one item: batch == one by one."""
    rng = np.random.default_rng(seed)
    a, b, M = problem(seed, B, 12, 6)
    # max|M|/reg > 100/0.05 > 8 tau (float64): relaxation off for this item only. A constant shift,
    # not a scale: the plan and the iteration's rate are those of M[0], so the item converges
    # (scaling by 100 made it stall to num_iter_max in most examples: a minute for nothing)
    M[0] += 100
    thr = torch.tensor(10.0 ** -rng.integers(3, 10, B), dtype=torch.float64)  # (B,)
    kw = dict(num_iter_max=3000, check_every=5, omega=omega, log=True, warn=False)
    lu0 = lv0 = None
    if warm:
        _, lg0 = sinkhorn_log(a, b, 0.9 * M, 0.05, **kw)
        lu0, lv0 = lg0['log_u'], lg0['log_v'].clone()
        # this item's warm kernel overflows (e^300 > e^tau): it alone takes the exact log-domain
        # iteration 0
        lv0[-1] += 300.0
    plan, lg = sinkhorn_log(a, b, M, 0.05, stop_thr=thr, log_u0=lu0, log_v0=lv0, **kw)
    for i in range(B):
        w = {} if not warm else dict(log_u0=lu0[i], log_v0=lv0[i])
        p1, lg1 = sinkhorn_log(a[i], b[i], M[i], 0.05, stop_thr=float(thr[i]), **w, **kw)
        assert int(lg['n_iter_item'][i]) == lg1['n_iter'] and bool(lg['converged'][i]) == bool(
            lg1['converged']
        )
        torch.testing.assert_close(plan[i], p1, atol=1e-13, rtol=0)
        torch.testing.assert_close(lg['stop_thr'][i], lg1['stop_thr'])


def test_stop_thr_tensor_bad_shape_and_values():
    a, b, M = problem(3, 3, 5, 4)
    with pytest.raises(ValueError, match='does not broadcast'):
        sinkhorn_log(a, b, M, 0.1, stop_thr=torch.ones(2))
    with pytest.raises(ValueError, match='non-negative'):
        sinkhorn_log(a, b, M, 0.1, stop_thr=torch.tensor([1e-9, -1.0, 1e-9]))
    _, lg = sinkhorn_log(a, b, M, 0.1, stop_thr=torch.tensor([1e-2, 1e-6, 1e-10]), log=True)
    assert lg['converged'].all() and (lg['err'] < torch.tensor([1e-2, 1e-6, 1e-10])).all()
    assert lg['n_iter_item'][0] <= lg['n_iter_item'][1] <= lg['n_iter_item'][2]


def test_broadcast_shared_b_and_absent_item():
    a, b, M = problem(0, 4, 10, 5)
    a[2] = 0.0  # absent item
    plan, lg = sinkhorn_log(a, b[0], M, 0.1, log=True)  # b broadcast over the batch
    assert (plan[2] == 0).all() and lg['converged'].all()
    torch.testing.assert_close(plan[1], sinkhorn_log(a[1], b[0], M[1], 0.1), atol=1e-14, rtol=0)


def test_float32_large_norms_no_nan():
    g = torch.Generator().manual_seed(0)
    # costs ~ 1e5
    h, z = 50 * torch.randn(4, 64, 32, generator=g), 50 * torch.randn(4, 16, 32, generator=g)
    M = torch.cdist(h, z) ** 2
    # honest: it cannot converge at reg 0.05 on such costs
    with pytest.warns(SinkhornConvergenceWarning):
        plan = sinkhorn_log(
            torch.full((4, 64), 1 / 64), torch.full((4, 16), 1 / 16), M, 0.05, num_iter_max=200
        )
    assert torch.isfinite(plan).all() and (plan >= 0).all()
    torch.testing.assert_close(plan.sum(-1), torch.full((4, 64), 1 / 64), atol=1e-6, rtol=1e-4)


def test_float32_unit_features_converge_and_match_float64():
    g = torch.Generator().manual_seed(1)
    h = torch.nn.functional.normalize(torch.randn(8, 128, 16, generator=g), dim=-1)
    z = torch.nn.functional.normalize(torch.randn(8, 32, 16, generator=g), dim=-1)
    M = torch.cdist(h, z) ** 2
    a, b = torch.full((8, 128), 1 / 128), torch.full((8, 32), 1 / 32)
    with warnings.catch_warnings():
        warnings.simplefilter('error', SinkhornConvergenceWarning)
        p32, lg = sinkhorn_log(a, b, M, 0.05, log=True)
    p64 = sinkhorn_log(a.double(), b.double(), M.double(), 0.05)
    # the float32 floor binds, per problem
    assert (
        p32.dtype == torch.float32
        and lg['stop_thr'].shape == (8,)
        and (lg['stop_thr'] > 1e-9).all()
    )
    assert (p32.double() - p64).abs().max() < 1e-6


def test_naive_underflows_log_domain_does_not():
    g = torch.Generator().manual_seed(0)
    M = (
        torch.cdist(
            3 * torch.randn(20, 64, generator=g, dtype=torch.float64),
            3 * torch.randn(6, 64, generator=g, dtype=torch.float64),
        )
        ** 2
    )
    a, b = (
        torch.full((20,), 1 / 20, dtype=torch.float64),
        torch.full((6,), 1 / 6, dtype=torch.float64),
    )
    with np.errstate(all='ignore'):
        assert sinkhorn_naive(a, b, M, 0.05, n_iter=5).isnan().any()
    with pytest.warns(SinkhornConvergenceWarning):
        assert torch.isfinite(sinkhorn_log(a, b, M, 0.05, num_iter_max=50)).all()


def test_log_agrees_with_naive_where_naive_works():
    a, b, M = problem(3, 1, 12, 7)
    torch.testing.assert_close(
        sinkhorn_log(a[0], b[0], M[0], 0.5, stop_thr=1e-13),
        sinkhorn_naive(a[0], b[0], M[0], 0.5, n_iter=3000),
        atol=1e-12,
        rtol=0,
    )


def test_cost_and_emd_limit():
    a, b, M = problem(4, 1, 15, 10)
    c = sinkhorn_log2(a, b, M, 0.1)
    ref = ot.sinkhorn2(a[0].numpy(), b[0].numpy(), M[0].numpy(), 0.1, method='sinkhorn_log')
    np.testing.assert_allclose(float(c[0]), float(ref), atol=1e-10)
    costs = [float(sinkhorn_log2(a, b, M, r, num_iter_max=50000)[0]) for r in (0.1, 0.01, 0.002)]
    exact = ot.emd2(a[0].numpy(), b[0].numpy(), M[0].numpy())
    assert costs[0] >= costs[1] >= costs[2] >= exact - 1e-9 and costs[2] - exact < 0.02


def test_warm_start_saves_iterations():
    a, b, M = problem(5, 4, 60, 20)
    _, lg = sinkhorn_log(a, b, M, 0.05, log=True, num_iter_max=5000)
    p_cold, lg_cold = sinkhorn_log(a, b, 1.01 * M, 0.05, log=True, num_iter_max=5000)
    p_warm, lg_warm = sinkhorn_log(
        a, b, 1.01 * M, 0.05, log=True, num_iter_max=5000, log_u0=lg['log_u']
    )
    assert lg_warm['n_iter'] < lg_cold['n_iter']
    torch.testing.assert_close(p_warm, p_cold, atol=1e-8, rtol=0)


def test_warm_start_from_both_potentials():
    a, b, M = problem(5, 4, 60, 20)
    _, lg = sinkhorn_log(a, b, M, 0.05, log=True, num_iter_max=5000)
    p_cold = sinkhorn_log(a, b, 1.01 * M, 0.05, num_iter_max=5000)
    p_warm, lg_warm = sinkhorn_log(
        a,
        b,
        1.01 * M,
        0.05,
        log=True,
        num_iter_max=5000,
        log_u0=lg['log_u'],
        log_v0=lg['log_v'],
        check_inputs=False,
    )
    assert lg_warm['converged'].all()
    torch.testing.assert_close(p_warm, p_cold, atol=1e-8, rtol=0)


@pytest.mark.parametrize('omega', [1.5, 1.9, 'auto'])
def test_over_relaxation_same_plan_fewer_iterations(omega):
    a, b, M = problem(8, 3, 50, 8)
    p1, lg1 = sinkhorn_log(a, b, M, 0.01, log=True, num_iter_max=50000)
    pw, lgw = sinkhorn_log(a, b, M, 0.01, log=True, num_iter_max=50000, omega=omega)
    assert lgw['converged'].all() and lgw['n_iter'] < lg1['n_iter']
    torch.testing.assert_close(pw, p1, atol=1e-8, rtol=0)
    torch.testing.assert_close(pw.sum(-1), a, atol=1e-14, rtol=0)


def test_bad_omega():
    a, b, M = problem(9, 1, 5, 4)
    for om in (0.5, 2.0, 'fast'):
        with pytest.raises(ValueError, match='omega'):
            sinkhorn_log(a, b, M, 0.1, omega=om)


def test_warns_on_non_convergence_and_log_contents():
    a, b, M = problem(6, 2, 30, 30)
    with pytest.warns(SinkhornConvergenceWarning, match='did not converge'):
        _, lg = sinkhorn_log(a, b, M, 0.001, num_iter_max=10, log=True)
    assert (
        set(lg) >= {'n_iter', 'err', 'log_u', 'log_v', 'converged'}
        and lg['n_iter'] == 10
        and not lg['converged'].any()
    )
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        sinkhorn_log(a, b, M, 0.001, num_iter_max=10, warn=False)


@pytest.mark.parametrize(
    'bad, msg',
    [
        (lambda a, b, M: (a, b, M[..., :-1]), 'shape mismatch'),
        (lambda a, b, M: (a, b, M.clone().fill_(float('nan'))), 'nan'),
        (lambda a, b, M: (a - 0.5, b, M), 'non-negative'),
        (lambda a, b, M: (2 * a, b, M), 'normalised'),
        (lambda a, b, M: (a.float(), b, M), 'dtype mismatch'),
        (lambda a, b, M: (a.tolist(), b, M), 'torch.Tensor or a NumPy array'),
        (lambda a, b, M: (a, b, M[:2]), 'broadcast'),
    ],
)
def test_bad_input(bad, msg):
    a, b, M = problem(7, 3, 4, 5)
    with pytest.raises((ValueError, TypeError), match=msg):
        sinkhorn_log(*bad(a, b, M), 0.1)


@pytest.mark.parametrize('reg', [0.0, -1.0, float('nan'), float('inf')])
def test_bad_reg(reg):
    a, b, M = problem(8, 1, 3, 3)
    with pytest.raises(ValueError, match='reg must be'):
        sinkhorn_log(a, b, M, reg)


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_cuda_matches_cpu():
    a, b, M = problem(9, 4, 50, 16)
    cpu = sinkhorn_log(a, b, M, 0.05)
    gpu = sinkhorn_log(a.cuda(), b.cuda(), M.cuda(), 0.05)
    assert gpu.device.type == 'cuda'
    torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-12, rtol=0)


def test_working_set_shrinks_without_changing_any_item():
    """Problems that converge leave the working set (compaction, several times here); every item
    equals its own solve."""
    a, b, M = problem(11, 16, 30, 7)
    # (4, 4) batch
    thr = torch.tensor([10.0 ** -(2 + i % 12) for i in range(16)], dtype=torch.float64).reshape(
        4, 4
    )
    a, b, M = a.reshape(4, 4, 30), b.reshape(4, 4, 7), M.reshape(4, 4, 30, 7)
    plan, lg = sinkhorn_log(a, b, M, 0.02, stop_thr=thr, omega=1.5, log=True, num_iter_max=5000)
    # items stopped at many different counts
    assert lg['converged'].all() and len(set(lg['n_iter_item'].flatten().tolist())) > 4
    for i in range(4):
        for j in range(4):
            p1, l1 = sinkhorn_log(
                a[i, j],
                b[i, j],
                M[i, j],
                0.02,
                stop_thr=float(thr[i, j]),
                omega=1.5,
                log=True,
                num_iter_max=5000,
            )
            assert int(lg['n_iter_item'][i, j]) == l1['n_iter']
            torch.testing.assert_close(plan[i, j], p1, atol=1e-14, rtol=0)
            torch.testing.assert_close(lg['log_v'][i, j], l1['log_v'], atol=1e-9, rtol=0)


# --- bad input that used to give a crash, a wrong plan marked converged, or a 16-bit "converged"
# plan far from its marginals


@pytest.mark.parametrize(
    'kw, msg',
    [
        (dict(check_every=0), 'check_every'),
        (dict(check_every=-1), 'check_every'),
        (dict(check_every=2.5), 'check_every'),
        (dict(num_iter_max=0), 'num_iter_max'),
    ],
)
def test_bad_iteration_settings(kw, msg):
    a, b, M = problem(12, 2, 5, 4)
    with pytest.raises(ValueError, match=msg):
        sinkhorn_log(a, b, M, 0.1, **kw)
    with pytest.raises(ValueError, match=msg):
        sinkhorn_log(a, b, M, 0.1, check_inputs=False, **kw)


def test_empty_support_refused_empty_batch_returns_empty():
    a, b, M = problem(13, 2, 5, 4)
    with pytest.raises(ValueError, match='empty problem'):
        sinkhorn_log(a[:, :0], b, M[:, :0], 0.1)
    with pytest.raises(ValueError, match='empty problem'):
        sinkhorn_log(a, b[:, :0], M[..., :0], 0.1)
    # no problems at all: an empty batch of plans
    plan, lg = sinkhorn_log(a[:0], b[:0], M[:0], 0.1, log=True)
    assert (
        plan.shape == (0, 5, 4)
        and lg['converged'].shape == (0,)
        and lg['n_iter'] == 0
        and lg['log_u'].shape == (0, 5)
    )


@pytest.mark.parametrize('val', [float('inf'), -float('inf'), float('nan'), 1e300, -1e300])
@pytest.mark.parametrize('which', ['log_u0', 'log_v0'])
def test_bad_warm_start_refused(val, which):
    """A warm start of +inf used to return a plan 0.09 away from the true one, marked converged; now
    every such start is refused."""
    a, b, M = problem(14, 1, 6, 5)
    x = torch.zeros(6 if which == 'log_u0' else 5, dtype=torch.float64)
    x[0, ...] = val
    for other in (False, True):
        kw = {which: x[None]}
        if other:
            kw['log_v0' if which == 'log_u0' else 'log_u0'] = torch.zeros(
                1, 5 if which == 'log_u0' else 6, dtype=torch.float64
            )
        with pytest.raises(ValueError, match=which):
            sinkhorn_log(a, b, M, 0.1, **kw)


def test_warm_start_padding_may_be_minus_inf_and_far_starts_still_converge():
    """The returned log_u has -inf on padding; passing it back is fine. A finite, merely bad start
    converges to the right plan."""
    a, b, M = problem(15, 2, 6, 5)
    a[1, 4:] = 0
    a[1] /= a[1].sum()
    ref, lg = sinkhorn_log(a, b, M, 0.1, log=True)
    assert torch.isinf(lg['log_u'][1, 4:]).all()
    torch.testing.assert_close(
        sinkhorn_log(a, b, M, 0.1, log_u0=lg['log_u'], log_v0=lg['log_v']), ref, atol=1e-9, rtol=0
    )
    # far from the potentials, within the documented bound
    x = torch.zeros(2, 6, dtype=torch.float64)
    x[:, 0] = 150.0
    plan, lg2 = sinkhorn_log(a, b, M, 0.1, log_u0=x, log=True)
    assert lg2['converged'].all()
    torch.testing.assert_close(plan, ref, atol=1e-9, rtol=0)


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_16bit_costs_are_solved_in_float32(dtype):
    """bf16 used to stop at a floor of ~0.3: a plan 4e-3 off its column marginal (reg 0.01) counted
    as converged."""
    a, b, M = problem(16, 3, 12, 7)
    a, b, M = a.to(dtype), b.to(dtype), M.to(dtype)
    plan, lg = sinkhorn_log(a, b, M, 0.01, log=True, num_iter_max=20000)
    assert plan.dtype == dtype and lg['err'].dtype == torch.float32 and lg['converged'].all()
    # the documented renormalisation
    a32, b32 = (
        a.float() / a.float().sum(-1, keepdim=True),
        b.float() / b.float().sum(-1, keepdim=True),
    )
    # same problem in float64
    ref = sinkhorn_log(a32.double(), b32.double(), M.double(), 0.01, num_iter_max=20000, warn=False)
    # the final cast to 16 bits, on top of the float32 solve (~6e-6)
    rel = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-11
    assert ((plan.double() - ref).abs() <= rel * ref + 2e-5).all()
    assert ((plan.double().sum(-2) - b32.double()).abs() <= rel * b32.double() + 2e-5).all()
    assert (lg['err'] < 1e-5).all()


@pytest.mark.parametrize(
    'reg',
    [
        np.float64(0.1),
        np.float32(0.25),
        np.array(0.1),
        torch.tensor(0.1),
        torch.tensor(0.1, dtype=torch.float64),
        np.int64(1),
        1,
    ],
)
def test_reg_scalars_accepted(reg):
    a, b, M = problem(17, 2, 5, 4)
    torch.testing.assert_close(
        sinkhorn_log(a, b, M, reg), sinkhorn_log(a, b, M, float(reg)), atol=0, rtol=0
    )
    torch.testing.assert_close(
        sinkhorn_log(a, b, M, reg, check_inputs=False),
        sinkhorn_log(a, b, M, float(reg)),
        atol=0,
        rtol=0,
    )


@pytest.mark.parametrize(
    'reg',
    [
        torch.tensor([0.1]),
        np.array([0.1, 0.2]),
        True,
        'x',
        None,
        np.array(-1.0),
        torch.tensor(float('nan')),
        np.inf,
        1j,
    ],
)
def test_reg_bad_values_refused(reg):
    a, b, M = problem(18, 1, 3, 3)
    with pytest.raises(ValueError, match='reg must be'):
        sinkhorn_log(a, b, M, reg)


def test_numpy_inputs_accepted():
    a, b, M = problem(19, 2, 5, 4)
    plan = sinkhorn_log(a.numpy(), b.numpy(), M.numpy(), 0.1)
    assert isinstance(plan, torch.Tensor) and plan.dtype == torch.float64
    torch.testing.assert_close(plan, sinkhorn_log(a, b, M, 0.1), atol=0, rtol=0)
    torch.testing.assert_close(
        sinkhorn_log(a[0].numpy(), b[0], M[0].numpy(), 0.1),
        sinkhorn_log(a[0], b[0], M[0], 0.1),
        atol=0,
        rtol=0,
    )
    torch.testing.assert_close(
        sinkhorn_log2(a.numpy(), b.numpy(), M.numpy(), 0.1),
        sinkhorn_log2(a, b, M, 0.1),
        atol=0,
        rtol=0,
    )
    with pytest.raises(TypeError, match='dtype mismatch'):
        sinkhorn_log(a.float().numpy(), b, M, 0.1)


def test_cap_reported_in_log_and_warning():
    a, b, M = problem(20, 3, 20, 20)
    with pytest.warns(
        SinkhornConvergenceWarning, match='3 of 3 problems did not converge in 7 iterations'
    ):
        _, lg = sinkhorn_log(a, b, M, 0.001, num_iter_max=7, log=True)
    assert (
        lg['n_iter'] == 7
        and (lg['n_iter_item'] == 7).all()
        and not lg['converged'].any()
        and (lg['err'] > lg['stop_thr']).all()
    )


@pytest.mark.parametrize('n, m', [(1, 2), (1, 5), (8, 8), (3, 12)])
def test_semidual_reference_solves_float32_problems(n, m):
    """Chapter 05's Newton reference on float32 problems (one source point, square, wide): no error,
    no warning, stopped within the float32 floor; rows exact to float32's rounding; one source
    point's plan is b itself."""
    from hara_ref.ot.entropic import semidual_reference
    from hara_ref.engine.verifier import rounding_tol

    for seed in range(20):
        for reg in (0.02, 0.05, 0.2):
            a, b, M = (x[0] for x in problem(seed, 1, n, m, dtype=torch.float32))
            with warnings.catch_warnings():
                warnings.simplefilter('error')  # converged: no ConvergenceWarning
                P, lg = semidual_reference(a, b, M, reg, log=True)
            assert P.dtype == torch.float32 and lg['converged'] and lg['err'] < lg['stop_thr']
            assert lg['stop_thr'] < 1e-4  # the float32 floor, not a loose threshold
            rnd = rounding_tol(1.0, max(n, m))  # plan entries <= 1, sums of n or m of them
            assert float((P.sum(1) - a).abs().max()) <= rnd
            assert float((P.sum(0) - b).norm()) <= lg['stop_thr'] + rnd
            if n == 1:  # one source point sends b_j to node j
                assert float((P[0] - b).abs().max()) <= lg['stop_thr'] + rnd
