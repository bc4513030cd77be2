"""The conformance kit (chapter 22_conformance): the oracle conforms to itself, each deliberately
broken implementation fails with a short shrunk case that pastes into a test, and the committed
vectors are the oracle's own regression suite."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hara_ref.testing import (
    QUANTITIES,
    assert_conforms,
    upcast,
    _plans_oracle,
    _novelty_oracle,
    _bary_oracle,
)
from hara_ref.testing.strategies import build_case, case_flags
from hara_ref.testing.vectors import check_vectors, write_vectors
from hara_ref.rlvr.grpo import group_advantages, ppo_clip_loss, k3_kl
from hara_ref.ot.lfgw import lifted_cost
from hara_ref.ot.fgw_barycenter import sq_dists
from hara_ref.hara.weights import hara_weights, hara_advantages
from hara_ref.practice.cli import main

VECTORS = Path(__file__).parent / 'vectors'

SELF = {
    'grpo_advantages': lambda r, g: group_advantages(r, g),
    'ppo_clip_loss': lambda lp, old, A, m: ppo_clip_loss(lp, old, A, m)[0],
    'k3_kl': k3_kl,
    'lifted_cost': lambda h, tau, Z, tb: lifted_cost(h, tau, Z, tb),
    'entropic_plans': lambda h, m, Z: _plans_oracle(upcast(dict(hidden=h, mask=m, Z=Z))),
    'novelty': lambda h, m, Z: _novelty_oracle(upcast(dict(hidden=h, mask=m, Z=Z))),
    'hara_weights': lambda x, A: hara_weights(x, A),
    'barycenter': lambda h, m: _bary_oracle(upcast(dict(hidden=h, mask=m))),
    'hara_advantages': lambda h, m, r, g: hara_advantages(h, m, r, g)[0],
}
FEW = dict(barycenter=3, hara_advantages=3, entropic_plans=10, novelty=10)


@pytest.mark.parametrize('name', list(QUANTITIES))
def test_the_oracle_conforms_to_itself(name):
    assert_conforms(SELF[name], name, max_examples=FEW.get(name, 30))


# ---------------------------------------------------------------- broken implementations


def population_std(r, g):
    out = torch.zeros(len(r), dtype=torch.float64)
    for k in g.unique():
        x = r[g == k].double()
        out[g == k] = (x - x.mean()) / (x.std(unbiased=False) + 1e-6)
    return out


def no_factor_two(h, tau, Z, tau_bar):
    "(1-α)|h - z|² + α(τ - τ̄)²: the structure term without its 2."
    feat = sq_dists(h, Z.expand(*h.shape[:-2], *Z.shape))
    return 0.75 * feat + 0.25 * (tau[..., None] - tau_bar) ** 2


def unmasked_plans(h, m, Z):
    "Plans with every token real."
    return _plans_oracle(upcast(dict(hidden=h, mask=torch.ones_like(m), Z=Z))) * m[..., None]


def novelty_without_length(h, m, Z):
    "Contributions c_t, not L_i c_t."
    x = upcast(dict(hidden=h, mask=m, Z=Z))
    return _novelty_oracle(x) / m.sum(-1, keepdim=True)


def no_clip(x, A):
    return torch.where(A[:, None] != 0, 1 + torch.sign(A)[:, None] * (x - 1), torch.ones_like(x))


def zero_barycenter(h, m):
    "Z = 0: not a fixed point (the map moves it to the mean features)."
    return torch.zeros(8, h.shape[-1], dtype=h.dtype)


def unmasked_padding(h, m, r, g):
    return hara_advantages(h, torch.ones_like(m), r, g)[0] * m


BROKEN = [
    ('grpo_advantages', population_std, {}, 20),
    ('grpo_advantages', lambda r, g: group_advantages(r, g), dict(convention='verl'), 50),
    ('grpo_advantages', lambda r, g: group_advantages(r.float(), g), {}, 50),  # float32 inside
    ('ppo_clip_loss', lambda *a: ppo_clip_loss(*a, agg='token-mean')[0], {}, 50),
    ('k3_kl', lambda lp, ref: k3_kl(ref, lp), {}, 20),
    ('lifted_cost', no_factor_two, {}, 20),
    ('entropic_plans', unmasked_plans, {}, 20),
    ('novelty', novelty_without_length, {}, 20),
    ('hara_weights', no_clip, {}, 50),
    ('barycenter', zero_barycenter, {}, 3),
    ('hara_advantages', unmasked_padding, {}, 3),
]


@pytest.mark.parametrize(
    'name, fn, opts, n', BROKEN, ids=[f'{b[0]}-{i}' for i, b in enumerate(BROKEN)]
)
def test_each_broken_implementation_fails_with_a_short_case(name, fn, opts, n):
    with pytest.raises(AssertionError, match='does not conform') as e:
        assert_conforms(fn, name, max_examples=n, **opts)
    msg = str(e.value)
    assert 'case (paste into a test):' in msg and 'flags:' in msg
    # shrunk: every input of the printed case is small
    for line in msg.split('case (paste into a test):')[1].splitlines():
        if '= torch.tensor(' in line and 'expected' not in line and 'got' not in line:
            assert line.count(',') < 60, line


def test_the_printed_case_pastes_into_a_test():
    with pytest.raises(AssertionError) as e:
        assert_conforms(population_std, 'grpo_advantages', max_examples=20)
    code = str(e.value).split('case (paste into a test):')[1]
    ns = {}
    exec('\n'.join(line[4:] for line in code.splitlines() if line.strip()), ns)
    torch.testing.assert_close(population_std(ns['rewards'], ns['group_ids']), ns['got'])
    torch.testing.assert_close(group_advantages(ns['rewards'], ns['group_ids']), ns['expected'])
    assert len(ns['rewards']) == 2  # the smallest failing case: one group of two


def test_a_different_fixed_point_is_certified():
    "At alpha = 0 the reversed supports are another fixed point, with the same objective."

    def reversed_oracle(h, m):
        return _bary_oracle(upcast(dict(hidden=h, mask=m)), alpha=0.0).flip(0)

    assert_conforms(reversed_oracle, 'barycenter', alpha=0.0, max_examples=3)


def test_a_crash_is_a_failure_and_bad_calls_are_named():
    def crash(r, g):
        raise RuntimeError('boom')

    with pytest.raises(AssertionError, match='fn raised RuntimeError: boom'):
        assert_conforms(crash, 'grpo_advantages', max_examples=5)
    with pytest.raises(ValueError, match='quantity must be one of'):
        assert_conforms(crash, 'grpo')
    with pytest.raises(TypeError, match="has no option 'eps'"):
        assert_conforms(crash, 'grpo_advantages', eps=1e-4)
    with pytest.raises(AssertionError, match=r'shape \(0,\), expected'):
        assert_conforms(lambda r, g: r[:0], 'grpo_advantages', max_examples=5)


def test_flags_name_the_edges():
    c = build_case('tokens', dict(lengths=[0, 3, 5], T=5, holes=True, dtype='float64', seed=2))
    assert {'empty-row', 'mask-hole', 'ragged', 'padded'} <= set(case_flags(c))
    c = build_case(
        'labels', dict(sizes=[1, 3], kind='equal', shuffle=True, dtype='bfloat16', seed=0)
    )
    assert {'singleton-group', 'all-equal', 'bfloat16'} <= set(case_flags(c))


# ---------------------------------------------------------------- frozen vectors


def test_committed_vectors_are_the_oracles_answers(tmp_path):
    "Regenerate the vectors: the same cases, flags and tolerances, and the same answers."
    index = write_vectors(tmp_path)
    old = json.loads((VECTORS / 'index.json').read_text())
    assert [c['id'] for c in index['cases']] == [c['id'] for c in old['cases']]
    from safetensors.torch import load_file

    for new_c, old_c in zip(index['cases'], old['cases']):
        assert {k: v for k, v in new_c.items() if k not in ('rtol', 'atol')} == {
            k: v for k, v in old_c.items() if k not in ('rtol', 'atol')
        }
        a, b = load_file(tmp_path / new_c['file']), load_file(VECTORS / old_c['file'])
        for k in old_c['inputs']:
            assert torch.equal(a[f"{old_c['id']}/{k}"], b[f"{old_c['id']}/{k}"]), (old_c['id'], k)
        key = f"{old_c['id']}/expected"
        torch.testing.assert_close(a[key], b[key], rtol=old_c['rtol'], atol=old_c['atol'])


@pytest.mark.parametrize('name', [q for q in QUANTITIES if q != 'grpo_advantages'])
def test_the_oracle_passes_its_vectors(name):
    assert check_vectors(SELF[name], name, VECTORS) >= 2


def test_vectors_catch_a_convention():
    assert check_vectors(lambda r, g: group_advantages(r, g, 'rloo'), 'grpo_advantages', VECTORS,
                         convention='rloo') == 4  # fmt: skip
    with pytest.raises(AssertionError, match='vectors fail'):
        check_vectors(lambda r, g: group_advantages(r, g), 'grpo_advantages', VECTORS,
                      convention='trl')  # fmt: skip


def test_vectors_read_with_numpy_alone():
    from safetensors.numpy import load_file

    index = json.loads((VECTORS / 'index.json').read_text())
    for f in {c['file'] for c in index['cases']}:
        assert len(load_file(VECTORS / f)) > 0


# ---------------------------------------------------------------- command line


def test_cli_check_and_vectors(tmp_path, capsys):
    assert (
        main(['check', 'hara_ref.rlvr.grpo:k3_kl', '--quantity', 'k3_kl', '--examples', '5']) == 0
    )
    assert 'PASS' in capsys.readouterr().out
    argv = ['check', 'tests.test_testing:population_std', '--quantity', 'grpo_advantages']
    assert main(argv + ['--examples', '20']) == 1
    assert 'rewards = torch.tensor([' in capsys.readouterr().out
    assert main(['vectors', '--out', str(tmp_path), '--quantity', 'k3_kl']) == 0
    assert json.loads((tmp_path / 'index.json').read_text())['cases'][0]['quantity'] == 'k3_kl'


def test_import_hara_ref_stays_light():
    "No oracle module imports the kit, so hypothesis is not loaded by them."
    code = (
        'import sys, hara_ref, hara_ref.hara.weights, hara_ref.practice.cli, hara_ref.train.rl; '
        "assert 'hypothesis' not in sys.modules and 'hara_ref.testing' not in sys.modules"
    )
    subprocess.run([sys.executable, '-c', code], check=True)


def test_report_numbers_match_the_entries():
    with pytest.raises(AssertionError) as e:
        assert_conforms(no_clip, 'hara_weights', max_examples=30)
    m = re.search(r'(\d+) of (\d+) output entries differ', str(e.value))
    assert m and 1 <= int(m[1]) <= int(m[2])
