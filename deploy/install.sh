#!/bin/sh
# install.sh — installs, starts, stops and reports one pi-host under an install root.
#
#   install.sh install --root R --version V [--artifact PATH.tar.gz]
#   install.sh start   --root R [--wait-seconds N] [--mode auto|systemd|detached] [--reuse]
#   install.sh stop    --root R [--wait-seconds N]
#   install.sh status  --root R
#
# Layout under R: versions/<V>/bin/pi-host, current -> versions/<V>, install.sh (this script,
# as last installed), staging/ (uploads), data/ (the host's data dir), config.toml (optional),
# state.json (written by `pi-host serve --state-file`), host.log (+ host.log.1).
#
# POSIX sh on purpose: the remote may be a minimal Debian, Alpine (busybox) or macOS.
# Exit codes: 0 ok; 10 lock busy; 11 bad usage; 12 artifact missing/corrupt; 13 binary does not
# run here; 14 switching `current` failed; 20 the host exited while starting (or nothing is
# installed); 21 the host did not report its address in time. deploy/README.md has the details.

set -u
umask 077

PROG=install.sh

say() { printf '%s\n' "$*"; }
warn() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() {
    code=$1
    shift
    warn "$*"
    exit "$code"
}

usage() {
    die 11 "usage: install.sh install|start|stop|status --root DIR [--version V] [--artifact FILE] [--wait-seconds N] [--mode auto|systemd|detached] ($*)"
}

# ---------------------------------------------------------------------------------------------
# Arguments

[ $# -ge 1 ] || usage "no subcommand"
COMMAND=$1
shift
ROOT='' VERSION='' ARTIFACT='' WAIT='' MODE=auto REUSE=no
while [ $# -gt 0 ]; do
    case $1 in
        --*=*)
            opt=${1%%=*} val=${1#*=}
            shift
            set -- "$opt" "$val" "$@"
            continue
            ;;
        --root | --version | --artifact | --wait-seconds | --mode)
            [ $# -ge 2 ] || usage "$1 needs a value"
            case $1 in
                --root) ROOT=$2 ;;
                --version) VERSION=$2 ;;
                --artifact) ARTIFACT=$2 ;;
                --wait-seconds) WAIT=$2 ;;
                --mode) MODE=$2 ;;
            esac
            shift 2
            ;;
        --reuse)
            REUSE=yes
            shift
            ;;
        *) usage "unknown argument '$1'" ;;
    esac
done

case $COMMAND in
    install | start | stop | status) ;;
    *) usage "unknown subcommand '$COMMAND'" ;;
esac
[ -n "$ROOT" ] || usage "--root is required"
case $WAIT in
    '') ;;
    *[!0-9]*) usage "--wait-seconds must be a whole number" ;;
esac
case $MODE in
    auto | systemd | detached) ;;
    *) usage "--mode must be auto, systemd or detached" ;;
esac

# An absolute, symlink-free root: the systemd unit and the daemon must not depend on the cwd.
case $COMMAND in
    install | start) mkdir -p "$ROOT" || die 11 "cannot create root $ROOT" ;;
esac
if [ -d "$ROOT" ]; then
    ROOT=$(cd "$ROOT" && pwd -P) || die 11 "cannot enter root $ROOT"
fi
STATE=$ROOT/state.json
LOG=$ROOT/host.log

# ---------------------------------------------------------------------------------------------
# Helpers

now() { date +%s; }

# One polling interval: 20 ms where sleep takes fractions (GNU, busybox, macOS), else 1 s. The
# first call only finds out which (a 1 ms sleep), so a wait that is over at once costs nothing.
TICK=
tick() {
    if [ -z "$TICK" ]; then
        if sleep 0.001 2>/dev/null; then TICK=0.02; else TICK=1; fi
        return 0
    fi
    sleep "$TICK"
}

# A process that exists and is not a zombie (a zombie answers kill -0 until it is reaped, and a
# daemon reparented to a non-reaping init would look alive forever).
alive() {
    [ -n "${1:-}" ] || return 1
    kill -0 "$1" 2>/dev/null || return 1
    if [ -r "/proc/$1/stat" ]; then
        # The state is the field after the ")" that ends the command name.
        st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)
        [ "$st" != Z ] || return 1
    fi
    return 0
}

