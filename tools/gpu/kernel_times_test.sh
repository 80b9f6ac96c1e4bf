#!/bin/bash
# kernel_times.py on made-up Nsight Compute CSVs: the step period, the per-kernel sums, units,
# and clear errors.
set -u
script=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() {  # check NAME EXPECTED_GREP FILE
  if ! grep -qE -- "$2" "$3"; then
    echo "FAIL: $1: no line matching '$2' in:"; cat "$3"; fail=1
  else
    echo "ok: $1"
  fi
}
header='"ID","Process ID","Process Name","Kernel Name","Context","Stream","gpu__time_duration.sum"'
units='"","","","","","","nsecond"'
# A prefill, then 4 decode steps of 2 layers each (norm, gemm, attn per layer, then lm_head and
# sample): the layers repeat inside a step, the step period is 8.
{
  echo "==PROF== Connected to process"
  echo "$header"; echo "$units"
  id=0
  for k in prefill_gemm prefill_attn prefill_gemm; do echo "\"$id\",\"1\",\"b\",\"$k\",\"1\",\"7\",\"50,000\""; id=$((id+1)); done
  for s in 1 2 3 4; do
    for l in 1 2; do
      echo "\"$id\",\"1\",\"b\",\"norm\",\"1\",\"7\",\"1000\""; id=$((id+1))
      echo "\"$id\",\"1\",\"b\",\"gemm<bf16>\",\"1\",\"7\",\"4000\""; id=$((id+1))
      echo "\"$id\",\"1\",\"b\",\"attn\",\"1\",\"7\",\"3000\""; id=$((id+1))
    done
    echo "\"$id\",\"1\",\"b\",\"gemm<bf16>\",\"1\",\"7\",\"10000\""; id=$((id+1))
    echo "\"$id\",\"1\",\"b\",\"sample\",\"1\",\"7\",\"2000\""; id=$((id+1))
  done
} > "$tmp/a.csv"
python3 "$script" --steps 3 "$tmp/a.csv" > "$tmp/a.out" 2>&1
check "period and total" "kernels per decode step: 8, summed kernel time per step: 28.0 us" "$tmp/a.out"
check "gemm sum" "^ +18.0 us +64.3% +3 calls +gemm<bf16>$" "$tmp/a.out"
check "norm sum" "^ +2.0 us +7.1% +2 calls +norm$" "$tmp/a.out"
check "sample" "^ +2.0 us +7.1% +1 calls +sample$" "$tmp/a.out"
# Our launch wrappers are stripped from the names, and --order lists the last step in order.
sed -e 's/"norm"/"void launch_internal::WaitThenRun<\&deepinfer::<unnamed>::AddRmsNormBody>"/' \
  "$tmp/a.csv" > "$tmp/e.csv"
python3 "$script" --steps 3 --order "$tmp/e.csv" > "$tmp/e.out" 2>&1
check "wrapper stripped" "^ +2.0 us +7.1% +2 calls +AddRmsNormBody>$" "$tmp/e.out"
check "order first" "^ +0 +1.0 us +AddRmsNormBody>$" "$tmp/e.out"
check "order last" "^ +7 +2.0 us +sample$" "$tmp/e.out"
# The same in microseconds.
sed -e 's/"nsecond"/"usecond"/' -e 's/"50,000"/"50"/' "$tmp/a.csv" |
  sed -E 's/"([0-9]+)000"$/"\1"/' > "$tmp/b.csv"
python3 "$script" --steps 2 "$tmp/b.csv" > "$tmp/b.out" 2>&1
check "usecond units" "summed kernel time per step: 28.0 us" "$tmp/b.out"
# No repetition at the end: a clear error, exit status 1.
head -n 8 "$tmp/a.csv" > "$tmp/c.csv"
if python3 "$script" --steps 3 "$tmp/c.csv" > "$tmp/c.out" 2>&1; then
  echo "FAIL: no repetition accepted"; fail=1
else
  check "no repetition" "do not repeat 3 times" "$tmp/c.out"
fi
# Not an ncu CSV.
echo "hello" > "$tmp/d.csv"
if python3 "$script" "$tmp/d.csv" > "$tmp/d.out" 2>&1; then
  echo "FAIL: bad CSV accepted"; fail=1
else
  check "bad csv" "no header with 'Kernel Name'" "$tmp/d.out"
fi
exit $fail
