#!/usr/bin/env bash
# Search new walks for the hypothesis properties: every file using hypothesis, ROUNDS times
# (default 3), each round with fresh random seeds. The suite itself walks fixed examples
# (tests/conftest.py): a walk found here becomes an example test beside its property.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
rounds="${1:-3}"
mapfile -t files < <(grep -rlE --include='test_*.py' '^from hypothesis|^import hypothesis' tests)
for ((i = 1; i <= rounds; i++)); do
    echo "[hunt] round $i of $rounds: ${#files[@]} files"
    VLLMWATCH_HYPOTHESIS=search .venv/bin/python -m pytest -q -p no:cacheprovider \
        -m "not e2e and not systemd" "${files[@]}"
done
