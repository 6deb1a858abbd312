"""Where a learned reward stops paying: the proxy-vs-verified divergence point of each arm.

A learned reward model is a proxy for correctness. The policy optimises it; once the
policy finds what the RM wrongly likes, the proxy keeps rising while the verified score
(final-answer correctness) falls (Gao et al., "Scaling laws for reward model
overoptimization"). :func:`divergence_point` finds the FLOPs (and step) of one series at
which that starts; :func:`divergence_table` does it per learned-reward arm of a study.

Definition (one series of training steps, each with its cumulative counted FLOPs, the
proxy and the verified score; x = FLOPs / the series' last FLOPs):

- a step i QUALIFIES when, over the rest of the run (steps i..end, at least ``min_tail``
  points and ``tail_frac`` of the run), the least-squares line of the proxy on x rises by
  at least ``min_change`` (its fitted change from x_i to the end) with a slope at least
  ``z`` standard errors above 0, and the verified score's line falls by at least
  ``min_change`` with a slope at least ``z`` standard errors below 0 (standard error of a
  least-squares slope, residual variance on n - 2 degrees of freedom);
- the divergence point is the qualifying step where the verified score, smoothed by a
  centred moving average over ``window`` steps, is highest (its peak before the fall; the
  earliest such step on ties); none qualifying: "no divergence within the run".

Both thresholds at once keep a noise-sized wobble (one step's verified mean is a mean of
prompts x G samples: +-0.12 at 16) from being called a divergence; the thresholds are
parameters, reported with every verdict.

Per arm (:func:`divergence_table`): the arm's runs (one allocation: same model, group
size, reward, ...) at different budgets share their seed's trajectory, so each seed's
LONGEST finished run stands for it; the verdict is on the seed-mean series (steps all
seeds reached, FLOPs averaged), with each seed's own verdict beside it. Proxy: the RM's own
score (``rm_score_mean``, the learned model's aggregate before any rule terms are mixed
in) when the train table has it for the arm, else the training reward (``reward_mean``);
verified: ``verified_mean`` (0/1 final-answer correctness of the same training samples).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from race.schema import FINISHED

from .bootstrap import bootstrap_cells, difference
from .curves import final_scores
from .tables import prepare_runs, require_columns, reward_flag

#: The exact dense process reward a learned reward is also compared with (as ``reward_rule`` writes it).
DENSE_RULE = "rule:partial"
PROXY_COLUMNS = ("rm_score_mean", "reward_mean")


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares slope of y on x and its standard error (residual variance over n - 2)."""
    n = len(x)
    mx, my = x.mean(), y.mean()
    sxx = float(((x - mx) ** 2).sum())
    if n < 3 or sxx <= 0:
        return float("nan"), float("nan")
    b = float(((x - mx) * (y - my)).sum() / sxx)
    resid = y - (my + b * (x - mx))
    return b, math.sqrt(float((resid ** 2).sum()) / (n - 2) / sxx)


def _smooth(y: np.ndarray, window: int) -> np.ndarray:
    """Centred moving average over ``window`` points (fewer at the ends)."""
    h = window // 2
    c = np.concatenate([[0.0], np.cumsum(y)])
    lo = np.clip(np.arange(len(y)) - h, 0, len(y))
    hi = np.clip(np.arange(len(y)) + h + 1, 0, len(y))
    return (c[hi] - c[lo]) / (hi - lo)


