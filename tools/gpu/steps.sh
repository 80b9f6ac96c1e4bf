#!/bin/bash
# steps.sh - sourced by tools/gpu/suite.sh (the GPU machine's suite runner) from a bundle made by
# tools/gpu/prepare.sh, which copies it next to it:
#
#   here=$(cd "$(dirname "$0")" && pwd)
#   STEP_BUDGET_S=110                    # optional budget for all steps, from the sourcing on
#   . "$here/steps.sh"
#
# It sets up the bundle's environment (its lib/ on LD_LIBRARY_PATH, TEST_SRCDIR for the tests'
# fixtures, NCCL_NVLS_ENABLE=0, the CUDA tools on PATH), B=$here/bin and C=$here/configs, an
# empty log folder, $OUT/summary.txt and $OUT/machine.txt (GPU, driver, cuBLAS, commit), and
# defines
#
#   step NAME MAX_S COMMAND...
#
# which runs COMMAND with a timeout of MAX_S seconds (less when STEP_BUDGET_S is set and less is
# left; skipped when under 3 s are left or COMMAND is not there), its output in the log NAME.log,
# and appends one line to $OUT/summary.txt: the verdict (PASS, FAIL(rc=N); "+SKIPS" when a gtest
# binary skipped tests, which is no pass on a GPU), the time, and the gtest result lines and
# the benchmark's `prefill:` / `decode:` lines. After each step the logs are archived into
# $OUT/logs.tar.gz (the device tool returns at most 8 files, and a call cut short still returns
# what ran). $failed counts failed steps.
if [[ -z "${here:-}" ]]; then
  echo "steps.sh: set 'here' to the bundle folder before sourcing" >&2
  exit 2
fi
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TEST_SRCDIR="$here/srcdir"
export NCCL_NVLS_ENABLE=0
export PATH="$PATH:/usr/local/cuda/bin"
B="$here/bin"
C="$here/configs"
logs=$(mktemp -d /tmp/gpu-logs.XXXXXX)
summary="$OUT/summary.txt"
: > "$summary"
failed=0
steps_start=$(date +%s)
{
  echo "commit: $(head -1 "$here/COMMIT" 2>/dev/null)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  ls -la /usr/local/cuda/lib64/libcublas.so* 2>/dev/null | head -3
} > "$OUT/machine.txt" 2>&1

# Seconds left of STEP_BUDGET_S (a large number without a budget).
steps_left() {
  if [[ -z "${STEP_BUDGET_S:-}" ]]; then
    echo 1000000
  else
    echo $((STEP_BUDGET_S - ($(date +%s) - steps_start)))
  fi
}

step() {  # step NAME MAX_S COMMAND...
  local name=$1 limit=$2
  shift 2
  if ! command -v "$1" > /dev/null; then
    echo "$name SKIPPED (not bundled: $1)" | tee -a "$summary"
    return
  fi
  local left
  left=$(steps_left)
  if ((left < 3)); then
    echo "$name SKIPPED (time budget spent)" | tee -a "$summary"
    return
  fi
  ((limit > left)) && limit=$left
  local start_ms=$(($(date +%s%N) / 1000000))
  local line_buffered=()
  command -v stdbuf > /dev/null && line_buffered=(stdbuf -oL -eL)
  timeout "$limit" "${line_buffered[@]}" "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  local ms=$(($(date +%s%N) / 1000000 - start_ms))
  local verdict=PASS
  [[ $rc -eq 0 ]] || { verdict="FAIL(rc=$rc)"; failed=$((failed + 1)); }
  if grep -q '\[  SKIPPED \]' "$logs/$name.log" 2>/dev/null; then verdict="$verdict+SKIPS"; fi
  printf '%-40s %-16s %5d.%03ds  %s\n' "$name" "$verdict" $((ms / 1000)) $((ms % 1000)) \
    "$(grep -E '^\[  (PASSED|FAILED) |ERROR SUMMARY|^prefill:|^decode:' "$logs/$name.log" |
      tr '\n' ' ' | cut -c1-900)" | tee -a "$summary"
  tar -C "$logs" -czf "$OUT/logs.tar.gz" .
}
