"""gpu_check.py's timing checks: RACE's per-call overhead, phase seconds against the step's
wall time, per-phase MFU, attach-then-move, ``torch_compile``; and the settings one process
on one GPU cannot show (``NOT TESTED`` with the reason).

Timing: a probe callback placed FIRST starts each step's clock and one placed LAST stops
it, both after a ``torch.cuda.synchronize`` (on CUDA), so the probe's interval encloses
RACE's own. ``torch.cuda.synchronize`` is wrapped to count the calls made inside each step
(the probe's own are not counted). Every timed run fixes the completion length
(``min_new_tokens``) so each step runs the same work with and without RACE.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from gpu_check_base import Ctx, NotTested, mfu, peak_flops
from gpu_check_trl import dataset, grpo_args, lora_config, quiet, reward

class Probe:
    """Per-step wall seconds (enclosing RACE's callback) and ``torch.cuda.synchronize``
    calls per step."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.count = 0
        self.walls: list[float] = []
        self.syncs: list[int] = []
        self._t = 0.0
        self._n = 0

    def install(self, trainer: Any) -> None:
        import torch
        from transformers import TrainerCallback

        self.orig = torch.cuda.synchronize
        probe = self

        def counting(*a: Any, **k: Any) -> Any:
            probe.count += 1
            return probe.orig(*a, **k)

        torch.cuda.synchronize = counting

        class Begin(TrainerCallback):
            def on_step_begin(self, *a: Any, **k: Any) -> None:
                probe._n = probe.count
                probe._t = probe.now()

        class End(TrainerCallback):
            def on_step_end(self, *a: Any, **k: Any) -> None:
                probe.walls.append(probe.now() - probe._t)
                probe.syncs.append(probe.count - probe._n)

        cbs = trainer.callback_handler.callbacks
        cbs.insert(0, Begin())
        cbs.append(End())

    def now(self) -> float:
        if self.cuda:
            self.orig()
        return time.perf_counter()

    def uninstall(self) -> None:
        import torch

        torch.cuda.synchronize = self.orig


def timed_run(ctx: Ctx, name: str, *, race: bool, move: bool = False, steps: int | None = None,
              **grpo: Any) -> dict[str, Any]:
    """LoRA, beta 0, TRL's default checkpointing, fixed completion length; ``warm_steps``
    untimed, then the rest timed. ``move``: the policy is on the CPU when RACE attaches."""
    import torch
    from trl import GRPOTrainer

    from race.engines.trl_callback import add_race_accounting

    s = ctx.sizes
    n = steps or s.warm_steps + s.timed_steps
    torch.manual_seed(0)
    model, tok = ctx.load_policy()
    args = grpo_args(ctx, ctx.work / name / "trl", max_steps=n, beta=0.0, gradient_checkpointing=True,
                     generation_kwargs={"min_new_tokens": s.completion}, **grpo)
    trainer = quiet(GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=dataset(),
                                processing_class=tok, peft_config=lora_config()))
    cb = None
    if move:
        trainer.model.to("cpu")
        torch.cuda.empty_cache()
    if race:
        cb = add_race_accounting(trainer, output_dir=ctx.work / name / "race")
    if move:
        trainer.model.to(ctx.device)
    probe = Probe(ctx.cuda)
    probe.install(trainer)
    try:
        trainer.train()
    finally:
        probe.uninstall()
    lens = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    rows = args.per_device_train_batch_size * args.gradient_accumulation_steps
    w = s.warm_steps
    walls, syncs = probe.walls[w:], probe.syncs[w:]
    tokens = [rows * x for x in lens[w:]]
    return {"walls": walls, "syncs": syncs, "tokens": tokens, "cb": cb, "warm": w,
            "median_s": statistics.median(walls), "median_syncs": statistics.median(syncs),
            "tokens_per_s": statistics.median(t / x for t, x in zip(tokens, walls))}


def check_overhead(ctx: Ctx) -> dict[str, Any]:
    """Median step seconds and completion tokens/s without and with RACE (same config, same
    completion length), and synchronizes per step."""
    plain = timed_run(ctx, "plain", race=False)
    with_race = timed_run(ctx, "race", race=True)
    ctx.shared["timed_race"] = with_race
    ratio = with_race["median_s"] / plain["median_s"]
    limit = None if ctx.reduced else ctx.args.max_overhead
    ok = limit is None or ratio <= limit
    head = (f"median step {plain['median_s']:.3f} s -> {with_race['median_s']:.3f} s with RACE (x{ratio:.3f}"
            f"{'' if limit is None else f', limit x{limit}'}); tokens/s {plain['tokens_per_s']:.0f} -> "
            f"{with_race['tokens_per_s']:.0f}; synchronizes/step {plain['median_syncs']:.0f} -> "
            f"{with_race['median_syncs']:.0f}")
    strip = ("cb",)
    return {"ok": ok, "headline": head, "ratio": ratio, "limit": limit,
            "note": None if limit else "reduced (CPU) run: recorded, no threshold",
            "without": {k: v for k, v in plain.items() if k not in strip},
            "with": {k: v for k, v in with_race.items() if k not in strip}}


