"""The committed outputs of the core chapters (tools/pages.py): the provenance hash follows the code
and the hara_ref modules a notebook imports; `check` catches stale outputs, unclean outputs and
outputs off the core path. On tiny copies in a temporary folder, never on the real notebooks."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / 'tools'))
import pages  # noqa: E402

MODULES = {
    'hara_ref/__init__.py': '__version__ = "0"\n',
    'hara_ref/ot/__init__.py': '',
    'hara_ref/ot/fgw.py': 'from ..rlvr.data import planted\n\ndef fgw(): return planted()\n',
    'hara_ref/rlvr/__init__.py': '',
    'hara_ref/rlvr/data.py': 'def planted(): return 1\n',
    'hara_ref/rlvr/grpo.py': 'def grpo(): return 2\n',
    'hara_ref/hara/__init__.py': '',
    'hara_ref/hara/weights.py': 'import hara_ref.rlvr.grpo\n',
}


def cell(src, outputs=(), cid=None, kind='code'):
    c = {'cell_type': kind, 'id': cid or f'c{abs(hash(src)) % 10**7:07d}', 'metadata': {}}
    c['source'] = src
    if kind == 'code':
        c.update(execution_count=None, outputs=list(outputs))
    return c


def stdout(text):
    return {'name': 'stdout', 'output_type': 'stream', 'text': [text]}


def write_nb(path, cells, rendered=True, root=None):
    nb = {'cells': cells, 'metadata': {}, 'nbformat': 4, 'nbformat_minor': 5}
    if rendered:
        nb['metadata'][pages.META] = {'sha256': pages.nb_hash(nb, root)}
    path.write_text(json.dumps(nb, indent=1))
    return nb


@pytest.fixture
def book(tmp_path):
    "A tiny project: hara_ref modules, a core chapter rendered clean, a chapter off the path."
    for name, text in MODULES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    nbs = tmp_path / 'nbs'
    (nbs / '1_rlvr').mkdir(parents=True)
    (nbs / 'core_path.txt').write_text('1_rlvr/01_core.ipynb\n')
    core = nbs / '1_rlvr' / '01_core.ipynb'
    write_nb(
        core,
        [
            cell('# A chapter', kind='markdown', cid='md000001'),
            cell('from hara_ref.ot.fgw import fgw', cid='import01'),
            cell('print(fgw())', [stdout('1\n')], cid='print001'),
            cell('#| hide\nx = 2', cid='hidden01'),
        ],
        root=tmp_path,
    )
    write_nb(nbs / '1_rlvr' / '03_side.ipynb', [cell('print(3)', cid='side0001')], rendered=False)
    return tmp_path, core


def edit(path, cid, **changes):
    nb = json.loads(path.read_text())
    c = next(c for c in nb['cells'] if c['id'] == cid)
    c.update(changes)
    path.write_text(json.dumps(nb))


def problems(root, capsys, **kw):
    rc = pages.check(root=root, **kw)
    out = capsys.readouterr().out.strip().splitlines()
    return rc, out[:-1], out[-1]


def test_imports_are_followed_within_hara_ref(book):
    root, _ = book
    srcs = ['import hara_ref.hara.weights', 'from hara_ref.ot import fgw\nimport numpy as np']
    got = [f.relative_to(root).as_posix() for f in pages.module_closure(srcs, root)]
    # fgw imports rlvr.data by a relative import, weights imports rlvr.grpo by name, and each
    # package's __init__ runs on the way
    assert got == sorted(MODULES)
    got = [f.relative_to(root).as_posix() for f in pages.module_closure([srcs[1]], root)]
    assert 'hara_ref/rlvr/data.py' in got and 'hara_ref/rlvr/grpo.py' not in got
    assert pages.module_closure(['%matplotlib inline\nimport torch'], root) == []


def test_hash_follows_code_cells_and_imported_modules(book):
    root, core = book
    nb = json.loads(core.read_text())
    h = pages.nb_hash(nb, root)
    nb['cells'][0]['source'] = '# Another title'  # markdown: not part of the hash
    assert pages.nb_hash(nb, root) == h
    (root / 'hara_ref/rlvr/grpo.py').write_text('def grpo(): return 3\n')  # not imported
    assert pages.nb_hash(nb, root) == h
    (root / 'hara_ref/rlvr/data.py').write_text('def planted(): return 2\n')  # imported by fgw
    h2 = pages.nb_hash(nb, root)
    assert h2 != h
    nb['cells'][2]['source'] = 'print(fgw() + 1)'
    assert pages.nb_hash(nb, root) != h2


def test_clean_rendered_chapter_passes(book, capsys):
    root, _ = book
    rc, probs, summary = problems(root, capsys)
    assert (rc, probs) == (0, [])
    assert '1/1 core notebooks rendered' in summary


def test_stale_hash_is_caught(book, capsys):
    root, core = book
    (root / 'hara_ref/rlvr/data.py').write_text('def planted(): return 5\n')
    rc, probs, _ = problems(root, capsys)
    assert rc == 1 and probs == [f'1_rlvr/01_core.ipynb: {pages.STALE}']
    write_nb(core, json.loads(core.read_text())['cells'], root=root)  # rendered again
    edit(core, 'print001', source='print(fgw() * 2)')
    assert problems(root, capsys)[1] == [f'1_rlvr/01_core.ipynb: {pages.STALE}']


@pytest.mark.parametrize(
    'output, what',
    [
        ({'name': 'stderr', 'output_type': 'stream', 'text': ['note\n']}, 'a stderr stream'),
        (stdout('/x.py:3: UserWarning: careful\n  warnings.warn(\n'), 'a Python warning'),
        (stdout(' 40%|████      | 4/10 [00:01<00:02, 3.10it/s]\n'), 'a progress bar'),
        (stdout('Timeout during comparison\n'), 'a math-verify timeout'),
        (
            {
                'output_type': 'error',
                'ename': 'ValueError',
                'evalue': 'x',
                'traceback': ['Traceback (most recent call last)', 'ValueError: x'],
            },
            'an error (ValueError)',
        ),
    ],
)
def test_unclean_output_is_caught_unless_marked(book, capsys, output, what):
    root, core = book
    edit(core, 'print001', outputs=[stdout('1\n'), output])
    rc, probs, _ = problems(root, capsys)
    assert rc == 1 and f'1_rlvr/01_core.ipynb: cell print001: {what} in the output' in probs
    # the marker is part of the code, so the notebook is rendered again with it
    nb = json.loads(core.read_text())
    nb['cells'][2]['source'] = f'{pages.MARKER}\nprint(fgw())'
    write_nb(core, nb['cells'], root=root)
    assert problems(root, capsys)[:2] == (0, [])


def test_missing_outputs_are_caught(book, capsys):
    root, core = book
    edit(core, 'print001', outputs=[])
    rc, probs, _ = problems(root, capsys)
    assert rc == 1 and probs == [
        '1_rlvr/01_core.ipynb: cell print001: shows nothing though it should (run make pages)'
    ]


def test_outputs_live_only_on_the_core_path(book, capsys):
    root, core = book
    side = root / 'nbs/1_rlvr/03_side.ipynb'
    edit(side, 'side0001', outputs=[stdout('3\n')])
    rc, probs, _ = problems(root, capsys)
    assert (
        rc == 1 and len(probs) == 1 and probs[0].startswith('1_rlvr/03_side.ipynb: cell side0001')
    )
    edit(side, 'side0001', outputs=[])
    # a core chapter with outputs but no hash; with neither it is only not rendered yet
    nb = json.loads(core.read_text())
    write_nb(core, nb['cells'], rendered=False)
    assert problems(root, capsys)[1] == [
        f'1_rlvr/01_core.ipynb: cell print001: outputs with no {pages.META} hash (run make pages)'
    ]
    write_nb(core, [c | {'outputs': []} if 'outputs' in c else c for c in nb['cells']], False)
    rc, probs, summary = problems(root, capsys)
    assert (rc, probs) == (0, []) and 'not rendered yet: 1_rlvr/01_core.ipynb' in summary
    assert problems(root, capsys, strict=True)[0] == 1


def test_shows_something():
    assert pages.shows_something('print(1)')
    assert pages.shows_something('fig, ax = plt.subplots()\nax.plot([1])')
    assert pages.shows_something('x = 1\nx')
    assert pages.shows_something('for i in range(2):\n    print(i)')
    assert not pages.shows_something('#| hide\nprint(1)')
    assert not pages.shows_something('test_eq(f(1), 2)')  # a call at the end may return None
    assert not pages.shows_something('def f():\n    print(1)')
    assert not pages.shows_something('x = 1\nx;')


def test_render_runs_as_nbdev_test(tmp_path):
    "Skipped cells are left without output, `slow` ones run, figures come out as PNG."
    nb = tmp_path / 'nb.ipynb'
    write_nb(
        nb,
        [
            cell('print("run")', [stdout('stale\n')], cid='run00001'),
            cell('x = 1', [stdout('stale\n')], cid='silent01'),
            cell('#| eval: false\nprint("no")', cid='noeval01'),
            cell('#| notest\nprint("no")', cid='notest01'),
            cell('#| slow\nprint("slow")', cid='slow0001'),
            cell('import matplotlib.pyplot as plt\nplt.plot([0, 1])\nplt.show()', cid='figure01'),
        ],
        rendered=False,
    )
    outs, not_run = run_in_subprocess(nb)
    assert outs['run00001'] == [stdout('run\n')] and outs['silent01'] == []  # no stale output
    assert sorted(not_run) == ['noeval01', 'notest01'] and outs['slow0001'] == [stdout('slow\n')]
    assert 'image/png' in outs['figure01'][0]['data']
    assert 'slow0001' in run_in_subprocess(nb, skip_slow=True)[1]


def run_in_subprocess(nb, skip_slow=False):
    "pages.run_notebook in a fresh process (it sets IN_TEST and the inline matplotlib backend)."
    code = (
        f'import json, sys; sys.path.insert(0, {str(ROOT / "tools")!r}); import pages; '
        f'print(json.dumps(pages.run_notebook(pages.Path({str(nb)!r}), {skip_slow})))'
    )
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_site_pages_are_scanned(book, tmp_path):
    root, _ = book
    site = tmp_path / 'site'
    site.mkdir()
    code = '<div class="highlight"><pre><span class="n">f</span>()</pre></div>'
    page = (
        f'{code}<pre class="output stdout">fine</pre>'
        '<div class="highlight"><pre>warnings.warn("in code is fine")</pre></div>'
        '<pre class="output stderr">UserWarning: x</pre>'
    )
    (site / '01_core.html').write_text(page)
    (site / '03_side.html').write_text(page)  # off the core path: not scanned
    assert pages.check_site(site, root) == [
        '01_core.html: a Python warning on the page',
        '01_core.html: stderr output on the page',
    ]
    marked = f'<div class="highlight"><pre><span class="c1">{pages.MARKER}</span></pre></div>'
    (site / '01_core.html').write_text(marked + '<pre class="output stderr">UserWarning: x</pre>')
    assert pages.check_site(site, root) == []
