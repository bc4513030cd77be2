"""The conformance kit (chapter 22_conformance): the oracle conforms to itself, each deliberately
broken implementation fails with a short shrunk case that pastes into a test, and the committed
vectors are the oracle's own regression suite."""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch

from hara_ref.testing import (
    QUANTITIES,
    assert_conforms,
    keyword_options,
    upcast,
    _plans_oracle,
    _novelty_oracle,
    _bary_oracle,
)
from hara_ref.testing.strategies import DTYPES, build_case, case_flags, case_specs
import hara_ref
from hara_ref.testing.vectors import check_cli, check_parser, check_vectors, read_vectors
from hara_ref.testing.vectors import write_vectors
from hara_ref.rlvr.grpo import group_advantages, k3_kl
from hara_ref.engine.conventions import AGG_MODES, ppo_clip_loss
from hara_ref.ot.lfgw import lifted_cost
from hara_ref.ot.fgw_barycenter import sq_dists
from hara_ref.hara.weights import hara_weights
from hara_ref.engine.novelty import hara_novelty
from hara_ref.engine.hara_engine import hara_advantages
from hara_ref.practice.cli import main

VECTORS = Path(__file__).parent / 'vectors'
N_CASES = len(json.loads((VECTORS / 'index.json').read_text())['cases'])

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
    'hara_advantages_outcomes': lambda h, m, r, g, o: hara_advantages(h, m, r, g, outcomes=o)[0],
}
FEW = dict(
    barycenter=3, hara_advantages=3, hara_advantages_outcomes=3, entropic_plans=10, novelty=10
)


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
    c = build_case('tokens', dict(lengths=[0, 3, 5], T=5, holes=True, dtype='float64', seed=4))
    assert {'empty-row', 'mask-hole', 'ragged', 'padded'} <= set(case_flags(c))
    c = build_case(
        'labels', dict(sizes=[1, 3], kind='equal', shuffle=True, dtype='bfloat16', seed=0)
    )
    assert {'singleton-group', 'all-equal', 'bfloat16'} <= set(case_flags(c))


# ---------------------------------------------------------------- frozen vectors


def test_committed_vectors_are_the_oracles_answers(tmp_path):
    """Regenerate the vectors: the same cases, flags and tolerances, and the same answers, written
    by this version (an answer that changes moves the version, and the set is written again)."""
    index = write_vectors(tmp_path)
    old = read_vectors(VECTORS)  # its seal checked
    assert old['version'] == hara_ref.__version__, 'write the committed vectors again'
    assert [c['id'] for c in index['cases']] == [c['id'] for c in old['cases']]
    from safetensors.torch import load_file

    skip = ('rtol', 'atol', 'sha256')  # tolerances (and so digests) may move by rounding
    for new_c, old_c in zip(index['cases'], old['cases']):
        assert {k: v for k, v in new_c.items() if k not in skip} == {
            k: v for k, v in old_c.items() if k not in skip
        }
        a, b = load_file(tmp_path / new_c['file']), load_file(VECTORS / old_c['file'])
        for k in old_c['inputs']:
            assert torch.equal(a[f"{old_c['id']}/{k}"], b[f"{old_c['id']}/{k}"]), (old_c['id'], k)
        key = f"{old_c['id']}/expected"
        msg = f"{old_c['id']}: an answer changed: move the version and write the vectors again"
        torch.testing.assert_close(
            a[key], b[key], rtol=old_c['rtol'], atol=old_c['atol'], msg=lambda m: f"{msg}\n{m}"
        )


@pytest.mark.parametrize('name', [q for q in QUANTITIES if q != 'grpo_advantages'])
def test_the_oracle_passes_its_vectors(name):
    assert check_vectors(SELF[name], name, VECTORS) >= 2


def test_vectors_catch_a_convention():
    assert check_vectors(lambda r, g: group_advantages(r, g, 'rloo'), 'grpo_advantages', VECTORS,
                         convention='rloo') == 7  # fmt: skip
    with pytest.raises(
        AssertionError, match=r'of 7 grpo_advantages vectors of hara_ref [\d.]+ fail'
    ):
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


# ---------------------------------------------------------------- sealed vectors


def _edit_index(change):
    def edit(d):
        index = json.loads((d / 'index.json').read_text())
        change(index)
        (d / 'index.json').write_text(json.dumps(index))

    return edit


def _edit_file(d):
    b = bytearray((d / 'k3_kl.safetensors').read_bytes())
    b[-1] ^= 1  # one bit of the last expected value
    (d / 'k3_kl.safetensors').write_bytes(b)


