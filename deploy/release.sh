#!/bin/sh
# release.sh — packages pi-host for the SSH bootstrapper.
#
#   deploy/release.sh [--arch x86_64|aarch64] [--binary PATH] [--version V] [--out DIR] [--native]
#
# --arch is the Linux architecture to build for (default: this machine's; `arm64` is aarch64).
# Without --binary it builds pi-host itself. On Linux, for x86_64 or aarch64, that is `cargo
# zigbuild --release --locked -p pi-host --target ARCH-unknown-linux-gnu.2.17`: the binary runs on
# glibc 2.17 and later (deploy/README.md, "The glibc floor"), and zig cross-compiles the C code for
# the other architecture. cargo-zigbuild (crates.io) and zig (PyPI's ziglang) are installed into a
# cache directory when missing ($PI_HOST_RELEASE_TOOLS, default ~/.cache/pi-host/release-tools),
# and so is the Rust target's standard library (`rustup target add`). --native builds with plain
# `cargo build --release` instead (other platforms always do; only for this machine's
# architecture). The shipped binary is stripped (ARCH-linux-gnu-objcopy for another
# architecture: Debian's binutils-aarch64-linux-gnu); its debug info stays beside the release as
# pi-host-V-OS-ARCH.debug (not in the manifest, never uploaded).
# The version defaults to what `PATH version --json` reports (for a binary of another
# architecture, pi-host's version in Cargo.toml). Writes into DIR (default dist/):
#   pi-host-V-OS-ARCH.tar.gz   bin/pi-host and share/pi-host.service
#   install.sh, pi-host.service, SHA256SUMS, manifest.json
# Run it once per platform with the same --out to collect several platforms into one release
# (`--arch x86_64`, then `--arch aarch64`): when DIR/manifest.json has the same version, its
# artifacts are merged (the entry for the same os/arch is replaced). Merging needs python3;
# without it the manifest is rewritten with this platform only (a warning says so). A different
# version in DIR/manifest.json is replaced.

set -eu

here=$(cd "$(dirname "$0")" && pwd -P)
repo=$(dirname "$here")

die() {
    printf 'release.sh: %s\n' "$*" >&2
    exit 1
}

# An architecture as `uname -m` may print it, as the manifest names it.
normalize_arch() {
    case $1 in
        amd64 | x64) echo x86_64 ;;
        arm64) echo aarch64 ;;
        *) echo "$1" ;;
    esac
}

usage='release.sh [--arch x86_64|aarch64] [--binary PATH] [--version V] [--out DIR] [--native]'
BINARY='' VERSION='' OUT=dist NATIVE='' ARCH=''
while [ $# -gt 0 ]; do
    case $1 in
        --arch | --binary | --version | --out)
            [ $# -ge 2 ] || die "$1 needs a value"
            case $1 in
                --arch) ARCH=$(normalize_arch "$2") ;;
                --binary) BINARY=$2 ;;
                --version) VERSION=$2 ;;
                --out) OUT=$2 ;;
            esac
            shift 2
            ;;
        --native)
            NATIVE=yes
            shift
            ;;
        -h | --help)
            sed -n '2,25p' "$0"
            exit 0
            ;;
        *) die "unknown argument '$1' (usage: $usage)" ;;
    esac
done

os=$(uname -s | tr '[:upper:]' '[:lower:]')
host_arch=$(normalize_arch "$(uname -m)")
[ -n "$ARCH" ] || ARCH=$host_arch
arch=$ARCH
case $arch in
    '' | *[!a-z0-9_]*) die "bad architecture '$arch' (as uname -m prints it: x86_64, aarch64)" ;;
esac
# A build for another architecture: it cannot run here, and is made with zig for Linux only.
foreign=''
[ "$arch" = "$host_arch" ] || foreign=yes

# The oldest glibc the Linux builds run on (deploy/README.md, "The glibc floor").
GLIBC_FLOOR=2.17
ZIGBUILD_VERSION=0.24.1
ZIG_VERSION=0.15.2
tools=${PI_HOST_RELEASE_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/pi-host/release-tools}
target_dir=${CARGO_TARGET_DIR:-$repo/target}

