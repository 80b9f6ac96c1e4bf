#!/usr/bin/env python3
"""Greedy jobs from an HF fixture's prompts, and the comparison of two runs of one.

  fixture_job.py make FIXTURE_DIR JOB.jsonl
      one greedy line of 24 and one of 64 tokens per prompt of FIXTURE_DIR/expected.json
      (logprobs on, EOS ignored)
  fixture_job.py compare A.jsonl B.jsonl FIXTURE_DIR
      per line: tokens equal, the first 24 tokens against HF's greedy_24, the largest logprob
      difference where the tokens are equal; exit status 1 when any line differs

Used to check that `deepinfer run --backend cuda` gives the CPU backend's tokens
(docs/performance.md, DeepSeek-V4 shapes).
"""
import json
import sys


def make(fixture, job):
    expected = json.load(open(fixture + "/expected.json"))
    with open(job, "w") as f:
        for i, p in enumerate(expected["prompts"]):
            for max_tokens in (24, 64):
                body = {"prompt": p["ids"], "max_tokens": max_tokens, "temperature": 0,
                        "ignore_eos": True, "return_token_ids": True, "logprobs": 1}
                line = {"custom_id": f"p{i}-{max_tokens}", "method": "POST",
                        "url": "/v1/completions", "body": body}
                f.write(json.dumps(line) + "\n")


def choices(path):
    out = {}
    for line in open(path):
        j = json.loads(line)
        out[j["custom_id"]] = j["response"]["body"]["choices"][0]
    return out


def compare(a_path, b_path, fixture):
    a, b = choices(a_path), choices(b_path)
    expected = json.load(open(fixture + "/expected.json"))
    same, largest = 0, 0.0
    for key in sorted(a):
        ca, cb = a[key], b[key]
        ta, tb = ca["token_ids"], cb["token_ids"]
        hf = expected["prompts"][int(key[1:].split("-")[0])]["greedy_24"]
        equal = ta == tb
        same += equal
        detail = "tokens differ"
        if equal:
            la = (ca.get("logprobs") or {}).get("token_logprobs") or []
            lb = (cb.get("logprobs") or {}).get("token_logprobs") or []
            d = max([abs(x - y) for x, y in zip(la, lb)] or [0.0])
            largest = max(largest, d)
            detail = f"largest |logprob difference| {d:.2e}"
        print(f"{key}: equal {equal} ({len(ta)} tokens), first 24 == HF: "
              f"{ta[:24] == hf} / {tb[:24] == hf}, {detail}")
    print(f"{fixture}: {same} of {len(a)} lines identical, largest logprob difference {largest:.2e}")
    return 0 if same == len(a) == len(b) else 1


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 5 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3], sys.argv[4]))
    else:
        sys.exit(__doc__)
