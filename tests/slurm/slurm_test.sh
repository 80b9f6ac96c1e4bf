#!/usr/bin/env bash
# slurm_test.sh - deploy/slurm against a real Slurm: starts a one-node Slurm 22.05 on
# loopback (tests/slurm/start-local-slurm.sh: munged, slurmctld, slurmd from Debian, with
# 8 advertised CPUs and 2 fake GPUs), bundles the built binaries (deploy/bundle.sh) and
# submits deploy/slurm/deepinfer.sbatch with the bundle, the CPU backend, the fixture model
# tests/fixtures/dsv3_qlora_rope and 1 coordinator + 2 worker tasks. Cases:
#   bundle        the bundle resolves its libraries and runs from another directory
#   job           the Slurm job COMPLETES; every request has exactly one good output line
#                 with max_tokens tokens; both workers registered under different ids and
#                 each saw the node's GPUs; no deepinfer process is left behind
#   killed_worker one worker task is SIGKILLed mid-job; the Slurm job still COMPLETES with
#                 every request exactly once and no error
#   scancel       a serving cluster (a copy of the sbatch script, DEEPINFER_HOME=bundle) is
#                 scancel'ed: CANCELLED, every daemon exits through its SIGTERM path, no
#                 process left
# Slurm is stopped afterwards whatever happened. Prints "PASS: slurm/CASE" or
# "FAIL: slurm/CASE" per case and ends with "slurm: N passed, N failed"; exit 1 on a failure.
#
#   tests/slurm/slurm_test.sh [--bazel-bin DIR] [--keep]
#     --bazel-bin DIR  where the built binaries are (default: bazel-bin of the checkout)
#     --keep           keep the work directory (logs, outputs) even when everything passed
# Needs root (the Slurm daemons run as root) and Debian's apt for the Slurm packages the
# first time. Runs outside Bazel's sandbox: slurmd must fork job steps as root.
set -euo pipefail
exec </dev/null

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bazel_bin=$root/bazel-bin keep=0
while [[ $# -gt 0 ]]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --bazel-bin) [[ $# -ge 2 ]] || { echo "--bazel-bin needs a directory" >&2; exit 2; }; bazel_bin=$2; shift ;;
    --keep) keep=1 ;;
    *) echo "slurm_test.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ $(id -u) -eq 0 ]] || { echo "slurm_test.sh: must run as root (it starts munged, slurmctld and slurmd)" >&2; exit 2; }

T0=$SECONDS
log() { printf '[slurm_test %4ds] %s\n' $((SECONDS - T0)) "$*"; }
passed=0 failed=0
pass() { echo "PASS: slurm/$1 ($((SECONDS - case_t0))s)"; passed=$((passed + 1)); }
fail() { echo "FAIL: slurm/$1: $2"; failed=$((failed + 1)); show_logs=1; }

