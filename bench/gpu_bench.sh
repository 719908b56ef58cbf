#!/usr/bin/env bash
# The H200 benchmark, one device call: serve the full-size DiffusionGemma shape with random weights
# (fused engine + naive baseline on the same model instance), sweep it over HTTP, write bench.json/png.
# Usage on the GPU machine, from the repo root, with the wheels and model folder carried:
#   bash bench/gpu_bench.sh .cache/gpu/dgemma "$OUT"
# GPUS=N serves N replicas (one per GPU) and skips the naive baseline.
set -euo pipefail
folder=$1
out=$2
source bench/gpu_setup.sh
port=8011
gpus=${GPUS:-1}
name=$(basename "$folder")
if [ "$gpus" -gt 1 ]; then
    engine=(--gpus "$gpus")
    baseline=()
else
    engine=(--naive-baseline)
    baseline=(--baseline-model "$name-naive" --baseline-concurrency "${BASELINE_LEVELS:-1,4,16}")
fi
python3 -m canvasread serve --model "$folder" --random-weights 0.02 --experts grouped_mm "${engine[@]}" \
    --max-batch "${MAX_BATCH:-256}" --port $port --log-level warning > "$out/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$port/ready" > /dev/null && break; sleep 1; done
curl -sf "http://127.0.0.1:$port/ready"
python3 -m canvasread bench --url "http://127.0.0.1:$port" --model "$name" \
    --concurrency "${LEVELS:-1,2,4,8,16,32,64,128,256}" --duration "${DURATION:-8}" "${baseline[@]}" \
    --gpu "${gpus}x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), torch $(python3 -c 'import torch; print(torch.__version__)')" \
    --out "$out"
