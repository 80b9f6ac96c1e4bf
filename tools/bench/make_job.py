#!/usr/bin/env python3
"""make_job.py - the standard end-to-end benchmark jobs, as OpenAI Batch input files (JSONL).

Every job is generated from a seed (Python's random.Random, the same file on every machine and
Python 3 version) as token-id prompts, so it needs no tokenizer and suits dummy weights:

  long-sampled   prompts of 256-768 tokens, 256 sampled tokens (temperature 0.8, top_p 0.95,
                 a seed per request): the job of docs/e2e-jobs.md
  long-greedy    the same prompts, greedy
  short-sampled  prompts of 16-64 tokens, 256 sampled tokens
  short-greedy   the same short prompts, greedy

Every request has ignore_eos, so each generates exactly max_tokens tokens (random weights emit
EOS at random). --requests, --max-tokens and the prompt range can be changed for small runs.

  python3 make_job.py --workload long-sampled --vocab 163840 --out job.jsonl
  python3 make_job.py --workload short-greedy --config CONFIG.json --requests 16 --max-tokens 8 \
      --out job.jsonl
"""

import argparse
import json
import random
import sys

WORKLOADS = {
    # name: (shortest prompt, longest prompt, sampled)
    "long-sampled": (256, 768, True),
    "long-greedy": (256, 768, False),
    "short-sampled": (16, 64, True),
    "short-greedy": (16, 64, False),
}
TEMPERATURE = 0.8
TOP_P = 0.95


def make_lines(workload, vocab, requests=1024, max_tokens=256, seed=0, prompt_range=None):
    """The job's request lines (dicts), in order."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload '{workload}' (one of {', '.join(WORKLOADS)})")
    lo, hi, sampled = WORKLOADS[workload]
    if prompt_range is not None:
        lo, hi = prompt_range
    if not (1 <= lo <= hi) or vocab < 1 or requests < 1 or max_tokens < 1:
        raise ValueError("need 1 <= min prompt <= max prompt, vocab, requests, max_tokens >= 1")
    # The prompts depend on the seed and the prompt range only: the greedy and sampled forms of
    # a workload share them.
    rng = random.Random(f"{seed}:{lo}:{hi}")
    lines = []
    for i in range(requests):
        n = rng.randint(lo, hi)
        body = {
            "prompt": [rng.randrange(vocab) for _ in range(n)],
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        if sampled:
            body.update({"temperature": TEMPERATURE, "top_p": TOP_P, "seed": seed * 1000003 + i})
        else:
            body["temperature"] = 0
        lines.append({"custom_id": f"{workload}-{i}", "method": "POST", "url": "/v1/completions",
                      "body": body})
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    p.add_argument("--vocab", type=int, default=0, help="token ids are drawn from [0, vocab)")
    p.add_argument("--config", default="", help="or: take the vocabulary from this config.json")
    p.add_argument("--requests", type=int, default=1024)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--prompt-range", default="", help="MIN,MAX prompt tokens (default: the workload's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="the JSONL file to write (- for stdout)")
    a = p.parse_args()
    vocab = a.vocab or (json.load(open(a.config))["vocab_size"] if a.config else 0)
    if vocab < 1:
        p.error("give --vocab or --config")
    prompt_range = tuple(int(x) for x in a.prompt_range.split(",")) if a.prompt_range else None
    try:
        lines = make_lines(a.workload, vocab, a.requests, a.max_tokens, a.seed, prompt_range)
    except ValueError as e:
        p.error(str(e))
    out = sys.stdout if a.out == "-" else open(a.out, "w")
    for line in lines:
        out.write(json.dumps(line, separators=(",", ":")) + "\n")
    if out is not sys.stdout:
        out.close()


if __name__ == "__main__":
    main()