TAMPER = {
    'atol': (
        _edit_index(lambda i: [c.update(atol=1e9) for c in i['cases']]),
        r'case grpo_advantages-00 in .* was edited: its tolerance',
    ),
    'case-removed': (
        _edit_index(lambda i: i['cases'].pop(5)),
        rf'the case list in .* was edited \({N_CASES - 1} cases\): cases were added, removed or '
        'renamed',
    ),
    'version': (
        _edit_index(lambda i: i.update(version='9.9.9')),
        r'the version in .* was edited: hara_ref 9\.9\.9 did not write this set',
    ),
    'file-edited': (_edit_file, r'k3_kl\.safetensors was edited: its sha256 is not the one'),
    'file-missing': (
        lambda d: (d / 'novelty.safetensors').unlink(),
        r'novelty\.safetensors is missing from the set hara_ref',
    ),
    'no-seal': (_edit_index(lambda i: i.pop('sha256')), r'carries no digests'),
}


@pytest.mark.parametrize('what', list(TAMPER))
def test_an_edited_set_is_refused_with_its_reason(tmp_path, what, capsys):
    edit, reason = TAMPER[what]
    d = tmp_path / 'v'
    shutil.copytree(VECTORS, d)
    check_vectors(k3_kl, 'k3_kl', d)  # the copy passes before the edit
    edit(d)
    with pytest.raises(ValueError, match=reason):
        check_vectors(k3_kl, 'k3_kl', d)
    # the command line refuses it before any case runs: rc 2, one line
    argv = ['hara_ref.rlvr.grpo:k3_kl', '--quantity', 'k3_kl', '--vectors', str(d)]
    assert check_cli(argv) == 2
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and re.search(reason, err), err


def test_the_set_says_which_version_wrote_it(tmp_path):
    index = write_vectors(tmp_path, ['k3_kl'])
    assert index['version'] == hara_ref.__version__ == read_vectors(tmp_path)['version']
    with pytest.raises(AssertionError, match=rf'k3_kl vectors of hara_ref {hara_ref.__version__}'):
        check_vectors(lambda a, b: k3_kl(b, a), 'k3_kl', tmp_path)


def test_vectors_never_mix_two_sets(tmp_path):
    write_vectors(tmp_path, ['k3_kl', 'hara_weights'])
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ValueError, match=r'holds another set \(of hara_weights, k3_kl\)'):
        write_vectors(tmp_path, ['k3_kl'])
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written
    # the same set again replaces it, and is still sealed
    write_vectors(tmp_path, ['hara_weights', 'k3_kl'])
    assert check_vectors(k3_kl, 'k3_kl', tmp_path) == 6
    (tmp_path / 'notes.txt').write_text('x')
    with pytest.raises(ValueError, match='holds files of no vector set: notes.txt'):
        write_vectors(tmp_path, ['hara_weights', 'k3_kl'])
    other = tmp_path / 'other'
    other.mkdir()
    (other / 'a.txt').write_text('x')
    with pytest.raises(ValueError, match='is not empty and holds no vector set'):
        write_vectors(other, ['k3_kl'])


def test_vectors_cli_refuses_a_file_and_a_mixed_folder(tmp_path, capsys):
    f = tmp_path / 'out.json'
    f.write_text('{}')
    assert main(['vectors', '--out', str(f), '--quantity', 'k3_kl']) == 2
    assert (
        capsys.readouterr().err
        == f"hara-ref vectors: {f} is a file: vectors are written to a folder\n"
    )
    assert main(['vectors', '--out', str(tmp_path / 'v'), '--quantity', 'k3_kl']) == 0
    capsys.readouterr()
    assert main(['vectors', '--out', str(tmp_path / 'v'), '--quantity', 'hara_weights']) == 2
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and 'holds another set (of k3_kl)' in err
    assert (
        main(
            ['vectors', '--out', str(tmp_path / 'w'), '--quantity', 'k3_kl', '--quantity', 'k3_kl']
        )
        == 2
    )
    assert "'k3_kl' is given twice" in capsys.readouterr().err


# ---------------------------------------------------------------- time limit


def hangs(*args):
    threading.Event().wait()  # never returns (and holds no CPU)


