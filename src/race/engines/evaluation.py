"""Evaluation targets: greedy accuracy on the test split, pass@k at the training
temperature, pass@1 (the mean accuracy of those same k samples: the expected verified
reward of the policy as it samples, i.e. what GRPO optimises; ``per_problem`` holds each
problem's fraction correct), greedy accuracy on the harder held-out split.

The problems are the same for every run of a study (fixed seeds, independent of the run
seed), in the same order, so ``per_problem`` vectors line up for bootstrap over problems.
Evaluation FLOPs are computed from what executed and recorded apart from the budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from race.accounting import PolicyCost
from race.engines.sampling import decode_completions, encode_prompts, rollout_flops, sample

EVAL_SEED = 1_000_003  # problems seed shared by every run


@dataclass
class EvalResult:
    rows: list[dict[str, Any]]  # one per target: target, score, n, per_problem
    flops: int = 0
    tokens: int = 0
    seconds: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


class Evaluator:
    """Runs the configured evaluation targets on a policy."""

    def __init__(self, task: Any, settings: Any, *, tokenizer: Any, max_new_tokens: int, temperature: float,
                 policy: PolicyCost, device: Any, verify: Callable[[Any, str], bool],
                 batch_size: int = 256) -> None:
        self.task, self.s, self.tok = task, settings, tokenizer
        self.max_new, self.temperature = max_new_tokens, temperature
        self.policy, self.device = policy, device  # what the evaluation's rollouts are charged as
        self.verify, self.batch_size = verify, batch_size
        self.drop_finished = True  # finished rows leave the decode batch (race.engines.sampling)
        self.test = task.problems("test", settings.n_problems, seed=EVAL_SEED) if "greedy" in settings.targets else []
        self.hard = (task.problems("hard", settings.n_hard_problems, seed=EVAL_SEED)
                     if "hard" in settings.targets and settings.n_hard_problems else [])
        sampled = "pass@k" in settings.targets or "pass@1" in settings.targets
        self.passk = (task.problems("test", settings.n_pass_problems, seed=EVAL_SEED + 1)
                      if sampled and settings.n_pass_problems else [])

    def _jobs(self) -> list[tuple[str, Any, int, bool]]:
        """(target, problem, samples, greedy) per evaluated problem, in target order."""
        jobs = [("greedy", p, 1, True) for p in self.test]
        jobs += [("pass@k", p, self.s.pass_k, False) for p in self.passk]
        jobs += [("hard", p, 1, True) for p in self.hard]
        return jobs

    @torch.no_grad()
    def evaluate(self, model: Any) -> EvalResult:
        """Every target in ONE decode loop per batch of up to ``batch_size`` rows: a greedy
        row per test/hard problem, ``pass_k`` sampled rows per pass@k problem (its prompt
        repeated, so prefill runs per row). At pilot scale a decode loop costs about the
        same for 100 rows as for 250, so one loop instead of one per target cuts the
        evaluation time roughly by the number of targets."""
        import time

        t0 = time.perf_counter()
        rows_of: list[tuple[int, str]] = []  # per row: (job index, prompt)
        jobs = self._jobs()
        greedy_flags: list[bool] = []
        for j, (_, p, k, greedy) in enumerate(jobs):
            rows_of += [(j, p.prompt)] * k
            greedy_flags += [greedy] * k
        correct: list[list[bool]] = [[] for _ in jobs]
        flops = tokens = 0
        row_steps = [0, 0]  # decode row-steps run, and rows x longest completion (what keeping every row runs)
        gen = torch.Generator(device="cpu").manual_seed(EVAL_SEED)
        was_training = model.training
        model.eval()
        try:
            for i in range(0, len(rows_of), self.batch_size):
                chunk = rows_of[i:i + self.batch_size]
                ids, mask = encode_prompts(self.tok, [prompt for _, prompt in chunk], self.device)
                flags = torch.tensor(greedy_flags[i:i + self.batch_size], dtype=torch.bool)
                ro = sample(model, ids, mask, group=1, max_new_tokens=self.max_new, eos_id=self.tok.eos_token_id,
                            pad_id=self.tok.pad_token_id, temperature=self.temperature, greedy=flags, generator=gen,
                            drop_finished=self.drop_finished)
                for (j, _), text in zip(chunk, decode_completions(self.tok, ro)):
                    correct[j].append(self.verify(jobs[j][1], text))
                comps = rollout_flops(self.policy, ro)
                flops += sum(comps.values())
                tokens += int(ro.lengths.sum())
                row_steps[0] += int(ro.decoded.sum()) if ro.decoded is not None else ro.completion_ids.numel()
                row_steps[1] += ro.completion_ids.numel()
        finally:
            model.train(was_training)
        rows: list[dict[str, Any]] = []
        for target in ("greedy", "pass@k", "hard"):
            res = [c for (t, *_), c in zip(jobs, correct) if t == target]
            if not res:
                continue
            if target == "pass@k":
                if "pass@k" in self.s.targets:
                    rows.append(self._row(target, [any(r) for r in res], k=self.s.pass_k,
                                          pass1=sum(sum(r) for r in res) / (len(res) * self.s.pass_k)))
                if "pass@1" in self.s.targets:
                    rows.append(self._row("pass@1", [sum(r) / len(r) for r in res], k=self.s.pass_k))
            else:
                rows.append(self._row(target, [r[0] for r in res]))
        return EvalResult(rows, flops, tokens, time.perf_counter() - t0,
                          extra={"row_steps_share": row_steps[0] / max(1, row_steps[1])})

    @staticmethod
    def _row(target: str, correct: list[bool] | list[float], **extra: Any) -> dict[str, Any]:
        per = [c if isinstance(c, float) else (1 if c else 0) for c in correct]
        row = {"target": target, "score": sum(per) / max(1, len(per)), "n": len(per), "per_problem": per}
        row.update(extra)
        return row
