#!/usr/bin/env python3
"""Makes the DeepSeek-V3 parity fixtures in tests/fixtures/ with HF transformers (float32).

Each fixture is a small random-weight checkpoint (config.json + safetensors) plus what HF
computes from exactly those stored values: float32 logits at every prompt position
(logits.bin, row-major [positions, vocab], little-endian) and 24-token greedy continuations
(expected.json). Runs on CPU torch; needs transformers >= 5 (DeepseekV3ForCausalLM).

  python3 tools/make_fixtures.py --out tests/fixtures [--only NAME ...]
"""
import json
import math
import os
import shutil

import fixture_cli
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

COMMON = dict(vocab_size=1000, hidden_act="silu", max_position_embeddings=512,
              rms_norm_eps=1e-6, attention_bias=False, tie_word_embeddings=False,
              routed_scaling_factor=2.5, norm_topk_prob=True, bos_token_id=0, eos_token_id=1,
              pad_token_id=None)

FIXTURES = {
    # (a) q_lora, plain RoPE (interleaved, as DeepSeek checkpoints), one dense layer.
    "dsv3_qlora_rope": dict(
        hidden_size=96, intermediate_size=192, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8,
        kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=16, qk_nope_head_dim=24,
        v_head_dim=24, n_group=2, topk_group=1, num_experts_per_tok=2, first_k_dense_replace=1,
        rope_interleave=True,
        rope={"rope_type": "default", "rope_theta": 10000.0},
        prompts=[5, 17, 64, 130], dtypes=None),
    # (b) no q_lora, YaRN, two dense layers, 4 groups, 2 shared experts, rotate-half RoPE,
    # stored as a dtype mix (FP8 block-scaled attention/dense/shared, BF16 experts+embeddings)
    # in DeepSeek's per-expert naming, sharded through model.safetensors.index.json.
    "dsv3_yarn_nolora": dict(
        hidden_size=128, intermediate_size=256, moe_intermediate_size=32, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=2, n_routed_experts=16,
        kv_lora_rank=64, q_lora_rank=None, qk_rope_head_dim=16, qk_nope_head_dim=32,
        v_head_dim=32, n_group=4, topk_group=2, num_experts_per_tok=4, first_k_dense_replace=2,
        rope_interleave=False,
        rope={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
              "original_max_position_embeddings": 128, "beta_fast": 32.0, "beta_slow": 1.0,
              "mscale": 1.0, "mscale_all_dim": 1.0},
        prompts=[7, 33, 130], dtypes="mix"),
    # (c) the MLA head sizes of DeepSeek-V3 / Moonlight (kv_lora 512, rope 64, nope 128, v 128),
    # which the fast CUDA kernels require (the bf16 MLA decode key-split kernel, the
    # non-absorbed prefill), small elsewhere; no q_lora, one group, one dense layer, weights
    # stored as bf16 (HF's float32 reference runs on the bf16-rounded values).
    "dsv3_mla_dims": dict(
        hidden_size=128, intermediate_size=256, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, n_shared_experts=1, n_routed_experts=8,
        kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=128,
        v_head_dim=128, n_group=1, topk_group=1, num_experts_per_tok=2, first_k_dense_replace=1,
        rope_interleave=True,
        rope={"rope_type": "default", "rope_theta": 50000.0},
        prompts=[5, 70, 150], dtypes="bf16"),
}


def make_config(spec):
    kw = dict(COMMON)
    kw.update({k: v for k, v in spec.items() if k not in ("rope", "prompts", "dtypes")})
    try:
        cfg = DeepseekV3Config(**kw, rope_parameters=dict(spec["rope"]))
    except TypeError:
        rope = dict(spec["rope"])
        kw["rope_theta"] = rope.pop("rope_theta")
        cfg = DeepseekV3Config(**kw, rope_scaling=None if rope["rope_type"] == "default" else rope)
    return cfg


def fp8_quantize(w):
    """Block 128x128 FP8 e4m3 as DeepSeek stores it: w ~= q * scale_inv (per block)."""
    out, inp = w.shape
    bo, bi = math.ceil(out / 128), math.ceil(inp / 128)
    scale = torch.zeros(bo, bi, dtype=torch.float32)
    for i in range(bo):
        for j in range(bi):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            scale[i, j] = blk.abs().max().clamp(min=1e-12) / 448.0
    s_full = scale.repeat_interleave(128, 0)[:out].repeat_interleave(128, 1)[:, :inp]
    q = (w / s_full).to(torch.float8_e4m3fn)
    deq = q.to(torch.float32) * s_full
    return q, scale, deq


def storage_kind(name):
    if "norm" in name or "mlp.gate." in name or "e_score" in name:
        return "f32"
    if ".experts." in name and "shared" not in name:
        return "bf16"
    if name.endswith("embed_tokens.weight") or name == "lm_head.weight":
        return "bf16"
    return "fp8"


def bf16_storage(name, t):
    """Tensors a dtypes="bf16" fixture stores as bf16: the matrices (not norms, router, bias)."""
    return t.dim() >= 2 and "norm" not in name and "mlp.gate." not in name and "e_score" not in name


