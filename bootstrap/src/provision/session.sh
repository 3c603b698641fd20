# The one remote command of a connect (remote_shell::session_script puts R, W, N, A and M before
# it: the install root as a shell word, the version wanted, this connect's staging directory
# name, the pi version wanted and the mark that ends the config line a connect writes).
# POSIX sh: the login shell may be bash, dash or busybox ash. Nothing is written to or run from
# /tmp. Full-line comments and indentation are stripped before it is sent.
umask 077
# CDPATH would send the relative `cd`s below elsewhere (and make bash print where they went).
unset CDPATH

# The probe. On the warm path it runs on every connect, so up to `probe-end` it uses builtins
# only, but for the permission check and the status query: each fork and exec is paid again on
# each connect.
[ -d "$R" ] || mkdir -p "$R" || exit 97
cd -P "$R" || exit 97
R=$PWD
echo "root=$R"
# What runs from the root runs as this user: like OpenSSH's StrictModes, the root, what
# `current` leads to, its bin/pi-host and install.sh must be this user's and writable by no one
# else, or nothing of it is run (remote_shell::Unsafe). `x/` follows a link to a directory.
for f in "$R/" "$R/current/" "$R/current/bin/" "$R/current/bin/pi-host" "$R/install.sh"; do
    if [ -e "$f" ] && [ ! -O "$f" ]; then echo "unsafe=owner $f"; exit 96; fi
done
w=$(find "$R/" "$R/current/" "$R/current/bin/" "$R/current/bin/pi-host" "$R/install.sh" -prune \( -perm -0020 -o -perm -0002 \) -print 2>/dev/null)
if [ -n "$w" ]; then echo "unsafe=writable ${w%%
*}"; exit 96; fi
c=
if [ -L current ] && cd -P ./current 2>/dev/null; then
    c=${PWD##*/}
    echo "current=$PWD"
    cd "$R" || exit 97
fi
# `pi-host` on the user's PATH (deploy/README.md, "The host's own CLI"): a link in ~/.local/bin
# when that directory exists or is on PATH, made only where nothing is (or a dangling link),
# never over the user's own; `cli=` names it when it leads to this root's host.
cli() {
    L=${HOME:-/nonexistent}/.local/bin/pi-host
    case ":$PATH:" in *":${L%/*}:"*) [ -d "${L%/*}" ] || mkdir -p "${L%/*}" 2>/dev/null ;; esac
    if [ -d "${L%/*}" ] && [ ! -e "$L" ]; then ln -sf "$R/current/bin/pi-host" "$L" 2>/dev/null; fi
    if [ "$L" -ef "$R/current/bin/pi-host" ] 2>/dev/null; then echo "cli=$L"; fi
}
if [ -n "$c" ]; then cli; fi
i=
if [ -f install.sh ]; then i=yes; echo installer=yes; fi
if [ -x current/bin/pi-host ] && [ -S data/admin.sock ]; then
    s=$(current/bin/pi-host --data-dir data status --json 2>/dev/null) && echo "status=$s"
fi
# The config's agent line: the one a connect wrote ends with the mark; another is the
# operator's, and then the agent is theirs.
g=
if [ -f config.toml ]; then
    while IFS= read -r l || [ -n "$l" ]; do
        case $l in
            agent=* | 'agent '* | 'agent	'*)
                echo "agentconf=$l"
                case $l in *"$M") g=${g:-ours} ;; *) g=other ;; esac
                ;;
        esac
    done <config.toml
fi
a=
if [ "$g" != other ] && [ -x "data/agent/versions/$A/bin/pi" ]; then a=yes; echo "agentv=$A"; fi
# The platform (OS, architecture, C library) and the SHA-256 tool matter only for an install,
# and the bootstrapper installs only when `current` is not the wanted version or install.sh is
# missing, or its own agent is not installed: the same test as here.
if [ "$c" != "$W" ] || [ -z "$i" ] || { [ "$g" != other ] && [ -z "$a" ]; }; then
    echo "os=$(uname -s)"
    echo "arch=$(uname -m)"
    if v=$(getconf GNU_LIBC_VERSION 2>/dev/null) && [ -n "$v" ]; then echo "libc=$v"
    else echo "ldd=$(ldd --version 2>&1 | head -n 2 | tr '\n' ' ')"; fi
    for f in /lib/ld-musl-*.so.1; do [ -e "$f" ] && echo "musl=$f" && break; done
    if command -v sha256sum >/dev/null 2>&1; then echo sha=sha256sum
    elif command -v shasum >/dev/null 2>&1; then echo 'sha=shasum -a 256'; fi
    # The agent the host will drive: the login shell's Node, and a pi already there (a running
    # host reports its own check in `status` instead).
    if n=$(command -v node 2>/dev/null) && [ -n "$n" ]; then
        echo "nodebin=$n"
        echo "node=$("$n" --version 2>/dev/null)"
        if [ -x "${n%/*}/npm" ]; then echo "npmbin=${n%/*}/npm"
        elif m=$(command -v npm 2>/dev/null) && [ -n "$m" ]; then echo "npmbin=$m"; fi
    fi
    for p in "$(command -v pi 2>/dev/null)" "${HOME:-/nonexistent}/.local/bin/pi" "${HOME:-/nonexistent}/.npm-global/bin/pi"; do
        if [ -n "$p" ] && [ -x "$p" ]; then echo "pi=$p"; break; fi
    done
