"""The update share p = C_learning / C_total: the seed study's control variable, measured.

Per run, from its ledger's counted FLOPs (the runs table's phase sums): learning = update +
old-policy + reference log-probs, search = rollout, feedback = reward, and

    p = learning / (search + learning + feedback),   p_policy = learning / (search + learning)

(``p_policy`` leaves the reward model's share out: where two reward systems' best p differ
but their best p_policy agree, the shift is the RM's own share). A nested study's prefix
rows carry their own sums, so each budget reads the p of the run up to that budget.

A *line* is the allocations that differ only in the knobs that move p at equal FLOPs
(:data:`KNOBS`: ``num_iterations``, ``steps_per_generation`` and the batch settings that go
with it, ``num_update_generations``: the rollouts per prompt the update trains on, PODS's m
of the group's n), so one line holds one model, group size (rollouts generated), update
selection and reward system. Where an allocation sets ``num_update_generations``, its group
size is a knob of the line too (:func:`line_names`): generating more rollouts per prompt
while the update trains on the same m is PODS's search-heavy direction, the one way below
``p`` at m = 2 of n; an allocation that leaves m unset trains on its whole group, so there
the group size stays in the line's name (a group-size study is not an update-share line).
Reward systems are written as the spec writes them (the spec as written:
``rule:outcome``, ``prm:prm-m:min+outcome``). Per budget and line, each allocation is a point
(p, score): p the mean over its seeds, the score read at equal
counted FLOPs (``final_scores(at="equal")``) with the study's joint replicates
(:func:`race.analysis.joint.draw_replicates`: one draw of the problems shared by every
cell, seeds drawn per allocation with the small-sample correction), so every interval and
every difference is paired. The best p of a reward system at a budget (:func:`best_share`) is
found as the seed study's RACE finds it:

1. a local response: the quadratic ``score = c2 p^2 + c1 p + c0`` through the line's points
   (least squares, >= 4 distinct p: three give a parabola through three points, which
   cannot say where between them the optimum lies, as for the isoFLOP profiles), refitted
   on every replicate; its vertex is **located** when the point fit opens downward with its
   vertex inside the p range tried, at least 90% of the replicates have a maximum, the
   vertex's interval stays inside the range, and the model-free call below locates the best
   inside the range too (the score falls beyond the noise on both sides: the fit may refine
   a location, never make one from its shape alone);
2. otherwise the **pilot-best fallback**: the allocation with the best score; where it has
   tried p on both sides (**bracketed**: its nearest neighbours' p, by position only; whether
   they score below it beyond the noise is the model-free call's question), not located; at
   the smallest or largest p tried it sits on the grid's edge.

The regime, in the seed's terms (:class:`Regime`): the split at the best p (the located
vertex's, with the search/feedback split of the nearest allocation; or the pilot best's)
is **update-heavy** when learning takes at least half the FLOPs, else **search-heavy** or
**feedback-heavy** by the larger of rollout and reward; **not identified** when no
allocation of the line scores below the best one beyond the noise (every paired interval
of best - other covers 0: the response in p is flat within the pilots' resolution), or when
the best allocation of the regime so called does not score above the best allocation of
another regime tried beyond the noise (:func:`regime_ties`: a call its intervals do not
support is not made).
Regime labels are one type, :class:`Regime`, as the recommendation's labels are one type in
``race.analysis.decision``.

Beside the fit, each line gets the model-free call of :mod:`race.analysis.share_optimum`, in
p and in p_policy (``BestShare.in_p``, ``BestShare.in_p_policy``): **located** inside the range
where the response falls beyond the noise on both sides of every plausibly best point,
**flat** where no two points differ by more than a margin at the intervals' bound, else on an
edge or not resolved.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .bootstrap import BootstrapResult, difference
from .curves import final_scores
from .joint import draw_replicates, study_matrix
from .share_optimum import FLAT_MARGIN, MIN_VALID, Call, Located, locate_best, vertex_fit
from .tables import extra_allocation_columns, prepare_runs, require_columns, table_names, without_controls

#: p values closer than this are one p level (the same knob setting, other seeds' groups dropped).
SAME_P = 0.005
#: The knobs a line sweeps (grid axis columns; ``num_iterations`` has a column of its own).
KNOBS = ("axis_steps_per_generation", "axis_gradient_accumulation_steps", "axis_per_device_train_batch_size",
         "axis_num_update_generations")
#: Distinct p a local fit needs (a parabola has 3 coefficients; one more measures its misfit).
MIN_LEVELS = 4


class Regime(str):
    """Where the best p puts a run's FLOPs, in the seed study's words (module docstring): one
    of the four constants below, each a ``str`` (so tables and report.json show the words)."""

    __slots__ = ()
    UPDATE_HEAVY: "Regime"
    SEARCH_HEAVY: "Regime"
    FEEDBACK_HEAVY: "Regime"
    NOT_IDENTIFIED: "Regime"


Regime.UPDATE_HEAVY = Regime("update-heavy")
Regime.SEARCH_HEAVY = Regime("search-heavy")
Regime.FEEDBACK_HEAVY = Regime("feedback-heavy")
Regime.NOT_IDENTIFIED = Regime("not identified")
#: Every regime label, in that order.
REGIMES = (Regime.UPDATE_HEAVY, Regime.SEARCH_HEAVY, Regime.FEEDBACK_HEAVY, Regime.NOT_IDENTIFIED)


def line_names(pr: pd.DataFrame) -> list[str]:
    """The line of each row of ``pr`` (prepared runs, :func:`race.analysis.tables.prepare_runs`):
    its allocation name with the knobs written ``*``: ``num_iterations`` always, every
    :data:`KNOBS` column left out, and the group size ``G=*`` where the row sets
    ``num_update_generations``, when those rows have more than one group size (PODS's n of m:
    more rollouts per prompt for the same update is the search-heavy knob; module docstring).
    Named over these rows' varying columns."""
    rows = pr.assign(num_iterations="*")
    if "axis_num_update_generations" in rows.columns:
        pods = rows["axis_num_update_generations"].notna()
        if rows.loc[pods, "num_generations"].nunique() > 1:  # one n among them: the name keeps it
            rows["num_generations"] = rows["num_generations"].astype(object).where(~pods, "*")
    return table_names(rows, [c for c in extra_allocation_columns(pr) if c not in KNOBS])


