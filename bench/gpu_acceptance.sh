#!/usr/bin/env bash
# Issue 15's GPU acceptance, prepared for a machine with CUDA (docs/executors.md, "On a GPU").
#
#   bash bench/gpu_acceptance.sh [DATA_ROOT]    (default ../shared/data)
#
# 1. The FedGP paper protocol on rot-mnist (10 tasks x 20 rounds, 10 clients, der+fedgp, the
#    stream's mnist-cnn), once per executor: wall time, final accuracy (summary.json) and the
#    GPU's peak memory as nvidia-smi samples it. Goal: <= 60 s wall for the vectorized one.
# 2. bench/executors.py on CUDA at K = 1000 (every client, and a tenth per round), mnist-cnn:
#    samples/s of both executors, their ratio and torch's peak allocated memory.
set -euo pipefail
DATA=${1:-../shared/data}
OUT=${OUT:-runs/gpu-acceptance}
mkdir -p "$OUT"
for executor in vectorized sequential; do
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 \
    > "$OUT/$executor-gpu-mib.txt" &
  sampler=$!
  start=$(date +%s.%N)
  cfl-bench run --stream rot-mnist --strategy der+fedgp --data-root "$DATA" \
    --tasks 10 --rounds-per-task 20 --clients 10 --device cuda --executor "$executor" \
    --out "$OUT/$executor" --overwrite
  end=$(date +%s.%N)
  kill "$sampler"
  peak=$(sort -n "$OUT/$executor-gpu-mib.txt" | tail -1)
  acc=$(python -c "import json,sys; s=json.load(open(sys.argv[1])); print(s.get('Acc_T', s))" \
    "$OUT/$executor/summary.json")
  echo "$executor: wall $(python -c "print(round($end - $start, 1))") s, Acc_T $acc, GPU peak ${peak} MiB"
done
python -m bench.executors --data-root "$DATA" --device cuda --model mnist-cnn \
  --sizes 1000:1,1000:0.1 --learners fedavg,der,der+fedgp --repeats 1