fi
echo probe-end

# The plan (remote_shell::Plan::line); EOF instead is the warm path. The shell reads commands
# one at a time, so nothing below is even parsed then.
IFS= read -r plan || exit 0
set -f
set -- $plan
set +f
[ "${1:-}" = go ] || exit 0
STOP=$2 INSTALL=$3 START=$4 MINT=$5 V=$6 ART=$7 ASHA=$8 ISHA=$9 ILEN=${10}
AP=${11:--} AV=${12:--} AC=${13:--} AS=${14:-npm} BSHA=${15:--} ALEN=${16:-0}

# Copies exactly $2 bytes of stdin to $1. The build follows on stdin, so nothing may read past
# them: dd reads at most bs bytes, and a pipe may hand over fewer, hence the loop (`read` and
# head -c would do one byte per call, or read ahead).
take() {
    : >"$1" || return 1
    n=0
    while [ "$n" -lt "$2" ]; do
        dd bs=$(($2 - n)) count=1 2>/dev/null >>"$1" || return 1
        m=$(wc -c <"$1") || return 1
        # EOF before the last byte: the bootstrapper went away.
        [ "$m" -gt "$n" ] || return 1
        n=$((m))
    done
}

if [ "$INSTALL" = 1 ] || [ "$AS" = bundle ]; then
    SHA=sha256sum
    command -v sha256sum >/dev/null 2>&1 || SHA='shasum -a 256'
    D=$R/staging/$N
    find "$R/staging" -mindepth 1 -maxdepth 1 -mmin +60 -exec rm -rf {} + 2>/dev/null
    mkdir -p "$D" || exit 90
    trap 'rm -rf "$D"' EXIT
    echo stage=transfer
    # install.sh, the build, then the agent bundle; the last one to EOF.
    if [ "$INSTALL" = 1 ]; then take "$D/install.sh" "$ILEN" || exit 91; fi
    if [ "$INSTALL" = 1 ] && [ "$AS" = bundle ]; then
        take "$D/$ART" "$ALEN" || exit 91
        got=$($SHA <"$D/$ART") || exit 93
        asum=${got%% *}
    elif [ "$INSTALL" = 1 ]; then
        # Hashed as it lands (no second pass over it).
        got=$( (tee "$D/$ART" || echo tee-failed) | $SHA) || exit 91
        asum=${got%% *}
    fi
    if [ "$AS" = bundle ]; then
        # The bundle unpacks as it arrives, into a directory nothing runs from until the
        # bundle's SHA-256 matched (below); a failed unpack still reads the rest, so the sum
        # says whether the bytes were the ones sent.
        U=$R/data/agent/versions/.$AV.tmp.$N
        mkdir -p "$U" || exit 80
        trap 'rm -rf "$D" "$U"' EXIT
        tee "$D/agent.tar.gz" | { (cd "$U" && gzip -dc | tar -xf -) || { : >"$D/unpack-failed"; cat >/dev/null; }; }
    fi
    echo stage=verify
    if [ "$INSTALL" = 1 ]; then
        got=$($SHA <"$D/install.sh") || exit 93
        isum=${got%% *}
        echo "verified=$ART $asum"
        echo "verified=install.sh $isum"
        # Nothing runs before both match the manifest.
        [ "$asum" = "$ASHA" ] || { echo "$ART arrived with another SHA-256 than the manifest's" >&2; exit 92; }
        [ "$isum" = "$ISHA" ] || { echo "install.sh arrived with another SHA-256 than the manifest's" >&2; exit 92; }
    fi
    if [ "$AS" = bundle ]; then
        got=$($SHA <"$D/agent.tar.gz") || exit 93
        bsum=${got%% *}
        echo "verified=agent.tar.gz $bsum"
        [ "$bsum" = "$BSHA" ] || { echo "agent.tar.gz arrived with another SHA-256 than the bundle's" >&2; exit 92; }
    fi
