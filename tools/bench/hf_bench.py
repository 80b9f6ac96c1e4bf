#!/usr/bin/env python3
"""hf_bench.py - the HF transformers baseline for deepinfer-bench, on the same config.json.

Builds DeepseekV3ForCausalLM (or DeepseekV4ForCausalLM, when the config's `architectures` names
it; HF's V4 port has only eager attention, so --attn is eager there) from a config with random
weights (HF's own init), in bf16 on one CUDA GPU, and measures what deepinfer-bench measures:

  prefill:  B prompts of C random tokens per forward (logits of the last position only, as our
            engine computes them), one warm-up forward, then --prefill-iters timed ones; median.
  decode:   for each N in --decode-requests: N prompts of C tokens prefilled into a
            DynamicCache (untimed), then --warmup + --decode-steps greedy one-token steps of all
            N requests; each step timed with torch.cuda.synchronize() around it; median.

Prints one JSON object (and writes it to --out). Needs torch and transformers >= 5 (GPU
machine: torch 2.11, transformers 5.17). A case that does not fit in memory (or in
--budget-s) is reported with an "error" / "skipped" field instead of numbers.

  python3 hf_bench.py --config tools/bench/configs/moonlight_shaped.json \
      --prefill-batch 32 --context 1024 --decode-requests 1,128 --out hf.json
"""

import argparse
import json
import statistics
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--config", required=True, help="config.json (DeepSeek-V3 family or V4)")
    p.add_argument("--context", type=int, default=1024, help="prompt / cached tokens per request")
    p.add_argument("--prefill-batch", type=int, default=32, help="prompts per prefill forward (0: skip)")
    p.add_argument("--prefill-iters", type=int, default=3, help="timed prefill forwards")
    p.add_argument("--decode-requests", default="1,128", help="comma list of concurrent requests")
    p.add_argument("--decode-steps", type=int, default=10, help="timed decode steps per N")
    p.add_argument("--warmup", type=int, default=3, help="untimed decode steps per N")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--attn", default="sdpa", help="attn_implementation (sdpa or eager)")
    p.add_argument("--experts-impl", default="",
                   help="experts_implementation passed to transformers (default: its own)")
    p.add_argument("--budget-s", type=float, default=0,
                   help="skip the remaining cases once this many seconds have passed (0: never)")
    p.add_argument("--pause-before-decode-ms", type=int, default=0,
                   help="idle the GPU this long after each decode run's cache fill (as "
                        "deepinfer-bench --pause-before-decode-ms): clocks settle after a prefill")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="", help="also write the JSON here")
    return p.parse_args()


