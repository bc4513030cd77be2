"""Every iterative solver reports its cap: `converged`/`n_iter`, one warning, a line in its caller's
notes."""

import warnings
import pytest
import torch

from hara_ref.ot.entropic import ConvergenceWarning, sinkhorn_reference, semidual_reference
from hara_ref.engine.sinkhorn import SinkhornConvergenceWarning
from hara_ref.engine.ot_checks import (
    checked_sinkhorn_reference,
    checked_semidual_reference,
    checked_fgw,
)
from hara_ref.ot.fgw import fgw, fgw2, rollout_pair
from hara_ref.ot.fgw_barycenter import fgw_barycenter
from hara_ref.ot.fgw import chain_structure
from hara_ref.engine.barycenters import group_barycenters
from hara_ref.engine.novelty import _cap_notes
from hara_ref.engine.baselines import shear_weights, shear_advantages
from hara_ref.rlvr.data import planted_stage_rollouts


def no_warning(fn):
    "Run fn with every warning an error: a normal problem at the defaults must not warn."
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        return fn()


def planted_problem(dtype=torch.float64):
    "One rollout's tokens against every third of them: block-structured costs (slow Sinkhorn)."
    pr = planted_stage_rollouts(K=2, seed=0, dtype=dtype)
    h = torch.nn.functional.normalize(pr.hidden[0][pr.mask[0]], dim=-1)  # (L, d)
    M = torch.cdist(h, h[::3]) ** 2  # (L, m)
    n, m = M.shape
    return torch.full((n,), 1 / n, dtype=dtype), torch.full((m,), 1 / m, dtype=dtype), M


def test_one_warning_class_for_both_filters():
    assert issubclass(ConvergenceWarning, UserWarning)
    assert issubclass(ConvergenceWarning, RuntimeWarning)
    assert issubclass(SinkhornConvergenceWarning, ConvergenceWarning)


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_sinkhorn_reference_cap(dtype):
    a, b, M = planted_problem(dtype)
    msg = r'sinkhorn_reference: stopped at num_iter_max=1 with marginal error'
    with pytest.warns(ConvergenceWarning, match=msg):
        _, lg = sinkhorn_reference(a, b, M, 0.05, num_iter_max=1, log=True)
    assert lg['converged'] is False and lg['n_iter'] == 1 and lg['err'] >= lg['stop_thr']
    # float32 too: the floor keeps the default stop_thr reachable
    _, lg = no_warning(lambda: sinkhorn_reference(a, b, M, 0.05, log=True))
    assert lg['converged'] is True and lg['err'] < lg['stop_thr']
    n_iter = no_warning(lambda: sinkhorn_reference(a, b, M, 0.05))[1]
    assert isinstance(n_iter, int)  # default return: (plan, n_iter)


@pytest.mark.parametrize('solve', [checked_sinkhorn_reference, checked_semidual_reference])
def test_reference_solvers_refuse_unequal_totals(solve):
    "The reference solvers' checked twins (chapter 36_ot_checks) refuse unequal totals."
    a, b, M = planted_problem()
    with pytest.raises(ValueError, match=r'a sums in \[1, 1\], b sums in \[1\.5, 1\.5\]'):
        solve(a, 1.5 * b, M, 0.05)
    with pytest.raises(ValueError, match='a sums in'):  # far above float64's tolerance (1e-7)
        solve(a * (1 + 1e-5), b, M, 0.05)


def test_semidual_reference_cap():
    a, b, M = planted_problem()
    msg = 'semidual_reference: stopped at max_iter=1 Newton steps'
    with pytest.warns(ConvergenceWarning, match=msg):
        _, lg = semidual_reference(a, b, M, 0.05, max_iter=1, log=True)
    assert lg['converged'] is False and lg['n_iter'] == 1  # the steps it took, not one fewer
    _, steps = semidual_reference(a, b, M, 0.05, max_iter=2, warn=False)
    assert steps == 2
    _, lg = no_warning(lambda: semidual_reference(a, b, M, 0.05, log=True))
    assert lg['converged'] is True and lg['n_iter'] < 100


def test_fgw_cap():
    pr = planted_stage_rollouts(K=2, seed=1, p_skip=0.2, p_repeat=0.2)
    M, C1, C2 = rollout_pair(pr.hidden, pr.mask, 0, 1)
    msg = r'fgw: stopped at max_iter=1 Frank-Wolfe iterations with objective change'
    with pytest.warns(ConvergenceWarning, match=msg):
        _, lg = fgw(M, C1, C2, max_iter=1, log=True)
    assert lg['converged'] is False and lg['n_iter'] == 1
    with pytest.warns(ConvergenceWarning, match='fgw: stopped at max_iter=1'):
        fgw2(M, C1, C2, max_iter=1)
    _, lg = no_warning(lambda: fgw(M, C1, C2, log=True))
    assert lg['converged'] is True and lg['n_iter'] < 10000
    with pytest.raises(ValueError, match='max_iter must be an integer >= 1, got 0'):
        checked_fgw(M, C1, C2, max_iter=0)  # the lesson's `fgw` takes a valid cap


