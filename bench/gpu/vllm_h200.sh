#!/usr/bin/env bash
# bench/gpu/vllm_h200.sh — from ../shared/gpu/vllm_h200.sh, adapted: vllmwatch, its bench
# harness and scripts/make_tiny_model.py come from $VW_DIR (default: the checkout root; e.g.
# .gpu/vw, an export of a branch), the driver is bench/gpu/drive.py (the package bench/gpu,
# phases registered in bench/gpu/phases/__init__.py; bench/gpu/README.md).
# docs/GPU.md gives the exact sequence of commands used for the results there.
#
# vllm_h200.sh — a real vLLM (0.26.0: the release that pins torch 2.11.0 and links CUDA 13, as
# installed on the H200 machine) on that machine, supervised by vllmwatch from this checkout.
#
# The H200 machine has no network and each command there receives at most 64 MiB of files, so
# vLLM and the Python packages its image lacks travel as one xz-compressed, pre-installed
# site-packages tree split into parts of <= 60 MiB; successive commands drop them under /tmp
# there (kept while the machine is held: at most 30 min, given back 30 s after a command).
# Nothing is downloaded there; no model is downloaded anywhere: the tiny model and a
# Qwen3-8B-shaped random one are written there.
#
# HERE (the CPU machine, with PyPI), from the project checkout root:
#     echo /.gpu/ >> .git/info/exclude            # once: .gpu/ stays out of git
#     mkdir -p .gpu && cp -r ../shared/gpu .gpu/tools   # ../shared does not travel; .gpu does
#     bash .gpu/tools/vllm_h200.sh build          # -> .gpu/payload/part.NN + MANIFEST
#     bash .gpu/tools/vllm_h200.sh calls          # prints the sequence of commands below
#
# THERE, one command after the other, each within 30 s of the last one's answer (or the machine
# goes back and the parts dropped so far are lost: start again at 1). Send with each command
# the files named, plus .gpu/tools. For two parts:
#   1. send .gpu/payload/part.00 .gpu/payload/MANIFEST .gpu/tools
#      bash .gpu/tools/vllm_h200.sh stash && bash .gpu/tools/vllm_h200.sh drive probe0
#   2. send .gpu/payload/part.01 .gpu/payload/MANIFEST .gpu/tools
#      bash .gpu/tools/vllm_h200.sh stash && bash .gpu/tools/vllm_h200.sh install \
#        && bash .gpu/tools/vllm_h200.sh drive auto --budget 540
#   3., 4., ... send .gpu/tools:  bash .gpu/tools/vllm_h200.sh drive auto --budget 540
#      (each command runs the phases not yet done, in order, as long as their time fits; the
#      driver keeps its state in /tmp/vllm_h200/state.json there)
# Give each command 600 s. `drive PHASE...` runs named phases again (auto never repeats a
# phase, failed or not). vllmwatch is installed there from this checkout's working tree
# (vllmwatch/), so uncommitted changes are what runs. Seen 2026-11-30 (one H200): the machine
# started in ~30 s; install (unpack 469 MiB + byte-compile) ~10 s; probe 38 s, serve 73 s, watch
# 152 s, prewarm 234 s; biggen/big not run yet. Results come back under $OUT: summary.jsonl
# (one JSON line per measurement, also printed as '## {...}' lines) and logs.tar.gz.
#
# Two things that broke vLLM on the H200 and are handled here (see `install` and `drive`):
#   - the `vllm` console script needs its `if __name__ == "__main__":` guard (spawned EngineCore
#     re-imports the main script);
#   - without the flashinfer package vLLM 0.26's sampler fails at engine start unless
#     VLLM_USE_FLASHINFER_SAMPLER=0 (set for every vLLM started here, and in the vllmwatch
#     configs' [vllm.env]).
#
# Phases (bench/gpu/phases/): probe, serve (plain `vllm serve`, tiny model), watch (vllmwatch
# run, kill -9 of EngineCore, SIGTERM), prewarm (vllmwatch prewarm, direct FA3 warm-up, cold
# start and warm restart), biggen (write the 8B-shaped model), big (8B-shaped: cold start,
# warm restart, kill -9 of EngineCore).
#
# What the slimming drops from the vLLM 0.26.0 wheel (732 MB unpacked), and why it is safe for a
# dense bf16 model on Hopper:
#   vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so (305 MB): FA2; imported in a try/except, and on
#       compute capability 9.x vLLM picks FA3 (_vllm_fa3_C, kept) — fa_utils.get_flash_attn_version
#   vllm/vllm-rs (43 MB): the Rust front end, used only with VLLM_USE_RUST_FRONTEND=1
#   vllm/third_party/fmha_sm100 (30 MB): Blackwell-only sparse attention for MiniMax-M3
#   vllm/third_party/deep_gemm/_C.cpython-3{10,11,13,14}-*.so: other Pythons' builds
#   vllm/_moe_C_stable_libtorch.abi3.so (48 MB, 40 MB compressed): MoE kernels; imported under
#       contextlib.suppress(ImportError) in platforms/cuda.py, used only by fused-MoE layers.
#       Keep it (KEEP_MOE=1, one more part) to serve MoE models.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=${VLLM_H200_REPO:-$PWD}                     # the project checkout root (here and there)
GPU=$REPO/.gpu                                  # ignored by git; sent explicitly
VW_DIR=${VW_DIR:-$REPO}                         # holds vllmwatch/, bench/gpu/, scripts/
VLLM_VERSION=0.26.0
PART_SIZE=${PART_SIZE:-48M}                     # split size: a part + the checkout + .gpu/vw < 64 MiB
WORK=${VLLM_H200_WORK:-/tmp/vllm_h200}          # working folder on the H200 machine
SITE=$WORK/site                                 # there: the unpacked packages