def run_shares(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per complete run: ``run_id, budget, seed, allocation, line, reward, p, p_policy,
    search_share, feedback_share`` from its counted FLOPs (module docstring). Runs with no
    counted FLOPs are left out."""
    pr = prepare_runs(runs)
    require_columns(pr, ["rollout_flops", "learning_flops", "feedback_flops"], "runs")  # race.schema's columns
    s, lrn, f = (pr["rollout_flops"].astype(float), pr["learning_flops"].astype(float),
                 pr["feedback_flops"].astype(float))
    total = s + lrn + f
    line = line_names(pr)
    out = pr[["run_id", "budget", "seed", "allocation", "reward"]].assign(
        line=line, reward=pr["reward"].astype(str), p=lrn / total, p_policy=lrn / (s + lrn),
        search_share=s / total,
        feedback_share=f / total)
    return out[total > 0].reset_index(drop=True)


def share_table(evals: pd.DataFrame, runs: pd.DataFrame, target: str, *, n_boot: int = 1000,
                rng: Any = 0, level: float = 0.95) -> tuple[pd.DataFrame, BootstrapResult]:
    """Per (budget, allocation): ``line, reward, p, p_min, p_max`` (over its seeds), ``p_policy,
    search_share, feedback_share, score, lo, hi`` (score at equal FLOPs and its interval),
    ``n_runs``; and the joint bootstrap (cells in the same order). The random-reward control
    is left out (its p says nothing about a reward system)."""
    fin = without_controls(final_scores(evals, runs, target, at="equal"))
    shares = run_shares(runs).set_index("run_id")
    fin = fin[fin["run_id"].isin(shares.index)]
    if fin.empty:
        raise ValueError(f"no complete run with counted FLOPs and a {target!r} score")
    boot = joint_cells(evals, runs, target, set(fin["run_id"]), n_boot=n_boot, rng=rng)
    ivs = boot.intervals(level)
    per = shares.loc[fin["run_id"]].assign(allocation=fin["allocation"].to_numpy(), budget=fin["budget"].to_numpy())
    agg = per.groupby(["budget", "allocation"], sort=True).agg(
        line=("line", "first"), reward=("reward", "first"), p=("p", "mean"), p_min=("p", "min"), p_max=("p", "max"),
        p_policy=("p_policy", "mean"), search_share=("search_share", "mean"),
        feedback_share=("feedback_share", "mean")).reset_index()
    table = ivs[["budget", "allocation", "score", "lo", "hi", "n_runs"]].merge(agg, on=["budget", "allocation"])
    cols = ["budget", "allocation", "line", "reward", "p", "p_min", "p_max", "p_policy", "search_share",
            "feedback_share",
            "score", "lo", "hi", "n_runs"]
    return table[cols], boot


def joint_cells(evals: pd.DataFrame, runs: pd.DataFrame, target: str, run_ids: set[str], *, n_boot: int = 1000,
                rng: Any = 0) -> BootstrapResult:
    """Per (budget, allocation) of the runs ``run_ids``: the mean score at equal FLOPs and its
    replicates from the study's joint draw (:func:`race.analysis.joint.draw_replicates`: problems
    shared by every cell, a seed's runs at every budget of an allocation drawn together, the
    sqrt(m/(m-1)) small-sample correction), as a :class:`BootstrapResult` sorted by budget and
    allocation."""
    sm = study_matrix(evals, runs, target)
    reps = draw_replicates(sm, n_boot, rng)
    end = reps.scores(sm.end_pp, sm.end)
    keep = sm.runs["run_id"].isin(run_ids).to_numpy()
    rows, cols = [], []
    for (alloc, budget), idx in sorted(reps.strata.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        idx = idx[keep[idx]]
        if len(idx):
            rows.append(dict(budget=budget, allocation=alloc, score=float(sm.end[idx].mean()), n_runs=len(idx)))
            cols.append(reps.cell_mean(end, idx))
    over = tuple(o for o in reps.over if o != "problems" or reps.weights is not None)
    return BootstrapResult(cells=pd.DataFrame(rows), reps=np.column_stack(cols), over=over, notes=list(sm.notes))


@dataclass
class BestShare:
    """The best p of one reward system at one budget (module docstring)."""

    budget: float
    line: str  # the allocations that differ only in the knobs (module docstring)
    reward: str
    status: str  # "located" | "bracketed" | "edge" | "single"
    p: float  # the located vertex, else the pilot best's p
    lo: float | None  # the vertex's interval, or the bracket
    hi: float | None
    best_allocation: str  # the pilot best
    best_score: float
    best_p: float
    best_p_policy: float
    regime: Regime
    method: str  # "local fit" | "pilot-best fallback"
    frac_valid: float | None  # replicates with a maximum (the local fit)
    coef: list[float] | None  # [c2, c1, c0] of the point fit
    n_points: int
    flat: bool  # no allocation below the best beyond the noise
    p_policy: float = float("nan")  # the best p without the RM's share (located: at the nearest allocation's ratio)
    in_p: Located | None = None  # the model-free call in p (race.analysis.share_optimum)
    in_p_policy: Located | None = None  # ... in p_policy
    worse: list[str] = field(default_factory=list)  # allocations below the best beyond the noise
    notes: list[str] = field(default_factory=list)

    def text(self) -> str:
        """The best p in words: located with its interval, bracketed, or at the edge."""
        if self.status == "located":
            return f"{self.p:.2f} [{self.lo:.2f}, {self.hi:.2f}]"
        if self.status == "bracketed":
            return f"pilot best {self.p:.2f}, p tried on both sides ({self.lo:.2f}, {self.hi:.2f}); not located"
        if self.status == "edge":
            side = "smallest" if self.lo is None else "largest"
            return f"at the grid's edge: the {side} p tried, {self.p:.2f} (not bracketed)"
        return f"{self.p:.2f} (one p tried)"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["regime"], d["text"] = str(self.regime), self.text()
        for k in ("in_p", "in_p_policy"):
            call = getattr(self, k)
            if call is not None:
                d[k]["call"], d[k]["text"] = str(call.call), call.text()
        return d


def regime_of(p: float, search: float, feedback: float) -> Regime:
    """Update-heavy when learning takes at least half the FLOPs, else the larger of search
    and feedback names the regime."""
    if p >= 0.5:
        return Regime.UPDATE_HEAVY
    return Regime.SEARCH_HEAVY if search >= feedback else Regime.FEEDBACK_HEAVY


def _levels(p: np.ndarray) -> np.ndarray:
    """The distinct p levels (values closer than :data:`SAME_P` merged), sorted."""
    out: list[float] = []
    for v in np.sort(p):
        if not out or v - out[-1] > SAME_P:
            out.append(float(v))
    return np.asarray(out)


def _local_fit(p: np.ndarray, y: np.ndarray, reps: np.ndarray, level: float
               ) -> tuple[tuple[float, float, float] | None, list[float] | None, float | None, list[str]]:
    """The quadratic through the line's points (module docstring): ``(located vertex and
    interval or None, point-fit coefficients, share of replicates with a maximum, notes)``."""
    levels = _levels(p)
    if len(levels) < MIN_LEVELS:
        return None, None, None, [f"{len(levels)} distinct p: a local fit needs {MIN_LEVELS} (three give a parabola "
                                  "through three points, which cannot locate the optimum)"]
    coef = [float(x) for x in np.polyfit(p, y, 2)]
    fit = vertex_fit(p, y, reps, level=level)
    if fit is None:
        return None, coef, None, ["the local fit has no maximum (it opens upward)"]
    xv, lo, hi, frac = fit
    if levels[0] <= xv <= levels[-1] and levels[0] <= lo and hi <= levels[-1] and frac >= MIN_VALID:
        return (xv, lo, hi), coef, frac, []
    return None, coef, frac, [f"local fit not stable (vertex {xv:.2f}, interval [{lo:.2f}, {hi:.2f}] against the p "
                              f"tried {levels[0]:.2f}-{levels[-1]:.2f}; {frac:.0%} of replicates with a maximum)"]


def best_share(line: pd.DataFrame, boot: BootstrapResult, *, level: float = 0.95,
               margin: float = FLAT_MARGIN) -> BestShare:
    """The best p of one (budget, line) of :func:`share_table` (module docstring);
    ``boot`` the table's joint bootstrap (its replicates are refitted, paired); ``margin``
    the flat call's (:func:`race.analysis.share_optimum.locate_best`)."""
    line = line.sort_values(["p", "allocation"], kind="mergesort").reset_index(drop=True)
    cols = np.array([boot.index_of(budget=b, allocation=a) for b, a in zip(line["budget"], line["allocation"])])
    p, y, reps = line["p"].to_numpy(float), line["score"].to_numpy(float), boot.reps[:, cols]
    in_p = locate_best(p, y, reps, coord="p", level=level, margin=margin)
    in_pol = locate_best(line["p_policy"].to_numpy(float), y, reps, coord="p_policy", level=level, margin=margin)
    ib = in_p.best
    best = line.iloc[ib]
    worse = [str(a) for j, a in enumerate(line["allocation"]) if j not in in_p.plausible]
    base = dict(budget=float(best["budget"]), line=str(best["line"]), reward=str(best["reward"]),
                best_allocation=str(best["allocation"]),
                best_score=float(y[ib]), best_p=float(p[ib]), best_p_policy=float(best["p_policy"]),
                n_points=len(line), flat=not worse, worse=worse, in_p=in_p, in_p_policy=in_pol)
    located, coef, frac, notes = _local_fit(p, y, reps, level)
    if located is not None and in_p.call != Call.LOCATED:  # the fit may refine a location, not make one
        side = ("either side" if in_p.below is None and in_p.above is None else
                "its low side" if in_p.below is None else "its high side")
        notes.append(f"the quadratic's vertex {located[0]:.2f} [{located[1]:.2f}, {located[2]:.2f}] lies inside the "
                     f"range, but the score does not fall below the best beyond the noise on {side}: the fit's "
                     "shape, not the intervals, would place it, so it is not called located")
        located = None
    if located is not None:
        xv, lo, hi = located
        near = line.iloc[int(np.argmin(np.abs(p - xv)))]  # its search : feedback ratio stands for p*'s
        ns, nf = float(near["search_share"]), float(near["feedback_share"])
        out = BestShare(status="located", p=xv, lo=lo, hi=hi, method="local fit", frac_valid=frac, coef=coef,
                        regime=regime_of(xv, ns, nf), p_policy=xv / (xv + (1 - xv) * ns / max(ns + nf, 1e-12)),
                        notes=notes, **base)
    else:
        levels = _levels(p)
        below, above = levels[levels < p[ib] - SAME_P], levels[levels > p[ib] + SAME_P]
        status = "single" if len(levels) == 1 else "bracketed" if len(below) and len(above) else "edge"
        out = BestShare(status=status, p=float(p[ib]), lo=float(below[-1]) if len(below) else None,
                        hi=float(above[0]) if len(above) else None,
                        regime=regime_of(float(p[ib]), float(best["search_share"]), float(best["feedback_share"])),
                        method="pilot-best fallback", frac_valid=frac, coef=coef, notes=notes,
                        p_policy=float(best["p_policy"]), **base)
    if out.flat:
        out.regime = Regime.NOT_IDENTIFIED
        out.notes.append("no allocation scores below the best beyond the noise: the response in p is flat within "
                         "the pilots' resolution")
    else:
        ties = regime_ties(line, reps, out.regime, level=level)
        if ties:
            out.notes.append(f"{out.regime} not identified: " + "; ".join(ties))
            out.regime = Regime.NOT_IDENTIFIED
    return out


