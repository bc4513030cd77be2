"""Bad input to the oracle path (hara_advantages, hara_novelty, the baselines, HaraConfig):
each class of bad value raises an error naming the parameter; tiny, huge and grad-requiring
inputs give the documented results."""

import math
import numpy as np
import pytest
import torch

from hara_ref.engine.checks import check_scalar, span_ids
from hara_ref.ot.fgw import normalize_features
from hara_ref.engine.ot_checks import checked_normalize_features
from hara_ref.engine.bary_steps import feature_scales
from hara_ref.engine.hara_engine import checked_hara_weights
from hara_ref.engine.hara_engine import hara_advantages, reweight_advantages, REWEIGHTS
from hara_ref.engine.novelty import hara_novelty
from hara_ref.engine.baselines import (
    shear_weights,
    checked_entropy_weights,
    checked_position_weights,
)

F32_EPS, F64_EPS = torch.finfo(torch.float32).eps, torch.finfo(torch.float64).eps


def batch(dtype=torch.float64, seed=0):
    "8 rollouts of 2 prompts, lengths 2..6, binary rewards with both outcomes in each prompt."
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(8, 6, 3, generator=g, dtype=torch.float64).to(dtype)  # (B, T, d)
    m = torch.arange(6) < torch.tensor([6, 5, 4, 6, 3, 6, 5, 2])[:, None]  # (B, T)
    return h, m, torch.tensor([0.0, 1.0] * 4, dtype=dtype), torch.arange(8) // 4


# ---------------------------------------------------------------- numeric options
NOT_NUMBERS = ['1', None, True, [1.0], 1 + 0j]  # TypeError
BAD = [  # (option, bad value, error type)
    *[('kappa', v, TypeError) for v in NOT_NUMBERS],
    *[
        ('kappa', v, ValueError)
        for v in (math.inf, math.nan, -1.0, np.float64('inf'), torch.tensor([1.0, 2.0]))
    ],
    *[('w_min', v, ValueError) for v in (-0.1, 1.5, math.nan, math.inf)],
    ('w_min', '0.5', TypeError),
    *[('w_max', v, ValueError) for v in (0.5, math.inf, math.nan)],
    ('w_max', None, TypeError),
    *[('alpha', v, ValueError) for v in (-0.1, 1.5, math.nan)],
    ('alpha', '0.25', TypeError),
    *[('reg', v, ValueError) for v in (0.0, -1.0, math.inf)],
    ('reg', True, TypeError),
    *[('L_b', v, ValueError) for v in (0, -3)],
    *[('L_b', v, TypeError) for v in (2.5, 4.0, True, '8')],
    *[('span_len', v, ValueError) for v in (0, -1, np.int64(0))],
    *[('span_len', v, TypeError) for v in (2.5, 2.0, True, '2', torch.tensor(2.5))],
]


@pytest.mark.parametrize('name, bad, err', BAD, ids=[f"{n}={v!r}" for n, v, _ in BAD])
def test_bad_option_names_itself(name, bad, err):
    h, m, r, g = batch()
    kw = dict(granularity='span') if name == 'span_len' else {}
    with pytest.raises(err, match=f"^{name} must be"):
        hara_advantages(h, m, r, g, **kw, **{name: bad})


@pytest.mark.parametrize(
    'name, bad, err',
    [
        ('kappa', math.inf, ValueError),
        ('kappa', 'x', TypeError),
        ('w_max', math.nan, ValueError),
        ('active', torch.tensor([0.5, 1.0]), ValueError),
    ],
)
def test_hara_weights_bad_option(name, bad, err):
    with pytest.raises(err, match=f"^{name} must be"):
        checked_hara_weights(torch.ones(2, 3), torch.ones(2), **{name: bad})


def _entropy(rho):
    return checked_entropy_weights(torch.rand(2, 3), torch.ones(2, 3, dtype=torch.bool), rho)


def _position(lam):
    return checked_position_weights(torch.ones(2, 3, dtype=torch.bool), lam=lam)