# cargo-zigbuild from crates.io and zig from PyPI, each into its own versioned directory of the
# cache, installed under a temporary name and renamed, so a broken install is never used.
install_tools() {
    zigbuild_dir=$tools/cargo-zigbuild-$ZIGBUILD_VERSION
    if [ ! -x "$zigbuild_dir/bin/cargo-zigbuild" ]; then
        printf 'release.sh: installing cargo-zigbuild %s into %s\n' "$ZIGBUILD_VERSION" "$zigbuild_dir" >&2
        mkdir -p "$tools"
        rm -rf "$zigbuild_dir.tmp"
        cargo install --quiet --locked --version "$ZIGBUILD_VERSION" --root "$zigbuild_dir.tmp" \
            cargo-zigbuild || die "cargo install cargo-zigbuild failed"
        rm -rf "$zigbuild_dir"
        mv "$zigbuild_dir.tmp" "$zigbuild_dir"
    fi
    zig_dir=$tools/ziglang-$ZIG_VERSION
    if [ ! -x "$zig_dir/ziglang/zig" ]; then
        printf 'release.sh: installing zig %s (PyPI ziglang) into %s\n' "$ZIG_VERSION" "$zig_dir" >&2
        command -v python3 >/dev/null 2>&1 || die "python3 is needed to install zig from PyPI"
        mkdir -p "$tools"
        rm -rf "$zig_dir.tmp"
        python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
            --target "$zig_dir.tmp" "ziglang==$ZIG_VERSION" || die "pip install ziglang failed"
        rm -rf "$zig_dir"
        mv "$zig_dir.tmp" "$zig_dir"
    fi
    PATH=$zig_dir/ziglang:$zigbuild_dir/bin:$PATH
    export PATH
}

# The Rust target's standard library, added with rustup when it is missing.
ensure_rust_target() {
    command -v rustup >/dev/null 2>&1 || return 0
    if ! rustup target list --installed 2>/dev/null | grep -qx "$1"; then
        printf 'release.sh: adding the Rust target %s (rustup target add)\n' "$1" >&2
        rustup target add "$1" >&2 || die "rustup target add $1 failed"
    fi
}

if [ -z "$BINARY" ]; then
    if [ -z "$NATIVE" ] && [ "$os" = linux ] && { [ "$arch" = x86_64 ] || [ "$arch" = aarch64 ]; }; then
        install_tools
        ensure_rust_target "$arch-unknown-linux-gnu"
        (cd "$repo" && cargo zigbuild --release --locked -p pi-host \
            --target "$arch-unknown-linux-gnu.$GLIBC_FLOOR") || die "cargo zigbuild failed"
        BINARY=$target_dir/$arch-unknown-linux-gnu/release/pi-host
        CHECK_FLOOR=yes
    elif [ -n "$foreign" ] && [ -n "$NATIVE" ]; then
        die "--native builds for this machine's architecture ($host_arch) only: drop it to cross-build for $arch with zig"
    elif [ -n "$foreign" ]; then
        die "a build for $arch on $os-$host_arch: release.sh cross-builds with zig on Linux, for x86_64 or aarch64 only (or give the binary with --binary)"
    else
        (cd "$repo" && cargo build --release --locked -p pi-host) || die "cargo build failed"
        BINARY=$target_dir/release/pi-host
    fi
fi
[ -x "$BINARY" ] || die "$BINARY is not an executable"

# The highest GLIBC_x.y version the binary's dynamic symbols need (empty when none). readelf
# reads the symbol versions of an ELF file of any architecture.
glibc_needed() {
    readelf -W --dyn-syms "$1" 2>/dev/null | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -t. -k1,1n -k2,2n -k3,3n | tail -1
}
if [ "${CHECK_FLOOR:-}" = yes ]; then
    needed=$(glibc_needed "$BINARY")
    highest=$(printf '%s\n%s\n' "$GLIBC_FLOOR" "$needed" | sort -t. -k1,1n -k2,2n -k3,3n | tail -1)
    [ "$highest" = "$GLIBC_FLOOR" ] ||
        die "$BINARY needs GLIBC_$needed, above the floor $GLIBC_FLOOR"
