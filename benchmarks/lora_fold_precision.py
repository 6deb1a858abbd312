"""What folding a small LoRA update into the base weights keeps, float32 vs bfloat16 base.

The built-in engine once merged LoRA into the weights for every rollout where that cost
fewer FLOPs, whatever the base's dtype (``W' = W + s B A``, cast to ``W``'s dtype). On a
bfloat16 base the cast rounds away every delta below half a unit in the last place of its
weight; it now merges only into float32 or wider (``race.engines.kernels.fast_decode.
fold_keeps_update``, docs/design.md). This script measures what the fold did, on
SmolLM2-135M-Instruct (``race base import smollm2``) or any local model directory:

- LoRA r=8, alpha=16 on every linear layer, B set to +-beta (Adam's first step moves each
  entry by about lr: beta 1e-4 is one step at lr 1e-4; 1e-3 and 1e-2 are ten and a
  hundred steps of one sign), A as PEFT initialises it;
- weights: of layer 0's ``gate_proj``, the share the fold changed and the share of the
  update it kept (the weight change projected on ``s B A``);
- logits, over every position of four chat-templated arithmetic prompts: the fold (the
  adapter added into a copy of the base weights in their dtype, adapter off) against the
  live adapter (the learning passes' forward, ``fast_forward.sequence_logits``), as a
  difference relative to the position's largest fp32 logit and as KL(live || fold); HF's
  own forward against the live one is the scale of two bf16 op orders.

Usage: ``OMP_NUM_THREADS=1 python benchmarks/lora_fold_precision.py [--model DIR]
[--betas 1e-4,1e-3,1e-2]`` (about 20 s on one CPU thread for SmolLM2).
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _folded(model: Any) -> Any:
    """A copy of ``model`` with every adapter added into its base weight, in the weight's
    dtype (what a merge into that dtype gives); use it with the adapter disabled."""
    import torch

    folded = copy.deepcopy(model)
    with torch.no_grad():
        for mod in folded.modules():
            if hasattr(mod, "lora_A") and hasattr(mod, "base_layer") and "default" in mod.lora_A:
                w = mod.base_layer.weight
                delta = (mod.lora_B["default"].weight * mod.scaling["default"]) @ mod.lora_A["default"].weight
                w.copy_((w + delta).to(w.dtype))
    return folded


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="model directory (default: the imported SmolLM2-135M-Instruct)")
    ap.add_argument("--betas", default="1e-4,1e-3,1e-2")
    args = ap.parse_args(argv)

    import torch
    import torch.nn.functional as F

    from race.engines.kernels.fast_forward import sequence_logits
    from race.engines.sampling import encode_prompts, positions
    from race.models.imported import imported_path
    from race.models.loading import load_policy
    from race.models.lora import wrap_lora
    from race.spec.run import LoraSettings
    from race.tasks.prompts import PromptFormat

    torch.set_num_threads(1)
    model_dir = args.model or imported_path("smollm2-135m")
    rows = [json.loads(x) for x in (ROOT / "configs/data/arith-qa/test.jsonl").read_text().splitlines()[:4]]
    models = {}
    for dt in ("float32", "bfloat16"):
        torch.manual_seed(0)  # PEFT draws lora_A from the global RNG: the same A in both
        m, tok = load_policy(model_dir, device="cpu", dtype=dt)
        models[dt] = wrap_lora(m, LoraSettings(r=8, lora_alpha=16)).eval()
    fmt = PromptFormat("{question} Give only the final number.", chat=True, tokenizer=tok)
    ids, mask = encode_prompts(tok, [fmt.render(r["question"]) + " The answer is" for r in rows], "cpu")
    pos, keep = positions(mask), mask.bool()

    def logits(m: Any) -> torch.Tensor:
        return sequence_logits(m, ids, mask, pos, 0, ids.shape[1]).float()[keep]

    def kl(p: torch.Tensor, q: torch.Tensor) -> float:
        return float(F.kl_div(q.log_softmax(-1), p.log_softmax(-1), log_target=True, reduction="none").sum(-1).mean())

    print(f"{model_dir}: {int(keep.sum())} positions")
    for beta in [float(b) for b in args.betas.split(",")]:
        res = {}
        for dt, model in models.items():
            g = torch.Generator().manual_seed(1)
            with torch.no_grad():
                for name, p in model.named_parameters():
                    if "lora_B" in name:
                        p.copy_(beta * (torch.randint(0, 2, p.shape, generator=g).float() * 2 - 1))
                gp = model.get_base_model().model.layers[0].mlp.gate_proj
                w = gp.base_layer.weight
                delta = (gp.lora_B["default"].weight * gp.scaling["default"]) @ gp.lora_A["default"].weight
                dw = (w + delta).to(w.dtype).float() - w.float()
                folded = _folded(model)
                with folded.disable_adapter():
                    fold = logits(folded)
                hf = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()[keep]
                res[dt] = dict(changed=float((dw != 0).float().mean()),
                               kept=float((dw * delta).sum() / (delta ** 2).sum()),
                               live=logits(model), fold=fold, hf=hf)
        scale = res["float32"]["live"].abs().amax(-1, keepdim=True)

        def rel(a: torch.Tensor, b: torch.Tensor) -> str:
            e = (a - b).abs() / scale
            return f"max {float(e.max()):.2e} mean {float(e.mean()):.2e}"

        print(f"B = +-{beta:g}")
        for dt, r in res.items():
            print(f"  {dt:8s} layer 0 gate_proj: fold changed {r['changed']:.1%} of the weights, kept "
                  f"{r['kept']:.1%} of the update | logits, fold vs live: {rel(r['fold'], r['live'])}, "
                  f"KL {kl(r['live'], r['fold']):.1e} | HF vs live: {rel(r['hf'], r['live'])}, "
                  f"KL {kl(r['live'], r['hf']):.1e}")


if __name__ == "__main__":
    main()