def test_a_hang_is_a_failure_that_names_the_case():
    t0 = time.perf_counter()
    with pytest.raises(AssertionError) as e:
        assert_conforms(hangs, 'grpo_advantages', timeout=0.3)
    msg = str(e.value)
    assert 'does not conform: fn did not return within 0.3 s (timeout)' in msg
    assert 'rewards = torch.tensor(' in msg  # the case it hung on
    assert time.perf_counter() - t0 < 10  # no case after the first timeout
    with pytest.raises(AssertionError) as e:
        check_vectors(hangs, 'k3_kl', VECTORS, timeout=0.3)
    lines = str(e.value).splitlines()
    assert lines[0].startswith('6 of 6 k3_kl vectors of hara_ref')
    assert lines[1].startswith('[k3_kl-00] k3_kl(clamp=False) does not conform: fn did not return')
    assert sum('not run: a case before it timed out' in x for x in lines) == 5


def test_limits_are_checked():
    ok = lambda r, g: group_advantages(r, g)  # noqa: E731
    for kw, msg in [
        (dict(atol=-1e-9), 'atol must be a finite real number >= 0, got -1e-09'),
        (dict(rtol=float('inf')), 'rtol must be a finite real number >= 0, got inf'),
        (dict(timeout=0), 'timeout must be a finite real number > 0, got 0'),
        (dict(max_examples=0), 'max_examples must be an integer >= 1, got 0'),
    ]:
        with pytest.raises(ValueError, match=re.escape(msg)):
            assert_conforms(ok, 'grpo_advantages', **kw)


# ---------------------------------------------------------------- hara-ref check: usage errors

GOOD = '''import torch
from pathlib import Path


def k3(logp, ref_logp):
    Path('ran').write_text('a case ran')
    u = ref_logp - logp
    return torch.exp(u) - u - 1


def grpo(rewards, group_ids):
    Path('ran').write_text('a case ran')
    return rewards


NOT_A_FUNCTION = 3
'''
K3 = ['good:k3', '--quantity', 'k3_kl']
# argv, the problem the one stderr line names
USAGE = {
    'no-module': (
        ['nope_mod:k3', '--quantity', 'k3_kl'],
        "cannot import nope_mod: No module named",
    ),
    'syntax': (
        ['bad_syntax:k3', '--quantity', 'k3_kl'],
        r'SyntaxError in .*bad_syntax\.py, line 1',
    ),
    'raises': (
        ['raises:k3', '--quantity', 'k3_kl'],
        'cannot import raises: it raised RuntimeError: no GPU here',
    ),
    'no-function': (['good:nope', '--quantity', 'k3_kl'], "good has no 'nope'"),
    'not-callable': (
        ['good:NOT_A_FUNCTION', '--quantity', 'k3_kl'],
        r'good:NOT_A_FUNCTION is not a function \(its type is int\)',
    ),
    'target-form': (['good', '--quantity', 'k3_kl'], "target must be MODULE:FUNCTION, got 'good'"),
    'no-quantity': (['good:k3'], 'the following arguments are required: --quantity'),
    'bad-quantity': (['good:k3', '--quantity', 'kl'], "invalid choice: 'kl'"),
    'unknown-flag': (K3 + ['--fast'], 'unrecognized arguments: --fast'),
    'unknown-option': (K3 + ['--option', 'eps=1e-4'], "k3_kl has no option 'eps'"),
    'option-form': (K3 + ['--option', 'clamp'], "--option needs KEY=VALUE, got 'clamp'"),
    'option-twice': (
        K3 + ['--option', 'clamp=true', '--option', 'clamp=false'],
        '--option clamp is given twice',
    ),
    'bad-convention': (
        ['good:grpo', '--quantity', 'grpo_advantages', '--option', 'convention=ppo'],
        r"convention must be one of \('grpo', .*\), got 'ppo'",
    ),
    'bad-option-value': (
        ['good:k3', '--quantity', 'hara_weights', '--option', 'kappa=-1'],
        'kappa must be a finite real number >= 0, got -1',
    ),
    'examples-0': (K3 + ['--examples', '0'], '--examples must be an integer >= 1, got 0'),
    'examples-not-int': (K3 + ['--examples', '2.5'], "invalid int value: '2.5'"),
    'atol-negative': (K3 + ['--atol', '-1'], '--atol must be a finite real number >= 0, got -1.0'),
    'rtol-nan': (K3 + ['--rtol', 'nan'], '--rtol must be a finite real number >= 0, got nan'),
    'timeout-0': (K3 + ['--timeout', '0'], '--timeout must be a finite real number > 0, got 0.0'),
    'equal-groups': (K3 + ['--equal-groups'], '--equal-groups does not apply to k3_kl'),
    'layout': (K3 + ['--layout', 'trl'], '--layout does not apply to k3_kl'),
    'bad-layout': (K3 + ['--layout', 'verl'], "argument --layout: invalid choice: 'verl'"),
    'no-vectors-folder': (K3 + ['--vectors', 'missing'], 'vectors folder missing does not exist'),
    'not-a-set': (K3 + ['--vectors', '.'], r'\. holds no vector set: it has no index\.json'),
    'no-vectors-for-options': (
        [
            'good:k3',
            '--quantity',
            'hara_weights',
            '--option',
            'kappa=0.5',
            '--vectors',
            str(VECTORS),
        ],
        r"no hara_weights vectors with options \{'kappa': 0\.5",
    ),
}


