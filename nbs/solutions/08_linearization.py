"""Worked solutions to the exercises of chapter 08, Lemma 3.1: anchor-guided linearization
(`nbs/2_ot/08_linearization.ipynb`)."""

import torch

from hara_ref.ot.fgw import chain_positions, chain_structure, gw_objective
from hara_ref.ot.lfgw import (
    anchor_plan,
    barycenter_cost,
    chain_tau_bar,
    lift,
    linear_cost,
    structure_cost,
)

torch.set_num_threads(1)
f64 = torch.float64

# Exercise 1: Lemma 3.1 for L = 3, L_b = 2.
# tau = (0, 1/2, 1), tau_bar = (0, 1), P0 = token 1 -> node 1, token 3 -> node 2. Then
# E_tj = (C[t,1] - C_bar[j,1])^2 + (C[t,3] - C_bar[j,2])^2 = (tau_t - tau_bar_j)^2
#        + ((1 - tau_t) - (1 - tau_bar_j))^2 = 2 (tau_t - tau_bar_j)^2, e.g. E_21 = 1/4 + 1/4 = 1/2.
mask = torch.ones(3, dtype=torch.bool)
tau, tau_bar = chain_positions(mask, f64), chain_tau_bar(2)  # (3,), (2,)
E_def = structure_cost(chain_structure(tau), chain_structure(tau_bar), anchor_plan(mask, 2))
by_hand = torch.tensor([[0, 2], [0.5, 0.5], [2, 0]], dtype=f64)  # (3, 2)
print(f"Exercise 1: E from the definition\n{E_def.numpy()}")
assert torch.allclose(E_def, by_hand, rtol=0, atol=1e-15)
assert torch.allclose(E_def, linear_cost(tau, tau_bar), rtol=0, atol=1e-15)

# Exercise 2: the crossing plan on two tokens and two nodes.
# The moves (1 -> 2) and (2 -> 1) cross, counted in both orders of the pair:
# R = 2 * |0 - 1| * |1 - 0| * (1/2)(1/2) = 1/2, so F_lin - F = 4 alpha R = 1/2 at alpha = 1/4.
# Directly: each move has E = 2 (tau - tau_bar)^2 = 2 and mass 1/2, so <E, T> = 2; GW(T) = 0 (the
# swap keeps the one distance); F_lin - F = alpha (<E, T> - GW(T)) = 1/2.
t2, tb2 = chain_positions(torch.ones(2, dtype=torch.bool), f64), chain_tau_bar(2)
T = torch.tensor([[0.0, 0.5], [0.5, 0.0]], dtype=f64)  # (2, 2) the crossing plan
C2, Cb2 = chain_structure(t2), chain_structure(tb2)
gap = 0.25 * float((linear_cost(t2, tb2) * T).sum() - gw_objective(T, C2, Cb2))
print(f"Exercise 2: F_lin - F = {gap}, 4 alpha R = {4 * 0.25 * 0.5}")
assert abs(gap - 0.5) < 1e-15

# Exercise 3: sizes when L doubles.
# The lifted cost is (K, L, L_b): it doubles. The exact barycenter's structures are K x (L, L): they
# grow four times.
K, d, L_b, alpha = 2, 4, 8, 0.25
sizes = {}
for L in (100, 200):
    h = torch.randn(K, L, d, dtype=f64)  # (K, L, d)
    m = torch.ones(K, L, dtype=torch.bool)  # (K, L)
    phi = lift(h, chain_positions(m, f64), alpha)  # (K, L, d+1)
    M = barycenter_cost(phi, torch.zeros(L_b, d, dtype=f64), chain_tau_bar(L_b), alpha)
    sizes[L] = M.numel(), K * chain_structure(chain_positions(m[0], f64)).numel()
(lin1, ex1), (lin2, ex2) = sizes[100], sizes[200]
print(f"Exercise 3: lifted cost x{lin2 / lin1:.0f}, exact structures x{ex2 / ex1:.0f}")
assert lin2 == 2 * lin1 and ex2 == 4 * ex1
