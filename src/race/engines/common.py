"""What both engines share: the policy they start from, the task and evaluation, the
evaluation schedule, and the run directory they write (docs/run-format.md): config,
checkpoint metadata, resume checks and the final ``run.json``.

An engine differs in how it trains; where it starts, what it evaluates, how it resumes
and what it reports are the same, and live here once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from race.accounting import LoRA, ModelShape
from race.engines.run_io import MetricsLog, read_extends, read_run, write_config, write_json_atomic
from race.estimate import run_lora
from race.records import RUN_PHASES  # noqa: F401  (re-exported: the phases a run's ledger records)
from race.spec.cells import trajectory_key
from race.spec.run import RunConfig

Progress = Callable[[dict[str, Any]], None]


class DivergedError(RuntimeError):
    """The loss became non-finite."""


def make_task(cfg: RunConfig, tokenizer: Any = None) -> Any:
    """The run's task. A chat-template task renders its prompts with ``tokenizer`` (the
    policy's; loaded from ``cfg.model`` when not given)."""
    from race.tasks import ArithTask

    if cfg.task.name == "arith":
        return ArithTask.from_settings(cfg.task, seed=0)
    from race.tasks.files import FileTask

    if cfg.task.chat_template and tokenizer is None:
        from race.models.loading import load_tokenizer, resolve_source

        source, kw = resolve_source(cfg.model)
        tokenizer = load_tokenizer(source, **kw)
    return FileTask.from_settings(cfg.task, tokenizer=tokenizer)


