#!/usr/bin/env bash
# Run the real vLLM (CPU) on the tiny random-weight model, in the foreground, for manual checks.
#
#   scripts/serve_tiny.sh [PORT] [extra vllm serve args...]      # PORT default 18000
#
# Makes the venv (scripts/setup_vllm.sh) and the model (scripts/make_tiny_model.py) first if
# needed; both steps are no-ops once done. Ctrl-C (SIGINT) or SIGTERM stops vLLM; the script
# execs vllm, so its pid is the API server's pid. The served model name is the model path
# unless you pass --served-model-name. Ready when `curl -s localhost:PORT/health` gives 200
# (~25-35 s on 2 cores).
#
# Environment: VLLMWATCH_VLLM_VENV (venv), VLLMWATCH_TINY_MODEL (model dir, default
# <repo>/.cache/tiny-model), VLLM_CPU_KVCACHE_SPACE (GiB of KV cache, default 1).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VLLMWATCH_VLLM_VENV:-$REPO/.cache/vllm-venv}
MODEL=${VLLMWATCH_TINY_MODEL:-$REPO/.cache/tiny-model}
PORT=${1:-18000}
[[ $# -gt 0 ]] && shift

"$REPO/scripts/setup_vllm.sh"
"$VENV/bin/python" "$REPO/scripts/make_tiny_model.py" "$MODEL"

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
set -x
exec "$VENV/bin/vllm" serve --model "$MODEL" --host 127.0.0.1 --port "$PORT" \
    --max-model-len 2048 --enforce-eager --dtype bfloat16 "$@"
