"""Where a built-in GRPO step's time goes, phase by phase, against a one-thread matmul peak.

    .venv/bin/python benchmarks/engine_profile.py [--sizes tiny-s,tiny-m] [--groups 8]
                                                 [--lengths 32,64] [--repeats 3] [--threads 1]

Per configuration (random tiny model, LoRA r=8 on all linear layers, ``prompts x G``
completions run to full length), each phase is timed on its own, medians of ``--repeats``:

- ``prefill``: the shared-prefix prompt forward; ``decode/token``: seconds per decode step
  (one token for every row), the loop's sampling included;
- ``decode, LoRA live``: the same decode with the adapter run unmerged (three matmuls per
  projection instead of one: what the LoRA merge saves); ``decode share of step``: the
  decode loop's part of prefill + decode + update;
- ``logprob fwd``: one no-grad forward over prompt+completion (an old-logprob or reference
  pass); ``update fwd`` / ``backward`` / ``optimizer``: the update's parts;
- ``python/token``: decode time per step minus what its FLOPs would take at the peak (an
  upper bound of the per-token overhead that is not matmul work).

FLOP/s per phase are model FLOPs under the ``torch`` conventions (what executes) over
seconds, and ``% peak`` compares them with a torch matmul of the model's MLP shape
(``--peak-rows`` rows) timed on the same threads. On a shared machine run it idle, or read
the shares, not the absolute seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def matmul_peak(m: int, k: int, n: int, repeats: int = 20) -> float:
    """Best FLOP/s of an (m x k) @ (k x n) float32 matmul on the current torch threads."""
    import torch

    a, b = torch.randn(m, k), torch.randn(k, n)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(10):
            a @ b
        best = min(best, (time.perf_counter() - t0) / 10)
    return 2 * m * k * n / best


def _median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def profile(size: str, root: Path, prompts: int, group: int, length: int, repeats: int) -> dict[str, float]:
    import torch

    from race.accounting import LoRA, ModelShape, generate_components, learning_components
    from race.engines.grpo_math import completion_logprobs, grpo_loss
    from race.engines.sampling import sample
    from race.models import build_char_tokenizer, build_tiny_model, wrap_lora
    from race.spec.run import LoraSettings
    from race.tasks import ArithTask

    tok = build_char_tokenizer()
    model = wrap_lora(build_tiny_model(size, seed=0, attn_implementation="sdpa"), LoraSettings(r=8, lora_alpha=8))
    shape = ModelShape.from_hf_config(model.get_base_model().config.to_dict())
    lora = LoRA(8)
    probs = ArithTask().problems("train", prompts, seed=1)
    enc = tok([p.prompt for p in probs], return_tensors="pt", padding=True, add_special_tokens=False)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    P = ids.shape[1]
    kw = dict(group=group, max_new_tokens=length, eos_id=-1, pad_id=tok.pad_token_id)  # no EOS: full length
    model.eval()

    def roll(n_new: int = length, merge: bool | None = None):
        return sample(model, ids, mask, **{**kw, "max_new_tokens": n_new}, merge_lora=merge,
                      generator=torch.Generator().manual_seed(0))

    ro = roll()
    out: dict[str, float] = {}
    t_full = _median_time(roll, repeats)
    t_one = _median_time(lambda: roll(1), repeats)  # prefill + one sampled token
    out["prefill_s"] = t_one
    out["decode_token_s"] = (t_full - t_one) / max(1, length - 1)
    t_live = _median_time(lambda: roll(merge=False), repeats) - _median_time(lambda: roll(1, merge=False), repeats)
    out["decode_token_live_s"] = t_live / max(1, length - 1)
    gen = generate_components(shape, [P] * prompts, [length] * (prompts * group), lora=None if ro.merged else lora,
                              share_prompt=True, conventions="torch")
    out["prefill_flops"], out["decode_flops_token"] = gen["prefill"], gen["decode"] / max(1, length - 1)
    B = prompts * group
    learn = learning_components(shape, [P + length] * B, [length] * B, lora=lora, conventions="torch")
    out["fwd_flops"], out["bwd_flops"] = learn["update/forward"], learn["update/backward"]

    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5)
    adv = torch.randn(B)

    def lp():
        return completion_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)

    with torch.no_grad():
        out["logprob_fwd_s"] = _median_time(lp, repeats)
    fwd, bwd, step = [], [], []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        logp = lp()
        loss, _ = grpo_loss(logp, logp.detach(), adv, ro.completion_mask, epsilon=0.2, epsilon_high=None,
                            loss_type="dapo", max_completion_length=length)
        t1 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        fwd.append(t1 - t0)
        bwd.append(t2 - t1)
        step.append(t3 - t2)
    out["update_fwd_s"], out["backward_s"], out["optimizer_s"] = (statistics.median(x[1:]) for x in (fwd, bwd, step))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="tiny-s,tiny-m")
    ap.add_argument("--groups", default="8")
    ap.add_argument("--lengths", default="32,64")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--peak-rows", type=int, default=2048)
    a = ap.parse_args()
    import torch

    from race.models.family import TINY_FAMILY

    torch.set_num_threads(a.threads)
    print(f"$ {' '.join([Path(sys.executable).name] + sys.argv)}")
    print(f"torch {torch.__version__}, {a.threads} thread(s), {a.prompts} prompts/step, medians of {a.repeats}\n")
    peaks = {}
    for size in a.sizes.split(","):
        h, f = TINY_FAMILY[size]["hidden_size"], TINY_FAMILY[size]["intermediate_size"]
        peaks[size] = matmul_peak(a.peak_rows, h, f)
        print(f"one-thread matmul peak, {size} MLP shape ({a.peak_rows}x{h})@({h}x{f}): "
              f"{peaks[size] / 1e9:.1f} GFLOP/s")
    print("\n| model | G | L | prefill ms | decode ms/token | decode ms/token, LoRA live | decode share of step | "
          "python+sampling ms/token | decode % peak | logprob fwd ms (% peak) | update fwd ms (% peak) | "
          "backward ms (% peak) | optimizer ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as td:
        for size in a.sizes.split(","):
            pk = peaks[size]
            for g in (int(x) for x in a.groups.split(",")):
                for L in (int(x) for x in a.lengths.split(",")):
                    r = profile(size, Path(td), a.prompts, g, L, a.repeats)
                    dt = r["decode_token_s"]
                    step = r["prefill_s"] + dt * (L - 1) + r["update_fwd_s"] + r["backward_s"] + r["optimizer_s"]
                    overhead = dt - r["decode_flops_token"] / pk

                    def pct(flops: float, s: float) -> str:
                        return f"{100 * flops / s / pk:.1f}%"

                    print(f"| {size} | {g} | {L} | {1e3 * r['prefill_s']:.1f} | {1e3 * dt:.2f} | "
                          f"{1e3 * r['decode_token_live_s']:.2f} | {100 * dt * (L - 1) / step:.0f}% | "
                          f"{1e3 * overhead:.2f} | {pct(r['decode_flops_token'], dt)} | "
                          f"{1e3 * r['logprob_fwd_s']:.1f} ({pct(r['fwd_flops'], r['logprob_fwd_s'])}) | "
                          f"{1e3 * r['update_fwd_s']:.1f} ({pct(r['fwd_flops'], r['update_fwd_s'])}) | "
                          f"{1e3 * r['backward_s']:.1f} ({pct(r['bwd_flops'], r['backward_s'])}) | "
                          f"{1e3 * r['optimizer_s']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
