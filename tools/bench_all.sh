#!/usr/bin/env bash
# Every CPU table of the benchmarks chapter in one command, about 45 minutes on an idle 2-core machine:
# the scale table (Qwen3 0.6B-8B shapes) with HARA on planted and on low-rank hidden states, bench hara
# plain and with Anderson (m = 5), bench hara on one prompt of each family with each outer step,
# bench ot on planted rollouts (linearized vs POT's barycenter, batched Sinkhorn, the FGW-batch table).
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
# the same with HARA on one prompt of low-rank states (rank 16 + 5 % noise, the family closest to an
# LLM's) (~8 min)
OMP_NUM_THREADS=2 run bench scale --threads 2 --family lowrank --rank 16 \
  --hara-prompts 1 --out "$OUT/scale_lowrank.json" | tee "$OUT/scale_lowrank.txt"
# bench hara's shape (L = 1024, d = 1024), one prompt of each family, each outer step (~15 min: the
# plain step meets its cap on the low-rank prompt)
for fam in planted lowrank; do
  for outer in plain lbfgs; do
    OMP_NUM_THREADS=1 run bench hara --threads 1 --prompts 1 --family $fam --rank 16 \
      --outer $outer --out "$OUT/hara_${fam}_${outer}.json" | tee "$OUT/hara_${fam}_${outer}.txt"
  done
done
# bench hara at the paper's batch on planted states, the plain step and Anderson (~2 min)
OMP_NUM_THREADS=1 run bench hara --threads 1 --outer plain | tee "$OUT/hara_plain.txt"
OMP_NUM_THREADS=1 run bench hara --threads 1 --outer plain --anderson 5 | tee "$OUT/hara_anderson5.txt"
# bench ot, planted rollouts: barycenter L = 512, 4096; FGW batch L = 128 .. 4096 (~6 min)
OMP_NUM_THREADS=1 run bench ot --data planted --repeat 1 --out "$OUT/ot_planted.json" \
  | tee "$OUT/ot_planted.txt"
