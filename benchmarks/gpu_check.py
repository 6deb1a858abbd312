"""GPU proof of RACE's TRL drop-in: one command, one pass/fail JSON.

    bash benchmarks/gpu_setup.sh && python benchmarks/gpu_check.py --out $OUT/gpu.json
    python benchmarks/gpu_check.py --reduced --out /tmp/gpu.json      (CPU, tiny shapes, < 1 min)

On a CUDA machine it builds a randomly initialised Qwen2.5-0.5B-shaped policy (the shapes of
``race.accounting``'s ``qwen2.5-0.5b`` preset, i.e. ``/work/shared/reference/qwen2.5-shapes.json``;
nothing is downloaded), in bf16 with eager attention, and runs real ``trl.GRPOTrainer`` steps
with ``add_race_accounting`` attached. Without CUDA (or with ``--reduced``) the same code runs
on the ``tiny-xs`` shape in fp32 on the CPU. Checks, in order (``gpu_check_trl.py`` and
``gpu_check_perf.py``):

- the ledger under ``conventions="torch"`` equals what ``FlopCounterMode`` counts
  (``race.measure.Counter``) around TRL's own stages, per step and phase group, within 0.1%:
  LoRA with beta 0 (``mask_truncated_completions`` on, then off) and full fine-tuning with
  beta 0.04 (a reference model, old log-probs); on CUDA with Triton TRL's compact fused head
  (logits at completion tokens only) is the path that runs;
- gradient-checkpointing recompute, non-reentrant and reentrant, equals the measured
  recompute (FLOPs run with grad enabled inside backward);
- a reward model (``*ForSequenceClassification``) in ``reward_funcs``: its charge equals what
  TRL's reward computation executes;
- the built-in engine: one step at the same shapes, measured vs its analytic ledger;
- the per-call overhead: median step seconds and completion tokens/s with and without RACE
  (the step timed between synchronizes), and ``torch.cuda.synchronize`` calls per step;
- phase seconds summed vs the step's wall time; per-phase MFU (and HFU, recompute included)
  below 1 against the device's peak;
- attach-then-move: the policy on the CPU when ``add_race_accounting`` runs, moved to CUDA
  before training (what DeepSpeed/FSDP do): the same synchronizes per step and sane seconds;
- ``torch_compile=True``: the ledger equals the eager run's, key for key;
- what one process on one GPU cannot show (vLLM, DeepSpeed, FSDP, NCCL with 2 GPUs,
  continuous batching) is printed as ``NOT TESTED: <why>``.

A check that raises is recorded as FAILED with its error and the next one starts. No check
starts once ``--max-seconds`` (default 420) would be exceeded by its estimate: the rest are
``NOT RUN``. The exit code is 0 when nothing FAILED and nothing was cut (``summary.ok``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
for _p in (str(HERE), str(ROOT / "src")):  # this tree's race, and the sibling check modules
    if _p not in sys.path:
        sys.path.insert(0, _p)
for _k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_k, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from gpu_check_base import Ctx, NotTested, Sizes, TOLERANCE  # noqa: E402  (stdlib only)

#: what the checks import (module name -> pip package)
NEEDED = {"torch": "torch", "transformers": "transformers", "trl": "trl", "peft": "peft", "accelerate": "accelerate",
          "datasets": "datasets", "safetensors": "safetensors", "tokenizers": "tokenizers", "pydantic": "pydantic",
          "yaml": "pyyaml", "typer": "typer", "rich": "rich"}

Check = tuple[str, Callable[[Ctx], dict], float, float]  # name, function, estimated seconds (full, reduced)


def missing_imports() -> list[str]:
    return [pkg for mod, pkg in NEEDED.items() if importlib.util.find_spec(mod) is None]


def environment() -> dict[str, Any]:
    """Versions from package metadata (importing vLLM or DeepSpeed would cost seconds) and
    the GPU."""
    import importlib.metadata as md

    env: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "vllm", "deepspeed", "triton"):
        try:
            env[dist] = md.version(dist)
        except md.PackageNotFoundError:
            env[dist] = None
    try:
        import torch

        env["cuda"] = torch.cuda.is_available()
        if env["cuda"]:
            env["gpu"] = torch.cuda.get_device_name(0)
            env["gpus"] = torch.cuda.device_count()
            env["cuda_version"] = torch.version.cuda
    except Exception as e:
        env["cuda"] = f"error: {e}"
    return env


def run_checks(ctx: Ctx, checks: list[Check], max_seconds: float, t0: float,
               on_result: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """Run each check in order, isolating failures, under the global time guard;
    ``on_result(results so far)`` after each (the JSON is rewritten, so a killed run
    leaves what it finished)."""
    results: list[dict[str, Any]] = []
    only = set(ctx.args.only.split(",")) if ctx.args.only else None
    for i, (name, fn, est_full, est_reduced) in enumerate(checks, 1):
        if only is not None and name not in only:
            continue
        elapsed = time.perf_counter() - t0
        est = est_reduced if ctx.reduced else est_full
        row: dict[str, Any] = {"name": name}
        if elapsed + est > max_seconds:
            row.update(status="not_run", reason=f"time guard: {elapsed:.0f} s elapsed + ~{est:.0f} s estimated > "
                                                f"--max-seconds {max_seconds:.0f}")
            print(f"[{i}/{len(checks)}] NOT RUN: {name}: {row['reason']}", flush=True)
            results.append(row)
            if on_result:
                on_result(results)
            continue
        print(f"[{i}/{len(checks)}] {name} ... (t={elapsed:.0f} s)", flush=True)
        start = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                detail = fn(ctx)
            ok = bool(detail.pop("ok"))
            row.update(status="passed" if ok else "failed", detail=detail)
            if not ok:
                row["error"] = detail.get("why", "a compared value is outside its tolerance (see detail)")
        except NotTested as e:
            row.update(status="not_tested", reason=str(e))
        except Exception as e:  # recorded, and the next check runs
            row.update(status="failed", error=f"{type(e).__name__}: {e}",
                       traceback=traceback.format_exc(limit=8)[-3000:])
        row["seconds"] = round(time.perf_counter() - start, 2)
        word = {"passed": "PASSED", "failed": "FAILED", "not_tested": "NOT TESTED"}[row["status"]]
        note = row.get("reason") or row.get("error") or _headline(row.get("detail", {}))
        print(f"    {word}: {name} ({row['seconds']:.1f} s){': ' + note if note else ''}", flush=True)
        results.append(row)
        _free(ctx)
        if on_result:
            on_result(results)
    return results


def _headline(detail: dict) -> str:
    return str(detail.get("headline", ""))


def _free(ctx: Ctx) -> None:
    import gc

    gc.collect()
    if ctx.cuda:
        import torch

        torch.cuda.empty_cache()


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    counts = {s: sum(r["status"] == s for r in results) for s in ("passed", "failed", "not_tested", "not_run")}
    return {**counts, "ok": counts["failed"] == 0 and counts["not_run"] == 0}


def print_table(results: list[dict[str, Any]]) -> None:
    w = max([len(r["name"]) for r in results] + [5])
    print(f"\n{'check':<{w}}  {'status':<10}  {'s':>6}  note")
    print("-" * (w + 60))
    for r in results:
        note = r.get("reason") or r.get("error") or _headline(r.get("detail", {}))
        sec = f"{r['seconds']:.1f}" if "seconds" in r else "-"
        print(f"{r['name']:<{w}}  {r['status'].upper():<10}  {sec:>6}  {str(note)[:110]}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, help="write the pass/fail JSON here")
    p.add_argument("--reduced", action="store_true", help="tiny shapes in fp32 (automatic without CUDA)")
    p.add_argument("--full", action="store_true", help="full (0.5B) shapes even without CUDA (slow on a CPU)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--dtype", choices=("auto", "bfloat16", "float32"), default="auto",
                   help="auto: bfloat16 for the full run on CUDA, float32 otherwise")
    p.add_argument("--max-seconds", type=float, default=420.0,
                   help="start no check that would end past this many seconds (default 420)")
    p.add_argument("--max-overhead", type=float, default=1.25,
                   help="full run: largest allowed median step-time ratio with/without RACE (default 1.25)")
    p.add_argument("--layers", type=int, help="decoder layers of the policy (default: the shape's own)")
    p.add_argument("--compile", action="store_true", help="run the torch_compile check on the CPU too (slow)")
    p.add_argument("--only", help="comma-separated check names to run")
    p.add_argument("--list", action="store_true", help="list the checks and exit")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    missing = missing_imports()
    if missing:
        msg = (f"missing imports: {', '.join(missing)}. Install them without replacing torch: "
               "bash benchmarks/gpu_setup.sh")
        print(f"gpu_check: {msg}", file=sys.stderr, flush=True)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({"summary": {"ok": False, "error": msg}, "missing_imports": missing},
                                           indent=2))
        return 2
    import torch

    from gpu_check_perf import PERF_CHECKS
    from gpu_check_trl import TRL_CHECKS

    checks: list[Check] = [*TRL_CHECKS, *PERF_CHECKS]
    if args.list:
        for name, _, ef, er in checks:
            print(f"{name:<32} ~{ef:.0f} s full, ~{er:.0f} s reduced")
        return 0
    cuda = torch.cuda.is_available() and args.device != "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: --device cuda but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    if args.reduced and args.full:
        print("gpu_check: --reduced and --full exclude each other", file=sys.stderr)
        return 2
    reduced = args.reduced or not (cuda or args.full)
    device = "cuda" if cuda else "cpu"
    dtype = args.dtype if args.dtype != "auto" else "bfloat16" if cuda and not reduced else "float32"
    if not cuda:
        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    env = environment()
    print(f"gpu_check: {'reduced' if reduced else 'full'} run on {device} ({env.get('gpu', platform.processor())}), "
          f"{dtype}; torch {env['torch']}, transformers {env['transformers']}, trl {env['trl']}, peft {env['peft']}",
          flush=True)
    sizes = Sizes.of(reduced)
    if args.layers:
        sizes.layers = args.layers

    def report(results: list[dict[str, Any]], done: bool = False) -> dict[str, Any]:
        out = {"summary": summary(results), "finished": done, "mode": "reduced" if reduced else "full",
               "device": device, "dtype": dtype, "sizes": sizes.__dict__, "tolerance": TOLERANCE,
               "seconds": round(time.perf_counter() - t0, 1), "environment": env, "checks": results}
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(out, indent=2, default=str))
        return out

    with tempfile.TemporaryDirectory(prefix="race-gpu-check-") as tmp:
        ctx = Ctx(reduced=reduced, device=device, dtype=dtype, sizes=sizes, work=Path(tmp), args=args)
        results = run_checks(ctx, checks, args.max_seconds, t0, on_result=report)
    out = report(results, done=True)
    print_table(results)
    s = out["summary"]
    print(f"\n{s['passed']} passed, {s['failed']} failed, {s['not_tested']} not tested, {s['not_run']} not run "
          f"in {out['seconds']:.0f} s", flush=True)
    if args.out:
        print(f"wrote {args.out}")
    return 0 if s["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