# A field of a one-line JSON object (state.json): string or number, no nesting needed.
json_field() {
    sed -n "s/.*\"$1\":[ ]*\"\{0,1\}\([^\",}]*\).*/\1/p" "$2" 2>/dev/null | head -n 1
}

# The pid in state.json when that process is a live pi-host, else nothing.
running_pid() {
    [ -s "$STATE" ] || return 0
    pid=$(json_field pid "$STATE")
    case $pid in '' | *[!0-9]*) return 0 ;; esac
    alive "$pid" || return 0
    # A reused pid belongs to some other program: check the name where /proc tells it.
    if [ -r "/proc/$pid/cmdline" ]; then
        tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q 'pi-host' || return 0
    fi
    say "$pid"
}

# rename(2) of a symlink over another: atomic where the tools allow it. GNU and busybox mv take
# -T; macOS mv would follow a symlink to a directory, so use perl's rename there.
replace_link() {
    mv -T "$1" "$2" 2>/dev/null && return 0
    if command -v perl >/dev/null 2>&1; then
        perl -e 'rename($ARGV[0], $ARGV[1]) or exit 1' "$1" "$2" && return 0
    fi
    if command -v python3 >/dev/null 2>&1; then
        python3 -c 'import os, sys; os.replace(sys.argv[1], sys.argv[2])' "$1" "$2" && return 0
    fi
    return 1
}

# Lock against concurrent installs/starts (the bootstrapper may run twice at once). flock where
# it exists; else mkdir, which is atomic everywhere, with the owner pid inside for stale locks.
LOCKDIR_OWNED=
lock() {
    if command -v flock >/dev/null 2>&1; then
        exec 9>>"$ROOT/install.lock" || die 10 "cannot open $ROOT/install.lock"
        flock -w 60 9 || die 10 "another install is in progress (lock $ROOT/install.lock)"
        return 0
    fi
    dir=$ROOT/install.lock.d
    deadline=$(($(now) + 60))
    while ! mkdir "$dir" 2>/dev/null; do
        owner=$(cat "$dir/pid" 2>/dev/null)
        if [ -n "$owner" ] && ! alive "$owner"; then
            # The owner died without its trap: take the stale lock over (renaming first, so
            # two waiters cannot both remove a lock a third one just took).
            mv "$dir" "$dir.stale.$$" 2>/dev/null && rm -rf "$dir.stale.$$"
            continue
        fi
        [ "$(now)" -lt "$deadline" ] || die 10 "another install is in progress (lock $dir)"
        tick
    done
    say "$$" >"$dir/pid"
    LOCKDIR_OWNED=$dir
}

# Everything a failed or interrupted run leaves behind is removed here; `current` and the
# installed versions are only ever changed by renames, so they need no undo.
# One path a line: the root may hold spaces.
CLEAN_PATHS=
clean_on_exit() {
    CLEAN_PATHS="$CLEAN_PATHS
$1"
}
cleanup() {
    set -f
    IFS='
'
    for p in $CLEAN_PATHS; do rm -rf "$p"; done
    [ -z "$LOCKDIR_OWNED" ] || rm -rf "$LOCKDIR_OWNED"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# Runs `bin/pi-host version --json`; on success prints its output.
runs() {
    out=$("$1" version --json 2>"$2") || return 1
    case $out in *'"version"'*) say "$out" ;; *) return 1 ;; esac
}

# ---------------------------------------------------------------------------------------------
# install

