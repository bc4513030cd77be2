#!/usr/bin/env bash
# Every CPU table of the benchmarks chapter in one command, about 15 minutes on an idle 2-core machine:
# the scale table (Qwen3 0.6B-8B shapes), bench hara plain and with Anderson (m = 5), bench ot on
# planted rollouts (linearized vs POT's barycenter, batched Sinkhorn, the FGW-batch table).
# Outputs go to bench_cpu/ (text and JSON). One torch thread for the OT tables (a like-for-like
# comparison with POT), two for the model pieces of the scale table.
#   bash tools/bench_all.sh [OUT_DIR]
set -euo pipefail
OUT=${1:-bench_cpu}
PY=${PYTHON:-python}
mkdir -p "$OUT"
run() { "$PY" -c 'import sys; from hara_ref.practice.cli import main; sys.exit(main(sys.argv[1:]))' "$@"; }
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# scale: 2 layers x 512 tokens, 32 x 4 decoding steps, 256 head rows, HARA on 2 of 16 prompts (~4 min)
OMP_NUM_THREADS=2 run bench scale --threads 2 --out "$OUT/scale.json" | tee "$OUT/scale.txt"
# bench hara at the paper's batch, plain and Anderson (~2 min)
OMP_NUM_THREADS=1 run bench hara --threads 1 | tee "$OUT/hara_plain.txt"
OMP_NUM_THREADS=1 run bench hara --threads 1 --anderson 5 | tee "$OUT/hara_anderson5.txt"
# bench ot, planted rollouts: barycenter L = 512, 4096; FGW batch L = 128 .. 4096 (~6 min)
OMP_NUM_THREADS=1 run bench ot --data planted --repeat 1 --out "$OUT/ot_planted.json" \
  | tee "$OUT/ot_planted.txt"