def default_torch_threads(cfg: RunConfig) -> int | None:
    """Torch threads for a run: ``cfg.torch_threads``; else the grid worker's setting
    (``$RACE_TORCH_THREADS``); else 1 for the tiny family, whose small matrices run about
    2x slower on 2 threads than on 1 (``benchmarks/grid_throughput.py``: 1 worker x 2
    threads 0.53x of 1 x 1 on the demo cells) and whose results then do not depend on the
    machine's core count; else ``None`` (torch's default)."""
    from race.models.family import is_tiny_name

    if cfg.torch_threads:
        return cfg.torch_threads
    env = os.environ.get("RACE_TORCH_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return 1 if is_tiny_name(cfg.model) else None


@dataclass
class RunPolicy:
    """What both engines start from: the loaded policy (not yet LoRA-wrapped), its
    tokenizer, shape and device, and the accounting ``LoRA`` (checked against the shape)."""

    model: Any
    tok: Any
    lora: LoRA | None
    shape: ModelShape
    device: Any


def load_run_policy(cfg: RunConfig) -> RunPolicy:
    """Threads from the config, the run's artefacts built when missing (its tiny warm start,
    its RACE reward model: ``race.builds.demand.ensure_run``, before the seed, so a run that
    builds them starts from the same random state as one that finds them cached), the
    seed, then the policy for any engine through ``load_policy``."""
    import torch

    from race.builds.demand import ensure_run
    from race.models import load_policy, model_shape

    threads = default_torch_threads(cfg)
    if threads:
        torch.set_num_threads(threads)
    ensure_run(cfg)
    torch.manual_seed(cfg.seed)
    # full fine-tuning trains (and keeps AdamW's state in) the weights' dtype: "auto" keeps them float32
    dtype = "float32" if cfg.lora is None and cfg.dtype == "auto" else cfg.dtype
    model, tok = load_policy(cfg.model, device=cfg.device, dtype=dtype, attn_implementation=cfg.attn_implementation)
    shape = model_shape(model)
    lora = run_lora(cfg)
    if lora is not None:
        lora.check(shape)
    return RunPolicy(model, tok, lora, shape, next(model.parameters()).device)


def _verify_fn() -> Callable[[Any, str], bool]:
    from race.rewards.text import verify_terms

    return lambda p, text: verify_terms(p, text)[0] == 1.0


def start_policy(cfg: RunConfig, schedule: EvalSchedule) -> RunPolicy:
    """What both engines' setup begins with: the run's policy (:func:`load_run_policy`),
    with its step-0 evaluation shared through ``schedule`` where ``eval_cache_dir`` asks for
    it. The engine takes what it needs from the returned policy itself."""
    policy = load_run_policy(cfg)
    schedule.share_step0(cfg, policy.model)
    return policy


def run_evaluator(cfg: RunConfig, task: Any, policy: RunPolicy) -> Any:
    """The run's evaluation targets on ``task`` (both engines evaluate the same way)."""
    from race.accounting import PolicyCost
    from race.engines.evaluation import Evaluator

    return Evaluator(task, cfg.eval, tokenizer=policy.tok, max_new_tokens=cfg.max_completion_length,
                     temperature=cfg.temperature, policy=PolicyCost(policy.shape, policy.lora, cfg.conventions),
                     device=policy.device, verify=_verify_fn())


@dataclass
class EvalSchedule:
    """Evaluate every ``every`` counted FLOPs (default ``budget / eval.num_points``), and
    where a run of each budget in ``at_budgets`` would stop (:meth:`reach_budgets`)."""

    every: float
    next_at: float = 0.0
    last_step: int = -1
    step0: tuple[Any, str] | None = None  # (Step0Cache, key) when the step-0 evaluation is shared
    at_budgets: tuple[float, ...] = ()
    budget_points: list[dict[str, float]] = field(default_factory=list)  # {"budget", "step", "flops"} reached

    @classmethod
    def of(cls, cfg: RunConfig) -> "EvalSchedule":
        return cls(cfg.eval.every_flops or cfg.budget_flops / cfg.eval.num_points,
                   at_budgets=tuple(sorted(cfg.eval.at_budgets)))

    def reach_budgets(self, evaluator: Any, model: Any, ledger: Any, metrics: MetricsLog, step: int,
                      step_bound: float) -> None:
        """Before step ``step + 1`` (bounded by ``step_bound`` FLOPs): every budget b of
        ``at_budgets`` whose run would stop here (``spent + step_bound > b``, the guard's
        own rule, ``race.accounting.guard.stops_before``) is reached at ``step``: evaluate (unless
        this step was just evaluated) and record ``{"budget", "step", "flops"}``. With the
        same seed and a schedule that does not depend on the budget (constant learning
        rate), the run so far IS the run of budget b: same prompts, samples and updates."""
        from race.accounting.guard import stops_before

        done = {p["budget"] for p in self.budget_points}
        for b in self.at_budgets:
            if b in done or not stops_before(b, ledger.total, step_bound):
                continue
            # evaluated already: at this step by the schedule, or before a crash that the
            # resumed run (checkpoint at this step, metrics kept up to it) is replaying
            if any(r["step"] == step for r in metrics.evals()):
                if self.last_step != step:  # the replayed evaluation's effect on the schedule
                    self.last_step, self.next_at = step, ledger.total + self.every
            else:
                self.evaluate(evaluator, model, ledger, metrics, step)
            self.budget_points.append({"budget": b, "step": step, "flops": ledger.total})

    def share_step0(self, cfg: RunConfig, base: Any) -> None:
        """With ``cfg.eval_cache_dir``, share the step-0 evaluation of the loaded ``base``
        model with every run that starts from it (``race.engines.eval_share``)."""
        if not cfg.eval_cache_dir:
            return
        import torch

        from race.engines.eval_share import Step0Cache, step0_key

        key = step0_key(cfg, getattr(base, "name_or_path", ""), torch.get_num_threads())
        if key is not None:
            self.step0 = (Step0Cache(cfg.eval_cache_dir), key)

    def due(self, total: float) -> bool:
        return total >= self.next_at

    def evaluate(self, evaluator: Any, model: Any, ledger: Any, metrics: MetricsLog, step: int) -> list[dict[str, Any]]:
        """Run the targets, charge the uncounted ``eval`` phase, append the metrics rows.
        A shared step-0 evaluation read from the cache is recorded as ``eval/shared``
        with the 0 FLOPs this run executed for it."""
        shared = False
        if step == 0 and self.step0 is not None:
            cache, key = self.step0
            res, shared = cache.get_or_compute(key, lambda: evaluator.evaluate(model))
        else:
            res = evaluator.evaluate(model)
        ledger.add(step, "eval", "shared" if shared else "generate", res.flops, tokens=res.tokens,
                   seconds=res.seconds, counted=False)
        rows = [dict(r, kind="eval", step=step, flops=ledger.total) for r in res.rows]
        metrics.append(rows)
        self.last_step = step
        self.next_at = ledger.total + self.every
        return rows

    def state(self) -> dict[str, Any]:
        return {"next_eval_at": self.next_at, "last_eval_step": self.last_step,
                "budget_points": [dict(p) for p in self.budget_points]}

    def restore(self, meta: dict[str, Any]) -> None:
        self.next_at, self.last_step = float(meta["next_eval_at"]), int(meta["last_eval_step"])
        self.budget_points = [dict(p) for p in meta.get("budget_points", [])]

    def extend(self, ext: dict[str, Any]) -> None:
        """After restoring the last checkpoint of the shorter run ``ext`` describes (it ended
        evaluated, at its own budget's stop): where a fresh run of this budget stands at that
        step. Its budget is a budget point reached there (when ``at_budgets`` lists it: the
        guard's stop rule is the one both runs follow), and the next evaluation is this
        budget's spacing after it (the shorter run's came from its own budget)."""
        for b in self.at_budgets:
            if abs(b - float(ext["budget_flops"])) <= 1e-9 * b:
                self.budget_points.append({"budget": b, "step": int(ext["steps"]), "flops": ext["total_flops"]})
        # evaluated at its last step (a TRL checkpoint is written before that final evaluation)
        self.last_step, self.next_at = int(ext["steps"]), float(ext["total_flops"]) + self.every


class RunDir:
    """The run directory of one run (docs/run-format.md), as both engines write it."""

    def __init__(self, path: str | Path, cfg: RunConfig) -> None:
        self.path, self.cfg = Path(path), cfg

    def completed(self) -> dict[str, Any] | None:
        """The stored run.json when this very run (same id) already completed here."""
        done = read_run(self.path) if self.path.is_dir() else None
        if done is not None and done.get("status") == "complete" and done.get("run_id") == self.cfg.run_id():
            return done
        return None

    def begin(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        write_config(self.path, self.cfg)

    def start_over(self) -> None:
        """No checkpoint: a crash before the first one leaves records to drop."""
        for f in ("ledger.jsonl", "metrics.jsonl"):
            (self.path / f).unlink(missing_ok=True)

    def checkpoint_meta(self, schedule: EvalSchedule, reward: Any) -> dict[str, Any]:
        """What a checkpoint stores besides the weights, to resume exactly."""
        return {**schedule.state(), "run_id": self.cfg.run_id(), "reward_calls": getattr(reward, "call_index", 0)}

    def extension(self) -> dict[str, Any] | None:
        """The shorter run this directory was seeded to extend (``run_io.seed_extension``), else None."""
        return read_extends(self.path)

    def resume(self, meta: dict[str, Any], schedule: EvalSchedule, reward: Any) -> None:
        """Check a checkpoint's metadata belongs to this run, or to the shorter run of the
        same trajectory this directory was seeded to extend (same settings but the budget,
        a smaller budget, a constant learning rate: ``race.spec.cells.trajectory_key``), and
        restore what it stored; an extension then stands where a fresh run of this budget
        stands at that step (:meth:`EvalSchedule.extend`)."""
        ext = self.extension()
        extending = meta.get("run_id") != self.cfg.run_id() and ext is not None and meta.get("run_id") == ext["run_id"]
        if meta.get("run_id") != self.cfg.run_id() and not extending:
            raise RuntimeError(f"{self.path} holds a checkpoint of another run ({meta.get('run_id')}); "
                               "use a new output directory")
        if extending:
            mine = trajectory_key(self.cfg)
            if mine is None or ext.get("trajectory") != mine or not float(ext["budget_flops"]) < self.cfg.budget_flops:
                raise RuntimeError(f"{self.path} was seeded to extend run {ext['run_id']}, but that run is not a "
                                   f"shorter run of this one's trajectory (trajectory {ext.get('trajectory')} vs "
                                   f"{mine}, budget {ext['budget_flops']:.4g} vs {self.cfg.budget_flops:.4g}); use a "
                                   "new output directory")
        schedule.restore(meta)
        if extending:
            schedule.extend(ext)
        if hasattr(reward, "set_call_index"):
            reward.set_call_index(int(meta.get("reward_calls", 0)))

    def finish(self, *, engine: str, ledger: Any, metrics: MetricsLog, steps: int, status: str, stop_reason: str,
               error: str | None, wall: float, shape: ModelShape, resumed_from: int | None,
               budget_points: list[dict[str, float]] | None = None) -> dict[str, Any]:
        """Write and return ``run.json`` (the report card is the engine's to write)."""
        from dataclasses import asdict

        from race.records import run_record

        cfg = self.cfg
        rec = run_record(evals=metrics.evals(), train=[r for r in metrics.rows if r.get("kind") == "train"],
                         ledger=[asdict(r) for r in ledger], steps=steps, learned=cfg.reward.learned,
                         target=cfg.eval.targets[0])
        out = {
            "run_id": cfg.run_id(), "name": cfg.name, "engine": engine, "status": status,
            "stop_reason": stop_reason, "error": error, "budget_flops": cfg.budget_flops,
            "total_flops": rec.total_flops, "phase_flops": rec.phase_flops, "steps": rec.steps,
            "wall_s": round(wall, 3),
            "phase_seconds": {k: round(v, 3) for k, v in ledger.seconds_by_phase().items()},
            "model_params": shape.num_params(), "non_embedding_params": shape.non_embedding_params(),
            "initial": rec.initial, "final": rec.final, "diagnostics": rec.diagnostics,
            "resumed_from": resumed_from, "conventions": cfg.conventions, "trajectory": trajectory_key(cfg),
            "config": cfg.model_dump(mode="json"),
        }
        if cfg.eval.at_budgets:  # where the run stood in for each smaller budget (eval.at_budgets)
            out["budget_points"] = [dict(p) for p in budget_points or []]
        ext = self.extension()
        if ext is not None:  # it continued that run: its ledger, metrics and wall seconds hold that run's
            out["extends"] = {k: ext[k] for k in ("run_id", "budget_flops", "steps", "total_flops", "wall_s")}
            out["wall_s"] = round(wall + float(ext["wall_s"]), 3)
        write_json_atomic(self.path / "run.json", out)
        return out


__all__ = ["DivergedError", "EvalSchedule", "RUN_PHASES", "Progress", "RunDir", "RunPolicy", "default_torch_threads",
           "load_run_policy", "make_task", "run_evaluator", "start_policy"]
