#!/usr/bin/env bash
# Build dist/vllmwatch_<version>_<arch>.deb from this repository.
#
#   packaging/build-deb.sh            # then: lintian dist/vllmwatch_*.deb
#
# The package holds vllmwatch in its own virtualenv under /opt/vllmwatch/venv (built here with
# pip from the repo; the build machine needs PyPI or a pip index for the dependencies), the
# systemd units, the journald catalog, /etc/vllmwatch/vllmwatch.toml as a conffile (etc/vllmwatch.toml as is), the
# `vllmwatch` system user (sysusers.d) and a `systemctl daemon-reload` on install; it starts
# and enables nothing. vLLM itself stays the user's own install: the config points at it.
#
# The virtualenv links to the build machine's /usr/bin/python3, so build on the Debian release
# you ship to (Depends pins that Python minor version).
#
# Environment:
#   VLLMWATCH_DEB_PYTHON      interpreter for the virtualenv (default /usr/bin/python3)
#   VLLMWATCH_DEB_CONFIG      config shipped as the conffile (default etc/vllmwatch.toml)
#   VLLMWATCH_DEB_MAINTAINER  Maintainer field (default below)
#   VLLMWATCH_DEB_OUT         output folder (default dist/)
#   VLLMWATCH_DEB_BUILD       scratch folder, emptied first (default build/deb/)
#   VLLMWATCH_DEB_ARCH        Debian architecture to build for (default: this machine's).
#                             Another one (arm64 for a DGX Spark, from an amd64 builder) is a
#                             cross build: pure-Python wheels are built here, binary ones are
#                             taken from the index for that platform only (pip --platform
#                             manylinux2014_aarch64 --only-binary=:all:), so the venv holds
#                             no code of this machine's architecture. The target needs the same
#                             Python minor version as VLLMWATCH_DEB_PYTHON (Debian 12: 3.11,
#                             Ubuntu 24.04 / DGX OS 7: 3.12; build with a matching interpreter).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PKG=vllmwatch
PREFIX=/opt/vllmwatch
PYTHON=${VLLMWATCH_DEB_PYTHON:-/usr/bin/python3}
CONFIG_SRC=${VLLMWATCH_DEB_CONFIG:-$REPO/etc/vllmwatch.toml}
MAINTAINER=${VLLMWATCH_DEB_MAINTAINER:-vllmwatch maintainers <vllmwatch@lists.example.org>}
OUTDIR=${VLLMWATCH_DEB_OUT:-$REPO/dist}

say() { printf '[build-deb] %s\n' "$*"; }
die() { printf '[build-deb] ERROR: %s\n' "$*" >&2; exit 1; }

for tool in dpkg-deb dpkg strip; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install dpkg binutils)"
done
[[ -x $PYTHON ]] || die "$PYTHON not found; set VLLMWATCH_DEB_PYTHON"
[[ -f $CONFIG_SRC ]] || die "$CONFIG_SRC not found: the package ships it as /etc/vllmwatch/vllmwatch.toml"

# A venv for another architecture: every wheel must be for that platform or pure Python.
cross_install() {
    local wheels=$BUILD/wheels site
    site=$VENV/lib/python$PYVER/site-packages
    say "cross build: wheels for ${PIP_PLATFORMS[*]}, CPython $PYVER"
    # Pure-Python wheels of vllmwatch and of dependencies published only as sdists (sdnotify).
    "$PYTHON" -m pip wheel --quiet --no-deps -w "$wheels" "$REPO"
    "$PYTHON" -m pip wheel --quiet -w "$wheels/all" "$REPO"
    find "$wheels/all" -name '*-none-any.whl' -exec mv {} "$wheels/" \;
    rm -rf "$wheels/all"
    local plat=() p
    for p in "${PIP_PLATFORMS[@]}"; do plat+=(--platform "$p"); done
    local whl
    whl=$(ls "$wheels"/vllmwatch-*.whl)
    "$PYTHON" -m pip install --quiet --no-compile --no-warn-script-location \
        --target "$site" "${plat[@]}" --implementation cp --python-version "$PYVER" \
        --only-binary=:all: --find-links "$wheels" "$whl[incidents]"
    # py-spy's binary for the target; pip --target puts wheel scripts under site/bin.
    [[ -f $site/bin/py-spy ]] && install -m 0755 "$site/bin/py-spy" "$VENV/bin/py-spy"
    rm -rf "$site/bin"   # scripts pip wrote for this machine's Python; ours is below
    printf '#!%s/venv/bin/python\nimport sys\n\nfrom vllmwatch.cli import main\n\nif __name__ == "__main__":\n    sys.exit(main())\n' \
        "$PREFIX" > "$VENV/bin/vllmwatch"
    chmod 0755 "$VENV/bin/vllmwatch"
}

