#!/usr/bin/env bash
# The demo (README): install everything, make a tiny random-weight model locally, and run a
# real vLLM (CPU build) supervised by vllmwatch. Ctrl-C stops both and leaves nothing behind.
#
#   bash scripts/demo.sh               # run until Ctrl-C
#   DEMO_UNTIL_READY=1 bash scripts/demo.sh   # stop by itself once vLLM is READY (for checks)
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
bash scripts/bootstrap.sh
bash scripts/setup_vllm.sh
VENV=${VLLMWATCH_VLLM_VENV:-$REPO/.cache/vllm-venv}
MODEL=$REPO/.cache/tiny-model
"$VENV/bin/python" scripts/make_tiny_model.py "$MODEL"
CONF=$REPO/.cache/demo.toml
PORT=${DEMO_PORT:-8000}
STATUS_PORT=${DEMO_STATUS_PORT:-9101}
cat > "$CONF" <<TOML
# Written by scripts/demo.sh: a real vLLM on CPU with a tiny local model.
[vllm]
command = ["$VENV/bin/vllm", "serve"]
model = "$MODEL"
served_model_name = "tiny"
port = $PORT
gpus = []
[vllm.env]
HF_HUB_OFFLINE = "1"
VLLM_CPU_KVCACHE_SPACE = "1"
[vllm.args]
max-model-len = 2048
enforce-eager = true
dtype = "bfloat16"
[probe]
canary_interval = "30s"
[prewarm]
cache_dir = "$REPO/.cache/vllmwatch-cache"
[status]
listen = "127.0.0.1:$STATUS_PORT"
TOML
echo "[demo] config: $CONF"
echo "[demo] vLLM will answer on http://127.0.0.1:$PORT/v1 (model \"tiny\"),"
echo "[demo] vllmwatch's status on http://127.0.0.1:$STATUS_PORT/status"
echo "[demo]   try: .venv/bin/vllmwatch status --config $CONF"
.venv/bin/vllmwatch check --config "$CONF" --fast || true
if [[ "${DEMO_UNTIL_READY:-0}" == 1 ]]; then
    .venv/bin/vllmwatch run --config "$CONF" &
    pid=$!
    for _ in $(seq 1 300); do
        if curl -fsS "http://127.0.0.1:$STATUS_PORT/readyz" >/dev/null 2>&1; then
            curl -sS "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
                -d '{"model": "tiny", "prompt": "Hello", "max_tokens": 5}'; echo
            kill -TERM "$pid"; wait "$pid"; exit $?
        fi
        sleep 1
    done
    kill -TERM "$pid"; wait "$pid" || true; echo "[demo] not ready in 300 s" >&2; exit 1
fi
exec .venv/bin/vllmwatch run --config "$CONF"
