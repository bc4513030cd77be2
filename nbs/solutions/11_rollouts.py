"""Worked solutions to the exercises of chapter 11 (Rollout batches: outcome groups, spans,
medians)."""

import torch

from hara_ref.hara.rollouts import (
    group_geometric_median,
    group_mean,
    outcome_groups,
    weiszfeld_median,
)

f64 = dict(dtype=torch.float64)

# Exercise 1: two points. For y on the segment, |y1 - y| + |y - y2| = |y1 - y2| (equality in the
# triangle inequality); off the segment the inequality is strict, so f is larger.
y1, y2 = torch.tensor([0.0, 0.0], **f64), torch.tensor([2.0, 4.0], **f64)


def f(y):
    return float((y1 - y).norm() + (y2 - y).norm())


d = float((y2 - y1).norm())
for s in (0.5, 0.25):
    assert abs(f(y1 + s * (y2 - y1)) - d) < 1e-12  # every point of the segment is a minimiser
normal = torch.tensor([-4.0, 2.0], **f64) / 20**0.5  # unit vector orthogonal to the segment
assert f((y1 + y2) / 2 + normal) > d + 0.1  # one unit off the segment: strictly larger

# Exercise 2: the mean moves with the novel member; the geometric median hardly moves.
g = torch.Generator().manual_seed(0)
typical = 0.3 * torch.randn(6, 2, generator=g, **f64)  # section 3's six typical members
one7 = torch.zeros(7, dtype=torch.long), torch.ones(7, dtype=torch.bool)
moves = {}
for name, stat in (
    ('mean', group_mean),
    ('median', lambda v, og, m: group_geometric_median(v, og, m)[0]),
):
    near = stat(torch.cat([typical, torch.tensor([[4.0, 3.0]], **f64)]), *one7)[0]
    far = stat(torch.cat([typical, torch.tensor([[40.0, 30.0]], **f64)]), *one7)[0]
    moves[name] = float((far - near).norm())
print(
    f"moving the novel member 45 units: the mean moves {moves['mean']:.2f}, "
    f"the median {moves['median']:.4f}"
)
assert abs(moves['mean'] - 45 / 7) < 1e-9  # the mean moves by 1/7 of the move, exactly
assert moves['median'] < 0.01  # a far point pulls with a unit force, whatever its distance

# Exercise 3: outcome labels. By reward, 1.5 and 1.5 share a group and 1 is alone; by outcome
# (solved or not), the three solved rollouts form one group.
r4 = torch.tensor([1.0, 1.5, 0.5, 1.5])
og_r, sizes_r = outcome_groups(r4, torch.zeros(4))
solved = r4 >= 1.0  # the outcome labels
og_o, sizes_o = outcome_groups(solved, torch.zeros(4))
assert sorted(sizes_r.tolist()) == [1, 1, 2] and sorted(sizes_o.tolist()) == [1, 3]
assert og_o[0] == og_o[1] == og_o[3] != og_o[2]

# Exercise 4: three of five points at (1, 1): a step delta off (1, 1) adds 3 delta to the three
# copies' distances and takes at most 2 delta from the other two, so the median is (1, 1).
# Weiszfeld's steps shrink as they near it (the copies' weights grow without bound): the loop ends
# close to (1, 1) but not on it.
maj = torch.tensor([[[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [5.0, 2.0], [0.0, 9.0]]], **f64)
m_plain, info = weiszfeld_median(maj, torch.ones(1, 5, dtype=torch.bool))
gap = float((m_plain[0] - 1).norm())
print(f"Weiszfeld: {info['n_iter']} steps, converged={info['converged']}, {gap:.1e} from (1, 1)")
assert info['converged'] and 0 < gap < 1e-6
