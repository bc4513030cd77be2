"""The whole game of chapter 01: `tools/whole_game.py` makes the numbers of the chapter's opening
picture, the committed `nbs/results/whole_game.json` is what it makes (so the picture cannot drift
from the code), and the story the chapter tells about the picture holds."""

import json
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / 'tools' / 'whole_game.py'
COMMITTED = ROOT / 'nbs' / 'results' / 'whole_game.json'
tool = runpy.run_path(str(TOOL))


@pytest.fixture(scope='module')
def game():
    return tool['whole_game']()


def close(a, b, path=''):
    """Equal structure, equal ints and strings, floats within 1e-9: the barycenter and the plans
    are solved to 1e-12, so another BLAS may move the last digits but not more."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            close(a[k], b[k], f'{path}.{k}')
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            close(x, y, f'{path}[{i}]')
    elif isinstance(a, float) or isinstance(b, float):
        assert abs(a - b) <= 1e-9 * max(1.0, abs(a)), (path, a, b)
    else:
        assert a == b, (path, a, b)


def test_the_committed_file_is_what_the_tool_makes(game):
    close(game, json.loads(COMMITTED.read_text()))


def test_close_sees_a_change():
    with pytest.raises(AssertionError):
        close({'x': [1.0, 2.0]}, {'x': [1.0, 2.0 + 1e-6]})
    with pytest.raises(AssertionError):
        close({'x': [1, 2]}, {'x': [1, 2, 3]})


def test_grpo_gives_every_token_its_rollouts_advantage(game):
    A = np.array(game['advantages'])
    r = np.array(game['rewards'])
    assert np.all(np.sign(A) == np.where(r > 0, 1, -1))
    for i, row in enumerate(game['grpo']):
        assert len(row) == game['lengths'][i] and np.all(np.array(row) == A[i])


def test_hara_is_grpo_times_the_weights(game):
    for g, h, w in zip(game['grpo'], game['hara'], game['weights']):
        np.testing.assert_allclose(np.array(h), np.array(g) * np.array(w), rtol=1e-12)


def test_the_story_holds(game):
    "What chapter 01 says of its picture."
    w = [np.array(x) for x in game['weights']]
    novel = [np.array(s) == game['novel_stage'] for s in game['stages']]
    ic, iw = game['novel_correct'][0], game['novel_wrong'][0]
    assert game['rewards'][ic] == 1 and game['rewards'][iw] == 0
    # only the two novel rollouts visit the novel stage
    assert [i for i, n in enumerate(novel) if n.any()] == sorted([ic, iw])
    # the novel correct stage is lifted to the clip, the novel wrong one lowered to it
    assert np.all(w[ic][novel[ic]] == game['oracle']['w_max'])
    assert np.all(w[iw][novel[iw]] == game['oracle']['w_min'])
    # every other token keeps a weight close to 1
    assert max(np.abs(x - 1)[~n].max() for x, n in zip(w, novel)) < 0.1
    # so the darkest blue of the picture is the novel correct stage, the palest red the novel wrong
    hara = [np.array(x) for x in game['hara']]
    top = max(x.max() for x in hara)
    assert np.all(hara[ic][novel[ic]] == top)
    wrong = [x for x, r in zip(hara, game['rewards']) if r == 0]
    assert np.all(hara[iw][novel[iw]] == max(x.max() for x in wrong))


def test_chapter_01_draws_from_the_committed_file():
    cells = json.loads((ROOT / 'nbs' / '1_rlvr' / '01_data.ipynb').read_text())['cells']
    code = '\n'.join(''.join(c['source']) for c in cells if c['cell_type'] == 'code')
    assert "'../results/whole_game.json'" in code


def test_the_command_writes_the_file(tmp_path, game):
    out = tmp_path / 'game.json'
    tool['main'](['--out', str(out)])
    close(json.loads(out.read_text()), game)


def test_a_usage_error_is_one_line_and_writes_nothing(tmp_path):
    missing = str(tmp_path / 'no' / 'x.json')
    for args, flag in ((['--bogus'], '--bogus'), (['--out', missing], '--out')):
        res = subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True)
        assert res.returncode == 2
        assert len(res.stderr.strip().splitlines()) == 1 and flag in res.stderr
    assert list(tmp_path.iterdir()) == []
