"""Worked solutions to the exercises of chapter 13 (HARA: novelty-weighted credit assignment)."""

import torch

from hara_ref.hara.weights import hara_reference, hara_weights
from hara_ref.rlvr.data import planted_stage_rollouts
from hara_ref.rlvr.grpo import group_advantages

# Exercise 1: A < 0: w = 1 - κ (x - 1) = 0.5 at x = 1.5. A > 0: w = 1 + κ (x - 1) = 2 at x = 2.
x = torch.tensor([[1.5, 2.0, 3.0], [1.5, 2.0, 3.0]])
w = hara_weights(x, torch.tensor([-1.0, 1.0]))
assert torch.equal(w, torch.tensor([[0.5, 0.5, 0.5], [1.5, 2.0, 2.0]]))
assert float(hara_weights(torch.tensor([1.49]), torch.tensor([-1.0]))) > 0.5  # not yet clipped

# The chapter's prompt: rollouts 0-3 correct, 4-7 wrong; 1 and 5 with a novel stage.
kw = dict(K=8, n_stages=4, d=8, stage_len=(3, 5), noise=0.1, seed=0)
pr1, pr5 = (planted_stage_rollouts(**kw, substitute=(i, 2)) for i in (1, 5))
hidden = pr1.hidden.clone()
hidden[5] = pr5.hidden[5]
mask, r = pr1.mask, (torch.arange(8) < 4).double()
A = group_advantages(r, torch.zeros(8, dtype=torch.long))  # (8,)

# Exercise 2: κ = 0 makes every weight 1: the advantages are GRPO's, A_i on every real token.
# (L_b = 8 keeps it quick; with κ = 0 the barycenter does not matter.)
adv, rec = hara_reference(hidden, mask, r, kappa=0.0, L_b=8)
assert torch.equal(adv, A[:, None] * mask) and torch.equal(rec['w'], torch.ones_like(rec['w']))
assert float(rec['x'][1].max()) > 2  # the novelty is still measured; it just has no effect

# Exercise 3: every reward 1: one outcome group, and GRPO's advantages are all 0 (no spread of
# rewards). HARA multiplies 0 by its weights, so it returns 0 too; it skips the group (w = 1),
# since nothing would change.
adv1, rec1 = hara_reference(hidden, mask, torch.ones(8, dtype=torch.float64))
assert torch.equal(adv1, torch.zeros_like(adv1)) and torch.equal(
    rec1['w'], torch.ones_like(rec1['w'])
)
print('advantages with every reward 1:', float(adv1.abs().max()))
