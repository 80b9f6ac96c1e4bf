#!/usr/bin/env python3
"""Prefix caching benchmark: a shared-system-prompt job and a report of what the cache saved.

  prefix_cache_bench.py make-job [--systems 64 --questions 32 --system-tokens 2048
      --question-tokens 64 --max-tokens 32 --vocab 129280 --seed 1] > job.jsonl
      OpenAI Batch /v1/completions lines with token-id prompts: `systems` distinct system
      prompts, each followed by `questions` distinct questions, in a seeded shuffled order (as
      a real job's requests come); greedy, ignore_eos, token ids and 1 logprob returned.
  prefix_cache_bench.py report --on OUT.jsonl --on-seconds S --off OUT.jsonl --off-seconds S
      [--run NAME=OUT.jsonl:SECONDS[:LOG] ...] [--json]
      From the output files of the same job run with and without prefix caching (usage and
      choices) and their wall times: prompt tokens, tokens served from the cache, prefill tokens
      computed (prompt - cached; recomputation after preemption is not in the usage), hit rate,
      end-to-end throughput, and whether tokens and logprobs agree. Each --run adds a column
      (e.g. a re-run on a warm --kv-cache-dir, or several ranks with and without prefix-aware
      routing), compared with the run without prefix caching; with LOG (the run's stderr),
      the job summary's tokens per rank, max / mean (balance).

prefix_cache_bench.sh runs both halves around `deepinfer run`.
"""
import argparse
import json
import random
import re
import sys


def make_job(args):
    rng = random.Random(args.seed)
    lo = 2  # ids 0 and 1 are BOS / EOS on the fixtures; harmless elsewhere
    hi = args.vocab - 1

    def ids(n):
        return [rng.randint(lo, hi) for _ in range(n)]

    systems = [ids(args.system_tokens) for _ in range(args.systems)]
    requests = []
    for s, system in enumerate(systems):
        for q in range(args.questions):
            # Questions differ from their first token on, so only the system prompt is shared.
            question = [lo + (q % (hi - lo))] + ids(args.question_tokens - 1)
            requests.append((f"s{s}-q{q}", system + question))
    rng.shuffle(requests)
    out = sys.stdout
    for custom_id, prompt in requests:
        body = {"prompt": prompt, "max_tokens": args.max_tokens, "temperature": 0,
                "ignore_eos": True, "return_token_ids": True, "logprobs": 1}
        out.write(json.dumps({"custom_id": custom_id, "method": "POST",
                              "url": "/v1/completions", "body": body}) + "\n")


def read_lines(path):
    lines = {}
    with open(path) as f:
        for text in f:
            text = text.strip()
            if not text:
                continue
            line = json.loads(text)
            lines[line["custom_id"]] = line
    return lines


def summarize(lines, seconds):
    prompt = cached = completion = errors = 0
    for line in lines.values():
        if line.get("error"):
            errors += 1
            continue
        usage = line["response"]["body"]["usage"]
        prompt += usage["prompt_tokens"]
        completion += usage["completion_tokens"]
        cached += usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    return {
        "requests": len(lines),
        "errors": errors,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "prefill_tokens_computed": prompt - cached,
        "hit_rate": cached / prompt if prompt else 0.0,
        "completion_tokens": completion,
        "seconds": seconds,
        "requests_per_s": len(lines) / seconds if seconds > 0 else 0.0,
        "total_tokens_per_s": (prompt + completion) / seconds if seconds > 0 else 0.0,
        "output_tokens_per_s": completion / seconds if seconds > 0 else 0.0,
    }


def compare(on, off):
    """Requests whose tokens differ, and the largest logprob difference of the others."""
    differ = 0
    max_diff = 0.0
    for custom_id, want in off.items():
        got = on.get(custom_id)
        if got is None or got.get("error") or want.get("error"):
            differ += 1
            continue
        a = got["response"]["body"]["choices"][0]
        b = want["response"]["body"]["choices"][0]
        if a.get("token_ids") != b.get("token_ids"):
            differ += 1
            continue
        la = (a.get("logprobs") or {}).get("token_logprobs") or []
        lb = (b.get("logprobs") or {}).get("token_logprobs") or []
        for x, y in zip(la, lb):
            max_diff = max(max_diff, abs(x - y))
    return differ, max_diff


