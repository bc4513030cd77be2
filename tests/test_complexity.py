"Tests for hara_ref.ot.complexity (Theorem 3.3 measurements and `hara-ref bench ot`)."

import json
import numpy as np
import pytest
import torch
from hara_ref.ot.complexity import (
    LargestTensor,
    linearized_pipeline,
    bench_rollouts,
    loglog_slope,
    pot_fgw_barycenter,
    timed,
)
from hara_ref.practice.commands import bench_ot_cli
from hara_ref.bench.solvers import format_barycenter_row


def test_bench_ot_quick_prints_ratio_lines(capsys, tmp_path):
    """The quick benchmark prints its ratio lines and writes its JSON; it runs on `--threads` and
    gives this process its own thread count back."""
    out, threads = tmp_path / 'bench.json', torch.get_num_threads()
    assert bench_ot_cli(['--quick', '--out', str(out), '--threads', str(threads + 1)]) == 0
    assert torch.get_num_threads() == threads
    printed = capsys.readouterr().out
    assert f'torch threads={threads + 1}' in printed
    lines = printed.strip().splitlines()
    bary = [l for l in lines if l.startswith('L=')]
    assert len(bary) == 2 and all(
        'ratio' in l and 'POT default call' in l and 'POT run to tol' in l for l in bary
    )
    assert 'extrapolated' in bary[1]  # L=256 > --pot-full-max-L in quick mode
    assert any(l.startswith('sinkhorn') and 'ratio' in l for l in lines)
    res = json.loads(out.read_text())
    assert {'barycenter', 'sinkhorn', 'args'} <= set(res) and len(res['barycenter']) == 2


def test_bench_ot_cli_bad_flag(capsys):
    "A bad flag: exit code 2 and one line naming it, as every command of hara-ref."
    assert bench_ot_cli(['--data', 'nope']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "argument --data: invalid choice: 'nope'" in err[0]


def test_linearized_path_never_builds_L_by_L():
    L = 600
    h, m = bench_rollouts(4, L, 16)
    with LargestTensor() as rec:
        nov = linearized_pipeline(h, m, L_b=16, warn=False)
    assert rec.numel < L * L and rec.numel <= 4 * L * max(16 + 1, 16)
    assert nov.shape == (4, L) and torch.isfinite(nov).all() and (nov >= 0).all()


def test_bench_rollouts_kinds():
    for kind in ('gauss', 'planted'):
        h, m = bench_rollouts(3, 100, 8, kind)
        assert h.shape == (3, 100, 8) and m.all() and (h.norm(dim=-1) > 0).all()
    with pytest.raises(ValueError, match='kind'):
        bench_rollouts(kind='x')


def test_planted_rollouts_padded_with_the_last_stage():
    from hara_ref.rlvr.data import planted_stage_rollouts

    # bench_rollouts draws 8 stages of (3/4, 5/4) * L/8 tokens: some rollouts are shorter than L
    L = 200
    h, m = bench_rollouts(4, L, 8, 'planted', seed=1)
    pr = planted_stage_rollouts(K=4, n_stages=8, d=8, stage_len=(18, 31), seed=1)
    short = pr.mask.sum(-1) < L  # (K,) rollouts padded up to L
    assert short.any() and pr.centers.shape[0] == 8
    # stage 7, the last of the 8
    assert torch.equal(h[short, -1], pr.centers[-1].expand(int(short.sum()), 8))


def test_loglog_slope_and_row_format():
    assert abs(loglog_slope([10, 100, 1000], [1, 10, 100]) - 1) < 1e-12
    r = dict(
        L=512,
        t_lin=0.1,
        lin_iters=10,
        lin_inner_iters=20,
        t_pot_default=1.0,
        ratio_default=10.0,
        t_pot_tol=5.0,
        pot_iters=20,
        pot_extrapolated=True,
        pot_probe_iters=2,
        pot_probe_time=0.5,
        ratio_tol=50.0,
    )
    s = format_barycenter_row(r)
    assert 'ratio 10.0x' in s and 'ratio 50.0x' in s and 'extrapolated' in s


def test_pot_reference_runs():
    h, m = bench_rollouts(3, 20, 4)
    X, n = pot_fgw_barycenter(h, m, L_b=5)
    # POT 0.9.7 stops after one outer iteration with a fixed structure
    assert X.shape == (5, 4) and n == 1
    X2, n2 = pot_fgw_barycenter(h, m, L_b=5, stop_criterion='loss')
    assert n2 >= 1 and np.isfinite(X2).all()


def test_timed_min_and_median(monkeypatch):
    import time

    for stat, want in (('min', 1.0), ('median', 2.0)):
        clock = iter([0.0, 1.0, 1.0, 4.0, 4.0, 6.0])  # runs of 1, 3 and 2 seconds
        monkeypatch.setattr(time, 'perf_counter', lambda: next(clock))
        assert timed(lambda: 7, 3, stat=stat) == (want, 7)
