"""The docs builder (tools/docs.py): pages exist, figures are embedded, math is there and typeset by
the local KaTeX, no error output."""

import base64
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / 'tools'))
import docs

TINY = {
    'cells': [
        {
            'cell_type': 'code',
            'metadata': {},
            'execution_count': None,
            'outputs': [],
            'source': '#| default_exp tiny',
        },
        {
            'cell_type': 'markdown',
            'metadata': {},
            'source': (
                '# A tiny chapter\n> For the docs test.\n\nInline $a_i*b_j < c$, a display\n'
                '$$\\sum_t \\frac{1}{L_i}\\,δ_{h_t} \\tag{1}$$\n'
                'and [the maths](hara_math.ipynb#novelty).'
            ),
        },
        {
            'cell_type': 'code',
            'metadata': {},
            'execution_count': None,
            'outputs': [],
            'source': '#| hide\nimport sys, matplotlib.pyplot as plt\nhidden_marker = 1',
        },
        {
            'cell_type': 'code',
            'metadata': {},
            'execution_count': None,
            'outputs': [],
            'source': (
                'fig, ax = plt.subplots(figsize=(3, 2)); ax.plot([0, 1], [1, 0]); plt.show()\n'
                'print("two < three"); print("a warning", file=sys.stderr)\n6 * 7'
            ),
        },
    ],
    'metadata': {
        'kernelspec': {'display_name': 'python3', 'language': 'python', 'name': 'python3'}
    },
    'nbformat': 4,
    'nbformat_minor': 5,
}


def katex_or_skip():
    try:
        return docs.katex_bundle()
    except (SystemExit, subprocess.CalledProcessError) as e:
        pytest.skip(f'KaTeX not fetchable here: {e}')


@pytest.fixture(scope='module')
def site(tmp_path_factory):
    """A site of three pages: a tiny executed notebook with a figure, the mathematics page, and the
    index."""
    katex_or_skip()
    tmp = tmp_path_factory.mktemp('docs')
    (tmp / 'nbs').mkdir()
    (tmp / 'nbs' / 'tiny.ipynb').write_text(json.dumps(TINY))
    docs.build(
        [
            tmp / 'nbs' / 'tiny.ipynb',
            ROOT / 'nbs' / 'hara_math.ipynb',
            ROOT / 'nbs' / 'index.ipynb',
        ],
        tmp / 'site',
    )
    return tmp / 'site'


def page(site, name):
    return (site / f'{name}.html').read_text()


def test_pages_exist(site):
    assert sorted(p.name for p in site.glob('*.html')) == [
        'hara_math.html',
        'index.html',
        'tiny.html',
    ]
    assert '<h1 id="a-tiny-chapter">A tiny chapter</h1>' in page(site, 'tiny')


def test_outputs_rendered_hidden_cells_not(site):
    s = page(site, 'tiny')
    assert (
        '<pre class="output stdout">two &lt; three\n</pre>' in s
        and '<pre class="output">42</pre>' in s
    )
    assert 'class="output stderr">a warning' in s
    assert 'hidden_marker' not in s and '#|' not in s


def test_figures_embedded(site):
    imgs = re.findall(r'<img [^>]*src="([^"]+)"', page(site, 'tiny'))
    assert len(imgs) == 1 and imgs[0].startswith('data:image/png;base64,')
    png = base64.b64decode(imgs[0].split(',', 1)[1])
    assert png[:8] == b'\x89PNG\r\n\x1a\n' and len(png) > 2000


def test_math_marked_for_local_katex(site):
    s = page(site, 'tiny')
    # markdown left the math alone (no <em> from *)
    assert '<span class="math inline">a_i*b_j &lt; c</span>' in s
    assert '<span class="math display">\\sum_t' in s
    for name in ('tiny', 'hara_math', 'index'):
        s = page(site, name)
        srcs = re.findall(r'<script[^>]* src="([^"]+)"', s) + re.findall(
            r'<link[^>]* href="([^"]+)"', s
        )
        assert sorted(srcs) == ['katex/katex.min.css', 'katex/katex.min.js']
        assert not re.search(r'(src|href)="(https?:)?//', s), (
            f'{name} loads something from the network'
        )
        assert all((site / p).is_file() for p in srcs)
    css = (site / 'katex' / 'katex.min.css').read_text()
    fonts = set(re.findall(r'url\((fonts/[\w-]+\.woff2)\)', css))
    assert len(fonts) > 10 and all((site / 'katex' / f).is_file() for f in fonts)


