"""The exercises of the core path: each core chapter ends with a section `## Exercises` of two to
four numbered exercises that links its worked solutions, `nbs/solutions/NN_name.py`; every
solution file runs here (its asserts are the checks), so a solution cannot rot."""

import json
import re
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / 'nbs'
CORE = (NBS / 'core_path.txt').read_text().split()
SOLUTIONS = sorted((NBS / 'solutions').glob('*.py'))


def exercises(rel: str) -> str:
    "The markdown of chapter `rel` from its `## Exercises` heading on ('' if it has none)."
    cells = json.loads((NBS / rel).read_text())['cells']
    text = '\n'.join(''.join(c['source']) for c in cells if c['cell_type'] == 'markdown')
    return text[text.index('## Exercises') :] if '## Exercises' in text else ''


@pytest.mark.parametrize('rel', CORE)
def test_each_core_chapter_ends_with_exercises_and_their_solutions(rel):
    text = exercises(rel)
    assert text, f'{rel} has no "## Exercises" section'
    n = len(re.findall(r'^\d+\. ', text, re.M))
    assert 2 <= n <= 4, f'{rel}: {n} exercises'
    name = Path(rel).stem
    assert f'solutions/{name}.py' in text, f'{rel} does not link solutions/{name}.py'
    assert (NBS / 'solutions' / f'{name}.py').exists()


def test_every_solution_belongs_to_a_core_chapter():
    stems = {Path(r).stem for r in CORE}
    assert {p.stem for p in SOLUTIONS} <= stems


@pytest.mark.parametrize('path', SOLUTIONS, ids=lambda p: p.stem)
def test_solution_runs(path, monkeypatch):
    monkeypatch.chdir(path.parent)
    runpy.run_path(str(path), run_name='__main__')