fi

if [ -z "$VERSION" ] && [ -n "$foreign" ]; then
    # `cargo pkgid` prints path+file:///…/pi-host#0.1.0 (or …#pi-host@0.1.0).
    VERSION=$(cd "$repo" && cargo pkgid -p pi-host | sed 's/.*[#@]//')
    [ -n "$VERSION" ] || die "cargo pkgid -p pi-host did not report a version"
elif [ -z "$VERSION" ]; then
    VERSION=$("$BINARY" version --json | sed -n 's/.*"version":[ ]*"\([^"]*\)".*/\1/p')
    [ -n "$VERSION" ] || die "$BINARY version --json did not report a version"
fi
case $VERSION in
    .* | *[!A-Za-z0-9._+-]*) die "bad version '$VERSION' (letters, digits and ._+- only)" ;;
esac

sha256() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | cut -d' ' -f1
    else
        shasum -a 256 "$1" | cut -d' ' -f1
    fi
}

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd -P)
# Staged inside OUT so the final renames are atomic (same file system).
stage=$(mktemp -d "$OUT/.release.XXXXXX")
trap 'rm -rf "$stage"' EXIT

# The tarball: the binary and the unit template (install.sh renders it from the installed
# version, so the unit always matches the binary it starts).
mkdir -p "$stage/pkg/bin" "$stage/pkg/share"
# Shipped stripped; the debug info goes beside the release, linked by name (.gnu_debuglink) so
# gdb and addr2line find it for symbolication. Without objcopy (macOS), or for a binary objcopy
# does not read (a script standing in for pi-host in tests), it ships as is; but a zig build
# always ships stripped. This machine's objcopy reads its own architecture only: another's
# binaries need that architecture's (ARCH-linux-gnu-objcopy).
objcopy=objcopy
[ -z "$foreign" ] || objcopy=$arch-linux-gnu-objcopy
if [ "${CHECK_FLOOR:-}" = yes ] && ! command -v "$objcopy" >/dev/null 2>&1; then
    die "$objcopy is needed to strip the $arch build (Debian: apt-get install binutils-$arch-linux-gnu)"
fi
debug_file=pi-host-$VERSION-$os-$arch.debug
if command -v "$objcopy" >/dev/null 2>&1 && [ "$os" = linux ] &&
    "$objcopy" --only-keep-debug "$BINARY" "$stage/$debug_file" 2>/dev/null; then
    "$objcopy" --strip-all "$BINARY" "$stage/pi-host.stripped"
    (cd "$stage" && "$objcopy" --add-gnu-debuglink="$debug_file" pi-host.stripped pkg/bin/pi-host)
    rm -f "$stage/pi-host.stripped"
    chmod 644 "$stage/$debug_file"
elif [ "${CHECK_FLOOR:-}" = yes ]; then
    die "$objcopy could not read $BINARY to strip it"
else
    rm -f "$stage/$debug_file"
    cp "$BINARY" "$stage/pkg/bin/pi-host"
    debug_file=''
fi
cp "$here/pi-host.service" "$stage/pkg/share/pi-host.service"
chmod 755 "$stage/pkg/bin" "$stage/pkg/share" "$stage/pkg/bin/pi-host"
chmod 644 "$stage/pkg/share/pi-host.service"

artifact=pi-host-$VERSION-$os-$arch.tar.gz
if tar --version 2>/dev/null | grep -q 'GNU tar'; then
    # Byte-for-byte reproducible: fixed order, times and owners; gzip without name or time.
    tar --sort=name --mtime="@${SOURCE_DATE_EPOCH:-0}" --owner=0 --group=0 --numeric-owner \
        --format=gnu -cf - -C "$stage/pkg" bin share | gzip -n >"$stage/$artifact"
else
    tar -cf - -C "$stage/pkg" bin share | gzip -n >"$stage/$artifact"
