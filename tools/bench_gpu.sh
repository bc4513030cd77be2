#!/usr/bin/env bash
# The GPU tables in one command: `hara-ref bench scale` on CUDA in float32 and bfloat16 model
# pieces. Both passes time HARA (in float32) on all 16 prompts, so each Qwen3-0.6B row holds
# `bench hara`'s batch (16 x 16 rollouts, L = 1024, d = 1024) timed on the GPU. HARA's hidden states
# are low rank + 5 % noise (rank 16, the family closest to an LLM's; `--family planted` for the
# planted stages of earlier tables), with the oracle's default outer step unless --outer is given.
#   bash tools/bench_gpu.sh                     # on a CUDA machine; tables in bench_gpu/
#   bash tools/bench_gpu.sh --family planted --outer lbfgs --out DIR
#   bash tools/bench_gpu.sh --device cpu --tiny # dry run anywhere (tests/test_bench_scale.py)
set -euo pipefail
DEVICE=cuda
TINY=()
OUT=bench_gpu
FAMILY=(--family lowrank --rank 16)
OUTER=()
while [ $# -gt 0 ]; do
  case $1 in
    --device) DEVICE=$2; shift 2 ;;
    --tiny) TINY=(--tiny); shift ;;
    --out) OUT=$2; shift 2 ;;
    --family) FAMILY=(--family "$2"); shift 2 ;;
    --outer) OUTER=(--outer "$2"); shift 2 ;;
    *) echo "bench_gpu.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-python}
mkdir -p "$OUT"
# both passes in one Python process (each pass warms up before it times, and measures peak memory
# in fresh subprocesses of its own): the imports (torch, POT, transformers) are paid once, not twice
"$PY" - "$DEVICE" "$OUT" "${TINY[@]}" "${FAMILY[@]}" "${OUTER[@]}" <<'EOF'
import sys

import torch

from hara_ref.practice.cli import main

device, out, *more = sys.argv[1:]  # more: --tiny, --family, --rank, --outer
cuda = torch.cuda.is_available()
print('torch', torch.__version__, 'cuda', cuda, torch.cuda.get_device_name(0) if cuda else '')


class Tee:  # a pass's table on the screen and in OUT/scale_DTYPE.txt
    def __init__(self, *files):
        self.files = files

    def write(self, s):
        for f in self.files:
            f.write(s)
        return len(s)

    def flush(self):
        for f in self.files:
            f.flush()


for dtype in ('float32', 'bfloat16'):
    argv = ['bench', 'scale', '--device', device, '--dtype', dtype, '--hara-prompts', '16']
    argv += ['--layers', '4', '--tokens', '2048', '--decode-batch', '256', '--decode-steps', '8']
    argv += ['--head-tokens', '4096', '--repeat', '3', *more, '--out', f'{out}/scale_{dtype}.json']
    stdout = sys.stdout
    with open(f'{out}/scale_{dtype}.txt', 'w') as f:
        sys.stdout = Tee(stdout, f)
        try:
            rc = main(argv)
        finally:
            sys.stdout.flush()
            sys.stdout = stdout
    if rc:
        sys.exit(rc)
EOF
