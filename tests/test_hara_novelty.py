"""Novelty relative to the group, converged defaults, notes and warnings on caps, and bad input in
the oracle path (chapters 11_rollouts, 12_novelty, 13_hara, 42_hara_engine, 38_checks)."""

import warnings
import numpy as np
import pytest
import torch

from hara_ref.hara.novelty import (
    local_assignment,
    stage_versions,
    version_excess,
    relative_to_group,
)
from hara_ref.engine.hara_engine import hara_advantages
from hara_ref.engine.novelty import hara_novelty, BARY_DEFAULTS, PLAN_DEFAULTS
from hara_ref.ot.lfgw import lifted_cost
from hara_ref.hara.rollouts import group_median, group_mean, outcome_groups
from hara_ref.engine.checks import group_geometric_median
from hara_ref.ot.fgw import chain_positions, normalize_features
from hara_ref.ot.lfgw import lift
from hara_ref.rlvr.data import planted_stage_rollouts


def gauss_batch(seed, P=4, K=8, T=64, d=32, dtype=torch.float64):
    """i.i.d. Gaussian hidden states, lengths 20 to 64, random binary rewards: no structure, the
    slowest barycenters."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(P * K, T, d, generator=g, dtype=dtype)
    L = torch.randint(20, T + 1, (P * K,), generator=g)
    return (
        h,
        torch.arange(T) < L[:, None],
        (torch.rand(P * K, generator=g) < 0.5).to(dtype),
        torch.arange(P).repeat_interleave(K),
    )


def planted_batch(seed, P=4, K=8, d=32, dtype=torch.float64):
    """P prompts of K planted-stage rollouts (stages skipped and swapped at random), random binary
    rewards."""
    prs = [
        planted_stage_rollouts(
            K=K, n_stages=6, d=d, seed=100 * seed + p, dtype=dtype, p_skip=0.1, p_swap=0.1
        )
        for p in range(P)
    ]
    T = max(pr.mask.shape[1] for pr in prs)
    h = torch.zeros(P * K, T, d, dtype=dtype)
    m = torch.zeros(P * K, T, dtype=torch.bool)
    for p, pr in enumerate(prs):
        h[p * K : (p + 1) * K, : pr.mask.shape[1]] = pr.hidden
        m[p * K : (p + 1) * K, : pr.mask.shape[1]] = pr.mask
    r = (torch.rand(P * K, generator=torch.Generator().manual_seed(seed)) < 0.5).to(dtype)
    return h, m, r, torch.arange(P).repeat_interleave(K)


def tighter(f=100.0):
    """The defaults made `f` times tighter (barycenter tolerance, inner and final Sinkhorn
    tolerances), with room to get there."""
    return dict(
        bary_kw=dict(
            tol=BARY_DEFAULTS['tol'] / f,
            max_iter=50 * BARY_DEFAULTS['max_iter'],
            inner_iter=10 * BARY_DEFAULTS['inner_iter'],
            stop_thr=1e-7 / f,
        ),
        plan_kw=dict(
            stop_thr=PLAN_DEFAULTS['stop_thr'] / f,
            num_iter_max=10 * PLAN_DEFAULTS['num_iter_max'],
        ),
    )


# ---------------------------------------------------------------- converged by default
@pytest.mark.parametrize('make,seed', [(gauss_batch, 0), (planted_batch, 0)])
def test_default_weights_are_converged(make, seed):
    """Default call vs a solve 100 times tighter: no token weight moves by more than 5e-4 (2 prompts
    x 8 rollouts; the math page's table: up to about 1e-4 on such batches)."""
    h, m, r, g = make(seed, P=2)
    with warnings.catch_warnings():
        # planted data: the final plans of a few rollouts stop at their cap (a note)
        warnings.simplefilter('ignore', RuntimeWarning)
        _, rw = hara_advantages(h, m, r, g)
        _, rt = hara_advantages(h, m, r, g, **tighter())
    # the barycenter itself converged
    assert not any('linearized barycenter' in n for n in rw.notes), rw.notes
    assert float((rw.weights - rt.weights).abs()[m].max()) <= 5e-4


def test_caps_are_noted_and_warned():
    h, m, r, g = gauss_batch(1)
    with pytest.warns(RuntimeWarning, match='stopped at max_iter=3'):
        _, rw = hara_advantages(h, m, r, g, bary_kw=dict(max_iter=3))
    assert any('max_iter=3' in n for n in rw.notes) and any(
        'max_iter=3' in n for n in rw.novelty.notes
    )
    with pytest.warns(RuntimeWarning, match='final plans'):
        # the plain outer step moves Z once after its last plans (the quasi-Newton step stops at
        # the point its plans were solved for, so one step already meets the tolerance there)
        kw = dict(bary_kw=dict(outer='plain'), plan_kw=dict(num_iter_max=1, stop_thr=1e-12))
        _, rw = hara_advantages(h, m, r, g, **kw)
    assert any('final plans' in n for n in rw.notes)


# ---------------------------------------------------------------- the group reference
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
@pytest.mark.parametrize('gran', ['seq', 'tok', 'span'])
def test_identical_rollouts_get_weight_one(dtype, gran):
    pr = planted_stage_rollouts(K=1, n_stages=6, d=16, seed=3, dtype=dtype)
    h, m = pr.hidden.expand(6, -1, -1), pr.mask.expand(6, -1)
    r = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0], dtype=dtype)
    kw = dict(span_len=3) if gran == 'span' else {}
    _, rw = hara_advantages(h, m, r, torch.zeros(6, dtype=torch.long), granularity=gran, **kw)
    torch.testing.assert_close(
        rw.weights[m], torch.ones(int(m.sum()), dtype=dtype), atol=1e-6, rtol=0
    )
    n = rw.novelty.n_tok[0][m[0]]
    # the token costs themselves vary: the weights are 1 because the group is compared with itself
    assert float(n.max() / n.min()) > 2
    _, old = hara_advantages(
        h, m, r, torch.zeros(6, dtype=torch.long), granularity=gran, reference='barycenter', **kw
    )
    # the barycenter ratio does not have this property
    if gran != 'seq':
        assert float((old.weights - 1).abs()[m].max()) > 0.3