def main():
    args = parse_args()
    start = time.time()
    import torch
    import transformers
    from transformers.cache_utils import DynamicCache

    with open(args.config) as f:
        v4 = "DeepseekV4ForCausalLM" in json.load(f).get("architectures", [])
    if v4:
        from transformers import DeepseekV4Config as Config, DeepseekV4ForCausalLM as ForCausalLM
        args.attn = "eager"
    else:
        from transformers import DeepseekV3Config as Config, DeepseekV3ForCausalLM as ForCausalLM

    dtype = getattr(torch, args.dtype)
    result = {
        "engine": "hf-transformers",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "config": args.config,
        "dtype": args.dtype,
        "attn_implementation": args.attn,
        "context": args.context,
        "gpu": torch.cuda.get_device_name(0),
    }

    def over_budget():
        return args.budget_s > 0 and time.time() - start > args.budget_s

    def timed(fn):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        return out, time.perf_counter() - t0

    torch.manual_seed(args.seed)
    cfg = Config.from_json_file(args.config)
    cfg.use_cache = True
    kwargs = {"attn_implementation": args.attn}
    if args.experts_impl:
        kwargs["experts_implementation"] = args.experts_impl
    t0 = time.time()
    with torch.device("cuda"):
        try:
            model = ForCausalLM._from_config(cfg, dtype=dtype, **kwargs)
        except TypeError:  # transformers < 5 spells it torch_dtype
            model = ForCausalLM._from_config(cfg, torch_dtype=dtype, **kwargs)
    model.eval()
    torch.cuda.synchronize()
    result["build_s"] = round(time.time() - t0, 2)
    result["params"] = sum(p.numel() for p in model.parameters())
    result["param_dtype"] = str(next(model.parameters()).dtype)
    result["experts_implementation"] = str(getattr(model.config, "_experts_implementation", None))
    # HF's own init must have filled the weights (all-equal router weights would route every
    # token to the same experts and flatter the MoE timing): record a few standard deviations.
    result["weight_std"] = {
        name: float(p.detach().float().std())
        for name, p in model.named_parameters()
        if name.endswith(("embed_tokens.weight", "layers.1.mlp.gate.weight",
                          "layers.1.mlp.experts.down_proj", "layers.1.self_attn.o_proj.weight"))
    }
    vocab = cfg.vocab_size
    gen = torch.Generator(device="cuda").manual_seed(1234)

    def prompts(n):
        return torch.randint(0, vocab, (n, args.context), device="cuda", generator=gen)

    # ---- prefill ----
    if args.prefill_batch > 0:
        pre = {"batch": args.prefill_batch, "tokens_per_step": args.prefill_batch * args.context}
        try:
            with torch.inference_mode():
                ids = prompts(args.prefill_batch)
                fwd = lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1).logits
                timed(fwd)  # warm-up
                times = [timed(fwd)[1] for _ in range(args.prefill_iters)]
            pre["step_s"] = statistics.median(times)
            pre["tokens_per_s"] = pre["tokens_per_step"] / pre["step_s"]
            pre["times_s"] = times
        except torch.cuda.OutOfMemoryError as e:
            pre["error"] = "out of memory: " + str(e).splitlines()[0]
        result["prefill"] = pre
        torch.cuda.empty_cache()

    # ---- decode at N concurrent requests ----
    result["decode"] = []
    for n in [int(x) for x in args.decode_requests.split(",") if x]:
        dec = {"requests": n}
        if over_budget():
            dec["skipped"] = "time budget"
            result["decode"].append(dec)
            continue
        cache = None
        try:
            with torch.inference_mode():
                # V4's layers need their own cache kinds (window, compressed): from the config.
                cache = DynamicCache(config=cfg) if v4 else DynamicCache()
                ids = prompts(n)
                (logits, t_fill) = timed(lambda: model(input_ids=ids, past_key_values=cache,
                                                       use_cache=True, logits_to_keep=1).logits)
                dec["fill_prefill_s"] = t_fill
                nxt = logits[:, -1].argmax(-1, keepdim=True)
                if args.pause_before_decode_ms > 0:
                    torch.cuda.synchronize()
                    time.sleep(args.pause_before_decode_ms / 1000.0)
                times, seq0 = [], []
                for step in range(args.warmup + args.decode_steps):
                    def one():
                        return model(input_ids=nxt, past_key_values=cache, use_cache=True).logits
                    logits, t = timed(one)
                    nxt = logits[:, -1].argmax(-1, keepdim=True)
                    seq0.append(int(nxt[0, 0]))
                    if step >= args.warmup:
                        times.append(t)
            dec["timed_steps"] = len(times)
            dec["p50_s"] = statistics.median(times)
            dec["p99_s"] = sorted(times)[min(len(times) - 1, int(0.99 * (len(times) - 1) + 0.5))]
            dec["tokens_per_s"] = n / dec["p50_s"]
            dec["seq0_tokens"] = seq0
        except torch.cuda.OutOfMemoryError as e:
            dec["error"] = "out of memory: " + str(e).splitlines()[0]
        del cache
        torch.cuda.empty_cache()
        result["decode"].append(dec)

    result["mem_peak_bytes"] = torch.cuda.max_memory_allocated()
    result["total_s"] = round(time.time() - start, 2)
    text = json.dumps(result)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
