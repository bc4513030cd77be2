"""The barycenter, Newton and Sinkhorn iterations read nothing back to the host between two checks,
and the check interval changes no number.

What `HostReads` (chapter 34_barycenters) can see on CPU tensors, and so what these tests count:
scalar reads (`.item()`, `float()`, `int()`, `bool()` of a tensor: `aten._local_scalar_dense`),
`nonzero`, `masked_select`, `unique`, boolean indexing (`aten.index` / `index_put_` with a bool
index), the error checks of `torch.linalg.solve`/`cholesky` (`_linalg_check_errors`), and
`tolist()` (no aten operation: counted by a wrapper). A copy to the host (`.cpu()`, `aten._to_copy`)
is a read on a GPU but does nothing on a CPU tensor, so it cannot be seen here."""

import collections
import json
import math
import runpy
import subprocess
import sys
from pathlib import Path
import pytest
import torch
import hara_ref.engine.barycenters as bary
import hara_ref.engine.newton as newton
import hara_ref.engine.novelty as novelty
from hara_ref.engine.bary_steps import HostReads
from hara_ref.engine.barycenters import group_barycenters
from hara_ref.engine.newton import semidual_newton, newton_start, newton_trial
from hara_ref.engine.sinkhorn import sinkhorn_log, _setup, _iterate
from hara_ref.bench.solvers import bench_batch, small_batch
from hara_ref.engine.hara_engine import hara_advantages
from hara_ref.rlvr.data import planted_stage_rollouts
from test_sinkhorn import problem

pytestmark = pytest.mark.usefixtures('one_thread')  # tests/conftest.py

# reads outside the loop: input checks, the groups read once, the final plans, the report
SETUP = 25


def planted_groups(seed=0, d=16):
    "Four planted groups of 3 rollouts, flat: h (12, T, d), mask (12, T), group (12,)."
    prs = [
        planted_stage_rollouts(K=3, n_stages=5, d=d, seed=seed + k, p_skip=0.2) for k in range(4)
    ]
    T = max(p.mask.shape[1] for p in prs)
    h = torch.cat([torch.nn.functional.pad(p.hidden, (0, 0, 0, T - p.mask.shape[1])) for p in prs])
    mask = torch.cat([torch.nn.functional.pad(p.mask, (0, T - p.mask.shape[1])) for p in prs])
    return h, mask, torch.arange(4).repeat_interleave(3)


def planted_record(anderson=0, device='cpu', copies=1, outer='plain'):
    """`group_barycenters`' record of `planted_groups(1)` (`copies` times over, each copy its own 4
    groups) on `device`, first iterate set, trials adapted from `TRIALS`: what its loop would
    run."""
    h, mask, group = planted_groups(1)
    h, mask = h.repeat(copies, 1, 1), mask.repeat(copies, 1)
    group = torch.cat([group + 4 * k for k in range(copies)])
    h, mask, group = h.to(device), mask.to(device), group.to(device)
    group, Y = bary.check_group_inputs(h, mask, group, None, 0.25, 'newton')
    settings = dict(alpha=0.25, reg=0.05, inner_rtol=1e-3, inner_iter=50, omega=1.9)
    settings.update(check_every=5, newton=True, max_iter=200, trials=bary.TRIALS, adapt=True)
    settings.update(outer=outer)
    bar = bary.barycenter_problem(h, mask, group, Y, None, 'unit', 32, 1e-4, 1e-7, **settings)
    bary._first_iterate(bar, anderson)
    return bar


def counted_hara(batch, **kw):
    """Host reads of one `hara_advantages` call, and of the `group_barycenters` call inside it, with
    that call's info."""
    inner = {}

    def wrapped(*a, **k):
        with HostReads() as r:
            out = group_barycenters(*a, **k)
        inner.update(reads=r.total, info=out[1], check_every=k.get('check_every', 5))
        return out

    orig, novelty.group_barycenters = novelty.group_barycenters, wrapped
    try:
        with HostReads() as r:
            hara_advantages(*batch, **kw)
    finally:
        novelty.group_barycenters = orig
    return r.total, inner