cmd_install() {
    [ -n "$VERSION" ] || usage "install needs --version"
    case $VERSION in
        .* | *[!A-Za-z0-9._+-]*) usage "bad version '$VERSION' (letters, digits and ._+- only)" ;;
    esac
    mkdir -p "$ROOT/versions" "$ROOT/staging" || die 12 "cannot create $ROOT/versions"
    lock
    # Temporary dirs from runs that were killed (no trap ran): nobody else holds the lock.
    rm -rf "$ROOT"/versions/.*.tmp.* "$ROOT"/versions/.*.old.* "$ROOT"/.current.tmp.*

    target=$ROOT/versions/$VERSION
    previous=$(readlink "$ROOT/current" 2>/dev/null)
    previous=${previous#versions/}

    if [ -x "$target/bin/pi-host" ] && runs "$target/bin/pi-host" /dev/null >/dev/null; then
        : # Already installed and working: only the switch below is left.
    else
        [ -n "$ARTIFACT" ] || usage "version $VERSION is not installed: --artifact is required"
        [ -f "$ARTIFACT" ] || die 12 "artifact $ARTIFACT not found"
        tmp=$ROOT/versions/.$VERSION.tmp.$$
        clean_on_exit "$tmp"
        mkdir "$tmp" || die 12 "cannot create $tmp"
        # One pass: tar fails on a truncated or corrupt stream too (gzip checks its length and
        # CRC at the end), and nothing extracted here is used before that is known.
        tar -xzf "$ARTIFACT" -C "$tmp" 2>"$tmp/.err" ||
            die 12 "cannot extract $ARTIFACT (corrupt or truncated?): $(head -n 3 "$tmp/.err" | tr '\n' ' ')"
        [ -f "$tmp/bin/pi-host" ] || die 12 "artifact $ARTIFACT has no bin/pi-host"
        chmod 755 "$tmp" "$tmp/bin" "$tmp/bin/pi-host"
        # Running it catches the wrong architecture or libc before anything is switched.
        if ! runs "$tmp/bin/pi-host" "$tmp/.err" >/dev/null; then
            die 13 "bin/pi-host does not run on this machine ($(uname -sm)): $(head -n 5 "$tmp/.err" | tr '\n' ' ')"
        fi
        rm -f "$tmp/.err"
        if [ -e "$target" ]; then
            # A broken leftover under the same name: set it aside, put it back on failure.
            mv "$target" "$ROOT/versions/.$VERSION.old.$$" || die 14 "cannot replace $target"
            clean_on_exit "$ROOT/versions/.$VERSION.old.$$"
        fi
        if ! mv "$tmp" "$target"; then
            [ ! -e "$ROOT/versions/.$VERSION.old.$$" ] || mv "$ROOT/versions/.$VERSION.old.$$" "$target"
            die 14 "cannot move the new version into $target"
        fi
    fi

    link=$ROOT/.current.tmp.$$
    clean_on_exit "$link"
    ln -s "versions/$VERSION" "$link" || die 14 "cannot create a symlink in $ROOT"
    replace_link "$link" "$ROOT/current" || die 14 "cannot switch $ROOT/current to versions/$VERSION"
    [ "$(readlink "$ROOT/current")" = "versions/$VERSION" ] || die 14 "$ROOT/current does not point at versions/$VERSION"

    # Keep a copy of the installer that last worked, for start/stop/status on later runs. When
    # the script came on stdin ($0 is the shell) there is nothing to copy.
    if [ -f "$0" ]; then
        copy=$ROOT/.install.sh.tmp.$$
        clean_on_exit "$copy"
        if cp "$0" "$copy" && chmod 755 "$copy" && mv -f "$copy" "$ROOT/install.sh"; then :; else
            warn "could not copy the installer to $ROOT/install.sh (the install itself worked)"
        fi
    fi

    # Reinstalling the current version keeps everything: "previous" is then unknown.
    [ "$previous" = "$VERSION" ] || prune "$VERSION" "$previous"
    say "installed version=$VERSION path=$target"
}

# Removes old versions except the new one, the previous one and the one a running host uses.
prune() {
    keep=" $1 $2 "
    pid=$(running_pid)
    if [ -n "$pid" ]; then
        exe=$(readlink "/proc/$pid/exe" 2>/dev/null)
        case $exe in
            "$ROOT"/versions/*) exe=${exe#"$ROOT"/versions/} && keep="$keep ${exe%%/*} " ;;
        esac
        [ ! -s "$ROOT/run.version" ] || keep="$keep $(cat "$ROOT/run.version") "
    fi
    for dir in "$ROOT"/versions/*; do
        [ -d "$dir" ] || continue
        case $keep in *" ${dir##*/} "*) continue ;; esac
        rm -rf "$dir"
    done
}