def one_changed_span(dtype=torch.float64, K=8):
    """K copies of a planted rollout per outcome group (2 groups); in copy 1 of each, a whole stage
    visit replaced by a novel stage."""
    base = planted_stage_rollouts(K=1, n_stages=6, d=16, seed=0, dtype=dtype)
    nov = planted_stage_rollouts(K=1, n_stages=6, d=16, seed=0, substitute=(0, 3), dtype=dtype)
    L = int(base.mask[0].sum())
    st = base.stages[0, :L]
    starts = torch.nonzero(torch.diff(st) != 0).flatten() + 1
    s0, s1 = int(starts[2]), int(starts[3])  # the 4th stage visit
    novel_tok = nov.hidden[0][nov.stages[0] == 6]
    h = base.hidden.repeat(2 * K, 1, 1)
    span = torch.zeros(2 * K, h.shape[1], dtype=torch.bool)
    for i in (1, K + 1):
        h[i, s0:s1] = novel_tok[torch.arange(s1 - s0) % len(novel_tok)]
        span[i, s0:s1] = True
    return (
        h,
        base.mask.expand(2 * K, -1),
        (torch.arange(2 * K) < K).to(dtype),
        torch.zeros(2 * K, dtype=torch.long),
        span,
    )


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
@pytest.mark.parametrize('gran', ['tok', 'span'])
def test_one_changed_span(dtype, gran):
    """Only the changed span is reweighted: the clip on it, 1 (to 5e-3) on the rest of its rollout,
    exactly 1 on the unchanged copies."""
    h, m, r, g, span = one_changed_span(dtype)
    K = len(r) // 2
    kw = dict(span_len=2) if gran == 'span' else {}
    _, rw = hara_advantages(h, m, r, g, granularity=gran, **kw)
    w = rw.weights
    # correct novel: largest push; wrong novel: smallest penalty
    for i, clip in ((1, 2.0), (K + 1, 0.5)):
        on, off = span[i], m[i] & ~span[i]
        if gran == 'tok':
            assert (w[i][on] == clip).all()
        # a window straddling the span's edge mixes in an unchanged token
        else:
            assert (w[i][on] - 1).abs().min() >= 0.4
        assert (
            float(
                (w[i] - 1)
                .abs()[off if gran == 'tok' else off & ~span[i].roll(1) & ~span[i].roll(-1)]
                .max()
            )
            <= 5e-3
        )
    copies = [k for k in range(2 * K) if k not in (1, K + 1)]
    assert (w[copies] == 1).all()  # bit for bit: the group reference is the copies' own version


