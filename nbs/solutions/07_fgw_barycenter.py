"""Worked solutions to the exercises of chapter 07, The exact FGW barycenter
(`nbs/2_ot/07_fgw_barycenter.ipynb`)."""

import torch

from hara_ref.ot.fgw import chain_structure
from hara_ref.ot.fgw_barycenter import (
    fgw_barycenter,
    monotone_coupling,
    update_features,
    update_structure,
)

torch.set_num_threads(1)
f64 = torch.float64

# Exercise 1: one rollout and the identity plan.
# With T = I / L and b = 1 / L: (T^T h)_j = h_j / L, divided by b_j = 1 / L gives z_j = h_j; and
# (T^T C T)_{jk} = C_{jk} / L^2, divided by b_j b_k = 1 / L^2 gives C_bar = C.
L = 5
h = torch.randn(L, 3, generator=torch.Generator().manual_seed(0), dtype=f64)  # (L, d)
C = chain_structure(torch.linspace(0, 1, L, dtype=f64))  # (L, L)
T, b = torch.eye(L, dtype=f64) / L, torch.full((L,), 1 / L, dtype=f64)
Z, Cb = update_features([T], [h], [1.0], b), update_structure([T], [C], [1.0], b)
print(
    f"Exercise 1: max |Z - h| {float((Z - h).abs().max()):.1e}, max |Cb - C| "
    f"{float((Cb - C).abs().max()):.1e}"
)
assert torch.allclose(Z, h, rtol=0, atol=1e-15) and torch.allclose(Cb, C, rtol=0, atol=1e-15)

# Exercise 2: the north-west corner rule, 4 tokens (1/4 each) onto 3 nodes (1/3 each).
# In twelfths: token 1 (3) fills node 1 to 3 of 4; token 2 gives 1 to node 1 (full) and 2 to
# node 2; token 3 gives 2 to node 2 (full) and 1 to node 3; token 4 gives 3 to node 3.
by_hand = torch.tensor([[3, 0, 0], [1, 2, 0], [0, 2, 1], [0, 0, 3]], dtype=f64) / 12  # (4, 3)
P = monotone_coupling(torch.full((4,), 1 / 4, dtype=f64), torch.full((3,), 1 / 3, dtype=f64))
print(f"Exercise 2: the coupling x 12:\n{(12 * P).numpy()}")
assert torch.allclose(P, by_hand, rtol=0, atol=1e-15)

# Exercise 3: weights 3 and 1, one node.
# With one node every plan sends all of a rollout's mass to it, so the feature step is the
# lambda-weighted mean: (3 (0, 0) + 1 (4, 0)) / 4 = (1, 0).
hs = [torch.tensor([[0.0, 0.0]], dtype=f64), torch.tensor([[4.0, 0.0]], dtype=f64)]  # 2 x (1, 2)
Cs = [torch.zeros(1, 1, dtype=f64)] * 2
Z1, _ = fgw_barycenter(hs, Cs, lambdas=[3, 1], L_b=1)
print(f"Exercise 3: the node sits at {Z1[0].tolist()}")
assert torch.allclose(Z1, torch.tensor([[1.0, 0.0]], dtype=f64), rtol=0, atol=1e-14)