# [project]'s version, read as text: tomllib is Python 3.11's, and the build Python is the
# target's (Ubuntu 22.04: 3.10, which vllmwatch supports)
VERSION=$("$PYTHON" -c 'import re, sys
project = re.split(r"(?m)^\[", open(sys.argv[1], encoding="utf-8").read().split("\n[project]\n", 1)[1])[0]
print(re.search(r"(?m)^version\s*=\s*\"([^\"]+)\"", project).group(1))' "$REPO/pyproject.toml")
HOST_ARCH=$(dpkg --print-architecture)
ARCH=${VLLMWATCH_DEB_ARCH:-$HOST_ARCH}
case $ARCH in
    "$HOST_ARCH") PIP_PLATFORMS=() ;;
    arm64) PIP_PLATFORMS=(manylinux2014_aarch64 manylinux_2_28_aarch64 linux_aarch64) ;;
    amd64) PIP_PLATFORMS=(manylinux2014_x86_64 manylinux_2_28_x86_64 linux_x86_64) ;;
    *) die "VLLMWATCH_DEB_ARCH=$ARCH: cross builds know arm64 and amd64" ;;
esac
PYVER=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
PYNEXT=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1] + 1}")')
BUILD=${VLLMWATCH_DEB_BUILD:-$REPO/build/deb}
ROOT=$BUILD/root
VENV=$ROOT$PREFIX/venv
DEB=$OUTDIR/${PKG}_${VERSION}_${ARCH}.deb
say "vllmwatch $VERSION for $ARCH with Python $PYVER"

rm -rf "$BUILD"
mkdir -p "$ROOT/DEBIAN" "$OUTDIR"