def balance(log_path):
    """The job summary's "tokens per rank max/mean X" of a `deepinfer run` log, or None."""
    if not log_path:
        return None
    with open(log_path) as f:
        found = re.findall(r"tokens per rank max/mean ([0-9.]+)", f.read())
    return float(found[-1]) if found else None


def parse_run(spec):
    """NAME=OUT.jsonl:SECONDS[:LOG]"""
    name, _, rest = spec.partition("=")
    parts = rest.split(":")
    if not name or len(parts) not in (2, 3):
        raise argparse.ArgumentTypeError(f"--run wants NAME=OUT.jsonl:SECONDS[:LOG], not {spec!r}")
    return name, parts[0], float(parts[1]), parts[2] if len(parts) == 3 else None


def report(args):
    on = summarize(read_lines(args.on), args.on_seconds)
    off = summarize(read_lines(args.off), args.off_seconds)
    differ, max_diff = compare(read_lines(args.on), read_lines(args.off))
    result = {"on": on, "off": off, "requests_with_other_tokens": differ,
              "max_logprob_difference": max_diff,
              "speedup": off["seconds"] / on["seconds"] if on["seconds"] > 0 else 0.0,
              "runs": {}}
    for name, path, seconds, log in args.run:
        run = summarize(read_lines(path), seconds)
        run["requests_with_other_tokens"], run["max_logprob_difference"] = compare(
            read_lines(path), read_lines(args.off))
        run["balance"] = balance(log)
        result["runs"][name] = run
    if args.json:
        print(json.dumps(result, indent=1))
        return
    rows = [("requests", "requests", "{}"), ("prompt tokens", "prompt_tokens", "{}"),
            ("cached prompt tokens", "cached_tokens", "{}"),
            ("prefill tokens computed", "prefill_tokens_computed", "{}"),
            ("hit rate", "hit_rate", "{:.1%}"), ("output tokens", "completion_tokens", "{}"),
            ("wall time (s)", "seconds", "{:.1f}"),
            ("prompt + output tokens/s", "total_tokens_per_s", "{:.0f}"),
            ("output tokens/s", "output_tokens_per_s", "{:.1f}"),
            ("error lines", "errors", "{}")]
    runs = result["runs"]
    if runs:
        rows.append(("tokens per rank, max/mean", "balance", "{:.2f}"))
    names = ["prefix caching on"] + list(runs) + ["off"]
    columns = [on] + list(runs.values()) + [off]
    print("| | " + " | ".join(names) + " |")
    print("| --- |" + " --- |" * len(names))
    for name, key, fmt in rows:
        cells = ["-" if c.get(key) is None else fmt.format(c[key]) for c in columns]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"\nend-to-end speedup {result['speedup']:.2f}x; requests whose tokens differ: "
          f"{differ}; largest logprob difference of the others: {max_diff:.3g}")
    for name, run in runs.items():
        print(f"{name}: requests whose tokens differ from off: {run['requests_with_other_tokens']};"
              f" largest logprob difference: {run['max_logprob_difference']:.3g}")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    job = sub.add_parser("make-job")
    job.add_argument("--systems", type=int, default=64)
    job.add_argument("--questions", type=int, default=32)
    job.add_argument("--system-tokens", type=int, default=2048)
    job.add_argument("--question-tokens", type=int, default=64)
    job.add_argument("--max-tokens", type=int, default=32)
    job.add_argument("--vocab", type=int, default=129280, help="ids are drawn from 2..vocab-1")
    job.add_argument("--seed", type=int, default=1)
    rep = sub.add_parser("report")
    rep.add_argument("--on", required=True)
    rep.add_argument("--on-seconds", type=float, required=True)
    rep.add_argument("--off", required=True)
    rep.add_argument("--off-seconds", type=float, required=True)
    rep.add_argument("--run", type=parse_run, action="append", default=[],
                     help="NAME=OUT.jsonl:SECONDS[:LOG], another column")
    rep.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.command == "make-job":
        if min(args.systems, args.questions, args.system_tokens, args.question_tokens,
               args.max_tokens) < 1 or args.vocab < 4:
            parser.error("counts and lengths must be >= 1 and --vocab >= 4")
        make_job(args)
    else:
        report(args)


if __name__ == "__main__":
    main()