# ---------------------------------------------------------------------------------------------
# start / stop / status

# A name unique to this root, so several roots for one user each get their own unit.
unit_name() {
    say "pi-host-$(printf '%s' "$ROOT" | cksum | cut -d' ' -f1).service"
}
unit_path() {
    say "${XDG_CONFIG_HOME:-${HOME:-/nonexistent}/.config}/systemd/user/$(unit_name)"
}

# A user systemd that keeps services after the SSH session ends (lingering); else the detached
# daemon. Paths with characters systemd or sed would interpret also take the detached path.
use_systemd() {
    [ "$MODE" != detached ] || return 1
    case $ROOT in *[!A-Za-z0-9/._+-]*) return 1 ;; esac
    if [ "$MODE" = auto ]; then
        [ -f "$ROOT/current/share/pi-host.service" ] || return 1
        command -v systemctl >/dev/null 2>&1 || return 1
        systemctl --user show-environment >/dev/null 2>&1 || return 1
        if command -v loginctl >/dev/null 2>&1; then
            user=$(id -un)
            if ! loginctl show-user "$user" -p Linger 2>/dev/null | grep -q '=yes'; then
                loginctl enable-linger "$user" >/dev/null 2>&1 || return 1
            fi
        fi
    fi
    return 0
}

cmd_start() {
    wait_s=${WAIT:-20}
    [ -x "$ROOT/current/bin/pi-host" ] || die 20 "nothing installed under $ROOT (no current/bin/pi-host)"
    lock
    # --reuse: a host already started from `current` (by a concurrent connect that took the lock
    # first) is kept as it is.
    if [ "$REUSE" = yes ] && pid=$(running_pid) && [ -n "$pid" ] &&
        [ -f "$ROOT/run.version" ] && [ "$(cat "$ROOT/run.version")" = "$(readlink "$ROOT/current" | sed 's|^versions/||')" ]; then
        tr -d '\n' <"$STATE"
        echo
        return 0
    fi
    # One host per data dir: whatever runs is stopped first (start doubles as restart).
    stop_host 10
    rm -f "$STATE"
    mkdir -p "$ROOT/data" && chmod 700 "$ROOT/data"
    # Bounded log: rotate above 10 MiB at each start.
    if [ -f "$LOG" ] && [ "$(wc -c <"$LOG")" -gt 10485760 ]; then
        mv -f "$LOG" "$LOG.1"
    fi
    current=$(readlink "$ROOT/current")
    say "${current#versions/}" >"$ROOT/run.version"

    set -- "$ROOT/current/bin/pi-host" --data-dir "$ROOT/data" serve --listen 127.0.0.1:0 --state-file "$STATE"
    extra=
    if [ -f "$ROOT/config.toml" ]; then
        set -- "$@" --config "$ROOT/config.toml"
        extra="--config $ROOT/config.toml"
    fi

    daemon=
    if use_systemd; then
        unit=$(unit_path)
        mkdir -p "${unit%/*}" || die 20 "cannot create ${unit%/*}"
        clean_on_exit "$unit.tmp.$$"
        sed -e "s|@ROOT@|$ROOT|g" -e "s|@SERVE_EXTRA@|$extra|g" \
            "$ROOT/current/share/pi-host.service" >"$unit.tmp.$$" || die 20 "cannot write $unit"
        mv -f "$unit.tmp.$$" "$unit" || die 20 "cannot write $unit"
        systemctl --user daemon-reload || die 20 "systemctl --user daemon-reload failed"
        # Without the lock fd: a systemctl that starts the service itself (container shims do)
        # would otherwise pass the install lock on to the host. Not waiting for the start job:
        # the unit is Type=notify, started only once /readyz passes (never while the agent is
        # missing), and the host serves before that; the state file below says it listens.
        systemctl --user restart --no-block "$(unit_name)" 9>&- || die 20 "systemctl --user restart $(unit_name) failed"
        systemctl --user enable --quiet "$(unit_name)" 2>/dev/null || warn "could not enable $(unit_name)"
    else
        printf '%s\n' "--- $(date) starting $current" >>"$LOG"
        # A new session (setsid) so the SSH session's end (SIGHUP, its process group) does not
        # reach the host; stdio away from the session so ssh does not wait for it; the lock fd
        # closed so the host does not hold the install lock.
        if command -v setsid >/dev/null 2>&1; then
            NO_COLOR=1 setsid nohup "$@" </dev/null >>"$LOG" 2>&1 9>&- &
        elif command -v perl >/dev/null 2>&1; then
            NO_COLOR=1 perl -MPOSIX -e 'POSIX::setsid(); exec @ARGV or exit 127' nohup "$@" </dev/null >>"$LOG" 2>&1 9>&- &
        else
            NO_COLOR=1 nohup "$@" </dev/null >>"$LOG" 2>&1 9>&- &
        fi
        daemon=$!
    fi
    watch=$daemon

    deadline=$(($(now) + wait_s))
    while :; do
        pid=$(running_pid)
        if [ -n "$pid" ]; then
            # One line, whatever the file's formatting.
            tr -d '\n' <"$STATE"
            echo
            return 0
        fi
        if [ -n "$watch" ] && ! alive "$watch"; then
            wait "$watch"
            status=$?
            # Status 0 is a setsid that forked (it does when it leads a process group): the host
            # runs on in the child, so keep waiting for the state file.
            [ "$status" -eq 0 ] || start_failed 20 "pi-host exited while starting (status $status)"
            watch=
        fi
        if [ -z "$daemon" ] && unit_failed; then
            start_failed 20 "pi-host exited while starting (systemctl --user status $(unit_name))"
        fi
        if [ "$(now)" -ge "$deadline" ]; then
            # Do not leave a half-started host behind to confuse the next attempt.
            [ -z "$daemon" ] || kill -KILL "$daemon" 2>/dev/null
            [ -n "$daemon" ] || systemctl --user stop "$(unit_name)" >/dev/null 2>&1
            start_failed 21 "pi-host did not write $STATE within ${wait_s}s"
        fi
        tick
    done
}

