"""Evaluation targets: greedy accuracy on the test split, pass@k at the training
temperature, greedy accuracy on the harder held-out split.

The problems are the same for every run of a study (fixed seeds, independent of the run
seed), in the same order, so ``per_problem`` vectors line up for bootstrap over problems.
Evaluation FLOPs are computed from what executed and recorded apart from the budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from race.accounting import LoRA, ModelShape, generate_components
from race.engines.sampling import decode_completions, encode_prompts, sample

EVAL_SEED = 1_000_003  # problems seed shared by every run


@dataclass
class EvalResult:
    rows: list[dict[str, Any]]  # one per target: target, score, n, per_problem
    flops: int = 0
    tokens: int = 0
    seconds: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


def _batched(seq: Sequence[Any], n: int):
    for i in range(0, len(seq), n):
        yield seq[i:i + n]


class Evaluator:
    """Runs the configured evaluation targets on a policy."""

    def __init__(self, task: Any, settings: Any, *, tokenizer: Any, max_new_tokens: int, temperature: float,
                 shape: ModelShape, lora: LoRA | None, conventions: str, device: Any,
                 verify: Callable[[Any, str], bool], batch_size: int = 256) -> None:
        self.task, self.s, self.tok = task, settings, tokenizer
        self.max_new, self.temperature = max_new_tokens, temperature
        self.shape, self.lora, self.conv, self.device = shape, lora, conventions, device
        self.verify, self.batch_size = verify, batch_size
        self.test = task.problems("test", settings.n_problems, seed=EVAL_SEED) if "greedy" in settings.targets else []
        self.hard = (task.problems("hard", settings.n_hard_problems, seed=EVAL_SEED)
                     if "hard" in settings.targets and settings.n_hard_problems else [])
        self.passk = (task.problems("test", settings.n_pass_problems, seed=EVAL_SEED + 1)
                      if "pass@k" in settings.targets and settings.n_pass_problems else [])

    def _run(self, model: Any, problems: Sequence[Any], *, group: int, greedy: bool,
             seed: int) -> tuple[list[list[bool]], int, int]:
        """Correctness per problem per sample, FLOPs and tokens executed."""
        out: list[list[bool]] = []
        flops = tokens = 0
        gen = torch.Generator(device="cpu").manual_seed(seed)
        for chunk in _batched(list(problems), max(1, self.batch_size // group)):
            ids, mask = encode_prompts(self.tok, [p.prompt for p in chunk], self.device)
            ro = sample(model, ids, mask, group=group, max_new_tokens=self.max_new, eos_id=self.tok.eos_token_id,
                        pad_id=self.tok.pad_token_id, temperature=self.temperature, greedy=greedy, generator=gen)
            texts = decode_completions(self.tok, ro)
            for i, p in enumerate(chunk):
                out.append([self.verify(p, texts[i * group + j]) for j in range(group)])
            comps = generate_components(self.shape, [ro.prompt_len] * len(chunk),
                                        [ro.completion_len] * (len(chunk) * group), lora=self.lora,
                                        share_prompt=True, conventions=self.conv)
            flops += sum(comps.values())
            tokens += int(ro.lengths.sum())
        return out, flops, tokens

    @torch.no_grad()
    def evaluate(self, model: Any) -> EvalResult:
        import time

        t0 = time.perf_counter()
        rows: list[dict[str, Any]] = []
        flops = tokens = 0
        was_training = model.training
        model.eval()
        try:
            if self.test:
                res, f, t = self._run(model, self.test, group=1, greedy=True, seed=EVAL_SEED)
                rows.append(self._row("greedy", [r[0] for r in res]))
                flops, tokens = flops + f, tokens + t
            if self.passk:
                res, f, t = self._run(model, self.passk, group=self.s.pass_k, greedy=False, seed=EVAL_SEED + 2)
                rows.append(self._row("pass@k", [any(r) for r in res], k=self.s.pass_k,
                                      pass1=sum(sum(r) for r in res) / (len(res) * self.s.pass_k)))
                flops, tokens = flops + f, tokens + t
            if self.hard:
                res, f, t = self._run(model, self.hard, group=1, greedy=True, seed=EVAL_SEED + 3)
                rows.append(self._row("hard", [r[0] for r in res]))
                flops, tokens = flops + f, tokens + t
        finally:
            model.train(was_training)
        return EvalResult(rows, flops, tokens, time.perf_counter() - t0)

    @staticmethod
    def _row(target: str, correct: list[bool], **extra: Any) -> dict[str, Any]:
        per = [1 if c else 0 for c in correct]
        row = {"target": target, "score": sum(per) / max(1, len(per)), "n": len(per), "per_problem": per}
        row.update(extra)
        return row