die() { echo "vllm_h200: $*" >&2; exit 1; }

# ---------------------------------------------------------------------------------------------
# build (here): download, install into a staging tree, slim, compress, split; copy vllmwatch.
build() {
    local stage=${STAGE:-/tmp/vllm_h200_stage} project=${PROJECT:-$REPO}
    local py=${PYTHON:-python3}
    mkdir -p "$stage/wheels" "$GPU"
    # pip may run under any Python here: the flags make it choose and accept cp312 wheels.
    local plat=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312
        --abi abi3 --abi none)
    for n in 28 27 26 24 17 12 5 31 34; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
    plat+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64
        --platform manylinux1_x86_64 --platform linux_x86_64 --platform any)
    # 1. the vLLM wheel (290 MiB) — reuse a copy already on disk (WHEEL_DIR) when there is one
    local whl="vllm-$VLLM_VERSION-cp38-abi3-manylinux_2_28_x86_64.whl"
    if [[ ! -f $stage/wheels/$whl && -n ${WHEEL_DIR:-} && -f $WHEEL_DIR/$whl ]]; then
        cp "$WHEEL_DIR/$whl" "$stage/wheels/"
    fi
    [[ -f $stage/wheels/$whl ]] || "$py" -m pip download -q --no-deps "${plat[@]}" \
        -d "$stage/wheels" "vllm==$VLLM_VERSION"
    # 2. the packages the image lacks (vllm_h200_deps.txt); sdnotify only exists as an sdist
    grep -v -e '^#' -e '^sdnotify==' "$HERE/vllm_h200_deps.txt" > "$stage/deps.txt"
    "$py" -m pip download -q --no-deps "${plat[@]}" -d "$stage/wheels" -r "$stage/deps.txt"
    if ! ls "$stage"/wheels/sdnotify-*.whl >/dev/null 2>&1; then
        "$py" -m pip download -q --no-deps --no-binary=:all: -d "$stage/sdist" \
            "$(grep '^sdnotify==' "$HERE/vllm_h200_deps.txt")"
        "$py" -m pip wheel -q --no-deps -w "$stage/wheels" "$stage"/sdist/sdnotify-*.tar.gz
    fi
    # 3. install them all into one tree, exactly as `pip install --target` would do there
    rm -rf "$stage/site"
    "$py" -m pip install -q --no-index --no-deps --no-compile "${plat[@]}" \
        --target "$stage/site" "$stage"/wheels/*.whl
    # 4. slim (see the header for why each is safe)
    local v=$stage/site/vllm
    # py-spy's binary (incident records, phase `incident`) leaves bin/ for a folder of its own
    if [[ -f $stage/site/bin/py-spy ]]; then
        mkdir -p "$stage/site/vllmwatch-bin"; mv "$stage/site/bin/py-spy" "$stage/site/vllmwatch-bin/"
    fi
    rm -rf "$stage/site/bin" "$v/vllm-rs" "$v/vllm_flash_attn/_vllm_fa2_C.abi3.so" \
        "$v/third_party/fmha_sm100" "$v"/third_party/deep_gemm/_C.cpython-31[0134]-*.so
    [[ ${KEEP_MOE:-0} == 1 ]] || rm -f "$v/_moe_C_stable_libtorch.abi3.so"
    # 5. one xz stream (Python's lzma can undo it where no xz binary exists), split in parts
    rm -rf "$GPU/payload"; mkdir -p "$GPU/payload"
    tar -C "$stage/site" -cf - . | xz -9 -T0 -c > "$stage/site.tar.xz"
    split -b "$PART_SIZE" -d -a 2 "$stage/site.tar.xz" "$GPU/payload/part."
    local parts; parts=$(cd "$GPU/payload" && ls part.* | tr '\n' ' ')
    { echo "vllm==$VLLM_VERSION"; echo "parts: $parts";
      echo "sha256: $(sha256sum "$stage/site.tar.xz" | cut -d' ' -f1)";
      echo "bytes: $(stat -c %s "$stage/site.tar.xz")";
      echo "unpacked: $(du -sb "$stage/site" | cut -f1)"; } > "$GPU/payload/MANIFEST"
    cat "$GPU/payload/MANIFEST"; ls -l "$GPU/payload"
    calls
}

calls() {  # the commands for the H200 machine, for the parts built
    local parts=("$GPU"/payload/part.*) i=0 n
    n=${#parts[@]}
    for p in "${parts[@]}"; do
        local rel=".gpu/payload/$(basename "$p")" cmd="bash .gpu/tools/vllm_h200.sh stash"
        i=$((i + 1))
        if ((i == n)); then
            cmd+=" && bash .gpu/tools/vllm_h200.sh install && bash .gpu/tools/vllm_h200.sh drive auto --budget 540"
        else
            cmd+=" && bash .gpu/tools/vllm_h200.sh drive probe0"
        fi
        echo "$i. send $rel .gpu/payload/MANIFEST .gpu/tools"
        echo "        $cmd"
    done
    echo "$((n + 1)), ...: send .gpu/tools; bash .gpu/tools/vllm_h200.sh drive auto --budget 540"
}

# ---------------------------------------------------------------------------------------------
# stash (there): keep this call's part outside the working copy, where later calls find it.
stash() {
    mkdir -p "$WORK/payload"
    local p found=0
    for p in "$GPU"/payload/part.*; do
        [[ -f $p ]] || continue
        cmp -s "$p" "$WORK/payload/$(basename "$p")" 2>/dev/null || cp "$p" "$WORK/payload/"
        found=1
    done
    cp "$GPU/payload/MANIFEST" "$WORK/payload/"
    ((found)) || die "no .gpu/payload/part.* came with this command (send it)"
    echo "stashed: $(cd "$WORK/payload" && ls part.* | tr '\n' ' ')"
}

# install (there): reassemble, check, unpack; make the image's python3 see the tree through a
# .pth file (image packages keep precedence; `python3 -I` sees it too, as vllmwatch's version
# probe needs); console scripts `vllm` and `vllmwatch` beside python3.
install() {
    local m=$WORK/payload/MANIFEST parts want have py bin sp
    [[ -f $m ]] || die "no MANIFEST in $WORK/payload"
    parts=$(sed -n 's/^parts: //p' "$m"); want=$(sed -n 's/^sha256: //p' "$m")
    py=$(command -v python3); bin=$(dirname "$py")
    sp=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    if [[ ! -f $SITE/.complete || $(cat "$SITE/.complete") != "$want" ]]; then
        local t0=$SECONDS
        for p in $parts; do [[ -f $WORK/payload/$p ]] || die "part $p missing: send it first"; done
        have=$(cd "$WORK/payload" && cat $parts | sha256sum | cut -d' ' -f1)
        [[ $have == "$want" ]] || die "payload sha256 $have != $want"
        rm -rf "$SITE"; mkdir -p "$SITE"
        if command -v xz >/dev/null; then
            (cd "$WORK/payload" && cat $parts) | xz -d -T0 | tar -x -C "$SITE"
        else
            (cd "$WORK/payload" && cat $parts) | "$py" -c \
                'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer, 1<<20)' \
                | tar -x -C "$SITE"
        fi
        # byte-compile as pip would (the first import otherwise compiles ~2000 modules)
        "$py" -m compileall -q -j 0 "$SITE" >/dev/null 2>&1 || true
        echo "$want" > "$SITE/.complete"
        echo "unpacked $(du -sh "$SITE" | cut -f1) in $((SECONDS - t0)) s"
    fi
    # vllmwatch from this checkout's working tree
    rm -rf "$SITE/vllmwatch"; cp -r "$VW_DIR/vllmwatch" "$SITE/vllmwatch"
    echo "$SITE" > "$sp/zz_vllm_h200.pth"
    # Console scripts as pip writes them. The __main__ guard matters: vLLM starts EngineCore
    # with multiprocessing's spawn method, which re-imports the main script in the child; an
    # unguarded script starts a second API server there and the engine dies at birth
    # ("An attempt has been made to start a new process before the current process has
    # finished its bootstrapping phase"; seen on the H200).
    local tpl='#!%s\nimport sys\nfrom %s import main\nif __name__ == "__main__":\n    sys.exit(main())\n'
    # shellcheck disable=SC2059
    printf "$tpl" "$py" vllm.entrypoints.cli.main > "$bin/vllm"
    # shellcheck disable=SC2059
    printf "$tpl" "$py" vllmwatch.cli > "$bin/vllmwatch"
    chmod 755 "$bin/vllm" "$bin/vllmwatch"
    "$py" -I -c 'import importlib.metadata as m, vllmwatch; print("vllm", m.version("vllm"),
        "| vllmwatch", vllmwatch.__version__)'
}

# drive (there): the measurements; logs packed into $OUT whatever happens.
drive() {
    mkdir -p "${OUT:=/tmp/vllm_h200_out}" "$WORK/logs"
    export OUT PYTHONUNBUFFERED=1 VLLM_H200_WORK=$WORK VLLM_H200_VW_SRC=$VW_DIR
    # multi-GPU hygiene on these machines (harmless on one GPU): never NVLink multicast
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
    # FlashInfer is not carried (its kernels are JIT-built or come as large cubin packages).
    # vLLM 0.26's sampler imports the FlashInfer attention backend unless this is 0, and that
    # import fails without the package: "ModuleNotFoundError: No module named 'flashinfer'"
    # in EngineCore right after the weights load (seen on the H200). 0 = PyTorch sampling.
    export VLLM_USE_FLASHINFER_SAMPLER=0
    local rc=0
    python3 "$HERE/drive.py" "$@" || rc=$?
    tar -C "$WORK" -czf "$OUT/logs.tar.gz" logs state.json 2>/dev/null || true
    return $rc
}

case ${1:-} in
    build) build ;;
    calls) calls ;;
    stash) stash ;;
    install) install ;;
    drive) shift; drive "$@" ;;
    *) sed -n '2,40p' "${BASH_SOURCE[0]}"; exit 2 ;;
esac
