#!/usr/bin/env bash
# The GPU tables in one command (under 5 minutes on one GPU): `hara-ref bench scale` on CUDA in float32
# and bfloat16 model pieces. Both passes time HARA (in float32) on all 16 prompts, so each Qwen3-0.6B
# row holds `bench hara`'s batch (16 x 16 rollouts, L = 1024, d = 1024) timed on the GPU.
#   bash tools/bench_gpu.sh                     # on a CUDA machine; tables in bench_gpu/
#   bash tools/bench_gpu.sh --device cpu --tiny # dry run anywhere (tests/test_bench_scale.py)
set -euo pipefail
DEVICE=cuda
TINY=()
OUT=bench_gpu
while [ $# -gt 0 ]; do
  case $1 in
    --device) DEVICE=$2; shift 2 ;;
    --tiny) TINY=(--tiny); shift ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "bench_gpu.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-python}
mkdir -p "$OUT"
run() { "$PY" -c 'import sys; from hara_ref.practice.cli import main; sys.exit(main(sys.argv[1:]))' "$@"; }
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")'
run bench scale --device "$DEVICE" --dtype float32 --hara-prompts 16 --layers 4 --tokens 2048 \
  --decode-batch 256 --decode-steps 8 --head-tokens 4096 --repeat 3 "${TINY[@]}" \
  --out "$OUT/scale_float32.json" | tee "$OUT/scale_float32.txt"
run bench scale --device "$DEVICE" --dtype bfloat16 --hara-prompts 16 --layers 4 --tokens 2048 \
  --decode-batch 256 --decode-steps 8 --head-tokens 4096 --repeat 3 "${TINY[@]}" \
  --out "$OUT/scale_bfloat16.json" | tee "$OUT/scale_bfloat16.txt"
