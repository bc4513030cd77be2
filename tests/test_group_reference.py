"""The geometric group reference (chapters 11_rollouts, 12_novelty, 42_hara_engine, 38_checks):
HARA's advantages do not change under rotations of the hidden space; exact cases; agreement with a
brute-force minimisation; caps."""

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st, HealthCheck
from scipy.optimize import minimize

from hara_ref.engine.hara_engine import hara_advantages
from hara_ref.engine.checks import geometric_median, group_geometric_median
from hara_ref.hara.rollouts import weiszfeld_median
from hara_ref.rlvr.data import planted_stage_rollouts

DATA = Path(__file__).parent / 'data'
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TIGHT = dict(bary_kw=dict(tol=1e-7, max_iter=5000))  # the barycenter 100 x tighter than the default
GRAN = [dict(granularity='seq'), dict(granularity='tok'), dict(granularity='span', span_len=3)]


def groups_of_3(seed, T=12, d=8):
    "Two outcome groups of 3 i.i.d. Gaussian rollouts (one prompt), float64."
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(6, T, d, generator=g, dtype=torch.float64)
    r = torch.tensor([1.0, 1, 1, 0, 0, 0], dtype=torch.float64)
    return h, torch.ones(6, T, dtype=torch.bool), r, torch.zeros(6, dtype=torch.long)


def planted(seed, K=8):
    "K planted-stage rollouts of one prompt (stages skipped and swapped at random), half correct."
    p = planted_stage_rollouts(K=K, n_stages=6, d=16, seed=seed, p_skip=0.1, p_swap=0.1)
    return p.hidden, p.mask, (torch.arange(K) < K // 2).double(), torch.zeros(K, dtype=torch.long)


def rotation(d, seed):
    "A random orthogonal (d, d) matrix: Q of the QR factorisation of a Gaussian matrix, float64."
    g = torch.Generator().manual_seed(seed)
    return torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))[0]  # (d, d)


def rotation_deviation(make, seed, ref, kw):
    "Largest change of a token advantage when the hidden space is rotated (h -> Q h)."
    h, m, r, g = make(seed)
    adv, _ = hara_advantages(h, m, r, g, group_reference=ref, **kw, **TIGHT)
    hq = h @ rotation(h.shape[-1], seed).T  # (B, T, d)
    adv_q, _ = hara_advantages(hq, m, r, g, group_reference=ref, **kw, **TIGHT)
    return float((adv - adv_q).abs().max())


# ---------------------------------------------------------------- rotation invariance
@pytest.mark.parametrize('kw', GRAN, ids=['seq', 'tok', 'span'])
@pytest.mark.parametrize('make,seed', [(groups_of_3, 0), (groups_of_3, 1), (planted, 0)])
def test_advantages_do_not_depend_on_the_basis(make, seed, kw):
    assert rotation_deviation(make, seed, 'geometric', kw) <= 1e-6


@pytest.mark.parametrize('make,seed,floor', [(groups_of_3, 0, 1e-2), (planted, 0, 1e-3)])
def test_entrywise_reference_depends_on_the_basis(make, seed, floor):
    "The same check on the entrywise median fails: what the geometric reference fixes."
    assert rotation_deviation(make, seed, 'entrywise', dict(granularity='tok')) > floor


# ---------------------------------------------------------------- exact cases
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
@pytest.mark.parametrize('kw', GRAN, ids=['seq', 'tok', 'span'])
def test_copies_get_weight_exactly_one(dtype, kw):
    pr = planted_stage_rollouts(K=1, n_stages=6, d=16, seed=3, dtype=dtype)
    h, m = pr.hidden.expand(6, -1, -1), pr.mask.expand(6, -1)
    r = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0], dtype=dtype)
    _, rw = hara_advantages(h, m, r, torch.zeros(6, dtype=torch.long), **kw)
    assert (rw.weights == 1).all() and (rw.x[m] == 1).all()