def test_fgw_barycenter_reports_inner_caps_once():
    g = torch.Generator().manual_seed(0)
    H = torch.randn(5, 3, generator=g, dtype=torch.float64)  # (5, 3)
    C = chain_structure(torch.linspace(0, 1, 5, dtype=torch.float64))  # (5, 5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        lg = fgw_barycenter(
            [H, H.flip(0)], [C] * 2, L_b=5, log=True, fgw_kwargs=dict(max_iter=1, tol_rel=0.0)
        )[2]
    inner = [w for w in caught if 'FGW plans of the last iteration' in str(w.message)]
    assert lg['fgw_unconverged'] == 2 and len(inner) == 1
    assert inner[0].category is ConvergenceWarning
    assert not any(str(w.message).startswith('fgw: ') for w in caught)  # the inner solver is quiet
    lg = no_warning(lambda: fgw_barycenter([H, H.flip(0)], [C] * 2, L_b=5, log=True)[2])
    assert lg['converged'] and lg['fgw_unconverged'] == 0


def test_group_barycenters_final_plans_cap():
    pr = planted_stage_rollouts(K=4, seed=0)
    one = torch.zeros(4, dtype=torch.long)
    with pytest.warns(ConvergenceWarning, match='final plans stopped at their cap'):
        final = dict(num_iter_max=1, stop_thr=1e-12)
        _, info = group_barycenters(pr.hidden, pr.mask, one, L_b=8, final_plans_kw=final)
    assert info['final_unconverged'] > 0
    with pytest.warns(ConvergenceWarning, match='groups not converged in 1 iterations'):
        group_barycenters(pr.hidden, pr.mask, one, L_b=8, max_iter=1)


def test_exact_fgw_caps_are_noted():
    info = dict(converged=True, converged_group=torch.ones(1, dtype=torch.bool), fgw_unconverged=3)
    assert _cap_notes(info, dict(max_iter=200, tol=1e-9), None, 'exact') == [
        "exact barycenter: 3 FGW plans of the last iterations stopped at fgw's max_iter"
    ]


def shear_batch():
    "One prompt, planted rollouts of about 40 tokens, two outcomes."
    p = planted_stage_rollouts(K=4, stage_len=(5, 9), seed=0)
    r = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)  # (4,)
    return p.hidden, p.mask, r, torch.zeros(4, dtype=torch.long)


def test_shear_defaults_converge_without_warning():
    h, m, r, g = shear_batch()
    assert 35 <= float(m.sum(-1).double().mean()) <= 45
    w, info = no_warning(lambda: shear_weights(h, m, r, g, log=True))
    assert info['windows'] > 0 and info['unconverged'] == 0
    _, rw = no_warning(lambda: shear_advantages(h, m, r, g))
    assert not any('SHEAR' in n for n in rw.notes)
    # Sinkhorn at the same stop_thr and 200 iterations leaves window problems at the cap (counted)
    _, info_s = shear_weights(
        h, m, r, g, solver='sinkhorn', plan_kw=dict(num_iter_max=200), log=True, warn=False
    )
    assert info_s['unconverged'] > 0


def test_shear_cap_is_warned_once_and_noted():
    h, m, r, g = shear_batch()
    w = shear_weights(h, m, r, g)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        adv, rw = shear_advantages(h, m, r, g, plan_kw=dict(num_iter_max=1))
    caps = [x for x in caught if issubclass(x.category, ConvergenceWarning)]
    assert len(caps) == 1 and 'window OT problems stopped at num_iter_max=1' in str(caps[0].message)
    note = [n for n in rw.notes if n.startswith('SHEAR: ')]
    assert len(note) == 1 and 'stopped at num_iter_max=1 (newton)' in note[0]
    assert float((rw.weights - w).abs().max()) > 0.05  # the capped weights are visibly off
    msg = r'shear_weights: SHEAR: \d+ of \d+ window OT problems'
    with pytest.warns(ConvergenceWarning, match=msg):
        shear_weights(h, m, r, g, solver='sinkhorn', plan_kw=dict(num_iter_max=1))
    with pytest.raises(ValueError, match="solver must be 'newton' or 'sinkhorn'"):
        shear_weights(h, m, r, g, solver='emd')
