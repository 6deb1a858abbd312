"""Rungs sized by the grid and the cap: the schedule a racing study runs (standard library only).

A racing study runs its K allocations in rungs toward the target budget T. Rung 0 runs every
allocation with ``first_seeds`` seeds; each later rung extends the runs of the allocations
that go on (their first ``later_seeds`` seeds: a continued run costs its final budget once);
after the last rung the pick's continued run becomes the target run, so the last rung's
budget is compute the target run reuses. The pilots it does not reuse are capped at
``cap`` x T.

**Geometry (successive halving).** ``keep[j]`` allocations are ranked onto rung j:
``keep[0] = K``, ``keep[L] = keep_last`` (>= 2, so the last rung still races), geometric in
between over ``L = ceil(log(K / keep_last) / log(eta))`` cuts. The rung budgets are geometric
from ``b_0`` to ``b_L = last x T``; ``b_0`` is the largest first rung whose worst-case
unreused compute fits the cap (:func:`choose_schedule`). More allocations, a tighter cap or
more first-rung seeds push the first rung down; the last rung never loses its race.

**Step floor.** An allocation is measured once its runs have taken ``warmup + floor`` optimizer
steps (``min_budgets``: that many steps x its step cost). At a rung below that minimum it runs
to its minimum instead (:meth:`RungSchedule.budget_of`) and is judged there, beside the others
at the rung's budget: it is never stopped before it has been measured, and it is judged with
the little extra compute its floor took.

**Cost (worst case).** ``pilots = s sum_k b_k0 + sum_{j>=1} l (the keep[j] largest b_kj - b_k,j-1)``
with ``s`` first-rung seeds, ``l`` later seeds and ``b_kj`` allocation k's budget at rung j;
``reused = l b_L``; ``unreused = pilots - reused``. Budgets are budgets: a run spends at most
its budget, so the realised compute is at most this.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

#: budgets closer than this (relative) are the same budget
RTOL = 1e-9
#: candidate first rungs tried between the least first rung and the last rung (log-spaced), then bisected
_GRID = 120


class ScheduleError(ValueError):
    """No schedule fits: the message says what to cut or what cap would fit."""


@dataclass(frozen=True)
class RungSchedule:
    """A racing schedule: rung budgets, how many allocations are ranked onto each, the floor."""

    target_budget: float
    budgets: tuple[float, ...]  # FLOPs, ascending; the last is the pick's pilot at the end of the race
    keep: tuple[int, ...]  # allocations ranked onto each rung (keep[0] = every allocation)
    first_seeds: int = 2
    later_seeds: int = 1
    min_budgets: Mapping[str, float] = field(default_factory=dict)  # allocation -> budget of warmup + floor steps
    cap: float | None = 0.9  # unreused pilot compute / T at most (None: no cap)

    def __post_init__(self) -> None:
        b = list(self.budgets)
        if not b or any(not (x > 0 and math.isfinite(x)) for x in b) or any(y <= x for x, y in zip(b, b[1:])):
            raise ValueError(f"rung budgets must be positive and increasing, got {b}")
        if b[-1] > self.target_budget * (1 + RTOL):
            raise ValueError(f"the last rung {b[-1]:.3g} is beyond the target budget {self.target_budget:.3g}")
        if len(self.keep) != len(b) or any(k < 1 for k in self.keep) or any(y > x for x, y in zip(self.keep, self.keep[1:])):
            raise ValueError(f"keep must give a non-increasing count >= 1 per rung ({len(b)} rungs), got {self.keep}")
        if not 1 <= self.later_seeds <= self.first_seeds:
            raise ValueError(f"need 1 <= later_seeds <= first_seeds, got {self.later_seeds} and {self.first_seeds}")

    @property
    def allocations(self) -> int:
        return self.keep[0]

    @property
    def fractions(self) -> tuple[float, ...]:
        return tuple(b / self.target_budget for b in self.budgets)

    def budget_of(self, name: str, rung: int) -> float:
        """Allocation ``name``'s budget at rung ``rung``: the rung's, or its step floor's where that
        lies above (it runs until it has its warmup + floor steps, then is judged), never beyond
        the last rung."""
        return min(max(self.budgets[rung], self.min_budgets.get(name, 0.0)), self.budgets[-1])

    def ladder(self, name: str) -> list[float]:
        """``name``'s budget at every rung (repeats where its floor spans several rungs)."""
        return [self.budget_of(name, j) for j in range(len(self.budgets))]

    def unmeasured(self) -> list[str]:
        """Allocations whose floor lies beyond the last rung: never measured by the race."""
        return sorted(a for a, b in self.min_budgets.items() if b > self.budgets[-1] * (1 + RTOL))

    def cost(self) -> dict[str, float]:
        """Worst-case pilot compute (module docstring), in FLOPs and in units of T: every
        allocation's first rung at its own budget, then at each later rung the ``keep[j]``
        largest extensions."""
        K, s, l_ = self.keep[0], self.first_seeds, self.later_seeds
        named = list(self.min_budgets)[:K]
        ladders = [self.ladder(a) for a in named] + [list(self.budgets)] * (K - len(named))
        pilots = s * sum(lad[0] for lad in ladders)
        for j in range(1, len(self.budgets)):
            steps = sorted((lad[j] - lad[j - 1] for lad in ladders), reverse=True)
            pilots += l_ * sum(steps[: self.keep[j]])
        reused = l_ * self.budgets[-1]
        T = self.target_budget
        return {"pilots": pilots, "reused": reused, "unreused": pilots - reused, "pilots_T": pilots / T,
                "reused_T": reused / T, "unreused_T": (pilots - reused) / T}

    def fits(self) -> bool:
        return self.cap is None or self.cost()["unreused_T"] <= self.cap * (1 + 1e-9)

    def as_dict(self) -> dict:
        return {"target_budget": self.target_budget, "budgets": list(self.budgets), "fractions": list(self.fractions),
                "keep": list(self.keep), "first_seeds": self.first_seeds,
                "later_seeds": self.later_seeds, "min_budgets": dict(self.min_budgets), "cap": self.cap,
                **self.cost()}


