#!/usr/bin/env bash
# Where a lone client's request spends the time outside the engine's pass: py-spy samples the server process and
# the engine process (every thread, idle ones too) while one closed-loop client sends `standard` requests.
#
# Usage (on the GPU machine, after `source bench/gpu_setup.sh`, with py-spy's wheel in $SPY, default .cache/spy):
#     bash bench/gpu_spy.sh MODEL_FOLDER OUT
# OUT gets server.raw and engine.raw (py-spy's collapsed stacks, one line a stack and its sample count), the
# sweep's JSON (latency) and metrics.txt (the engine's pass time and passes, /metrics after the sweep).
set -euo pipefail
folder=$1
out=$2
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --target /tmp/spy "${SPY:-.cache/spy}"/*.whl
spy=/tmp/spy/bin/py-spy
port=8012
url=http://127.0.0.1:$port
python3 -m canvasread serve --model "$folder" --random-weights 0.02 --experts grouped_mm --max-batch 256 \
    --max-queue-delay 0.35 --engine-process --port $port --log-level warning > "$out/server.log" 2>&1 &
server=$!
trap 'kill $server 2> /dev/null || true' EXIT
until curl -sf "$url/ready" > /dev/null; do
    kill -0 "$server" 2> /dev/null || { tail -20 "$out/server.log"; exit 1; }
    sleep 1
done
engine=$(pgrep -P "$server" -f spawn_main | head -1)
python3 bench/http_sweep.py "$url" "$(basename "$folder")" "$out/standard-1.json" --workload standard \
    --server-command "canvasread serve (bench/gpu_spy.sh)" --levels 1 --duration 14 > "$out/sweep.log" 2>&1 &
sweep=$!
sleep 4
"$spy" record -p "$server" -d 8 -r 400 --threads --idle -f raw -o "$out/server.raw" > "$out/spy.log" 2>&1 &
spies=$!
"$spy" record -p "$engine" -d 8 -r 400 --threads --idle -f raw -o "$out/engine.raw" >> "$out/spy.log" 2>&1 &
wait "$sweep" "$spies" $!
curl -s "$url/metrics" | grep -E "^canvasread_engine_(pass|passes)" > "$out/metrics.txt" || true
tail -3 "$out/sweep.log"
