"""Worked solutions to the exercises of chapter 17 (the RL step: GRPO, with and without HARA)."""

import torch

from hara_ref.rlvr.countdown import Countdown, countdown_strategy
from hara_ref.rlvr.grpo import clipped_token_loss, group_advantages
from hara_ref.train.rl import route_scratchpads

torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)

# Exercise 1: at ratio 1 the loss is -1/B sum_i A_i w̄_i. GRPO (w = 1): the A_i of each group sum
# to 0, so the policy term is 0. HARA: sum_i A_i w̄_i = sum_i A_i + sum_i A_i (w̄_i - 1), and each
# A_i (w̄_i - 1) >= 0 (w̄ >= 1 where A > 0, w̄ <= 1 where A < 0), so the policy term is <= 0.
B, L = 16, 12
groups = torch.arange(2).repeat_interleave(8)  # (B,) two prompts, G = 8
r = torch.tensor([1, 0, 0, 1, 0, 0, 0, 1, 1, 1, 0, 1, 0, 0, 1, 0]).double()
A_i = group_advantages(r, groups)  # (B,)
mask = torch.arange(L)[None] < torch.randint(3, L + 1, (B, 1), generator=g)  # (B, L)
logp = -torch.rand(B, L, generator=g, dtype=torch.float64)  # log pi_old = log pi_theta
u = torch.rand(B, L, generator=g, dtype=torch.float64)
w = torch.where(r[:, None] == 1, 1 + u, 1 - u / 2)  # correct in [1, 2], wrong in [0.5, 1]
grpo = clipped_token_loss(logp, logp, A_i[:, None] * mask, mask)
hara = clipped_token_loss(logp, logp, A_i[:, None] * w * mask, mask)
assert abs(float(grpo)) < 1e-12 and float(hara) < -1e-3, (float(grpo), float(hara))


# Exercise 2: AdamW divides the running mean of the gradient by the root of the running mean of its
# square, so a constant factor on the loss cancels (up to its eps = 1e-8): the same steps, not
# larger ones. Only the advantages' ratios (which rollout weighs more) change an AdamW step.
def two_steps(scale: float) -> torch.Tensor:
    torch.manual_seed(0)
    net = torch.nn.Linear(8, 4).double()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.0)
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    adv = torch.randn(32, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    for _ in range(2):
        loss = -(scale * adv * torch.log_softmax(net(x), -1)).mean()  # advantages x log-probs
        opt.zero_grad()
        loss.backward()
        opt.step()
    return torch.cat([p.detach().flatten() for p in net.parameters()])


start = two_steps(0.0)  # a zero gradient: AdamW leaves the parameters where they started
step1, step10 = two_steps(1.0) - start, two_steps(10.0) - start
assert step1.abs().max() > 1e-3  # the steps do move the parameters ...
assert torch.allclose(step1, step10, rtol=1e-5, atol=1e-9)  # ... by the same amount

# Exercise 3: each route has two steps with commutative operations: x*y or y*x in step 1, and the
# same in step 2, so 2 x 2 = 4 scratchpads each.
p = Countdown((1, 3, 2), 6)
for strategy in ('((1*3)*2)', '((1+3)+2)'):
    texts = route_scratchpads(p, strategy)
    assert len(texts) == 4 and all(countdown_strategy(t, p.answer) == strategy for t in texts)
    print(strategy, texts)
