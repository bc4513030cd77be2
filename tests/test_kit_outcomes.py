"""The kit and the vectors test HARA's outcome groups beyond binary rewards: graded rewards with
ties, all-distinct rewards, and outcome labels given with `outcomes=`; an implementation that forms
the groups by any other rule fails both."""

import re
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings

from hara_ref.engine.hara_engine import hara_advantages
from hara_ref.testing import assert_conforms
from hara_ref.testing.strategies import REWARD_KINDS, build_case, case_flags, case_specs
from hara_ref.testing.vectors import check_vectors, read_vectors

VECTORS = Path(__file__).parent / 'vectors'


def threshold(h, m, r, g):
    "Outcome groups r > 0.5 and r <= 0.5: the oracle's on binary rewards alone."
    return hara_advantages(h, m, r, g, outcomes=r > 0.5)[0]


def best_of_prompt(h, m, r, g):
    "Outcome groups 'the prompt's best reward' and the rest."
    best = torch.stack([r[g == k].max() for k in g]).to(r.dtype)  # (B,)
    return hara_advantages(h, m, r, g, outcomes=r == best)[0]


def rounded(h, m, r, g):
    "Rewards rounded to 0 or 1 before grouping."
    return hara_advantages(h, m, r, g, outcomes=r.double().round())[0]


@pytest.mark.parametrize('fn', [threshold, best_of_prompt, rounded])
def test_a_rule_that_agrees_on_binary_rewards_fails_on_graded_ones(fn):
    assert_conforms(fn, 'hara_advantages', cases=dict(edges=False), max_examples=10)  # binary
    with pytest.raises(AssertionError, match='does not conform') as e:
        assert_conforms(fn, 'hara_advantages', max_examples=15)
    flags = re.search(r'^flags: (.*)$', str(e.value), re.M)[1].split(', ')
    assert 'graded-rewards' in flags, flags


def ignores_labels(h, m, r, g, o):
    "Outcome groups from the rewards, the labels ignored."
    return hara_advantages(h, m, r, g)[0]


def binary_labels(h, m, r, g, o):
    "Labels read as correct (> 0) or not."
    return hara_advantages(h, m, r, g, outcomes=o > 0)[0]


def labels_as_rewards(h, m, r, g, o):
    "Labels passed as the rewards: the groups right, the base advantages not."
    return hara_advantages(h, m, o.to(r.dtype), g)[0]


@pytest.mark.parametrize('fn', [ignores_labels, binary_labels, labels_as_rewards])
def test_outcome_labels_are_checked(fn):
    with pytest.raises(AssertionError, match='does not conform'):
        assert_conforms(fn, 'hara_advantages_outcomes', max_examples=15)
    with pytest.raises(AssertionError, match='hara_advantages_outcomes vectors of'):
        check_vectors(fn, 'hara_advantages_outcomes', VECTORS)


def test_the_oracle_with_labels_conforms():
    def oracle(h, m, r, g, o):
        return hara_advantages(h, m, r, g, outcomes=o)[0]

    assert_conforms(oracle, 'hara_advantages_outcomes', max_examples=5)
    assert check_vectors(oracle, 'hara_advantages_outcomes', VECTORS) == 6


def test_committed_vectors_hold_graded_rewards_ties_and_labels():
    cases = read_vectors(VECTORS)['cases']
    hara = [set(c['flags']) for c in cases if c['quantity'] == 'hara_advantages']
    assert any({'graded-rewards', 'graded-tie'} <= f for f in hara)
    labelled = [set(c['flags']) for c in cases if c['quantity'] == 'hara_advantages_outcomes']
    assert labelled and all('outcome-labels' in f for f in labelled)
    assert any('outcomes-not-rewards' in f for f in labelled)
    for fn in (threshold, best_of_prompt, rounded):
        with pytest.raises(AssertionError) as e:
            check_vectors(fn, 'hara_advantages', VECTORS)
        failed = re.findall(r'^\[([\w-]+)\]', str(e.value), re.M)
        flags = {c['id']: c['flags'] for c in cases}
        assert failed and all('graded-rewards' in flags[c] for c in failed), failed


def test_batch_cases_draw_every_reward_kind_with_ties():
    seen = set()

    @settings(max_examples=80, database=None, deadline=None)
    @given(case_specs('batch'))
    def draw(spec):
        c = build_case('batch', spec)
        kind = spec.get('rewards', 'binary')
        seen.add(kind)
        r = c['rewards'].double()
        if kind == 'graded':
            assert torch.equal(r * 4, (r * 4).round()) and bool(((r >= 0) & (r <= 1)).all())
        if kind == 'binary':
            assert 'graded-rewards' not in case_flags(c)
        assert c['outcomes'].dtype == torch.int64 and len(c['outcomes']) == len(r)
        seen.update(f for f in case_flags(c) if f in ('graded-tie', 'outcomes-not-rewards'))

    draw()
    assert seen >= set(REWARD_KINDS) | {'graded-tie', 'outcomes-not-rewards'}, seen
