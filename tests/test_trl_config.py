"""HaraConfig without TRL (hara_ref.practice.trl_config): every value checked when the config is
made (the oracle's own checks, the user's own values), the fields each method reads, outcomes from
the values the reward functions return, any outcome labels."""

import uuid
import warnings
import pytest
import torch
from hara_ref.engine.checks import check_outcomes
from hara_ref.engine.hara_engine import hara_advantages
from hara_ref.practice import trl_config
from hara_ref.practice.trl_config import (
    READS,
    HaraConfig,
    dry_caps,
    dry_run,
    hara_summary,
    rollout_labels,
    sep_token_ids,
)
from hara_ref.train.policy import char_tokenizer

NAMES = ['accuracy', 'format']


def error_of(**kw) -> str:
    "The message of the error `HaraConfig(**kw)` raises ('' if none)."
    try:
        HaraConfig(**kw)
    except (ValueError, TypeError) as e:
        return str(e)
    return ''


# --- item 5 and 15: every value is checked when the config is made, by the oracle ----------------


@pytest.mark.parametrize(
    'where, key, value',
    [
        ('bary_kw', 'max_iter', 0),
        ('bary_kw', 'max_iter', -1),
        ('bary_kw', 'max_iter', 1.5),
        ('bary_kw', 'inner_iter', 0),
        ('bary_kw', 'anderson', -1),
        ('bary_kw', 'tol', -1.0),
        ('bary_kw', 'omega', 5),
        ('plan_kw', 'num_iter_max', 0),
        ('plan_kw', 'num_iter_max', 'many'),
        ('plan_kw', 'stop_thr', float('nan')),
        ('median_kw', 'max_iter', 0),
    ],
)
def test_solver_values_are_refused_when_the_config_is_made(where, key, value):
    """Solver settings, the iteration caps included, reach the oracle as the user gave them: a bad
    one fails when HaraConfig is made, with the field and the key named (before: it ran, or the
    dry run replaced the cap with its own and the trainer failed after loading the model)."""
    msg = error_of(novelty_kw={where: {key: value}})
    assert msg.startswith('HaraConfig.novelty_kw: ') and key in msg, msg


@pytest.mark.parametrize(
    'kw, field',
    [
        (dict(metric='cosine'), 'HaraConfig.metric must be'),
        (dict(novelty_kw={'normalize': 'l2'}), 'HaraConfig.novelty_kw: normalize must be'),
        (dict(novelty_kw={'compute_dtype': 'bfloat16'}), 'HaraConfig.novelty_kw: compute_dtype'),
        (dict(reweight='shear', reweight_kw={'reg': 0}), 'HaraConfig.reweight_kw: reg must be'),
        (dict(reweight='entropy', reweight_kw={'rho': 2.0}), 'HaraConfig.reweight_kw: rho'),
    ],
)
def test_option_values_are_refused_when_the_config_is_made(kw, field):
    "The metric (item 15) and every other option value: one clear error naming the field."
    assert error_of(**kw).startswith(field)


def test_dry_run_hands_the_users_own_values_to_the_oracle(monkeypatch):
    """Every option reaches the oracle as given, caps included (the first, no-work call); the
    second call lowers only caps that are larger positive integers."""
    seen = []
    monkeypatch.setattr(trl_config, 'hara_advantages', lambda *a, **kw: seen.append(kw))
    user = dict(
        bary_kw=dict(max_iter=0, inner_iter=-2, tol=-1.0, anderson=-1, omega=5),
        plan_kw=dict(num_iter_max='many', stop_thr=0.0),
        median_kw=dict(max_iter=0),
    )
    cfg = HaraConfig(novelty_kw=user)  # the oracle is the spy: nothing refused
    seen.clear()
    dry_run(cfg)
    assert len(seen) == 2
    for kw in seen:  # none of these is a larger positive integer: all as given
        assert {k: kw[k] for k in user} == user
    cfg = HaraConfig(novelty_kw=dict(bary_kw=dict(max_iter=500, inner_iter=3)))
    seen.clear()
    dry_run(cfg)
    assert seen[0]['bary_kw'] == dict(max_iter=500, inner_iter=3)  # the checks: as given
    assert seen[1]['bary_kw'] == dict(max_iter=1, inner_iter=3)  # the work: 500 lowered, 3 kept


