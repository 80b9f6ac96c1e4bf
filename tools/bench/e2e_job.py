#!/usr/bin/env python3
"""e2e_job.py - what a batch job really costs: one job through `deepinfer run` (a local
coordinator and worker processes), its wall time split and priced against the step benchmark.

  python3 e2e_job.py --bin-dir BIN --config CONFIG.json --backend cuda --workload long-sampled \
      --out DIR [--requests N] [--max-tokens M] [--hf-requests 64]
  (--model DIR instead of --config: a checkpoint's real weights; HF still builds random ones)

Runs, in this order, in one call:
 1. the job (make_job.py's workload, or --job FILE) with dummy weights of CONFIG.json:
    `BIN/deepinfer run --model dummy:CONFIG.json --backend B ...`, the workers writing their
    step statistics (deepinfer-worker --step-stats-dir; worker/engine/step_stats.h);
 2. deepinfer-bench (BIN/deepinfer-bench) on the same backend and config: decode step times at
    a grid of batch sizes up to the largest the job ran, at the job's mean context, with the job's
    sampling, one prefill step of --max-batch-tokens tokens, and mixed steps (decode rows and
    prompt tokens in one step, --mixed-steps) at a grid of points spanning the job's;
 3. optionally HF transformers' generate on the first --hf-requests requests of the same job
    (hf_generate.py, GPU only).

Reports (stdout: a table row; DIR/e2e.json: everything):
  wall        the `deepinfer run` process, start to exit
  start-up    from the start to the first engine step: process start (to the worker's main),
              registration and group configuration, then the rank's own phases as the worker
              logs them (group, backend, data plane, memory check, weights, memory plan and KV
              cache, graph capture, warm-up, engine and barrier), then waiting for the first
              request; also the weight load's GB and GB/s, the decode graphs recorded at
              start-up and the warm-up's steps and tokens, as the worker logs them
  serving     first step start to last step end (rank 0; the latest end of all ranks)
  tail        last step end to the process exit, split (tail_breakdown_s) at the moments the
              processes log: results reported to the coordinator (the job complete), the end
              seen by `deepinfer run`, results written, workers stopped (worker_shutdown_s:
              the first worker's signal to shutdown, leaving the coordinator, its server, its
              ranks, the KV store flush, the process exit), coordinator stopped, the exit
  capture     time recording decode graphs: the worker's start-up capture (the graph capture
              phase, within start-up) plus the steps that recorded one while serving (graphs
              the start-up did not record: with logit adjustments, expert-parallel groups; a
              bucket's first step runs eagerly, then is recorded); the recordings alone, as the
              worker logs them, are graph_record_s
  ideal       the job's steps priced with deepinfer-bench's step times, summed over the
              batch-size histogram the workers recorded (steps keyed by d decode rows and p
              prefill tokens): a decode-only or prefill-only step of r = d + p rows at
              max(decode(min(r, D)), r x prefill s/token), decode() interpolated linearly
              between the measured batch sizes (1 .. D, D the largest decode batch the job ran)
              and the prefill rate from one step of --max-batch-tokens tokens; a mixed step
              (d and p both > 0) by bilinear interpolation over (d, p) of the measured mixed
              steps (clamped at the grid's edges). ideal_fresh_prefill_s prices the mixed steps
              as prefill-only steps of d + p tokens instead, for comparison
  idle share  gaps between consecutive steps / serving, timed on the thread that runs the
              steps (with async scheduling the engine's StepExecutor: the next step is formed
              while one runs): Model::Step returns once the step's results are on the host, so
              the device has no work during a gap; host work inside Model::Step before its
              first kernel counts as step time, so this is a lower bound. The row's label says
              "(sync)" when the workers ran with --no-async-scheduling; dropped_tokens counts
              rows computed for requests that had already stopped (async scheduling)
  TTFT        p50 / p99 over requests, from the step that took a request off the rank's queue
              to the end of the step that sampled its first token (the worker's view; a batch
              job's requests also wait in the coordinator before that)
  tokens/s    output tokens / wall and (prompt + output) tokens / wall; also output / serving
  HF tokens/s output tokens / HF's generate time, on its subset; ratio = ours (wall) / HF
"""

import argparse
import glob
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_job  # noqa: E402

