"""Every option of the oracle is checked before any work: each key of `bary_kw`, `plan_kw` and
`median_kw` against its solver's range, a key the oracle sets itself or does not know refused by
name (the valid ones listed), `compute_dtype` float32 or float64, the flags `final_plans` and
`checked`, `hara_advantages`' other keyword arguments; `group_barycenters` checks its own settings;
the checked weight map refuses NaN; advantages whose weighted value overflows and meta tensors are
refused by name."""

import inspect
import math
import re
import numpy as np
import pytest
import torch

import hara_ref.engine.barycenters as bary
import hara_ref.engine.hara_engine as engine
import hara_ref.engine.novelty as novelty
from hara_ref.engine.barycenters import BARY_RANGES, group_barycenters
from hara_ref.engine.hara_engine import checked_hara_weights, hara_advantages
from hara_ref.engine.novelty import (
    NOVELTY_OPTIONS,
    OPTIONAL_SETTINGS,
    SOLVER_OF,
    SOLVER_SETTINGS,
    hara_novelty,
    novelty_options,
)
from hara_ref.trainer.step import TrainConfig, oracle_options


def batch(dtype=torch.float64, seed=0):
    "8 rollouts of 2 prompts, lengths 2..6, binary rewards with both outcomes in each prompt."
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(8, 6, 3, generator=g, dtype=torch.float64).to(dtype)  # (B, T, d)
    m = torch.arange(6) < torch.tensor([6, 5, 4, 6, 3, 6, 5, 2])[:, None]  # (B, T)
    return h, m, torch.tensor([0.0, 1.0] * 4, dtype=dtype), torch.arange(8) // 4


@pytest.fixture
def no_work(monkeypatch):
    "Reading the batch or starting a solve fails the test: an option must be refused before."

    def work(*a, **k):
        raise AssertionError('work started before the options were checked')

    for mod, name in (
        (engine, 'check_rollouts'),
        (novelty, 'check_rollouts'),
        (novelty, 'group_barycenters'),
        (novelty, 'exact_group_barycenters'),
        (bary, 'barycenter_problem'),
    ):
        monkeypatch.setattr(mod, name, work)


def refused_values(rule) -> list:
    "(value, error type) pairs that a `SOLVER_SETTINGS` rule refuses."
    if rule is bool:
        return [('yes', TypeError), (1, TypeError)]
    if rule == 'omega':
        return [(2.0, ValueError), (0.5, ValueError), (math.nan, ValueError), ('fast', TypeError)]
    if isinstance(rule, tuple):
        return [('nonsense', ValueError)]
    out = [('1', TypeError), (None, TypeError)] if rule.get('integer') else [('1', TypeError)]
    if rule.get('integer'):
        return out + [(rule['lo'] - 1, ValueError), (2.5, TypeError), (True, TypeError)]
    low = rule['lo'] if rule.get('open_low') else rule['lo'] - 1e-9  # just outside the range
    return out + [(low, ValueError), (math.nan, ValueError), (math.inf, ValueError)]


def where_kw(where: str, variant: str, kw: dict) -> dict:
    "The oracle's keyword arguments that send `kw` to dict `where` of solver `variant`."
    if where == 'bary_kw':
        return dict(bary_kw=kw, barycenter=variant)
    if where == 'plan_kw':
        return dict(plan_kw=kw, bary_kw=dict(solver=variant))
    return dict(median_kw=kw)


CASES = [
    (where, variant, key, value, err)
    for (where, variant), rules in SOLVER_SETTINGS.items()
    for key, rule in rules.items()
    for value, err in refused_values(rule)
    if not (value is None and key in OPTIONAL_SETTINGS)
]


SET_HERE = [  # (dict, solver, a keyword of that solver that hara_novelty sets itself)
    (where, variant, k)
    for (where, variant), fn in SOLVER_OF.items()
    for k in inspect.signature(fn).parameters
    if k not in SOLVER_SETTINGS[where, variant]
]


@pytest.mark.parametrize('where, variant, key', SET_HERE, ids=['-'.join(x) for x in SET_HERE])
def test_every_other_keyword_of_the_solvers_is_refused_as_set_here(no_work, where, variant, key):
    "Each solver keyword outside the table is one the oracle sets: refused, where to give it said."
    own = key in NOVELTY_OPTIONS  # alpha, L_b, reg, normalize: hara_novelty's own arguments
    said = f"'s own argument {key}: give it there" if own else ' itself'
    with pytest.raises(
        ValueError, match=re.escape(f"{where}[{key!r}] is set by hara_novelty{said}")
    ):
        hara_advantages(*batch(), **where_kw(where, variant, {key: 1.0}))