@pytest.mark.parametrize('what', list(USAGE))
def test_check_usage_error_is_one_line_rc_2_before_any_case(what, tmp_path, monkeypatch, capsys):
    argv, problem = USAGE[what]
    mods = dict(good=GOOD, bad_syntax='def k3(:\n', raises="raise RuntimeError('no GPU here')\n")
    for name, text in mods.items():
        (tmp_path / f"{name}.py").write_text(text)
        monkeypatch.delitem(sys.modules, name, raising=False)  # imported fresh from tmp_path
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, 'path', list(sys.path))
    assert check_cli(argv) == 2
    out, err = capsys.readouterr()
    assert out == '' and err.count('\n') == 1 and err.startswith('hara-ref check: '), err
    assert re.search(problem, err), err
    assert not (tmp_path / 'ran').exists()  # no case ran


def test_check_help_lists_quantities_options_and_conventions():
    text = check_parser().format_help()
    for name, q in QUANTITIES.items():
        assert f"  {name}: fn({', '.join(q.inputs)}) -> {q.output}" in text
        for k, v in q.options.items():
            assert f"{k}={v!r}" in text
    for line in [
        "'grpo': method='grpo', eps=1e-06 (δ, added to the std), singleton='zero' (a group of one)",
        "'trl': method='grpo', eps=0.0001 (δ, added to the std), singleton='zero' (a group of one)",
        "'verl': method='grpo', eps=1e-06 (δ, added to the std), singleton='verl' (a group of one: "
        'mean 0, std 1, float32 constants: 1 + δ in float32)',
        "'trl_batch': method='grpo', eps=0.0001 (δ, added to the std), scale='batch' (the std: the "
        "group's, or the batch's), singleton='zero' (a group of one)",
        "empty_rows: one of 'count', 'skip'",
        "agg: one of 'token-mean', 'seq-mean-token-mean', 'seq-mean-token-sum', ",
    ]:
        assert line in text, line
    assert '--timeout' in text and 'Exit code 0' in text


# ---------------------------------------------------------------- hara-ref check, as a user runs it


def _hara_ref(cwd, *args):
    exe = shutil.which('hara-ref') or str(Path(sys.executable).parent / 'hara-ref')
    env = dict(os.environ, HF_HUB_OFFLINE='1', TRANSFORMERS_OFFLINE='1', OMP_NUM_THREADS='1')
    return subprocess.run(
        [exe, *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=env
    )


def test_check_imports_from_the_current_directory_and_names_the_convention(
    tmp_path, monkeypatch, capsys
):
    """The issue's case: a package in the working directory with TRL's δ, checked against 'grpo'.
    The console script imports it from its working directory; the passing convention and the
    syntax error then run `main` in this process (a new process spends ~3 s importing torch and
    POT), the module forgotten between the two as a new process would."""
    (tmp_path / 'mypkg').mkdir()
    (tmp_path / 'mypkg' / '__init__.py').write_text('')
    (tmp_path / 'mypkg' / 'adv.py').write_text(
        'from hara_ref.rlvr.grpo import group_advantages\n\n\n'
        'def grpo_advantages(rewards, group_ids):\n'
        '    return group_advantages(rewards, group_ids, eps=1e-4)\n'
    )
    argv = [
        'check',
        'mypkg.adv:grpo_advantages',
        '--quantity',
        'grpo_advantages',
        '--examples',
        '30',
    ]
    r = _hara_ref(tmp_path, *argv)
    assert r.returncode == 1, r.stderr
    assert "convention='grpo' means method='grpo', eps=1e-06 (δ, added to the std)" in r.stdout
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, 'path', list(sys.path))  # `load_target` puts the directory first
    forget = lambda: [sys.modules.pop(m, None) for m in ('mypkg.adv', 'mypkg')]
    forget()
    try:
        rc = main([*argv, '--option', 'convention=trl', '--vectors', str(VECTORS)])
        out, err = capsys.readouterr()
        assert rc == 0, out + err
        assert out.strip().endswith(f"7 vectors of hara_ref {hara_ref.__version__}")
        forget()
        (tmp_path / 'mypkg' / 'adv.py').write_text('def grpo_advantages(:\n')
        rc = main(argv)
        out, err = capsys.readouterr()
        assert rc == 2 and out == '' and err.count('\n') == 1, err
        assert 'cannot import mypkg.adv: SyntaxError in' in err
    finally:
        forget()


