"""The gang engine: LoRA runs of one base model train together, step by step.

Each member is a :class:`race.engines.builtin.BuiltinEngine` (its config, run directory,
policy, reward, optimizer, lr schedule, evaluation schedule and ledger), and the gang runs
the solo loop for all of them in lockstep: every gang step, each live member first asks
whether it may go on (``max_steps``; the budget at its next step's bound, through
the member's ``BudgetGuard``), and those that may run one batched step
(``race.engines.gang.step``). A member leaves when its budget, ``max_steps``, an overrun
or a divergence stops it; it then finishes as a solo run does (a last evaluation, its
final checkpoint, adapter, report card and ``run.json``, which records the gang under
``"gang"``) and the others go on. Evaluations are each member's own (solo passes),
including those where a run of a smaller budget would stop (``eval.at_budgets``, nested
pilots), decided before each step exactly as the solo loop decides them.

Each member's run directory is the one its solo run writes; its ledger charges exactly
its own rows with the solo engine's functions (same keys, same FLOPs; the rollout is
charged as the solo rollout, merged where the solo merges, while the gang executes it as
one merged, stacked decode, or with live adapters on a bfloat16/float16 base, where
neither merges: ``run.json["gang"]["rollout_flops_executed"]`` records what it executed).

Wall seconds: setup is split equally among the members; a batched stage's seconds go to
the members that ran in it in proportion to the FLOPs it charges each; a member's reward,
evaluation and finishing are its own. ``run.json["wall_s"]`` is the sum of a member's
shares, so the members' wall seconds add up to the gang's.

Resume: the gang checkpoints as a whole (``race.engines.gang.checkpoint``) every
``min(checkpoint_every)`` steps and whenever a member leaves (after its ``run.json``);
after a kill it restarts from that state: live members' ledgers and metrics are cut back
to what they held at the checkpoint, members that had left keep their results, and every later step
runs with the same members, so the results are those of an uninterrupted gang.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from race.accounting.guard import BUDGET_STOP
from race.engines.builtin import BuiltinEngine
from race.engines.common import Progress
from race.engines.gang.checkpoint import find_gang, load_member, read_gang, save_gang
from race.engines.gang.members import gang_refusal
from race.engines.gang.step import Work, gang_step
from race.engines.run_io import read_run, write_json_atomic
from race.spec.run import RunConfig


class GangEngine:
    """Train ``members`` ((config, run directory) pairs) as one gang; ``gang_dir`` holds
    the gang's checkpoint. ``run()`` returns each member's run.json, in order."""

    name = "builtin"  # members' run.json say the built-in engine trained them (a gang is how, not what)

    def __init__(self, members: list[tuple[RunConfig, Path]], gang_dir: Path, progress: Progress | None = None) -> None:
        why = gang_refusal([c for c, _ in members])
        if why:
            raise ValueError(why)
        self.gang_dir = Path(gang_dir)
        self.cfgs = [c for c, _ in members]  # the members' configs (the gang reads these, not the members')
        self.engs = [BuiltinEngine(c, Path(d), progress) for c, d in members]
        self.run_ids = [c.run_id() for c, _ in members]
        self.left = [False] * len(self.engs)
        self.results: list[dict[str, Any] | None] = [None] * len(self.engs)
        self.wall = [0.0] * len(self.engs)
        self.executed = [0] * len(self.engs)  # rollout FLOPs the gang executed per member
        self.total_steps = [0] * len(self.engs)  # each member's lr-schedule length (its books', once open)
        self.every = min(c.checkpoint_every for c, _ in members)

    def gang_info(self, i: int) -> dict[str, Any]:
        return {"members": self.run_ids, "index": i, "size": len(self.engs),
                "names": [c.name for c in self.cfgs], "rollout_flops_executed": self.executed[i]}

    # -- the run --------------------------------------------------------------------------
    def run(self) -> list[dict[str, Any]]:
        ckpt = find_gang(self.gang_dir)
        state = read_gang(ckpt, self.run_ids) if ckpt is not None else None
        if state is not None and all(state["left"]):
            done = [read_run(e.run_dir) for e in self.engs]
            if all(d is not None and d.get("status") != "running" for d in done):
                return done  # type: ignore[return-value]
        t0 = time.perf_counter()
        self.gang_dir.mkdir(parents=True, exist_ok=True)
        for e in self.engs:
            e.prepare()
        from race.engines.kernels import fast_forward
        from race.engines.gang.forward import share_base

        if not all(fast_forward.supports(e.model) for e in self.engs):
            raise ValueError("a gang needs the functional forward (a Qwen2/Llama-style model without gradient "
                             "checkpointing or attention dropout); run these cells alone (gang: false)")
        share_base([e.model for e in self.engs])
        step = self._restore(ckpt, state)
        setup = (time.perf_counter() - t0) / len(self.engs)
        for i in range(len(self.engs)):
            self.wall[i] += setup
        while not all(self.left):
            step = self._one_step(step)
        return [r if r is not None else read_run(e.run_dir) for r, e in zip(self.results, self.engs)]  # type: ignore

    def _restore(self, ckpt: Path | None, state: dict[str, Any] | None) -> int:
        """Every member's state at the gang checkpoint (or a fresh start); returns its step."""
        step = 0 if state is None else int(state["step"])
        for i, e in enumerate(self.engs):
            if state is not None and state["left"][i]:
                self.left[i] = True
                self.results[i] = read_run(e.run_dir)
                self.total_steps[i] = int(state["total_steps"][i])
                continue
            if state is None:
                e.begin()  # its ledger, metrics and guard, as BuiltinEngine.run opens them
            else:
                meta = load_member(ckpt, i, e)  # type: ignore[arg-type]
                self.executed[i] = int(meta.get("rollout_flops_executed", 0))
                self.wall[i] = float(meta.get("wall_s", 0.0))
                # back to what it had written at the checkpoint (counts, not steps: a member that
                # left recorded its final evaluation at its last step, which may be the checkpoint's)
                e.resume_from(meta, step, int(state["total_steps"][i]))
            self.total_steps[i] = e.total_steps
            if state is None:
                t = time.perf_counter()
                e.evaluate(0)
                self.wall[i] += time.perf_counter() - t
        return step

    def _one_step(self, step: int) -> int:
        """Gang step ``step + 1``: who goes on, the batched step, evaluations, leavers."""
        t = step + 1
        works, leaving = [], []
        for i, e in enumerate(self.engs):
            if self.left[i]:
                continue
            cfg = self.cfgs[i]
            if cfg.max_steps and step >= cfg.max_steps:
                leaving.append((i, "complete", "max_steps", None, step))
                continue
            problems, ids, mask = e.prompts_at(t)
            bound = e.step_bound(ids.shape[1], problems)
            t1 = time.perf_counter()  # the smaller budgets a run of this member would stop at (eval.at_budgets)
            may = e.may_step(step, bound)
            self.wall[i] += time.perf_counter() - t1
            if not may:
                leaving.append((i, "complete", BUDGET_STOP, None, step))
                continue
            works.append(Work(i, e, problems, ids, mask))
        if works:
            spent = gang_step(t, works)
            flops = [sum(w.roll.values()) + sum(w.learn.values()) for w in works]
            from race.engines.gang.members import split_seconds

            for w, s in zip(works, split_seconds(spent, flops)):
                self.wall[w.index] += s + w.rw.seconds
                self.executed[w.index] += w.executed
            for w in works:
                if w.outcome == "overrun":
                    leaving.append((w.index, "complete", BUDGET_STOP, None, step))
                elif w.outcome == "diverged":
                    leaving.append((w.index, "diverged", "diverged", f"{w.error}; kept the last good checkpoint", t))
                elif w.member.eval_due():
                    t1 = time.perf_counter()
                    w.member.evaluate(t)
                    self.wall[w.index] += time.perf_counter() - t1
        for i, status, reason, error, at in sorted(leaving):
            self._leave(i, status, reason, error, at)
        if leaving or (works and t % self.every == 0):
            self._checkpoint(t)
        return t

    def _leave(self, i: int, status: str, reason: str, error: str | None, step: int) -> None:
        """Member ``i`` finishes as its solo run does at ``step`` (``BuiltinEngine.run``'s end)."""
        e = self.engs[i]
        t0 = time.perf_counter()
        if status == "complete" and e.last_eval_step != step:
            e.evaluate(step)
        if status == "complete":
            e.checkpoint(step)
        self.wall[i] += time.perf_counter() - t0
        out = e.finish(step, status, reason, error, self.wall[i])
        out["gang"] = self.gang_info(i)
        write_json_atomic(e.run_dir / "run.json", out)
        self.results[i] = out
        self.left[i] = True

    def _checkpoint(self, step: int) -> None:
        metas = [None if gone else dict(e.save_meta(), wall_s=self.wall[i], rollout_flops_executed=self.executed[i])
                 for i, (e, gone) in enumerate(zip(self.engs, self.left))]
        save_gang(self.gang_dir, step=step, run_ids=self.run_ids, left=list(self.left),
                  members=self.engs, metas=metas, total_steps=list(self.total_steps))


def run_gang(members: list[tuple[RunConfig, Path]], gang_dir: Path,
             progress: Progress | None = None) -> list[dict[str, Any]]:
    """Train ``members`` as one gang (see :class:`GangEngine`); returns their run.json."""
    return GangEngine(members, gang_dir, progress).run()


__all__ = ["GangEngine", "run_gang"]