DECODE_GRID = [1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512]
# The mixed steps measured: these decode rows and prompt tokens inside the range the job's mixed
# steps span, and that range's two ends (mixed_grid).
MIXED_DECODE_GRID = [64, 128, 256]
MIXED_PROMPT_GRID = [512, 1024, 2048]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--bin-dir", required=True, help="deepinfer, deepinfer-coordinator, "
                   "deepinfer-worker and deepinfer-bench")
    p.add_argument("--config", default="", help="model config.json (dummy weights)")
    p.add_argument("--model", default="",
                   help="or: a model directory (config.json + safetensors), its real weights")
    p.add_argument("--backend", default="cpu")
    p.add_argument("--dtype", default="", help="--dtype for the workers and deepinfer-bench")
    p.add_argument("--workload", default="long-sampled", choices=sorted(make_job.WORKLOADS))
    p.add_argument("--job", default="", help="run this job file instead of a workload")
    p.add_argument("--requests", type=int, default=1024)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--prompt-range", default="", help="MIN,MAX (default: the workload's)")
    p.add_argument("--max-batch-tokens", type=int, default=2048,
                   help="the workers' --max-batch-tokens (also the priced prefill step)")
    p.add_argument("--run-args", default="", help="more `deepinfer run` flags (word-split)")
    p.add_argument("--worker-args", default="", help="more worker flags (space-separated)")
    p.add_argument("--bench-args", default="", help="more deepinfer-bench flags (word-split)")
    p.add_argument("--no-price", action="store_true", help="skip the deepinfer-bench pricing")
    p.add_argument("--hf-requests", type=int, default=0,
                   help="HF generate on this many of the job's first requests (0: none)")
    p.add_argument("--hf-batch", type=int, default=64, help="HF generate's batch size")
    p.add_argument("--hf-script", default="", help="hf_generate.py (default: beside this one)")
    p.add_argument("--timeout-s", type=int, default=600, help="for each of the three parts")
    p.add_argument("--label", default="", help="row label (default: config + workload)")
    p.add_argument("--out", required=True, help="directory for the job, logs and e2e.json")
    return p.parse_args()


def unix_of(pattern, text):
    m = re.search(pattern, text)
    return float(m.group(1)) if m else None


def read_worker_logs(state_dir):
    """Start-up facts from the worker logs (the first worker's rank 0 for the phases)."""
    out = {"main_unix": None, "formed_unix": None, "phases": {}, "configure_unix": None}
    logs = sorted(glob.glob(os.path.join(state_dir, "logs", "worker-*.log")))
    mains, formed = [], []
    for path in logs:
        text = open(path, errors="replace").read()
        t = unix_of(r"start-up: main at unix ([0-9.]+)", text)
        if t is not None:
            mains.append(t)
        for m in re.finditer(r"start-up: formed in ([0-9.]+) s, at unix ([0-9.]+)", text):
            formed.append((float(m.group(2)), float(m.group(1))))
        if not out["phases"]:
            m = re.search(r"rank \d+: start-up: (group .*)", text)
            if m:
                for part in m.group(1).split(", "):
                    pm = re.match(r"(.+) ([0-9.]+) s$", part.strip())
                    if pm:
                        out["phases"][pm.group(1)] = float(pm.group(2))
    if mains:
        out["main_unix"] = max(mains)
    if formed:
        out["formed_unix"] = max(t for t, _ in formed)
        out["form_s"] = max(d for _, d in formed)
    # Decode graphs recorded (decode_graph_runner.cc logs each with its time), all workers.
    out["graphs_recorded"] = 0
    out["graph_record_s"] = 0.0
    for path in logs:
        for m in re.finditer(r"decode graph for batch bucket \d+ .* recorded in ([0-9.]+) ms",
                             open(path, errors="replace").read()):
            out["graphs_recorded"] += 1
            out["graph_record_s"] += float(m.group(1)) / 1e3
    out["logs"] = logs
    return out


def read_startup_lines(logs):
    """The weight load, start-up graph capture and warm-up lines of rank 0 of the first worker."""
    out = {}
    for path in logs:
        text = open(path, errors="replace").read()
        m = re.search(r"start-up: weights loaded in ([0-9.]+) s, ([0-9.]+) GB, ([0-9.]+) GB/s",
                      text)
        if m and "weights_load_s" not in out:
            out.update({"weights_load_s": float(m.group(1)), "weights_gb": float(m.group(2)),
                        "weights_gb_per_s": float(m.group(3))})
        m = re.search(r"start-up: decode graphs recorded in ([0-9.]+) s, (\d+) graphs", text)
        if m and "startup_capture_s" not in out:
            out.update({"startup_capture_s": float(m.group(1)),
                        "startup_graphs": int(m.group(2))})
        m = re.search(r"start-up: warm-up ran in ([0-9.]+) s, (\d+) steps, (\d+) tokens", text)
        if m and "warm_up_s" not in out:
            out.update({"warm_up_s": float(m.group(1)), "warm_up_steps": int(m.group(2)),
                        "warm_up_tokens": int(m.group(3))})
    return out


def read_tail(state_dir, last_step_end, end_unix):
    """The tail, last token to the exit of `deepinfer run`, split at the moments the processes
    log in unix seconds: the coordinator's "job ... completed at unix", `deepinfer run`'s own
    timeline (logs/run.log: the job's end seen, results written, workers and coordinator
    stopped) and the first worker's "shutdown:" line (its parts, done at unix). Each phase
    runs from the end of the one before; together they are the tail."""
    logs = os.path.join(state_dir, "logs")

    def text_of(name):
        path = os.path.join(logs, name)
        return open(path, errors="replace").read() if os.path.exists(path) else ""

    run = text_of("run.log")
    marks = [("results reported (last token -> job complete)",
              unix_of(r"job \S+ completed at unix ([0-9.]+)", text_of("coordinator.log"))),
             ("job end seen by deepinfer run", unix_of(r"job \w+ seen at unix ([0-9.]+)", run)),
             ("results written", unix_of(r"results written at unix ([0-9.]+)", run)),
             ("workers stopped", unix_of(r"workers stopped at unix ([0-9.]+)", run)),
             ("coordinator stopped", unix_of(r"coordinator stopped at unix ([0-9.]+)", run)),
             ("deepinfer run exit", end_unix)]
    phases, at = {}, last_step_end
    for name, t in marks:
        if t is None:
            continue
        phases[name] = t - at
        at = t
    out = {"tail_breakdown_s": phases}
    # Inside "workers stopped": the first worker's own account of its shutdown.
    worker = text_of("worker-0.log")
    m = re.search(r"shutdown: left the coordinator in ([0-9.]+) s, server stopped in ([0-9.]+) s, "
                  r"ranks stopped in ([0-9.]+) s, KV store flushed in ([0-9.]+) s; "
                  r"done at unix ([0-9.]+)", worker)
    stopping = unix_of(r"stopping at unix ([0-9.]+)", run)
    stopped = unix_of(r"workers stopped at unix ([0-9.]+)", run)
    if m:
        leave, server, ranks, flush, done = (float(x) for x in m.groups())
        parts = {}
        if stopping is not None:
            parts["signal to shutdown"] = done - (leave + server + ranks + flush) - stopping
        parts.update({"leave the coordinator": leave, "stop the server": server,
                      "stop the ranks": ranks, "flush the KV store": flush})
        if stopped is not None:
            parts["process exit"] = stopped - done
        out["worker_shutdown_s"] = parts
    m = re.search(r"prefix cache: (\d+) of (\d+) idle cached blocks handed to the store in "
                  r"([0-9.]+) s", worker)
    if m:
        out["shutdown_spilled_blocks"] = int(m.group(1))
        out["shutdown_spill_s"] = float(m.group(3))
    return out


def read_step_stats(stats_dir):
    ranks = []
    for path in sorted(glob.glob(os.path.join(stats_dir, "rank-*.json"))):
        ranks.append(json.load(open(path)))
    return ranks


def read_outputs(path):
    done = failed = output_tokens = prompt_tokens = 0
    if not os.path.exists(path):
        return {"done": 0, "failed": 0, "output_tokens": 0, "prompt_tokens": 0}
    for line in open(path):
        j = json.loads(line)
        r = j.get("response") or {}
        body = r.get("body") or {}
        if j.get("error") or r.get("status_code", 200) != 200 or not body:
            failed += 1
            continue
        done += 1
        usage = body.get("usage") or {}
        ids = (body.get("choices") or [{}])[0].get("token_ids")
        output_tokens += usage.get("completion_tokens", len(ids or []))
        prompt_tokens += usage.get("prompt_tokens", 0)
    return {"done": done, "failed": failed, "output_tokens": output_tokens,
            "prompt_tokens": prompt_tokens}


def interpolate(points, x):
    """Piecewise linear through sorted (x, y) points; per-row slope of the last two past them."""
    if not points:
        return 0.0
    if len(points) == 1 or x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = points[-2], points[-1]
    return y1 + (y1 - y0) / (x1 - x0) * (x - x1)


def mixed_grid(histogram):
    """The (decode rows, prompt tokens) points to measure mixed steps at: per axis, the smallest
    and largest value of the histogram's mixed steps (decode rows and prompt tokens both) and the
    grid's values between them. ([], []) without mixed steps."""
    mixed = [(d, p) for d, p, n, _ in histogram if d > 0 and p > 0 and n > 0]
    if not mixed:
        return [], []

    def axis(values, grid):
        lo, hi = min(values), max(values)
        return sorted({lo, hi} | {x for x in grid if lo < x < hi})
    return (axis([d for d, _ in mixed], MIXED_DECODE_GRID),
            axis([p for _, p in mixed], MIXED_PROMPT_GRID))


def bilinear(grid, d, p):
    """Bilinear interpolation of {(D, P): seconds}, which holds every pair of its Ds and Ps, at
    (d, p) clamped to the grid's edges (one D or one P: linear along the other)."""
    ds = sorted({k[0] for k in grid})
    ps = sorted({k[1] for k in grid})

    def bracket(xs, x):
        x = min(max(x, xs[0]), xs[-1])
        for a, b in zip(xs, xs[1:]):
            if x <= b:
                return a, b, (x - a) / (b - a)
        return xs[-1], xs[-1], 0.0
    d0, d1, u = bracket(ds, d)
    p0, p1, v = bracket(ps, p)
    return ((1 - u) * (1 - v) * grid[(d0, p0)] + u * (1 - v) * grid[(d1, p0)] +
            (1 - u) * v * grid[(d0, p1)] + u * v * grid[(d1, p1)])


def measured_mixed(bench):
    """deepinfer-bench's mixed step p50s as {(D, P): seconds}; None unless they cover every pair
    of their Ds and Ps."""
    grid = {(m["decode_rows"], m["prompt_tokens"]): m["p50_s"]
            for m in bench.get("mixed") or [] if m.get("p50_s")}
    ds = {d for d, _ in grid}
    ps = {p for _, p in grid}
    if not grid or len(grid) != len(ds) * len(ps):
        return None
    return grid


def price(histogram, bench):
    """The ideal time of the histogram's steps from deepinfer-bench's JSON. A step of d decode
    rows and p prompt tokens, decode-only or prefill-only: max(decode(min(d + p, D)),
    (d + p) x prefill s/token); mixed (both > 0): the bilinear interpolation of the benchmark's
    mixed step p50s where it measured them, else that fresh-prefill price, which the
    *_fresh_prefill_s figures give for every mixed step, for comparison."""
    decode = sorted((d["requests"], d["p50_s"]) for d in bench.get("decode", []) if d.get("p50_s"))
    pre = bench.get("prefill") or {}
    per_token = pre["step_s"] / pre["tokens_per_step"] if pre.get("tokens_per_step") else 0.0
    mixed = measured_mixed(bench)
    decode_part = prefill_only = mixed_part = mixed_fresh = 0.0
    top = decode[-1][0] if decode else 1
    for d, p, steps, _ in histogram:
        rows = d + p
        if rows == 0:
            continue
        # Past the largest measured decode batch a step costs at least that batch's step.
        fresh = max(interpolate(decode, min(rows, top)), rows * per_token)
        if p == 0:
            decode_part += steps * fresh
        elif d == 0:
            prefill_only += steps * fresh
        else:
            mixed_fresh += steps * fresh
            mixed_part += steps * (bilinear(mixed, d, p) if mixed else fresh)
    out = {"ideal_s": decode_part + prefill_only + mixed_part,
           "ideal_fresh_prefill_s": decode_part + prefill_only + mixed_fresh,
           "ideal_decode_only_steps_s": decode_part,
           "ideal_steps_with_prefill_s": prefill_only + mixed_part,
           "ideal_steps_with_prefill_fresh_prefill_s": prefill_only + mixed_fresh,
           "ideal_mixed_steps_s": mixed_part, "ideal_mixed_steps_fresh_prefill_s": mixed_fresh,
           "mixed_measured": mixed is not None, "prefill_s_per_token": per_token,
           "decode_p50_s": dict((str(k), v) for k, v in decode)}
    if mixed:
        out["mixed_p50_s"] = {f"{d}:{p}": t for (d, p), t in sorted(mixed.items())}
    return out


def run_logged(cmd, log, timeout, env=None):
    with open(log, "w") as f:
        f.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
        f.flush()
        t0 = time.time()
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                                env=env).returncode
        except subprocess.TimeoutExpired:
            rc = 124
        return rc, time.time() - t0


