"""The drop-in ledger's files and budget decisions, on one process or many.

One process: ``ledger.jsonl`` carries the budget, as before.

Several (DDP / DeepSpeed through accelerate, ``torch.distributed`` initialised): each rank
keeps ``ledger.rank<r>.jsonl`` with what ITS hooks saw, and every step the ranks exchange
their per-key FLOPs, tokens and seconds (one ``all_gather_object``). Every rank then holds
the same global ledger (sum of the ranks' FLOPs and tokens per key; the largest rank's
seconds, the ranks running side by side), the main process writes it to ``ledger.jsonl``,
and the budget is charged and the stop decided from the GLOBAL total on every rank from
the same numbers, so all ranks stop after the same optimizer step. The step bound is the
sum of the ranks' bounds. On resume the main process's global ledger is broadcast to the
others. NCCL and gloo both carry these collectives (gloo is tested on CPU).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from race.accounting import BudgetGuard, FlopLedger
from race.accounting.errors import AccountingError
from race.accounting.guard import counted, record_overrun_step

Step = tuple[dict[str, int], dict[str, int], dict[str, float]]


def world(args: Any = None) -> tuple[int, int]:
    """(rank, world size) of ``torch.distributed`` (``(0, 1)`` when not initialised). A
    config that says ``world_size > 1`` without a process group is refused."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if args is not None and int(getattr(args, "world_size", 1)) > 1:
        raise AccountingError(f"world_size={args.world_size} but torch.distributed is not initialised: launch with "
                              "accelerate launch / torchrun so the ranks can share the ledger")
    return 0, 1


def _merge(parts: list[Step]) -> Step:
    comps: dict[str, int] = {}
    tokens: dict[str, int] = {}
    seconds: dict[str, float] = {}
    for c, t, s in parts:
        for k, v in c.items():
            comps[k] = comps.get(k, 0) + int(v)
        for k, v in t.items():
            tokens[k] = tokens.get(k, 0) + int(v)
        for k, v in s.items():
            seconds[k] = max(seconds.get(k, 0.0), float(v))
    return comps, tokens, seconds


class RunLedgers:
    """The global ledger (``ledger``: budget, logs, report card) and, with several
    processes, this rank's (``rank_ledger``). See the module docstring."""

    def __init__(self, out: Path, budget: float | None, *, resume_step: int, args: Any = None) -> None:
        self.rank, self.world = world(args)
        self.rank_ledger: FlopLedger | None = None
        self.rank_flops = [0] * self.world  # counted FLOPs per rank since this (re)start: the imbalance logs
        self.rank_seconds = [0.0] * self.world
        if self.world == 1:
            self.ledger = FlopLedger(out / "ledger.jsonl", budget=budget)
            self.ledger.truncate_after(resume_step)  # a resumed run drops what came after its checkpoint
            return
        self.rank_ledger = FlopLedger(out / f"ledger.rank{self.rank}.jsonl")
        self.rank_ledger.truncate_after(resume_step)
        self.ledger = FlopLedger(out / "ledger.jsonl" if self.rank == 0 else None, budget=budget)
        self.ledger.truncate_after(resume_step)
        import torch.distributed as dist

        box = [self.ledger.records if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        if self.rank != 0:
            self.ledger.extend(box[0] or [], enforce_budget=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def _gather(self, part: Step, parts_out: list | None = None) -> Step:
        if self.world == 1:
            if parts_out is not None:
                parts_out.append(part)
            return part
        import torch.distributed as dist

        parts: list[Any] = [None] * self.world
        dist.all_gather_object(parts, part)
        if parts_out is not None:
            parts_out.extend(parts)
        return _merge(parts)

    def commit(self, step: int, comps: dict[str, int], tokens: dict[str, int], seconds: dict[str, float],
               guard: BudgetGuard) -> int:
        """Charge one optimizer step (every rank's share) through ``guard`` (the run's, over
        the global ledger). Returns 0, or the FLOPs recorded as ``overrun`` when
        the budget could not take the step (the same on every rank); ``executed/*`` records
        (never charged) stay as they are."""
        parts: list[Step] = []
        g = self._gather((comps, tokens, seconds), parts)
        for r, (c, _, s) in enumerate(parts):
            self.rank_flops[r] += counted(c)
            self.rank_seconds[r] += sum(s.values())
        over = guard.charge(step, g[0], tokens=g[1], seconds=g[2])
        if over:
            if self.rank_ledger is not None:
                record_overrun_step(self.rank_ledger, step, comps, tokens=tokens, seconds=seconds)
            return over
        if self.rank_ledger is not None:
            self.rank_ledger.add_components(step, comps, tokens=tokens, seconds=seconds)
        return 0

    def record_uncounted(self, step: int, comps: dict[str, int]) -> None:
        """Uncounted records (TRL's evaluation), gathered like a step. Every rank calls it."""
        g = self._gather((comps, {}, {}))
        if g[0]:
            self.ledger.add_components(step, g[0])
        if comps and self.rank_ledger is not None:
            self.rank_ledger.add_components(step, comps)

    def global_bound(self, bound: int) -> int:
        """The next step's bound over all ranks (the sum of theirs)."""
        if self.world == 1:
            return bound
        return sum(self._gather(({"bound": int(bound)}, {}, {}))[0].values())


__all__ = ["RunLedgers", "world"]
