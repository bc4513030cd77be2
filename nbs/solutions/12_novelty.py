"""Worked solutions to the exercises of chapter 12 (Novelty: each token's distance from its outcome
group)."""

import torch

from hara_ref.hara.novelty import (
    local_assignment,
    relative_to_group,
    sequence_novelty,
    stage_versions,
    token_contributions,
    token_novelty,
    version_excess,
)
from hara_ref.hara.rollouts import group_geometric_median
from hara_ref.ot.entropic import semidual_reference
from hara_ref.ot.fgw import chain_positions, normalize_features
from hara_ref.ot.lfgw import chain_tau_bar, lift, lifted_cost, linearized_barycenter_reference
from hara_ref.rlvr.data import planted_stage_rollouts

f64 = dict(dtype=torch.float64)

# The group of sections 2 and 3: the four correct rollouts, rollout 2 with a novel stage.
pr = planted_stage_rollouts(K=8, n_stages=6, d=16, substitute=(2, 3), seed=0)
K, L_b = 4, 16
hidden, mask, novel = pr.hidden[:K], pr.mask[:K], pr.stages[:K] == 6
Z, _ = linearized_barycenter_reference(hidden, mask, L_b=L_b)
h = normalize_features(hidden, how='unit') * mask[..., None]
tau, tau_bar = chain_positions(mask, h.dtype), chain_tau_bar(L_b, h.dtype)
C = lifted_cost(h, tau, Z, tau_bar)  # (K, T, L_b)
a = mask.to(h.dtype) / mask.sum(-1, keepdim=True)
b = torch.full((L_b,), 1 / L_b, **f64)
plans = torch.stack([semidual_reference(a[k], b, C[k], 0.05)[0] for k in range(K)])
nbar = sequence_novelty(token_novelty(token_contributions(plans, C), mask), mask).mean()  # n̄_g
one = torch.zeros(K, dtype=torch.long)
phi = lift(h, tau, 0.25)  # (K, T, d+1)


def relative(reg):
    "x_{i,t} of the group reference with the assignment at entropy `reg`, and P, Λ."
    q = local_assignment(C, mask, reg)
    y = stage_versions(q, phi)
    nu, e, _ = version_excess(q, y, group_geometric_median(y, one, one == 0)[0], mask)
    return relative_to_group(e, nbar.expand(K), mask), q, nu


# Exercise 1: mean_t x_{i,t} = 1 + mean_t e_{i,t} / n̄_g, and
# mean_t e_{i,t} = Σ_t a_t Σ_j (P_tj / a_t) Λ_j = Σ_{t,j} P_{i,tj} Λ_{i,j}.
x, q, nu = relative(0.05)
lhs = (x * mask).sum(-1) / mask.sum(-1)  # (K,)
rhs = 1 + (q * nu[:, None, :]).sum((-1, -2)) / nbar  # (K,)
assert torch.allclose(lhs, rhs, rtol=0, atol=1e-12)
print(f"mean x per rollout: {lhs.numpy().round(4)} = 1 + Σ P Λ / n̄_g: {rhs.numpy().round(4)}")

# Exercise 2: two of three rollouts are (0, 3): the median of stage 1 is now 3, so rollout 0 is the
# novel one, with Λ = (0, 4) and x = (1, 3).
q3 = torch.tensor([[0.5, 0.0], [0.0, 0.5]], **f64).expand(3, 2, 2)
phi3 = torch.tensor([[[0.0], [1.0]], [[0.0], [3.0]], [[0.0], [3.0]]], **f64)
y3 = stage_versions(q3, phi3)
og3, all3, mk3 = (
    torch.zeros(3, dtype=torch.long),
    torch.ones(3, dtype=torch.bool),
    torch.ones(3, 2, dtype=torch.bool),
)
nu3, e3, _ = version_excess(q3, y3, group_geometric_median(y3, og3, all3)[0], mk3)
x3 = relative_to_group(e3, torch.full((3,), 2.0, **f64), mk3)
# (chapter 11's plain Weiszfeld iteration: the median to its tolerance, not exactly)
assert torch.allclose(nu3, torch.tensor([[0.0, 4.0], [0.0, 0.0], [0.0, 0.0]], **f64), atol=1e-12)
assert torch.allclose(x3[0], torch.tensor([1.0, 3.0], **f64), rtol=0, atol=1e-8)

# Exercise 3: a larger ε spreads each token's mass over more nodes, so the versions blur together
# and the novel stage's versions are pulled towards the others: its x goes down.
x_sharp, x_soft = relative(0.05)[0], relative(0.5)[0]
top_sharp, top_soft = float(x_sharp[2][novel[2]].max()), float(x_soft[2][novel[2]].max())
print(
    f"rollout 2's largest x on its novel stage: ε = 0.05 -> {top_sharp:.2f}, "
    f"ε = 0.5 -> {top_soft:.2f}"
)
assert top_soft < top_sharp
