"""How far is each FLOP convention from what actually executes?

Measures FLOPs with ``torch.utils.flop_counter.FlopCounterMode`` (eager attention; the CPU
blind spots filled by ``race.measure``) on random Qwen2 models and prints, side by side, the
relative error (analytic - measured) / measured of:

- RACE, ``conventions="torch"`` (full-square attention, as the counter counts): exact;
- RACE default (``"race"``: causal attention pairs) -- what the causal mask leaves to compute,
  so it sits *below* the counter, which multiplies the masked half too;
- 6ND (2ND for forward-only passes), verl's FlopsCounter (current and before its January
  2026 attention fix), PaLM appendix B, Megatron-LM;

for the phases of a GRPO step: rollout (HF-style KV-cache generation), log-prob (a forward
over prompt+completion with logits at the completion positions) and update (forward +
backward, LoRA r=16 on all matrices and full fine-tuning).

Workload at sequence length S: one sequence of S/2 prompt + S/2 completion tokens; update and
log-prob passes keep logits at the S/2 completion positions (``logits_to_keep``); rollout
prefills the S/2 prompt and generates T = min(S/2, 64) tokens (16 on meta models): every
counted decode step costs ~0.3 ms per dispatched op under FlopCounterMode, and meta kernels
are slower still. The P+T column says what ran.

Models: "tiny" and "small" random Qwen2 models run on CPU with real weights; Qwen2.5 presets
run at real width on the meta device (shapes only, no memory) at 1 and 2 layers and are scaled
per layer to full depth, m(L) = m(1) + (L-1) (m(2) - m(1)), which tests/measure prove exact.

Run:  .venv/bin/python benchmarks/accounting_error.py            (about 1-2 minutes on 2 cores)
      .venv/bin/python benchmarks/accounting_error.py --quick    (S = 64 and 512 only)
"""

from __future__ import annotations

import argparse
import copy
import shlex
import sys
import time
import warnings

import torch

from race.accounting import LAYER_MATRICES, LoRA, ModelShape, forward_flops, generate_flops, train_flops
from race.measure import build_model, measure_forward, measure_generate, measure_train_step

CONVENTIONS = [("RACE (torch)", "torch"), ("RACE (causal)", "race"), ("6ND / 2ND", "6nd"), ("verl", "verl"),
               ("verl-legacy", "verl-legacy"), ("PaLM", "palm"), ("Megatron", "megatron")]
PHASES = ["rollout", "log-prob", "update (LoRA r=16)", "update (full)"]
RANK = 16

CPU_MODELS = {
    "tiny (0.2M)": ModelShape("tiny", num_layers=4, hidden=64, num_heads=4, num_kv_heads=2, head_dim=16,
                              intermediate=192, vocab=64, tie_embeddings=True),
    "small (6.6M)": ModelShape("small", num_layers=6, hidden=256, num_heads=8, num_kv_heads=2, head_dim=32,
                               intermediate=768, vocab=4096),
}


def _analytic(shape: ModelShape, phase: str, S: int, P: int, T: int, conv: str) -> int:
    keep = S // 2
    if phase == "rollout":
        return generate_flops(shape, [P], [T], conventions=conv)
    if phase == "log-prob":
        return forward_flops(shape, [S], logits=keep, conventions=conv)
    lora = LoRA(RANK, LAYER_MATRICES) if "LoRA" in phase else None
    return train_flops(shape, [S], lora=lora, logits=keep, conventions=conv)


def _lora(model):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=RANK, lora_alpha=RANK, target_modules=list(LAYER_MATRICES)))