@pytest.mark.parametrize('batch', [small_batch, lambda: bench_batch(4, 8, 32, 16, seed=3)])
def test_host_reads_follow_the_checks(batch):
    total, inner = counted_hara(batch())
    info = inner['info']
    assert info['sweeps'] >= info['n_iter'] > 10  # a real iteration
    # one read per check, and a few more around the loop
    assert inner['reads'] <= info['sweeps'] / inner['check_every'] + SETUP, (inner['reads'], info)
    assert info['host_checks'] == math.ceil(info['sweeps'] / inner['check_every']) + 1
    # the rest of hara_advantages does not iterate
    assert total <= inner['reads'] + 60


def test_host_reads_do_not_grow_with_the_inner_steps():
    """The reads of the loop divided by check_every: an interval ten times longer, ten times fewer
    checks; the same numbers."""
    h, mask, group = planted_groups()
    out = {}
    for ce in (1, 10):
        with HostReads() as r:
            Z, info = group_barycenters(h, mask, group, check_every=ce, warn=False)
        out[ce] = (r.total, Z, info)
    (r1, Z1, i1), (r10, Z10, i10) = out[1], out[10]
    assert i1['host_checks'] == i1['sweeps'] + 1
    assert i10['host_checks'] == math.ceil(i10['sweeps'] / 10) + 1 <= i1['host_checks'] / 8
    assert r10 < r1 - 0.8 * i1['sweeps']
    torch.testing.assert_close(Z10, Z1, atol=1e-12, rtol=0)
    assert torch.equal(i10['n_iter_group'], i1['n_iter_group'])
    assert i10['sweeps'] - i1['sweeps'] < 10  # the sweeps after the last group stopped


@pytest.mark.parametrize('anderson, outer', [(0, 'plain'), (3, 'plain'), (0, 'lbfgs')])
def test_a_sweep_reads_nothing(anderson, outer):
    bar = planted_record(anderson, outer=outer)
    with HostReads() as r:
        for _ in range(20):
            bary._sweep(bar)
    assert r.total == 0 and bool(bar.live.any()) and int(bar.n_it.max()) > 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')
def test_a_sweep_makes_the_gpu_host_wait_for_nothing():
    """On a GPU, CUDA's own sync detector over 20 sweeps: any operation that makes the host wait
    for the device (a scalar read, `nonzero`, a copy to the host) raises."""
    bar = planted_record(device='cuda')
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode('error')
    try:
        for _ in range(20):
            bary._sweep(bar)
    finally:
        torch.cuda.set_sync_debug_mode('default')
    assert bool(bar.live.any()) and int(bar.n_it.max()) > 3


def test_trials_per_sweep_change_no_number():
    """Fixed trials per sweep (1, 2, 4) and the default, adapted at each check to the steps an
    iteration waited for on average: the same numbers; the adapted trials take fewer sweeps than
    two a sweep."""
    h, mask, group = planted_groups(2)
    out = {tr: group_barycenters(h, mask, group, warn=False, trials=tr) for tr in (1, 2, 4, None)}
    for tr in (1, 4, None):
        torch.testing.assert_close(out[tr][0], out[2][0], atol=1e-12, rtol=0)
        assert torch.equal(out[tr][1]['n_iter_group'], out[2][1]['n_iter_group'])
        assert out[tr][1]['inner_iters'] == out[2][1]['inner_iters']
    sweeps = {k: v[1]['sweeps'] for k, v in out.items()}
    assert sweeps[1] > sweeps[2] >= sweeps[4] and sweeps[None] < sweeps[2], sweeps
    for tr in (1, 2, 4):  # every sweep ran `trials` trials
        assert out[tr][1]['trials'] == tr * sweeps[tr]
    assert sweeps[None] < out[None][1]['trials'] != 2 * sweeps[None]  # they changed
    # Sinkhorn's plans take no trials
    assert group_barycenters(h, mask, group, warn=False, solver='sinkhorn')[1]['trials'] == 0


