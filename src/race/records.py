"""One run record: a run's summary, built by one function from its rows. Standard library only.

A run's summary (``run.json``'s ``steps``, ``total_flops``, ``phase_flops``, ``initial``,
``final`` and ``diagnostics``) has one author, :func:`run_record`, whoever holds the rows:

- the engine, when it finishes a run (``race.engines.common.RunDir.finish``: its ledger and
  metrics);
- the study store, when it writes a nested or extended run's prefix at a smaller budget
  (``race.grid.store``: the stored rows up to the prefix's step, ``upto_step``);
- the tables loader (``race.grid.tables.load_tables``: the FLOP split and the diagnostics
  columns of each stored run).

Rows are plain mappings: evaluations ``{"step", "flops", "target", "score"}``, training
rows ``{"step", "flops", <metric>: value, ...}``, ledger rows ``{"step", "phase", "flops",
"counted"}`` (the layouts of ``race.schema`` and docs/run-format.md).

One over-optimisation rule (:func:`overoptimisation`): the proxy (training) reward rises
while the verified score falls, each a least-squares slope against x = FLOPs / the run's
largest FLOPs (so a slope is the change over the whole run, in score units), flagged when
the proxy slope exceeds :data:`OVEROPTIMISATION_THRESHOLD` and the verified slope is below
minus it. The engine writes its verdict into run.json for a learned reward; the report's
diagnostics (``race.analysis.overoptimisation``) apply the same function to the study's
tables.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from race.accounting.ledger import KNOWN_PHASES

#: The phases a run's ledger records (warm starts are the base's), each in ``phase_flops``.
RUN_PHASES = tuple(p for p in KNOWN_PHASES if p != "warmstart")
#: The training metrics whose run means are the record's diagnostics.
MEAN_METRICS = ("zero_var_frac", "trunc_rate", "reward_mean", "verified_mean")
#: Slope (score units over the whole run) beyond which a trend counts as a trend.
OVEROPTIMISATION_THRESHOLD = 0.02
#: Fewest points a slope is fitted on.
MIN_SLOPE_POINTS = 3


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ``ys`` on ``xs``; NaN with fewer than :data:`MIN_SLOPE_POINTS`
    finite points or no spread in x."""
    pts = [(float(x), float(y)) for x, y in zip(xs, ys) if math.isfinite(float(x)) and math.isfinite(float(y))]
    if len(pts) < MIN_SLOPE_POINTS:
        return math.nan
    n = len(pts)
    mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return math.nan
    return sum((x - mx) * (y - my) for x, y in pts) / sxx


def overoptimisation(proxy: Iterable[tuple[float, float]], verified: Iterable[tuple[float, float]], *,
                     threshold: float = OVEROPTIMISATION_THRESHOLD, from_fraction: float = 0.0) -> dict[str, Any]:
    """The over-optimisation rule (module docstring) on one run's ``(flops, value)`` pairs of
    the proxy reward and of the verified score. x = flops / the largest flops of both series;
    points with x >= ``from_fraction`` count. Returns ``flag``, ``proxy_slope``,
    ``verified_slope`` (NaN where too few points) and ``threshold``."""
    p, v = list(proxy), list(verified)
    top = max((f for f, _ in p + v if math.isfinite(float(f))), default=math.nan)
    slopes = []
    for series in (p, v):
        if not series or not math.isfinite(top) or top <= 0:
            slopes.append(math.nan)
            continue
        kept = [(f / top, y) for f, y in series if f / top >= from_fraction]
        slopes.append(slope([x for x, _ in kept], [y for _, y in kept]))
    ps, vs = slopes
    return {"flag": overoptimised(ps, vs, threshold), "proxy_slope": ps, "verified_slope": vs, "threshold": threshold}


def overoptimised(proxy_slope: float, verified_slope: float, threshold: float = OVEROPTIMISATION_THRESHOLD) -> bool:
    """The rule's verdict on two slopes: the proxy rose beyond ``threshold`` and the verified
    score fell beyond it (a slope that could not be fitted, NaN or None, flags nothing)."""
    ok = all(isinstance(x, (int, float)) and math.isfinite(x) for x in (proxy_slope, verified_slope))
    return bool(ok and proxy_slope > threshold and verified_slope < -threshold)


@dataclass(frozen=True)
class RunRecord:
    """A run's summary (module docstring); :meth:`as_dict` gives run.json's fields."""

    steps: int  # optimizer steps charged
    total_flops: float  # counted FLOPs (what the budget was charged)
    phase_flops: dict[str, float]  # FLOPs per phase, counted or not; every RUN_PHASES key present
    initial: dict[str, float]  # target -> score at step 0
    final: dict[str, float]  # target -> score at the last evaluated step
    diagnostics: dict[str, Any] = field(default_factory=dict)  # MEAN_METRICS means + "overoptimisation"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _upto(rows: Iterable[Mapping[str, Any]], step: int | None) -> list[Mapping[str, Any]]:
    return [r for r in rows if step is None or int(r["step"]) <= step]


def run_record(*, evals: Iterable[Mapping[str, Any]], train: Iterable[Mapping[str, Any]],
               ledger: Iterable[Mapping[str, Any]], upto_step: int | None = None, steps: int | None = None,
               learned: bool = False, target: str = "greedy") -> RunRecord:
    """The summary of one run from its rows (module docstring), of its prefix up to step
    ``upto_step`` when given. ``steps``: the steps charged, where the caller counted them
    (an engine's step counter); else ``upto_step``, else the last step with counted ledger
    rows. ``learned``: the reward is a learned model's, so the record carries the
    over-optimisation verdict on ``target`` (else ``None``)."""
    ev, tr, led = _upto(evals, upto_step), _upto(train, upto_step), _upto(ledger, upto_step)
    phases: dict[str, float] = {p: 0 for p in RUN_PHASES}
    total: float = 0
    charged = 0
    for r in led:
        phases[r["phase"]] = phases.get(r["phase"], 0) + r["flops"]
        if r.get("counted", True):
            total += r["flops"]
            charged = max(charged, int(r["step"]))
    last = max((int(r["step"]) for r in ev), default=0)
    initial = {r["target"]: r["score"] for r in ev if int(r["step"]) == 0}
    final = {r["target"]: r["score"] for r in ev if int(r["step"]) == last}

    def mean(key: str) -> float:
        vals = [r[key] for r in tr if r.get(key) is not None]
        return sum(vals) / len(vals) if vals else 0.0

    diag: dict[str, Any] = {m: mean(m) for m in MEAN_METRICS}
    diag["overoptimisation"] = overoptimisation(
        [(r["flops"], r["reward_mean"]) for r in tr if r.get("reward_mean") is not None],
        [(r["flops"], r["score"]) for r in ev if r["target"] == target]) if learned else None
    if diag["overoptimisation"] is not None:  # JSON-able: a slope that could not be fitted is None
        oo = diag["overoptimisation"]
        oo.update({k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in oo.items()}, target=target)
    steps = steps if steps is not None else upto_step if upto_step is not None else charged
    return RunRecord(steps=int(steps), total_flops=total, phase_flops=phases, initial=initial, final=final,
                     diagnostics=diag)


__all__ = ["MEAN_METRICS", "MIN_SLOPE_POINTS", "OVEROPTIMISATION_THRESHOLD", "RUN_PHASES", "RunRecord",
           "overoptimisation", "overoptimised", "run_record", "slope"]
