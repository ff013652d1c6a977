#!/usr/bin/env bash
# The demo (README): install everything, make a tiny random-weight model locally, and run a
# real vLLM (CPU build) supervised by vllmwatch. Ctrl-C stops both and leaves nothing behind.
#
#   bash scripts/demo.sh               # run until Ctrl-C
#   DEMO_UNTIL_READY=1 bash scripts/demo.sh   # stop by itself once vLLM is READY (for checks)
#   DEMO_PORT=8000 DEMO_STATUS_PORT=9101 bash scripts/demo.sh   # fixed ports (default: free)
#
# What it leaves: the checkout's .cache (the venvs, the tiny model, demo.toml, vLLM's compile
# cache for the next run); nothing in /run/vllmwatch, ~/.cache or ~/.local/state: the
# daemon's state (instance lock, incident records) lives in a private folder removed at exit.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
bash scripts/bootstrap.sh
bash scripts/setup_vllm.sh
VENV=${VLLMWATCH_VLLM_VENV:-$REPO/.cache/vllm-venv}
MODEL=$REPO/.cache/tiny-model
"$VENV/bin/python" scripts/make_tiny_model.py "$MODEL"
free_port() {  # a port nothing listens on now (the kernel's pick), unless the caller gave one
    .venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
PORT=${DEMO_PORT:-$(free_port)}
STATUS_PORT=${DEMO_STATUS_PORT:-$(free_port)}
while [[ "$STATUS_PORT" == "$PORT" ]]; do STATUS_PORT=$(free_port); done
# Private directories: the daemon writes nothing where a system install would (issue 36.20).
CACHE=$REPO/.cache/vllmwatch-cache  # kept: vLLM's compile cache makes the next start faster
PRIVATE=$(mktemp -d "${TMPDIR:-/tmp}/vllmwatch-demo.XXXXXX")
mkdir -p "$CACHE" "$PRIVATE/state" "$PRIVATE/run"
export CACHE_DIRECTORY=$CACHE STATE_DIRECTORY=$PRIVATE/state RUNTIME_DIRECTORY=$PRIVATE/run
export XDG_CACHE_HOME=$PRIVATE/xdg-cache XDG_STATE_HOME=$PRIVATE/xdg-state
cleanup() { rm -rf "$PRIVATE"; }
trap cleanup EXIT
CONF=$REPO/.cache/demo.toml
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
[restart]
drain_timeout = "20s"  # with stop_timeout: Ctrl-C stops vLLM within 30 s
stop_timeout = "10s"
[prewarm]
cache_dir = "$CACHE"
[status]
listen = "127.0.0.1:$STATUS_PORT"
TOML
echo "[demo] config: $CONF"
echo "[demo] vLLM will answer on http://127.0.0.1:$PORT/v1 (model \"tiny\"),"
echo "[demo] vllmwatch's status on http://127.0.0.1:$STATUS_PORT/status"
echo "[demo]   try: .venv/bin/vllmwatch status --config $CONF"
echo "[demo] the full checklist first (vllmwatch check; asks vLLM for its flags once):"
if ! .venv/bin/vllmwatch check --config "$CONF"; then
    echo "[demo] check found a FAIL (above): fix it, then run the demo again" >&2
    exit 1
fi
# vllmwatch runs in this shell's process group: Ctrl-C reaches it as well as this script. Its
# first SIGINT drains and stops vLLM (up to restart.drain_timeout + stop_timeout); a second one
# kills vLLM's group at once. The trap only says so, and keeps the script waiting for it.
.venv/bin/vllmwatch run --config "$CONF" &
pid=$!
interrupts=0
on_interrupt() {
    interrupts=$((interrupts + 1))
    if (( interrupts == 1 )); then
        echo "[demo] stopping vLLM (≤ 30 s; Ctrl-C again to kill now)" >&2
    else
        echo "[demo] killing vLLM now" >&2
    fi
}
trap on_interrupt INT
# A SIGTERM sent to this script alone (not to the group): pass it on, as Ctrl-C would.
trap 'on_interrupt; kill -TERM "$pid" 2>/dev/null || true' TERM
finish() {  # wait for vllmwatch through any number of interrupts; its exit code is ours
    local rc r
    while :; do
        if wait "$pid"; then rc=0; else rc=$?; fi
        if (( rc > 128 )); then  # a trapped signal woke `wait`, or vllmwatch died of one
            kill -0 "$pid" 2>/dev/null && continue
            if wait "$pid" 2>/dev/null; then rc=0; else r=$?; (( r == 127 )) || rc=$r; fi
        fi
        exit "$rc"
    done
}
if [[ "${DEMO_UNTIL_READY:-0}" == 1 ]]; then
    for _ in $(seq 1 300); do
        if curl -fsS "http://127.0.0.1:$STATUS_PORT/readyz" >/dev/null 2>&1; then
            curl -sS "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
                -d '{"model": "tiny", "prompt": "Hello", "max_tokens": 5}'; echo
            kill -TERM "$pid"; finish
        fi
        kill -0 "$pid" 2>/dev/null || finish
        sleep 1
    done
    kill -TERM "$pid"; echo "[demo] not ready in 300 s" >&2; finish
fi
finish