def test_dry_caps():
    assert dry_caps({}) == dict(
        bary_kw=dict(max_iter=1, inner_iter=5), plan_kw=dict(num_iter_max=5)
    )
    got = dry_caps(dict(bary_kw=dict(max_iter=True, inner_iter=None), plan_kw=dict(num_iter_max=9)))
    assert got == dict(bary_kw=dict(max_iter=True, inner_iter=None), plan_kw=dict(num_iter_max=5))
    # the exact barycenter takes no inner_iter and solves no final plans; 'embed' neither
    assert dry_caps(dict(barycenter='exact')) == dict(barycenter='exact', bary_kw=dict(max_iter=1))
    assert 'plan_kw' not in dry_caps({}, metric='embed')
    assert 'plan_kw' not in dry_caps(dict(final_plans=False))
    assert dry_caps(dict(bary_kw='fast')) == dict(bary_kw='fast', plan_kw=dict(num_iter_max=5))


def test_dry_run_runs_every_barycenter_and_leaves_the_random_state():
    "The exact barycenter takes no inner_iter (the dry run gave it one: a TypeError)."
    state = torch.random.get_rng_state()
    for kw in (dict(barycenter='exact'), dict(reference='barycenter'), {}):
        dry_run(HaraConfig(novelty_kw=kw))
    dry_run(HaraConfig(metric='embed'))
    assert torch.equal(state, torch.random.get_rng_state())


# --- item 9: text separators ---------------------------------------------------------------------


@pytest.mark.parametrize('seps', [['\n', '.'], ['\n', 0, '.'], ['\n', '.', ';', '1']])
def test_several_text_separators_pass_the_dry_run(seps):
    "Texts get distinct stand-in ids, none equal to an id given (before: every text became 0)."
    cfg = HaraConfig(span_sep_ids=seps)
    dry_run(cfg)
    assert cfg.span_sep_ids == tuple(int(s) if s in (0, '1') else s for s in seps)


def test_separators_that_are_one_token_are_refused_once_tokenized():
    tok = char_tokenizer()
    nl = tok.convert_tokens_to_ids('\n')
    with pytest.raises(ValueError, match=r"name the same token twice \(token ids \[\d+, \d+\]\)"):
        sep_token_ids(['\n', nl], tok)
    assert sep_token_ids(['\n', '.'], tok) == (nl, tok.convert_tokens_to_ids('.'))


# --- item 10: fields a method does not read; any outcome labels ---------------------------------


@pytest.mark.parametrize('reweight', ['entropy', 'position', 'none'])
@pytest.mark.parametrize('kw', [dict(outcome_funcs=['accuracy']), dict(outcome_threshold=0.5)])
def test_outcome_settings_are_refused_where_no_outcome_is_read(reweight, kw):
    (field,) = kw
    assert error_of(reweight=reweight, **kw).startswith(
        f"HaraConfig.{field} is not read with reweight={reweight!r}"
    )


@pytest.mark.parametrize('reweight', ['hara-seq', 'hara-tok', 'shear'])
def test_outcome_settings_are_kept_where_the_outcome_is_read(reweight):
    cfg = HaraConfig(reweight=reweight, outcome_funcs=['accuracy'], outcome_threshold=0.5)
    line = hara_summary(cfg, NAMES, [1.0, 1.0])
    assert "'accuracy' >= 0.5 (1) or not (0)" in line


@pytest.mark.parametrize(
    'reweight, kw',
    [
        ('shear', dict(kappa=0.5)),
        ('shear', dict(clip=[0.7, 1.5])),
        ('entropy', dict(hidden_layer=0)),
        ('position', dict(forward_batch_size=4)),
        ('none', dict(kappa=0.0)),
        ('none', dict(hidden_layer=2)),
    ],
)
def test_fields_a_method_does_not_read_are_refused(reweight, kw):
    (field,) = kw
    assert f"HaraConfig.{field} is not read with reweight={reweight!r}" in error_of(
        reweight=reweight, **kw
    )


def test_every_field_is_read_by_some_method():
    from dataclasses import fields

    read = {f for fs in READS.values() for f in fs} | {'reweight'}
    assert read == {f.name for f in fields(HaraConfig)}


def test_startup_line_of_a_baseline_claims_no_outcome():
    for reweight in ('entropy', 'position'):
        line = hara_summary(HaraConfig(reweight=reweight), NAMES, [1.0, 1.0])
        assert 'no outcome read' in line and 'outcome group' not in line and 'kappa' not in line


