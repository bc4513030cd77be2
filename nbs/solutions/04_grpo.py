"""Worked solutions to the exercises of chapter 04, Group-based policy optimization.

Run from anywhere: `python nbs/solutions/04_grpo.py` (every answer is checked by an assert).
"""

import math

import torch

from hara_ref.rlvr.grpo import clipped_token_loss, group_advantages, token_advantages

# Exercise 1: GRPO's advantage of a correct answer.
# With p = n+/G the mean is p and sum_j (r_j - p)^2 = n+ (1 - p)^2 + (G - n+) p^2 = G p (1 - p), so
# sd = sqrt(G p (1 - p) / (G - 1)) and A+ = (1 - p) / sd = sqrt((G - 1)/G * (1 - p)/p)    = sqrt((G
# - 1)/G * (G - n+)/n+): large for a rare success (n+ small), small for a common one.
G = 16
for n_plus in range(1, G):
    r = (torch.arange(G) < n_plus).double()  # (G,) n+ correct
    A = group_advantages(r, [0] * G, 'grpo', eps=0.0)[0].item()
    assert abs(A - math.sqrt((G - 1) / G * (G - n_plus) / n_plus)) < 1e-12
print('A+ at n+ = 1, 8, 15:', [round(math.sqrt((G - 1) / G * (G - k) / k), 3) for k in (1, 8, 15)])

# Exercise 2: a group whose rewards are all equal.
# Every r_i equals the group mean, so every advantage is 0 (GRPO gives a group with no spread 0),
# every token advantage is 0, and the loss (with beta = 0) is 0 at every theta: its gradient is
# exactly 0.
torch.manual_seed(0)
V, B, T = 7, 6, 4
policy = torch.nn.Embedding(V, V).double()  # a bigram policy
seqs = torch.randint(0, V, (B, T + 1))  # (B, T+1)
mask = torch.ones(B, T, dtype=torch.bool)  # (B, T)
rewards = torch.tensor(
    [1.0, 1.0, 1.0, 0.0, 0.0, 0.0], dtype=torch.float64
)  # two groups, each uniform
A_tok = token_advantages(group_advantages(rewards, [0, 0, 0, 1, 1, 1]), mask)  # (B, T)
lp = torch.log_softmax(policy(seqs[:, :-1]), -1).gather(-1, seqs[:, 1:, None]).squeeze(-1)  # (B, T)
clipped_token_loss(lp, lp.detach() - 0.1, A_tok, mask).backward()  # rho != 1, still no gradient
print('largest |gradient| with equal rewards:', policy.weight.grad.abs().max().item())
assert torch.all(policy.weight.grad == 0)

# Exercise 3: where A = -1 loses its gradient under DAPO's range.
# For A < 0 the token loss is -min(-rho, -clip(rho)) = max(rho, clip(rho)): the clipped term is the
# larger one exactly when rho < 1 - c_low = 0.8, where the loss is the constant 0.8. So the gradient
# is 0 for rho < 0.8 and -A rho / L = rho / L elsewhere (no ceiling for A < 0).
rho = torch.linspace(0.505, 1.495, 100, dtype=torch.float64)  # (N,) off the kinks 0.8, 1.28
lp_r = rho.log()[None].clone().requires_grad_()  # (1, N), old log-probs 0
A_r = -torch.ones(1, len(rho), dtype=torch.float64)  # (1, N)
clipped_token_loss(lp_r, torch.zeros_like(lp_r), A_r, torch.ones(1, len(rho)), 0.2, 0.28).backward()
zero = rho[lp_r.grad[0] == 0]
print(f'zero gradient for the ratios {zero.min():.3f} to {zero.max():.3f} of the grid')
assert torch.equal(lp_r.grad[0] == 0, rho < 0.8)