def test_check_times_out_a_busy_function(tmp_path):
    "A function that spins (and holds the GIL between switches) fails on its case, rc 1."
    (tmp_path / 'spin.py').write_text('def k3(logp, ref_logp):\n    while True:\n        pass\n')
    r = _hara_ref(tmp_path, 'check', 'spin:k3', '--quantity', 'k3_kl', '--timeout', '1')
    assert r.returncode == 1, r.stderr
    assert 'k3_kl(clamp=False) does not conform: fn did not return within 1 s (timeout)' in r.stdout
    assert 'logp = torch.tensor(' in r.stdout


# ---------------------------------------------------------------- edge families
# Each broken implementation below passes the cases drawn before the edge families
# (`cases=dict(edges=False)`, the same specs as before) and fails with them. Checked by hand on the
# commit before the edge families (3fd73bf): `assert_conforms` at its defaults (200 cases, seed 0)
# passed every one of them (label_order_blocks also at seeds 1 and 2).


def index_by_id(r, g):
    "GRPO with each group's statistics stored at index `id` (bincount-style): needs ids >= 0."
    n = int(g.max()) + 1
    r = r.double()
    cnt = torch.zeros(n, dtype=r.dtype).index_add_(0, g, torch.ones_like(r))
    mean = torch.zeros(n, dtype=r.dtype).index_add_(0, g, r) / cnt.clamp(min=1)
    dev = r - mean[g]
    var = torch.zeros(n, dtype=r.dtype).index_add_(0, g, dev * dev) / (cnt - 1).clamp(min=1)
    return torch.where(cnt[g] > 1, dev / (var.sqrt()[g] + 1e-6), 0.0)


def id_zero_is_padding(r, g):
    "GRPO where group id 0 marks padding rows (advantage 0)."
    return torch.where(g != 0, group_advantages(r, g), 0.0)


def label_order_blocks(r, g):
    """GRPO with a fast path for contiguous groups of one size: block k of r.view(P, G) gets the
    statistics of the k-th smallest id, right only when the blocks come in id order."""
    uniq, cnt = torch.unique(g, return_counts=True)
    P, G = len(uniq), len(r) // len(uniq)
    contiguous = int((g[1:] != g[:-1]).sum()) + 1 == P
    if not (contiguous and bool((cnt == G).all()) and G > 1):
        return group_advantages(r, g)
    r = r.double()
    mean = torch.stack([r[g == u].mean() for u in uniq])  # (P,) in id order
    std = torch.stack([r[g == u].std() for u in uniq])  # (P,)
    return ((r.view(P, G) - mean[:, None]) / (std[:, None] + 1e-6)).flatten()


def zero_as_positive(x, A):
    "The weight map with A = 0 treated as positive."
    s = torch.where(A >= 0, 1.0, -1.0).to(x.dtype)[:, None]
    return (1 + s * (x - 1)).clamp(0.5, 2.0)


def zero_x_is_padding(x, A):
    "x = 0 read as padding: weight 1 (the oracle's weight there is at the clip, 0.5 or 2)."
    return torch.where(x == 0, torch.ones_like(x), hara_weights(x, A))


def clip_15(x, A):
    "The weight map clipped at 1.5."
    return hara_weights(x, A, w_max=1.5)


# quantity, broken implementation, options, the flag of the family that catches it
EDGE_BROKEN = [
    ('grpo_advantages', index_by_id, {}, 'negative-ids'),
    ('grpo_advantages', id_zero_is_padding, {}, 'id-0'),
    ('grpo_advantages', label_order_blocks, {}, 'unsorted-ids'),
    ('hara_weights', zero_as_positive, {}, 'zero-advantage'),
    ('hara_weights', zero_x_is_padding, {}, 'weight-at-clip'),
    ('k3_kl', lambda lp, ref: k3_kl(lp, ref, clamp=True), {}, 'k3-clamped'),
    ('k3_kl', lambda lp, ref: k3_kl(lp, ref), dict(clamp=True), 'k3-clamped'),
]


