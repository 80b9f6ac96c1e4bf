#!/usr/bin/env python3
"""make_large_job.py - a large OpenAI Batch input file of text prompts, for the submission and
validation benchmark (tools/bench/large_job.sh, docs/jobs.md "Jobs of any size").

Lines are /v1/completions with a text prompt (3 in 4) or /v1/chat/completions with a system
and a user message (1 in 4), about 500 bytes each, so 1,000,000 lines make about 0.5 GB. The
text is English-like: sentences of pseudo-words drawn with Zipf-like frequencies, numbers and
punctuation, generated from a seed (the same file on every machine and Python 3 version).

  python3 make_large_job.py --lines 1000000 --out job.jsonl
  python3 make_large_job.py --lines 10000000 --out job5g.jsonl   # about 5 GB
"""

import argparse
import json
import random
import sys

SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "pe", "da", "re", "in", "on", "an",
             "er", "st", "th", "ch", "qu", "el", "or", "is", "at", "en", "ul", "ga", "bo", "fi"]


def make_words(rng, count):
    words = set()
    while len(words) < count:
        words.add("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))))
    words = sorted(words)
    rng.shuffle(words)  # frequency independent of spelling
    return words


def make_sentences(rng, words, count):
    # Zipf-like: the word of rank r is drawn with weight 1 / (r + 1).
    cum_weights = []
    total = 0.0
    for r in range(len(words)):
        total += 1.0 / (r + 1)
        cum_weights.append(total)
    sentences = []
    for _ in range(count):
        picked = rng.choices(words, cum_weights=cum_weights, k=rng.randint(6, 16))
        if rng.random() < 0.3:
            picked.insert(rng.randrange(len(picked)), str(rng.randint(0, 99999)))
        if rng.random() < 0.2:
            picked[rng.randrange(len(picked))] += ","
        sentence = " ".join(picked)
        sentences.append(sentence[0].upper() + sentence[1:] + rng.choice([".", ".", ".", "?", "!"]))
    return sentences


def text(rng, sentences, size):
    out = []
    n = 0
    while n < size:
        s = rng.choice(sentences)
        out.append(s)
        n += len(s) + 1
    return " ".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--lines", type=int, default=1000000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="the JSONL file to write (- for stdout)")
    a = p.parse_args()
    rng = random.Random(a.seed)
    words = make_words(rng, 8000)
    sentences = make_sentences(rng, words, 50000)
    system = text(rng, sentences, 120)
    out = sys.stdout if a.out == "-" else open(a.out, "w", encoding="utf-8")
    for i in range(a.lines):
        if i % 4 == 3:
            body = {"messages": [{"role": "system", "content": system},
                                 {"role": "user", "content": text(rng, sentences, 220)}],
                    "max_tokens": 64}
            url = "/v1/chat/completions"
        else:
            body = {"prompt": text(rng, sentences, 330), "max_tokens": 64}
            url = "/v1/completions"
        out.write(json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": url, "body": body},
                             separators=(", ", ": ")))
        out.write("\n")
    if out is not sys.stdout:
        out.close()


if __name__ == "__main__":
    main()
