#!/usr/bin/env bash
# deepinfer-slurm.sh - start a deepinfer cluster inside a Slurm allocation (sbatch or salloc):
# the coordinator on the first node, one worker per node (all of the node's GPUs to that
# worker), wired together through a run directory on a shared filesystem; then either run
# one job file to completion (--input/--output) or keep serving until scancel / time limit.
#
#   deepinfer-slurm.sh --model DIR [--input FILE --output FILE] [options]
#
# Usually started by deploy/slurm/deepinfer.sbatch; see deploy/README.md.
#
# Options:
#   --model DIR            model directory, on a filesystem every node sees (required)
#   --input FILE           job file (OpenAI Batch JSONL) to run to completion, then stop
#   --output FILE          where its output lines go (required with --input)
#   --run-dir DIR          shared directory for the port file, token, logs and job state
#                          (default: $SLURM_SUBMIT_DIR/deepinfer-$SLURM_JOB_ID)
#   --bin-dir DIR          directory holding the four deepinfer binaries (default:
#                          $DEEPINFER_BIN_DIR, else ../bin of a bundle, else bin/ of a checkout)
#   --backend cpu|cuda     worker backend (default: cpu)
#   --workers-per-node N   worker tasks per node (default 1: the worker owns every GPU of
#                          its node; >1 only for CPU tests on few nodes)
#   --ranks-per-worker N   engine ranks per worker (default: the worker decides: one per GPU)
#   --worker-arg ARG       extra flag for every worker, repeatable (e.g. --worker-arg=--threads=4)
#   --coordinator-arg ARG  extra flag for the coordinator, repeatable
#   --srun-arg ARG         extra flag for both srun steps, repeatable (e.g. --srun-arg=--mem=0)
#   --startup-timeout S    seconds for the coordinator to serve and every worker to register
#                          (default 600)
#   --job-timeout S        give up on the job after S seconds (default 0: never)
#   -h, --help             this text
#
# Exit status: 0 when the job COMPLETED (or, without --input, when stopped by a signal after
# serving); 1 when it failed, a daemon died, or a timeout passed; 2 for bad usage.
set -euo pipefail
exec </dev/null

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
log() { printf '[deepinfer-slurm %(%H:%M:%S)T] %s\n' -1 "$*"; }
die() { log "ERROR: $*" >&2; exit 1; }
bad_usage() { echo "deepinfer-slurm.sh: $*  (try --help)" >&2; exit 2; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
model="" input="" output="" run_dir="" bin_dir=${DEEPINFER_BIN_DIR:-} backend=cpu
workers_per_node=1 ranks_per_worker="" startup_timeout=600 job_timeout=0
worker_args=() coordinator_args=() srun_args=()
while [[ $# -gt 0 ]]; do
  arg=$1
  # --flag=value and --flag value both work.
  if [[ $arg == --*=* ]]; then val=${arg#*=}; arg=${arg%%=*}; has_val=1; else val=${2:-}; has_val=0; fi
  shift_by=1
  case $arg in
    -h|--help) usage; exit 0 ;;
    --model|--input|--output|--run-dir|--bin-dir|--backend|--workers-per-node|--ranks-per-worker|\
    --worker-arg|--coordinator-arg|--srun-arg|--startup-timeout|--job-timeout)
      if [[ $has_val == 0 ]]; then [[ $# -ge 2 ]] || bad_usage "$arg needs a value"; shift_by=2; fi
      case $arg in
        --model) model=$val ;;
        --input) input=$val ;;
        --output) output=$val ;;
        --run-dir) run_dir=$val ;;
        --bin-dir) bin_dir=$val ;;
        --backend) backend=$val ;;
        --workers-per-node) workers_per_node=$val ;;
        --ranks-per-worker) ranks_per_worker=$val ;;
        --worker-arg) worker_args+=("$val") ;;
        --coordinator-arg) coordinator_args+=("$val") ;;
        --srun-arg) srun_args+=("$val") ;;
        --startup-timeout) startup_timeout=$val ;;
        --job-timeout) job_timeout=$val ;;
      esac ;;
    *) bad_usage "unknown argument '$1'" ;;
  esac
  shift "$shift_by"
