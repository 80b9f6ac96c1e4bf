#!/usr/bin/env bash
# stop-local-slurm.sh - stop the cluster started by start-local-slurm.sh.
# Only processes recorded in our own pid files are signalled (slurmd, slurmctld,
# slurmdbd, mariadbd, munged), each after checking /proc/PID/comm, so a recycled PID is never hit.
# Jobs still queued/running are cancelled first through scancel, so their
# slurmstepd/task processes are cleaned up by Slurm itself.
# Idempotent: does nothing (exit 0) if nothing is running.
#   SLURM_LOCAL_BASE=${TMPDIR:-/tmp}/local-slurm
#   SLURM_LOCAL_PURGE=0   1: also delete state, logs, config and key (keeps the scripts)
# (Copied from the team's checked recipe shared/recipes/slurm-local/ so that CI, which has
# no shared/, can run tests/slurm; keep the two in step.)
set -uo pipefail
exec </dev/null
BASE=${SLURM_LOCAL_BASE:-${TMPDIR:-/tmp}/local-slurm}
export SLURM_CONF=$BASE/etc/slurm.conf
log() { echo "[stop-local-slurm] $*"; }

alive() {  # alive NAME PIDFILE -> prints pid if it is a live (non-zombie) NAME
  local pid state
  [ -s "$2" ] || return 1
  pid=$(cat "$2" 2>/dev/null); [[ $pid =~ ^[0-9]+$ ]] || return 1
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
  [ "$state" != Z ] && [ "$(cat /proc/$pid/comm 2>/dev/null)" = "$1" ] && echo "$pid"
}
stop() {  # stop NAME PIDFILE
  local pid i
  pid=$(alive "$1" "$2") || { log "$1 not running"; rm -f "$2"; return 0; }
  kill -TERM "$pid" 2>/dev/null
  for ((i = 0; i < 300; i++)); do alive "$1" "$2" >/dev/null || break; sleep 0.1; done
  if alive "$1" "$2" >/dev/null; then log "$1 (pid $pid) ignored SIGTERM for 30s, sending SIGKILL"; kill -KILL "$pid" 2>/dev/null; sleep 0.2; fi
  rm -f "$2"; log "stopped $1 (pid $pid)"
}

# 1. cancel remaining jobs while the controller is still up
if alive slurmctld "$BASE/run/slurmctld.pid" >/dev/null && [ -f "$SLURM_CONF" ]; then
  jobs=$(squeue -h -o %i 2>/dev/null | tr '\n' ' ')
  if [ -n "${jobs// /}" ]; then
    log "cancelling jobs: $jobs"; scancel $jobs 2>/dev/null
    for ((i = 0; i < 300; i++)); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.1; done
  fi
fi
# 2. daemons, in reverse start order
stop slurmd    "$BASE/run/slurmd.pid"
stop slurmctld "$BASE/run/slurmctld.pid"
stop slurmdbd  "$BASE/run/slurmdbd.pid"          # only with SLURM_LOCAL_ACCOUNTING=1
stop mariadbd  "$BASE/mysql/run/mariadbd.pid"    # only with SLURM_LOCAL_ACCOUNTING=1
stop munged    "$BASE/munge/run/munged.pid"
rm -f "$BASE/munge/run/munge.socket.2" "$BASE/munge/run/munge.socket.2.lock"
# 3. the /etc/slurm/slurm.conf symlink, only if we created it and it still points to us
if [ -f "$BASE/run/etc-link" ] && [ "$(readlink /etc/slurm/slurm.conf 2>/dev/null)" = "$SLURM_CONF" ]; then
  rm -f /etc/slurm/slurm.conf; rm -f "$BASE/run/etc-link"; log "removed /etc/slurm/slurm.conf symlink"
fi
if [ "${SLURM_LOCAL_PURGE:-0}" = 1 ]; then
  rm -rf "$BASE"/{etc,run,log,state,munge,mysql,fakegpu} "$BASE/env.sh"; log "purged $BASE state"
fi
exit 0
