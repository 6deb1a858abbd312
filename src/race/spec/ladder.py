"""A racing grid's ladder: allocation x seed -> the cell of each rung and of the target run.

    rung 0       the grid's cells (``GridSpec.cells``): every allocation x every seed, each
                 read at the study budgets below the first rung (nested)
    rung k > 0   each allocation's first ``race.later_seeds`` seeds, each EXTENDING its run of
                 rung k-1 (``Cell.extends``: its checkpoint resumed with the larger budget)
    target       the continued seeds' runs extended once more, to the target budget; a seed
                 beyond them extends its first-rung run when the study ran one, else starts fresh

Built once per grid spec (``GridSpec.ladder``) and read by the racing driver
(``race.protocol.racing``), the target run (``race.protocol.target``) and the plan's pricing
(``race.grid.race_plan``). Allocations are chosen by their name (``Cell.name``, fixed when the
grid expanded: ``race.spec.cells.name_cells``), what the racing decisions name, and every cell
of an allocation carries that name. Rung budgets come from :meth:`Ladder.budgets` (per
allocation, so that an allocation's first rung may one day sit higher than another's; today
every allocation climbs ``race.rung_budgets()``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from race.spec.cells import Cell, GridLike, allocation_label, cell_data, expand_cells, prefix_refusal
from race.spec.errors import ConfigError, GridSpecError
from race.spec.race import same_budget
from race.spec.run import run_config_from_dict

#: The target cells' store positions start here (x the number of rungs + 1), after every rung's.
TARGET_INDEX = 10_000


def race_cell(spec: GridLike, allocation: dict[str, Any], budget: float, seed: int, *, extends: str | None = None,
              index: int = 0, name: str = "") -> Cell:
    """One cell of a racing grid at ``budget`` (a rung's, or the target's), read at every
    study budget below it (``eval.at_budgets``: the first rung's reads and the rungs below),
    continuing the run ``extends`` (its trajectory's shorter run) when given; ``name``: its
    allocation's name."""
    below = [b for b in spec.budgets if b < budget and not same_budget(b, budget)]
    data = cell_data(spec, allocation, budget, seed, below)
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

    def __init__(self, spec: GridLike):
        race = getattr(spec, "race", None)
        if race is None:
            raise ValueError(f"study {spec.study}: a ladder needs a racing grid (protocol: race with a race: section)")
        self.spec, self.race = spec, race
        self.first: list[Cell] = spec.cells() if hasattr(spec, "cells") else expand_cells(spec)
        #: the allocations' names, in the grid's order
        self.names: list[str] = list(dict.fromkeys(c.name for c in self.first))
        self._allocation = {c.name: c.allocation for c in self.first}
        self._rungs: dict[int, list[Cell]] = {0: self.first}

    @property
    def rungs(self) -> int:
        """How many rungs the race has."""
        return len(self.race.rungs)

    @property
    def continued(self) -> list[int]:
        """The seeds that go on past the first rung (the first ``race.later_seeds`` of the grid's)."""
        return list(self.spec.seeds)[: self.race.later_seeds]

    def budgets(self, name: str | None = None) -> list[float]:
        """The rungs' budgets in FLOPs, ascending, of allocation ``name`` (the same for every
        allocation: ``RaceSettings.rung_budgets``)."""
        return self.race.rung_budgets()

    def check(self, names: Iterable[str]) -> list[str]:
        """``names`` as a list, each an allocation of this grid (else ValueError naming the others)."""
        names = list(names)
        unknown = [n for n in names if n not in self._allocation]
        if unknown:
            raise ValueError(f"{unknown}: not allocations of the racing grid {self.spec.study} "
                             f"(its allocations: {self.names})")
        return names

    def cells(self, rung: int, names: Iterable[str] | None = None) -> list[Cell]:
        """The cells of rung ``rung`` of the allocations ``names`` (all when None), in the grid's order."""
        if rung not in range(self.rungs):
            raise ValueError(f"rung must be in 0..{self.rungs - 1}, got {rung}")
        if rung not in self._rungs:
            before = {(c.name, c.seed): c for c in self.cells(rung - 1)}
            self._rungs[rung] = [
                race_cell(self.spec, c.allocation, self.budgets(c.name)[rung], c.seed, name=c.name,
                          extends=before[(c.name, c.seed)].run_id, index=rung * len(self.first) + c.index)
                for c in self.first if c.seed in self.continued]
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
                out.append(race_cell(self.spec, self._allocation[name], budget, seed, name=name,
                                     extends=parent.run_id if parent else None,
                                     index=TARGET_INDEX * (last + 2) + len(out)))
        return out


__all__ = ["Ladder", "TARGET_INDEX", "race_cell"]