def test_trials_per_sweep_change_no_number_of_the_quasi_newton_step():
    h, mask, group = planted_groups(2)
    out = {
        tr: group_barycenters(h, mask, group, warn=False, trials=tr, outer='lbfgs', tol=1e-8)
        for tr in (1, 3, None)
    }
    for tr in (3, None):
        torch.testing.assert_close(out[tr][0], out[1][0], atol=1e-12, rtol=0)
        assert torch.equal(out[tr][1]['n_iter_group'], out[1][1]['n_iter_group'])
        assert torch.equal(out[tr][1]['objective'], out[1][1]['objective'])


@pytest.mark.parametrize('waits, trials', [([0, 3], 1), ([7, 3], 3), ([0, 0], 2)])
def test_a_check_sets_at_least_one_trial(waits, trials):
    """Iterations whose plans were already solved at their warm start waited for 0 steps: the next
    sweeps still take a trial, or a plan that then needs one would never be solved. No iteration
    since the last check: the trials stay."""
    bar = planted_record()
    assert bar.trials == 2 == bary.TRIALS
    bar.waits = torch.tensor(waits)
    assert bary._check(bar) and bar.trials == trials


@pytest.mark.parametrize(
    'kw, name',
    [
        (dict(trials=0), 'trials'),
        (dict(trials=1.5), 'trials'),
        (dict(trials=True), 'trials'),
        (dict(check_every=0), 'check_every'),
        (dict(max_iter=0), 'max_iter'),
        (dict(max_iter=2.5), 'max_iter'),
        (dict(omega=2.0), 'omega'),
    ],
)
def test_loop_settings_are_checked(kw, name):
    h, mask, group = planted_groups(0)
    with pytest.raises(ValueError, match=name):
        group_barycenters(h, mask, group, **kw)


def test_newton_trial_reads_nothing_and_freezes_stopped_problems():
    a, b, M = problem(3, 6, 20, 8)
    st = newton_start(M / -0.05, a, b, torch.zeros_like(b), torch.full((6,), 1e-11).double(), 100)
    frozen = {}
    with HostReads() as r:
        for _ in range(60):
            newton_trial(st)
            for k, d in enumerate(st.done.unbind()):
                if d:  # a bool of a tensor: counted, so subtracted below
                    frozen.setdefault(k, st.T[k].clone())
    assert r.counts['_local_scalar_dense'] == 60 * 6 and r.total == 60 * 6  # only the test's own
    assert st.done.all() and all(torch.equal(st.T[k], T) for k, T in frozen.items())


def test_a_trial_and_a_sweep_run_as_many_operations_on_any_batch():
    """On a small batch the time of a call is its count of torch operations (chapter 52_bench): a
    Newton trial and the rest of a sweep run a fixed number of them, whatever the batch, and no
    more than they do now. Counted as the loop runs them, under `torch.inference_mode`."""
    trial, rest = [], []
    with torch.inference_mode():
        for copies in (1, 3):  # 12 and 36 rollouts
            bar = planted_record(copies=copies)
            with HostReads() as r:
                newton_trial(bar.st)
            trial.append(r.ops)
            for _ in range(2):
                with HostReads() as r:
                    bary._sweep(bar)
                rest.append(r.ops - bar.trials * trial[-1])
    assert trial[0] == trial[1] <= 112
    assert len(set(rest)) == 1 and rest[0] <= 169


@pytest.mark.parametrize('check_every', [1, 4])
def test_semidual_newton_reads_once_per_check(monkeypatch, check_every):
    a, b, M = problem(4, 40, 30, 8)
    trials = collections.Counter()  # chunk -> its trials

    def counted(st):
        trials[id(st)] += 1
        newton_trial(st)

    monkeypatch.setattr(newton, 'newton_trial', counted)
    kw = dict(stop_thr=1e-10, log=True, check_every=check_every, chunk=16, check_inputs=False)
    with HostReads() as r:
        P, lg = semidual_newton(a, b, M, 0.05, **kw)
    # 40 problems in chunks of 16: one read per check for all three, until the slowest is done
    checks = max(trials.values()) / check_every + 1
    assert lg['converged'].all() and len(trials) == 3 and len(set(trials.values())) > 1
    assert r.counts['tolist'] == checks and r.total <= checks + 8
    monkeypatch.undo()
    P1, lg1 = semidual_newton(a, b, M, 0.05, **{**kw, 'check_every': 1})
    assert torch.equal(P, P1) and torch.equal(lg['n_iter_item'], lg1['n_iter_item'])