def main():
    args, names = fixture_cli.parse(FIXTURES, __doc__)
    for name in names:
        spec = FIXTURES[name]
        torch.manual_seed(1234 + len(name))
        cfg = make_config(spec)
        model = DeepseekV3ForCausalLM(cfg).eval().float()
        gen = torch.Generator().manual_seed(99 + len(name))
        sd_names = []
        with torch.no_grad():
            for pname, p in model.named_parameters():
                sd_names.append((pname, tuple(p.shape)))
                if "e_score_correction_bias" in pname:
                    continue
                if "norm" in pname:
                    p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
                elif "embed_tokens" in pname:
                    p.copy_(torch.randn(p.shape, generator=gen))
                else:
                    p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
            for bname, b in list(model.named_buffers()) + list(model.named_parameters()):
                if "e_score_correction_bias" in bname:
                    b.copy_((torch.rand(b.shape, generator=gen) - 0.5) * 0.2)
            quant = {}
            if spec["dtypes"] == "bf16":  # round what bf16_storage() stores as bf16
                for pname, p in model.named_parameters():
                    if bf16_storage(pname, p):
                        p.copy_(p.bfloat16().float())
            if spec["dtypes"] == "mix":
                for pname, p in model.named_parameters():
                    kind = storage_kind(pname)
                    if kind == "bf16":
                        p.copy_(p.bfloat16().float())
                    elif kind == "fp8" and p.dim() == 2:
                        q, s, deq = fp8_quantize(p.detach().clone())
                        p.copy_(deq)
                        quant[pname] = (q, s)
        print(name, "params:", sd_names[:40], "...")
        d = os.path.join(args.out, name)
        shutil.rmtree(d, ignore_errors=True)
        model.save_pretrained(d, safe_serialization=True)
        print(name, "saved files:", sorted(os.listdir(d)))
        if spec["dtypes"] == "bf16":
            for f in sorted(os.listdir(d)):
                if f.endswith(".safetensors"):
                    path = os.path.join(d, f)
                    sd = load_file(path)
                    save_file({k: v.to(torch.bfloat16).contiguous()
                               if bf16_storage(k, v) else v.contiguous() for k, v in sd.items()},
                              path, metadata={"format": "pt"})
        if spec["dtypes"] == "mix":
            sd = {}
            for f in sorted(os.listdir(d)):
                if f.endswith(".safetensors"):
                    sd.update(load_file(os.path.join(d, f)))
                    os.remove(os.path.join(d, f))
            for f in os.listdir(d):
                if f.endswith(".index.json"):
                    os.remove(os.path.join(d, f))
            inter = spec["moe_intermediate_size"]
            hid = spec["hidden_size"]
            out = {}
            for k, v in sd.items():
                if k.endswith("mlp.experts.gate_up_proj"):  # fused [E, 2I, H] -> per expert
                    pre = k[: -len("gate_up_proj")]
                    if v.shape[1] != 2 * inter:
                        v = v.transpose(1, 2)
                    for e in range(v.shape[0]):
                        out[f"{pre}{e}.gate_proj.weight"] = v[e, :inter].contiguous()
                        out[f"{pre}{e}.up_proj.weight"] = v[e, inter:].contiguous()
                elif k.endswith("mlp.experts.down_proj"):  # fused [E, H, I]
                    pre = k[: -len("down_proj")]
                    if v.shape[1] != hid:
                        v = v.transpose(1, 2)
                    for e in range(v.shape[0]):
                        out[f"{pre}{e}.down_proj.weight"] = v[e].contiguous()
                else:
                    out[k] = v
            final = {}
            for k, v in out.items():
                kind = storage_kind(k)
                if k in quant:
                    final[k] = quant[k][0].contiguous()
                    final[k + "_scale_inv"] = quant[k][1].contiguous()
                elif kind == "bf16":
                    final[k] = v.to(torch.bfloat16).contiguous()
                else:
                    final[k] = v.float().contiguous()
            keys = sorted(final)
            half = len(keys) // 2
            shards = {"model-00001-of-00002.safetensors": keys[:half],
                      "model-00002-of-00002.safetensors": keys[half:]}
            wmap = {}
            for fname, ks in shards.items():
                save_file({k: final[k] for k in ks}, os.path.join(d, fname), metadata={"format": "pt"})
                for k in ks:
                    wmap[k] = fname
            with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {}, "weight_map": wmap}, f, indent=1)
            with open(os.path.join(d, "config.json")) as f:
                cj = json.load(f)
            cj["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3",
                                         "activation_scheme": "dynamic",
                                         "weight_block_size": [128, 128]}
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(cj, f, indent=2)
        # Reference outputs.
        pg = torch.Generator().manual_seed(7 + len(name))
        logits_rows = []
        prompts = []
        with torch.no_grad():
            for n in spec["prompts"]:
                ids = torch.randint(2, cfg.vocab_size, (n,), generator=pg)
                lg = model(input_ids=ids[None]).logits[0].float()
                logit_offset = sum(r.shape[0] for r in logits_rows)
                logits_rows.append(lg)
                seq = ids.tolist()
                cont, margins = [], []
                for _ in range(24):
                    last = model(input_ids=torch.tensor([seq])).logits[0, -1].float()
                    top2 = torch.topk(last, 2).values
                    margins.append(float(top2[0] - top2[1]))
                    t = int(torch.argmax(last))
                    cont.append(t)
                    seq.append(t)
                prompts.append({"ids": ids.tolist(), "logits_row_offset": logit_offset,
                                "greedy_24": cont, "greedy_min_margin": min(margins),
                                "max_abs_logit": float(lg.abs().max())})
                print(name, "prompt", n, "max|logit|", float(lg.abs().max()), "min margin",
                      min(margins))
        allrows = torch.cat(logits_rows, 0).contiguous()
        allrows.numpy().astype("<f4").tofile(os.path.join(d, "logits.bin"))
        with open(os.path.join(d, "expected.json"), "w") as f:
            json.dump({"generator": "tools/make_fixtures.py", "transformers": transformers.__version__,
                       "torch": torch.__version__, "vocab_size": cfg.vocab_size,
                       "logits_rows": int(allrows.shape[0]), "prompts": prompts}, f)
        print(name, "files:", {f: os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)})


if __name__ == "__main__":
    main()
