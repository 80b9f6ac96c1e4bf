#!/usr/bin/env bash
# Runs every test (bazel test //...), then the Slurm deployment tests (tests/slurm, outside
# Bazel's sandbox: they start real Slurm daemons as root), and ends with one line
# "N passed, N failed" (counted per test target, plus one per Slurm test case).
# Extra arguments go to bazel, e.g. tools/test.sh -c opt.
# DEEPINFER_SKIP_SLURM_TESTS=1 skips tests/slurm (also skipped, with a note, when not root).
set -uo pipefail
cd "$(dirname "$0")/.."
for f in tools/ci/setup.d/*.sh; do
  [[ -e "$f" ]] || continue
  bash "$f" || { echo "test setup $f failed"; echo "0 passed, 1 failed"; exit 1; }
done
log=$(mktemp)
bazel test "$@" //... 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
failed=$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|NO STATUS|FLAKY|INCOMPLETE)|FAILED TO BUILD' "$log")
if [[ $rc -ne 0 && $failed -eq 0 ]]; then failed=1; fi  # build broke before tests ran

# tests/slurm uses the binaries `bazel test` just built (bazel-bin).
if [[ ${DEEPINFER_SKIP_SLURM_TESTS:-0} == 1 ]]; then
  echo "tests/slurm skipped (DEEPINFER_SKIP_SLURM_TESTS=1)"
elif [[ $(id -u) -ne 0 ]]; then
  echo "tests/slurm skipped: needs root (it starts munged, slurmctld and slurmd)"
elif [[ ! -x bazel-bin/worker/deepinfer-worker ]]; then
  echo "tests/slurm not run: the binaries did not build"
  failed=$((failed + 1))
else
  echo "== tests/slurm/slurm_test.sh"
  bash tests/slurm/slurm_test.sh 2>&1 | tee "$log"
  slurm_rc=${PIPESTATUS[0]}
  slurm_passed=$(grep -cE '^PASS: slurm/' "$log")
  slurm_failed=$(grep -cE '^FAIL: slurm/' "$log")
  if [[ $slurm_rc -ne 0 && $slurm_failed -eq 0 ]]; then slurm_failed=1; fi  # died before a case ended
  passed=$((passed + slurm_passed))
  failed=$((failed + slurm_failed))
fi
rm -f "$log"
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