def schedule_from_dict(d: Mapping[str, object]) -> RungSchedule:
    """A :class:`RungSchedule` from its :meth:`RungSchedule.as_dict` (as a store keeps it)."""
    return RungSchedule(float(d["target_budget"]), tuple(float(b) for b in d["budgets"]),  # type: ignore[union-attr]
                        tuple(int(k) for k in d["keep"]), int(d["first_seeds"]), int(d["later_seeds"]),  # type: ignore
                        {str(a): float(b) for a, b in dict(d.get("min_budgets") or {}).items()},  # type: ignore
                        None if d.get("cap") is None else float(d["cap"]))  # type: ignore[arg-type]


def keep_counts(k: int, keep_last: int = 2, eta: float = 3.0) -> tuple[int, ...]:
    """Allocations ranked onto each rung: ``k`` first, ``min(k, keep_last)`` last, geometric in
    between over ``ceil(log(k / keep_last) / log(eta))`` cuts (each count strictly below the last)."""
    if k < 1 or keep_last < 1 or not eta > 1:
        raise ValueError(f"need k >= 1, keep_last >= 1 and eta > 1, got {k}, {keep_last}, {eta}")
    last = min(k, keep_last)
    if k == last:
        return (k,)
    cuts = max(1, math.ceil(math.log(k / last) / math.log(eta) - 1e-9))
    out = [k]
    for j in range(1, cuts):
        out.append(max(last + 1, min(out[-1] - 1, int(round(k * (last / k) ** (j / cuts))))))
    out.append(last)
    return tuple(out)


def geometric_rungs(first: float, last: float, n: int) -> tuple[float, ...]:
    """``n`` budgets from ``first`` to ``last``, evenly spaced in log FLOPs."""
    if n == 1:
        return (last,)
    return tuple(first * (last / first) ** (j / (n - 1)) for j in range(n))