@pytest.mark.parametrize('entry', ['hara_advantages', 'hara_novelty'])
@pytest.mark.parametrize(
    'where, variant, key, value, err', CASES, ids=[f"{w}-{v}-{k}={x!r}" for w, v, k, x, _ in CASES]
)
def test_every_solver_setting_is_checked_before_any_work(
    no_work, entry, where, variant, key, value, err
):
    fn = hara_advantages if entry == 'hara_advantages' else hara_novelty
    kw = where_kw(where, variant, {key: value})
    with pytest.raises(err, match='^' + re.escape(f"{where}[{key!r}]")):
        fn(*batch(), **kw)


@pytest.mark.parametrize('where, variant', list(SOLVER_SETTINGS))
def test_an_unknown_key_is_refused_with_the_valid_ones_named(no_work, where, variant):
    typo = 'max_itr' if where != 'plan_kw' else 'num_iter'
    with pytest.raises(ValueError, match=f"^{where} has an unknown key '{typo}'") as e:
        hara_advantages(*batch(), **where_kw(where, variant, {typo: 5}))
    for key in SOLVER_SETTINGS[where, variant]:
        assert key in str(e.value)


def test_exact_barycenter_takes_only_its_own_settings(no_work):
    "`inner_iter` is a setting of the linearized barycenter: under 'exact' it is refused, named."
    msg = "bary_kw has an unknown key 'inner_iter': exact_group_barycenters"
    with pytest.raises(ValueError, match=msg):
        hara_advantages(*batch(), barycenter='exact', bary_kw=dict(inner_iter=20))


@pytest.mark.parametrize(
    'dtype, err, said',
    [
        (torch.bfloat16, ValueError, '100 eps = 0.78'),
        (torch.float16, ValueError, '100 eps = 0.098'),
        (torch.int64, ValueError, 'need a real floating dtype'),
        (torch.complex128, ValueError, 'need a real floating dtype'),
        ('bfloat16', ValueError, '100 eps = 0.78'),
        ('banana', TypeError, "got str 'banana'"),
        (np.float64, TypeError, 'got type'),
        (64, TypeError, 'got int 64'),
    ],
)
def test_compute_dtype_is_float32_or_float64(no_work, dtype, err, said):
    with pytest.raises(err, match='^compute_dtype must be torch.float64, torch.float32') as e:
        hara_advantages(*batch(), compute_dtype=dtype)
    assert said in str(e.value)


@pytest.mark.parametrize('name', ['final_plans', 'checked'])
@pytest.mark.parametrize('bad', ['yes', None, 1])
def test_flags_are_true_or_false(no_work, name, bad):
    with pytest.raises(TypeError, match=f"^{name} must be True or False"):
        hara_novelty(*batch(), **{name: bad})


def test_hara_advantages_refuses_options_it_cannot_pass_on(no_work):
    with pytest.raises(TypeError, match="unknown option 'kapa'") as e:
        hara_advantages(*batch(), kapa=2.0)
    assert all(k in str(e.value) for k in NOVELTY_OPTIONS)
    for k in ('keep', 'checked'):
        with pytest.raises(TypeError, match=f"sets hara_novelty's {k} itself"):
            hara_advantages(*batch(), **{k: True})


@pytest.mark.filterwarnings('ignore::RuntimeWarning')  # a float32 solve, Sinkhorn: caps noted
def test_good_settings_at_their_edges_run_and_agree():
    "Edge values (0 where 0 is allowed, 'auto', None, numpy and torch numbers, dtype names) run."
    h, m, r, g = batch()
    ref, _ = hara_advantages(h, m, r, g)
    same = [
        dict(compute_dtype='float64'),
        dict(bary_kw=dict(max_iter=np.int64(2000), tol=torch.tensor(1e-5), inner_iter=None)),
        dict(plan_kw=dict(stop_thr=np.float64(1e-6), num_iter_max=5000, warn=False)),
        dict(median_kw=dict(tol=1e-9, max_iter=200)),
    ]
    for kw in same:
        torch.testing.assert_close(hara_advantages(h, m, r, g, **kw)[0], ref)
    for kw in (
        dict(bary_kw=dict(anderson=0, inner_rtol=0.0, trials=None, warn=True)),
        dict(bary_kw=dict(solver='sinkhorn', omega='auto'), plan_kw=dict(omega=1.5)),
        dict(plan_kw=dict(stop_thr=0.0)),  # floored at the rounding level
        dict(compute_dtype=torch.float32),
        dict(compute_dtype=None),
    ):
        assert torch.isfinite(hara_advantages(h, m, r, g, **kw)[0]).all()


def test_novelty_options_is_the_check_and_keeps_hara_novelties_defaults():
    "The data-free check other callers (HaraConfig) use: plain values back, the same defaults."
    o = novelty_options(metric='w', alpha=np.float32(0.7), L_b=torch.tensor(8))
    assert (o['alpha'], o['L_b'], type(o['L_b'])) == (0.0, 8, int)
    assert o['bary_kw'] == o['plan_kw'] == o['median_kw'] == {}
    assert novelty_options() == {**NOVELTY_OPTIONS, 'bary_kw': {}, 'plan_kw': {}, 'median_kw': {}}
    assert NOVELTY_OPTIONS['compute_dtype'] is torch.float64
    with pytest.raises(TypeError, match="^unknown option 'kapa'"):
        novelty_options(kapa=1.0)