def test_links_between_notebooks_become_pages(site):
    assert '<a href="hara_math.html#novelty">' in page(site, 'tiny')
    assert 'id="novelty"' in page(site, 'hara_math')


@pytest.mark.skipif(not shutil.which('node'), reason='node not installed')
def test_katex_typesets_every_formula(site):
    """Every formula of the pages parses in KaTeX (what the browser will run), the mathematics
    page's included."""
    tex = [
        (m[1] == 'display', m[2])
        for name in ('tiny', 'hara_math')
        for m in re.finditer(
            r'<(?:span|div) class="math (inline|display|block)">(.*?)</(?:span|div)>',
            page(site, name),
            re.S,
        )
    ]
    assert len(tex) > 100
    import html

    js = (
        "const k = require(process.argv[1]); let bad = [];"
        "for (const [d, t] of JSON.parse(require('fs').readFileSync(0, 'utf8')))"
        "  try { k.renderToString(t, {displayMode: d, throwOnError: true, strict: false}) } catch "
        "(e) { bad.push(t + ': ' + e.message) }"
        "console.log(JSON.stringify(bad))"
    )
    out = subprocess.run(
        ['node', '-e', js, str(site / 'katex' / 'katex.min.js')],
        input=json.dumps([(d, html.unescape(t)) for d, t in tex]),
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout) == []


def test_no_error_output(site):
    for name in ('tiny', 'hara_math', 'index'):
        assert 'class="output error"' not in page(
            site, name
        ) and 'Traceback (most recent call last)' not in page(site, name)


def test_a_failing_notebook_stops_the_build(tmp_path):
    katex_or_skip()
    nb = {
        **TINY,
        'cells': [
            {
                'cell_type': 'code',
                'metadata': {},
                'execution_count': None,
                'outputs': [],
                'source': '1 / 0',
            }
        ],
    }
    (tmp_path / 'bad.ipynb').write_text(json.dumps(nb))
    with pytest.raises(RuntimeError, match=r'bad.ipynb raised(.|\n)*ZeroDivisionError'):
        docs.build([tmp_path / 'bad.ipynb'], tmp_path / 'site')
    assert not (tmp_path / 'site' / 'bad.html').exists()


def test_index_links_every_chapter(tmp_path):
    """Every notebook of nbs/ is in the book's chapter map, linked, and in every page's navigation
    (rendered without running); the front page links the book."""
    katex_or_skip()
    nbs = docs.all_notebooks()
    docs.build(nbs, tmp_path, execute=False)
    assert 'href="book.html"' in (tmp_path / 'index.html').read_text()
    book = (tmp_path / 'book.html').read_text()
    table = book[book.index('The chapters</h2>') :]
    for nb in nbs:
        if nb.stem in ('index', 'book'):
            continue
        assert f'<td><a href="{nb.stem}.html"><code>{nb.stem}</code></a></td>' in table, (
            f'{nb.stem} missing from the chapter map'
        )
        assert (tmp_path / f'{nb.stem}.html').is_file()
    nav = re.search(r'<nav>(.*?)</nav>', (tmp_path / '13_hara.html').read_text(), re.S)[1]
    assert re.findall(r'href="(\w+)\.html"', nav)[1:] == ['index', 'book', 'hara_math'] + [
        n.stem for n in nbs if n.stem not in ('index', 'book', 'hara_math')
    ]


def test_make_test_skips_slow_cells_and_make_docs_runs_them():
    """`nbdev_test` (make test) skips the cells carrying a flag of settings.ini's `tst_flags`, which
    it splits on whitespace: `slow` must be one of them; the docs builder skips only `notest`."""
    from nbdev.config import get_config

    assert {'notest', 'slow'} <= set(get_config(path=ROOT).tst_flags.split())
    assert docs.SKIP_FLAGS == {'notest'}
