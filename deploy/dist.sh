#!/bin/sh
# dist.sh — makes the desktop distribution: pi-remote (release build) and, beside it, the pi-host
# releases it installs on remotes, for x86_64 and aarch64, with their manifest.
#
#   deploy/dist.sh [--out PREFIX] [--arch x86_64|aarch64]...
#
# Writes PREFIX/bin/pi-remote and PREFIX/share/pi-remote/release/ (deploy/release.sh's output:
# manifest.json, one tarball per architecture, install.sh). `pi-remote connect` finds that
# release by itself (bootstrap/src/provision/release.rs, `search_path`), so no --release-dir is
# needed. PREFIX defaults to dist/pi-remote; `--out ~/.local` puts pi-remote on the usual PATH.
# Needs what release.sh needs (it installs cargo-zigbuild and zig into a cache when missing).

set -eu

here=$(cd "$(dirname "$0")" && pwd -P)
repo=$(dirname "$here")

die() {
    printf 'dist.sh: %s\n' "$*" >&2
    exit 1
}

OUT=$repo/dist/pi-remote ARCHES=''
while [ $# -gt 0 ]; do
    case $1 in
        --out | --arch)
            [ $# -ge 2 ] || die "$1 needs a value"
            case $1 in
                --out) OUT=$2 ;;
                --arch) ARCHES="$ARCHES $2" ;;
            esac
            shift 2
            ;;
        -h | --help)
            echo 'dist.sh [--out PREFIX] [--arch x86_64|aarch64]...'
            exit 0
            ;;
        *) die "unknown argument $1 (dist.sh [--out PREFIX] [--arch x86_64|aarch64]...)" ;;
    esac
done
[ -n "$ARCHES" ] || ARCHES='x86_64 aarch64'

mkdir -p "$OUT/bin" "$OUT/share/pi-remote/release" || die "cannot create $OUT"
OUT=$(cd "$OUT" && pwd -P)
target=${CARGO_TARGET_DIR:-$repo/target}
(cd "$repo" && cargo build --release --locked -p bootstrap --bin pi-remote) ||
    die "cargo build of pi-remote failed"
cp "$target/release/pi-remote" "$OUT/bin/pi-remote.tmp" && mv -f "$OUT/bin/pi-remote.tmp" "$OUT/bin/pi-remote" ||
    die "cannot write $OUT/bin/pi-remote"
for arch in $ARCHES; do
    "$here/release.sh" --arch "$arch" --out "$OUT/share/pi-remote/release" >/dev/null ||
        die "release.sh --arch $arch failed"
done
version=$("$OUT/bin/pi-remote" --version | sed 's/^pi-remote //')
printf '%s\n' \
    "pi-remote $version: $OUT/bin/pi-remote" \
    "pi-host $version releases ($(echo $ARCHES | tr ' ' ',')): $OUT/share/pi-remote/release" \
    "pi-remote connect finds them by itself; put $OUT/bin on your PATH."