fi
# The agent (provision/agent.rs), before the build is installed: when it fails, nothing of the
# host, of its config or of the agent it runs has changed.
if [ "$AP" != - ]; then
    echo stage=agent
    G=$R/data/agent
    P=$G/versions/$AV
    mkdir -p "$G/versions" || exit 80
    # Staging left by a connect that died (a live one's is younger than that).
    find "$G/versions" -mindepth 1 -maxdepth 1 -name '.*.tmp.*' ! -name ".$AV.tmp.$N" -mmin +60 -exec rm -rf {} + 2>/dev/null
    # A copy that runs is kept (a config rewritten, a host restarted); else the unpacked
    # bundle goes in, or npm installs one.
    if ! v=$(PATH="$P/bin:$PATH" "$P/bin/pi" --version 2>&1) || [ "${v##*"$AV"*}" = "$v" ]; then
        if [ "$AS" = bundle ]; then
            T=$U
            [ ! -e "$D/unpack-failed" ] ||
                { echo "the agent bundle could not be unpacked in $G (is the disk full? gzip and tar are needed)" >&2; exit 86; }
            # A bundle without Node runs with the remote's own.
            if [ ! -e "$T/bin/node" ]; then
                n=$(command -v node 2>/dev/null) || { echo "the remote has no node on its PATH" >&2; exit 81; }
                ln -s "$n" "$T/bin/node" || exit 83
            fi
            # The bundle's bytes are the ones made from the pinned tree (its SHA-256 matched):
            # what can still fail here is Node on this machine, and pi's version is in its
            # package.json, so pi is not loaded just to print it (a second or more).
            "$T/bin/node" --version >/dev/null 2>&1 || { echo "Node in the agent bundle does not run here ($T/bin/node --version failed)" >&2; exit 84; }
            v=$(sed -n 's/^[[:space:]]*"version":[[:space:]]*"\([^"]*\)".*/\1/p' "$T/lib/node_modules/$AP/package.json" 2>/dev/null)
        else
            T=$G/versions/.$AV.tmp.$N
            trap 'rm -rf "$T" ${D:+"$D"}' EXIT
            n=$(command -v node 2>/dev/null) || { echo "the remote has no node on its PATH" >&2; exit 81; }
            m=${n%/*}/npm
            [ -x "$m" ] || m=$(command -v npm 2>/dev/null) || { echo "the remote has no npm beside $n or on its PATH" >&2; exit 81; }
            # A registry that does not answer fails within minutes, not npm's default half hour.
            out=$(PATH="${n%/*}:$PATH" "$m" install --global --prefix "$T" --no-audit --no-fund --no-update-notifier --loglevel=error --prefer-offline --fetch-timeout=60000 --fetch-retry-maxtimeout=10000 "$AP@$AV" 2>&1) ||
                { printf '%s\n' "$out" | tail -n 8 >&2; echo "npm install $AP@$AV failed (npm's output above): the remote's npm must reach a registry, or name your own agent in $R/config.toml" >&2; exit 82; }
            # The Node npm ran with goes beside pi: the host runs pi with it, whatever its PATH.
            ln -s "$n" "$T/bin/node" || exit 83
            v=$(PATH="$T/bin:$PATH" "$T/bin/pi" --version 2>&1) || { printf '%s\n' "$v" | tail -n 5 >&2; echo "the installed pi does not run" >&2; exit 84; }
        fi
        [ "${v##*"$AV"*}" != "$v" ] || { echo "the installed pi says it is $v, not $AV" >&2; exit 84; }
        if [ -e "$P" ]; then mv "$P" "$G/versions/.$AV.tmp.old.$N" || exit 83; fi
        mv "$T" "$P" || exit 83
        rm -rf "$G/versions/.$AV.tmp.old.$N"
    fi
    C=$R/config.toml
    o=
    [ ! -f "$C" ] || o=$(sed -n "/$M\$/p" "$C" | head -n 1)
    { printf "$AC"; echo; [ ! -f "$C" ] || sed "/$M\$/d" "$C"; } >"$C.tmp.$N" && mv -f "$C.tmp.$N" "$C" || { rm -f "$C.tmp.$N"; exit 85; }
    # Kept: this version and the one the config named before (a host may still run it).
    o=${o#*/data/agent/versions/}
    o=${o%%/*}
    for d in "$G"/versions/*; do
        [ -d "$d" ] || continue
        case ${d##*/} in "$AV" | "$o") ;; *) rm -rf "$d" ;; esac
    done
    echo "agent=pi $AV"
fi
if [ "$INSTALL" = 1 ]; then
    echo stage=install
    out=$(sh "$D/install.sh" install --root "$R" --version "$V" --artifact "$D/$ART") || exit $?
    echo "installed=$(printf '%s\n' "$out" | tail -n 1)"
    cli
fi
if [ "$START" = 1 ]; then
    echo stage=start
    if [ "$STOP" = 1 ]; then sh "$R/install.sh" stop --root "$R" >/dev/null || exit $?; fi
    out=$(sh "$R/install.sh" start --reuse --root "$R") || exit $?
    echo "state=$(printf '%s\n' "$out" | tail -n 1)"
fi
if [ "$MINT" = 1 ]; then
    echo stage=pair
    out=$("$R/current/bin/pi-host" --data-dir "$R/data" pair --json --roles owner --ttl 2m) || exit $?
    echo "pair=$(printf '%s' "$out" | tr -d '\n')"
fi