def regime_ties(line: pd.DataFrame, reps: np.ndarray, regime: Regime, *, level: float = 0.95) -> list[str]:
    """Why ``regime`` is not identified on a line (sorted as :func:`best_share` sorts it, ``reps``
    its replicates' columns in that order): per other regime present, its best allocation where
    the best of ``regime`` does not score above it beyond the noise (paired); empty when every
    other regime's best is below."""
    y = line["score"].to_numpy(float)
    reg = np.array([regime_of(float(r.p), float(r.search_share), float(r.feedback_share)) for r in line.itertuples()])
    mine = np.flatnonzero(reg == regime)
    if not mine.size:
        return [f"no allocation tried is {regime}"]
    a = mine[np.argmax(y[mine])]
    out = []
    for other in sorted(set(reg) - {regime}):
        idx = np.flatnonzero(reg == other)
        b = idx[np.argmax(y[idx])]
        d = difference(y[a], y[b], reps[:, a], reps[:, b], level=level)
        if d.lo <= 0:
            out.append(f"its best (p {line['p'].iloc[a]:.2f}) minus the best {other} allocation "
                       f"(p {line['p'].iloc[b]:.2f}) is {d.diff:+.3f} [{d.lo:+.3f}, {d.hi:+.3f}], within the noise")
    return out


