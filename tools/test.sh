#!/usr/bin/env bash
# Runs every test (bazel test //...) and ends with one line "N passed, N failed"
# (counted per test target). Extra arguments go to bazel, e.g. tools/test.sh -c opt.
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
rm -f "$log"
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
