#!/usr/bin/env python3
"""hf_generate.py - HF transformers' generate on the first requests of an end-to-end job file,
the peer of tools/bench/e2e_job.py (which runs the same job through `deepinfer run`).

Builds DeepseekV3ForCausalLM from the config with random weights (HF's own init) in bf16 on one
CUDA GPU (as hf_bench.py does), then runs model.generate over the first --requests lines of the
job in batches of --batch, prompts left-padded, each request's max_tokens as both
max_new_tokens and min_new_tokens (the job sets ignore_eos), greedy or sampled with the job's
temperature and top_p. One untimed generate of 2 prompts x 4 tokens warms up first.

Prints one JSON object (and writes --out): build_s, generate_s (the timed batches, synchronised),
requests, output_tokens, output_tokens_per_s, total_tokens_per_s. Batches left when --budget-s
has passed are skipped (requests says how many ran). Needs torch and transformers >= 5.

  python3 hf_generate.py --config moonlight_shaped.json --job job.jsonl --requests 64 --out hf.json
"""

import argparse
import json
import sys
import time


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--job", required=True, help="OpenAI Batch JSONL with token-id prompts")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--attn", default="sdpa")
    p.add_argument("--budget-s", type=float, default=0, help="0: no limit")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="")
    a = p.parse_args()
    start = time.time()
    import torch
    import transformers
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    bodies = []
    for line in open(a.job):
        if len(bodies) == a.requests:
            break
        bodies.append(json.loads(line)["body"])
    result = {"engine": "hf-transformers", "transformers": transformers.__version__,
              "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
              "dtype": a.dtype, "batch": a.batch}
    torch.manual_seed(a.seed)
    cfg = DeepseekV3Config.from_json_file(a.config)
    cfg.use_cache = True
    dtype = getattr(torch, a.dtype)
    t0 = time.time()
    with torch.device("cuda"):
        try:
            model = DeepseekV3ForCausalLM._from_config(cfg, dtype=dtype, attn_implementation=a.attn)
        except TypeError:  # transformers < 5 spells it torch_dtype
            model = DeepseekV3ForCausalLM._from_config(cfg, torch_dtype=dtype,
                                                       attn_implementation=a.attn)
    model.eval()
    torch.cuda.synchronize()
    result["build_s"] = round(time.time() - t0, 2)
    pad = 0

    def generate(batch_bodies):
        n = max(len(b["prompt"]) for b in batch_bodies)
        ids = torch.full((len(batch_bodies), n), pad, dtype=torch.long, device="cuda")
        mask = torch.zeros_like(ids)
        for i, b in enumerate(batch_bodies):
            k = len(b["prompt"])
            ids[i, n - k:] = torch.tensor(b["prompt"], device="cuda")
            mask[i, n - k:] = 1
        b0 = batch_bodies[0]
        new = b0.get("max_tokens", 16)
        temperature = b0.get("temperature", 1.0)
        kwargs = {"max_new_tokens": new, "min_new_tokens": new, "pad_token_id": pad}
        if temperature > 0:
            kwargs.update({"do_sample": True, "temperature": temperature,
                           "top_p": b0.get("top_p", 1.0), "top_k": 0})
        else:
            kwargs["do_sample"] = False
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        return int(out.shape[1] - n) * len(batch_bodies), sum(len(b["prompt"]) for b in batch_bodies)

    done = out_tokens = in_tokens = 0
    gen_s = 0.0
    try:
        generate([dict(b, max_tokens=4) for b in bodies[:2]])  # warm-up
        torch.cuda.synchronize()
        for i in range(0, len(bodies), a.batch):
            if a.budget_s > 0 and time.time() - start > a.budget_s:
                result["skipped"] = f"budget of {a.budget_s} s spent after {done} requests"
                break
            chunk = bodies[i:i + a.batch]
            torch.cuda.synchronize()
            t = time.perf_counter()
            o, n = generate(chunk)
            torch.cuda.synchronize()
            gen_s += time.perf_counter() - t
            done += len(chunk)
            out_tokens += o
            in_tokens += n
    except Exception as e:  # reported in the JSON: an HF failure must not hide our numbers
        result["error"] = f"{type(e).__name__}: {e}"[:2000]
    result.update({"requests": done, "output_tokens": out_tokens, "prompt_tokens": in_tokens,
                   "generate_s": round(gen_s, 3)})
    if gen_s > 0:
        result["output_tokens_per_s"] = out_tokens / gen_s
        result["total_tokens_per_s"] = (out_tokens + in_tokens) / gen_s
    text = json.dumps(result)
    print(text)
    if a.out:
        open(a.out, "w").write(text + "\n")
    return 0 if done > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
