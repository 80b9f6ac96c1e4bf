#!/usr/bin/env python3
"""Makes the DeepSeek-V4 parity fixtures in tests/fixtures/ with HF transformers (float32).

Each fixture is a small random-weight checkpoint (config.json + safetensors) plus what HF's
`deepseek_v4` computes from exactly the stored values:

* logits.bin: float32 little-endian [rows, vocab]; for each prompt, one row per position of
  prompt + greedy_24[:23] (the logits that predict every prompt token after the first and every
  greedy token), computed by one forward pass without a cache.
* expected.json: per prompt its ids, logits_row_offset, greedy_24 (greedy continuation by full
  recompute, use_cache=False, one token at a time: the truth), greedy_24_cached (HF's cached
  `generate`), cached_max_logit_diff (largest |logit| difference between the cached steps and
  the full recompute), greedy_min_margin, draws (see MIN_MARGIN) and max_abs_logit.

Tensors carry HF's parameter names. Two storage layouts:
* "bf16": matrices in bf16 (HF's float32 reference runs on the bf16-rounded values); norms,
  hyper-connection parameters, sinks, position biases and the router in float32.
* "mix", as a V4 release stores a model: attention, shared-expert and indexer query projections
  in FP8 e4m3 with power-of-two (UE8M0) float32 `<name>_scale_inv` over 128x128 blocks; routed
  experts per expert in MXFP4 (`...experts.E.{gate,up,down}_proj.weight` U8 [out, in/2], low
  nibble = even input column, E2M1 codes; `...weight_scale` U8 [out, in/32], E8M0 = 2^(b-127));
  compressor and indexer key/gate/weights projections, embeddings and lm_head in bf16; the rest
  float32; sharded in two files with model.safetensors.index.json. HF's reference runs on the
  dequantised values, which are exactly representable in float32.

Runs on CPU torch; needs transformers with DeepseekV4ForCausalLM (5.17).

  python3 tools/make_fixtures_v4.py --out tests/fixtures [--only NAME ...]
"""
import json
import math
import os
import shutil

import fixture_cli
import torch
import transformers
from safetensors.torch import save_file
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

COMMON = dict(vocab_size=1000, hidden_act="silu", max_position_embeddings=1024,
              rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1,
              pad_token_id=None, scoring_func="sqrtsoftplus", norm_topk_prob=True,
              rope_theta=10000.0, compress_rope_theta=160000.0, num_key_value_heads=1,
              num_nextn_predict_layers=0)

