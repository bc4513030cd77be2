"""The MKL code paths this CPU can run, for make test's rerun of the numerical checks.

torch's CPU build does its matrix products and linear solves in MKL, which picks a code path from
CPU (Intel: AVX-512 or AVX2 kernels; other CPUs: their own path). `MKL_CBWR=<branch>` asks for
another; MKL honours it only where the CPU runs that branch, and otherwise stays on its own path.
MKL_VERBOSE shows which branch a call took ("CNR:..."). Prints the environments of make test's
reruns, one per line: ATen's portable kernels with MKL's portable branch (always), then each other
branch of `BRANCHES` that MKL really takes here. On stderr, what every branch resolved to.
"""

import os
import re
import subprocess
import sys

BRANCHES = ('COMPATIBLE', 'AVX2')  # portable kernels (as AMD CPUs run them), Intel's AVX2 kernels
PROBE = 'import torch; a = torch.eye(16, dtype=torch.float64); torch.linalg.solve(a, a)'


def taken(branch: str) -> str:
    "The branch MKL reports for a linear solve under MKL_CBWR=branch ('' for none: MKL chose)."
    env = {**os.environ, 'MKL_VERBOSE': '1', 'MKL_CBWR': branch}
    out = subprocess.run([sys.executable, '-c', PROBE], env=env, capture_output=True, text=True)
    m = re.search(r'CNR:(\w+)', out.stdout + out.stderr)
    return m.group(1) if m else ''


if __name__ == '__main__':
    seen = {b: taken(b) for b in ('', *BRANCHES)}
    for b, t in seen.items():
        print(f"MKL_CBWR={b or '(unset)'}: MKL takes CNR:{t or '?'}", file=sys.stderr)
    print('MKL_CBWR=COMPATIBLE ATEN_CPU_CAPABILITY=default')
    print('\n'.join(f'MKL_CBWR={b}' for b in BRANCHES[1:] if seen[b] == b))
