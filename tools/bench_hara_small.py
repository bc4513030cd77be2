"""Time `hara_advantages` on the small batch (8 rollouts x 12 tokens, d = 16, one prompt, two
outcome groups of 4) on one CPU thread: the fastest and the median of N runs.

It needs nothing but `hara_advantages`, so the same batch can be timed on any checkout, one after
the other on the same machine:

    PYTHONPATH=/path/to/checkout python tools/bench_hara_small.py [N]
"""

import sys
import time
import torch

try:
    from hara_ref.engine.hara_engine import hara_advantages
except ImportError:  # a checkout from before the engine's own part
    try:
        from hara_ref.appendix.hara_engine import hara_advantages
    except ImportError:  # a checkout from before the engine chapters
        from hara_ref.hara.weights import hara_advantages


def small_batch(seed=1, dtype=torch.float32):
    "`hara_ref.bench.solvers.small_batch`'s batch (tests/test_sync_free.py checks they agree)."
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(8, 12, 16, generator=g, dtype=dtype)  # (B, L, d)
    rewards = torch.tensor([1.0] * 4 + [0.0] * 4, dtype=dtype)  # (B,)
    return hidden, torch.ones(8, 12, dtype=torch.bool), rewards, torch.zeros(8, dtype=torch.long)


def main(n=20):
    torch.set_num_threads(1)
    batch = small_batch()
    _, rw = hara_advantages(*batch)  # untimed: first-call costs
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        hara_advantages(*batch)
        ts.append(time.perf_counter() - t0)
    print(
        f"hara_advantages, 8 x 12 x 16 (2 groups of 4), 1 thread: min of {n} runs "
        f"{min(ts):.4f} s (median {sorted(ts)[n // 2]:.4f} s); "
        f"barycenter iterations: {rw.novelty.bary_iters}"
    )


if __name__ == '__main__':
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