def _measure_model(base, device: str, S: int, P: int, T: int) -> dict[str, int]:
    """Measured FLOPs of each phase on one model (left unchanged: training runs on copies)."""
    vocab = base.config.vocab_size
    if device == "cpu":
        ids = torch.randint(0, vocab, (1, S), generator=torch.Generator().manual_seed(S))
        fresh = lambda: copy.deepcopy(base)  # noqa: E731
    else:
        ids = torch.zeros(1, S, dtype=torch.long, device="meta")
        fresh = lambda: build_model(_shape_of(base), num_layers=base.config.num_hidden_layers)  # noqa: E731
    keep = S // 2
    out = {"log-prob": measure_forward(base, ids, logits_to_keep=keep)}
    out["update (full)"] = measure_train_step(fresh(), ids, logits_to_keep=keep).total
    out["update (LoRA r=16)"] = measure_train_step(_lora(fresh()), ids, logits_to_keep=keep).total
    g = measure_generate(base, ids[:, :P], T, use_generate=device == "cpu")
    assert g.new_tokens == T
    out["rollout"] = g.total
    return out


def _shape_of(model) -> ModelShape:
    return ModelShape.from_hf_config(model.config.to_dict())


def measure(shape: ModelShape, device: str, lengths: list[int], max_new: int) -> dict[int, tuple[int, dict]]:
    """{S: (T, {phase: measured FLOPs})}; meta models are measured at 1 and 2 layers and
    scaled per layer to full depth."""
    out: dict[int, tuple[int, dict]] = {}
    if device == "cpu":
        base = build_model(shape, device="cpu", seed=0)
        for S in lengths:
            T = min(S // 2, max_new)
            out[S] = (T, _measure_model(base, device, S, S // 2, T))
        return out
    m1, m2 = build_model(shape, num_layers=1), build_model(shape, num_layers=2)
    L = shape.num_layers
    for S in lengths:
        T = min(S // 2, max_new)
        a, b = _measure_model(m1, device, S, S // 2, T), _measure_model(m2, device, S, S // 2, T)
        out[S] = (T, {k: a[k] + (L - 1) * (b[k] - a[k]) for k in a})
    return out


def _fmt_err(a: int, m: int) -> str:
    e = (a - m) / m * 100
    if e == 0:
        return "0 (exact)"
    return f"{e:+.1f}%" if abs(e) >= 0.1 else f"{e:+.2f}%"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[64, 512, 2048], help="sequence lengths S")
    ap.add_argument("--presets", nargs="*", default=["qwen2.5-0.5b"], help="Qwen2.5 presets measured on meta")
    ap.add_argument("--max-new-tokens", type=int, default=64,
                    help="rollout tokens generated on CPU models (T = min(S/2, this))")
    ap.add_argument("--meta-new-tokens", type=int, default=16, help="the same for meta models (slow per step)")
    ap.add_argument("--quick", action="store_true", help="S = 64 and 512 only")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest for these small ops)")
    args = ap.parse_args(argv)
    lengths = [s for s in args.lengths if s <= 512] if args.quick else args.lengths
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    print("$ " + shlex.join([sys.executable.rsplit("/", 1)[-1], *sys.argv]))
    print()
    models = [(name, shape, "cpu") for name, shape in CPU_MODELS.items()]
    for p in args.presets:
        models.append((f"{p} (meta, scaled)", ModelShape.from_preset(p), "meta"))

    t0 = time.perf_counter()
    rows = []
    for label, shape, device in models:
        res = measure(shape, device, lengths, args.max_new_tokens if device == "cpu" else args.meta_new_tokens)
        for S, (T, measured) in res.items():
            P = S // 2
            for phase in PHASES:
                m = measured[phase]
                errs = [_fmt_err(_analytic(shape, phase, S, P, T, conv), m) for _, conv in CONVENTIONS]
                pt = f"{P}+{T}" if phase == "rollout" else f"{P}+{S - P}"
                rows.append([label, phase, str(S), pt, f"{m:.3e}", *errs])
    elapsed = time.perf_counter() - t0

    head = ["model", "phase", "S", "P+T", "measured FLOPs", *[c for c, _ in CONVENTIONS]]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join(["---"] * 4 + ["---:"] * (len(head) - 4)) + "|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print()
    print("Relative error = (analytic - measured) / measured. Measured: torch.utils.flop_counter.FlopCounterMode "
          "(full-square attention, matmuls only), eager attention, head at the S/2 completion positions in "
          "log-prob/update, lm_head at the last prompt position and each decode step in rollout. "
          f"torch {torch.__version__}; {elapsed:.0f} s.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