# ---------------------------------------------------------------- group_barycenters' own settings
BARY_CASES = [
    (k, v)
    for k, rule in BARY_RANGES.items()
    for v, _ in refused_values(rule)
    if not (v is None and k in OPTIONAL_SETTINGS)
]


@pytest.mark.parametrize('key, value', BARY_CASES, ids=[f"{k}={v!r}" for k, v in BARY_CASES])
def test_group_barycenters_checks_every_setting_before_work(monkeypatch, key, value):
    "`reg=0` ran for minutes, `anderson=-1` ended in an IndexError, `inner_iter=0` ran to the cap."
    monkeypatch.setattr(bary, 'barycenter_problem', lambda *a, **k: 1 / 0)
    h, m, _, _ = batch()
    with pytest.raises((ValueError, TypeError), match=f"^{key} must be"):
        group_barycenters(h, m, torch.zeros(8, dtype=torch.long), **{key: value})


# ---------------------------------------------------------------- the trainer's oracle options
def test_train_config_refuses_what_the_oracle_would():
    "A plan cap under the exact barycenter ran into a TypeError at the first step; now refused."
    with pytest.raises(ValueError, match='plan_iters caps Newton or Sinkhorn steps'):
        TrainConfig(reweight='hara-tok', barycenter='exact', plan_iters=20)
    cfg = TrainConfig(reweight='hara-seq', barycenter='exact', bary_iters=3)
    assert oracle_options(cfg)['bary_kw'] == dict(max_iter=3)
    novelty_options(**oracle_options(TrainConfig(reweight='hara-tok', plan_iters=7)))
    TrainConfig(reweight='shear', barycenter='exact', plan_iters=20)  # SHEAR's plans: a cap


# ---------------------------------------------------------------- weights, overflow, meta tensors
@pytest.mark.parametrize('where', ['x', 'A'])
@pytest.mark.parametrize('bad', [math.nan, math.inf])
@pytest.mark.parametrize('shape', [(4,), (4, 3)])
def test_checked_weights_refuse_nan_novelty_and_advantages(where, bad, shape):
    x, A = torch.rand(shape, dtype=torch.float64) * 2, torch.tensor([1.0, -1.0, 0.5, -2.0])
    (x if where == 'x' else A)[1] = bad
    with pytest.raises(ValueError, match=f"^{where} has NaN/Inf"):
        checked_hara_weights(x, A)


def test_checked_weights_refuse_mismatched_shapes():
    with pytest.raises(ValueError, match='^x must be a floating'):
        checked_hara_weights(torch.rand(3, 2), torch.ones(4))
    with pytest.raises(ValueError, match='^A must be a floating'):
        checked_hara_weights(torch.rand(4, 2), torch.ones(4, 1))


@pytest.mark.parametrize('dtype, big', [(torch.float64, 1e308), (torch.float32, 3e38)])
def test_finite_advantages_never_become_inf(dtype, big):
    "±1e308 times a weight up to w_max = 2 is not a float64: refused, not returned as ±inf."
    h, m, r, g = batch(dtype)
    A = torch.tensor([big, -big] * 4, dtype=dtype)  # (B,)
    with pytest.raises(ValueError, match=f'overflow {dtype}'):
        hara_advantages(h, m, r, g, advantages=A)
    with pytest.raises(ValueError, match=f'overflow {dtype}'):
        engine.reweight_advantages('hara-seq', h, m, r, g, advantages=A)
    adv, _ = hara_advantages(h, m, r, g, advantages=A, kappa=0.0)  # weights 1: nothing overflows
    torch.testing.assert_close(adv, A[:, None] * m)
    adv, _ = hara_advantages(h, m, r, g, advantages=A / 4)  # a quarter: up to big / 2, finite
    assert torch.isfinite(adv).all()


@pytest.mark.parametrize(
    'name', ['hidden', 'mask', 'rewards', 'group_ids', 'advantages', 'boundaries', 'outcomes']
)
def test_a_meta_tensor_is_refused_by_name(name):
    h, m, r, g = batch()
    args = dict(hidden=h, mask=m, rewards=r, group_ids=g, granularity='span')
    args.update(advantages=r - 0.5, boundaries=torch.zeros_like(m), outcomes=r)
    args[name] = args[name].to('meta')
    with pytest.raises(ValueError, match=f"^{name} is on the meta device"):
        hara_advantages(**args)


def test_a_meta_tensor_is_refused_by_the_novelty_and_the_weight_map():
    h, m, r, g = batch()
    with pytest.raises(ValueError, match='^keep is on the meta device'):
        hara_novelty(h, m, r, g, keep=torch.ones(8, dtype=torch.bool, device='meta'))
    with pytest.raises(ValueError, match='^x is on the meta device'):
        checked_hara_weights(torch.ones(2, 3, device='meta'), torch.ones(2))
