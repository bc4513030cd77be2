"""Property tests, cross-checks and failure cases for hara_ref.methods.hora (chapter 49_hora): hit
utility, greedy allocation, the trainer hook."""

import itertools
import json
import math
import os
import warnings

import mpmath
import pytest
import torch
from hypothesis import given, settings, strategies as st, HealthCheck

os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('MPLBACKEND', 'Agg')
from hara_ref.methods.hora import (
    lgamma_diff,
    log_miss,
    hit_utility,
    log_marginal_gain,
    allocate,
    allocate_greedy,
    hora_rollouts,
)
from hara_ref.practice.commands import hora_variants, compare_hora_cli
import numpy as np
from hara_ref.train.policy import char_tokenizer, tiny_qwen3
from hara_ref.trainer.step import TrainConfig
from hara_ref.trainer.loop import read_jsonl
from hara_ref.practice.cli import train_cli, train_parser, configs_from_args


SET = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
counts = st.integers(0, 60)


def direct_log_miss(s, f, m):
    "log prod_{j<m} (b+j)/(a+b+j), summed term by term in float64."
    a, b, j = 1 + s, 1 + f, torch.arange(m, dtype=torch.float64)
    return torch.log1p(-a / (a + b + j)).sum().item()


def mp_log_miss(s, f, m):
    "The same in 50-digit arithmetic, from log-Gamma."
    mpmath.mp.dps = 50
    a, b = mpmath.mpf(1 + s), mpmath.mpf(1 + f)
    return float(
        mpmath.loggamma(b + m)
        - mpmath.loggamma(b)
        - mpmath.loggamma(a + b + m)
        + mpmath.loggamma(a + b)
    )


@SET
@given(s=counts, f=counts, m=st.integers(0, 40))
def test_closed_form_equals_product_form(s, f, m):
    assert abs(log_miss(s, f, m).item() - direct_log_miss(s, f, m)) <= 1e-12 * (
        1 + abs(direct_log_miss(s, f, m))
    )


