#!/bin/sh
# release.sh — packages pi-host for the platform it runs on, for the SSH bootstrapper.
#
#   deploy/release.sh [--binary PATH] [--version V] [--out DIR]
#
# Without --binary it builds `cargo build --release --locked -p pi-host`. The version defaults to
# what `PATH version --json` reports. Writes into DIR (default dist/):
#   pi-host-V-OS-ARCH.tar.gz   bin/pi-host and share/pi-host.service
#   install.sh, pi-host.service, SHA256SUMS, manifest.json
# Run it once per platform with the same --out to collect several platforms into one release:
# when DIR/manifest.json has the same version, its artifacts are merged (the entry for the same
# os/arch is replaced). Merging needs python3; without it the manifest is rewritten with this
# platform only (a warning says so). A different version in DIR/manifest.json is replaced.

set -eu

here=$(cd "$(dirname "$0")" && pwd -P)
repo=$(dirname "$here")

die() {
    printf 'release.sh: %s\n' "$*" >&2
    exit 1
}

BINARY='' VERSION='' OUT=dist
while [ $# -gt 0 ]; do
    case $1 in
        --binary | --version | --out)
            [ $# -ge 2 ] || die "$1 needs a value"
            case $1 in
                --binary) BINARY=$2 ;;
                --version) VERSION=$2 ;;
                --out) OUT=$2 ;;
            esac
            shift 2
            ;;
        -h | --help)
            sed -n '2,14p' "$0"
            exit 0
            ;;
        *) die "unknown argument '$1' (usage: release.sh [--binary PATH] [--version V] [--out DIR])" ;;
    esac
done

if [ -z "$BINARY" ]; then
    (cd "$repo" && cargo build --release --locked -p pi-host)
    BINARY=$repo/target/release/pi-host
fi
[ -x "$BINARY" ] || die "$BINARY is not an executable"

if [ -z "$VERSION" ]; then
    VERSION=$("$BINARY" version --json | sed -n 's/.*"version":[ ]*"\([^"]*\)".*/\1/p')
    [ -n "$VERSION" ] || die "$BINARY version --json did not report a version"
fi
case $VERSION in
    .* | *[!A-Za-z0-9._+-]*) die "bad version '$VERSION' (letters, digits and ._+- only)" ;;
esac

os=$(uname -s | tr '[:upper:]' '[:lower:]')
arch=$(uname -m)
case $arch in
    amd64) arch=x86_64 ;;
    arm64) arch=aarch64 ;;
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
cp "$BINARY" "$stage/pkg/bin/pi-host"
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
for f in "$artifact" install.sh pi-host.service; do
    mv -f "$stage/$f" "$OUT/$f"
done

size=$(wc -c <"$OUT/$artifact" | tr -d ' ')
entry_sha=$(sha256 "$OUT/$artifact")
installer_sha=$(sha256 "$OUT/install.sh")
unit_sha=$(sha256 "$OUT/pi-host.service")

# manifest.json, then SHA256SUMS for every file it names.
if command -v python3 >/dev/null 2>&1; then
    files=$(python3 - "$OUT/manifest.json" "$VERSION" "$os" "$arch" "$artifact" "$entry_sha" \
        "$size" "$installer_sha" "$unit_sha" <<'EOF'
import json, os, sys
path, version, os_, arch, file, sha, size, installer_sha, unit_sha = sys.argv[1:]
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
artifacts.append({"os": os_, "arch": arch, "file": file, "sha256": sha, "size": int(size)})
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
    cat >"$OUT/manifest.json.tmp" <<EOF
{
  "version": "$VERSION",
  "artifacts": [
    {"os": "$os", "arch": "$arch", "file": "$artifact", "sha256": "$entry_sha", "size": $size}
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

printf 'release version=%s artifact=%s dir=%s\n' "$VERSION" "$OUT/$artifact" "$OUT"