def _step_phases(cb: Any, steps: list[int]) -> tuple[dict[int, float], dict[str, dict[str, float]]]:
    """Seconds summed per step, and per phase: counted FLOPs, hardware FLOPs (recompute
    added to the update) and seconds, over ``steps``."""
    per_step: dict[int, float] = {s: 0.0 for s in steps}
    phases: dict[str, dict[str, float]] = {}
    for r in cb.ledger:
        if r.step not in per_step or r.phase == "eval":
            continue
        per_step[r.step] += r.seconds
        ph = "update" if r.phase == "recompute" else r.phase
        d = phases.setdefault(ph, {"flops": 0.0, "hardware_flops": 0.0, "seconds": 0.0})
        d["hardware_flops"] += r.flops
        d["seconds"] += r.seconds
        if r.counted:
            d["flops"] += r.flops
    return per_step, phases


def _timed_steps(run: dict[str, Any]) -> list[int]:
    return list(range(run["warm"] + 1, run["warm"] + 1 + len(run["walls"])))


def _wall_ratios(run: dict[str, Any]) -> list[float]:
    per_step, _ = _step_phases(run["cb"], _timed_steps(run))
    return [per_step[s] / w for s, w in zip(_timed_steps(run), run["walls"])]


def check_phase_seconds(ctx: Ctx) -> dict[str, Any]:
    """Per timed step: the ledger's seconds summed over phases / the probe's wall time. RACE's
    interval lies inside the probe's: the ratio is at most 1; it is close to 1 when every
    phase is timed (0.9 on CUDA, where a missing synchronize would show)."""
    run = ctx.shared.get("timed_race")
    if run is None:
        raise RuntimeError("its run (overhead) did not finish: see that check")
    ratios = _wall_ratios(run)
    low = 0.9 if ctx.cuda else 0.5
    ok = all(low <= r <= 1.0 + 1e-3 for r in ratios)
    return {"ok": ok, "headline": f"phase seconds / step wall per step: {[round(r, 4) for r in ratios]} "
            f"(want {low}..1)", "ratios": ratios, "low": low}


def _mfu_table(ctx: Ctx, run: dict[str, Any]) -> tuple[dict[str, Any], str, float | None]:
    import torch

    name = torch.cuda.get_device_name(0) if ctx.cuda else "cpu"
    peak, source = peak_flops(name, ctx.dtype)
    name = f"{name} ({source})" if peak else name
    _, phases = _step_phases(run["cb"], _timed_steps(run))
    table = {}
    for ph, d in phases.items():
        if d["hardware_flops"] == 0:
            continue
        secs = d["seconds"] if d["seconds"] > 0 else 1e-300  # FLOPs in no time: a clock that missed them (rate inf)
        row = {"flops_per_s": d["flops"] / secs, "hardware_flops_per_s": d["hardware_flops"] / secs, **d}
        if peak:
            row["mfu"] = mfu(d["flops"], secs, peak)
            row["hfu"] = mfu(d["hardware_flops"], secs, peak)
        table[ph] = row
    return table, name, peak


def check_phase_mfu(ctx: Ctx) -> dict[str, Any]:
    """Per-phase MFU (counted FLOPs) and HFU (recompute included) over the timed steps,
    against the device's dense peak: each must be in (0, 1)."""
    run = ctx.shared.get("timed_race")
    if run is None:
        raise RuntimeError("its run (overhead) did not finish: see that check")
    table, name, peak = _mfu_table(ctx, run)
    if peak is None:
        rates = ", ".join(f"{ph} {r['flops_per_s'] / 1e9:.1f} GFLOP/s" for ph, r in table.items())
        raise NotTested(f"no peak FLOP/s for {name!r} at {ctx.dtype} (CPUs have none in the table); achieved: {rates}")
    ok = bool(table) and all(0 <= r["mfu"] <= r["hfu"] < 1 and r["hfu"] > 0 for r in table.values())
    head = ", ".join(f"{ph} MFU {r['mfu']:.3f}/HFU {r['hfu']:.3f}" for ph, r in table.items())
    return {"ok": ok, "headline": f"{name} peak {peak / 1e12:.0f} TFLOP/s: {head}", "peak": peak, "phases": table}


