#!/usr/bin/env bash
# Stop the daemons that scripts/slurm/up.sh started, and only those: it reads the list
# up.sh wrote ($STATE_DIR/started, "NAME PIDFILE" per line) and stops them in reverse order
# (slurmd, slurmctld, munged), each by the pid in its pid file, checking that the pid still
# belongs to a process of that name. Jobs still in the queue are cancelled first, so that no
# job step (slurmstepd) outlives the cluster.
set -euo pipefail

STATE_DIR=/run/olmx-slurm
STARTED="$STATE_DIR/started"
say() { echo "down.sh: $*"; }

if [ ! -s "$STARTED" ]; then
    say "nothing to stop ($STARTED is empty or missing)"
    exit 0
fi

alive() {
    local pid comm
    [ -s "$2" ] || return 1
    pid=$(cat "$2")
    [ -r "/proc/$pid/comm" ] || return 1
    comm=$(cat "/proc/$pid/comm")
    # A zombie (state Z) has exited; where PID 1 does not reap orphans it stays listed.
    [[ "$comm" == "$1"* ]] && [ "$(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null)" != Z ]
}

if grep -q '^slurmctld ' "$STARTED" && alive slurmctld /run/slurm/slurmctld.pid; then
    jobs=$(squeue -h -o %i 2>/dev/null || true)
    if [ -n "$jobs" ]; then
        say "cancelling jobs still queued: $(echo $jobs)"
        # shellcheck disable=SC2086
        scancel $jobs || true
        for _ in $(seq 100); do
            [ -z "$(squeue -h -o %i 2>/dev/null || true)" ] && break
            sleep 0.2
        done
    fi
fi

# gone PID: no such process, or only a zombie left for its parent to reap.
gone() { [ ! -r "/proc/$1/stat" ] || [ "$(awk '{ print $3 }' "/proc/$1/stat")" = Z ]; }

tac "$STARTED" | while read -r name pidfile; do
    if ! alive "$name" "$pidfile"; then
        say "$name is not running"
        continue
    fi
    pid=$(cat "$pidfile")
    kill -TERM "$pid"
    for _ in $(seq 150); do
        gone "$pid" && break
        sleep 0.1
    done
    if ! gone "$pid"; then
        say "$name (pid $pid) ignored SIGTERM for 15 s; sending SIGKILL"
        kill -KILL "$pid" || true
    fi
    rm -f "$pidfile"
    say "stopped $name (pid $pid)"
done
rm -f "$STARTED"
