"""Worked solutions to the exercises of chapter 01, Data we control.

Run from anywhere: `python nbs/solutions/01_data.py` (every answer is checked by an assert).
"""

import itertools
import json
import math
from pathlib import Path

import torch

from hara_ref.rlvr.data import Problem, planted_stage_rollouts, sum_solution

# Exercise 1: distances to the stage centres.
# A token is h = c_s + u xi with xi ~ N(0, I/d), so E||h - c_s||^2 = u^2 E||xi||^2 = u^2: the
# distance to its own centre is about u. To another centre c_r: ||c_s - c_r + u xi||^2 = ||c_s -
# c_r||^2 + 2u <c_s - c_r, xi> + u^2 ||xi||^2, whose mean is 2 - 2<c_s, c_r> + u^2, and two random
# unit vectors in high dimension have <c_s, c_r> close to 0: about sqrt(2 + u^2).
u = 0.3
pr = planted_stage_rollouts(K=8, n_stages=6, d=256, noise=u, seed=1)
allc = torch.cat([pr.centers, pr.novel_center[None]])  # (S+1, d)
dist = torch.cdist(pr.hidden[pr.mask], allc)  # (N, S+1)
own = torch.nn.functional.one_hot(pr.stages[pr.mask], len(allc)).bool()  # (N, S+1)
print(
    f"own centre {dist[own].mean():.3f} (u = {u}); others {dist[~own].mean():.3f} "
    f"(sqrt(2 + u^2) = {math.sqrt(2 + u * u):.3f})"
)
assert abs(dist[own].mean().item() - u) < 0.02
assert abs(dist[~own].mean().item() - math.sqrt(2 + u * u)) < 0.05

# Exercise 2: how many correct scratchpads?
# Every order of the terms gives a scratchpad; with three different terms the 3! = 6 orders give 6
# different strings (the first partial sum names the first two terms in order). With 3, 3, 5, two
# orders that only swap the two 3s write the same string: 6 / 2 = 3.
for terms, predicted in (((7, 2, 5), 6), ((3, 3, 5), 3)):
    p = Problem('+'.join(map(str, terms)) + '=', str(sum(terms)), terms)
    pads = {sum_solution(p, order) for order in itertools.permutations(range(3))}
    print(f"{p.prompt}: {len(pads)} scratchpads")
    assert len(pads) == predicted

# Exercise 3: HARA's total advantage for rollout 1, against GRPO's.
# sum_t A_1 w_{1,t} / sum_t A_1 = (A_1 sum_t w_{1,t}) / (L_1 A_1) = mean_t w_{1,t}. Rollout 1 is
# correct (A_1 > 0), its novel stage has weight above 1 and its other tokens stay near 1: above 1.
game = json.loads((Path(__file__).parent.parent / 'results' / 'whole_game.json').read_text())
i = game['novel_correct'][0]
ratio = sum(game['hara'][i]) / sum(game['grpo'][i])
mean_w = sum(game['weights'][i]) / len(game['weights'][i])
print(f"rollout {i}: HARA / GRPO total advantage {ratio:.4f}, mean weight {mean_w:.4f}")
assert abs(ratio - mean_w) < 1e-12 and ratio > 1