# The unit's host exited: the unit failed, or waits to be started again (Restart=on-failure).
# Activating is not a failure: the host listens before it reports ready.
unit_failed() {
    case $(systemctl --user show --property=SubState --value "$(unit_name)" 2>/dev/null) in
        failed | auto-restart) return 0 ;;
    esac
    return 1
}

start_failed() {
    if [ -f "$LOG" ]; then
        say "--- last lines of $LOG ---" >&2
        tail -n 20 "$LOG" >&2
    fi
    die "$1" "$2"
}

# SIGTERM (the host drains), SIGKILL after $1 seconds.
stop_host() {
    if [ -f "$(unit_path)" ] && command -v systemctl >/dev/null 2>&1 &&
        systemctl --user show-environment >/dev/null 2>&1; then
        systemctl --user disable --quiet "$(unit_name)" >/dev/null 2>&1
        systemctl --user stop "$(unit_name)" >/dev/null 2>&1
    fi
    pid=$(running_pid)
    if [ -n "$pid" ]; then
        kill -TERM "$pid" 2>/dev/null
        deadline=$(($(now) + $1))
        while alive "$pid" && [ "$(now)" -lt "$deadline" ]; do tick; done
        if alive "$pid"; then
            warn "pi-host (pid $pid) did not stop within $1s: killing it"
            kill -KILL "$pid" 2>/dev/null
            deadline=$(($(now) + 10))
            while alive "$pid" && [ "$(now)" -lt "$deadline" ]; do tick; done
        fi
    fi
    # A killed host leaves its state file behind.
    [ -n "$(running_pid)" ] || rm -f "$STATE"
}

cmd_stop() {
    [ -d "$ROOT" ] || return 0
    lock
    stop_host "${WAIT:-10}"
}

cmd_status() {
    pid=$(running_pid)
    if [ -n "$pid" ]; then
        say "running pid=$pid version=$(json_field version "$STATE") listen=$(json_field listen "$STATE")"
    else
        say stopped
    fi
}

case $COMMAND in
    install) cmd_install ;;
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
esac