@pytest.mark.parametrize(
    'call, name, bad, err',
    [
        (lambda v: shear_weights(*batch(), width=v), 'width', 2.5, TypeError),
        (lambda v: shear_weights(*batch(), stride=v), 'stride', 0, ValueError),
        (lambda v: shear_weights(*batch(), reg=v), 'reg', math.inf, ValueError),
        (_entropy, 'rho', math.nan, ValueError),
        (_entropy, 'rho', '0.2', TypeError),
        (_position, 'lam', math.inf, ValueError),
        (_position, 'lam', None, TypeError),
        (lambda v: hara_novelty(*batch(), L_b=v), 'L_b', 1.5, TypeError),
        (lambda v: hara_novelty(*batch(), keep=v), 'keep', torch.full((8,), 2), ValueError),
    ],
)
def test_baseline_and_novelty_options_name_themselves(call, name, bad, err):
    with pytest.raises(err, match=f"^{name} must be"):
        call(bad)


def test_good_scalars_of_every_kind_are_accepted():
    h, m, r, g = batch()
    a, _ = hara_advantages(h, m, r, g, granularity='span', span_len=2)
    for kw in (
        dict(kappa=np.float32(1), span_len=np.int64(2)),
        dict(kappa=torch.tensor(1.0), span_len=torch.tensor(2)),
        dict(kappa=1, w_min=torch.tensor([0.5]), span_len=2),
    ):
        torch.testing.assert_close(hara_advantages(h, m, r, g, granularity='span', **kw)[0], a)
    assert check_scalar('x', np.float64(0.5), 0, 1) == 0.5
    assert type(check_scalar('n', np.int64(3), 1, integer=True)) is int


def test_hara_config_reuses_the_checks():
    trl = pytest.importorskip('hara_ref.practice.trl')
    for kw, err, name in [
        (dict(kappa=math.inf), ValueError, 'kappa'),
        (dict(kappa='1'), TypeError, 'kappa'),
        (dict(clip=(0.5, math.inf)), ValueError, r'clip\[1\]'),
        (dict(clip=(math.nan, 2.0)), ValueError, r'clip\[0\]'),
        (dict(span_len=True), TypeError, 'span_len'),
        (dict(alpha=math.nan), ValueError, 'alpha'),
        (dict(reg=math.inf), ValueError, 'reg'),
        (dict(forward_batch_size=0), ValueError, 'forward_batch_size'),
    ]:
        with pytest.raises(err, match=f"^HaraConfig.{name}"):
            trl.HaraConfig(**kw)


# ---------------------------------------------------------------- masks and other 0/1 inputs
@pytest.mark.parametrize('bad', [0.5, 2, -1, math.nan, 2.0])
def test_mask_must_be_exactly_0_or_1(bad):
    h, m, r, g = batch()
    mm = m.to(torch.float64 if isinstance(bad, float) else torch.long).clone()  # numeric 0/1 mask
    ref = hara_advantages(h, m, r, g)[0]
    torch.testing.assert_close(hara_advantages(h, mm, r, g)[0], ref)  # 0/1 is accepted
    mm[3, 0] = bad
    with pytest.raises(ValueError, match='^mask must be boolean or hold only 0 and 1'):
        hara_advantages(h, mm, r, g)
    with pytest.raises(ValueError, match='^mask must be'):
        reweight_advantages('position', None, mm, r, g)


@pytest.mark.parametrize('bad', [0.5, 2, -1])
def test_boundaries_must_be_exactly_0_or_1(bad):
    m = torch.ones(1, 4, dtype=torch.bool)
    dtype = torch.float64 if isinstance(bad, float) else torch.long
    bnd = torch.tensor([[0, 0, bad, 0]], dtype=dtype)  # (1, T)
    with pytest.raises(ValueError, match='^boundaries must be boolean or hold only 0 and 1'):
        span_ids(m, boundaries=bnd)


def test_mask_with_holes_still_refused():
    h, m, r, g = batch()
    mm = m.clone()
    mm[0, 2] = False
    with pytest.raises(ValueError, match='holes'):
        hara_advantages(h, mm, r, g)


