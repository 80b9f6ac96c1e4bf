#!/usr/bin/env python3
"""HF transformers' own FP8 error on the FP8 parity fixture: the reference for issue 24's accuracy.

tests/fixtures/dsv3_yarn_nolora stores its attention projections, dense MLPs and shared experts
as FP8 e4m3 with 128 x 128 block scales (`*_scale_inv`, made by tools/make_fixtures.py from
random float32 weights); its logits.bin is HF float32 on the dequantised weights. This runs HF
transformers' fine-grained FP8 path on the same checkpoint: the model in bfloat16 with every
FP8-stored linear replaced by transformers' `FP8Linear` (integrations/finegrained_fp8.py:
activations quantised per token in 1 x 128 groups by its Triton `act_quant`, the Triton W8A8
block-scaled GEMM, the path `from_pretrained` takes for a `quant_method: fp8` checkpoint), and
prints the figures cuda_fp8_parity_test prints for ours:

  max |logit - logit_fp32| / max |logit_fp32| per prompt and over all positions, its rms, the
  positions within 2e-2 (kBf16Tolerance), and the teacher-forced greedy agreement with
  expected.json's greedy_24.

It also prints HF bf16 on the dequantised weights (no FP8 GEMM) in the same run, so the FP8
GEMM's own share of the error shows. Runs on the GPU machine (torch + transformers + triton):

  python3 tools/parity/hf_fp8_error.py --fixtures tests/fixtures [--fixture dsv3_yarn_nolora]
"""
import argparse
import inspect
import json
import math
import os
import sys

import numpy as np
import torch
import transformers
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_bf16_error import BF16_TOLERANCE, load_fp32_model, measure  # noqa: E402


def raw_fp8_tensors(d):
    """The checkpoint's FP8 matrices and their scale_inv tables, as stored."""
    raw = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            raw.update(load_file(os.path.join(d, f)))
    return {k: (v, raw[k + "_scale_inv"]) for k, v in raw.items()
            if k + "_scale_inv" in raw and v.dtype == torch.float8_e4m3fn}


def make_fp8_linear(fp8_linear_cls, weight, scale_inv, block, device):
    out_features, in_features = weight.shape
    params = inspect.signature(fp8_linear_cls.__init__).parameters
    kwargs = {"bias": False}
    if "block_size" in params:
        kwargs["block_size"] = tuple(block)
    if "device" in params:
        kwargs["device"] = device
    if "has_bias" in params:
        kwargs.pop("bias")
        kwargs["has_bias"] = False
    layer = fp8_linear_cls(in_features, out_features, **kwargs)
    layer.weight = torch.nn.Parameter(weight.to(device).contiguous(), requires_grad=False)
    layer.weight_scale_inv = torch.nn.Parameter(scale_inv.to(device).float().contiguous(),
                                                requires_grad=False)
    if getattr(layer, "block_size", None) is None:
        layer.block_size = tuple(block)
    return layer.to(device)


def swap_in_fp8(model, fp8, block, device):
    """Replaces each nn.Linear whose checkpoint weight is FP8 by transformers' FP8Linear.

    HF's act_quant needs the input width to be a multiple of the 128-wide group: a matrix with
    fewer input features (the fixture's kv_b_proj reads the 64-wide latent) stays bf16 on its
    dequantised weights, and is listed."""
    from transformers.integrations.finegrained_fp8 import FP8Linear
    swapped, kept = 0, []
    for name, module in list(model.named_modules()):
        key = name + ".weight"
        if key not in fp8 or not isinstance(module, torch.nn.Linear):
            continue
        if module.in_features % block[1] != 0:
            kept.append(name)
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        w, s = fp8[key]
        setattr(parent, child, make_fp8_linear(FP8Linear, w, s, block, device))
        swapped += 1
    return swapped, kept


def report(tag, name, prompts, rel, per_prompt, m, n):
    within = int((rel <= BF16_TOLERANCE).sum())
    print(f"[hf-fp8] {name} {tag} per prompt max rel: "
          + " ".join(f"{len(p['ids'])}:{x:.3e}" for p, x in zip(prompts, per_prompt)))
    print(f"[hf-fp8] {name} {tag}: max rel logit error vs HF float32 {rel.max():.3e}, "
          f"median {float(np.median(rel)):.3e}, rms {math.sqrt(float((rel ** 2).mean())):.3e}, "
          f"{within} of {rel.size} positions within {BF16_TOLERANCE:.0e}, "
          f"teacher-forced greedy {m}/{n}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", default="tests/fixtures")
    ap.add_argument("--fixture", default="dsv3_yarn_nolora")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    print("transformers", transformers.__version__, "torch", torch.__version__, "device",
          args.device)
    d = os.path.join(args.fixtures, args.fixture)
    with open(os.path.join(d, "expected.json")) as f:
        exp = json.load(f)
    with open(os.path.join(d, "config.json")) as f:
        block = json.load(f)["quantization_config"]["weight_block_size"]
    vocab = exp["vocab_size"]
    ref = np.fromfile(os.path.join(d, "logits.bin"), dtype="<f4").reshape(-1, vocab)
    model = load_fp32_model(d, args.device)
    rel32, _, m32, n32 = measure(model, exp["prompts"], ref, vocab, args.device)
    print(f"[hf-fp8] {args.fixture} HF float32 reload vs logits.bin: max rel {rel32.max():.3e}, "
          f"greedy {m32}/{n32} (sanity: ~1e-6 and all)")
    if rel32.max() > 1e-3:
        print("[hf-fp8] the float32 reload does not reproduce the fixture; stopping")
        return 1
    model = model.to(torch.bfloat16)
    report("HF bf16 (dequantised weights)", args.fixture, exp["prompts"],
           *measure(model, exp["prompts"], ref, vocab, args.device))
    fp8 = raw_fp8_tensors(d)
    swapped, kept = swap_in_fp8(model, fp8, block, args.device)
    print(f"[hf-fp8] {args.fixture}: {swapped} of {len(fp8)} FP8 matrices run as "
          f"transformers' FP8Linear; bf16 (input width not a multiple of {block[1]}): "
          + (", ".join(kept) if kept else "none"))
    if swapped + len(kept) != len(fp8):
        print("[hf-fp8] not every FP8 matrix maps to an nn.Linear; stopping")
        return 1
    report("HF FP8 (FP8Linear, W8A8 Triton)", args.fixture, exp["prompts"],
           *measure(model, exp["prompts"], ref, vocab, args.device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