def grouped_batch():
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(8, 7, 6, generator=g, dtype=torch.float64)  # (B, T, d)
    mask = torch.arange(7) < torch.tensor([7, 5, 6, 4, 7, 3, 6, 5])[:, None]  # (B, T)
    rewards = torch.tensor([1.0, 0.5, 1.5, 0.0, 1.0, 1.5, 0.5, 1.0], dtype=torch.float64)
    return hidden, mask, rewards, torch.arange(8) // 4


@pytest.mark.parametrize(
    'labels',
    [
        ['right', 'wrong', 'right', 'wrong', 'wrong', 'right', 'right', 'right'],
        [uuid.UUID(int=i % 2 + 7) for i in (0, 1, 0, 1, 1, 0, 0, 0)],
        [('right', 1), ('wrong', 0), ('right', 1), ('wrong', 0)] * 2,
    ],
)
def test_outcome_labels_of_any_kind(labels):
    """String, uuid and tuple labels give the oracle's answer on the same labels as integers
    (before: torch's "too many dimensions 'str'", "Could not infer dtype")."""
    codes = {}
    ints = torch.tensor([codes.setdefault(x, len(codes)) for x in labels])  # (B,)
    hidden, mask, rewards, gid = grouped_batch()
    kw = dict(bary_kw=dict(max_iter=5))
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # the barycenter stops at 5 iterations
        got, rw = hara_advantages(hidden, mask, rewards, gid, outcomes=labels, **kw)
        want, rw0 = hara_advantages(hidden, mask, rewards, gid, outcomes=ints, **kw)
    assert torch.equal(got, want) and torch.equal(rw.novelty.og, rw0.novelty.og)
    assert rw.novelty.group_size.tolist() == rw0.novelty.group_size.tolist()
    assert (rw.weights[mask] != 1).any()


def test_outcome_labels_refused_with_the_reason():
    for bad, msg in (
        (['a', 'b'], r'^outcomes must have shape \(B,\) = \(4,\), got 2 labels'),
        ([[0], 'a', 'b', 'c'], '^outcomes must be numbers, bools or hashable labels'),
        ('abcd', '^outcomes must be \\(B,\\) labels, got one str'),
    ):
        with pytest.raises((ValueError, TypeError), match=msg):
            check_outcomes(bad, 4, 'cpu')


# --- item 7: outcomes from the values the functions return ----------------------------------------


@pytest.mark.parametrize('weight', [0.5, 2.0, 0.0, -1.0])
def test_outcome_threshold_compares_the_unweighted_value(weight):
    """With reward_weights [w, 1] and threshold 1.0 on the first function, a correct rollout
    (accuracy 1) is outcome 1 whatever w (before: 0.5 * 1 < 1 made it 0)."""
    nan = float('nan')
    rpf = torch.tensor([[1.0, 0.2], [0.0, 0.9], [1.0, nan], [0.0, 0.1], [nan, 0.3]])  # (B, F)
    w = torch.tensor([weight, 1.0])
    r, gid, o = rollout_labels(rpf, w, 5, outcome_cols=(0,), outcome_threshold=1.0)
    assert o.tolist() == [1.0, 0.0, 1.0, 0.0, 0.0] and gid.tolist() == [0, 0, 0, 0, 9]
    want_r = torch.tensor([weight + 0.2, 0.9, weight, 0.1, 0.3])  # TRL's reward: weighted
    assert torch.allclose(r, want_r)
    # without a threshold: the values, so a zero weight does not merge the outcomes
    _, _, o = rollout_labels(rpf, w, 5, outcome_cols=(0,))
    assert o.tolist() == [1.0, 0.0, 1.0, 0.0, 0.0]


def test_startup_line_says_the_outcome_is_unweighted():
    cfg = HaraConfig(outcome_funcs=['accuracy'], outcome_threshold=1.0)
    line = hara_summary(cfg, NAMES, [0.5, 1.0])
    assert (
        "with 'accuracy' >= 1.0 (1) or not (0), as the function returns it (unweighted: TRL's "
        "reward_weights ('accuracy' 0.5) scale the reward only)"
    ) in line
    line = hara_summary(HaraConfig(outcome_funcs=[0, 1]), NAMES, [1.0, 1.0])
    assert line.endswith(
        "equal 'accuracy' + 'format', as the functions return them (unweighted: TRL's "
        "reward_weights scale the reward only)"
    )