# 1. The virtualenv, built in the staging tree and then moved to its final path below. pip
#    comes from the build Python; the shipped venv carries none (nothing installs into it).
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_ROOT_USER_ACTION=ignore
"$PYTHON" -m venv --without-pip "$VENV"
if [[ ${#PIP_PLATFORMS[@]} -eq 0 ]]; then
    # [incidents]: py-spy, which incident records use to read a hung vLLM's stacks.
    "$PYTHON" -m pip --python "$VENV/bin/python" install --quiet --no-compile \
        --no-warn-script-location "$REPO[incidents]"
else
    cross_install
fi
# vllmwatch/testing/ (the fake vLLM, engine and NVML, the daemon harness, an HAProxy harness)
# serves the test suite and bench/, which import it from the source tree; nothing `vllmwatch`
# runs needs it (tests/core/test_architecture.py), so the package leaves it out, and out of
# the wheel's RECORD, which would otherwise list files that are not there.
for SITE in "$VENV"/lib/python3*/site-packages; do
    rm -rf "$SITE/vllmwatch/testing"
    sed -i '\#^vllmwatch/testing/#d' "$SITE"/vllmwatch-*.dist-info/RECORD
done
# Scripts and activate files name the staging path: point them at /opt, as dh-virtualenv does.
grep -rlI --null -F "$VENV" "$VENV" | xargs -0 -r sed -i "s|$VENV|$PREFIX/venv|g"
sed -i '/^command = /d' "$VENV/pyvenv.cfg"
find "$VENV" -name direct_url.json -delete   # records the build machine's checkout path
# Console scripts of the dependencies (e.g. idna's): nothing runs them; only ours is shipped,
# and py-spy's binary, which vllmwatch runs for incident records (docs/operations/incidents.md).
find "$VENV/bin" -maxdepth 1 -type f -perm -u+x ! -name vllmwatch ! -name py-spy -delete
find "$VENV" \( -name __pycache__ -o -name '*.pyc' \) -prune -exec rm -rf {} +
STRIP=strip
if [[ $ARCH != "$HOST_ARCH" ]]; then
    case $ARCH in arm64) STRIP=aarch64-linux-gnu-strip ;; amd64) STRIP=x86_64-linux-gnu-strip ;; esac
fi
if command -v "$STRIP" >/dev/null; then
    find "$VENV" -name '*.so' -exec "$STRIP" --strip-unneeded --remove-section=.comment {} +
    # py-spy's static binary, as its wheel ships it (incident records); still runs stripped.
    [[ -f $VENV/bin/py-spy ]] && "$STRIP" --strip-unneeded --remove-section=.comment "$VENV/bin/py-spy"
else
    say "$STRIP not found (apt-get install binutils-aarch64-linux-gnu): .so files left unstripped"
fi
# Library modules that start with "#!/usr/bin/env python" are never run as scripts here.
find "$VENV/lib" -name '*.py' ! -perm -u+x -exec sed -i '1{/^#!/d}' {} +
find "$VENV" -type d -empty -delete
grep -rlI -F "$BUILD" "$ROOT" && die "staging path left in the files above"

mkdir -p "$ROOT$PREFIX/bin" "$ROOT/usr/bin"
ln -s ../venv/bin/vllmwatch "$ROOT$PREFIX/bin/vllmwatch"
ln -s $PREFIX/bin/vllmwatch "$ROOT/usr/bin/vllmwatch"

# 2. Units, sysusers.d, config, docs.
install -D -m 0644 "$REPO/systemd/vllmwatch.service" "$ROOT/lib/systemd/system/vllmwatch.service"
install -D -m 0644 "$REPO/systemd/vllmwatch@.service" "$ROOT/lib/systemd/system/vllmwatch@.service"
install -D -m 0644 "$REPO/systemd/sysusers.d/vllmwatch.conf" "$ROOT/usr/lib/sysusers.d/vllmwatch.conf"
# What each MESSAGE_ID means and what to do: `journalctl -x` prints it (postinst compiles it).
install -D -m 0644 "$REPO/systemd/vllmwatch.catalog" "$ROOT/usr/lib/systemd/catalog/vllmwatch.catalog"
install -D -m 0644 "$CONFIG_SRC" "$ROOT/etc/vllmwatch/vllmwatch.toml"
DOC=$ROOT/usr/share/doc/$PKG
install -d "$DOC"
[[ -f $REPO/docs/OPERATIONS.md ]] && install -m 0644 "$REPO/docs/OPERATIONS.md" "$DOC/"
# The index above links its task pages as operations/*.md: ship them beside it.
if [[ -d $REPO/docs/operations ]]; then
    install -d "$DOC/operations"
    install -m 0644 "$REPO"/docs/operations/*.md "$DOC/operations/"
fi
"$PYTHON" "$REPO/packaging/copyright.py" "$VENV" > "$DOC/copyright"
DATE=$(date -R -d "@${SOURCE_DATE_EPOCH:-$(git -C "$REPO" log -1 --format=%ct 2>/dev/null || date +%s)}")
printf '%s (%s) unstable; urgency=medium\n\n  * Package built from the vllmwatch repository.\n\n -- %s  %s\n' \
    "$PKG" "$VERSION" "$MAINTAINER" "$DATE" | gzip -9n > "$DOC/changelog.gz"
install -D -m 0644 "$REPO/packaging/vllmwatch.8" "$ROOT/usr/share/man/man8/vllmwatch.8"
gzip -9n "$ROOT/usr/share/man/man8/vllmwatch.8"
install -D -m 0644 "$REPO/packaging/lintian-overrides" "$ROOT/usr/share/lintian/overrides/$PKG"

# 3. Control files.
for script in postinst prerm postrm; do
    install -m 0755 "$REPO/packaging/debian/$script" "$ROOT/DEBIAN/$script"
done
echo /etc/vllmwatch/vllmwatch.toml > "$ROOT/DEBIAN/conffiles"
SIZE=$(du -sk --exclude=DEBIAN "$ROOT" | cut -f1)
sed -e "s|@VERSION@|$VERSION|" -e "s|@ARCH@|$ARCH|" -e "s|@SIZE@|$SIZE|" \
    -e "s|@MAINTAINER@|$MAINTAINER|" -e "s|@PYVER@|$PYVER|" -e "s|@PYNEXT@|$PYNEXT|" \
    "$REPO/packaging/debian/control.in" > "$ROOT/DEBIAN/control"
(cd "$ROOT" && find . -type f ! -path './DEBIAN/*' -printf '%P\0' | LC_ALL=C sort -z \
    | xargs -0 md5sum) > "$ROOT/DEBIAN/md5sums"

# 4. Build: root-owned files, directories 0755, files 0644 unless executable.
find "$ROOT" -type d -exec chmod 0755 {} +
find "$ROOT" -type f ! -perm -u+x -exec chmod 0644 {} +
find "$ROOT" -type f -perm -u+x -exec chmod 0755 {} +
dpkg-deb --build -Zxz --root-owner-group "$ROOT" "$DEB" >/dev/null
say "built $DEB ($(du -h "$DEB" | cut -f1))"
