#!/usr/bin/env python3
"""HF transformers' own bf16 error on the parity fixtures: the other half of "ours X vs HF bf16 Y".

For each fixture (tests/fixtures/<name>/: config.json + safetensors + logits.bin/expected.json
from tools/make_fixtures.py) this loads the exact weights HF's float32 reference used (FP8
block-scaled tensors dequantised as make_fixtures.py did, per-expert tensors fused back into
HF's expert layout), checks that HF float32 reproduces logits.bin (sanity: the load is right),
then casts the model to bfloat16 (as `from_pretrained(..., dtype=torch.bfloat16)` would run it)
and prints, over every prompt position,

  max |logit_bf16 - logit_fp32| / max |logit_fp32|      (the figure cuda_parity_test prints
                                                         for our bf16 model as "max rel")
  the rms of the per-position value, the positions within 2e-2 (kBf16Tolerance), and the
  teacher-forced greedy agreement with expected.json's greedy_24 (as TeacherForcedGreedy).

Runs on the GPU machine (torch + transformers 5.17); CPU works too, slowly.

  python3 tools/parity/hf_bf16_error.py --fixtures tests/fixtures [--device cuda]
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import transformers
from safetensors.torch import load_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

BF16_TOLERANCE = 2e-2  # tests/parity/parity_checks.h kBf16Tolerance


def read_checkpoint(d, block_rows, block_cols):
    """All tensors of the fixture as float32, FP8 ones dequantised (w = q * scale_inv per block)."""
    raw = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            raw.update(load_file(os.path.join(d, f)))
    out = {}
    for k, v in raw.items():
        if k.endswith("_scale_inv"):
            continue
        if k + "_scale_inv" in raw:
            s = raw[k + "_scale_inv"].float()
            rows, cols = v.shape
            full = s.repeat_interleave(block_rows, 0)[:rows].repeat_interleave(block_cols, 1)[:, :cols]
            out[k] = v.float() * full
        else:
            out[k] = v.float()
    return out


def to_model_layout(tensors, model):
    """Maps checkpoint names onto the model's parameters (per-expert -> fused experts)."""
    want = model.state_dict()
    sd = {}
    for key, ref in want.items():
        if key in tensors:
            sd[key] = tensors[key]
            continue
        if key.endswith("mlp.experts.gate_up_proj"):
            pre = key[: -len("gate_up_proj")]
            n = ref.shape[0]
            v = torch.stack([torch.cat([tensors[f"{pre}{e}.gate_proj.weight"],
                                        tensors[f"{pre}{e}.up_proj.weight"]], 0)
                             for e in range(n)])  # [E, 2I, H]
            sd[key] = v if v.shape == ref.shape else v.transpose(1, 2).contiguous()
        elif key.endswith("mlp.experts.down_proj"):
            pre = key[: -len("down_proj")]
            n = ref.shape[0]
            v = torch.stack([tensors[f"{pre}{e}.down_proj.weight"] for e in range(n)])  # [E, H, I]
            sd[key] = v if v.shape == ref.shape else v.transpose(1, 2).contiguous()
    missing = [k for k in want if k not in sd]
    return sd, missing


def load_fp32_model(d, device):
    with open(os.path.join(d, "config.json")) as f:
        cj = json.load(f)
    block = (cj.get("quantization_config") or {}).get("weight_block_size", [128, 128])
    cfg = DeepseekV3Config.from_pretrained(d)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config  # dequantised here, as the float32 reference was
    model = DeepseekV3ForCausalLM(cfg).eval().float()
    sd, missing = to_model_layout(read_checkpoint(d, block[0], block[1]), model)
    # Non-persistent buffers (rotary inv_freq) are rebuilt by the model; anything else missing
    # would be a wrong load, which the float32 sanity check below would also show.
    result = model.load_state_dict(sd, strict=False)
    if missing or result.missing_keys:
        print("  warning: not loaded:", sorted(set(missing) | set(result.missing_keys))[:10])
    return model.to(device)


def measure(model, prompts, ref, vocab, device):
    """Per-position max |ours - ref| / max |ref| and teacher-forced greedy matches."""
    rel_all, matches, positions, max_ref = [], 0, 0, 0.0
    rows = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p["ids"]], device=device)
            lg = model(input_ids=ids).logits[0].float().cpu().numpy()
            off = p["logits_row_offset"]
            r = ref[off:off + len(p["ids"])]
            rows.append((lg, r))
            max_ref = max(max_ref, float(np.abs(ref[off:off + len(p["ids"])]).max()))
            greedy = p["greedy_24"]
            full = torch.tensor([p["ids"] + greedy[:-1]], device=device)
            out = model(input_ids=full).logits[0].float()
            pred = out[len(p["ids"]) - 1:].argmax(-1).cpu().tolist()
            matches += sum(int(a == b) for a, b in zip(pred, greedy))
            positions += len(greedy)
    per_prompt = []
    for lg, r in rows:
        # Same denominator as parity_checks.cc: max |HF fp32 logit| of this prompt.
        denom = float(np.abs(r).max())
        pos = np.abs(lg.astype(np.float64) - r).max(axis=1) / denom
        rel_all.extend(pos.tolist())
        per_prompt.append(float(pos.max()))
    rel = np.array(rel_all)
    return rel, per_prompt, matches, positions


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", default="tests/fixtures")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 sanity check must be float32
    print("transformers", transformers.__version__, "torch", torch.__version__, "device",
          args.device)
    names = sorted(n for n in os.listdir(args.fixtures)
                   if os.path.isfile(os.path.join(args.fixtures, n, "expected.json")))
    status = 0
    for name in names:
        d = os.path.join(args.fixtures, name)
        with open(os.path.join(d, "expected.json")) as f:
            exp = json.load(f)
        vocab = exp["vocab_size"]
        ref = np.fromfile(os.path.join(d, "logits.bin"), dtype="<f4").reshape(-1, vocab)
        model = load_fp32_model(d, args.device)
        rel32, _, m32, n32 = measure(model, exp["prompts"], ref, vocab, args.device)
        print(f"[hf-bf16] {name} HF float32 reload vs logits.bin: max rel {rel32.max():.3e}, "
              f"greedy {m32}/{n32} (sanity: ~1e-6 and all)")
        if rel32.max() > 1e-3:
            print(f"[hf-bf16] {name}: the float32 reload does not reproduce the fixture; "
                  "the bf16 figure below is not meaningful")
            status = 1
        model = model.to(torch.bfloat16)
        rel, per_prompt, m, n = measure(model, exp["prompts"], ref, vocab, args.device)
        within = int((rel <= BF16_TOLERANCE).sum())
        print(f"[hf-bf16] {name} per prompt max rel: "
              + " ".join(f"{len(p['ids'])}:{x:.3e}" for p, x in zip(exp["prompts"], per_prompt)))
        print(f"[hf-bf16] {name} HF bf16: max rel logit error vs HF float32 {rel.max():.3e}, "
              f"rms over positions {math.sqrt(float((rel ** 2).mean())):.3e}, {within} of "
              f"{rel.size} positions within {BF16_TOLERANCE:.0e}, teacher-forced greedy {m}/{n}")
    return status


if __name__ == "__main__":
    sys.exit(main())
