"""Wall time and device-hours of a run, from its predicted FLOPs per phase and a device.

A plan prices each run on one device of the table (``race.accounting.devices``; ``--device``).
On a GPU a run of ``n`` steps takes

    cell_s + n x (step_s + max(R / (P m_rollout), L x decode_s) + Lrn / (P m_learning) + F / (P m_feedback))

seconds: ``R``, ``Lrn``, ``F`` its predicted rollout, learning and feedback FLOPs per step,
``P`` the device's dense peak at the run's dtype, ``m`` the model-FLOP utilisation of each
phase, ``L`` the completion tokens a step decodes one after another (``max_completion_length``)
and ``decode_s`` the time of one decoding position however small the model (token-by-token
decoding is bound by latency, not FLOPs, at pilot sizes), ``step_s`` a step's other fixed
cost and ``cell_s`` the loading of one run; its evaluations are priced as rollouts
(:meth:`Pricing.eval_seconds`). Its device-hours are its seconds x the devices it holds
(``gpus_per_cell``; one per cell on the local runner).

The MFU per phase is, in this order: ``--mfu``; measured on the study's finished runs
(``--study-dir``: each phase's ledger FLOPs over its ledger seconds, against the device's peak:
:func:`measured_mfu`); else :data:`ASSUMED_MFU`, stated as an assumption. On the ``cpu`` device
the table's number is already a measured rate and the plan keeps its original CPU model
(``cell_s`` 4 s, ``step_s`` 0.4 s, MFU 1: ``race.grid.plan.default_seconds``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from race.accounting.devices import Device, gpu_hours, plan_device
from race.accounting.guard import steps_bought

#: The phases of a plan's prediction, in the order MFU is written (``rollout`` is the search axis).
PHASES = ("rollout", "learning", "feedback")
#: The default MFU on a GPU: an assumption, not a measurement (module docstring; docs/gpu.md).
ASSUMED_MFU = {"rollout": 0.02, "learning": 0.15, "feedback": 0.15}
ASSUMED_MFU_SOURCE = "assumed, not measured: docs/gpu.md; --mfu or --study-dir to replace it"
#: Fixed costs on a GPU: ``decode_s`` measured (TRL on an H200, Qwen2.5-0.5B, bf16, 16 sequences x 48 tokens:
#: rollout 14.97 s over 5 steps = 62 ms per decoded position; docs/gpu-check/h200-run1.json), ``step_s``
#: measured in the same run (update 2.12 s over 5 steps), ``cell_s`` assumed (loading the models).
GPU_DECODE_SECONDS = 0.062
GPU_STEP_SECONDS = 0.42
GPU_CELL_SECONDS = 60.0
#: Rows per evaluation decode loop (``race.engines.evaluation.Evaluator``'s batch_size).
EVAL_BATCH = 256
#: The CPU model (``race.grid.plan``): measured on the demo grid, 2 workers x 1 thread, 2-core CPU.
CPU_CELL_SECONDS = 4.0
CPU_STEP_SECONDS = 0.4


def parse_mfu(text: str) -> dict[str, float]:
    """``--mfu``: one number for every phase (``0.3``) or ``phase=value`` pairs
    (``rollout=0.05,learning=0.3``; ``search`` is the rollout; unnamed phases keep
    :data:`ASSUMED_MFU`). ``ValueError`` says what to write."""
    out = dict(ASSUMED_MFU)
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    try:
        if len(items) == 1 and "=" not in items[0]:
            out = {p: float(items[0]) for p in PHASES}
        else:
            for item in items:
                phase, value = (s.strip() for s in item.split("=", 1))
                phase = "rollout" if phase == "search" else phase
                if phase not in PHASES:
                    raise ValueError(f"unknown phase {phase!r}")
                out[phase] = float(value)
    except ValueError as e:
        raise ValueError(f"--mfu {text!r}: {e}; write one fraction (0.3) or rollout=0.02,learning=0.15,"
                         "feedback=0.15") from None
    bad = [p for p, v in out.items() if not (0 < v <= 1 and math.isfinite(v))]
    if bad:
        raise ValueError(f"--mfu {text!r}: an MFU is a fraction of the peak in (0, 1]; {', '.join(bad)} is not")
    return out


def run_dtype(cfg: Any) -> str:
    """The dtype a run's matmuls use on a GPU (``RunConfig.dtype``; ``auto``: bf16 with LoRA,
    fp32 for full fine-tuning, as ``race.engines.common`` loads it)."""
    d = getattr(cfg, "dtype", "auto") if not isinstance(cfg, dict) else cfg.get("dtype", "auto")
    lora = getattr(cfg, "lora", None) if not isinstance(cfg, dict) else cfg.get("lora")
    if d == "auto":
        return "bf16" if lora is not None else "fp32"
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(str(d), "fp32")


@dataclass(frozen=True)
class Pricing:
    """How a plan turns FLOPs into seconds on ``device`` (module docstring)."""

    device: Device
    mfu: dict[str, float]
    mfu_source: str
    cell_s: float
    step_s: float
    decode_s: float
    gpus_per_cell: float = 1.0
    measured: dict[str, Any] = field(default_factory=dict)  # what measured_mfu found, for the notes

    @property
    def unit(self) -> str:
        """What the hours are of: ``GPU`` or ``worker`` (a CPU grid worker)."""
        return "GPU" if self.device.gpu else "worker"

    def run_seconds(self, steps: float, flops: dict[str, float], *, dtype: str, completion_len: int) -> float:
        """Seconds of a run of ``steps`` steps spending ``flops`` (phase -> whole-run FLOPs;
        ``total`` stands for all of them when no phase is given)."""
        phases = {p: float(flops.get(p) or 0.0) for p in PHASES}
        if not any(phases.values()):
            phases["learning"] = float(flops.get("total") or 0.0)
        peak = self.device.peak(dtype) or self.device.peak("fp32") or 0.0
        if not self.device.gpu:
            if len(set(self.mfu.values())) == 1:  # the CPU model as it always was: total FLOPs at one rate
                return self.cell_s + steps * self.step_s + sum(phases.values()) / (peak * self.mfu["rollout"])
            return self.cell_s + steps * self.step_s + sum(v / (peak * self.mfu[p]) for p, v in phases.items())
        if steps <= 0:
            return self.cell_s + sum(v / (peak * self.mfu[p]) for p, v in phases.items())
        per = {p: v / steps for p, v in phases.items()}
        rollout = max(per["rollout"] / (peak * self.mfu["rollout"]), completion_len * self.decode_s)
        rest = sum(per[p] / (peak * self.mfu[p]) for p in ("learning", "feedback"))
        return self.cell_s + steps * (self.step_s + rollout + rest)

    def cell_seconds(self, pred: dict[str, float], cfg: Any) -> float:
        """Seconds of the run a cell's prediction describes, its evaluations included on a GPU
        (:meth:`eval_seconds`; a CPU prediction's own ``est_seconds`` when the predictor gave
        one and the MFU is the CPU model's)."""
        if not self.device.gpu and "est_seconds" in pred and set(self.mfu.values()) == {1.0}:
            return float(pred["est_seconds"])
        return self.run_seconds(pred.get("steps", 0), pred, dtype=run_dtype(cfg),
                                completion_len=int(getattr(cfg, "max_completion_length", 0) or 0)) + \
            self.eval_seconds(pred, cfg)

    def eval_seconds(self, pred: dict[str, float], cfg: Any) -> float:
        """A run's evaluations on a GPU (the CPU model counts them in its fixed costs): at
        each point (step 0, ``eval.num_points`` over the budget or every ``eval.every_flops``,
        and each ``eval.at_budgets``) one decode of every evaluated row (greedy and hard
        problems, ``pass_k`` samples per pass@k problem) in batches of 256, priced as the
        rollout: ``max(rows x a rollout sequence's FLOPs / (P m_rollout), batches x L x decode_s)``."""
        ev = getattr(cfg, "eval", None)
        steps, n_seq = pred.get("steps") or 0, cfg.prompts_per_step * cfg.num_generations if ev else 0
        if not self.device.gpu or ev is None or not steps or not n_seq:
            return 0.0
        rows = (ev.n_problems if "greedy" in ev.targets else 0) + (ev.n_hard_problems if "hard" in ev.targets else 0)
        rows += ev.n_pass_problems * ev.pass_k if {"pass@k", "pass@1"} & set(ev.targets) else 0
        points = 1 + len(ev.at_budgets) + (ev.num_points if ev.every_flops is None  # evaluations every_flops apart
                                           else steps_bought(cfg.budget_flops, ev.every_flops))
        peak = self.device.peak(run_dtype(cfg)) or self.device.peak("fp32") or 0.0
        per_row = float(pred.get("rollout") or 0.0) / steps / n_seq
        decode = math.ceil(rows / EVAL_BATCH) * cfg.max_completion_length * self.decode_s
        return points * max(rows * per_row / (peak * self.mfu["rollout"]), decode)

    def budget_seconds(self, budget: float) -> float:
        """A cell without a prediction: its budget at the learning phase's rate, plus its fixed cost."""
        return self.run_seconds(0, {"total": budget}, dtype="bf16", completion_len=0)

    def hours(self, seconds: float) -> float:
        """Device-hours of ``seconds`` of one cell (:func:`race.accounting.devices.gpu_hours`)."""
        return gpu_hours(seconds, self.gpus_per_cell)

    def describe(self) -> str:
        """One line: the device, its peak, the MFU and where it comes from, the fixed costs."""
        d = self.device
        mfu = ", ".join(f"{p} {self.mfu[p]:.3g}" for p in PHASES)
        if not d.gpu:
            return (f"priced on {d.key}: {d.peak('fp32'):.3g} FLOP/s per worker (a measured rate: "
                    f"race.accounting.devices) + {self.cell_s:g} s per cell + {self.step_s:g} s per step"
                    + ("" if set(self.mfu.values()) == {1.0} else f"; MFU {mfu}"))
        return (f"priced on {d.key} ({d.title}, bf16 dense peak {d.peak('bf16') / 1e12:.4g} TFLOP/s); MFU {mfu} "
                f"({self.mfu_source}); at least {self.decode_s * 1e3:.0f} ms per decoded position, {self.step_s:g} s "
                f"per step, {self.cell_s:g} s per cell to load, evaluations priced as rollouts; {self.gpus_per_cell:g} GPU "
                "per cell")


def pricing(device: str = "cpu", *, mfu: "str | dict[str, float] | None" = None,
            study_dir: "str | Path | None" = None, gpus_per_cell: float = 1.0) -> Pricing:
    """The pricing of ``device`` (a plan's ``--device``; ``AccountingError`` for an unknown
    name, listing the table's): ``mfu`` (``--mfu`` text or a dict) when given, else measured
    on ``study_dir``'s finished runs when it has any with phase seconds (GPU devices), else
    the assumption (:data:`ASSUMED_MFU`; 1 on the CPU, whose rate is measured)."""
    dev = plan_device(device)
    if dev.gpu:
        base = Pricing(dev, dict(ASSUMED_MFU), ASSUMED_MFU_SOURCE, GPU_CELL_SECONDS, GPU_STEP_SECONDS,
                       GPU_DECODE_SECONDS, gpus_per_cell)
    else:
        base = Pricing(dev, {p: 1.0 for p in PHASES}, "the CPU rate is measured", CPU_CELL_SECONDS, CPU_STEP_SECONDS,
                       0.0, 1.0)
    if mfu is not None:
        given = parse_mfu(mfu) if isinstance(mfu, str) else {**base.mfu, **mfu}
        return replace(base, mfu=given, mfu_source="--mfu")
    if dev.gpu and study_dir is not None:
        found = measured_mfu(study_dir, dev)
        if found["mfu"]:
            return replace(base, mfu={**base.mfu, **found["mfu"]}, measured=found,
                           mfu_source=f"measured on {found['runs']} finished run(s) of {study_dir}"
                           + ("" if len(found["mfu"]) == len(PHASES) else "; the other phases assumed"))
    return base


def study_runs(study_dir: "str | Path") -> list[dict[str, Any]]:
    """The finished runs of a study with what pricing reads: ``run_id``, ``wall_s``, ``steps``,
    ``total_flops``, ``config`` (the cell's run settings), ``flops`` and ``seconds`` per plan
    phase (counted ledger rows; 0 seconds where the engine timed none)."""
    from race.accounting.phases import SPLIT
    from race.grid.store import Store

    if not (Path(study_dir) / "study.sqlite").exists():
        return []
    axis = {ph: ("rollout" if ax == "search" else ax) for ax, phases in SPLIT.items() for ph in phases}
    with Store(study_dir, create=False) as store:
        runs = {r["run_id"]: {"run_id": r["run_id"], "wall_s": r["wall_s"], "steps": r["steps"],
                              "total_flops": r["total_flops"], "config": json.loads(r["spec_json"]),
                              "flops": dict.fromkeys(PHASES, 0.0), "seconds": dict.fromkeys(PHASES, 0.0)}
                for r in store.conn.execute("SELECT run_id, wall_s, steps, total_flops, spec_json FROM runs "
                                            "WHERE status='complete'")}
        for run_id, phase, flops, seconds in store.conn.execute(
                "SELECT run_id, phase, SUM(flops), SUM(seconds) FROM ledger WHERE counted=1 GROUP BY run_id, phase"):
            if run_id in runs and phase in axis:
                runs[run_id]["flops"][axis[phase]] += float(flops or 0.0)
                runs[run_id]["seconds"][axis[phase]] += float(seconds or 0.0)  # SUM is NULL when none was timed
    return list(runs.values())


def measured_mfu(study_dir: "str | Path", device: Device) -> dict[str, Any]:
    """Per-phase MFU of a study's finished runs against ``device``'s peak at each run's dtype:
    ``sum(FLOPs) / sum(seconds x peak)`` over the runs whose ledger timed the phase (so a
    long run weighs in proportion). ``{"mfu": {phase: value}, "runs": n}``; a phase no run
    timed is left out. Meaningful when the study ran on ``device``."""
    num = dict.fromkeys(PHASES, 0.0)
    den = dict.fromkeys(PHASES, 0.0)
    used: set[str] = set()
    for r in study_runs(study_dir):
        peak = device.peak(run_dtype(r["config"])) or device.peak("fp32")
        for p in PHASES:
            f, s = r["flops"][p], r["seconds"][p]
            if peak and f > 0 and s:
                num[p] += f
                den[p] += s * peak
                used.add(r["run_id"])
    return {"mfu": {p: num[p] / den[p] for p in PHASES if den[p] > 0}, "runs": len(used)}


__all__ = ["ASSUMED_MFU", "PHASES", "Pricing", "measured_mfu", "parse_mfu", "pricing", "run_dtype", "study_runs"]