done

# ------------------------------------------------------------------ checks
[[ -n ${SLURM_JOB_ID:-} ]] || bad_usage "not inside a Slurm allocation (SLURM_JOB_ID is unset); submit deploy/slurm/deepinfer.sbatch with sbatch, or run this under salloc"
[[ -n $model ]] || bad_usage "--model DIR is required"
[[ -z $input || -n $output ]] || bad_usage "--input needs --output"
[[ -n $input || -z $output ]] || bad_usage "--output needs --input"
[[ $backend == cpu || $backend == cuda ]] || bad_usage "--backend must be cpu or cuda, not '$backend'"
for n in workers_per_node startup_timeout job_timeout; do
  [[ ${!n} =~ ^[0-9]+$ ]] || bad_usage "--${n//_/-} must be a number, not '${!n}'"
done
[[ $workers_per_node -ge 1 ]] || bad_usage "--workers-per-node must be >= 1"
[[ -z $ranks_per_worker || $ranks_per_worker =~ ^[1-9][0-9]*$ ]] || bad_usage "--ranks-per-worker must be >= 1"
command -v srun >/dev/null || die "srun not found on PATH"

if [[ -z $bin_dir ]]; then
  # A bundle keeps this script in slurm/ next to bin/; a checkout keeps it in deploy/slurm/.
  for d in "$here/../bin" "$here/../../bin"; do
    if [[ -x $d/deepinfer-coordinator ]]; then bin_dir=$d; break; fi
  done
  [[ -n $bin_dir ]] || die "no deepinfer binaries found in $here/../bin or $here/../../bin; pass --bin-dir (tools/setup.sh fills bin/, deploy/bundle.sh makes a bundle)"
fi
[[ -d $bin_dir ]] || die "--bin-dir '$bin_dir' is not a directory"
bin_dir=$(cd "$bin_dir" && pwd)
for b in deepinfer-coordinator deepinfer-worker deepinfer deepinfer-admin; do
  [[ -x $bin_dir/$b ]] || die "$bin_dir/$b is missing or not executable (--bin-dir)"
done
[[ -d $model || $model == dummy:* ]] || die "model directory '$model' does not exist (it must be on a filesystem every node sees)"
[[ $model == dummy:* ]] || model=$(cd "$model" && pwd)
if [[ -n $input ]]; then
  [[ -r $input ]] || die "cannot read the job file '$input'"
  input=$(cd "$(dirname "$input")" && pwd)/$(basename "$input")
  out_dir=$(dirname "$output")
  [[ -d $out_dir && -w $out_dir ]] || die "the output directory '$out_dir' does not exist or is not writable"
  output=$(cd "$out_dir" && pwd)/$(basename "$output")
fi

# Every path the tasks use must be the same on every node: the run directory lives on the
# shared filesystem the job was submitted from, one per Slurm job, so concurrent jobs never
# share a port file or a token.
run_dir=${run_dir:-${SLURM_SUBMIT_DIR:-$PWD}/deepinfer-$SLURM_JOB_ID}
mkdir -p "$run_dir/logs" "$run_dir/pids" || die "cannot create the run directory '$run_dir'"
run_dir=$(cd "$run_dir" && pwd)
rm -f "$run_dir/coordinator.port" "$run_dir/coordinator.address"
# A batch job requeued after a node failure runs again under the same job id, so with the
# same run directory: its coordinator resumes the unfinished job from state/, which must
# then not be submitted a second time.
restart=${SLURM_RESTART_COUNT:-0}
[[ $restart -gt 0 ]] || rm -f "$run_dir/job.id"

