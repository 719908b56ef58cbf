#!/usr/bin/env bash
# The H200 benchmark, one device call: serve the full-size DiffusionGemma shape with random weights and sweep
# it over HTTP, one results JSON per (quantization, workload) into OUT. In bf16 the workloads of BF16_WORKLOADS
# run in order on one server (default: mixed mixed-samples1 standard cold span steps4 think-beside think; mixed
# first, on the fresh server, with no warm-up level; think last, a thought being the slowest request; NAIVE=1 also
# serves the naive baseline and sweeps it on standard). QUANTIZATIONS="fp8-experts" serves FP8 experts instead and
# sweeps FP8_WORKLOADS (default: standard cold); "bf16 fp8-experts" does both, one server after the other. SERVE_FLAGS are added to
# every server's flags (e.g. "--max-queue-delay 2", to measure goodput past the knee with shedding on). The
# workloads are described in src/canvasread/tools/workloads.py and mixed.py; `think-beside` in src/canvasread/tools/beside.py.
#
# Usage on the GPU machine, from the repo root, with .whl and .cache/gpu carried (bench/gpu_carry.sh builds them):
#   PACK="$OUT/bench.tgz" bash bench/gpu_bench.sh .cache/gpu/dgemma /tmp/bench
# PACK (outside OUT): after every row and at exit all of OUT (the JSONs, bench.log, server.log) is packed into this
# one file, since a device call returns at most 8 files and a call cut short still returns what it measured.
#
# Time budget. One device call runs at most 10 minutes, the machine's start and the wheels' install aside, and a
# server takes about a minute from launch to /ready (load, compile, capture). BUDGET_S (default 540) is this
# script's own deadline, counted from its start: a row begins only with 30 s left and is interrupted at the
# deadline (`timeout -s INT`; the row still writes the levels it finished); FP8's server starts only with 150 s
# left. The default list is sized to end in about 8 minutes: DURATION=4 s a level (after a warm-up of 0.8 s, two
# requests a client at most), and
#   setup (install the wheels, import torch) ~20 s, bf16 server to /ready ~60 s,
#   mixed 1,4,16,64 (no warm-up) ~25 s, mixed-samples1 1,4,16,64 ~25 s,
#   standard 1,4,16,32,64,128,256 ~60 s (each knee up to 64 clients has its 4x level: goodput past the knee),
#   cold 1,4,16,64 ~25 s, span 1,4,16 ~17 s, steps4 1,4,16 ~17 s,
#   think-beside 8 standard clients, alone then beside 8 thinkers ~15 s,
#   think 1,4 ~20 s,
# about 5 minutes when a thought costs what a few reads do. On the 2026-12-02 engine (a thought is transformers'
# `generate`, 6.6 s, written one after another) think-beside takes up to ~60 s (the 8 thoughts in flight when it
# ends are waited for) and think ~75 s: about 7.5 minutes. Adding FP8 (~50 s start, ~85 s of rows) would pass 8
# minutes, so it is a call of its own.
set -euo pipefail
folder=$1
out=$2
budget=${BUDGET_S:-540}
duration=${DURATION:-4}
mixed_levels=${MIXED_LEVELS:-1,4,16,64}
standard_levels=${LEVELS:-1,4,16,32,64,128,256}
cold_levels=${COLD_LEVELS:-1,4,16,64}
mkdir -p "$out"
exec > >(tee -a "$out/bench.log") 2>&1
pack() {  # everything in OUT into PACK, when it is set (a log being written as it is read still packs)
    [ -n "${PACK:-}" ] || return 0
    mkdir -p "$(dirname "$PACK")"
    tar czf "$PACK.part" -C "$out" . 2> /dev/null || true
    mv -f "$PACK.part" "$PACK"
}
server=
finish() {
    [ -z "$server" ] || kill "$server" 2> /dev/null || true
    echo "finished after ${SECONDS}s of a ${budget}s budget"
    pack
}
trap finish EXIT
if [ "${SETUP:-1}" = 1 ]; then  # SETUP=0: canvasread and its extras are installed already (not the device machine)
    source bench/gpu_setup.sh
