"""Worked solutions to the exercises of chapter 05, Entropic optimal transport and the log-domain
Sinkhorn (`nbs/2_ot/05_sinkhorn.ipynb`)."""

import math

import torch

from hara_ref.ot.entropic import semidual_reference, sinkhorn_reference
from hara_ref.rlvr.data import planted_stage_rollouts

torch.set_num_threads(1)
f64 = torch.float64

# Exercise 1: the 2 x 2 plan in closed form.
# With a = b = (1/2, 1/2) and M symmetric, swapping the two points maps the problem to itself, so
# u = u0 * 1 and v = v0 * 1. Then T = u0 v0 K, and the row sums give u0 v0 (1 + e^{-1/eps}) = 1/2:
# T_11 = T_22 = (1/2) / (1 + e^{-1/eps}), T_12 = T_21 = (1/2) e^{-1/eps} / (1 + e^{-1/eps}).
a2 = torch.tensor([0.5, 0.5], dtype=f64)  # (2,)
M2 = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=f64)  # (2, 2)
eps = 0.5
T2, _ = sinkhorn_reference(a2, a2, M2, eps, stop_thr=1e-14)
diag = 0.5 / (1 + math.exp(-1 / eps))
print(f"Exercise 1: diagonal {float(T2[0, 0]):.12f}, formula {diag:.12f}")
assert abs(float(T2[0, 0]) - diag) < 1e-12 and abs(float(T2[0, 1]) - (0.5 - diag)) < 1e-12

# Exercise 2: a padding point of weight 0.
# Prediction: log u = -inf on the padding row, so its row of the plan is exactly 0; the other rows
# solve the same problem as before (the padding point carries no mass), so they are unchanged.
g = torch.Generator().manual_seed(0)
a = torch.tensor([0.2, 0.5, 0.3], dtype=f64)  # (3,)
b = torch.tensor([0.6, 0.4], dtype=f64)  # (2,)
M = torch.rand(3, 2, generator=g, dtype=f64)  # (3, 2)
T, _ = sinkhorn_reference(a, b, M, 0.1, stop_thr=1e-13)
a_pad = torch.cat([a, torch.zeros(1, dtype=f64)])  # (4,)
M_pad = torch.cat([M, torch.rand(1, 2, generator=g, dtype=f64)])  # (4, 2) any cost row
T_pad, _ = sinkhorn_reference(a_pad, b, M_pad, 0.1, stop_thr=1e-13)
print(
    f"Exercise 2: padding row {T_pad[3].tolist()}, largest change elsewhere "
    f"{float((T_pad[:3] - T).abs().max()):.1e}"
)
assert bool((T_pad[3] == 0).all()) and float((T_pad[:3] - T).abs().max()) < 1e-12

# Exercise 3: the staged cost at larger regularisers.
# Prediction: a larger eps blurs the plan and brings Sinkhorn's contraction factor away from 1, so
# Sinkhorn converges, in fewer iterations at each doubling; Newton, already at a handful of steps,
# needs a few fewer. The price is a blurrier plan.
pr = planted_stage_rollouts(K=1, stage_len=(6, 10), seed=0)
h = pr.hidden[0][pr.mask[0]]  # (L, d)
h = h / h.norm(dim=-1, keepdim=True)
L, L_b = len(h), 16
tau, tau_bar = (torch.linspace(0, 1, n, dtype=f64) for n in (L, L_b))
z = h[(tau_bar * (L - 1)).round().long()]  # (L_b, d)
M_st = 0.75 * torch.cdist(h, z) ** 2 + 0.5 * (tau[:, None] - tau_bar) ** 2  # (L, L_b)
a_st, b_st = torch.full((L,), 1 / L, dtype=f64), torch.full((L_b,), 1 / L_b, dtype=f64)
res = {}
for reg in (0.05, 0.1, 0.2):
    _, sk = sinkhorn_reference(a_st, b_st, M_st, reg, num_iter_max=5000, log=True, warn=False)
    _, nt = semidual_reference(a_st, b_st, M_st, reg, log=True)
    res[reg] = sk, nt
    print(
        f"Exercise 3: eps {reg}: Sinkhorn {sk['n_iter']} iterations (converged {sk['converged']}),"
        f" Newton {nt['n_iter']} steps"
    )
(sk1, nt1), (sk2, nt2), (sk3, nt3) = res.values()
assert not sk1['converged'] and sk2['converged'] and sk3['converged']
assert sk3['n_iter'] < sk2['n_iter'] < 5000 and nt3['n_iter'] <= nt2['n_iter'] <= nt1['n_iter']
