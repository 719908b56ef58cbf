#!/usr/bin/env bash
# Where the time goes on the H200, one device call: a standard sweep at 1, 32 and 128 clients with the engine's
# own work per level (passes a second, tokens a pass, its busy share: bench/http_sweep.py), py-spy of the server
# and of its engine process (threads holding the interpreter lock only) during the 128-client level, then issue
# 24's GPU checks (bench/gpu_engine_checks.py) and the reader alone (bench/gpu_runner.py ... compiled).
# Usage on the GPU machine, from the repo root, with .whl, .cache/gpu and .cache/spy (a py-spy wheel) carried:
#   PACK="$OUT/diagnose.tgz" bash bench/gpu_diagnose.sh .cache/gpu/dgemma /tmp/diagnose
set -uo pipefail
folder=$1
out=$2
mkdir -p "$out"
source bench/gpu_setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/spy .cache/spy/*.whl && spy=/tmp/spy/bin/py-spy
pack() { [ -n "${PACK:-}" ] && tar czf "$PACK" -C "$out" . ; }
trap pack EXIT
export TORCHINDUCTOR_CACHE_DIR=/tmp/canvasread-inductor
url=http://127.0.0.1:8011
python3 -m canvasread serve --model "$folder" --random-weights 0.02 --experts grouped_mm --max-batch 256 \
    --max-queue-delay 0.35 --port 8011 --log-level warning > "$out/server.log" 2>&1 &
server=$!
until curl -sf "$url/ready" > /dev/null; do kill -0 $server || exit 1; sleep 1; done
echo "ready after ${SECONDS}s"
engine=$(pgrep -P $server -f spawn_main | head -1)
sweep() {
    python3 bench/http_sweep.py "$url" dgemma "$out/standard-$1.json" --workload standard --levels "$1" \
        --duration 4 --server-command "serve ... --max-queue-delay 0.35" --gpu H200
}
sweep 1,32
sweep 128 &
load=$!
sleep 6  # the 128-client level's warm-up is 4 s: sample its measured seconds
$spy record -p $server -o "$out/spy-server.txt" -f raw -d 5 -r 200 --gil --nonblocking > "$out/spy.log" 2>&1 &
[ -n "$engine" ] && $spy record -p "$engine" -o "$out/spy-engine.txt" -f raw -d 5 -r 200 --gil --nonblocking \
    >> "$out/spy.log" 2>&1
wait $load
kill $server; wait $server
echo "sweeps done after ${SECONDS}s"
pack
python3 bench/gpu_engine_checks.py "$folder" "$out/checks.json" 2>&1 | grep -v Warning | tail -5
echo "checks done after ${SECONDS}s"
pack
timeout $((560 - SECONDS)) python3 bench/gpu_runner.py "$folder" "$out/runner.json" compiled 2>&1 | tail -8
echo "finished after ${SECONDS}s"
