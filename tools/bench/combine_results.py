#!/usr/bin/env python3
"""combine_results.py - one CSV and one markdown table from deepinfer-bench --json outputs and
hf_bench.py outputs (plain python3, no torch).

  combine_results.py --ours moonlight=ours_moonlight.json --ours v3_4layers=ours_v3.json \
      --hf moonlight=hf_moonlight.json --csv table.csv --md table.md

Each --ours / --hf is LABEL=FILE; files that are missing or empty (a step that failed or ran out
of time) give rows with empty cells. Rows: per label, prefill (tokens per step) and decode at
each request count either side measured. Ratios: ours/hf (tokens/s), ours' roofline fraction
(the config's roofline time at ours' dtype / measured time), and HF's roofline fraction: the
same cost figures (bytes and FLOPs per step, from ours' JSON) with the bytes rescaled to HF's
dtype, against HF's measured time, at ours' peaks. Ours from the cpu backend has no peaks
(null): both roofline cells stay empty.
"""

import argparse
import csv
import json
import sys

COLUMNS = ["model", "phase", "requests", "context", "tokens_per_step", "ours_dtype",
           "ours_tok_s", "ours_p50_s", "ours_p99_s", "ours_roofline", "hf_dtype", "hf_tok_s",
           "hf_p50_s", "hf_roofline", "ours_over_hf", "ours_mem_gib", "hf_mem_gib"]


def load(spec):
    label, _, path = spec.partition("=")
    if not path:
        sys.exit(f"combine_results: expected LABEL=FILE, got '{spec}'")
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return label, None
    for candidate in (text, text.splitlines()[-1] if text else ""):  # whole file, or last line
        try:
            return label, json.loads(candidate)
        except ValueError:
            pass
    return label, None


def fmt(v, digits=4):
    if v is None or v == "":
        return ""
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def roofline_fraction(cost, ours, hf_dtype, seconds):
    """Roofline time of `cost` (bytes/FLOPs at ours' dtype) at hf_dtype, over `seconds`; None
    when ours has no peaks (null on the cpu backend)."""
    if not cost.get("bytes_per_step") or not seconds or hf_dtype not in BYTES:
        return None
    if not ours.get("peak_bytes_per_s") or not ours.get("peak_flops_per_s"):
        return None
    scale = BYTES[hf_dtype] / ours.get("bytes_per_value", 4)
    t = max(cost["bytes_per_step"] * scale / ours["peak_bytes_per_s"],
            cost.get("flops_per_step", 0) / ours["peak_flops_per_s"])
    return t / seconds


def rows_for(label, ours, hf):
    rows = []
    ctx = (ours or {}).get("context") or (hf or {}).get("context")
    base = {"model": label, "context": ctx,
            "ours_dtype": (ours or {}).get("dtype", ""), "hf_dtype": (hf or {}).get("dtype", "")}
    if ours and ours.get("mem_peak_bytes", -1) >= 0:
        base["ours_mem_gib"] = ours["mem_peak_bytes"] / 2**30
    if hf and hf.get("mem_peak_bytes"):
        base["hf_mem_gib"] = hf["mem_peak_bytes"] / 2**30
    op = (ours or {}).get("prefill") or {}
    hp = (hf or {}).get("prefill") or {}
    if op.get("tokens_per_step") or hp.get("tokens_per_step"):
        r = dict(base, phase="prefill", requests="",
                 tokens_per_step=op.get("tokens_per_step") or hp.get("tokens_per_step"),
                 ours_tok_s=op.get("tokens_per_s"), ours_p50_s=op.get("step_s"),
                 ours_roofline=op.get("roofline_fraction"), hf_tok_s=hp.get("tokens_per_s"),
                 hf_p50_s=hp.get("step_s"),
                 hf_roofline=roofline_fraction(op, ours or {}, base["hf_dtype"], hp.get("step_s"))
                 if op.get("tokens_per_step") == hp.get("tokens_per_step") else None)
        if op.get("tokens_per_step") and hp.get("tokens_per_step") and \
                op["tokens_per_step"] != hp["tokens_per_step"]:
            r["phase"] = f"prefill (hf: {hp['tokens_per_step']} tokens/step)"
        rows.append(r)
    ours_dec = {d["requests"]: d for d in (ours or {}).get("decode", [])}
    hf_dec = {d["requests"]: d for d in (hf or {}).get("decode", [])}
    for n in sorted(set(ours_dec) | set(hf_dec)):
        od, hd = ours_dec.get(n, {}), hf_dec.get(n, {})
        rows.append(dict(base, phase="decode", requests=n, tokens_per_step=n,
                         ours_tok_s=od.get("tokens_per_s"), ours_p50_s=od.get("p50_s"),
                         ours_p99_s=od.get("p99_s"), ours_roofline=od.get("roofline_fraction"),
                         hf_tok_s=hd.get("tokens_per_s"), hf_p50_s=hd.get("p50_s"),
                         hf_roofline=roofline_fraction(od, ours or {}, base["hf_dtype"],
                                                       hd.get("p50_s"))))
    for r in rows:
        if r.get("ours_tok_s") and r.get("hf_tok_s"):
            r["ours_over_hf"] = r["ours_tok_s"] / r["hf_tok_s"]
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ours", action="append", default=[], help="LABEL=deepinfer-bench --json file")
    p.add_argument("--hf", action="append", default=[], help="LABEL=hf_bench.py output file")
    p.add_argument("--csv", required=True)
    p.add_argument("--md", required=True)
    p.add_argument("--title", default="")
    args = p.parse_args()
    ours = dict(load(s) for s in args.ours)
    hf = dict(load(s) for s in args.hf)
    labels = list(dict.fromkeys(list(ours) + list(hf)))
    rows = [r for label in labels for r in rows_for(label, ours.get(label), hf.get(label))]
    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({c: fmt(r.get(c), 6) for c in COLUMNS})
    with open(args.md, "w") as f:
        if args.title:
            f.write(args.title + "\n\n")
        f.write("| " + " | ".join(COLUMNS) + " |\n")
        f.write("|" + "---|" * len(COLUMNS) + "\n")
        for r in rows:
            f.write("| " + " | ".join(fmt(r.get(c)) for c in COLUMNS) + " |\n")
        for label in labels:
            for side, given in (("ours", ours), ("hf", hf)):
                if label not in given:
                    continue
                data = given[label]
                if data is None:
                    f.write(f"\n{label} / {side}: no result (step failed or timed out)\n")
                else:
                    for d in data.get("decode", []):
                        if "error" in d or "skipped" in d:
                            f.write(f"\n{label} / {side} decode {d['requests']}: "
                                    f"{d.get('error') or d.get('skipped')}\n")
                    if "error" in (data.get("prefill") or {}):
                        f.write(f"\n{label} / {side} prefill: {data['prefill']['error']}\n")
    print(open(args.md).read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