fi
cp "$here/install.sh" "$stage/install.sh"
chmod 755 "$stage/install.sh"
cp "$here/pi-host.service" "$stage/pi-host.service"
for f in "$artifact" install.sh pi-host.service $debug_file; do
    mv -f "$stage/$f" "$OUT/$f"
done

size=$(wc -c <"$OUT/$artifact" | tr -d ' ')
# The oldest glibc the build runs on, for the bootstrapper's platform check (empty: not linked
# against glibc). The zig build was linked against the floor's symbols; another build needs at
# least the highest version its symbols name.
min_glibc=''
if [ "$os" = linux ]; then
    if [ "${CHECK_FLOOR:-}" = yes ]; then min_glibc=$GLIBC_FLOOR; else min_glibc=$(glibc_needed "$BINARY" || true); fi
fi
entry_sha=$(sha256 "$OUT/$artifact")
installer_sha=$(sha256 "$OUT/install.sh")
unit_sha=$(sha256 "$OUT/pi-host.service")

# manifest.json, then SHA256SUMS for every file it names.
if command -v python3 >/dev/null 2>&1; then
    files=$(python3 - "$OUT/manifest.json" "$VERSION" "$os" "$arch" "$artifact" "$entry_sha" \
        "$size" "$installer_sha" "$unit_sha" "$min_glibc" <<'EOF'
import json, os, sys
path, version, os_, arch, file, sha, size, installer_sha, unit_sha, min_glibc = sys.argv[1:]
artifacts = []
try:
    with open(path) as f:
        old = json.load(f)
    if old.get("version") == version:
        artifacts = [a for a in old.get("artifacts", [])
                     if (a.get("os"), a.get("arch")) != (os_, arch)
                     and os.path.exists(os.path.join(os.path.dirname(path), a.get("file", "")))]
    else:
        print(f"release.sh: replacing the manifest of version {old.get('version')}", file=sys.stderr)
except FileNotFoundError:
    pass
entry = {"os": os_, "arch": arch, "file": file, "sha256": sha, "size": int(size)}
if min_glibc:
    entry["glibc"] = min_glibc
artifacts.append(entry)
artifacts.sort(key=lambda a: (a["os"], a["arch"]))
manifest = {
    "version": version,
    "artifacts": artifacts,
    "installer": {"file": "install.sh", "sha256": installer_sha},
    "unit": {"file": "pi-host.service", "sha256": unit_sha},
}
tmp = path + ".tmp"
with open(tmp, "w") as f:
    json.dump(manifest, f, indent=2)
    f.write("\n")
os.replace(tmp, path)
for a in artifacts:
    print(a["file"])
EOF
    )
else
    [ ! -f "$OUT/manifest.json" ] ||
        printf 'release.sh: no python3: manifest.json rewritten with %s-%s only\n' "$os" "$arch" >&2
    glibc_json=''
    [ -z "$min_glibc" ] || glibc_json=", \"glibc\": \"$min_glibc\""
    cat >"$OUT/manifest.json.tmp" <<EOF
{
  "version": "$VERSION",
  "artifacts": [
    {"os": "$os", "arch": "$arch", "file": "$artifact", "sha256": "$entry_sha", "size": $size$glibc_json}
  ],
  "installer": {"file": "install.sh", "sha256": "$installer_sha"},
  "unit": {"file": "pi-host.service", "sha256": "$unit_sha"}
}
EOF
    mv -f "$OUT/manifest.json.tmp" "$OUT/manifest.json"
    files=$artifact
fi

: >"$stage/SHA256SUMS"
for f in $files install.sh pi-host.service; do
    printf '%s  %s\n' "$(sha256 "$OUT/$f")" "$f" >>"$stage/SHA256SUMS"
done
mv -f "$stage/SHA256SUMS" "$OUT/SHA256SUMS"

printf 'release version=%s artifact=%s size=%s glibc=%s dir=%s\n' "$VERSION" "$OUT/$artifact" \
    "$size" "$(glibc_needed "$BINARY" || true)" "$OUT"
