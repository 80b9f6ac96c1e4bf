#!/usr/bin/env bash
# start-local-slurm.sh - install, configure and start a single-node Slurm 22.05
# cluster (munged + slurmctld + slurmd [+ mariadbd + slurmdbd]) on loopback,
# without systemd and without needing cgroups (Debian 12 packages).
# Idempotent: re-running it while the cluster is up is a no-op (if the generated
# config changed, the Slurm daemons are restarted).  CI-safe: runs as root,
# never reads stdin, no prompts.
#
# Everything (config, munge key, state, logs, pid files) lives under $SLURM_LOCAL_BASE.
# Afterwards:  source $SLURM_LOCAL_BASE/env.sh   (exports SLURM_CONF)
#
# Knobs (environment variables, all optional):
#   SLURM_LOCAL_BASE=${TMPDIR:-/tmp}/local-slurm    working directory
#   SLURM_LOCAL_NODENAME=$(hostname -s)  node name (may also be "localhost")
#   SLURM_LOCAL_CPUS=<detected>          CPUs to advertise; if != hardware, adds
#                                        SlurmdParameters=config_overrides (fake a bigger node)
#   SLURM_LOCAL_FAKE_GPUS=0              N>0: gres gpu:N backed by symlinks to /dev/null
#   SLURM_LOCAL_ACCOUNTING=0             1: also run MariaDB + slurmdbd so that sacct works
#   SLURM_LOCAL_CTLD_PORT=6817 SLURM_LOCAL_SLURMD_PORT=6818
#   SLURM_LOCAL_DBD_PORT=6819  SLURM_LOCAL_MYSQL_PORT=3307
#   SLURM_LOCAL_EXTRA_PKGS=""            more Debian packages the jobs need, e.g. "python3 curl"
#   SLURM_LOCAL_INSTALL=1                0: never call apt-get (packages must be present)
#   SLURM_LOCAL_CLEAN=0                  1: start slurmctld with -c (drop saved jobs/node state);
#                                        done automatically when the generated config changed
#   SLURM_LOCAL_LINK_ETC=1               1: symlink /etc/slurm/slurm.conf -> our config when that
#                                        path is free, so plain `sinfo` works without SLURM_CONF
#   SLURM_LOCAL_TIMEOUT=60               seconds to wait for the node to become idle
# (Copied from the team's checked recipe shared/recipes/slurm-local/ so that CI, which has
# no shared/, can run tests/slurm; keep the two in step.)
set -euo pipefail
exec </dev/null

T_START=${EPOCHREALTIME/,/.}
BASE=${SLURM_LOCAL_BASE:-${TMPDIR:-/tmp}/local-slurm}
HOST_SHORT=$(hostname -s 2>/dev/null || uname -n); HOST_SHORT=${HOST_SHORT%%.*}
NODE=${SLURM_LOCAL_NODENAME:-$HOST_SHORT}
FAKE_GPUS=${SLURM_LOCAL_FAKE_GPUS:-0}
ACCOUNTING=${SLURM_LOCAL_ACCOUNTING:-0}
CTLD_PORT=${SLURM_LOCAL_CTLD_PORT:-6817}
SLURMD_PORT=${SLURM_LOCAL_SLURMD_PORT:-6818}
DBD_PORT=${SLURM_LOCAL_DBD_PORT:-6819}
MYSQL_PORT=${SLURM_LOCAL_MYSQL_PORT:-3307}
INSTALL=${SLURM_LOCAL_INSTALL:-1}
CLEAN=${SLURM_LOCAL_CLEAN:-0}
LINK_ETC=${SLURM_LOCAL_LINK_ETC:-1}
TIMEOUT=${SLURM_LOCAL_TIMEOUT:-60}
PKGS="munge slurm-client slurmctld slurmd slurm-wlm"
[ "$ACCOUNTING" = 1 ] && PKGS="$PKGS slurmdbd mariadb-server-core mariadb-client-core"
PKGS="$PKGS ${SLURM_LOCAL_EXTRA_PKGS:-}"   # e.g. "python3 curl" for the example jobs