def divergence_point(steps: Any, flops: Any, proxy: Any, verified: Any, *, min_change: float = 0.05,
                     z: float = 2.0, min_tail: int = 5, tail_frac: float = 0.2,
                     window: int | None = None) -> dict[str, Any]:
    """The step and FLOPs from which the proxy keeps rising while the verified score falls
    (module docstring), or ``diverged: False`` with the reason.

    Returns ``diverged``, ``step``, ``flops`` (None when not diverged), ``proxy_change`` and
    ``verified_change`` (fitted change over the rest of the run from the point; from the
    middle of the run when not diverged), ``proxy_z`` and ``verified_z`` (slope / its
    standard error), ``verified_peak`` / ``verified_end`` (smoothed), ``n_points``,
    ``reason`` and the settings used."""
    s = np.asarray(steps, float)
    f = np.asarray(flops, float)
    p = np.asarray(proxy, float)
    v = np.asarray(verified, float)
    ok = np.isfinite(s) & np.isfinite(f) & np.isfinite(p) & np.isfinite(v)
    order = np.argsort(s[ok], kind="mergesort")
    s, f, p, v = (a[ok][order] for a in (s, f, p, v))
    n = len(s)
    tail = max(int(min_tail), math.ceil(tail_frac * n), 3)
    w = int(window) if window else max(3, n // 10)
    out: dict[str, Any] = dict(diverged=False, step=None, flops=None, proxy_change=float("nan"),
                               verified_change=float("nan"), proxy_z=float("nan"), verified_z=float("nan"),
                               verified_peak=float("nan"), verified_end=float("nan"), n_points=n,
                               settings=dict(min_change=min_change, z=z, min_tail=tail, window=w))
    if n < 2 * tail or not f[-1] > 0:
        out["reason"] = f"too few training steps ({n}; need {2 * tail}): no verdict"
        return out
    x = f / f[-1]
    sm = _smooth(v, w)
    best: tuple[float, int, dict[str, float]] | None = None
    mid: dict[str, float] = {}
    for i in range(0, n - tail + 1):
        bp, sp = _line(x[i:], p[i:])
        bv, sv = _line(x[i:], v[i:])
        span = x[-1] - x[i]
        stats = dict(proxy_change=bp * span, verified_change=bv * span, proxy_z=bp / sp if sp > 0 else float("nan"),
                     verified_z=bv / sv if sv > 0 else float("nan"))
        if not mid and x[i] >= 0.5:
            mid = stats
        up = stats["proxy_change"] >= min_change and bp >= z * sp
        down = stats["verified_change"] <= -min_change and bv <= -z * sv
        if up and down and (best is None or sm[i] > best[0]):
            best = (float(sm[i]), i, stats)
    out["verified_end"] = float(sm[-1])
    if best is None:
        out.update(mid)
        out["reason"] = (f"no divergence within the run: from no step on did the proxy rise and the verified score "
                         f"fall by {min_change} and {z:g} standard errors each (second half: proxy "
                         f"{out['proxy_change']:+.3f}, verified {out['verified_change']:+.3f})")
        return out
    peak, i, stats = best
    out.update(stats, diverged=True, step=int(s[i]), flops=float(f[i]), verified_peak=peak)
    out["reason"] = (f"from step {int(s[i])} ({f[i]:.3g} FLOPs, {x[i]:.0%} of the run) the proxy rose "
                     f"{stats['proxy_change']:+.3f} (z {stats['proxy_z']:.1f}) while the verified score fell "
                     f"{stats['verified_change']:+.3f} (z {stats['verified_z']:.1f})")
    return out


def _series(train: pd.DataFrame, run_ids: list[str], proxy: str) -> pd.DataFrame:
    rows = train[train["run_id"].isin(run_ids)][["run_id", "step", "flops", proxy, "verified_mean"]]
    return rows.dropna().rename(columns={proxy: "proxy", "verified_mean": "verified"})


def divergence_table(runs: pd.DataFrame, train: pd.DataFrame, **settings: Any) -> pd.DataFrame:
    """One row per learned-reward arm (allocation) of ``runs`` (module docstring):
    ``allocation, reward, model, proxy, n_seeds, seeds_diverged, diverged, step, flops,
    proxy_change, verified_change, proxy_z, verified_z, verified_peak, verified_end,
    budgets_past`` (pilot budgets of the arm above the divergence FLOPs), ``run_ids``,
    ``per_seed`` (seed -> that seed's verdict) and ``reason``. ``settings`` go to
    :func:`divergence_point`."""
    require_columns(train, ["run_id", "step", "flops", "verified_mean"], "train")
    pr = prepare_runs(runs, include_failed=True)
    pr = pr[pr["status"].astype(str).isin(FINISHED)]
    pr = pr[reward_flag(pr, "reward_learned")]
    rows = []
    for alloc, g in pr.groupby("allocation", sort=True):
        longest = g.sort_values(["budget", "run_id"], ascending=[False, True]).drop_duplicates("seed")
        ids = list(longest["run_id"].astype(str))
        t = train[train["run_id"].isin(ids)]
        proxy = next((c for c in PROXY_COLUMNS if c in t.columns and t[c].notna().any()), None)
        base = dict(allocation=alloc, reward=str(g["reward"].iloc[0]), model=str(g["model"].iloc[0]), proxy=proxy,
                    n_seeds=len(ids), run_ids=ids, budgets=sorted(float(b) for b in g["budget"].unique()))
        if proxy is None:
            rows.append(dict(base, seeds_diverged=0, diverged=False, reason="no training log for this arm"))
            continue
        ser = _series(train, ids, proxy)
        per_seed = {}
        for seed, rid in zip(longest["seed"], ids):
            one = ser[ser["run_id"] == rid]
            per_seed[int(seed)] = divergence_point(one["step"], one["flops"], one["proxy"], one["verified"],
                                                   **settings)
        common = ser.groupby("step").filter(lambda d: d["run_id"].nunique() == len(ids))
        mean = common.groupby("step", as_index=False)[["flops", "proxy", "verified"]].mean()
        res = divergence_point(mean["step"], mean["flops"], mean["proxy"], mean["verified"], **settings)
        past = [b for b in base["budgets"] if res["diverged"] and b > res["flops"]]
        rows.append(dict(base, **{k: res[k] for k in ("diverged", "step", "flops", "proxy_change", "verified_change",
                                                      "proxy_z", "verified_z", "verified_peak", "verified_end",
                                                      "reason", "settings")},
                         seeds_diverged=sum(r["diverged"] for r in per_seed.values()), budgets_past=past,
                         per_seed=per_seed))
    cols = ["allocation", "reward", "model", "proxy", "n_seeds", "seeds_diverged", "diverged", "step", "flops",
            "proxy_change", "verified_change", "proxy_z", "verified_z", "verified_peak", "verified_end", "budgets",
            "budgets_past", "run_ids", "per_seed", "reason", "settings"]
    return pd.DataFrame(rows, columns=cols)


def feedback_comparisons(evals: pd.DataFrame, runs: pd.DataFrame, target: str, strength: dict[str, float], *,
                         n_boot: int = 1000, rng: Any = 0, level: float = 0.95) -> pd.DataFrame:
    """Did stronger feedback pay at equal FLOPs? Within each budget and each group of
    allocations that differ only in their reward, paired differences of the scores on
    ``target`` read at equal counted FLOPs (:func:`race.analysis.final_scores`, ``at="equal"``;
    one bootstrap over seeds and problems shared by every cell, :func:`bootstrap_cells`):

    - ``stronger RM``: each learned reward against each learned reward of a weaker RM
      (``strength``: reward spec -> a number, larger = stronger, e.g. the RM's step AUC);
    - ``RM vs its rule``: each learned reward against the rule it mixes in, alone
      (``prm:prm-s:min+outcome`` against ``rule:outcome``): what the RM's score added;
    - ``RM vs rule:partial``: against the exact dense process reward, where the group has it.

    One row per comparison: ``budget, group, kind, a, b, score_a, score_b, diff, lo, hi,
    p_greater, verdict`` (``won``: the interval of a - b above 0; ``lost``: below; else
    ``tied``). Empty when no group holds two comparable rewards."""
    cols = ["budget", "group", "kind", "a", "b", "score_a", "score_b", "diff", "lo", "hi", "p_greater", "verdict"]
    fin = final_scores(evals, runs, target, at="equal")
    pr = prepare_runs(runs, include_failed=True)  # the typed reward columns, one row per reward spec
    typed = pr.assign(reward=pr["reward"].astype(str)).drop_duplicates("reward").set_index("reward")
    learned_of, rule_of = reward_flag(typed, "reward_learned").to_dict(), typed["reward_rule"].to_dict()
    fin = fin[~fin["reward"].astype(str).map(reward_flag(typed, "reward_random")).eq(True)]
    if fin.empty:
        return pd.DataFrame(columns=cols)
    fin = fin.assign(group=[a.replace(f"|{r}", "|*", 1) for a, r in zip(fin["allocation"], fin["reward"].astype(str))])
    boot = bootstrap_cells(fin, ("budget", "allocation"), n_boot=n_boot, rng=rng)
    rows = []
    for (budget, group), g in fin.groupby(["budget", "group"], sort=True):
        arms = {str(r): str(a) for r, a in zip(g["reward"], g["allocation"])}
        pairs = []
        learned = [r for r in arms if learned_of[r]]
        rules = {r: rule_of[r] for r in arms if not learned_of[r] and isinstance(rule_of[r], str)}  # rule arms
        for a in learned:
            pairs += [("stronger RM", a, b) for b in learned if b != a and a in strength and b in strength
                      and strength[a] > strength[b]]
            rule = rule_of[a]  # the rule the learned reward mixes in, if any
            own = next((r for r in rules if isinstance(rule, str) and rules[r] == rule), None)
            if own is not None:
                pairs.append(("RM vs its rule", a, own))
            dense = next((r for r in rules if rules[r] == DENSE_RULE), None)
            if dense is not None and dense != own:
                pairs.append(("RM vs rule:partial", a, dense))
        for kind, a, b in pairs:
            ia = boot.index_of(budget=budget, allocation=arms[a])
            ib = boot.index_of(budget=budget, allocation=arms[b])
            sa, sb = float(boot.cells["score"].iloc[ia]), float(boot.cells["score"].iloc[ib])
            d = difference(sa, sb, boot.reps[:, ia], boot.reps[:, ib], level=level)
            verdict = "won" if d.lo > 0 else "lost" if d.hi < 0 else "tied"
            rows.append(dict(budget=float(budget), group=group, kind=kind, a=a, b=b, score_a=sa, score_b=sb,
                             diff=d.diff, lo=d.lo, hi=d.hi, p_greater=d.p_greater, verdict=verdict))
    return pd.DataFrame(rows, columns=cols)


__all__ = ["divergence_point", "divergence_table", "feedback_comparisons", "DENSE_RULE", "PROXY_COLUMNS"]