def best_shares(table: pd.DataFrame, boot: BootstrapResult, *, level: float = 0.95,
                margin: float = FLAT_MARGIN) -> list[BestShare]:
    """:func:`best_share` of every (budget, line) of :func:`share_table`, sorted."""
    return [best_share(g, boot, level=level, margin=margin) for _, g in table.groupby(["budget", "line"], sort=True)]


def share_shift(bests: list[BestShare]) -> pd.DataFrame:
    """Per budget, each line's best p and p_policy (:class:`BestShare`) beside the first
    line's (in sorted order): ``budget, line, reward, status, p, p_policy, d_p, d_p_policy, reference``
    (the first line). Where ``d_p`` is large and ``d_p_policy`` small, the shift of the best p
    is the reward model's own share."""
    rows = []
    by_budget: dict[float, list[BestShare]] = {}
    for b in bests:
        by_budget.setdefault(b.budget, []).append(b)
    for budget, bs in sorted(by_budget.items()):
        ref = bs[0]
        for b in bs:
            rows.append(dict(budget=budget, line=b.line, reward=b.reward, status=b.status, p=b.p, p_policy=b.p_policy,
                             d_p=b.p - ref.p, d_p_policy=b.p_policy - ref.p_policy, reference=ref.line))
    return pd.DataFrame(rows, columns=["budget", "line", "reward", "status", "p", "p_policy", "d_p", "d_p_policy",
                                       "reference"])


__all__ = ["BestShare", "KNOBS", "MIN_LEVELS", "MIN_VALID", "REGIMES", "Regime", "SAME_P", "best_share", "best_shares",
           "joint_cells", "line_names", "regime_of", "regime_ties", "run_shares",
           "share_shift", "share_table"]