def test_one_changed_span_the_plans_would_leak():
    """The same comparison built on the balanced plans' rows moves the unchanged tokens of the
    changed rollout (why q is local)."""
    h, m, r, g, span = one_changed_span()
    nov = hara_novelty(h, m, r, g)
    # versions from the final plans instead of the local assignment
    from hara_ref.engine.barycenters import group_barycenters

    gc = torch.where(
        nov.computed, torch.searchsorted(torch.unique(nov.og[nov.computed]), nov.og), -1
    )
    _, info = group_barycenters(h, m, gc, final_plans_kw=dict(PLAN_DEFAULTS), **BARY_DEFAULTS)
    phi = lift(normalize_features(h, how='unit'), chain_positions(m, h.dtype), 0.25)
    P = info['plans']
    y = stage_versions(P, phi)
    _, e, _ = version_excess(P, y, group_median(y, nov.og, nov.computed), m)
    x = relative_to_group(e, nov.nbar, m)
    # the plan rows of unchanged tokens moved
    assert float((x[1] - 1).abs()[m[1] & ~span[1]].max()) > 0.3
    # the local assignment's did not
    assert float((nov.excess[1] / nov.nbar[1]).abs()[m[1] & ~span[1]].max()) < 1e-3


def test_batched_stage_novelty_equals_reference():
    """The batched path in `hara_novelty` equals the reference functions on dense, normalised,
    lifted tokens (padded batch, 2 prompts)."""
    h, m, r, g = planted_batch(1, P=2)
    nov = hara_novelty(h, m, r, g)
    gc = torch.where(
        nov.computed, torch.searchsorted(torch.unique(nov.og[nov.computed]), nov.og), 0
    )
    hn, tau = normalize_features(h, how='unit'), chain_positions(m, torch.float64)
    C = lifted_cost(hn, tau, nov.barycenters[gc], nov.tau_bar, 0.25) * m[..., None]  # (B, T, L_b)
    q = local_assignment(C, m, 0.05) * nov.computed[:, None, None]
    y = stage_versions(q, lift(hn, tau, 0.25))
    # the default reference
    nu, e, e_seq = version_excess(q, y, group_geometric_median(y, nov.og, nov.computed)[0], m)
    torch.testing.assert_close(nov.stage_nov, nu * nov.computed[:, None], atol=1e-10, rtol=1e-8)
    torch.testing.assert_close(nov.excess, e, atol=1e-10, rtol=1e-8)
    torch.testing.assert_close(nov.excess_seq, e_seq, atol=1e-10, rtol=1e-8)
    # the sequence level is the token level's mean, and nothing is less novel than typical
    x_tok, x_seq = (
        relative_to_group(nov.excess, nov.nbar, m),
        relative_to_group(nov.excess_seq, nov.nbar, m),
    )
    L = m.sum(-1)
    torch.testing.assert_close(
        (x_tok.sum(-1) / L)[nov.computed], x_seq[nov.computed], atol=1e-12, rtol=1e-10
    )
    assert (x_tok[m] >= 1).all() and (nov.excess >= 0).all()


def test_group_median_ragged_groups_and_missing():
    v = torch.tensor([[1.0, 5.0], [3.0, torch.nan], [2.0, 7.0], [9.0, 9.0], [4.0, 0.0]])  # (B=5, 2)
    og = torch.tensor([0, 0, 0, 1, 1])
    member = torch.tensor([True, True, True, True, False])
    med = group_median(v, og, member)
    # nan skipped: (5+7)/2; non-member 0
    torch.testing.assert_close(
        med, torch.tensor([[2.0, 6.0], [2.0, 6.0], [2.0, 6.0], [9.0, 9.0], [0.0, 0.0]])
    )


def test_group_mean():
    v = torch.tensor([[1.0, 2.0], [3.0, 4.0], [10.0, 10.0], [5.0, 6.0]])
    og, member = torch.tensor([0, 0, 0, 1]), torch.tensor([True, True, False, True])
    torch.testing.assert_close(
        group_mean(v, og, member), torch.tensor([[2.0, 3.0], [2.0, 3.0], [2.0, 3.0], [5.0, 6.0]])
    )