def choose_schedule(names: Sequence[str] | int, target_budget: float, *, cap: float | None = 0.9,
                    first_seeds: int = 2, later_seeds: int = 1, last: float = 1 / 3, eta: float = 3.0,
                    keep_last: int = 2, min_budgets: Mapping[str, float] | None = None,
                    least_budget: float = 0.0, strict: bool = True) -> RungSchedule:
    """The racing schedule for these allocations (module docstring): the largest first rung
    whose worst-case unreused compute fits ``cap`` x T, at or above ``least_budget`` (e.g. one
    step of the costliest allocation). Raises :class:`ScheduleError` saying what would fit;
    ``strict=False`` returns the schedule at the least first rung instead (it does not fit:
    ``fits()`` says so; a benchmark's worlds where nothing could)."""
    K = names if isinstance(names, int) else len(names)
    if K < 1:
        raise ScheduleError("a racing study needs at least one allocation")
    if not 0 < last < 1:
        raise ValueError(f"last must be a fraction of the target budget in (0, 1), got {last!r}")
    T, b_last = float(target_budget), float(last) * float(target_budget)
    keep = keep_counts(K, keep_last, eta)
    mins = {str(a): float(b) for a, b in (min_budgets or {}).items()}
    never = sorted(a for a, b in mins.items() if b > b_last * (1 + RTOL))
    if never and strict:
        raise ScheduleError(
            f"{len(never)} allocation(s) would not reach their step floor even at the last rung ({b_last:.3g} FLOPs, "
            f"{last:.3g} T): {', '.join(never[:3])}{', ...' if len(never) > 3 else ''} need "
            f"{max(mins[a] for a in never):.3g}; raise the target budget, make their steps cheaper (fewer prompts or "
            "completions per step), shorten their warmup, or lower race.rule.floor_steps")

    def schedule(b0: float) -> RungSchedule:
        return RungSchedule(T, geometric_rungs(b0, b_last, len(keep)), keep, first_seeds, later_seeds, mins, cap)

    lo = max(float(least_budget), b_last * 1e-4)
    if len(keep) == 1 or lo >= b_last:
        s = schedule(b_last if len(keep) == 1 else lo)
        if (s.fits() and len(keep) == 1) or not strict:
            return s
        raise _infeasible(s, K, cap, first_seeds)
    grid = [b for b in (lo * (b_last / lo) ** (i / _GRID) for i in range(_GRID + 1)) if b < b_last * (1 - 1e-6)]
    ok = [i for i, b in enumerate(grid) if schedule(b).fits()]
    if not ok:
        if not strict:
            return schedule(lo)
        raise _infeasible(schedule(lo), K, cap, first_seeds)
    a = grid[ok[-1]]
    b = grid[ok[-1] + 1] if ok[-1] + 1 < len(grid) else b_last * (1 - 1e-6)
    for _ in range(30):  # the cost is continuous and increasing in b0 between two grid points: bisect to the edge
        m = (a * b) ** 0.5
        a, b = (m, b) if schedule(m).fits() else (a, m)
    return schedule(a)


def _infeasible(least: RungSchedule, k: int, cap: float | None, first_seeds: int) -> ScheduleError:
    c = least.cost()
    fits = 0
    for kk in range(k - 1, 0, -1):
        try:
            s = RungSchedule(least.target_budget, least.budgets[-1:] if kk <= least.keep[-1] else
                             geometric_rungs(least.budgets[0], least.budgets[-1], len(keep_counts(kk, least.keep[-1]))),
                             keep_counts(kk, least.keep[-1]), least.first_seeds, least.later_seeds, {}, cap)
        except ValueError:
            continue
        if s.fits():
            fits = kk
            break
    floor = least.unmeasured()
    why = (f"{len(floor)} allocation(s) would not reach their step floor even at the last rung ({', '.join(floor[:3])}"
           f"{', ...' if len(floor) > 3 else ''}): raise the target budget or make their steps cheaper; " if floor else "")
    return ScheduleError(
        f"{k} allocations do not fit the racing cap: at the least first rung ({least.budgets[0]:.3g} FLOPs) the pilots "
        f"would leave {c['unreused_T']:.2f} T unreused against the cap of {cap:g} T. {why}Raise the cap "
        f"(race.rule.max_unreused) to >= {c['unreused_T']:.2f}, cut the grid to <= {fits} allocation(s)"
        + (", or run 1 seed on the first rung (seeds:)" if first_seeds > 1 else "") + ".")


__all__ = ["RungSchedule", "ScheduleError", "choose_schedule", "geometric_rungs", "keep_counts", "schedule_from_dict"]
