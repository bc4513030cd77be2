"""Options of the kit are checked before any case runs: each value's kind (from its default, or the
quantity's `kinds`), then the oracle once on a probe case where every step runs; `hara-ref check`
refuses a bad `--option` with exit code 2 and one line, the Python API with a TypeError or
ValueError naming the option, and the function is never called."""

import re
import sys
from pathlib import Path

import pytest

from hara_ref.rlvr.grpo import k3_kl
from hara_ref.testing import QUANTITIES, KINDS, assert_conforms, check_options, option_kind
from hara_ref.testing.vectors import check_cli, check_vectors

VECTORS = Path(__file__).parent / 'vectors'

GOOD = '''from pathlib import Path


def f(*args):
    Path('ran').write_text('a case ran')
    raise RuntimeError('a case ran')
'''
HARA = ['good:f', '--quantity', 'hara_advantages']
# argv, the problem the one stderr line names
BAD = {
    'bool-as-text': (
        ['good:f', '--quantity', 'k3_kl', '--option', 'clamp=maybe'],
        r"clamp must be True or False \(JSON true or false\), got 'maybe'",
    ),
    'bool-as-number': (
        ['good:f', '--quantity', 'k3_kl', '--option', 'clamp=1'],
        'clamp must be True or False .*, got 1',
    ),
    'int-as-float': (HARA + ['--option', 'L_b=8.5'], 'L_b must be an integer, got 8.5'),
    'int-as-bool': (HARA + ['--option', 'L_b=true'], 'L_b must be an integer, got True'),
    'real-as-bool': (HARA + ['--option', 'kappa=true'], 'kappa must be a finite real number'),
    'real-nan': (
        ['good:f', '--quantity', 'lifted_cost', '--option', 'alpha=NaN'],
        'alpha must be a finite real number, got nan',
    ),
    'real-or-none': (
        ['good:f', '--quantity', 'ppo_clip_loss', '--option', 'dual_clip=three'],
        "dual_clip must be a finite real number or None, got 'three'",
    ),
    'dict-kind': (HARA + ['--option', 'bary_kw=50'], 'bary_kw must be a dict or None, got 50'),
    'bary-kw-typo': (
        HARA + ['--option', 'bary_kw={"max_itr": 50}'],
        r"hara_advantages cannot run with bary_kw=\{'max_itr': 50\}: .*max_itr",
    ),
    'plan-kw-typo': (
        HARA + ['--option', 'plan_kw={"num_iter": 5}'],
        r"cannot run with plan_kw=\{'num_iter': 5\}: .*num_iter",
    ),
    'median-kw-typo': (
        HARA + ['--option', 'median_kw={"maxiter": 5}'],
        r"cannot run with median_kw=\{'maxiter': 5\}: .*maxiter",
    ),
    'exact-bary-kw-typo': (
        HARA + ['--option', 'barycenter=exact', '--option', 'bary_kw={"tolerance": 1e-3}'],
        r"cannot run with barycenter='exact', bary_kw=\{'tolerance': 0\.001\}: .*tolerance",
    ),
    'choice-as-list': (
        ['good:f', '--quantity', 'grpo_advantages', '--option', 'convention=["trl"]'],
        r"convention must be one of \('grpo', .*\), got \['trl'\]",
    ),
    'outcomes-quantity': (
        ['good:f', '--quantity', 'hara_advantages_outcomes', '--option', 'span_len=2.0'],
        'span_len must be an integer or None, got 2.0',
    ),
}


@pytest.mark.parametrize('what', list(BAD))
def test_a_bad_option_is_a_usage_error_before_any_case(what, tmp_path, monkeypatch, capsys):
    argv, problem = BAD[what]
    (tmp_path / 'good.py').write_text(GOOD)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, 'path', list(sys.path))
    monkeypatch.delitem(sys.modules, 'good', raising=False)
    assert check_cli(argv) == 2
    out, err = capsys.readouterr()
    assert out == '' and err.count('\n') == 1 and err.startswith('hara-ref check: '), err
    assert re.search(problem, err), err
    assert not (tmp_path / 'ran').exists()  # no case ran


def test_the_python_api_refuses_a_bad_option_before_calling_fn():
    calls = []

    def fn(*args):
        calls.append(1)
        return k3_kl(*args)

    for kw, kind, msg in [
        (dict(clamp='maybe'), TypeError, 'clamp must be True or False'),
        (dict(clamp=None), TypeError, 'clamp must be True or False'),
    ]:
        with pytest.raises(kind, match=msg):
            assert_conforms(fn, 'k3_kl', **kw)
        with pytest.raises(kind, match=msg):
            check_vectors(fn, 'k3_kl', VECTORS, **kw)
    with pytest.raises(ValueError, match="cannot run with bary_kw={'max_itr': 50}"):
        assert_conforms(fn, 'hara_advantages', bary_kw={'max_itr': 50})
    with pytest.raises(TypeError, match='L_b must be an integer, got 8.5'):
        assert_conforms(fn, 'hara_advantages_outcomes', L_b=8.5)
    assert calls == []


def test_good_values_of_every_kind_are_taken():
    q = QUANTITIES
    assert check_options(q['k3_kl'], dict(clamp=True))['clamp'] is True
    assert check_options(q['hara_weights'], dict(kappa=1))['kappa'] == 1  # an int is a real
    assert check_options(q['ppo_clip_loss'], dict(dual_clip=None))['dual_clip'] is None
    kw = dict(L_b=4, span_len=2, granularity='span', bary_kw=dict(max_iter=50), plan_kw={})
    assert check_options(q['hara_advantages'], kw)['bary_kw'] == {'max_iter': 50}


def test_every_option_of_every_quantity_has_a_kind():
    for q in QUANTITIES.values():
        for k in q.options:
            assert option_kind(q, k) in KINDS, (q.name, k)