# ---------------------------------------------------------------- bad input in the oracle path
def small():
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(4, 6, 3, generator=g, dtype=torch.float64),
        torch.ones(4, 6, dtype=torch.bool),
        torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64),
        torch.zeros(4, dtype=torch.long),
    )


def test_prompt_ids_beyond_2_53_stay_apart():
    ids = torch.tensor([2**60, 2**60, 2**60 + 1, 2**60 + 1])
    og, sizes = outcome_groups(torch.ones(4), ids)
    assert og.tolist() == [0, 0, 1, 1] and sizes.tolist() == [2, 2]
    h, m, r, _ = small()
    a_big, _ = hara_advantages(h, m, torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64), ids)
    a_small, _ = hara_advantages(
        h, m, torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64), torch.tensor([0, 0, 1, 1])
    )
    torch.testing.assert_close(a_big, a_small)


def test_non_binary_rewards_are_grouped_by_exact_value_and_noted():
    h, m, _, g = small()
    _, rw = hara_advantages(h, m, torch.tensor([0.5, 0.5, 0.25, 1.0], dtype=torch.float64), g)
    assert any('not binary' in n for n in rw.notes)
    assert rw.novelty.og.tolist() == [1, 1, 0, 2]
    _, rw = hara_advantages(h, m, torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64), g)
    assert any('alone in its outcome group' in n for n in rw.notes) and torch.equal(
        rw.weights, torch.ones_like(rw.weights)
    )


def test_zero_hidden_states_raise():
    h, m, r, g = small()
    h[1, 2] = 0.0
    with pytest.raises(ValueError, match='all zero on a real token'):
        hara_advantages(h, m, r, g)
    h[:] = 0.0
    with pytest.raises(ValueError, match='degenerate'):
        hara_novelty(h, m, r, g)
    # zero on padding is fine
    m[1, 2:] = False
    h = torch.randn(4, 6, 3, dtype=torch.float64)
    h[1, 3] = 0.0
    assert torch.isfinite(hara_advantages(h, m, r, g)[0]).all()


def test_numpy_inputs_and_scalar_options_are_accepted():
    h, m, r, g = small()
    a, _ = hara_advantages(h, m, r, g)
    a_np, _ = hara_advantages(h.numpy(), m.numpy(), r.numpy(), g.numpy())
    torch.testing.assert_close(a_np, a)
    for reg in (np.float64(0.05), np.array(0.05)):
        torch.testing.assert_close(hara_advantages(h, m, r, g, reg=reg)[0], a)
    # a float32 tensor holds 0.05 only to 7e-10: another regulariser, the same answer to the
    # solver's precision (the barycenter's tol)
    a32, _ = hara_advantages(h, m, r, g, reg=torch.tensor(0.05))
    torch.testing.assert_close(a32, a, atol=1e-5, rtol=0)
    torch.testing.assert_close(hara_advantages(h, m, r, g, alpha=np.float32(0.25))[0], a)
    for bad in (0.0, -1.0, float('nan'), float('inf'), torch.tensor([0.1, 0.2])):
        with pytest.raises(ValueError, match='reg must be'):
            hara_advantages(h, m, r, g, reg=bad)
    with pytest.raises(TypeError, match='reg must be'):
        hara_advantages(h, m, r, g, reg='x')
    with pytest.raises(ValueError, match='alpha must be'):
        hara_advantages(h, m, r, g, alpha=1.5)


def test_notes_speak_of_rewards_only_when_the_rewards_form_the_groups():
    "Graded rewards get a note on exact equality; given outcome labels (any values) get none."
    import hara_ref

    g = torch.Generator().manual_seed(0)
    h = torch.randn(4, 5, 3, generator=g, dtype=torch.float64)  # (B, T, d)
    m = torch.ones(4, 5, dtype=torch.bool)  # (B, T)
    r = torch.tensor([0.3, 0.7, 0.2, 0.9], dtype=torch.float64)  # (B,) graded, all distinct
    gid = torch.zeros(4, dtype=torch.long)  # (B,)
    by_rewards = hara_ref.hara_novelty(h, m, r, gid).notes
    assert any(n.startswith('rewards are not binary (4 distinct values)') for n in by_rewards)
    given = hara_ref.hara_novelty(h, m, r, gid, outcomes=torch.tensor([7, 7, -1, -1])).notes
    assert not any('reward' in n for n in given), given