# ---------------------------------------------------------------- tiny and huge hidden states
# a float32 1e-20 entry squares to 1e-40, below the smallest normal float32: the plain norm loses it
@pytest.mark.parametrize(
    'dtype, c',
    [
        (torch.float64, 1e-30),
        (torch.float64, 1e-200),
        (torch.float64, 1e200),
        (torch.float32, 1e-20),
        (torch.float32, 1e-25),
        (torch.float32, 1e25),
    ],
)
@pytest.mark.parametrize('granularity', ['seq', 'tok'])
def test_advantages_are_scale_invariant(dtype, c, granularity):
    h, m, r, g = batch(dtype)
    a, _ = hara_advantages(h, m, r, g, granularity=granularity)
    a_c, _ = hara_advantages(h * c, m, r, g, granularity=granularity)
    eps = torch.finfo(dtype).eps  # c h rounds each entry once; the solves repeat it (100: a margin)
    assert (a_c - a).abs().max() <= 100 * eps * a.abs().max()


@pytest.mark.parametrize(
    'dtype, e',
    [(torch.float64, -1060), (torch.float64, 1000), (torch.float32, -140), (torch.float32, 110)],
)
@pytest.mark.parametrize('how', ['unit', 'mean_norm'])
def test_normalisation_is_exact_down_to_subnormal_norms(dtype, e, how):
    """Integer entries times 2^e are exact even where the norm is subnormal: the engine's features
    (`checked_normalize_features`, `feature_scales`) are those of h."""
    g = torch.Generator().manual_seed(1)
    h = torch.randint(-8, 9, (3, 5, 4), generator=g).to(dtype)  # (N, T, d)
    h[0, 0] = torch.tensor([1.0, 0.0, 0.0, 0.0])
    mask = torch.ones(3, 5, dtype=torch.bool)
    hc = h * 2.0**e
    ref = normalize_features(h, how, mask)  # the lesson's, at a scale its plain norms can hold
    tol = 4 * torch.finfo(dtype).eps  # features have norm <= a few
    assert (checked_normalize_features(hc, how, mask) - ref).abs().max() <= tol
    hs, s, _ = feature_scales(hc, mask, how)
    assert (s.unsqueeze(-1) * hs - ref * (h.norm(dim=-1, keepdim=True) > 0)).abs().max() <= tol


def test_zero_rows_stay_zero_and_zero_real_tokens_are_refused():
    h = torch.tensor([[[3.0, 4.0], [0.0, 0.0]]])
    torch.testing.assert_close(normalize_features(h), torch.tensor([[[0.6, 0.8], [0.0, 0.0]]]))
    h, m, r, g = batch()
    h[1, 2] = 0.0
    with pytest.raises(ValueError, match='all zero on a real token'):
        hara_advantages(h, m, r, g)
    h, m, r, g = batch(torch.float32)
    h[1, 2] = 1e-30  # tiny, not zero: accepted
    assert torch.isfinite(hara_advantages(h, m, r, g)[0]).all()


# ---------------------------------------------------------------- grad-requiring inputs: detached
@pytest.mark.parametrize('which', ['hidden', 'rewards', 'advantages'])
def test_grad_requiring_inputs_are_detached(which):
    h, m, r, g = batch()
    A = r - r.view(2, 4).mean(1).repeat_interleave(4)  # (B,)
    given = A if which == 'advantages' else None  # else the base advantages come from the rewards
    ref, _ = hara_advantages(h, m, r, g, advantages=given)
    args = dict(hidden=h, rewards=r, advantages=given)
    args[which] = args[which].clone().requires_grad_()
    out, rw = hara_advantages(args['hidden'], m, args['rewards'], g, advantages=args['advantages'])
    assert not out.requires_grad and out.grad_fn is None
    assert not rw.base.requires_grad and not rw.weights.requires_grad
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize('method', REWEIGHTS)
def test_grad_requiring_rewards_leave_no_graph_in_any_method(method):
    h, m, r, g = batch()
    H = torch.rand(8, 6, dtype=torch.float64, requires_grad=True)  # (B, T) entropies with a graph
    kw = dict(logits_entropy=H) if method == 'entropy' else {}
    hg, rg = h.clone().requires_grad_(), r.clone().requires_grad_()
    out, rw = reweight_advantages(method, hg, m, rg, g, **kw)
    assert not out.requires_grad and (rw.signal is None or not rw.signal.requires_grad)