@given(
    st.integers(0, 2**16),
    st.integers(1, 4),
    st.integers(1, 5),
    st.sampled_from([torch.float32, torch.float64]),
)
@SETTINGS
def test_majority_point_and_two_members_are_exact(seed, extra, D, dtype):
    g = torch.Generator().manual_seed(seed)
    p, others = torch.randn(D, generator=g).to(dtype), torch.randn(extra, D, generator=g).to(dtype)
    v = torch.cat([p.expand(extra + 1, D), others])  # (2 extra + 1, D) a majority at p
    v = v[torch.randperm(len(v), generator=g)]
    one = torch.zeros(len(v), dtype=torch.long), torch.ones(len(v), dtype=torch.bool)
    assert (group_geometric_median(v, *one)[0] == p).all()
    two = torch.zeros(2, dtype=torch.long), torch.ones(2, dtype=torch.bool)
    # (2, D) a point and its opposite
    pm = others[:1].expand(2, D) * torch.tensor([[1.0], [-1.0]], dtype=dtype)
    assert (group_geometric_median(pm, *two)[0] == 0).all()
    mid = (others[0] + p) / 2
    assert (group_geometric_median(torch.stack([p, others[0]]), *two)[0] == mid).all()


# ------------------------------------------------------------ against a brute-force minimisation
@given(st.integers(0, 2**16), st.integers(3, 7), st.integers(2, 5))
@SETTINGS
def test_geometric_median_minimises_the_sum_of_distances(seed, K, D):
    """f(ours) <= f(scipy's minimiser) to rounding, and the points agree (random points: not on a
    line)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(1, K, D, generator=g, dtype=torch.float64)  # (1, K, D)
    m, info = geometric_median(y, torch.ones(1, K, dtype=torch.bool))
    f = lambda x: np.linalg.norm(y[0].numpy() - x, axis=1).sum()
    opts = dict(xtol=1e-12, ftol=1e-15)
    starts = (y[0].mean(0).numpy(), m[0].numpy())
    best = min(
        (minimize(f, x0, method='Powell', options=opts) for x0 in starts), key=lambda res: res.fun
    )
    assert info['converged']
    assert f(m[0].numpy()) <= best.fun * (1 + 1e-12)
    spread = float((y[0] - y[0].mean(0)).norm(dim=-1).mean())
    assert float(np.linalg.norm(m[0].numpy() - best.x)) <= 1e-5 * spread


@given(st.integers(0, 2**16), st.integers(3, 7), st.integers(2, 5))
@SETTINGS
def test_lessons_weiszfeld_loop_agrees_with_the_solver(seed, K, D):
    """Chapter 11's plain Weiszfeld loop, run long enough, finds the solver's median on random
    points (whose median is off the points): the same minimiser to 1e-6 of the spread."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(1, K, D, generator=g, dtype=torch.float64)  # (1, K, D)
    here = torch.ones(1, K, dtype=torch.bool)
    m, _ = geometric_median(y, here)
    if (y[0] - m[0]).norm(dim=-1).min() < 1e-3:  # a median on a point: the loop crawls there
        return
    plain, info = weiszfeld_median(y, here, max_iter=20000)
    spread = float((y[0] - y[0].mean(0)).norm(dim=-1).mean())
    assert info['converged']
    assert float((plain[0] - m[0]).norm()) <= 1e-6 * spread


# ------------------------------------------------- near-copies: converged at the defaults
def sum_dist(y: np.ndarray, x: np.ndarray) -> float:
    "f(x) = Σ_k ‖y_k - x‖ in float64."
    return float(np.linalg.norm(y - x, axis=1).sum())


def scipy_best(y: np.ndarray, starts) -> float:
    "The lowest f Powell finds from each start (float64)."
    opts = dict(xtol=1e-12, ftol=1e-15)
    return min(
        minimize(lambda x: sum_dist(y, x), x0, method='Powell', options=opts).fun for x0 in starts
    )


def f_tol(y: torch.Tensor, dtype: torch.dtype) -> float:
    """How far above the minimum f may be: the solver's step tolerance (tol=1e-9, at least 16 x the
    dtype's rounding) times the scale of the points (‖mean‖ + spread), once per point."""
    mean = y.double().mean(0)
    scale = float(mean.norm() + (y.double() - mean).norm(dim=-1).mean())
    return len(y) * max(1e-9, 16 * torch.finfo(dtype).eps) * scale


