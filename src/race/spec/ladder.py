"""A racing grid's ladder: allocation x seed -> the cell of each rung and of the target run.

    (a rung's run evaluates ``race.pilot_targets``, by default the primary target only: what
    the decisions read; the target run evaluates every target of the grid's ``eval:``)

    rung 0       every allocation x every seed at its first-rung budget (the schedule's
                 ``budget_of(name, 0)``: the rung's, or higher where the allocation's step floor
                 needs it), each read at the study budgets below it (nested)
    rung k > 0   each allocation's first ``race.later_seeds`` seeds, each EXTENDING its run of
                 rung k-1 (``Cell.extends``: its checkpoint resumed with the larger budget); where
                 an allocation's floor spans two rungs its run there is the same cell
    target       the continued seeds' runs extended once more, to the target budget; a seed
                 beyond them extends its first-rung run when the study ran one, else starts fresh

Built by ``GridSpec.ladder(schedule)`` and read by the racing driver (``race.protocol.racing``),
the target run (``race.protocol.target``) and the plan's pricing (``race.grid.race_plan``).
The rung budgets come from the study's schedule (a :class:`race.spec.rungs.RungSchedule`, per
allocation) or, for a grid that lists its rungs and has no schedule yet, from ``race.rungs``.
Allocations are chosen by their name (``Cell.name``, fixed when the grid expanded:
``race.spec.cells.name_cells``), what the racing decisions name.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from race.spec.cells import Cell, GridLike, allocation_label, cell_data, expand_cells, prefix_refusal
from race.spec.errors import ConfigError, GridSpecError
from race.spec.race import same_budget
from race.spec.run import run_config_from_dict

if TYPE_CHECKING:
    from race.spec.rungs import RungSchedule

#: The target cells' store positions start here (x the number of rungs + 1), after every rung's.
TARGET_INDEX = 10_000


def race_cell(spec: GridLike, allocation: dict[str, Any], budget: float, seed: int, *, extends: str | None = None,
              index: int = 0, name: str = "", reads: Sequence[float] | None = None,
              targets: Sequence[str] | None = None) -> Cell:
    """One cell of a racing grid at ``budget`` (a rung's, or the target's), read at ``reads``
    (``eval.at_budgets``; default every study budget below it: the first rung's reads and the
    listed rungs below), continuing the run ``extends`` (its trajectory's shorter run) when
    given; ``name``: its allocation's name; ``targets``: the evaluation targets (default the
    grid's: a pilot evaluates fewer, ``race.pilot_targets``)."""
    below = ([b for b in spec.budgets if b < budget and not same_budget(b, budget)] if reads is None
             else sorted(b for b in set(reads) if b < budget and not same_budget(b, budget)))
    data = cell_data(spec, allocation, budget, seed, below)
    if targets is not None:
        data["eval"] = {**(data.get("eval") or {}), "targets": list(targets)}
    where = f"cell [{allocation_label(allocation)} budget={budget:.3g} seed={seed}]"
    try:
        cfg = run_config_from_dict(data, source=where)
    except ConfigError as e:
        raise GridSpecError(str(e)) from None
    why = prefix_refusal(cfg, racing=True)
    if why:
        raise GridSpecError(f"{where}: protocol: race, but {why}")
    return Cell(index=index, run_id=cfg.run_id(), config=cfg, allocation=allocation, extends=extends, name=name)


class Ladder:
    """The cells of a racing grid (module docstring); each rung's built once, when first asked."""

    def __init__(self, spec: GridLike, schedule: "RungSchedule | None" = None):
        race = getattr(spec, "race", None)
        if race is None:
            raise ValueError(f"study {spec.study}: a ladder needs a racing grid (protocol: race with a race: section)")
        if schedule is None and not race.explicit:
            raise ValueError(f"study {spec.study}: rungs: auto: the ladder needs the study's schedule "
                             "(race.protocol.racing.race_schedule, stored when the race starts)")
        self.spec, self.race, self.schedule = spec, race, schedule
        self.expanded: list[Cell] = spec.cells() if hasattr(spec, "cells") else expand_cells(spec)
        #: the allocations' names, in the grid's order
        self.names: list[str] = list(dict.fromkeys(c.name for c in self.expanded))
        self._allocation = {c.name: c.allocation for c in self.expanded}
        self._reads = [float(b) for b in spec.budgets]
        self._rungs: dict[int, list[Cell]] = {}
        first = self.expanded[0].config.eval.targets if self.expanded else []
        #: what a rung's run evaluates (race.pilot_targets, default the primary target)
        self.pilot_targets: list[str] = list(race.pilot_targets or first[:1])

    @property
    def rungs(self) -> int:
        """How many rungs the race has."""
        return len(self.schedule.budgets) if self.schedule is not None else len(self.race.rungs)

    @property
    def continued(self) -> list[int]:
        """The seeds that go on past the first rung (the first ``race.later_seeds`` of the grid's)."""
        return list(self.spec.seeds)[: self.race.later_seeds]

    def budgets(self, name: str | None = None) -> list[float]:
        """The rungs' budgets in FLOPs of allocation ``name`` (the schedule's ladder: its first rung
        raised where its step floor needs it); without a name, the common rung budgets."""
        if self.schedule is None:
            return self.race.rung_budgets()
        return list(self.schedule.budgets) if name is None else self.schedule.ladder(name)

    def _reads_below(self, name: str, rung: int) -> list[float]:
        """Where a rung-``rung`` cell of ``name`` is also read: the study's reads below its first
        rung (nested) and its own budgets at the rungs below."""
        own = self.budgets(name)
        return [b for b in self._reads if b < own[0] * (1 - 1e-9)] + own[:rung]

    def check(self, names: Iterable[str]) -> list[str]:
        """``names`` as a list, each an allocation of this grid (else ValueError naming the others)."""
        names = list(names)
        unknown = [n for n in names if n not in self._allocation]
        if unknown:
            raise ValueError(f"{unknown}: not allocations of the racing grid {self.spec.study} "
                             f"(its allocations: {self.names})")
        return names

    def cells(self, rung: int, names: Iterable[str] | None = None) -> list[Cell]:
        """The cells of rung ``rung`` of the allocations ``names`` (all when None), in the grid's
        order; an allocation whose budget does not grow from the rung before keeps that cell."""
        if rung not in range(self.rungs):
            raise ValueError(f"rung must be in 0..{self.rungs - 1}, got {rung}")
        if rung not in self._rungs:
            if rung == 0:
                self._rungs[0] = [race_cell(self.spec, c.allocation, self.budgets(c.name)[0], c.seed, name=c.name,
                                            index=c.index, reads=self._reads_below(c.name, 0),
                                            targets=self.pilot_targets) for c in self.expanded]
            else:
                before = {(c.name, c.seed): c for c in self.cells(rung - 1)}
                out = []
                for c in self.expanded:
                    if c.seed not in self.continued:
                        continue
                    prev, own = before[(c.name, c.seed)], self.budgets(c.name)[rung]
                    out.append(prev if own <= prev.budget * (1 + 1e-9) else
                               race_cell(self.spec, c.allocation, own, c.seed, name=c.name, extends=prev.run_id,
                                         index=rung * len(self.expanded) + c.index,
                                         reads=self._reads_below(c.name, rung), targets=self.pilot_targets))
                self._rungs[rung] = out
        if names is None:
            return list(self._rungs[rung])
        keep = set(self.check(names))
        return [c for c in self._rungs[rung] if c.name in keep]

    def target_cells(self, names: Sequence[str], budget: float, seeds: Sequence[int] | None = None) -> list[Cell]:
        """The target runs at ``budget`` of the allocations ``names``, in that order: each
        continued seed's run extends its last-rung run; each seed of ``seeds`` beyond them
        extends its first-rung run when the study ran one, else starts fresh."""
        last = self.rungs - 1
        out: list[Cell] = []
        for name in self.check(names):
            first = {c.seed: c for c in self.cells(0, [name])}
            top = {c.seed: c for c in self.cells(last, [name])}
            for seed in [*self.continued, *[s for s in (seeds or []) if s not in self.continued]]:
                parent = top.get(seed) if seed in self.continued else first.get(seed)
                reads = (self._reads_below(name, last + 1) if seed in self.continued
                         else None if self.schedule is None else self._reads_below(name, 1))
                out.append(race_cell(self.spec, self._allocation[name], budget, seed, name=name,
                                     extends=parent.run_id if parent else None,
                                     index=TARGET_INDEX * (last + 2) + len(out), reads=reads))
        return out


__all__ = ["Ladder", "TARGET_INDEX", "race_cell"]
