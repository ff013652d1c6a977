#!/usr/bin/env bash
# Run `vllmwatch check` from an arm64 .deb in an arm64 Debian root file system, under
# qemu-user, on an amd64 machine without binfmt_misc (a container): the proof that the
# package built with VLLMWATCH_DEB_ARCH=arm64 runs on aarch64 (a DGX Spark is aarch64).
#
#   packaging/arm64-check.sh DEB ROOTFS CONFIG [SUITE]
#
# Needs root, qemu-user-static, debootstrap and unshare (apt-get install qemu-user-static
# debootstrap). ROOTFS is made with `debootstrap --foreign` (first stage only: packages are
# unpacked, nothing of arm64 runs) when it does not exist yet, and reused after. CONFIG is
# copied to /etc/vllmwatch/check.toml inside. /proc is bind-mounted in a private mount
# namespace, so nothing stays mounted. Prints `machine=...` then the checklist; exits with
# `vllmwatch check`'s status.
set -euo pipefail
DEB=$1 ROOT=$2 CONFIG=$3 SUITE=${4:-bookworm}
MIRROR=${VLLMWATCH_DEBIAN_MIRROR:-http://deb.debian.org/debian}
QEMU=$(command -v qemu-aarch64-static) || { echo "qemu-aarch64-static not found" >&2; exit 2; }

if [[ ! -x $ROOT/usr/bin/python3 ]]; then
    rm -rf "$ROOT"
    debootstrap --arch arm64 --foreign --variant=minbase --include=python3 "$SUITE" "$ROOT" \
        "$MIRROR" > "$ROOT.debootstrap.log" 2>&1 \
        || { tail -20 "$ROOT.debootstrap.log" >&2; exit 3; }
    # --foreign downloads the --include packages but unpacks only the base: unpack Python.
    for d in "$ROOT"/var/cache/apt/archives/*.deb; do
        dpkg-deb --fsys-tarfile "$d" | tar -x --keep-directory-symlink -C "$ROOT"
    done
fi
# Keep merged-/usr symlinks (/lib -> usr/lib) when unpacking our lib/systemd/...
dpkg-deb --fsys-tarfile "$DEB" | tar -x --keep-directory-symlink -C "$ROOT"
install -m 0755 "$QEMU" "$ROOT/usr/bin/qemu-aarch64-static"
install -D -m 0644 "$CONFIG" "$ROOT/etc/vllmwatch/check.toml"
[[ -L $ROOT/proc ]] && rm "$ROOT/proc"
mkdir -p "$ROOT/proc"
exec unshare -m bash -c '
    mount --bind /proc "$1/proc"
    chroot "$1" /usr/bin/qemu-aarch64-static /opt/vllmwatch/venv/bin/python -c \
        "import platform; print(\"machine=\" + platform.machine())"
    exec chroot "$1" /usr/bin/qemu-aarch64-static /opt/vllmwatch/venv/bin/python \
        /opt/vllmwatch/bin/vllmwatch check --config /etc/vllmwatch/check.toml' _ "$ROOT"