def near_copies(seed: int, K: int, n_c: int, delta: float, D: int, dtype) -> torch.Tensor:
    """(K, D) points: n_c of them within `delta` of one centre (versions of rollouts that share
    tokens differ by rounding), the others at a distance of about 0.3 sqrt(D)."""
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(D, generator=g, dtype=torch.float64)  # (D,)
    y = c + 0.3 * torch.randn(K, D, generator=g, dtype=torch.float64)  # (K, D)
    y[:n_c] = c + delta * torch.randn(n_c, D, generator=g, dtype=torch.float64)
    return y.to(dtype)


def test_captured_training_median_converges_at_the_defaults():
    """One stage median of `hara-ref train --task countdown --seeds 1 --reweight hara-tok` (RL step
    58): 4 stage versions in 97 dimensions, two of them apart by float32 rounding, so Kuhn's exact
    test sees no copies; the median sits at that pair. Weiszfeld's steps crawl towards it and stop
    at max_iter=200."""
    d = torch.load(DATA / 'geometric_median_capped.pt')
    P = d['P']  # (1, 4, 97) float32: one node, four members
    one = torch.zeros(4, dtype=torch.long), torch.ones(4, dtype=torch.bool)
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # no cap warning
        med, info = group_geometric_median(P[0], *one)  # (4, 97)
    assert info['converged'] and info['n_iter'] <= 10
    y, m = P[0].double().numpy(), med[0].double().numpy()
    assert sum_dist(y, m) <= scipy_best(y, (y.mean(0), m)) + f_tol(P[0], P.dtype)
    # at the pair of near-copies (rows 0 and 2), to float32 rounding of the points' scale
    assert np.linalg.norm(m - y[0]) <= f_tol(P[0], P.dtype) / 4


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
@pytest.mark.parametrize('K,n_c', [(3, 2), (4, 2), (5, 2), (6, 2), (8, 3)])
@pytest.mark.parametrize('delta', [1e-4, 1e-6])
def test_near_copies_converge_in_few_steps(K, n_c, delta, dtype):
    "Clusters of near-copies: a median at the cluster or pulled away from it, found in a few steps."
    for seed in range(2):
        y = near_copies(seed, K, n_c, delta, 16, dtype)  # (K, 16)
        m, info = geometric_median(y[None], torch.ones(1, K, dtype=torch.bool))
        assert info['converged'] and info['n_iter'] <= 15, (seed, info)
        y64, m64 = y.double().numpy(), m[0].double().numpy()
        assert sum_dist(y64, m64) <= scipy_best(y64, (y64.mean(0), m64)) + f_tol(y, dtype)


@given(
    st.integers(0, 2**16),
    st.integers(3, 8),
    st.integers(2, 7),
    st.integers(-8, -1),
    st.integers(2, 8),
    st.sampled_from([torch.float32, torch.float64]),
)
@SETTINGS
def test_near_copies_minimise_the_sum_of_distances(seed, K, n_c, log_delta, D, dtype):
    """Near-copies of any tightness, in any dimension: converged at the defaults in a few steps, and
    no start of scipy's Powell finds a lower f than ours, to the solver's tolerance."""
    y = near_copies(seed, K, min(n_c, K - 1), 10.0**log_delta, D, dtype)  # (K, D)
    m, info = geometric_median(y[None], torch.ones(1, K, dtype=torch.bool))
    assert info['converged'] and info['n_iter'] <= 30
    y64, m64 = y.double().numpy(), m[0].double().numpy()
    assert sum_dist(y64, m64) <= scipy_best(y64, (y64.mean(0), m64)) + f_tol(y, dtype)


# ---------------------------------------------------------------- caps and bad input
def test_cap_is_warned_and_noted():
    h, m, r, g = groups_of_3(0)
    with pytest.warns(RuntimeWarning, match='geometric group reference'):
        _, rw = hara_advantages(h, m, r, g, median_kw=dict(max_iter=1))
    assert any('max_iter=1' in n for n in rw.notes) and rw.novelty.ref_iters == 1
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        _, rw = hara_advantages(h, m, r, g)  # the defaults converge
    assert rw.novelty.group_reference == 'geometric' and 0 < rw.novelty.ref_iters < 200


def test_bad_group_reference_raises():
    h, m, r, g = groups_of_3(0)
    with pytest.raises(ValueError, match="group_reference must be 'geometric' or 'entrywise'"):
        hara_advantages(h, m, r, g, group_reference='median')
