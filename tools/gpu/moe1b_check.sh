#!/bin/bash
# moe1b_check.sh - session 8 branch s8-moe1b's device call, from a bundle made by
# tools/gpu/prepare.sh with (at least) these targets:
#   GPU_TESTS="//kernels/moe:moe_decode_fused_test //kernels/moe:noaux_tc_router_fused_test
#     //worker/backend/cuda:cuda_backend_test //worker/model:decode_graph_gpu_test
#     //tests/parity:cuda_parity_test"
#   GPU_TOOLS="//tools/bench:deepinfer-bench //worker/backend/cuda:moe_block_decode_bench
#     //kernels/moe:noaux_tc_router_bench"
#
#   OUT=/tmp/out bash moe1b_check.sh        (results in $OUT, each step under `timeout`)
#
# 1. tests.txt: the GPU tests of the MoE block and the router (in parallel: they are CPU-bound
#    references), a failing test's log tail;
# 2. block.txt: moe_block_decode_bench (kStationary vs kSharedFirst, the routed rows with and
#    without SetRouterRankSelect);
# 3. e2e.txt: the 27-layer decode at one request, main's kernels (A: stationary, no rank
#    select) against the branch's defaults (B), alternating A B A B, each its own process;
# 4. ncu.txt: Nsight Compute on one routed Moonlight layer at one token (router, gate_up, down:
#    time, DRAM bytes and throughput, occupancy, warp stalls), new then old;
# 5. router.txt: noaux_tc_router_bench (rank select off / on), if time is left.
set -u
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TEST_SRCDIR="$here/srcdir"
export NCCL_NVLS_ENABLE=0
export PATH="$PATH:/usr/local/cuda/bin"
budget=${MOE1B_BUDGET:-112}
left() { echo $((budget - SECONDS)); }
cd "$here"

# 1. Tests.
logs=$(mktemp -d /tmp/moe1b_tests.XXXXXX)
run_test() {
  local name=$1
  shift
  local t0=$SECONDS
  timeout 55 "bin/$name" "$@" > "$logs/$name.txt" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - t0))s $(grep -E '^\[  (PASSED|FAILED) ' "$logs/$name.txt" | tr '\n' ' ')" \
    > "$logs/$name.summary"
}
run_test moe_decode_fused_test &
run_test noaux_tc_router_fused_test &
run_test cuda_backend_test \
  --gtest_filter='*RoutedAndShared*:*RouteTokens*:*ResidentWorkspaces*:*NormedDenseMlp*:*DecodeMoe*:*Router*' &
run_test decode_graph_gpu_test &
run_test cuda_parity_test &
wait
{
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,power.limit --format=csv
  cat "$logs"/*.summary
  for f in "$logs"/*.txt; do
    if grep -qE '^\[  FAILED  \]|Segmentation|Aborted' "$f" || ! grep -qE '^\[  PASSED  \]' "$f"; then
      echo "==== $(basename "$f")"
      grep -E 'Failure|FAILED|Expected|Which is|actual|differ|error' "$f" | head -40
      tail -15 "$f"
    fi
  done
} > "$OUT/tests.txt" 2>&1

# 2. The block bench.
timeout $(($(left) > 30 ? 30 : $(left))) bin/moe_block_decode_bench > "$OUT/block.txt" 2>&1
echo "# rc $? at ${SECONDS}s" >> "$OUT/block.txt"

# 3. 27 layers at one request, A B A B.
bench=(bin/deepinfer-bench --backend cuda --dtype bfloat16 --load-format dummy --seed 1
  --context-length 1024 --decode-fill random --warmup 3 --output-len 11
  --model configs/moonlight_shaped.json --decode-num-requests 1 --prefill-batch-tokens 0 --iters 3)
for arm in A B A B; do
  [[ $(left) -lt 12 ]] && break
  if [[ $arm == A ]]; then
    flags=(--decode-moe-fused-kernels=stationary --router-rank-select=false)
  else
    flags=()
  fi
  echo "# $arm: ${flags[*]:-(defaults: sharedfirst, rank select)} at ${SECONDS}s" >> "$OUT/e2e.txt"
  timeout $(($(left) > 25 ? 25 : $(left))) "${bench[@]}" "${flags[@]}" 2>&1 |
    grep -E '^(decode|prefill):|rror' >> "$OUT/e2e.txt"
done

# 4. ncu, one routed Moonlight layer at one token: new (rsra) then old (rsta).
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
for path in rsra rsta; do
  [[ $(left) -lt 8 || -z "$ncu" ]] && break
  echo "# ncu $path at ${SECONDS}s" >> "$OUT/ncu.txt"
  timeout $(($(left) > 20 ? 20 : $(left))) "$ncu" --graph-profiling node --cache-control all \
    --clock-control none --kernel-name-base demangled -k 'regex:RouteTokens|GateUp|DownStationary' -c 3 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --metrics dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active \
    bin/moe_block_decode_bench moonlight 1 "$path" >> "$OUT/ncu.txt" 2>&1
  echo "# ncu rc $?" >> "$OUT/ncu.txt"
done

# 5. The router alone.
if [[ $(left) -gt 6 ]]; then
  timeout $(left) bin/noaux_tc_router_bench > "$OUT/router.txt" 2>&1
  echo "# rc $? at ${SECONDS}s" >> "$OUT/router.txt"
fi
echo "done at ${SECONDS}s" >> "$OUT/tests.txt"
