#!/usr/bin/env bash
# Cloud Run: canvasread and vLLM in one container with one GPU.
#
# canvasread starts first and binds $PORT within seconds, so Cloud Run's startup probe on /ready gets a 503
# (not a refused connection) for the minutes vLLM spends loading the model, and 200 once vLLM answers.
# vLLM listens on loopback only. If either process exits, the other is stopped and the container exits with
# that status, so Cloud Run replaces the instance; SIGTERM stops both (canvasread drains requests in flight).
#
# Settings (environment): MODEL (hub id or path), TOKENIZER (default: MODEL), SERVED_MODEL_NAME, CANVAS_LENGTH,
# MAX_MODEL_LEN, MAX_NUM_SEQS, GPU_MEMORY_UTILIZATION, VLLM_PORT, extra flags in CANVASREAD_ARGS / VLLM_ARGS,
# and HF_TOKEN for gated models. PORT is set by Cloud Run.
set -euo pipefail

MODEL="${MODEL:-google/diffusiongemma-26B-A4B-it}"
TOKENIZER="${TOKENIZER:-$MODEL}"
SERVED_MODEL_NAME="${SERVED_MODEL_NAME:-dgemma}"
CANVAS_LENGTH="${CANVAS_LENGTH:-64}"
PORT="${PORT:-8080}"
VLLM_PORT="${VLLM_PORT:-8000}"
CANVASREAD_BIN="${CANVASREAD_BIN:-canvasread}"
VLLM_BIN="${VLLM_BIN:-vllm}"
read -r -a canvasread_args <<< "${CANVASREAD_ARGS:-}"
read -r -a vllm_args <<< "${VLLM_ARGS:-}"

# A stop signal can come at any moment, even before vLLM starts: forward it to whatever runs, and start nothing more.
stopping=""
trap 'stopping=1; kill -TERM ${canvasread:-} ${vllm:-} 2>/dev/null || true' TERM INT

"$CANVASREAD_BIN" serve --host 0.0.0.0 --port "$PORT" \
    --upstream "http://127.0.0.1:${VLLM_PORT}" --upstream-model "$SERVED_MODEL_NAME" \
    --upstream-canvas-length "$CANVAS_LENGTH" --tokenizer "$TOKENIZER" "${canvasread_args[@]}" &
canvasread=$!

# vLLM only starts once canvasread listens: its model load must never delay binding the port.
until (exec 3<>"/dev/tcp/127.0.0.1/${PORT}") 2>/dev/null; do
    if [ -n "$stopping" ] || ! kill -0 "$canvasread" 2>/dev/null; then
        wait "$canvasread"
        exit $?
    fi
    sleep 0.2
done
if [ -n "$stopping" ]; then
    wait "$canvasread"
    exit $?
fi

"$VLLM_BIN" serve "$MODEL" --host 127.0.0.1 --port "$VLLM_PORT" \
    --served-model-name "$SERVED_MODEL_NAME" \
    --diffusion-config "{\"canvas_length\": ${CANVAS_LENGTH}}" \
    --max-model-len "${MAX_MODEL_LEN:-65536}" --max-num-seqs "${MAX_NUM_SEQS:-16}" \
    --gpu-memory-utilization "${GPU_MEMORY_UTILIZATION:-0.85}" "${vllm_args[@]}" &
vllm=$!

set +e
wait -n "$canvasread" "$vllm"
status=$?
kill -TERM "$canvasread" "$vllm" 2>/dev/null
wait
exit "$status"
