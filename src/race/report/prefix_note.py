"""What the report says about reading a run's prefix as a shorter run.

Pooling pilot budgets, and nested pilots (``nested: true``: the smaller budgets read at
prefixes of the largest budget's runs), rest on one assumption: a run's score at C FLOPs
does not depend on how much further it was going to train. That holds exactly when the
learning-rate schedule does not depend on the budget (constant, RACE's default): the
built-in engine seeds every step from (seed, step), so the prefix is the shorter run. It
fails with a decaying schedule, whose length is the run's own budget.

The measured comparison is ``benchmarks/prefix_vs_short.py``'s summary, shipped with the
package (``race/report/data/prefix_vs_short.json``, written with ``--json``), so an
installed RACE states the same figures as docs/analysis.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MEASURED = Path(__file__).with_name("data") / "prefix_vs_short.json"


def load_measured(path: str | Path = MEASURED) -> dict[str, Any] | None:
    """The benchmark's summary, or None when the file is absent or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def measured_sentence(measured: dict[str, Any] | None) -> str | None:
    """One sentence with the measured prefix-minus-short-run differences per schedule."""
    if not measured or not measured.get("pooled"):
        return None
    allocs = sorted({c["allocation"] for c in measured.get("comparisons", [])})
    parts = []
    for sch, p in measured["pooled"].items():
        parts.append(f"{sch} learning rate {p['diff']:+.3f} [{p['lo']:+.3f}, {p['hi']:+.3f}] "
                     f"(identical per-problem outcomes in {p['identical']} of {p['n']})")
    gaps = [g["gap"] for g in measured.get("allocation_gaps", [])]
    gap = f"; the allocations differ by {min(gaps):.3f}-{max(gaps):.3f} at those budgets" if gaps else ""
    g = measured.get("short_gain_range")
    if g:
        lo, hi = (0.0 if abs(x) < 5e-4 else x for x in g)  # no "-0.000"
        gap += (f"; the shorter runs gained {lo:+.3f} to {hi:+.3f} over their step-0 score, too little for an "
                "annealing effect to show at this scale")
    return (f"Prefix versus shorter run, measured on real runs (benchmarks/prefix_vs_short.py: "
            f"{', '.join(allocs)}, {len(measured.get('seeds', []))} seeds, {measured.get('problems')} problems, "
            f"prefixes of a {4 * measured['budget_B']:.3g}-FLOP run against runs of {measured['budget_B']:.3g} and "
            f"{2 * measured['budget_B']:.3g} at equal counted FLOPs, reward {measured.get('reward', 'rule')}, "
            f"{measured.get('target', 'greedy')} accuracy): "
            f"prefix minus shorter run {'; '.join(parts)}{gap}. Comparing budgets (and nested pilots) assumes a "
            "constant learning rate: with a decaying one a shorter run anneals sooner and is not a prefix.")


def study_sentence(runs: Any) -> str | None:
    """Where this study's own runs are prefixes (a nested grid), say so."""
    if runs is None or "prefix_of" not in getattr(runs, "columns", ()):
        return None
    from .doc import is_prefix

    mask = is_prefix(runs)
    k = int(mask.sum())
    if not k:
        return None
    budgets = sorted({float(b) for b in runs.loc[mask, "budget"]})
    return (f"{k} of {len(runs)} runs of this study are prefixes of a larger budget's run (nested: true), read "
            f"where a run of budget {', '.join(f'{b:.3g}' for b in budgets)} would have stopped; at a constant "
            "learning rate they are those runs, not an approximation of them.")


__all__ = ["MEASURED", "load_measured", "measured_sentence", "study_sentence"]