elapsed() { awk -v a="$T_START" -v b="${EPOCHREALTIME/,/.}" 'BEGIN{printf "%.2f", b-a}'; }
log() { printf '[start-local-slurm %6.2fs] %s\n' "$(elapsed)" "$*"; }
die() { log "ERROR: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root"

# ---------------------------------------------------------------- helpers
# is_running NAME PIDFILE -> 0 if the pid in PIDFILE is alive (not a zombie) and its comm is NAME
is_running() {
  local name=$1 pidfile=$2 pid state
  [ -s "$pidfile" ] || return 1
  pid=$(cat "$pidfile" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ] || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ]
}
# wait_for SECONDS CMD... -> polls CMD every 0.1s until it succeeds
wait_for() {
  local t=$1; shift
  local end=$(( $(date +%s) + t ))
  until "$@"; do [ "$(date +%s)" -lt "$end" ] || return 1; sleep 0.1; done
}
not_running() { ! is_running "$@"; }
stop_pid() {  # only used to restart our own daemons after a config change
  local name=$1 pidfile=$2 pid
  is_running "$name" "$pidfile" || return 0
  pid=$(cat "$pidfile"); kill -TERM "$pid" 2>/dev/null || true
  wait_for 30 not_running "$name" "$pidfile" || kill -KILL "$pid" 2>/dev/null || true
}
# log_errors FILE: error/fatal lines written to a daemon log during this run (minus harmless PMIx noise)
declare -A LOG_MARK
mark_log() { if [ -f "$1" ]; then LOG_MARK[$1]=$(wc -l <"$1"); else LOG_MARK[$1]=0; fi; }
log_errors() {
  echo "---- errors in $1:"
  tail -n +$(( ${LOG_MARK[$1]:-0} + 1 )) "$1" 2>/dev/null | grep -E 'error|fatal' | grep -vE 'pmix|MPI:' | tail -15
  echo "----"
}
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

mkdir -p "$BASE"/{etc,run,log,state/ctld,state/d,munge/etc,munge/run,munge/log,munge/lib}
chmod 755 "$BASE" "$BASE/munge" "$BASE/munge/run"
chmod 700 "$BASE/munge/etc" "$BASE/munge/log" "$BASE/munge/lib"

# ---------------------------------------------------------------- 1. packages
missing=""
for p in $PKGS; do
  st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [ "$st" = "install ok installed" ] || missing="$missing $p"
