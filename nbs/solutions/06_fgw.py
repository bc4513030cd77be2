"""Worked solutions to the exercises of chapter 06, Rollouts as attributed chain graphs, and the FGW
distance (`nbs/2_ot/06_fgw.ipynb`)."""

import torch

from hara_ref.ot.fgw import chain_graph, chain_positions, chain_structure, fgw, gw_objective

torch.set_num_threads(1)
f64 = torch.float64

# Exercise 1: the reversal keeps every distance along a chain.
# tau_{L+1-t} = 1 - tau_t, so |tau_{L+1-t} - tau_{L+1-s}| = |(1 - tau_t) - (1 - tau_s)| = C[t, s].
# The reversed plan T = J / L (J the anti-identity) pairs (t, L+1-t) and (s, L+1-s): every term of
# the GW sum is (C[t, s] - C[L+1-t, L+1-s])^2 = 0.
L = 7
C = chain_structure(chain_positions(torch.ones(L, dtype=torch.bool), f64))  # (L, L)
J = torch.eye(L, dtype=f64).flip(1)  # (L, L) the anti-identity
assert torch.allclose(J @ C @ J.T, C, rtol=0, atol=1e-15)  # the reversal keeps C
gw_rev, gw_id = gw_objective(J / L, C, C), gw_objective(torch.eye(L, dtype=f64) / L, C, C)
print(
    f"Exercise 1: GW of the reversed plan {float(gw_rev):.1e}, of the identity {float(gw_id):.1e}"
)
assert abs(float(gw_rev)) < 1e-14 and abs(float(gw_id)) < 1e-14

# Exercise 2: features running in opposite directions.
# Prediction: no. The structure term cannot tell the reversal from the identity (exercise 1), so
# only the features decide, and they prefer the reversed matching at every alpha < 1.
angles = torch.linspace(0, 1.5, 5, dtype=f64)  # five tokens along an arc
h1 = torch.stack([angles.cos(), angles.sin()], -1)  # (5, 2)
h2 = h1.flip(0)  # (5, 2) the same states in the opposite order
M = torch.cdist(h1, h2) ** 2  # (5, 5)
C5 = chain_structure(torch.linspace(0, 1, 5, dtype=f64))  # (5, 5)
for alpha in (0.25, 0.9):
    plan = fgw(M, C5, C5, alpha=alpha)  # (5, 5)
    on_reversal = float((plan * torch.eye(5, dtype=f64).flip(1)).sum())
    print(f"Exercise 2: alpha {alpha}: mass on the reversal {on_reversal:.6f}")
    assert on_reversal > 1 - 1e-9

# Exercise 3: a left-padded rollout.
# Prediction: positions are counted over the real tokens, so the row reads 0, 0, 0, 1/3, 2/3, 1:
# padding gets tau = 0 (unused), weight 0 and a zero feature.
mask = torch.tensor([[False, False, True, True, True, True]])  # (1, T)
tau = chain_positions(mask, f64)  # (1, T)
print(f"Exercise 3: positions {tau[0].tolist()}")
assert torch.allclose(tau[0], torch.tensor([0, 0, 0, 1 / 3, 2 / 3, 1], dtype=f64), atol=1e-15)
g = chain_graph(torch.randn(1, 6, 4, dtype=f64), mask)
assert g['p'][0, :2].abs().sum() == 0 and g['h'][0, :2].abs().sum() == 0
assert abs(float(g['p'].sum()) - 1) < 1e-15