def check_attach_then_move(ctx: Ctx) -> dict[str, Any]:
    """The policy is on the CPU when add_race_accounting runs (as under DeepSpeed/FSDP until
    accelerate.prepare) and moved to CUDA before training: the same synchronizes per step
    as attaching on CUDA, phase seconds within the wall, MFU below 1."""
    if not ctx.cuda:
        raise NotTested("one device (CPU): nothing to move the model to")
    ref = ctx.shared.get("timed_race")
    if ref is None:
        raise RuntimeError("its reference run (overhead) did not finish: see that check")
    run = timed_run(ctx, "moved", race=True, move=True)
    ratios = _wall_ratios(run)
    table, _, peak = _mfu_table(ctx, run)
    mfu_ok = peak is None or all(r["hfu"] < 1 for r in table.values())
    ok = run["median_syncs"] == ref["median_syncs"] and all(0.9 <= r <= 1.001 for r in ratios) and mfu_ok
    return {"ok": ok, "headline": f"synchronizes/step {run['median_syncs']:.0f} (attached on CUDA: "
            f"{ref['median_syncs']:.0f}); seconds/wall {[round(r, 3) for r in ratios]}",
            "syncs": run["syncs"], "reference_syncs": ref["syncs"], "ratios": ratios,
            "hfu": {ph: r.get("hfu") for ph, r in table.items()}}


def check_torch_compile(ctx: Ctx) -> dict[str, Any]:
    """``torch_compile=True``: the ledger equals the eager run's, key for key (same seed,
    fixed completion length)."""
    if not ctx.cuda and not ctx.args.compile:
        raise NotTested("torch.compile (inductor) on the CPU compiles for minutes; pass --compile to run it here")
    n = ctx.sizes.warm_steps + 1
    eager = timed_run(ctx, "eager", race=True, steps=n)
    t0 = time.perf_counter()
    compiled = timed_run(ctx, "compiled", race=True, steps=n, torch_compile=True)
    secs = time.perf_counter() - t0
    a, b = eager["cb"].ledger.totals_by_key(), compiled["cb"].ledger.totals_by_key()
    diff = {k: (a.get(k, 0), b.get(k, 0)) for k in sorted(set(a) | set(b)) if a.get(k, 0) != b.get(k, 0)}
    return {"ok": not diff and bool(a), "headline": f"{len(a)} ledger keys, {len(diff)} differ; compiled run "
            f"{secs:.0f} s", "differences": diff, "eager_total": eager["cb"].ledger.total,
            "compiled_total": compiled["cb"].ledger.total}


def _not_tested(reason_fn: Any) -> Any:
    def check(ctx: Ctx) -> dict[str, Any]:
        raise NotTested(reason_fn(ctx))
    return check


def _has(mod: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(mod) is not None


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _vllm(mode: str) -> Any:
    return _not_tested(lambda ctx: (f"vllm is not installed here; the {mode} path is charged from token ids "
                                    "(tests/engines/test_trl_vllm_tokens.py, CPU, stand-in generation)")
                       if not _has("vllm") else
                       f"vllm {mode} is not run by this one-process script (a vLLM engine in the same lease would "
                       "take most of its time); see docs/trl.md for the launch command")


def _launcher(what: str, mod: str | None) -> Any:
    return _not_tested(lambda ctx: (f"{mod} is not installed here" if mod and not _has(mod) else
                                    f"{what} needs `accelerate launch` with its config; this script is one process")
                       + "; RACE's CPU tests launch only DDP over gloo (tests/engines/test_trl_ddp.py)")


def _nccl(ctx: Ctx) -> str:
    n = _gpus()
    if n < 2:
        return f"{n} GPU(s) here: the 2-rank ledger exchange over NCCL needs 2 (gloo on CPU: tests/engines/test_trl_ddp.py)"
    return f"{n} GPUs here, but this script runs one process; run tests/engines/trl_ddp_worker.py under torchrun"


PERF_CHECKS = [
    ("overhead_with_without_race", check_overhead, 90.0, 15.0),
    ("phase_seconds_vs_wall", check_phase_seconds, 0.0, 0.0),
    ("phase_mfu_below_1", check_phase_mfu, 0.0, 0.0),
    ("attach_then_move", check_attach_then_move, 45.0, 0.0),
    ("torch_compile_ledger_equals_eager", check_torch_compile, 150.0, 60.0),
    ("vllm_colocate", _vllm("colocate"), 0.0, 0.0),
    ("vllm_server", _vllm("server"), 0.0, 0.0),
    ("deepspeed_zero3", _launcher("DeepSpeed ZeRO-3", "deepspeed"), 0.0, 0.0),
    ("fsdp2", _launcher("FSDP2", None), 0.0, 0.0),
    ("nccl_2_gpus", _not_tested(_nccl), 0.0, 0.0),
]
