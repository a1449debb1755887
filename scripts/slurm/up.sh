#!/usr/bin/env bash
# Start a one-node Slurm cluster (munged, slurmctld, slurmd) on this machine for olmx's Slurm
# tests. Run as root. Installs the Debian packages when they are missing, writes
# /etc/slurm/slurm.conf from slurm.conf.in (CPUs = nproc, RealMemory from /proc/meminfo), starts
# the daemons and waits until the node is idle.
#
# Idempotent: a daemon that already runs (its pid file names a live process) is left alone.
# Every daemon this script starts is listed in $STATE_DIR/started; scripts/slurm/down.sh stops
# exactly those, by pid file. Prints how long each part took.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE_DIR=/run/olmx-slurm
STARTED="$STATE_DIR/started"
CONF=/etc/slurm/slurm.conf
NODE=localhost
WAIT_S="${OLMX_SLURM_WAIT_S:-60}"
PKGS=(slurm-wlm slurmctld slurmd munge slurm-client)

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
say() { echo "up.sh: $*"; }
die() {
    echo "up.sh: $*" >&2
    for log in /var/log/munge/munged.log /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log; do
        [ -f "$log" ] && { echo "--- last lines of $log" >&2; tail -n 15 "$log" >&2; }
    done
    exit 1
}

[ "$(id -u)" = 0 ] || die "must run as root (it installs packages and starts daemons as munge and slurm)"
mkdir -p "$STATE_DIR"
t_all=$(now)

# 1. Packages ---------------------------------------------------------------------------------
t=$(now)
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]} (log: $STATE_DIR/apt.log)"
    install() { DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${PKGS[@]}"; }
    # Try the package lists already on the machine first; refresh them only when that fails.
    if ! install >"$STATE_DIR/apt.log" 2>&1; then
        apt-get update >>"$STATE_DIR/apt.log" 2>&1 || { tail -n 20 "$STATE_DIR/apt.log" >&2; die "apt-get update failed"; }
        install >>"$STATE_DIR/apt.log" 2>&1 || { tail -n 20 "$STATE_DIR/apt.log" >&2; die "apt-get install failed"; }
    fi
fi
t_install=$(since "$t")

# 2. Configuration ------------------------------------------------------------------------------
t=$(now)
cpus=$(nproc)
real_mem=$(awk '/^MemTotal:/ { printf "%d", $2 / 1024 }' /proc/meminfo)
new_conf=$(sed -e "s/@CPUS@/$cpus/" -e "s/@REAL_MEMORY@/$real_mem/" "$HERE/slurm.conf.in")

mkdir -p /run/munge /var/log/munge /var/lib/munge /run/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
chown munge:munge /run/munge /var/log/munge /var/lib/munge
chown slurm:slurm /run/slurm /var/spool/slurmctld /var/log/slurm
if [ ! -s /etc/munge/munge.key ]; then
    mungekey --create --keyfile=/etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
fi

# alive NAME PIDFILE: the pid file names a live (not zombie) process whose command is NAME.
alive() {
    local pid comm
    [ -s "$2" ] || return 1
    pid=$(cat "$2")
    [ -r "/proc/$pid/comm" ] || return 1
    comm=$(cat "/proc/$pid/comm")
    # A zombie (state Z) has exited; where PID 1 does not reap orphans it stays listed.
    [[ "$comm" == "$1"* ]] && [ "$(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null)" != Z ]
}

# stop_ours NAME PIDFILE: stop a daemon that this script started earlier (config changed).
stop_ours() {
    grep -qx "$1 $2" "$STARTED" 2>/dev/null && alive "$1" "$2" || return 0
    say "config changed: restarting $1"
    kill -TERM "$(cat "$2")"
    for _ in $(seq 100); do alive "$1" "$2" || return 0; sleep 0.1; done
    die "$1 (pid $(cat "$2")) did not stop"
}

if [ "$(cat "$CONF" 2>/dev/null)" != "$new_conf" ]; then
    stop_ours slurmd /run/slurm/slurmd.pid
    stop_ours slurmctld /run/slurm/slurmctld.pid
    printf '%s\n' "$new_conf" >"$CONF"
    say "wrote $CONF (CPUs=$cpus RealMemory=$real_mem)"
fi

# 3. Daemons ----------------------------------------------------------------------------------
# start_daemon NAME PIDFILE CMD...: run CMD (which daemonizes and writes PIDFILE) unless NAME
# already runs; record it in $STARTED so that down.sh stops it.
start_daemon() {
    local name=$1 pidfile=$2
    shift 2
    if alive "$name" "$pidfile"; then
        say "$name already running (pid $(cat "$pidfile"))"
        return 0
    fi
    rm -f "$pidfile"
    "$@" || die "could not start $name: $*"
    for _ in $(seq 100); do alive "$name" "$pidfile" && break; sleep 0.1; done
    alive "$name" "$pidfile" || die "$name did not come up (no live pid in $pidfile)"
    touch "$STARTED"
    sed -i "\\|^$name |d" "$STARTED"
    echo "$name $pidfile" >>"$STARTED"
    say "started $name (pid $(cat "$pidfile"))"
}

start_daemon munged /run/munge/munged.pid runuser -u munge -- /usr/sbin/munged
munge -n | unmunge >/dev/null || die "munge credential round trip failed"
# -c: start with an empty queue. Jobs saved by a slurmctld that was killed (a session that
# ended without down.sh) would otherwise be requeued and hold the node's CPUs.
start_daemon slurmctld /run/slurm/slurmctld.pid /usr/sbin/slurmctld -c
# The machine's hostname is not 'localhost', so name the node explicitly.
start_daemon slurmd /run/slurm/slurmd.pid /usr/sbin/slurmd -N "$NODE"

# 4. Wait for the node ----------------------------------------------------------------------
resumed=0
state=
for _ in $(seq $((WAIT_S * 5))); do
    state=$(sinfo -h -n "$NODE" -o %T 2>/dev/null || true)
    case "$state" in
        idle | mixed | allocated | completing) break ;;
        drain* | down* | fail*)
            # Left over from an earlier run that was killed with jobs on the node.
            if [ "$resumed" = 0 ]; then
                scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true
                resumed=1
            fi
            ;;
    esac
    sleep 0.2
done
case "$state" in
    idle | mixed | allocated | completing) ;;
    *) die "node $NODE is not up after ${WAIT_S}s (sinfo state: '${state:-none}')" ;;
esac
t_up=$(since "$t")

say "node $NODE is $state: $(sinfo -h -n "$NODE" -o '%P cpus=%c mem=%mMB')"
say "timing: install ${t_install}s, config+daemons+node ${t_up}s, total $(since "$t_all")s"
