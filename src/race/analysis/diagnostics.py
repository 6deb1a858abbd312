"""Diagnostics: wasted rollouts, truncation, reward over-optimisation, random-reward control.

- :func:`waste_table`: per (budget, allocation) means of ``zero_var_frac`` (groups whose
  rewards all equal give zero advantage: their rollouts teach nothing), ``trunc_rate``,
  and the FLOP split. wasted_rollout_flops = zero_var_frac x rollout_flops.
- :func:`overoptimisation`: per run, the slope of the proxy (training) reward and of the
  verified accuracy over the run, each from least squares of value on x = flops / max
  flops of the run (so a slope is the change across the whole run, in score units).
  Flag: proxy slope > threshold and verified slope < -threshold: the one rule of
  ``race.records`` (the engine writes the same rule's verdict into run.json).
- :func:`random_control`: each allocation against the ``reward == "random"`` control at the
  same budget (same model when such a control exists, else all controls at the budget),
  with a bootstrap interval on the difference; a real gain has its interval above 0.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from race.records import OVEROPTIMISATION_THRESHOLD, overoptimisation as record_overoptimisation, overoptimised

from .bootstrap import bootstrap_cells, difference
from .curves import final_scores
from .tables import is_control, prepare_runs, require_columns, validate_train



def waste_table(runs: pd.DataFrame, by: tuple[str, ...] = ("budget", "allocation")) -> pd.DataFrame:
    """Zero-variance share, truncation and FLOP split per group (means over runs).

    Columns: ``by..., n_runs, zero_var_frac, trunc_rate, wasted_rollout_flops,
    wasted_share`` (wasted / total FLOPs), ``rollout_share, learning_share,
    feedback_share`` (phase FLOPs / total FLOPs), means over the group's runs.
    """
    need = ["zero_var_frac", "trunc_rate", "total_flops", "rollout_flops", "learning_flops", "feedback_flops"]
    require_columns(runs, need, "runs")
    pr = prepare_runs(runs).copy()
    total = pr["total_flops"].astype(float).replace(0, np.nan)
    pr["wasted_rollout_flops"] = pr["zero_var_frac"].astype(float) * pr["rollout_flops"].astype(float)
    pr["wasted_share"] = pr["wasted_rollout_flops"] / total
    for phase in ("rollout", "learning", "feedback"):
        pr[f"{phase}_share"] = pr[f"{phase}_flops"].astype(float) / total
    cols = ["zero_var_frac", "trunc_rate", "wasted_rollout_flops", "wasted_share", "rollout_share",
            "learning_share", "feedback_share"]
    grouped = pr.groupby(list(by), sort=True)
    out = grouped[cols].mean()
    out.insert(0, "n_runs", grouped.size())
    return out.reset_index()


def overoptimisation(
    runs: pd.DataFrame,
    train: pd.DataFrame | None = None,
    evals: pd.DataFrame | None = None,
    target: str = "greedy",
    proxy_col: str = "reward_mean",
    threshold: float = OVEROPTIMISATION_THRESHOLD,
    from_fraction: float = 0.0,
) -> pd.DataFrame:
    """Flag runs whose proxy reward rises while verified accuracy falls.

    Slopes come from ``runs.proxy_reward_trend`` / ``runs.verified_trend`` when both are
    present for a run, else from ``train[proxy_col]`` and ``evals.score`` (on ``target``)
    against x = flops / (run's max flops), using points with x >= ``from_fraction`` (to
    look at the late part of a run). Columns: ``run_id, allocation, reward, budget,
    proxy_slope, verified_slope, source, overoptimised``.
    """
    pr = prepare_runs(runs)
    if train is not None:
        validate_train(train, ["run_id", "flops", proxy_col])
    if evals is not None:
        require_columns(evals, ["run_id", "flops", "target", "score"], "evals")
        evals = evals[evals["target"] == target]
    rows = []
    for _, run in pr.iterrows():
        rid = run["run_id"]
        pt, vt = run.get("proxy_reward_trend", np.nan), run.get("verified_trend", np.nan)
        source = "runs"
        if pd.isna(pt) or pd.isna(vt):
            source = "tables"
            none = np.empty((0, 2))
            proxy = train.loc[train["run_id"] == rid, ["flops", proxy_col]].to_numpy(float) if train is not None else none
            seen = evals.loc[evals["run_id"] == rid, ["flops", "score"]].to_numpy(float) if evals is not None else none
            verdict = record_overoptimisation([tuple(r) for r in proxy], [tuple(r) for r in seen], threshold=threshold,
                                              from_fraction=from_fraction)
            pt, vt = verdict["proxy_slope"], verdict["verified_slope"]
        flag = overoptimised(float(pt), float(vt), threshold)
        rows.append(dict(run_id=rid, allocation=run["allocation"], reward=run["reward"], budget=run["budget"],
                         proxy_slope=float(pt), verified_slope=float(vt), source=source, overoptimised=flag))
    cols = ["run_id", "allocation", "reward", "budget", "proxy_slope", "verified_slope", "source", "overoptimised"]
    return pd.DataFrame(rows, columns=cols)


def random_control(
    evals: pd.DataFrame,
    runs: pd.DataFrame,
    target: str,
    at: str = "equal",
    n_boot: int = 1000,
    rng: np.random.Generator | int | None = 0,
    level: float = 0.95,
    over: tuple[str, ...] = ("seeds", "problems"),
) -> pd.DataFrame:
    """Each allocation minus its random-reward control at the same budget.

    Columns: ``budget, allocation, control`` (the control cell: ``random@<model>`` or
    ``random@all``), ``score, control_score, diff, lo, hi, beats_control`` (lo > 0),
    ``n_seeds, n_control``. Empty when there are no ``reward == "random"`` runs.
    ``result.beats_control.any()`` answers "does anything beat the control beyond noise?"
    """
    cols = ["budget", "allocation", "control", "score", "control_score", "diff", "lo", "hi", "beats_control",
            "n_seeds", "n_control"]
    finals = final_scores(evals, runs, target, at=at)
    is_ctl = is_control(finals)
    if not is_ctl.any():
        return pd.DataFrame(columns=cols)
    treated = finals[~is_ctl].assign(cell=lambda d: d["allocation"])
    ctl = finals[is_ctl]
    ctl_cells = pd.concat([ctl.assign(cell="random@" + ctl["model"].astype(str)), ctl.assign(cell="random@all")],
                          ignore_index=True)
    ctl_cells["run_id"] = ctl_cells["run_id"].astype(str) + "#" + ctl_cells["cell"]
    both = pd.concat([treated, ctl_cells], ignore_index=True)
    bs = bootstrap_cells(both, ["budget", "cell"], n_boot=n_boot, rng=rng, over=over)
    cells = bs.cells.reset_index(drop=True)
    rows = []
    for j, cell in cells.iterrows():
        if str(cell["cell"]).startswith("random@"):
            continue
        b = cell["budget"]
        model = treated.loc[treated["allocation"] == cell["cell"], "model"].iloc[0]
        names = [f"random@{model}", "random@all"]
        match = [k for k in names if ((cells["budget"] == b) & (cells["cell"] == k)).any()]
        if not match:
            continue
        k = int(cells.index[(cells["budget"] == b) & (cells["cell"] == match[0])][0])
        d = difference(cell["score"], cells.at[k, "score"], bs.reps[:, j], bs.reps[:, k], level)
        rows.append(dict(budget=b, allocation=cell["cell"], control=match[0], score=float(cell["score"]),
                         control_score=float(cells.at[k, "score"]), diff=d.diff, lo=d.lo, hi=d.hi,
                         beats_control=bool(d.lo > 0), n_seeds=int(cell["n_runs"]), n_control=int(cells.at[k, "n_runs"])))
    return pd.DataFrame(rows, columns=cols)