@pytest.mark.parametrize('omega', [1.0, 1.9])
def test_sinkhorn_log_reads_once_per_check(omega):
    a, b, M = problem(5, 6, 40, 10)
    for ce in (1, 10):
        with HostReads() as r:
            _, lg = sinkhorn_log(a, b, M, 0.05, log=True, check_every=ce, omega=omega)
        assert lg['converged'].all()
        checks = math.ceil(lg['n_iter'] / ce) + 1
        assert checks <= r.counts['tolist'] <= checks + 1 and r.total <= checks + 12


def test_sinkhorn_iteration_reads_nothing():
    a, b, M = problem(6, 4, 30, 8)
    s, omega = _setup(a, b, M, 0.05, 1e-9, None, None, 1.9, True)
    with HostReads() as r:
        for it in range(1, 30):
            _iterate(s, it, omega)
    assert r.total == 0


def test_padding_rows_cost_nothing_whatever_they_hold():
    """The batched products run over the padding rows too: whatever they hold (finite here, up to
    1e150; nan/inf rows are zeroed by `feature_scales`) changes no number."""
    h, mask, group = planted_groups(3)
    junk = h.masked_fill(~mask.unsqueeze(-1), 1e150)
    Z0, i0 = group_barycenters(h, mask, group, warn=False)
    Z1, i1 = group_barycenters(junk, mask, group, warn=False)
    torch.testing.assert_close(Z1, Z0, atol=1e-12, rtol=0)
    assert torch.isfinite(i1['token_cost']).all() and (i1['plans'][~mask] == 0).all()


def test_the_small_bench_tool_times_the_small_batch():
    "`tools/bench_hara_small.py` (which runs on old checkouts too) times `small_batch`'s batch."
    tool = runpy.run_path(str(Path(__file__).parents[1] / 'tools' / 'bench_hara_small.py'))
    for x, y in zip(tool['small_batch'](), small_batch()):
        assert torch.equal(x, y)


def test_the_compare_tool_times_checkouts_side_by_side(tmp_path):
    """`tools/bench_compare.py` runs each checkout in its own process and reports the ratio to the
    first; the same checkout twice gives two rows, the first with ratio 1."""
    root = Path(__file__).parents[1]
    out = tmp_path / 'cmp.json'
    cmd = [sys.executable, str(root / 'tools' / 'bench_compare.py'), str(root), str(root)]
    run = subprocess.run(cmd + ['--rounds', '1', '--calls', '1', '--out', str(out)], text=True)
    assert run.returncode == 0
    rows = json.loads(out.read_text())['rows']
    assert len(rows) == 2 and rows[0]['small_ratio'] == 1.0 and rows[1]['small_s'] > 0
    assert rows[0]['small_round_ratios'] == [1.0] and len(rows[1]['small_round_ratios']) == 1
    bad = subprocess.run(cmd + ['--rounds', '0'], capture_output=True, text=True)
    assert bad.returncode == 2 and '--rounds and --calls must be at least 1' in bad.stderr
    bad = subprocess.run(cmd + ['--paper-rounds', '0'], capture_output=True, text=True)
    assert bad.returncode == 2
    assert '--paper-rounds must be in [1, --rounds = 3], got 0' in bad.stderr


def test_results_are_ordinary_tensors():
    """The loop runs under `torch.inference_mode`; what it returns can be changed in place and kept
    for autograd, like any tensor (an inference tensor refuses both)."""
    h, mask, group = planted_groups(3)
    Z, info = group_barycenters(h, mask, group, warn=False, final_plans_kw={})
    outs = [Z] + [v for v in info.values() if isinstance(v, torch.Tensor)]
    assert len(outs) >= 10 and not any(x.is_inference() for x in outs)
    w = torch.ones_like(Z, requires_grad=True)
    (w * Z).sum().backward()  # Z saved for backward
    torch.testing.assert_close(w.grad, Z)
    Z.add_(1.0)
    info['plans'].mul_(2.0)
    batch = small_batch()
    adv, rw = hara_advantages(*batch)
    adv.mul_(2.0)
    assert not adv.is_inference()