FIXTURES = {
    # Every layer type, window 16, CSA every 4 with top-8 indexer picks, HCA every 16, YaRN on
    # the compressed layers, 4 residual streams, 2 output groups, one hash layer, a low SwiGLU
    # clamp; stored as a V4 release stores it (FP8 + MXFP4 + bf16).
    "dsv4_mix": dict(
        hidden_size=128, num_hidden_layers=4, num_attention_heads=4, head_dim=64,
        partial_rotary_factor=0.25, q_lora_rank=64, o_groups=2, o_lora_rank=32,
        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=64,
        routed_scaling_factor=1.5, swiglu_limit=2.0,
        layer_types=["sliding_attention", "compressed_sparse_attention",
                     "heavily_compressed_attention", "compressed_sparse_attention"],
        mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
        sliding_window=16, index_n_heads=4, index_head_dim=32, index_topk=8,
        hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6,
        rope_parameters={"rope_type": "yarn", "factor": 4.0,
                         "original_max_position_embeddings": 256, "beta_fast": 32.0,
                         "beta_slow": 1.0},
        prompts=[5, 37, 300], storage="mix"),
    # HCA first, two hash layers, window 8, CSA every 4 with top-4 picks, HCA every 8, plain
    # RoPE on the compressed layers, 2 residual streams with 7 Sinkhorn steps, 4 output
    # groups, 3 of 16 experts; matrices stored in bf16. 8 indexer heads: with few heads many
    # ReLU scores are exactly 0 and the top-k picks among ties, which torch.topk breaks by the
    # length of the forward pass, so HF's cached and full-recompute logits would disagree.
    "dsv4_bf16": dict(
        hidden_size=96, num_hidden_layers=5, num_attention_heads=4, head_dim=32,
        partial_rotary_factor=0.25, q_lora_rank=48, o_groups=4, o_lora_rank=16,
        n_routed_experts=16, num_experts_per_tok=3, n_shared_experts=1, moe_intermediate_size=32,
        routed_scaling_factor=2.0, swiglu_limit=10.0,
        layer_types=["heavily_compressed_attention", "sliding_attention",
                     "compressed_sparse_attention", "heavily_compressed_attention",
                     "sliding_attention"],
        mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        sliding_window=8, index_n_heads=8, index_head_dim=16, index_topk=4,
        hc_mult=2, hc_sinkhorn_iters=7, hc_eps=1e-6,
        rope_parameters=None,
        prompts=[9, 64, 260], storage="bf16"),
}

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def make_config(spec):
    kw = dict(COMMON)
    kw.update({k: v for k, v in spec.items() if k not in ("prompts", "storage")})
    if kw.get("rope_parameters") is None:
        kw.pop("rope_parameters", None)
    cfg = DeepseekV4Config(**kw)
    cfg.architectures = ["DeepseekV4ForCausalLM"]
    return cfg


def fp8_ue8m0(w):
    """128x128 blocks, power-of-two scale per block: w ~= q * scale_inv."""
    out, inp = w.shape
    bo, bi = math.ceil(out / 128), math.ceil(inp / 128)
    scale = torch.zeros(bo, bi, dtype=torch.float32)
    for i in range(bo):
        for j in range(bi):
            amax = float(w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128].abs().max())
            scale[i, j] = 2.0 ** math.ceil(math.log2(max(amax, 1e-30) / 448.0))
    s_full = scale.repeat_interleave(128, 0)[:out].repeat_interleave(128, 1)[:, :inp]
    q = (w / s_full).to(torch.float8_e4m3fn)
    return q, scale, q.to(torch.float32) * s_full