@pytest.mark.parametrize(
    'name, fn, opts, flag',
    EDGE_BROKEN,
    ids=[f'{b[0]}-{b[3]}-{i}' for i, b in enumerate(EDGE_BROKEN)],
)
def test_each_edge_family_catches_what_the_cases_before_it_miss(name, fn, opts, flag):
    assert_conforms(fn, name, cases=dict(edges=False), **opts)  # missed without the edge families
    with pytest.raises(AssertionError) as e:
        assert_conforms(fn, name, **opts)
    flags = next(x for x in str(e.value).splitlines() if x.startswith('flags: '))
    assert flag in flags.split(': ')[1].split(', '), flags


def test_committed_vectors_catch_the_edge_bugs():
    "A clip of 1.5, A = 0 as positive, and each edge family's bug fail the committed vectors."
    index = read_vectors(VECTORS)
    flags = {c['id']: c['flags'] for c in index['cases']}
    clip_15_e2e = lambda h, m, r, g: hara_advantages(h, m, r, g, w_max=1.5)[0]  # noqa: E731
    for name, fn, opts, flag in EDGE_BROKEN + [
        ('hara_weights', clip_15, {}, 'weight-at-clip'),
        ('hara_advantages', clip_15_e2e, {}, 'negative-ids'),
    ]:
        with pytest.raises(AssertionError) as e:
            check_vectors(fn, name, VECTORS, **opts)
        failed = re.findall(r'^\[([\w-]+)\]', str(e.value), re.M)
        assert failed and any(flag in flags[c] for c in failed), (fn, failed)


# ---------------------------------------------------------------- restrictions mean what they say


def test_case_restrictions_are_kept_or_refused_by_name():
    from hypothesis import given, settings

    @settings(max_examples=60, database=None, deadline=None)
    @given(
        case_specs('tokens', min_len=1),
        case_specs('batch', min_len=2),
        case_specs('labels', layout='trl'),
        case_specs('batch', layout='trl'),
    )
    def kept(tokens, batch, labels, trl_batch):
        assert build_case('tokens', tokens)['mask'].any(-1).all()  # no empty row, holes or not
        assert (build_case('batch', batch)['mask'].sum(-1) >= 2).all()
        for fam, spec in (('labels', labels), ('batch', trl_batch)):
            ids = build_case(fam, spec)['group_ids']
            G, P = spec['sizes'][0], len(spec['sizes'])
            assert G >= 2 and torch.equal(ids, torch.arange(P).repeat_interleave(G))

    kept()
    with pytest.raises(
        ValueError,
        match=re.escape(f"dtypes must be a non-empty tuple of {tuple(DTYPES)}, got ('float16',)"),
    ):
        assert_conforms(k3_kl, 'k3_kl', cases=dict(dtypes=('float16',)))
    with pytest.raises(TypeError, match="tokens cases have no restriction 'layout'"):
        assert_conforms(k3_kl, 'k3_kl', cases=dict(layout='trl'))
    for restrict, msg in [
        (dict(layout='verl'), "layout must be one of ('any', 'trl'), got 'verl'"),
        (dict(dtypes='float32'), "got 'float32'"),
        (dict(equal_groups=1), 'equal_groups must be True or False, got 1'),
    ]:
        with pytest.raises(ValueError, match=re.escape(msg)):
            case_specs('labels', **restrict)
    with pytest.raises(ValueError, match=re.escape('min_len must be an integer in [0, 6], got 7')):
        case_specs('tokens', min_len=7)


def trl_layout_grpo(rewards, group_ids):
    "GRPO on TRL's layout: rewards.view(-1, G), G the size of the first group, δ = 1e-4."
    G = int((group_ids == group_ids[0]).sum())
    grouped = rewards.double().view(-1, G)  # (P, G)
    std = grouped.std(1) if G > 1 else torch.zeros(len(grouped), dtype=torch.float64)
    return ((grouped - grouped.mean(1, keepdim=True)) / (std[:, None] + 1e-4)).flatten()


def test_trl_layout_needs_no_adapter(capsys):
    assert_conforms(trl_layout_grpo, 'grpo_advantages', cases=dict(layout='trl'), convention='trl')
    with pytest.raises(AssertionError):
        assert_conforms(trl_layout_grpo, 'grpo_advantages', convention='trl')
    argv = ['check', 'tests.test_testing:trl_layout_grpo', '--quantity', 'grpo_advantages']
    assert main(argv + ['--option', 'convention=trl', '--layout', 'trl']) == 0
    assert 'PASS' in capsys.readouterr().out


