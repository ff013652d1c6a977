#!/usr/bin/env bash
# Shared by demo.sh and test.sh: vllmwatch's own virtualenv (.venv) with its dev tools.
# Idempotent; a second run only checks that the install is current.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${VLLMWATCH_PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_ROOT_USER_ACTION=ignore
if [[ ! -x "$REPO/.venv/bin/python" ]]; then
    echo "[bootstrap] creating $REPO/.venv"
    "$PY" -m venv "$REPO/.venv"
fi
stamp="$REPO/.venv/.vllmwatch-deps"
want=$(sha256sum "$REPO/pyproject.toml" | cut -c1-16)
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
    echo "[bootstrap] installing vllmwatch and its dev tools into .venv"
    "$REPO/.venv/bin/pip" install -q -e "$REPO[dev]"
    echo "$want" > "$stamp"
fi
