"Properties of the shared data generators (hara_ref.rlvr.data)."

import random
import torch
from hypothesis import given, settings, strategies as st
from hara_ref.rlvr.data import (
    planted_stage_rollouts,
    stage_order,
    sum_problem,
    sum_solution,
    sum_task,
    is_heldout,
)


@settings(max_examples=60, deadline=None)
@given(S=st.integers(1, 9), seed=st.integers(0, 10**6), p=st.floats(0, 1))
def test_stage_order_keeps_anchors(S, seed, p):
    o = stage_order(S, random.Random(seed), p_skip=p, p_repeat=p, p_swap=p)
    assert o[0] == 0 and o[-1] == S - 1
    assert set(o) <= set(range(S))


@settings(max_examples=30, deadline=None)
@given(K=st.integers(1, 6), S=st.integers(2, 7), d=st.integers(1, 12), seed=st.integers(0, 1000))
def test_planted_rollouts_shapes_and_padding(K, S, d, seed):
    pr = planted_stage_rollouts(
        K=K, n_stages=S, d=d, seed=seed, p_skip=0.3, p_repeat=0.3, p_swap=0.3
    )
    T = pr.mask.shape[1]
    assert pr.hidden.shape == (K, T, d) and pr.stages.shape == (K, T)
    assert torch.equal(pr.mask, pr.stages >= 0)
    # masks are prefixes (no holes): real tokens first, padding after
    assert torch.equal(pr.mask, torch.sort(pr.mask.int(), dim=1, descending=True).values.bool())
    assert pr.hidden[~pr.mask].abs().sum() == 0


def test_substituted_stage_is_novel_and_contiguous():
    pr = planted_stage_rollouts(K=6, n_stages=6, substitute=(3, 2), seed=5)
    idx = (pr.stages[3] == 6).nonzero().flatten()
    assert len(idx) >= 3 and torch.equal(idx, torch.arange(idx[0], idx[-1] + 1))
    assert (pr.stages[[0, 1, 2, 4, 5]] == 6).sum() == 0


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(2, 5), data=st.data())
def test_every_order_gives_the_answer(seed, n, data):
    p = sum_problem(random.Random(seed), n_terms=n, max_value=20)
    order = data.draw(st.permutations(list(range(n))))
    sol = sum_solution(p, order)
    assert sol.endswith('\\boxed{' + p.answer + '}')
    assert sol.count(';') == n - 1


def test_split_is_disjoint_and_stable():
    tr, te = sum_task(500, 'train', seed=1), sum_task(100, 'test', seed=1)
    assert not {p.prompt for p in tr} & {p.prompt for p in te}
    assert all(is_heldout(p.prompt) for p in te) and not any(is_heldout(p.prompt) for p in tr)
    assert [p.prompt for p in sum_task(20, 'train', seed=1)] == [
        p.prompt for p in sum_task(20, 'train', seed=1)
    ]
