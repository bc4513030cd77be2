"""The core path is self-contained: each core chapter uses only what it or an earlier core chapter
defines; the front page's route is the same list (`nbs/core_path.txt`)."""

import json
import re
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
tool = runpy.run_path(str(ROOT / 'tools' / 'core_path.py'))


def test_the_core_path_is_self_contained():
    assert tool['problems'](ROOT / 'nbs') == []


def test_the_route_has_at_most_thirteen_chapters_that_exist():
    path = tool['route'](ROOT / 'nbs')
    assert 8 <= len(path) <= 13 and len(set(path)) == len(path)
    assert all((ROOT / 'nbs' / nb).exists() for nb in path)


def test_the_front_page_route_is_the_list():
    cells = json.loads((ROOT / 'nbs' / 'index.ipynb').read_text())['cells']
    text = next(''.join(c['source']) for c in cells if c.get('id') == 'routes01')
    bullet = text.split('**The core path**')[1].split('\n- ')[0]
    assert re.findall(r'\]\(([^)]+\.ipynb)\)', bullet) == tool['route'](ROOT / 'nbs')


def _book(tmp_path, chapters):
    "A book of notebooks: chapter -> (module it exports, code of its one other cell)."
    nbs = tmp_path / 'nbs'
    for nb, (mod, code) in chapters.items():
        cells = [f'#| default_exp {mod}', code]
        cells = [dict(cell_type='code', source=s, metadata={}, outputs=[]) for s in cells]
        (nbs / nb).parent.mkdir(parents=True, exist_ok=True)
        (nbs / nb).write_text(json.dumps(dict(cells=cells)))
    return nbs


@pytest.mark.parametrize(
    'code',
    [
        'from hara_ref.b.late import f',
        'import hara_ref.b.late as late',
        'from hara_ref.b import late',
        '#| export\nfrom ..b.late import f',
        "script = 'from hara_ref.b.late import f'",
    ],
)
def test_the_check_finds_a_chapter_that_uses_a_later_one(tmp_path, code):
    nbs = _book(
        tmp_path,
        {
            '1/01_a.ipynb': ('a.early', code),
            '2/02_b.ipynb': ('b.late', 'x = 1'),
            '2/03_c.ipynb': ('c', ''),
        },
    )
    (nbs / 'core_path.txt').write_text('1/01_a.ipynb\n2/02_b.ipynb\n')
    assert tool['problems'](nbs) == [
        '1/01_a.ipynb uses hara_ref.b.late, exported by 2/02_b.ipynb (later on the path): '
        'not defined before it'
    ]
    (nbs / 'core_path.txt').write_text('1/01_a.ipynb\n')  # b off the path altogether
    assert tool['problems'](nbs)[0].endswith('exported by 2/02_b.ipynb: not defined before it')
    (nbs / 'core_path.txt').write_text('2/02_b.ipynb\n1/01_a.ipynb\n')  # b first: fine
    assert tool['problems'](nbs) == []


def test_the_check_counts_chapters(tmp_path):
    nbs = _book(tmp_path, {f'1/{i:02d}_x.ipynb': (f'm{i}', '') for i in range(14)})
    (nbs / 'core_path.txt').write_text(''.join(f'1/{i:02d}_x.ipynb\n' for i in range(14)))
    assert tool['problems'](nbs) == ['the core path has 14 chapters, more than 13']


def test_the_lessons_load_no_engine():
    "Importing every core chapter's module loads no module of the appendix or the practice part."
    import subprocess
    import sys

    nbs, modules = ROOT / 'nbs', tool['exporters'](ROOT / 'nbs')
    lessons = sorted(m for m, nb in modules.items() if nb in tool['route'](nbs))
    assert len(lessons) == len(tool['route'](nbs))
    code = (
        f'import sys\nfor m in {lessons!r}: __import__(m)\n'
        "print(sorted(m for m in sys.modules if m.startswith(('hara_ref.appendix', "
        "'hara_ref.practice', 'hara_ref.testing'))))"
    )
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == '[]'