def test_trl_own_code_conforms_to_its_conventions():
    "TRL's lines, unchanged: 'group' conforms to 'trl', 'batch' to 'trl_batch' (float32, bf16)."
    pytest.importorskip('trl')
    from hara_ref.testing.trainers import trl_source_advantages

    low = dict(dtypes=('float32', 'bfloat16'))
    for layout in (dict(layout='trl'), dict(equal_groups=True)):
        cases = layout | low
        assert_conforms(trl_source_advantages(), 'grpo_advantages', cases=cases, convention='trl')
        batch = trl_source_advantages('batch')
        assert_conforms(batch, 'grpo_advantages', cases=cases, convention='trl_batch')
        with pytest.raises(AssertionError, match="convention='trl' means"):
            assert_conforms(
                batch, 'grpo_advantages', cases=cases, convention='trl', max_examples=50
            )


# ---------------------------------------------------------------- every option of the oracle


def test_hara_advantages_takes_every_option_of_the_oracle():
    opts = set(QUANTITIES['hara_advantages'].options)
    # tensors a caller adds (inputs, not options) and the novelty's internals are left out
    want = set(keyword_options(hara_advantages)) - {'advantages', 'boundaries', 'outcomes'}
    want |= set(keyword_options(hara_novelty)) - {'keep', 'checked', 'compute_dtype', 'outcomes'}
    assert (
        opts == want and {'kappa', 'L_b', 'alpha', 'reg', 'w_max', 'reference', 'span_len'} <= opts
    )
    kw = dict(kappa=0.5, L_b=8, alpha=0.5, reg=0.1, w_max=1.5, reference='barycenter')

    def mine(h, m, r, g):
        return hara_advantages(h, m, r, g, **kw)[0]

    assert_conforms(mine, 'hara_advantages', max_examples=3, **kw)
    with pytest.raises(AssertionError, match=r'hara_advantages\(.*kappa=1\.0'):
        assert_conforms(mine, 'hara_advantages', max_examples=3)
    span = dict(granularity='span', span_len=2)
    assert_conforms(
        lambda h, m, r, g: hara_advantages(h, m, r, g, **span)[0],
        'hara_advantages',
        max_examples=2,
        **span,
    )
    with pytest.raises(ValueError, match=r"granularity must be one of \('seq', 'tok', 'span'\)"):
        assert_conforms(mine, 'hara_advantages', granularity='token')


# ---------------------------------------------------------------- verl's own code
# verl 0.9.1, verl/trainer/ppo/core_algos.py (Apache-2.0): compute_grpo_outcome_advantage, agg_loss
# and compute_policy_loss_vanilla, and masked_sum from verl/utils/torch_functional.py, transcribed:
# the code lines as verl has them (formatted by ruff); docstrings, decorators, type hints and long
# comments left out. test_verl_own_code_read_from_the_installed_verl runs verl's files themselves.


def verl_compute_grpo_outcome_advantage(
    token_level_rewards,
    response_mask,
    index,
    epsilon=1e-6,
    norm_adv_by_std_in_grpo=True,
    config=None,
):
    scores = token_level_rewards.sum(dim=-1)

    id2score = defaultdict(list)
    id2mean = {}
    id2std = {}

    with torch.no_grad():
        bsz = scores.shape[0]
        for i in range(bsz):
            id2score[index[i]].append(scores[i])
        for idx in id2score:
            if len(id2score[idx]) == 1:
                id2mean[idx] = torch.tensor(0.0)
                id2std[idx] = torch.tensor(1.0)
            elif len(id2score[idx]) > 1:
                scores_tensor = torch.stack(id2score[idx])
                id2mean[idx] = torch.mean(scores_tensor)
                id2std[idx] = torch.std(scores_tensor)
            else:
                raise ValueError(f"no score in prompt index: {idx}")
        for i in range(bsz):
            if norm_adv_by_std_in_grpo:
                scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
            else:
                scores[i] = scores[i] - id2mean[index[i]]
        scores = scores.unsqueeze(-1) * response_mask

    return scores, scores


def verl_masked_sum(values, mask, axis=None):
    valid_values = torch.where(mask.bool(), values, 0.0)
    return (valid_values * mask).sum(axis=axis)


