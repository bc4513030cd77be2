"""The conformance kit (chapter 22_conformance): the oracle conforms to itself, each deliberately
broken implementation fails with a short shrunk case that pastes into a test, and the committed
vectors are the oracle's own regression suite."""

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
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
import hara_ref
from hara_ref.testing.vectors import check_cli, check_parser, check_vectors, read_vectors
from hara_ref.testing.vectors import write_vectors
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
                         convention='rloo') == 4  # fmt: skip
    with pytest.raises(
        AssertionError, match=r'of 4 grpo_advantages vectors of hara_ref [\d.]+ fail'
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
        r'the case list in .* was edited \(57 cases\): cases were added, removed or renamed',
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
    assert check_vectors(k3_kl, 'k3_kl', tmp_path) == 4
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
    assert lines[0].startswith('4 of 4 k3_kl vectors of hara_ref')
    assert lines[1].startswith('[k3_kl-00] k3_kl(clamp=False) does not conform: fn did not return')
    assert sum('not run: a case before it timed out' in x for x in lines) == 3


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
    'no-vectors-folder': (K3 + ['--vectors', 'missing'], 'vectors folder missing does not exist'),
    'not-a-set': (K3 + ['--vectors', '.'], r'\. holds no vector set: it has no index\.json'),
    'no-vectors-for-options': (
        K3 + ['--option', 'clamp=true', '--vectors', str(VECTORS)],
        r"no k3_kl vectors with options \{'clamp': True\}",
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
        "'verl': method='grpo', eps=1e-06 (δ, added to the std), singleton='verl' (a group of one)",
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


def test_check_imports_from_the_current_directory_and_names_the_convention(tmp_path):
    "The issue's case: a package in the working directory with TRL's δ, checked against 'grpo'."
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
    r = _hara_ref(tmp_path, *argv, '--option', 'convention=trl', '--vectors', str(VECTORS))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith(f"4 vectors of hara_ref {hara_ref.__version__}")
    (tmp_path / 'mypkg' / 'adv.py').write_text('def grpo_advantages(:\n')
    r = _hara_ref(tmp_path, *argv)
    assert r.returncode == 2 and r.stdout == '' and r.stderr.count('\n') == 1, r.stderr
    assert 'cannot import mypkg.adv: SyntaxError in' in r.stderr


def test_check_times_out_a_busy_function(tmp_path):
    "A function that spins (and holds the GIL between switches) fails on its case, rc 1."
    (tmp_path / 'spin.py').write_text('def k3(logp, ref_logp):\n    while True:\n        pass\n')
    r = _hara_ref(tmp_path, 'check', 'spin:k3', '--quantity', 'k3_kl', '--timeout', '1')
    assert r.returncode == 1, r.stderr
    assert 'k3_kl(clamp=False) does not conform: fn did not return within 1 s (timeout)' in r.stdout
    assert 'logp = torch.tensor(' in r.stdout
