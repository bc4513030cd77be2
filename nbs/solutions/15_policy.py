"""Worked solutions to the exercises of chapter 15 (the policy: countdown, a tiny Qwen3, sampling
and chunked scoring)."""

import math

import torch

from hara_ref.rlvr.countdown import Countdown, countdown_reward, left_to_right, solutions
from hara_ref.train.policy import (
    char_tokenizer,
    encode_prompts,
    policy_forward,
    tiny_qwen3,
    token_stats,
)

torch.set_num_threads(1)

# Exercise 1: 6,2,4:8 has six strategies. Left to right, (6 op 2) op 4, reaches 8 twice, as (6-2)+4
# and (6*2)-4; the other four start elsewhere or take one step. 3*2=6 uses a number that is not
# given, so it earns 0 even though its arithmetic and its answer are right.
p = Countdown((6, 2, 4), 8)
l2r = [st for st in left_to_right(p.numbers) if st[-1][3] == p.target]
assert len(solutions(p)) == 6 and [st[0][1] for st in l2r] == ['-', '*']
assert countdown_reward('2*4=8;\\boxed{8}', p.answer) == 1.0  # one step, not left to right
assert countdown_reward('4*6=24;24-2=22;\\boxed{8}', p.answer) == 0.0  # boxed 8, steps reach 22
assert countdown_reward('3*2=6;6+2=8;\\boxed{8}', p.answer) == 0.0  # 3 is not given

# Exercise 2: at initialisation the logits are small (weights of std 0.02 against unit-RMS hidden
# states), so pi is close to uniform: entropy close to log V, each token's log-prob close to -log V.
tok = char_tokenizer()
model = tiny_qwen3(tok)
pi, pm = encode_prompts(tok, [p.prompt])
o = tok(['6-2=4;4+4=8;\\boxed{8}' + tok.eos_token], add_special_tokens=False, return_tensors='pt')
ri, rm = o['input_ids'], o['attention_mask'].bool()
with torch.no_grad():
    logp, ent, _ = policy_forward(model, pi, pm, ri, rm)
log_v = math.log(len(tok))
assert abs(float(ent.mean()) - log_v) < 0.05, (float(ent.mean()), log_v)
assert abs(float(logp.mean()) + log_v) < 0.5, (float(logp.mean()), log_v)
print(f"log V = {log_v:.3f}; mean entropy {ent.mean():.3f}; mean log-prob {logp.mean():.3f}")

# Exercise 3: a (c, V) float32 chunk holds 4 c V bytes; under 64 MiB at Qwen3's V = 151,936 means
# c <= 64 * 2**20 / (4 V), i.e. c = 110 tokens. Chunking changes memory, not numbers: any chunk size
# gives the same log-probs and entropies.
V = 151_936
c = 64 * 2**20 // (4 * V)
assert c == 110 and 4 * c * V <= 64 * 2**20 < 4 * (c + 1) * V
g = torch.Generator().manual_seed(0)
W = torch.randn(50, 8, generator=g)  # a head with V = 50, d = 8
h, y = torch.randn(23, 8, generator=g), torch.randint(0, 50, (23,), generator=g)
head = lambda x: x @ W.T  # noqa: E731
lp1, e1 = token_stats(h, head, y, chunk_tokens=1)
lpn, en = token_stats(h, head, y, chunk_tokens=23)
assert torch.allclose(lp1, lpn, atol=1e-5) and torch.allclose(e1, en, atol=1e-5)