def main():
    a = parse_args()
    os.makedirs(a.out, exist_ok=True)
    out = os.path.abspath(a.out)
    if bool(a.config) == bool(a.model):
        sys.exit("e2e_job.py: give one of --config (dummy weights) and --model (a checkpoint)")
    config = os.path.abspath(a.config or os.path.join(a.model, "config.json"))
    model_spec = f"dummy:{config}" if a.config else os.path.abspath(a.model)
    cfg = json.load(open(config))
    name = os.path.basename(config).removesuffix(".json")
    if name == "config":  # a model directory's config.json: the directory names the model
        name = os.path.basename(os.path.dirname(config))
    label = a.label or f"{name} {a.workload}"
    result = {"label": label, "config": config, "backend": a.backend, "workload": a.workload}

    # ---- the job ----
    job = os.path.join(out, "job.jsonl")
    if a.job:
        lines = [json.loads(x) for x in open(a.job)]
        result["workload"] = os.path.basename(a.job)
    else:
        pr = tuple(int(x) for x in a.prompt_range.split(",")) if a.prompt_range else None
        lines = make_job.make_lines(a.workload, cfg["vocab_size"], a.requests, a.max_tokens,
                                    0, pr)
    with open(job, "w") as f:
        for line in lines:
            f.write(json.dumps(line, separators=(",", ":")) + "\n")
    bodies = [x["body"] for x in lines]
    prompt_lens = [len(b["prompt"]) for b in bodies]
    max_tokens = [b.get("max_tokens", 16) for b in bodies]
    sampled = any(b.get("temperature", 1.0) > 0 for b in bodies)
    result.update({"requests": len(lines), "mean_prompt": statistics.mean(prompt_lens),
                   "mean_max_tokens": statistics.mean(max_tokens), "sampled": sampled})

    # ---- 1. deepinfer run ----
    state = os.path.join(out, "state")
    stats_dir = os.path.join(out, "step_stats")
    subprocess.run(["rm", "-rf", state, stats_dir])
    os.makedirs(stats_dir)
    worker_args = f"--step-stats-dir={stats_dir} --max-batch-tokens={a.max_batch_tokens}"
    if a.worker_args:
        worker_args += " " + a.worker_args
    cmd = [os.path.join(a.bin_dir, "deepinfer"), "run", f"--model={model_spec}",
           f"--backend={a.backend}", f"--input={job}", f"--output={out}/output.jsonl",
           f"--state-dir={state}", f"--bin-dir={a.bin_dir}", f"--timeout-s={a.timeout_s}",
           f"--worker-args={worker_args}"]
    if a.dtype:
        cmd.append(f"--dtype={a.dtype}")
    cmd += shlex.split(a.run_args)
    start_unix = time.time()
    rc, wall = run_logged(cmd, os.path.join(out, "run.log"), a.timeout_s + 60)
    end_unix = start_unix + wall
    result["run_rc"] = rc
    result["wall_s"] = wall
    result.update(read_outputs(os.path.join(out, "output.jsonl")))
    logs = read_worker_logs(state)
    ranks = read_step_stats(stats_dir)
    result["ranks"] = len(ranks)
    result["graphs_recorded"] = logs["graphs_recorded"]
    result["graph_record_s"] = logs["graph_record_s"]
    result.update(read_startup_lines(logs["logs"]))
    if ranks:
        first = min(r["first_step_unix"] for r in ranks if r["steps"] > 0)
        last = max(r["last_step_end_unix"] for r in ranks if r["steps"] > 0)
        r0 = ranks[0]
        result["startup_s"] = first - start_unix
        result["serving_s"] = last - first
        result["tail_s"] = end_unix - last
        result.update(read_tail(state, last, end_unix))
        result["capture_s"] = (max(r["capture_s"] for r in ranks) +
                               logs["phases"].get("graph capture", 0.0))
        result["async_scheduling"] = r0.get("async_scheduling")
        result["dropped_tokens"] = r0.get("dropped_tokens", 0)
        if r0.get("async_scheduling") is False and not a.label:
            result["label"] += " (sync)"
        result["capture_steps"] = max(r["capture_steps"] for r in ranks)
        result["steps"] = r0["steps"]
        result["step_s"] = r0["step_s"]
        result["gap_s"] = r0["gap_s"]
        result["max_gap_s"] = r0["max_gap_s"]
        result["idle_share"] = r0["gap_s"] / r0["span_s"] if r0["span_s"] > 0 else 0.0
        result["ttft_p50_s"] = statistics.median(r["ttft_p50_s"] for r in ranks)
        result["ttft_p99_s"] = max(r["ttft_p99_s"] for r in ranks)
        hist = r0["histogram"]
        result["histogram_keys"] = len(hist)
        result["graph_steps"] = r0.get("graph_steps", 0)
        # What the steps took (rank 0), split as the ideal is: decode-only steps and the rest.
        result["decode_only_steps_s"] = sum(t for d, p, _, t in hist if p == 0)
        result["steps_with_prefill_s"] = sum(t for d, p, _, t in hist if p > 0)
        result["decode_only_steps"] = sum(n for d, p, n, _ in hist if p == 0)
        result["max_decode_batch"] = max((d for d, _, _, _ in hist), default=0)
        breakdown = {}
        if logs["main_unix"]:
            breakdown["process start"] = logs["main_unix"] - start_unix
        if logs["formed_unix"] and logs["main_unix"]:
            breakdown["registration and group configuration"] = (
                logs["formed_unix"] - logs.get("form_s", 0) - logs["main_unix"])
        breakdown.update(logs["phases"])
        if logs.get("form_s") is not None and logs["phases"]:
            # The phases are logged to the millisecond: no negative remainder from rounding.
            breakdown["engine and barrier"] = max(0.0, logs["form_s"] - sum(logs["phases"].values()))
        if logs["formed_unix"]:
            breakdown["first request"] = first - logs["formed_unix"]
        result["startup_breakdown_s"] = breakdown
    out_tok = result["output_tokens"]
    result["output_tokens_per_s"] = out_tok / wall if wall > 0 else 0
    result["total_tokens_per_s"] = (out_tok + result["prompt_tokens"]) / wall if wall > 0 else 0
    if result.get("serving_s"):
        result["serving_output_tokens_per_s"] = out_tok / result["serving_s"]

    # ---- 2. the step benchmark: the job's histogram priced ----
    if ranks and not a.no_price:
        context = int(round(result["mean_prompt"] + result["mean_max_tokens"] / 2))
        top = max(1, result["max_decode_batch"])
        grid = [n for n in DECODE_GRID if n < top] + [top]
        prompts = max(1, a.max_batch_tokens // context)
        bench = [os.path.join(a.bin_dir, "deepinfer-bench"), "--backend", a.backend,
                 "--model", config if a.config else model_spec,
                 "--load-format", "dummy" if a.config else "auto", "--json",
                 "--decode-num-requests", ",".join(str(n) for n in grid),
                 "--context-length", str(context),
                 "--prefill-batch-tokens", str(prompts * context),
                 "--decode-fill", "random", "--warmup", "2", "--output-len", "7", "--iters", "3"]
        # The workers' dtype: --dtype, else their backend's default (bf16 on cuda, fp32 on cpu;
        # deepinfer-bench's own default is bf16 everywhere).
        bench += ["--dtype", a.dtype or ("float32" if a.backend == "cpu" else "bfloat16")]
        if sampled:
            b = next(b for b in bodies if b.get("temperature", 1.0) > 0)
            bench += ["--decode-sampling",
                      f"{b.get('temperature', 1.0)},{b.get('top_k', 0)},{b.get('top_p', 1.0)}"]
        # The job's mixed steps measured at points spanning them: decode rows at the job's mean
        # context, prompt chunks over prompts of its mean prompt length.
        ds, ps = mixed_grid(ranks[0]["histogram"])
        if ds:
            bench += ["--mixed-steps", ",".join(f"{d}:{p}" for d in ds for p in ps),
                      "--mixed-prompt-length", str(max(1, round(result["mean_prompt"])))]
        bench += shlex.split(a.bench_args)
        log = os.path.join(out, "bench.log")
        with open(os.path.join(out, "bench.json"), "w") as f, open(log, "w") as e:
            e.write("$ " + " ".join(shlex.quote(c) for c in bench) + "\n")
            e.flush()
            try:
                rc = subprocess.run(bench, stdout=f, stderr=e, timeout=a.timeout_s).returncode
            except subprocess.TimeoutExpired:
                rc = 124
        result["bench_rc"] = rc
        if rc == 0:
            b = json.load(open(os.path.join(out, "bench.json")))
            result.update(price(ranks[0]["histogram"], b))
            result["bench_context"] = context
            result["bench_load_s"] = b.get("load_s")

    # ---- 3. HF transformers' generate on a subset ----
    if a.hf_requests > 0:
        script = a.hf_script or os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                             "hf_generate.py")
        hf_out = os.path.join(out, "hf.json")
        rc, _ = run_logged([sys.executable, script, "--config", config, "--job", job,
                            "--requests", str(a.hf_requests), "--batch", str(a.hf_batch),
                            "--budget-s", str(a.timeout_s - 30), "--out", hf_out],
                           os.path.join(out, "hf.log"), a.timeout_s)
        result["hf_rc"] = rc
        if os.path.exists(hf_out):
            hf = json.load(open(hf_out))
            result["hf"] = hf
            if hf.get("output_tokens_per_s"):
                result["hf_output_tokens_per_s"] = hf["output_tokens_per_s"]
                result["ratio_vs_hf"] = result["output_tokens_per_s"] / hf["output_tokens_per_s"]

    with open(os.path.join(out, "e2e.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(format_row(result))
    ok = rc_ok(result)
    return 0 if ok else 1


def rc_ok(r):
    return (r.get("run_rc") == 0 and r.get("failed", 1) == 0 and r.get("bench_rc", 0) == 0
            and r.get("hf_rc", 0) == 0)


HEADER = ("| job | wall s | start-up s | serving s | tail s | capture s | ideal s | "
          "ideal s, mixed as fresh prefill | serving / ideal | idle share | "
          "TTFT p50 / p99 s | output tok/s | total tok/s | HF output tok/s | ours / HF |")


def format_row(r):
    def f(key, fmt="%.2f"):
        v = r.get(key)
        return fmt % v if isinstance(v, (int, float)) else "-"
    # As docs/e2e-jobs.md gives it: the ideal over serving (100%: serving took the ideal).
    share = (f"{100 * r['ideal_s'] / r['serving_s']:.1f}%"
             if r.get("serving_s") and r.get("ideal_s") else "-")
    return (f"| {r['label']} ({r.get('done', 0)}/{r['requests']} done) | {f('wall_s')} | "
            f"{f('startup_s')} | {f('serving_s')} | {f('tail_s')} | {f('capture_s')} | "
            f"{f('ideal_s')} | {f('ideal_fresh_prefill_s')} | {share} | "
            f"{f('idle_share', '%.3f')} | "
            f"{f('ttft_p50_s', '%.3f')} / {f('ttft_p99_s', '%.3f')} | "
            f"{f('output_tokens_per_s', '%.0f')} | {f('total_tokens_per_s', '%.0f')} | "
            f"{f('hf_output_tokens_per_s', '%.0f')} | {f('ratio_vs_hf', '%.2f')} |")


if __name__ == "__main__":
    sys.exit(main())
