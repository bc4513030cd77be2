"""Worked solutions to the exercises of chapter 02, RLVR: rollouts, log-probabilities and verifiable
rewards.

Run from anywhere: `python nbs/solutions/02_rlvr.py` (every answer is checked by an assert).
"""

import math

import torch

from hara_ref.rlvr.basics import exact_match_reward, pass_at_k, sequence_logprob, token_logprobs

# Exercise 1: pass@k from exactly k samples.
# With n = k there is a single k-subset, all the samples. If n+ = 0, C(n - n+, k) / C(n, k) = C(k,
# k) / C(k, k) = 1 and pass@k = 0; if n+ >= 1, n - n+ < k, so C(n - n+, k) = 0 and pass@k = 1. The
# estimate only says whether some sample was correct: a problem solved once in 16 and one solved 16
# times out of 16 both get pass@16 = 1, and it cannot tell a likely success from a lucky one.
k = 16
assert pass_at_k(k, 0, k) == 0.0
assert all(pass_at_k(k, c, k) == 1.0 for c in range(1, k + 1))
print('pass@16 from 16 samples, n+ = 0..16:', [pass_at_k(k, c, k) for c in range(k + 1)])

# Exercise 2: the uniform policy.
# Equal logits give every token probability 1/V, so each response token adds log(1/V) and a response
# of |o| tokens gets -|o| log V = -5 log 23.
V, n_tok = 23, 5
logits = torch.zeros(1, n_tok + 2, V, dtype=torch.float64)  # (1, T, V): two extra (prompt) slots
targets = torch.randint(0, V, (1, n_tok + 2))  # (1, T)
mask = torch.tensor([[0, 0] + [1] * n_tok]).bool()  # (1, T) the response
lp = sequence_logprob(token_logprobs(logits, targets), mask)  # (1,)
print(f'log pi(o|q) = {lp.item():.6f}, -5 log 23 = {-n_tok * math.log(V):.6f}')
assert abs(lp.item() + n_tok * math.log(V)) < 1e-12

# Exercise 3: which box counts.
# The last top-level box is the answer: '\boxed{14}\boxed{15}' answers 15 (reward 0); '\fbox{14}' is
# a box (reward 1); '\boxed{{14}}' holds '{14}', which is not the string '14' (reward 0: the exact
# match of the built-in task does not strip braces).
got = [exact_match_reward(s, 14) for s in ('\\boxed{14}\\boxed{15}', '\\fbox{14}', '\\boxed{{14}}')]
print('rewards:', got)
assert got == [0.0, 1.0, 0.0]
