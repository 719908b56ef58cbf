#!/usr/bin/env bash
# The H200 benchmark, one device call: serve the full-size DiffusionGemma shape with random weights and sweep
# it over HTTP, one results JSON per (quantization, workload) into OUT. In bf16 the workloads of
# BF16_WORKLOADS run in order on one server (default: mixed mixed-samples1 standard cold span steps4 think; mixed first, on
# the fresh server, with no warm-up level; NAIVE=1 also serves the naive baseline and sweeps it on standard);
# with FP8 experts, standard and cold. QUANTIZATIONS="fp8-experts" runs only the FP8 half. The workloads are
# described in src/canvasread/tools/bench.py and mixed.py.
# Usage on the GPU machine, from the repo root, with the wheels (.whl) and the model folder carried:
#   bash bench/gpu_bench.sh .cache/gpu/dgemma "$OUT"
set -euo pipefail
folder=$1
out=$2
source bench/gpu_setup.sh
port=8011
url=http://127.0.0.1:$port
name=$(basename "$folder")
gpu="1x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/canvasread-inductor}  # the second start reuses it

serve() {  # serve QUANTIZATION FLAGS...: start a server, wait until it is ready (compile and capture included)
    local quantization=$1; shift
    server_command="canvasread serve --model $folder --random-weights 0.02 --experts grouped_mm --max-batch 256 $*"
    python3 -m canvasread serve --model "$folder" --random-weights 0.02 --experts grouped_mm --max-batch 256 "$@" \
        --port $port --log-level warning >> "$out/server.log" 2>&1 &
    server=$!
    for _ in $(seq 1 400); do  # stop waiting as soon as the server has died (a bad flag, a missing wheel)
        curl -sf "$url/ready" > /dev/null && break
        kill -0 $server 2> /dev/null || { tail -20 "$out/server.log"; exit 1; }
        sleep 1
    done
    curl -sf "$url/ready" > /dev/null
    echo "$quantization server ready after ${SECONDS}s"
}
sweep() {  # sweep QUANTIZATION WORKLOAD EXTRA...
    python3 bench/http_sweep.py "$url" "$name" "$out/bench-$1-$2.json" --quantization "$1" --workload "$2" \
        --server-command "$server_command" --gpu "$gpu" --levels "${LEVELS:-1,2,4,8,16,32,64,128}" \
        --duration "${DURATION:-5}" "${@:3}"
}
trap 'kill $server 2>/dev/null || true' EXIT
if [[ " ${QUANTIZATIONS:-bf16 fp8-experts} " == *" bf16 "* ]]; then
    serve bf16 ${NAIVE:+--naive-baseline}
    # mixed first, on the fresh server: what its first users see, first minute included (no warm-up level).
    # think last: a thought is a whole diffusion generation per request (seconds), so a call that runs out of
    # time still has every other row.
    for workload in ${BF16_WORKLOADS:-mixed mixed-samples1 standard cold span steps4 think}; do
        case $workload in
            mixed) sweep bf16 mixed --fresh --levels "${MIXED_LEVELS:-1,2,4,8,16,32,64,128}" ;;
            standard) sweep bf16 standard ${NAIVE:+--baseline "$name-naive" --baseline-levels 1,4} ;;
            span) sweep bf16 span --levels "${SPAN_LEVELS:-1,4,16}" ;;
            steps4) sweep bf16 steps4 --levels "${STEPS_LEVELS:-1,4,16}" ;;
            think) sweep bf16 think --levels "${THINK_LEVELS:-1,4}" ;;
            *) sweep bf16 "$workload" ;;
        esac
    done
    kill $server; wait $server || true
fi
if [[ " ${QUANTIZATIONS:-bf16 fp8-experts} " == *" fp8-experts "* ]]; then
    serve fp8-experts --fp8-experts
    sweep fp8-experts standard
    sweep fp8-experts cold
fi