work=$(mktemp -d /tmp/deepinfer-slurm-test.XXXXXX)
chmod 755 "$work"   # munged refuses a socket below a directory others cannot enter
export SLURM_LOCAL_BASE=$work/slurm
show_logs=0
finish() {
  local rc=$?
  log "stopping Slurm"
  bash "$root/tests/slurm/stop-local-slurm.sh" || true
  if [[ $show_logs == 1 || $rc -ne 0 ]]; then
    local f
    for f in "$SLURM_LOCAL_BASE"/log/slurmctld.log "$SLURM_LOCAL_BASE"/log/slurmd.log \
             "$work"/case-*/deepinfer-*.out "$work"/case-*/deepinfer-*/logs/*.log; do
      [[ -f $f ]] || continue
      echo "---- last lines of $f"; tail -n 40 "$f"
    done
    echo "work directory kept: $work"
  elif [[ $keep == 1 ]]; then
    echo "work directory kept: $work"
  else
    rm -rf "$work"
  fi
}
trap finish EXIT
trap 'exit 130' INT TERM

# Free TCP ports for the Slurm daemons, so a second test run or a real Slurm on this host
# cannot collide with ours.
free_ports() {
  python3 -c 'import socket
ss=[socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))'
}
read -r ctld_port slurmd_port < <(free_ports)

log "starting a local Slurm in $SLURM_LOCAL_BASE (slurmctld :$ctld_port, slurmd :$slurmd_port)"
# 8 CPUs (the hardware may have 2) so that the coordinator and two worker tasks fit; two
# fake GPUs so that the GPU request path (--gpus-per-node) is exercised too.
SLURM_LOCAL_CPUS=8 SLURM_LOCAL_FAKE_GPUS=2 SLURM_LOCAL_LINK_ETC=0 SLURM_LOCAL_TIMEOUT=120 \
SLURM_LOCAL_CTLD_PORT=$ctld_port SLURM_LOCAL_SLURMD_PORT=$slurmd_port \
  bash "$root/tests/slurm/start-local-slurm.sh" || {
  case_t0=$SECONDS
  for c in bundle job killed_worker scancel; do fail "$c" "not run: the local Slurm did not start"; done
  echo "slurm: $passed passed, $failed failed"
  exit 1
}
export SLURM_CONF=$SLURM_LOCAL_BASE/etc/slurm.conf

# ------------------------------------------------------------------ bundle
case_t0=$SECONDS
bundle=$work/bundle/deepinfer
if ! bash "$root/deploy/bundle.sh" --from "$bazel_bin" --out "$bundle"; then
  fail bundle "deploy/bundle.sh failed"
  for c in job killed_worker scancel; do fail "$c" "not run: no bundle"; done
  echo "slurm: $passed passed, $failed failed"
  exit 1
fi
# Run from an unrelated directory, empty environment: only $ORIGIN can find lib/.
err=""
for b in deepinfer-coordinator deepinfer-worker deepinfer deepinfer-admin deepinfer-bench; do
  libs=$(cd / && env -i ldd "$bundle/bin/$b")
  [[ $libs != *"not found"* ]] || err+=" $b: library not found;"
  [[ $libs == *"$bundle/bin/../lib/"* ]] || err+=" $b: no library resolved from the bundle;"
  (cd / && env -i "$bundle/bin/$b" --help >/dev/null 2>&1) || err+=" $b --help failed;"
done
[[ -x $bundle/slurm/deepinfer-slurm.sh && -f $bundle/slurm/deepinfer.sbatch ]] || err+=" slurm scripts missing;"
if [[ -z $err ]]; then pass bundle; else fail bundle "$err"; fi

# ------------------------------------------------------------------ helpers
model=$root/tests/fixtures/dsv3_qlora_rope
# make_job FILE N MAX_TOKENS SEED: N completion requests with token-id prompts (ids 2..999,
# no BOS/EOS); every third one samples with a seed, the others are greedy.
make_job() {
  python3 - "$@" <<'EOF'
import json, random, sys
path, n, max_tokens, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)
with open(path, "w") as f:
    for i in range(n):
        body = {"prompt": [rng.randint(2, 999) for _ in range(rng.randint(3, 22))],
                "max_tokens": max_tokens, "ignore_eos": True, "return_token_ids": True}
        if i % 3 == 2:
            body.update(temperature=0.8, top_p=0.9, seed=1000 + i)
        else:
            body["temperature"] = 0
        f.write(json.dumps({"custom_id": f"req-{i}", "method": "POST",
                            "url": "/v1/completions", "body": body}) + "\n")
EOF
}
# check_output FILE N MAX_TOKENS: every req-0..req-N-1 exactly once, no error, MAX_TOKENS
# tokens each; prints what is wrong and fails otherwise.
check_output() {
  python3 - "$@" <<'EOF'
import json, sys
path, n, max_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
seen, problems = {}, []
for no, line in enumerate(open(path), 1):
    try:
        j = json.loads(line)
    except ValueError:
        problems.append(f"line {no}: not JSON"); continue
    cid = j.get("custom_id")
    seen[cid] = seen.get(cid, 0) + 1
    if j.get("error") is not None:
        problems.append(f"{cid}: error {j['error']}"); continue
    toks = j["response"]["body"]["choices"][0].get("token_ids", [])
    if len(toks) != max_tokens:
        problems.append(f"{cid}: {len(toks)} tokens, expected {max_tokens}")
want = {f"req-{i}" for i in range(n)}
problems += [f"{c}: {k} lines" for c, k in seen.items() if k != 1]
problems += [f"{c}: missing" for c in sorted(want - seen.keys())]
problems += [f"{c}: unexpected" for c in sorted(seen.keys() - want)]
if problems:
    print(f"{path}: {len(problems)} problem(s): " + "; ".join(problems[:10]))
    sys.exit(1)
print(f"{path}: {n} requests, each exactly once, {max_tokens} tokens, no errors")
EOF
}
# job_state ID -> "STATE EXITCODE"
job_state() {
  local line
  line=$(scontrol show job -o "$1" 2>/dev/null || true)
  echo "$(sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' <<<"$line") $(sed -n 's/.* ExitCode=\([0-9:]*\).*/\1/p' <<<"$line")"
}
is_final() {
  case ${1%% *} in
    COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|PREEMPTED|BOOT_FAIL|DEADLINE) return 0 ;;
  esac
  return 1
}
# wait_slurm_job ID SECONDS -> final "STATE EXITCODE", or "STUCK <state>"
wait_slurm_job() {
  local end=$((SECONDS + $2)) st
  while :; do
    st=$(job_state "$1")
    if is_final "$st"; then echo "$st"; return; fi
    if ((SECONDS > end)); then scancel "$1" || true; echo "STUCK $st"; return; fi
    sleep 1
  done
}
# submit CASE_DIR ARGS...: sbatch the launcher from CASE_DIR (the "shared" submit directory)
submit() {
  local dir=$1; shift
  (cd "$dir" && sbatch --parsable --time=00:30:00 --gpus-per-node=2 "${sbatch_script:-$bundle/slurm/deepinfer.sbatch}" \
     --model "$model" --workers-per-node 2 --worker-arg=--threads=1 --job-timeout 1200 "$@")
}
# deepinfer processes started from this work directory that are still alive
leftovers() {
  local p
  for p in /proc/[0-9]*; do
    [[ $({ tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null) == "$bundle/bin/deepinfer"* ]] && echo -n "${p#/proc/} "
  done
  return 0
}

# ------------------------------------------------------------------ job
case_t0=$SECONDS
dir=$work/case-job; mkdir -p "$dir"
n=24 tokens=8
make_job "$dir/input.jsonl" $n $tokens 7
jid=$(submit "$dir" --input "$dir/input.jsonl" --output "$dir/output.jsonl")
log "job: Slurm job $jid ($n requests x $tokens tokens, 2 workers)"
st=$(wait_slurm_job "$jid" 1500)
log "job: Slurm job $jid ended: $st"
err=""
[[ $st == "COMPLETED 0:0" ]] || err+=" Slurm job state '$st', expected 'COMPLETED 0:0';"
run=$dir/deepinfer-$jid
if [[ -f $dir/output.jsonl ]]; then
  check_output "$dir/output.jsonl" $n $tokens || err+=" output check failed;"
else
  err+=" no output file;"
fi
for w in 0 1; do
  grep -q "worker-$w-.*CUDA_VISIBLE_DEVICES=0,1" "$run/logs/worker-$w.log" 2>/dev/null ||
    err+=" worker task $w did not report both GPUs;"
done
ids=$(grep -ho 'worker-[01]-[A-Za-z0-9_.-]*' "$run/logs/coordinator.log" 2>/dev/null | sort -u | wc -l)
[[ $ids -ge 2 ]] || err+=" the coordinator log names $ids distinct worker id(s), expected 2;"
sleep 1
left=$(leftovers)
[[ -z $left ]] || err+=" deepinfer processes left behind: $left;"
if [[ -z $err ]]; then pass job; else fail job "$err"; fi

# ------------------------------------------------------------------ killed_worker
case_t0=$SECONDS
dir=$work/case-killed; mkdir -p "$dir"
n=200 tokens=64
make_job "$dir/input.jsonl" $n $tokens 11
# --max-running=8: requests finish one after another instead of all at the end, so the
# kill lands while most of the job is still to do. --collective-timeout-s=30: after the
# kill the coordinator first retries 2-rank groups, which leave the survivor waiting for its
# dead peer until this timeout (default 300 s) before the 1-rank group can form.
jid=$(submit "$dir" --input "$dir/input.jsonl" --output "$dir/output.jsonl" \
  --coordinator-arg=--heartbeat-timeout-ms=3000 --worker-arg=--max-running=8 \
  --worker-arg=--collective-timeout-s=30)
run=$dir/deepinfer-$jid
log "killed_worker: Slurm job $jid ($n requests x $tokens tokens)"
err="" killed_at=""
end=$((SECONDS + 900))
while :; do
  st=$(job_state "$jid")
  if is_final "$st"; then err+=" the Slurm job ended ($st) before a worker could be killed;"; break; fi
  if ((SECONDS > end)); then err+=" no progress within 900 s;"; break; fi
  if [[ -s $run/job.id && -s $run/coordinator.address ]]; then
    done_now=$("$bundle/bin/deepinfer" status "$(cat "$run/job.id")" --json \
      --coordinator "$(cat "$run/coordinator.address")" --auth-token-file "$run/auth.token" 2>/dev/null |
      python3 -c 'import json,sys; print(json.loads(sys.stdin.read() or "{}").get("completed_requests", 0))' 2>/dev/null || echo 0)
    if [[ $done_now -ge 3 ]]; then
      pid=$(cat "$run/pids/worker-1.pid")
      [[ $(tr '\0' ' ' <"/proc/$pid/cmdline") == *deepinfer-worker* ]] || { err+=" pid $pid is not a worker;"; break; }
      kill -KILL "$pid"
      killed_at=$done_now
      log "killed_worker: SIGKILLed worker task 1 (pid $pid) with $done_now/$n requests done"
      break
    fi
  fi
  sleep 0.5
done
if [[ -n $killed_at ]]; then
  [[ $killed_at -lt $n ]] || err+=" the job had finished before the kill;"
  st=$(wait_slurm_job "$jid" 1500)
  log "killed_worker: Slurm job $jid ended: $st"
  [[ $st == "COMPLETED 0:0" ]] || err+=" Slurm job state '$st', expected 'COMPLETED 0:0';"
  if [[ -f $dir/output.jsonl ]]; then
    check_output "$dir/output.jsonl" $n $tokens || err+=" output check failed;"
  else
    err+=" no output file;"
  fi
  # The survivor finished the job in a new group, under the same Slurm job.
  grep -q "forming group generation [2-9]" "$run/logs/coordinator.log" ||
    err+=" the coordinator never formed a second group;"
  grep -q "worker 1 exited; the job goes on" "$dir/deepinfer-$jid.out" ||
    err+=" the launcher did not report the dead worker;"
fi
sleep 1
left=$(leftovers)
[[ -z $left ]] || err+=" deepinfer processes left behind: $left;"
if [[ -z $err ]]; then pass killed_worker; else fail killed_worker "$err"; fi

# ------------------------------------------------------------------ scancel
# A serving cluster (no --input) stopped by scancel: the job ends CANCELLED, every daemon
# exits through its SIGTERM path (logs "shutting down"), nothing is left running. Submitted
# as a user's own copy of the batch script, which finds the launcher through DEEPINFER_HOME.
case_t0=$SECONDS
dir=$work/case-scancel; mkdir -p "$dir"
cp "$bundle/slurm/deepinfer.sbatch" "$dir/my-deepinfer.sbatch"
jid=$(DEEPINFER_HOME=$bundle sbatch_script=$dir/my-deepinfer.sbatch submit "$dir")
run=$dir/deepinfer-$jid
log "scancel: Slurm job $jid (serving)"
err=""
end=$((SECONDS + 600))
until grep -q "all 2 worker(s) registered" "$dir/deepinfer-$jid.out" 2>/dev/null; do
  if is_final "$(job_state "$jid")" || ((SECONDS > end)); then err+=" the cluster never came up ($(job_state "$jid"));"; break; fi
  sleep 0.5
done
if [[ -z $err ]]; then
  scancel "$jid"
  st=$(wait_slurm_job "$jid" 300)
  log "scancel: Slurm job $jid ended: $st"
  [[ $st == CANCELLED* ]] || err+=" Slurm job state '$st', expected CANCELLED;"
  for f in coordinator worker-0 worker-1; do
    grep -q "received, shutting down" "$run/logs/$f.log" 2>/dev/null || err+=" $f did not shut down on SIGTERM;"
  done
fi
sleep 1
left=$(leftovers)
[[ -z $left ]] || err+=" deepinfer processes left behind: $left;"
if [[ -z $err ]]; then pass scancel; else fail scancel "$err"; fi

log "done in $((SECONDS - T0)) s"
echo "slurm: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
