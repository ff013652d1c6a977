#!/usr/bin/env bash
# The test command (README, .ci/run): install what the tests need, then lint, type-check and
# run the whole suite: pure tables, the loop with a fake vLLM, a real vLLM on CPU, and a real
# systemd booted in systemd-nspawn (root only). Extra arguments go to pytest.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
bash scripts/bootstrap.sh
bash scripts/setup_vllm.sh
# As root, the system tier installs Debian packages (README "Set-up"): systemd-container,
# lintian, fakeroot, haproxy, qemu-user-static, debootstrap, binutils-aarch64-linux-gnu,
# prometheus (whose running service it disables). VLLMWATCH_SKIP_SYSTEM_TIER=1 installs
# none of them and skips tests/systemd (tests/conftest.py); the tests that need haproxy or
# promtool skip when those are missing. .ci/run never sets it.
SYSTEM=1
if [[ "${VLLMWATCH_SKIP_SYSTEM_TIER:-0}" == 1 ]]; then
    SYSTEM=0
    echo "[test] VLLMWATCH_SKIP_SYSTEM_TIER=1: no apt-get installs; tests/systemd skipped"
fi
if [[ $SYSTEM == 1 && $(id -u) == 0 ]] && command -v apt-get >/dev/null \
        && ! { command -v systemd-nspawn && command -v lintian && command -v fakeroot; } >/dev/null; then
    echo "[test] installing systemd-container, lintian and fakeroot for the systemd tests"
    apt-get update -qq >/dev/null && \
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd-container lintian \
        fakeroot >/dev/null || echo "[test] apt-get failed: the systemd tests will skip"
fi
if [[ $SYSTEM == 1 && $(id -u) == 0 ]] && command -v apt-get >/dev/null \
        && ! command -v haproxy >/dev/null; then
    echo "[test] installing haproxy for the load-balancer drain test"
    { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        haproxy >/dev/null; } || echo "[test] apt-get failed: the haproxy test will skip"
fi
# The arm64 package tests (tests/systemd/test_package_arm64.py): strip for aarch64, and
# qemu-user + debootstrap to run `vllmwatch check` in an arm64 root file system.
if [[ $SYSTEM == 1 && $(id -u) == 0 ]] && command -v apt-get >/dev/null \
        && ! { command -v qemu-aarch64-static && command -v debootstrap \
               && command -v aarch64-linux-gnu-strip; } >/dev/null; then
    echo "[test] installing qemu-user-static, debootstrap and binutils-aarch64-linux-gnu"
    apt-get update -qq >/dev/null && \
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user-static debootstrap \
        binutils-aarch64-linux-gnu >/dev/null || echo "[test] apt-get failed: arm64 tests skip"
fi
# promtool and prometheus test contrib/prometheus (tests/daemon/test_contrib.py); Debian ships both.
if [[ $SYSTEM == 1 && $(id -u) == 0 ]] && command -v apt-get >/dev/null \
        && ! { command -v promtool && command -v prometheus; } >/dev/null; then
    echo "[test] installing prometheus (promtool) for the alert-rule tests"
    { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends prometheus >/dev/null; } \
        || echo "[test] apt-get failed: the promtool tests will skip"
    # The package starts a Prometheus service where an init system runs; tests start their own.
    if command -v systemctl >/dev/null && systemctl is-active -q prometheus 2>/dev/null; then
        systemctl disable --now prometheus >/dev/null 2>&1 || true
    fi
fi
echo "[test] ruff"; .venv/bin/ruff check vllmwatch tests bench scripts
echo "[test] mypy --strict (vllmwatch, bench, tests/support: pyproject's [tool.mypy] files)"; .venv/bin/mypy
echo "[test] pytest"
if [[ $# -gt 0 ]]; then
    exec .venv/bin/python -m pytest -ra "$@"
fi
# The whole suite: the real-vLLM tests (marker e2e) beside the rest, two pytests at once
# (scripts/lanes.py says why); each lane's summary and a line per lane at the end.
exec .venv/bin/python scripts/lanes.py .venv/bin/python