nodes=()
while read -r n; do nodes+=("$n"); done < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
[[ ${#nodes[@]} -ge 1 ]] || die "cannot expand SLURM_JOB_NODELIST='$SLURM_JOB_NODELIST'"
num_nodes=${#nodes[@]}
num_workers=$((num_nodes * workers_per_node))

# The address other nodes reach a node at is its NodeAddr, the one slurmctld itself uses
# (a node's hostname may resolve to a management interface, or not at all).
declare -A node_addr
while read -r line; do
  name=$(sed -n 's/^NodeName=\([^ ]*\).*/\1/p' <<<"$line")
  addr=$(sed -n 's/.* NodeAddr=\([^ ]*\).*/\1/p' <<<"$line")
  [[ -n $name ]] && node_addr[$name]=${addr:-$name}
done < <(scontrol show node -o "$SLURM_JOB_NODELIST" 2>/dev/null || true)
node_addrs=""
for n in "${nodes[@]}"; do node_addrs+="$n=${node_addr[$n]:-$n} "; done
head_node=${nodes[0]}
head_addr=${node_addr[$head_node]:-$head_node}

# The cluster token: fresh per allocation, readable by the job's user only.
token=$run_dir/auth.token
(umask 077; head -c 32 /dev/urandom | base64 >"$token")

# Steps must share the allocation's CPUs with each other (Slurm >= 20.11 gives each step
# exclusive CPUs unless --overlap).
step_args=(--kill-on-bad-exit=0 "${srun_args[@]}")
if [[ $(srun --help 2>&1) == *--overlap* ]]; then step_args+=(--overlap); fi

coord_pid="" worker_pids=() job_id="" stopping=0
alive() { local p; for p in "$@"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
workers_alive() { alive "${worker_pids[@]}"; }
# Stops the steps whose name starts with PREFIX and whose sruns are PIDS. A SIGTERM to srun
# itself makes it cancel its step (the tasks get SIGKILL), so the tasks are sent SIGTERM
# through `scancel --signal` and exit cleanly; sruns still there after 30 s are killed.
stop_steps() {
  local prefix=$1 label=$2 step i; shift 2
  alive "$@" || return 0
  log "stopping $label"
  for step in $(squeue -h -s -j "$SLURM_JOB_ID" -o '%i %j' 2>/dev/null | awk -v p="$prefix" 'index($2, p) == 1 {print $1}' || true); do
    scancel --signal=TERM "$step" 2>/dev/null || true
  done
  for ((i = 0; i < 300; i++)); do alive "$@" || break; sleep 0.1; done
  if alive "$@"; then
    log "$label still running after 30 s, killing"
    kill -KILL "$@" 2>/dev/null || true
  fi
  for i in "$@"; do wait "$i" 2>/dev/null || true; done
}
cleanup() {
  [[ $stopping == 0 ]] || return 0
  stopping=1
  # Workers first, so the coordinator still answers them while they drain.
  if [[ ${#worker_pids[@]} -gt 0 ]]; then stop_steps deepinfer-worker- "the workers" "${worker_pids[@]}"; fi
  if [[ -n $coord_pid ]]; then stop_steps deepinfer-coordinator "the coordinator" "$coord_pid"; fi
}
on_signal() {
  log "received SIG$1 (scancel, time limit or node failure): shutting down"
  if [[ -n $job_id && -n $output ]]; then
    # Whatever finished before the signal is kept.
    "$bin_dir/deepinfer" results "$job_id" --output "$output" --coordinator "$coord_address" \
      --auth-token-file "$token" 2>/dev/null || true
  fi
  cleanup
  exit 143
}
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT
trap cleanup EXIT
show_logs() {
  local f
  for f in "$run_dir"/logs/*.log; do
    [[ -e $f ]] || continue
    echo "---- last lines of $f"
    tail -n 25 "$f"
  done
}

log "job $SLURM_JOB_ID: $num_nodes node(s) (${nodes[*]}), $num_workers worker(s), backend $backend"
log "binaries: $bin_dir; model: $model; run directory: $run_dir"

# ------------------------------------------------------------------ coordinator
coord_cmd=("$bin_dir/deepinfer-coordinator" --listen 0.0.0.0:0
  --port-file "$run_dir/coordinator.port" --model "$model" --state-dir "$run_dir/state"
  --min-workers "$num_workers" --auth-token-file "$token" "${coordinator_args[@]}")
srun --nodes=1 --ntasks=1 --nodelist="$head_node" --job-name=deepinfer-coordinator \
  "${step_args[@]}" --output="$run_dir/logs/coordinator.log" "${coord_cmd[@]}" &
coord_pid=$!

deadline=$((SECONDS + startup_timeout))
until [[ -s $run_dir/coordinator.port ]]; do
  if ! kill -0 "$coord_pid" 2>/dev/null; then show_logs; die "the coordinator exited before serving (log: $run_dir/logs/coordinator.log)"; fi
  if ((SECONDS > deadline)); then show_logs; die "the coordinator wrote no port file within ${startup_timeout}s"; fi
  sleep 0.2
done
coord_address=$head_addr:$(cat "$run_dir/coordinator.port")
echo "$coord_address" >"$run_dir/coordinator.address"
log "coordinator serving at $coord_address"

# ------------------------------------------------------------------ workers
# One step per worker, not one step of all workers: srun ends a whole step when one of its
# tasks is killed, and a dead worker must leave the others running (the coordinator forms
# a new group without it). Each worker is named after its index (ids must differ when
# several share a node) and advertises its node's NodeAddr. Every step on a node gets all
# of the node's allocated GPUs from Slurm (CUDA_VISIBLE_DEVICES).
worker_task='
set -euo pipefail
node=${SLURMD_NODENAME:-$(hostname -s)}
addr=$node
for pair in $DEEPINFER_NODE_ADDRS; do [[ ${pair%%=*} == "$node" ]] && addr=${pair#*=}; done
id=worker-$DEEPINFER_WORKER_INDEX-$node
echo $$ >"$DEEPINFER_RUN_DIR/pids/worker-$DEEPINFER_WORKER_INDEX.pid"
echo "$id on $node ($addr): CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-none}" >&2
exec "$DEEPINFER_BIN_DIR/deepinfer-worker" --coordinator "$DEEPINFER_COORDINATOR" \
  --model "$DEEPINFER_MODEL" --backend "$DEEPINFER_BACKEND" --host 0.0.0.0 \
  --advertise-host "$addr" --worker-id "$id" --auth-token-file "$DEEPINFER_RUN_DIR/auth.token" "$@"
'
extra=("${worker_args[@]}")
[[ -z $ranks_per_worker ]] || extra+=(--ranks "$ranks_per_worker")
export DEEPINFER_NODE_ADDRS=$node_addrs DEEPINFER_RUN_DIR=$run_dir DEEPINFER_BIN_DIR=$bin_dir \
  DEEPINFER_COORDINATOR=$coord_address DEEPINFER_MODEL=$model DEEPINFER_BACKEND=$backend
for ((i = 0; i < num_workers; i++)); do
  DEEPINFER_WORKER_INDEX=$i srun --nodes=1 --ntasks=1 --nodelist="${nodes[i / workers_per_node]}" \
    --job-name="deepinfer-worker-$i" "${step_args[@]}" --output="$run_dir/logs/worker-$i.log" \
    bash -c "$worker_task" deepinfer-worker-task "${extra[@]}" &
  worker_pids+=($!)
done
log "started $num_workers worker(s); logs: $run_dir/logs/worker-N.log"

client=(--coordinator "$coord_address" --auth-token-file "$token")
# Every worker must register within the startup timeout: the coordinator waits for all
# of them (--min-workers) before it forms the first group, so a worker that never comes
# up (bad node, wrong path) would otherwise leave the job waiting until the time limit.
registered=0
until [[ $registered -ge $num_workers ]]; do
  if ! kill -0 "$coord_pid" 2>/dev/null; then show_logs; die "the coordinator exited while the workers were starting"; fi
  if ! workers_alive; then show_logs; die "every worker exited before registering"; fi
  if ((SECONDS > deadline)); then show_logs; die "only $registered of $num_workers worker(s) registered within ${startup_timeout}s"; fi
  sleep 1
  status=$("$bin_dir/deepinfer-admin" status --json "${client[@]}" 2>/dev/null || true)
  registered=$({ grep -o '"worker_id"' <<<"$status" || true; } | wc -l)
done
log "all $num_workers worker(s) registered"

# ------------------------------------------------------------------ serve only
if [[ -z $input ]]; then
  log "serving until scancel or the time limit. From any node:"
  log "  $bin_dir/deepinfer submit --input FILE --coordinator $coord_address --auth-token-file $token"
  log "  $bin_dir/deepinfer-admin status --coordinator $coord_address --auth-token-file $token"
  # Serve while the coordinator and at least one worker live; a dead worker is logged
  # (the others go on without it), the end of all of them or of the coordinator is a failure.
  while kill -0 "$coord_pid" 2>/dev/null && workers_alive; do sleep 2; done
  if ! kill -0 "$coord_pid" 2>/dev/null; then show_logs; die "the coordinator exited"; fi
  show_logs; die "every worker exited"
fi

# ------------------------------------------------------------------ one job
if [[ $restart -gt 0 && -s $run_dir/job.id ]]; then
  job_id=$(cat "$run_dir/job.id")
  log "Slurm restart $restart: the coordinator resumes job $job_id from $run_dir/state"
else
  job_id=$("$bin_dir/deepinfer" submit --input "$input" --name "slurm-$SLURM_JOB_ID" "${client[@]}" | tail -n 1) \
    || { show_logs; die "deepinfer submit failed"; }
  echo "$job_id" >"$run_dir/job.id"
  log "submitted $input as job $job_id"
fi

"$bin_dir/deepinfer" wait "$job_id" "${client[@]}" >"$run_dir/wait.out" 2>"$run_dir/logs/wait.log" &
wait_pid=$!
# `deepinfer wait` follows the job; this loop notices what it cannot: every worker gone
# (the job would wait forever for a group), or the time limit of --job-timeout.
started=$SECONDS failure="" gone=()
while kill -0 "$wait_pid" 2>/dev/null; do
  for i in "${!worker_pids[@]}"; do
    if [[ -z ${gone[i]:-} ]] && ! kill -0 "${worker_pids[i]}" 2>/dev/null; then
      gone[i]=1
      log "worker $i exited; the job goes on with the others (log: $run_dir/logs/worker-$i.log)"
    fi
  done
  if ! kill -0 "$coord_pid" 2>/dev/null; then failure="the coordinator exited"; break; fi
  if ! workers_alive; then failure="every worker exited"; break; fi
  if ((job_timeout > 0 && SECONDS - started > job_timeout)); then failure="the job did not finish within --job-timeout=${job_timeout}s"; break; fi
  sleep 1
done
wait_rc=0
if [[ -n $failure ]]; then
  kill "$wait_pid" 2>/dev/null || true
  wait "$wait_pid" 2>/dev/null || true
  wait_rc=1
else
  wait "$wait_pid" || wait_rc=$?
fi
summary=$(cat "$run_dir/wait.out" 2>/dev/null || true)
log "job $job_id: ${summary:-no final state (see $run_dir/logs/wait.log)}"
results_rc=0
"$bin_dir/deepinfer" results "$job_id" --output "$output" "${client[@]}" || results_rc=$?
if [[ -n $failure ]]; then show_logs; die "$failure"; fi
if [[ $results_rc -ne 0 ]]; then show_logs; die "could not fetch the results of job $job_id"; fi
if [[ $wait_rc -ne 0 ]]; then show_logs; die "job $job_id did not complete: $(cat "$run_dir/logs/wait.log" 2>/dev/null | tail -n 3)"; fi
log "output: $output ($(wc -l <"$output") line(s))"
cleanup
log "done"