fi
port=8011
url=http://127.0.0.1:$port
name=$(basename "$folder")
gpu="1x $(nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -1 || echo unknown)"
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/canvasread-inductor}  # the second start reuses it

serve() {  # serve QUANTIZATION FLAGS...: start a server, wait until it is ready (compile and capture included)
    local quantization=$1; shift
    local flags=(--random-weights 0.02 --experts grouped_mm --max-batch 256 "$@")
    # shellcheck disable=SC2206  # SERVE_FLAGS is a list of flags, split on spaces
    flags+=(${SERVE_FLAGS:-})
    server_command="canvasread serve --model $folder ${flags[*]}"
    python3 -m canvasread serve --model "$folder" "${flags[@]}" --port $port --log-level warning \
        >> "$out/server.log" 2>&1 &
    server=$!
    until curl -sf "$url/ready" > /dev/null; do  # stop waiting once the server has died (a bad flag, a missing wheel)
        kill -0 "$server" 2> /dev/null || { tail -20 "$out/server.log"; exit 1; }
        ((SECONDS < budget)) || { echo "$quantization server not ready within the budget"; exit 1; }
        sleep 1
    done
    echo "$quantization server ready after ${SECONDS}s"
}
sweep() {  # sweep QUANTIZATION WORKLOAD EXTRA...: one row, interrupted at the deadline (its finished levels kept)
    local left=$((budget - SECONDS))
    if ((left < 30)); then
        echo "skipped $1 $2: ${left}s left of the ${budget}s budget"
        return 0
    fi
    timeout -s INT -k 20 "$left" python3 bench/http_sweep.py "$url" "$name" "$out/bench-$1-$2.json" \
        --quantization "$1" --workload "$2" --server-command "$server_command" --gpu "$gpu" --duration "$duration" \
        "${@:3}" || echo "$1 $2 ended with status $? (124: interrupted at the deadline)"
    echo "$1 $2 done after ${SECONDS}s"
    pack
}
stop() {
    kill "$server" 2> /dev/null || true
    wait "$server" || true
    server=
}
row() {  # row QUANTIZATION WORKLOAD: one workload's sweep, at its levels
    case $2 in
        mixed) sweep "$1" mixed --fresh --levels "$mixed_levels" ;;
        mixed-samples1) sweep "$1" mixed-samples1 --levels "$mixed_levels" ;;
        standard)
            if [ "$1" = bf16 ] && [ -n "${NAIVE:-}" ]; then
                sweep "$1" standard --levels "$standard_levels" --baseline "$name-naive" --baseline-levels 1,4
            else
                sweep "$1" standard --levels "$standard_levels"
            fi
            ;;
        cold) sweep "$1" cold --levels "$cold_levels" ;;
        span) sweep "$1" span --levels "${SPAN_LEVELS:-1,4,16}" ;;
        steps4) sweep "$1" steps4 --levels "${STEPS_LEVELS:-1,4,16}" ;;
        think-beside) sweep "$1" think-beside --levels "${BESIDE_LEVELS:-8}" --thinkers "${THINKERS:-8}" ;;
        think) sweep "$1" think --levels "${THINK_LEVELS:-1,4}" ;;
        *) sweep "$1" "$2" --levels "$standard_levels" ;;
    esac
}
if [[ " ${QUANTIZATIONS:-bf16} " == *" bf16 "* ]]; then
    serve bf16 ${NAIVE:+--naive-baseline}
    for workload in ${BF16_WORKLOADS:-mixed mixed-samples1 standard cold span steps4 think-beside think}; do
        row bf16 "$workload"
    done
    stop
fi
if [[ " ${QUANTIZATIONS:-bf16} " == *" fp8-experts "* ]]; then
    if ((budget - SECONDS < 150)); then
        echo "skipped fp8-experts: $((budget - SECONDS))s left of the ${budget}s budget"
        exit 0
    fi
    serve fp8-experts --fp8-experts
    for workload in ${FP8_WORKLOADS:-standard cold}; do
        row fp8-experts "$workload"
    done
    stop
fi