done
if [ -n "$missing" ]; then
  [ "$INSTALL" = 1 ] || die "packages missing:$missing (and SLURM_LOCAL_INSTALL=0)"
  export DEBIAN_FRONTEND=noninteractive
  # Keep maintainer scripts from starting the packaged munge/slurm services
  # (no systemd/init here; on a systemd host they would also grab our ports).
  created_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; created_policy=1
  fi
  trap 'if [ "$created_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi' EXIT
  APT_OPTS=(-y -q --no-install-recommends -o Dpkg::Options::=--force-confdef
            -o Dpkg::Options::=--force-confold -o DPkg::Lock::Timeout=120)
  cand=$(apt-cache policy slurmd 2>/dev/null || true)   # no `| grep -q`: SIGPIPE + pipefail
  if [[ $cand != *"Candidate: 22."* ]]; then
    log "apt-get update"
    apt-get -q update >"$BASE/log/apt-update.log" 2>&1 || { tail -20 "$BASE/log/apt-update.log"; die "apt-get update failed"; }
  fi
  log "installing:$missing"
  if ! apt-get install "${APT_OPTS[@]}" $PKGS >"$BASE/log/apt-install.log" 2>&1; then
    log "install failed, retrying after apt-get update"
    apt-get -q update >>"$BASE/log/apt-install.log" 2>&1 || true
    apt-get install "${APT_OPTS[@]}" $PKGS >>"$BASE/log/apt-install.log" 2>&1 \
      || { tail -30 "$BASE/log/apt-install.log"; die "apt-get install failed"; }
  fi
  if [ "$created_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
  trap - EXIT
  log "packages installed ($(slurmd -V))"
else
  log "packages already installed ($(slurmd -V))"
fi

# ---------------------------------------------------------------- 2. munge
MUNGE_SOCK=$BASE/munge/run/munge.socket.2
if [ ! -s "$BASE/munge/etc/munge.key" ]; then
  mungekey --create --keyfile="$BASE/munge/etc/munge.key" 2>/dev/null \
    || dd if=/dev/urandom of="$BASE/munge/etc/munge.key" bs=1024 count=1 status=none
  chmod 600 "$BASE/munge/etc/munge.key"
  log "generated munge key"
fi
if is_running munged "$BASE/munge/run/munged.pid"; then
  log "munged already running (pid $(cat "$BASE/munge/run/munged.pid"))"
else
  rm -f "$MUNGE_SOCK" "$MUNGE_SOCK.lock" "$BASE/munge/run/munged.pid"
  munged --socket="$MUNGE_SOCK" --key-file="$BASE/munge/etc/munge.key" \
         --log-file="$BASE/munge/log/munged.log" --pid-file="$BASE/munge/run/munged.pid" \
         --seed-file="$BASE/munge/lib/munged.seed" --origin=127.0.0.1 \
    || { tail -20 "$BASE/munge/log/munged.log"; die "munged failed to start"; }
  wait_for 10 test -S "$MUNGE_SOCK" || die "munge socket did not appear"
  log "munged started (pid $(cat "$BASE/munge/run/munged.pid"))"
fi
munge -S "$MUNGE_SOCK" -n | unmunge -S "$MUNGE_SOCK" >/dev/null || die "munge self-test failed"

# ---------------------------------------------------------------- 3. config
CONF=$BASE/etc/slurm.conf
# hardware as slurmd sees it, e.g. "NodeName=vm CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=24105"
HW=$(slurmd -C 2>/dev/null | head -1)
hw() { sed -n "s/.*[[:space:]]$1=\([0-9]*\).*/\1/p" <<<"$HW"; }
HW_CPUS=$(hw CPUs); HW_MEM=$(hw RealMemory)
[ -n "$HW_CPUS" ] || die "slurmd -C failed: $HW"
CPUS=${SLURM_LOCAL_CPUS:-$HW_CPUS}
if [ "$CPUS" = "$HW_CPUS" ]; then
  NODE_HW="CPUs=$CPUS Boards=$(hw Boards) SocketsPerBoard=$(hw SocketsPerBoard) CoresPerSocket=$(hw CoresPerSocket) ThreadsPerCore=$(hw ThreadsPerCore) RealMemory=$HW_MEM"
  OVERRIDES=""
else
  NODE_HW="CPUs=$CPUS RealMemory=$HW_MEM"
  OVERRIDES="SlurmdParameters=config_overrides"   # advertise more/less CPUs than the hardware has
fi
GRES_NODE=""; GRES_TYPES=""
if [ "$FAKE_GPUS" -gt 0 ]; then
  mkdir -p "$BASE/fakegpu"
  for ((i = 0; i < FAKE_GPUS; i++)); do ln -sfn /dev/null "$BASE/fakegpu/nvidia$i"; done
  GRES_NODE=" Gres=gpu:$FAKE_GPUS"; GRES_TYPES="GresTypes=gpu"
fi
if [ "$ACCOUNTING" = 1 ]; then
  ACCT="# accounting through slurmdbd (+MariaDB) -> sacct works
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
# for slurmdbd connections the munge socket is taken from AccountingStoragePass, not AuthInfo
AccountingStoragePass=$MUNGE_SOCK
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30"
else
  ACCT="# no slurmdbd: sacct does not work; completed jobs are logged to JobCompLoc instead
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"
fi

NEW=$(mktemp); trap 'rm -f "$NEW"' EXIT
cat >"$NEW" <<EOF
# generated by start-local-slurm.sh - single-node loopback Slurm 22.05 test cluster
ClusterName=localtest
SlurmctldHost=$HOST_SHORT(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCK
StateSaveLocation=$BASE/state/ctld
SlurmdSpoolDir=$BASE/state/d
SlurmctldPidFile=$BASE/run/slurmctld.pid
SlurmdPidFile=$BASE/run/slurmd.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# no cgroups, no systemd
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
$ACCT
JobCompType=jobcomp/filetxt
JobCompLoc=$BASE/log/jobcomp.log
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MailProg=/bin/true
# keep finished jobs visible to scontrol/squeue for an hour (default 300s)
MinJobAge=3600
$GRES_TYPES
$OVERRIDES
NodeName=$NODE NodeAddr=127.0.0.1 $NODE_HW$GRES_NODE State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF

NEW_CG="# slurmd 22.05 always initialises a cgroup plugin and 'autodetect' (the default) makes
# slurmd exit when /sys/fs/cgroup is missing or cgroup v2/hybrid (containers).
# cgroup/v1's init touches no files, and with proctrack/linuxproc + task/none
# no cgroup operation is ever performed.
CgroupPlugin=cgroup/v1"
if [ "$FAKE_GPUS" -gt 0 ]; then
  NEW_GRES=$(printf 'AutoDetect=off\nNodeName=%s Name=gpu File=%s/fakegpu/nvidia[0-%d]' "$NODE" "$BASE" $((FAKE_GPUS - 1)))
else
  NEW_GRES="AutoDetect=off"
fi
NEW_DBD=""
if [ "$ACCOUNTING" = 1 ]; then
  NEW_DBD="AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
DbdHost=$HOST_SHORT
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$BASE/run/slurmdbd.pid
LogFile=$BASE/log/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$MYSQL_PORT
StorageUser=slurm
StoragePass=slurmpw
StorageLoc=slurm_acct_db"
fi

changed=0
cmp -s "$NEW" "$CONF" || { cp "$NEW" "$CONF"; changed=1; }
[ "$(cat "$BASE/etc/cgroup.conf" 2>/dev/null)" = "$NEW_CG" ] || { echo "$NEW_CG" >"$BASE/etc/cgroup.conf"; changed=1; }
[ "$(cat "$BASE/etc/gres.conf" 2>/dev/null)" = "$NEW_GRES" ] || { echo "$NEW_GRES" >"$BASE/etc/gres.conf"; changed=1; }
chmod 644 "$CONF" "$BASE/etc/cgroup.conf" "$BASE/etc/gres.conf"
if [ "$ACCOUNTING" = 1 ]; then
  [ "$(cat "$BASE/etc/slurmdbd.conf" 2>/dev/null)" = "$NEW_DBD" ] || { echo "$NEW_DBD" >"$BASE/etc/slurmdbd.conf"; changed=1; }
  chmod 600 "$BASE/etc/slurmdbd.conf"     # slurmdbd refuses a group/world-readable file
else
  rm -f "$BASE/etc/slurmdbd.conf"
fi
export SLURM_CONF=$CONF
printf 'export SLURM_CONF=%s\n' "$CONF" >"$BASE/env.sh"
if [ "$changed" = 1 ]; then log "config written to $BASE/etc"; else log "config unchanged"; fi

if [ "$LINK_ETC" = 1 ]; then
  mkdir -p /etc/slurm
  if [ ! -e /etc/slurm/slurm.conf ] && [ ! -L /etc/slurm/slurm.conf ]; then
    ln -s "$CONF" /etc/slurm/slurm.conf; echo /etc/slurm/slurm.conf >"$BASE/run/etc-link"
  elif [ "$(readlink /etc/slurm/slurm.conf)" != "$CONF" ]; then
    log "note: /etc/slurm/slurm.conf exists and is not ours; use: source $BASE/env.sh"
  fi
fi

# ---------------------------------------------------------------- 4. daemons
if [ "$changed" = 1 ]; then   # running daemons must pick up the new config
  for d in slurmd slurmctld slurmdbd; do
    if is_running $d "$BASE/run/$d.pid"; then log "config changed: stopping $d"; stop_pid $d "$BASE/run/$d.pid"; fi
  done
fi

if [ "$ACCOUNTING" = 1 ]; then
  M=$BASE/mysql
  if is_running mariadbd "$M/run/mariadbd.pid"; then
    log "mariadbd already running (pid $(cat "$M/run/mariadbd.pid"))"
  else
    mkdir -p "$M/run" "$M/tmp"
    if [ ! -d "$M/data/mysql" ]; then
      rm -rf "$M/data"
      mariadb-install-db --no-defaults --user=root --datadir="$M/data" --skip-test-db \
        --auth-root-authentication-method=socket >"$BASE/log/mariadb-install-db.log" 2>&1 \
        || { tail -20 "$BASE/log/mariadb-install-db.log"; die "mariadb-install-db failed"; }
      log "MariaDB datadir initialised"
    fi
    rm -f "$M/run/mysqld.sock" "$M/run/mariadbd.pid"
    setsid -f mariadbd --no-defaults --user=root --datadir="$M/data" --tmpdir="$M/tmp" \
      --socket="$M/run/mysqld.sock" --pid-file="$M/run/mariadbd.pid" --log-error="$BASE/log/mariadbd.err" \
      --bind-address=127.0.0.1 --port="$MYSQL_PORT" --skip-name-resolve \
      --innodb-buffer-pool-size=512M --innodb-lock-wait-timeout=900 </dev/null >/dev/null 2>&1
    wait_for 60 test -S "$M/run/mysqld.sock" || { tail -20 "$BASE/log/mariadbd.err"; die "mariadbd did not start"; }
    wait_for 10 test -s "$M/run/mariadbd.pid" || true
    mariadb --socket="$M/run/mysqld.sock" -u root -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmpw';
      GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" || die "could not create the slurm DB user"
    log "mariadbd started (pid $(cat "$M/run/mariadbd.pid" 2>/dev/null), 127.0.0.1:$MYSQL_PORT)"
  fi
  if is_running slurmdbd "$BASE/run/slurmdbd.pid"; then
    log "slurmdbd already running (pid $(cat "$BASE/run/slurmdbd.pid"))"
  else
    mark_log "$BASE/log/slurmdbd.log"
    slurmdbd || { log_errors "$BASE/log/slurmdbd.log"; die "slurmdbd failed"; }
    wait_for 30 port_open "$DBD_PORT" || { log_errors "$BASE/log/slurmdbd.log"; die "slurmdbd not listening on $DBD_PORT"; }
    log "slurmdbd started (pid $(cat "$BASE/run/slurmdbd.pid"))"
  fi
fi

if is_running slurmctld "$BASE/run/slurmctld.pid"; then
  log "slurmctld already running (pid $(cat "$BASE/run/slurmctld.pid"))"
else
  # -c (clean start: forget saved jobs/node state) when asked, and whenever the config
  # changed, so state saved under an older config (e.g. other GresTypes) cannot interfere
  CTLD_ARGS=(-i); if [ "$CLEAN" = 1 ] || [ "$changed" = 1 ]; then CTLD_ARGS+=(-c); fi
  mark_log "$BASE/log/slurmctld.log"; rm -f "$BASE/run/slurmctld.pid"
  slurmctld "${CTLD_ARGS[@]}" || { log_errors "$BASE/log/slurmctld.log"; die "slurmctld failed"; }
  t_end=$(( $(date +%s) + 30 ))
  while :; do
    sleep 0.1
    # daemonised: the pid file appears shortly after fork; a dead daemon (e.g. port in use) fails fast
    if [ -s "$BASE/run/slurmctld.pid" ] && ! is_running slurmctld "$BASE/run/slurmctld.pid"; then
      log_errors "$BASE/log/slurmctld.log"; die "slurmctld exited"
    fi
    [[ $(scontrol ping 2>/dev/null) == *"is UP"* ]] && break
    [ "$(date +%s)" -lt "$t_end" ] || { log_errors "$BASE/log/slurmctld.log"; die "slurmctld not responding on 127.0.0.1:$CTLD_PORT"; }
  done
  log "slurmctld started (pid $(cat "$BASE/run/slurmctld.pid"))"
fi

if is_running slurmd "$BASE/run/slurmd.pid"; then
  log "slurmd already running (pid $(cat "$BASE/run/slurmd.pid"))"
else
  mark_log "$BASE/log/slurmd.log"
  slurmd -N "$NODE" || { log_errors "$BASE/log/slurmd.log"; die "slurmd failed"; }
  wait_for 10 is_running slurmd "$BASE/run/slurmd.pid" || { log_errors "$BASE/log/slurmd.log"; die "slurmd exited"; }
  log "slurmd started (pid $(cat "$BASE/run/slurmd.pid"))"
fi

node_state() { sinfo -h -n "$NODE" -o %T 2>/dev/null | head -1; }
resumed=0
is_up() {
  local s; s=$(node_state)
  is_running slurmd "$BASE/run/slurmd.pid" || { log_errors "$BASE/log/slurmd.log"; die "slurmd died"; }
  case "$s" in
    idle|mixed|allocated|completing) return 0 ;;
    *drain*|down*|*fail*)   # left over from an earlier (mis)configured run: resume once
      if [ "$resumed" = 0 ]; then resumed=1; log "node state '$s', resuming"; scontrol update nodename="$NODE" state=resume || true; fi
      return 1 ;;
    *) return 1 ;;
  esac
}
if ! wait_for "$TIMEOUT" is_up; then
  sinfo -N -l || true; scontrol show node "$NODE" || true
  tail -20 "$BASE/log/slurmctld.log"; tail -20 "$BASE/log/slurmd.log"
  die "node $NODE not idle after ${TIMEOUT}s"
fi
log "cluster ready: node $NODE is $(node_state) ($CPUS CPUs${GRES_NODE:+,$GRES_NODE}$([ "$ACCOUNTING" = 1 ] && echo ', accounting on')); total $(elapsed)s"
log "use: export SLURM_CONF=$CONF   (or: source $BASE/env.sh)"
