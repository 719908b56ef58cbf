#!/usr/bin/env bash
# Run from the repository root: bash bench/results/cpu-2026-12-05e/run.sh OUT. The tiny checkpoint served in process and in an engine process, `standard` at 1 and 4 clients, 8 s a level.
set -euo pipefail
out=$1
mkdir -p "$out"
[ -d /tmp/tiny ] || python -m canvasread tiny-checkpoint /tmp/tiny
for mode in no-engine-process engine-process; do
    python -m canvasread serve --model /tmp/tiny --port 8093 --$mode --log-level warning > "$out/server-$mode.log" 2>&1 &
    pid=$!
    until curl -sf http://127.0.0.1:8093/ready > /dev/null; do kill -0 $pid; sleep 1; done
    python bench/http_sweep.py http://127.0.0.1:8093 tiny "$out/$mode.json" --workload standard --levels 1,4 \
        --duration 8 --gpu "cpu ($(nproc) cores)" --quantization bf16 \
        --server-command "canvasread serve --model /tmp/tiny --$mode" \
        --model-note "the tiny checkpoint (canvasread tiny-checkpoint /tmp/tiny), fp32 on the CPU" \
        --command "bash bench/results/cpu-2026-12-05e/run.sh bench/results/cpu-2026-12-05e" > "$out/sweep-$mode.log" 2>&1
    kill $pid; wait $pid || true
done