def verl_agg_loss(
    loss_mat,
    loss_mask,
    loss_agg_mode,
    dp_size=1,
    batch_num_tokens=None,
    global_batch_size=None,
    loss_scale_factor=None,
):
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            if dp_size > 1:
                raise ValueError("(global) batch_num_tokens is required when dp_size > 1")
            batch_num_tokens = loss_mask.sum()
        loss = verl_masked_sum(loss_mat, loss_mask) / batch_num_tokens * dp_size
    elif loss_agg_mode == "token-sum":
        loss = verl_masked_sum(loss_mat, loss_mask) * dp_size
    elif loss_agg_mode in ["seq-mean-token-sum", "seq-mean-token-sum-norm"]:
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)  # token-sum
        seq_mask = (torch.sum(loss_mask, dim=-1) > 0).float()  # exclude fully masked sequences
        if global_batch_size is None:
            if dp_size > 1:
                raise ValueError("global_batch_size is required when dp_size > 1")
            global_batch_size = seq_mask.sum()
        loss = verl_masked_sum(seq_losses, seq_mask) / global_batch_size * dp_size  # seq-mean
        if loss_agg_mode == "seq-mean-token-sum-norm":
            if loss_scale_factor is None:
                horizon = loss_mask.shape[-1]
                loss_scale_factor = horizon
            loss /= loss_scale_factor
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_mask = torch.sum(loss_mask, dim=-1)  # per-sequence token count
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_mask + 1e-8)  # token-mean
        seq_mask = (seq_mask > 0).float()  # exclude fully masked sequences
        if global_batch_size is None:
            if dp_size > 1:
                raise ValueError("global_batch_size is required when dp_size > 1")
            global_batch_size = seq_mask.sum()
        loss = verl_masked_sum(seq_losses, seq_mask) / global_batch_size * dp_size  # seq-mean
    else:
        raise ValueError(f"Invalid loss_agg_mode: {loss_agg_mode}")

    return loss


def verl_policy_loss_vanilla(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, clip_ratio, clip_ratio_c, info
):
    "compute_policy_loss_vanilla's loss (config's fields as arguments; metrics left out)."
    cliprange_low = clip_ratio
    cliprange_high = clip_ratio
    negative_approx_kl = log_prob - old_log_prob
    negative_approx_kl = torch.clamp(negative_approx_kl, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - cliprange_low, 1 + cliprange_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    return verl_agg_loss(
        loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **info
    )


def verl_grpo(rewards, group_ids):
    "verl's advantages as the kit calls them: one token per response, verl's numpy `index`."
    r = torch.as_tensor(rewards)
    one = torch.ones(len(r), 1, dtype=r.dtype)
    return verl_compute_grpo_outcome_advantage(r[:, None].clone(), one, np.asarray(group_ids))[0][
        :, 0
    ]


def verl_loss(agg, as_trainer):
    "verl's loss as the kit calls it; `as_trainer`: global_batch_size = B, as verl's trainer."

    def fn(logp, old_logp, advantages, mask):
        info = dict(global_batch_size=len(mask)) if as_trainer else {}
        A = advantages[:, None] * mask
        return verl_policy_loss_vanilla(old_logp, logp, A, mask.bool(), agg, 0.2, 3.0, info)

    return fn


def test_verl_transcribed_conforms_to_its_conventions():
    "verl's singleton constants are float32: 'verl' takes them, its 1 + δ rounded to float32."
    assert_conforms(verl_grpo, 'grpo_advantages', convention='verl')
    one = verl_grpo(torch.tensor([1.0], dtype=torch.float64), torch.tensor([5]))
    assert one.item() == 1 / float(torch.tensor(1.0) + 1e-6) != 1 / (1 + 1e-6)
    for agg in AGG_MODES:
        kw = dict(agg=agg, dual_clip=3.0, max_examples=40)
        assert_conforms(verl_loss(agg, False), 'ppo_clip_loss', empty_rows='skip', **kw)
        assert_conforms(verl_loss(agg, True), 'ppo_clip_loss', empty_rows='count', **kw)
        if agg != 'token-mean':  # an empty row tells the two apart
            with pytest.raises(AssertionError, match='empty-row'):
                assert_conforms(verl_loss(agg, False), 'ppo_clip_loss', **kw)


@pytest.mark.skipif(
    importlib.util.find_spec('verl') is None,
    reason='verl is not installed (pip install --no-deps verl)',
)
def test_verl_own_code_read_from_the_installed_verl():
    "verl's own files, run unchanged (verl_source): the same conventions as the transcription."
    from hara_ref.testing.trainers import verl_source_advantages, verl_source_loss

    assert_conforms(verl_source_advantages(), 'grpo_advantages', convention='verl')
    for agg in AGG_MODES:
        kw = dict(agg=agg, dual_clip=3.0, max_examples=40)
        assert_conforms(verl_source_loss(agg), 'ppo_clip_loss', empty_rows='skip', **kw)
        assert_conforms(verl_source_loss(agg, as_trainer=True), 'ppo_clip_loss', **kw)
