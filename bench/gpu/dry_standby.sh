#!/bin/sh
# Dry run of bench/gpu/phases_standby.py with the fake vLLM (no GPU, no NVML: the leak fault
# is skipped): the phases' plumbing, events and leftover checks, before the H200 call.
#   sh bench/gpu/dry_standby.sh [PHASE ...]     (default: standby standbyoff standbyapi2)
set -eu
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PY="$REPO/.venv/bin/python"
WORK=$(mktemp -d /tmp/vw-dry-standby-XXXXXX)
mkdir -p "$WORK/bin"
cat > "$WORK/bin/vllm" <<EOS
#!$PY
import sys
from vllmwatch.testing.fake_vllm import main
if __name__ == "__main__":
    sys.exit(main([*sys.argv[2:], "--startup-seconds", "2"]))
EOS
printf '#!/bin/sh\nexec %s -m vllmwatch "$@"\n' "$PY" > "$WORK/bin/vllmwatch"
chmod +x "$WORK/bin/vllm" "$WORK/bin/vllmwatch"
export PYTHONPATH="$REPO" VLLM_H200_WORK="$WORK" OUT="$WORK/out" VLLMWATCH_STANDBY_DRY=1
export VLLM_H200_VLLM="$WORK/bin/vllm" VLLM_H200_VLLMWATCH="$WORK/bin/vllmwatch"
[ $# -gt 0 ] || set -- standby standbyoff standbyapi2
timeout 900 "$PY" "$REPO/bench/gpu/drive.py" "$@" --budget 800
echo "summary: $WORK/out/summary.jsonl"
