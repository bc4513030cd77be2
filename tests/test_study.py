"""`hara-ref study`: the statistics against SciPy, the decision rule, and the --quick command end to
end on a few steps."""

import json
import math
import os
from pathlib import Path
import pytest

os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('MPLBACKEND', 'Agg')
from hara_ref.trainer.report import (
    mean_se,
    paired,
    verdict,
    cell_verdict,
    time_to,
    at_time,
    run_summary,
)
from hara_ref.practice.study import study_grid, StudyConfig


def test_paired_interval_equals_scipy_ttest_rel():
    from scipy.stats import ttest_rel

    a = {0: 0.31, 1: 0.28, 2: 0.35, 3: 0.30, 4: 0.27}
    b = {0: 0.29, 1: 0.27, 2: 0.30, 3: 0.31, 4: 0.24}
    m, lo, hi, n = paired(a, b)
    ci = ttest_rel(list(a.values()), list(b.values())).confidence_interval(0.95)
    assert (
        n == 5
        and m == pytest.approx(0.02)
        and (lo, hi) == pytest.approx((ci.low, ci.high), abs=1e-12)
    )


def test_decision_rule():
    assert [
        verdict(*paired({s: x + 0.1 for s, x in enumerate(v)}, dict(enumerate(v)))[1:3])
        for v in [[0.1, 0.2, 0.3]]
    ] == ['better']
    assert cell_verdict(['better', 'no detectable difference']) == 'helps'
    assert cell_verdict(['worse', 'no detectable difference']) == 'hurts'
    assert cell_verdict(['better', 'worse']) == 'mixed'
    assert cell_verdict(['no detectable difference'] * 2) == 'no detectable difference'
    m, se, n = mean_se([0.5])
    assert (m, se, n) == (0.5, 0.0, 1)
    # one seed: no interval, never a verdict
    assert paired({0: 1.0}, {0: 0.5})[1:3] == (-math.inf, math.inf)
    with pytest.raises(ValueError, match="not paired"):
        paired({0: 1.0}, {1: 1.0})


def test_grid_covers_the_tables():
    g = study_grid()
    tabs = {t: [c.key for c in g if t in c.tables] for t in ('T1', 'T2', 'T3', 'T4', 'F7')}
    assert len(tabs['T1']) == 12 and {c.task for c in g if 'T1' in c.tables} == {'sum', 'countdown'}
    assert {dict(c.overrides).get('metric', 'fgw') for c in g if 'T2' in c.tables} == {
        'w',
        'gw',
        'fgw',
        'embed',
    }
    alphas = sorted(
        {
            0.0
            if dict(c.overrides).get('metric') == 'w'
            else 1.0
            if dict(c.overrides).get('metric') == 'gw'
            else dict(c.overrides).get('alpha', 0.25)
            for c in g
            if 'F7' in c.tables
        }
    )
    assert alphas == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert [c.base for c in g if 'T4' in c.tables] == ['hara-tok']
    assert len(StudyConfig().seeds) >= 5


def test_time_helpers_and_incomplete_run():
    c = dict(time=[0.0, 5.0, 9.0], pass1=[0.1, 0.2, 0.3])
    assert (time_to(c, 0.2), time_to(c, 0.9), at_time(c, 8.0)) == (5.0, None, 0.2)
    with pytest.raises(ValueError, match="complete"):
        run_summary([dict(kind='eval', step=0, pass1=0.0, passk=0.0, length=1.0)])


def test_quick_study_end_to_end_and_resume(tmp_path, capsys):
    """The --quick command on a few steps: runs, report files, figures; a second call resumes and
    runs nothing. One worker: the runner's worker processes are tested with `hara-ref train`
    (test_training_cli)."""
    from hara_ref.practice.cli import main

    out = tmp_path / 'study'
    args = [
        'study',
        '--quick',
        '--out',
        str(out),
        '--steps',
        '2',
        '--eval-every',
        '1',
        '--sft-steps',
        '10',
        '--eval-prompts',
        '4',
        '--eval-samples',
        '4',
        '--workers',
        '1',
        '--threads',
        '1',
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert '4 runs in' in printed and 'Table 1, countdown' in printed
    res = json.loads((out / 'results.json').read_text())
    assert sorted(res['runs']) == ['countdown/grpo', 'countdown/hara-tok'] and all(
        len(v) == 2 for v in res['runs'].values()
    )
    one = res['runs']['countdown/hara-tok']['0']
    assert (
        len(one['passk_curve']) == 4
        and one['curve']['step'] == [0, 1, 2]
        and one['strategies'] is not None
    )
    assert (out / 'curves_countdown.png').stat().st_size > 1000 and 'Δ pass@1' in (
        out / 'tables.md'
    ).read_text()
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert '0 runs in' in printed
    assert '4 runs complete (left as they are), 0 to continue, 0 to start' in printed


def test_committed_full_study_reports_every_run():
    """The results chapter 28_study shows: every cell of the grid, at least 5 seeds each, complete
    runs, and the tables built from them."""
    root = Path(__file__).resolve().parent.parent / 'nbs' / '5_practice' / 'study'
    res = json.loads((root / 'results.json').read_text())
    keys = {c.key for c in study_grid()}
    assert set(res['runs']) == keys
    assert all(len(v) >= 5 for v in res['runs'].values())
    assert all(
        r['curve']['step'][-1] == res['config']['steps']
        for v in res['runs'].values()
        for r in v.values()
    )
    assert res['config']['eval_samples'] == 16 and all(
        len(r['passk_curve']) == 16 for v in res['runs'].values() for r in v.values()
    )
    md = (root / 'tables.md').read_text()
    for t in (
        'Table 1, countdown',
        'Table 1, sum',
        'Table 2',
        'Table 3',
        'Table 4',
        'Figure 7',
        'Figures 5-6',
        'Every run',
    ):
        assert t in md, t
    for f in ('curves_countdown.png', 'curves_sum.png', 'alpha.png'):
        assert (root / f).stat().st_size > 10_000


def test_duplicate_seeds_refused():
    with pytest.raises(ValueError, match='`seeds` lists 1 more than once'):
        StudyConfig(seeds=(0, 1, 1))


def test_study_refuses_a_run_it_cannot_continue_before_any_work(tmp_path, capsys):
    "A run trained with other settings stops the study before any work: its folder, its fields."
    from dataclasses import asdict
    from hara_ref.practice.cli import main
    from hara_ref.practice.study import base_train_config

    out = tmp_path / 'study'
    args = [
        'study',
        '--quick',
        '--out',
        str(out),
        '--steps',
        '2',
        '--eval-every',
        '1',
        '--sft-steps',
        '10',
        '--seeds',
        '1',
        '--eval-prompts',
        '4',
        '--eval-samples',
        '4',
        '--workers',
        '1',
        '--threads',
        '1',
    ]
    sc = StudyConfig(
        out=str(out),
        quick=True,
        steps=2,
        eval_every=1,
        sft_steps=10,
        seeds=(0,),
        eval_prompts=4,
        eval_samples=4,
    )
    d = out / 'countdown' / 'runs' / 'grpo-s0'
    d.mkdir(parents=True)
    saved = asdict(base_train_config(sc)) | dict(lr=1.0, seed=0)
    (d / 'train_config.json').write_text(json.dumps(saved))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert str(d) in err and '`lr` 1.0 -> 3e-05' in err and '--allow-config-change' in err, err
    assert not (out / 'countdown' / 'sft').exists()  # refused before any work