@SET
@given(s=counts, f=counts)
def test_utility_bounded_increasing_concave(s, f):
    m = torch.arange(0, 30)
    U = hit_utility(s, f, m)  # (30,)
    assert U[0] == 0 and (U >= 0).all() and (U <= 1).all()
    gains = U[1:] - U[:-1]
    # in float64 U may round to 1 (gains 0) ...
    assert (gains >= 0).all() and (gains[1:] <= gains[:-1] + 1e-15).all()
    # (30,) ... but the log gains stay finite and strictly decreasing
    lg = log_marginal_gain(s, f, m)
    assert torch.isfinite(lg).all() and (lg[1:] < lg[:-1]).all()
    assert abs(U[1].item() - (1 + s) / (2 + s + f)) < 1e-14  # one rollout: the posterior mean
    assert torch.allclose(lg[:-1].exp(), gains, rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize(
    's,f,m',
    [
        (0, 10**6, 1),
        (10**6, 10**6, 10**6),
        (3, 10**6, 17),
        (10**6, 0, 5),
        (2 * 10**6, 10**6, 10**6),
        (7, 9, 10**6),
    ],
)
def test_large_counts_match_high_precision(s, f, m):
    ref = mp_log_miss(s, f, m)
    got = log_miss(s, f, m).item()
    assert abs(got - ref) <= 1e-13 + 1e-12 * abs(ref), (got, ref)
    u_ref = -mpmath.expm1(ref)
    # U relative to 1e-9, even when U ~ 1e-6
    assert abs(hit_utility(s, f, m).item() - float(u_ref)) <= 1e-9 * float(u_ref) + 1e-300


def test_large_counts_direct_sum_and_float32_inputs():
    big = 10**6
    assert abs(log_miss(big, big, big).item() - direct_log_miss(big, big, big)) < 1e-6 * abs(
        direct_log_miss(big, big, big)
    )
    u32 = hit_utility(
        torch.tensor([0.0], dtype=torch.float32),
        torch.tensor([1e6], dtype=torch.float32),
        torch.tensor([1.0], dtype=torch.float32),
    )
    assert u32.dtype == torch.float64 and abs(u32.item() * (big + 2) - 1) < 1e-9


def test_lgamma_diff_both_branches():
    x = torch.tensor([1.0, 2.5, 9.999, 19.999, 20.0, 20.001, 55.0, 1e4, 1e7], dtype=torch.float64)
    for m in (0.0, 1.0, 3.5, 1e3, 1e6):
        mpmath.mp.dps = 50
        ref = torch.tensor(
            [
                float(
                    mpmath.loggamma(mpmath.mpf(float(v)) + m)
                    - mpmath.loggamma(mpmath.mpf(float(v)))
                )
                for v in x
            ],
            dtype=torch.float64,
        )
        assert torch.allclose(lgamma_diff(x, torch.full_like(x, m)), ref, rtol=1e-13, atol=1e-12)


def test_monte_carlo():
    g = torch.Generator().manual_seed(1)
    # s=1, f=8
    p = torch.distributions.Beta(torch.tensor(2.0), torch.tensor(9.0)).sample((400_000,))
    hits = (torch.rand(400_000, 6, generator=g) < p[:, None]).any(1).double().mean().item()
    assert abs(hit_utility(1, 8, 6).item() - hits) < 4e-3


def brute_best(s, f, budget, m_min):
    best = -1.0
    for m in itertools.product(range(m_min, budget + 1), repeat=len(s)):
        if sum(m) == budget:
            best = max(
                best, hit_utility(torch.tensor(s), torch.tensor(f), torch.tensor(m)).sum().item()
            )
    return best


@pytest.mark.parametrize('alloc_fn', [allocate_greedy, allocate])
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_greedy_matches_brute_force(alloc_fn, data):
    N = data.draw(st.integers(1, 4))
    s = data.draw(st.lists(st.integers(0, 8), min_size=N, max_size=N))
    f = data.draw(st.lists(st.integers(0, 8), min_size=N, max_size=N))
    m_min = data.draw(st.integers(0, 2))
    budget = data.draw(st.integers(N * m_min, N * m_min + 6))
    alloc = alloc_fn(s, f, budget, m_min)
    assert alloc.sum().item() == budget and (alloc >= m_min).all() and alloc.dtype == torch.long
    total = hit_utility(torch.tensor(s), torch.tensor(f), alloc).sum().item()
    assert abs(total - brute_best(s, f, budget, m_min)) < 1e-12


def test_deterministic_ties_and_permutation():
    test = allocate([2, 2, 2, 2], [2, 2, 2, 2], 6)
    assert test.tolist() == [2, 2, 1, 1]  # equal prompts: the lower index first
    s, f = [0, 5, 1, 3, 0], [6, 0, 4, 2, 1]
    base = allocate(s, f, 23)
    assert torch.equal(base, allocate(s, f, 23))
    perm = [3, 0, 4, 1, 2]
    # no tie here: order-free
    assert allocate([s[i] for i in perm], [f[i] for i in perm], 23).tolist() == [
        base[i].item() for i in perm
    ]
    assert allocate([1, 1], [0, 0], 0).tolist() == [0, 0]


@pytest.mark.parametrize(
    'call,msg',
    [
        (lambda: allocate([1, 2], [1], 3), 'equal-length'),
        (lambda: allocate([], [], 3), 'non-empty'),
        (lambda: allocate([[1]], [[1]], 3), '1-D'),
        (lambda: allocate([1, 1], [1, 1], 3, min_per_prompt=2), 'budget 3 < 2 prompts'),
        (lambda: allocate([1], [1], 2, min_per_prompt=-1), 'min_per_prompt must be >= 0, got -1'),
        (lambda: allocate([-1], [1], 2), 'successes must be >= 0'),
        (lambda: hit_utility(0, 0, float('inf')), 'm must be finite'),
        (lambda: hit_utility(float('nan'), 0, 1), 'successes must be finite'),
        (lambda: hit_utility(0, 0, -1), 'm must be >= 0'),
    ],
)
def test_bad_input(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()


def test_hora_rollouts_budget_and_groups():
    tok = char_tokenizer()
    net = tiny_qwen3(tok, hidden_size=32, seed=0)
    items = [
        dict(prompt=f"{a}+{b}=", answer=str(a + b)) for a, b in [(1, 2), (3, 4), (5, 5), (0, 9)]
    ]
    # a stand-in verifier the random model sometimes satisfies
    reward = lambda text, ans: float('1' in text)
    cfg = TrainConfig(group_size=6, max_new_tokens=6, allocation='hora', first_wave=3)
    pi, pm, ri, rm, answers, gids, info = hora_rollouts(
        net, tok, items, cfg, reward, torch.Generator().manual_seed(3)
    )
    sizes = torch.bincount(gids, minlength=4)
    assert (
        sizes.sum().item() == 24 and (sizes >= 3).all() and info['max_group'] == sizes.max().item()
    )
    assert (
        ri.shape == rm.shape
        and ri.shape[0] == pi.shape[0] == 24
        and answers == [items[i]['answer'] for i in gids.tolist()]
    )
    assert not rm[:, 0].logical_not().any()  # every row starts with a real token
    with pytest.raises(ValueError, match='first_wave must be in'):
        hora_rollouts(
            net,
            tok,
            items,
            TrainConfig(group_size=4, first_wave=5, allocation='hora'),
            reward,
            torch.Generator(),
        )


def test_cli_flags_checked():
    bad = [
        (['--allocation', 'hora', '--first-wave', '1'], '--first-wave must be'),
        (['--first-wave', '9'], '--first-wave must be'),
        (['--method', 'hp-rlvr', '-G', '1', '--allocation', 'hora'], 'needs a group-based method'),
    ]
    for argv, msg in bad:
        with pytest.raises(ValueError, match=msg):
            configs_from_args(train_parser().parse_args(argv))
    ex, cfg = configs_from_args(
        train_parser().parse_args(
            ['--allocation', 'hora', '--method', 'rloo', '--reweight', 'none']
        )
    )
    assert (cfg.allocation, cfg.method, cfg.first_wave) == ('hora', 'rloo', 0)
    v, roll = hora_variants(cfg)
    assert list(v) == ['grpo-uniform', 'grpo-hora', 'rloo-uniform', 'rloo-hora'] and set(
        roll.values()
    ) == {64}


@pytest.fixture
def tiny(tiny_flags):
    "Tiny runs of this chapter: groups of G = 4 (HORA reallocates them)."
    return tiny_flags(G=4)


def test_train_cli_hora_rloo(tmp_path, tiny):
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        assert (
            train_cli(
                [
                    '--out',
                    str(tmp_path),
                    '--method',
                    'rloo',
                    '--allocation',
                    'hora',
                    '--reweight',
                    'none',
                ]
                + tiny
            )
            == 0
        )
    rows = [
        r
        for r in read_jsonl(tmp_path / 'runs' / 'rloo+hora-s0' / 'metrics.jsonl')
        if r['kind'] == 'train'
    ]
    assert [r['step'] for r in rows] == [1, 2]
    for r in rows:
        assert (
            2 <= r['max_group'] <= 4 + 3 * 2
            and 0 <= r['hit_frac'] <= 1
            and 0 <= r['zero_grad_frac'] <= 1
            and r['n_updates'] == 4
        )
    assert (
        json.loads((tmp_path / 'summary.json').read_text())['variants'][0]['variant'] == 'rloo+hora'
    )


def test_compare_hora_cli(tmp_path, capsys, tiny):
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        # the last --steps wins
        assert compare_hora_cli(['--out', str(tmp_path)] + tiny + ['--steps', '1']) == 0
    table = (tmp_path / 'compare.md').read_text()
    for v in ('grpo-uniform', 'grpo-hora', 'rloo-uniform', 'rloo-hora', 'start (SFT)'):
        assert f"| {v} |" in table
    assert '| 12 |' in table  # rollouts per step: 3 prompts x G = 4, for every variant
    # the same tables with how they were measured, for a chapter's results file
    res = json.loads((tmp_path / 'compare.json').read_text())
    assert res['command'].startswith('hara-ref compare hora --out') and not res['stale']
    main, curve = res['tables']
    big = dict(zip(main['columns'], zip(*main['rows'])))['largest group']
    # start (SFT), then grpo-uniform, grpo-hora, rloo-uniform, rloo-hora: only HORA has groups of
    # unequal size
    assert [b == '' for b in big] == [True, True, False, True, False]
    assert curve['columns'] == ['variant', '0', '1'] and len(curve['rows']) == 4
    assert compare_hora_cli(['--out', str(tmp_path), '--seeds', 'x']) == 2


def test_compare_resume_reads_the_start_back_and_a_fresh_run_is_refused(tmp_path, capsys, tiny):
    """A resumed comparison reports the saved start evaluation (it does not evaluate the start
    again); a fresh one into a folder with results is refused before any work (exit 2)."""
    argv = ['--out', str(tmp_path)] + tiny + ['--steps', '1']
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        assert compare_hora_cli(argv) == 0
        se = tmp_path / 'start_eval.json'
        # 2 prompts x 2 samples give pass@1 in steps of 0.25: 0.125 is only the saved file's
        se.write_text(json.dumps(json.loads(se.read_text()) | dict(pass1=0.125)))
        assert compare_hora_cli(argv + ['--resume']) == 0
    md = (tmp_path / 'compare.md').read_text()
    assert '| 0.125 |' in next(row for row in md.splitlines() if row.startswith('| start (SFT)'))
    capsys.readouterr()
    assert compare_hora_cli(argv) == 2
    assert 'already holds an experiment' in capsys.readouterr().err


# allocate (threshold on the log gains) against allocate_greedy (the heap): equal, tie for tie

# small ones make equal prompts, so ties
small_counts = st.one_of(st.integers(0, 3), st.integers(0, 200))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_threshold_equals_greedy(data):
    N = data.draw(st.integers(1, 6))
    s = data.draw(st.lists(small_counts, min_size=N, max_size=N))
    f = data.draw(st.lists(small_counts, min_size=N, max_size=N))
    m_min = data.draw(st.integers(0, 3))
    budget = data.draw(st.integers(N * m_min, N * m_min + 80))
    K = data.draw(st.sampled_from([1, 2, 15, 63]))
    got, ref = allocate(s, f, budget, m_min, thresholds=K), allocate_greedy(s, f, budget, m_min)
    assert got.dtype == ref.dtype == torch.long and got.tolist() == ref.tolist(), (
        s,
        f,
        budget,
        m_min,
        K,
    )


@pytest.mark.parametrize(
    's,f',
    [
        ([2, 2, 2, 2], [2, 2, 2, 2]),  # equal prompts: every gain ties
        # equal first gains a/(a+b) = 1/2, different later ones
        ([0, 1, 3, 7], [0, 1, 3, 7]),
        ([5, 0, 5, 0, 5], [1, 4, 1, 4, 1]),  # two kinds, interleaved
        ([0, 0, 9, 0], [0, 0, 9, 0]),
    ],
)
def test_threshold_equals_greedy_with_ties(s, f):
    for budget in range(0, 25):
        for m_min in (0, 1):
            if budget < len(s) * m_min:
                continue
            ref = allocate_greedy(s, f, budget, m_min).tolist()
            for K in (1, 15):
                assert allocate(s, f, budget, m_min, thresholds=K).tolist() == ref, (
                    s,
                    f,
                    budget,
                    m_min,
                    K,
                )
    # ties: the lower index first
    assert allocate([2, 2, 2, 2], [2, 2, 2, 2], 6).tolist() == [2, 2, 1, 1]


def threshold_structure(s, f, alloc, m_min):
    """The greedy's picks are the R largest gains, ties to the lower index: every gain taken >=
    every gain left."""
    s, f = torch.as_tensor(s, dtype=torch.float64), torch.as_tensor(f, dtype=torch.float64)
    took = alloc > m_min  # (N,)
    # (N,) the last gain taken, where one was
    last = log_marginal_gain(s, f, (alloc - 1).clamp(min=0))
    left = log_marginal_gain(s, f, alloc)  # (N,) the next gain left
    for i in took.nonzero()[:, 0].tolist():
        for j in range(len(s)):
            assert (
                last[i] > left[j]
                or (last[i] == left[j] and i < j)
                or (last[i] == left[j] and i == j)
            ), (i, j)


@pytest.mark.parametrize('budget', [10**9, 10**12])
@pytest.mark.parametrize(
    's,f,m_min',
    [
        ([0, 1, 3, 4], [4, 3, 1, 0], 0),
        ([3], [4], 0),
        ([2, 2, 2], [2, 2, 2], 5),
        (list(range(40)), list(range(40))[::-1], 3),
        ([10**6, 0], [0, 10**6], 1),
    ],
)
def test_huge_budget(s, f, m_min, budget):
    """Would take days with the heap (one step per rollout); finishes here, with the threshold
    structure."""
    alloc = allocate(s, f, budget, m_min)
    assert alloc.dtype == torch.long and alloc.shape == (len(s),)
    assert alloc.sum().item() == budget and (alloc >= m_min).all()
    threshold_structure(s, f, alloc, m_min)
    if len(set(zip(s, f))) == 1:
        assert alloc.max() - alloc.min() <= 1 and alloc.tolist() == sorted(
            alloc.tolist(), reverse=True
        )


def test_threshold_structure_can_fail():
    "The structure check rejects a non-greedy allocation (one rollout moved to a worse prompt)."
    s, f = [0, 1, 3, 4], [4, 3, 1, 0]
    alloc = allocate(s, f, 1000)
    threshold_structure(s, f, alloc, 0)
    worse = alloc.clone()
    worse[0] -= 1
    worse[3] += 1
    with pytest.raises(AssertionError):
        threshold_structure(s, f, worse, 0)


@pytest.mark.parametrize('alloc_fn', [allocate, allocate_greedy])
@pytest.mark.parametrize(
    'budget,err,msg',
    [
        (float('nan'), TypeError, 'budget must be an integer, got nan'),
        (math.inf, TypeError, 'budget must be an integer, got inf'),
        (-math.inf, TypeError, 'budget must be an integer, got -inf'),
        (None, TypeError, 'budget must be an integer, got None'),
        (2.5, TypeError, 'budget must be an integer, got 2.5'),
        (4.0, TypeError, 'budget must be an integer, got 4.0'),
        (True, TypeError, 'budget must be an integer, got the bool True'),
        (np.bool_(False), TypeError, 'budget must be an integer'),
        ('3', TypeError, "budget must be an integer, got '3'"),
        (-1, ValueError, 'budget must be >= 0, got -1'),
        (2**40, ValueError, r'successes \+ failures \+ budget must be <= 2\*\*40'),
    ],
)
def test_bad_budget_named(alloc_fn, budget, err, msg):
    with pytest.raises(err, match=msg):
        alloc_fn([1, 2], [0, 3], budget)


@pytest.mark.parametrize('alloc_fn', [allocate, allocate_greedy])
def test_bad_min_per_prompt_and_good_integer_types(alloc_fn):
    for bad, err in [
        (0.5, TypeError),
        (True, TypeError),
        (None, TypeError),
        (-1, ValueError),
        (math.nan, TypeError),
    ]:
        with pytest.raises(err, match='min_per_prompt must be'):
            alloc_fn([1, 2], [0, 3], 4, bad)
    ref = alloc_fn([1, 2], [0, 3], 7, 1).tolist()
    for M, m in [(np.int64(7), np.int32(1)), (torch.tensor(7), torch.tensor(1))]:
        assert alloc_fn(np.array([1, 2]), torch.tensor([0, 3]), M, m).tolist() == ref


def test_thresholds_checked():
    for bad, err in [(0, ValueError), (1.5, TypeError), (True, TypeError)]:
        with pytest.raises(err, match='thresholds must be'):
            allocate([1], [1], 3, thresholds=bad)


# 0 .. 2**40 - 1
log_uniform = st.floats(0, 40 * math.log(2)).map(lambda x: math.floor(math.exp(x)) - 1)


@settings(max_examples=100, deadline=None)
@given(
    s=st.lists(log_uniform, min_size=50, max_size=50),
    f=st.lists(log_uniform, min_size=50, max_size=50),
    m=st.lists(log_uniform, min_size=50, max_size=50),
)
def test_float64_gains_strictly_decreasing_below_2_40(s, f, m):
    """The allocators rely on it: inside their domain (a + b + m <= 2**40) consecutive float64 log
    gains never tie or swap."""
    s, f, m = (torch.tensor(v, dtype=torch.float64) for v in (s, f, m))  # (50,) each
    m = torch.minimum(m, 2.0**40 - 3 - s - f).clamp(min=0)  # a + b + m + 1 <= 2**40
    keep = s + f + 3 <= 2.0**40
    g0, g1 = (
        log_marginal_gain(s[keep], f[keep], m[keep]),
        log_marginal_gain(s[keep], f[keep], m[keep] + 1),
    )
    assert torch.isfinite(g0).all() and (g1 < g0).all()


def test_vector_and_scalar_gains_bitwise_equal():
    """The heap evaluates one gain at a time, `allocate` whole vectors: exact equality needs the
    same float64 bits."""
    g = torch.Generator().manual_seed(0)
    s = torch.randint(0, 300, (500,), generator=g).double()
    f = torch.randint(0, 300, (500,), generator=g).double()
    # (500,) 1 .. 5e11
    m = torch.floor(torch.exp(torch.rand(500, generator=g, dtype=torch.float64) * 27))
    vec = log_marginal_gain(s, f, m)  # (500,)
    assert all(vec[i].item() == log_marginal_gain(s[i], f[i], int(m[i])).item() for i in range(500))
    # in a (2, 500) batch
    assert torch.equal(log_marginal_gain(s, f, torch.stack([m.flip(0), m]))[1], vec)