def mxfp4(w):
    """Per row, per 32 input columns: an E8M0 scale and E2M1 codes (low nibble first)."""
    out, inp = w.shape
    assert inp % 32 == 0, inp
    groups = w.reshape(out, inp // 32, 32)
    amax = groups.abs().amax(dim=-1).clamp(min=1e-30)
    exp = torch.ceil(torch.log2(amax / 6.0)).to(torch.int32)
    scale = torch.pow(2.0, exp.float())
    v = groups / scale.unsqueeze(-1)
    table = torch.tensor(E2M1)
    mag = (v.abs().unsqueeze(-1) - table).abs().argmin(dim=-1)  # nearest magnitude
    sign = (v < 0) & (mag > 0)
    codes = (mag | (sign.to(torch.int64) << 3)).to(torch.uint8).reshape(out, inp)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()
    deq = (table[mag] * torch.where(sign, -1.0, 1.0) * scale.unsqueeze(-1)).reshape(out, inp)
    return packed, (exp + 127).to(torch.uint8).contiguous(), deq


KEEP_BF16 = ("compressor.kv_proj", "compressor.gate_proj", "indexer.kv_proj", "indexer.gate_proj",
             "scorer.weights_proj")


def storage_kind(name, t, storage):
    """What a tensor is stored as: f32, bf16, fp8, mxfp4 (fused routed experts) or int."""
    if not t.is_floating_point():
        return "int"
    if t.dim() < 2 or "norm" in name or ".mlp.gate." in name:
        return "f32"
    if "attn_hc" in name or "ffn_hc" in name or "hc_head" in name or "position_bias" in name:
        return "f32"
    if storage == "bf16":
        return "bf16"
    if ".mlp.experts." in name:
        return "mxfp4"
    if "embed_tokens" in name or name == "lm_head.weight" or any(k in name for k in KEEP_BF16):
        return "bf16"
    return "fp8"


def randomise(model, cfg, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("sinks") or "position_bias" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".base") or name.endswith("hc_base"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".scale") or name.endswith("hc_scale"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            elif "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_((torch.rand(b.shape, generator=gen) - 0.5) * 0.2)
            elif name.endswith("tid2eid"):
                rows = [torch.randperm(cfg.n_routed_experts, generator=gen)[:cfg.num_experts_per_tok]
                        for _ in range(b.shape[0])]
                b.copy_(torch.stack(rows).to(b.dtype))


def stored_tensors(model, storage):
    """Rounds the model's parameters to what is stored and returns the tensors to write."""
    inter = model.config.moe_intermediate_size
    out = {}
    with torch.no_grad():
        params = dict(model.named_parameters())
        for name, t in model.state_dict().items():
            if "rotary_emb" in name:
                continue
            kind = storage_kind(name, t, storage)
            p = params.get(name)
            if kind == "int":
                out[name] = t.contiguous()
            elif kind == "f32":
                out[name] = t.float().contiguous()
            elif kind == "bf16":
                p.copy_(p.bfloat16().float())
                out[name] = p.detach().to(torch.bfloat16).contiguous()
            elif kind == "fp8":
                q, s, deq = fp8_ue8m0(p.detach().float().clone())
                p.copy_(deq)
                out[name] = q.contiguous()
                out[name + "_scale_inv"] = s.contiguous()
            elif kind == "mxfp4":
                pre = name[: name.rindex(".") + 1]  # model.layers.L.mlp.experts.
                deq_all = torch.empty_like(p)
                for e in range(p.shape[0]):
                    if name.endswith("gate_up_proj"):  # [E, 2I, H]: gate rows first, then up
                        parts = {"gate_proj": p[e, :inter], "up_proj": p[e, inter:]}
                    else:  # down_proj [E, H, I]
                        parts = {"down_proj": p[e]}
                    deq_parts = []
                    for pname, w in parts.items():
                        packed, sc, deq = mxfp4(w.detach().float().clone())
                        out[f"{pre}{e}.{pname}.weight"] = packed
                        out[f"{pre}{e}.{pname}.weight_scale"] = sc
                        deq_parts.append(deq)
                    deq_all[e] = torch.cat(deq_parts, 0)
                p.copy_(deq_all)
    return out


def write_checkpoint(d, cfg, model, tensors, storage):
    os.makedirs(d, exist_ok=True)
    cfg.save_pretrained(d)
    model.generation_config.save_pretrained(d)
    if storage == "mix":
        keys = sorted(tensors)
        half = len(keys) // 2
        shards = {"model-00001-of-00002.safetensors": keys[:half],
                  "model-00002-of-00002.safetensors": keys[half:]}
        wmap = {}
        for fname, ks in shards.items():
            save_file({k: tensors[k] for k in ks}, os.path.join(d, fname), metadata={"format": "pt"})
            wmap.update({k: fname for k in ks})
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": wmap}, f, indent=1)
        with open(os.path.join(d, "config.json")) as f:
            cj = json.load(f)
        cj["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                     "activation_scheme": "dynamic",
                                     "weight_block_size": [128, 128]}
        cj["expert_dtype"] = "fp4"
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cj, f, indent=2)
    else:
        save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})


def reload_check(d, model, ids):
    """HF loads the bf16 checkpoint back to the same logits (our names are HF's)."""
    try:
        again = DeepseekV4ForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        with torch.no_grad():
            a = model(input_ids=ids[None], use_cache=False).logits
            b = again(input_ids=ids[None], use_cache=False).logits
        print("  reload by HF: max |logit diff|", float((a - b).abs().max()))
    except Exception as e:  # reported, not fatal: the mix layout is not HF's FP8 loader's
        print("  reload by HF failed:", type(e).__name__, str(e)[:300])


# A prompt whose greedy continuation has a top-2 logit gap below MIN_MARGIN at some step is
# drawn again (at most MAX_DRAWS times): a gap that small is within float32 summation-order noise
# of an independent implementation, so greedy identity would test the noise.
MIN_MARGIN = 2e-3
MAX_DRAWS = 20


def greedy_by_recompute(model, cfg, n, pg):
    """A random prompt of n tokens and its 24 greedy tokens, each by a full forward pass."""
    ids = torch.randint(2, cfg.vocab_size, (n,), generator=pg)
    seq, cont, margins, steps = ids.tolist(), [], [], []
    for _ in range(24):
        last = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].float()
        top2 = torch.topk(last, 2).values
        margins.append(float(top2[0] - top2[1]))
        steps.append(last)
        t = int(torch.argmax(last))
        cont.append(t)
        seq.append(t)
    return ids, cont, margins, steps


def main():
    args, names = fixture_cli.parse(FIXTURES, __doc__)
    for name in names:
        spec = FIXTURES[name]
        torch.manual_seed(4321 + len(name))
        cfg = make_config(spec)
        model = DeepseekV4ForCausalLM(cfg).eval().float()
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        randomise(model, cfg, torch.Generator().manual_seed(77 + len(name)))
        tensors = stored_tensors(model, spec["storage"])
        d = os.path.join(args.out, name)
        shutil.rmtree(d, ignore_errors=True)
        write_checkpoint(d, cfg, model, tensors, spec["storage"])
        print(name, "tensors:", {k: (str(v.dtype), tuple(v.shape)) for k, v in list(tensors.items())[:60]})
        pg = torch.Generator().manual_seed(7 + len(name))
        rows, prompts = [], []
        with torch.no_grad():
            for n in spec["prompts"]:
                for draw in range(MAX_DRAWS):
                    ids, cont, margins, steps = greedy_by_recompute(model, cfg, n, pg)
                    if min(margins) >= MIN_MARGIN:
                        break
                full = torch.tensor([ids.tolist() + cont[:23]])
                lg = model(input_ids=full, use_cache=False).logits[0].float()
                gen = model.generate(ids[None], max_new_tokens=24, do_sample=False,
                                     output_logits=True, return_dict_in_generate=True)
                cached = gen.sequences[0, n:].tolist()
                cached_diff = max(float((c[0].float() - s).abs().max())
                                  for c, s in zip(gen.logits, steps))
                prompts.append({"ids": ids.tolist(), "logits_row_offset": sum(r.shape[0] for r in rows),
                                "logits_rows": int(lg.shape[0]), "greedy_24": cont,
                                "greedy_24_cached": cached, "cached_max_logit_diff": cached_diff,
                                "greedy_min_margin": min(margins), "draws": draw + 1,
                                "max_abs_logit": float(lg.abs().max())})
                rows.append(lg)
                print(name, "prompt", n, "max|logit|", float(lg.abs().max()), "min margin",
                      min(margins), "cached==full", cached == cont, "cached max diff", cached_diff)
            if spec["storage"] == "bf16":
                reload_check(d, model, torch.tensor(prompts[1]["ids"]))
        allrows = torch.cat(rows, 0).contiguous()
        allrows.numpy().astype("<f4").tofile(os.path.join(d, "logits.bin"))
        with open(os.path.join(d, "expected.json"), "w") as f:
            json.dump({"generator": "tools/make_fixtures_v4.py",
                       "transformers": transformers.__version__, "torch": torch.__version__,
                       "vocab_size": cfg.vocab_size, "logits_rows": int(allrows.shape[0]),
                       "logits_cover": "ids + greedy_24[:23], one forward pass, use_cache=False",
                       "prompts": prompts}, f)
        print(name, "files:", {f: os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)})


if __name__ == "__main__":
    main()
