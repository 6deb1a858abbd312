"""The learning gate: did an allocation learn anything before we forecast from it?

For allocation k at its largest pilot budget b_k, with m_k runs r (seeds) there:

    gain_k = mean_r [ end_r - start_r ]

end_r is the run's score at equal counted FLOPs within b_k, start_r its step-0 score (the
same base model on the same problems). Its standard error has two parts:

- **seeds**: the between-seed variance of each tested cell (each allocation at its largest
  budget, and the random-reward controls there), MODERATED toward the pool of every tested
  cell (:func:`moderated_seed_variances`, the empirical-Bayes variance of limma's moderated t):
  s~_k^2 = (d0 s0^2 + nu_k s_k^2) / (d0 + nu_k) on min(d0 + nu_k, sum nu) degrees of freedom,
  where d0 measures how much the cells' variances agree beyond chance. Cells that agree give
  d0 = inf: the pooled s^2 = sum_k sum_r (g_r - mean_k g)^2 / sum_k (m_k - 1) on sum (m_k - 1)
  df (two seeds per cell give one df each; pooling over K cells gives K); a cell whose seeds
  scatter more than the others' keeps more of its own variance and fewer df, so one seed SD
  is not assumed for every allocation where the seeds show otherwise. The seed part of the
  variance of gain_k is s~_k^2 / m_k.
- **problems**: the gain on problem j, delta_j = mean_r end_rj - start_j, varies over the
  P problems; its part is var_j(delta_j) / P with P - 1 degrees of freedom (it overlaps
  the seed part, which makes the test conservative, not liberal).

t_k = gain_k / se_k is compared with Student's t at 1 - alpha / K (one-sided Bonferroni
over the K allocations tested) at the degrees of freedom of :func:`size_safe_df`: the
Welch-Satterthwaite df (a + b)^2 / (a^2 / nu_s + b^2 / (P - 1)) (a, b the two variance
parts) with the seed part inflated by kappa(nu_s, alpha / K) >= 1, the smallest inflation
whose test holds its level at every ratio of the two true parts (:func:`size_safe_inflation`).
Plain Welch-Satterthwaite does not: with nu_s = 4 (4 cells x 2 seeds) its exact size is up
to 1.35x the nominal at alpha / K = 0.0125 and 2.25x at 0.0025, because a seed variance
that came out small also raises the df and so lowers the threshold. So with 2 seeds the
threshold is far above a normal z (the seed variance is barely known), and with nothing
learned anywhere every allocation fails with probability >= 1 - alpha. Where
random-reward controls of the same model ran at b_k, the allocation must also beat them:
diff = mean end_k - mean end_control, seed part s^2 (1/m_k + 1/m_c), same test. A study
with one seed per cell has no seed variance to pool: only the problem part is used and
the reason says so.

Pooling over budgets would give more seed df, but the runs of one seed at several budgets
are one trajectory (a prefix of each other at a constant learning rate), not independent
replicates of the seed effect, so only the tested cells (the largest budget) are pooled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.special import digamma, expit, polygamma
from scipy.stats import chi2, norm
from scipy.stats import t as student_t

from .joint import Replicates, StudyMatrix
from .tables import is_control

GATE_COLUMNS = ["allocation", "budget", "start", "end", "gain", "gain_lo", "gain_hi", "gain_z", "control",
                "control_diff", "control_lo", "control_hi", "control_z", "threshold_z", "df", "passed", "n_seeds",
                "end_flops", "reason"]


def pooled_seed_variance(groups: list[np.ndarray]) -> tuple[float, int]:
    """(s^2, nu): sum of squared deviations from each group's mean / sum (m_g - 1)."""
    ss = sum(float(np.sum((g - g.mean()) ** 2)) for g in groups if len(g) > 1)
    nu = sum(len(g) - 1 for g in groups if len(g) > 1)
    return (ss / nu, nu) if nu > 0 else (float("nan"), 0)


def moderated_seed_variances(groups: list[np.ndarray]) -> list[tuple[float, float]]:
    """Per group (seed values of one cell), its seed variance moderated toward the pool and the
    degrees of freedom it carries: s~_k^2 = (d0 s0^2 + nu_k s_k^2) / (d0 + nu_k) on min(d0 + nu_k,
    sum nu) df (empirical Bayes: Smyth 2004, the moderated t of limma). d0 and s0^2 come from the
    spread of ln s_k^2 over the groups beyond what chi-square sampling gives: E[ln s_k^2] = ln s0^2
    + psi(d0 / 2) - ln(d0 / 2) + the group's own sampling bias, var = psi'(d0 / 2) + psi'(nu_k / 2).
    Groups that agree (no excess spread) give d0 = inf: the pooled variance on the pooled df, the
    gate before; a group whose seeds vary more than the others keeps more of its own variance and
    fewer df, so one seed SD is no longer assumed for every allocation. A group of one seed gets s0^2
    on min(d0, sum nu) df; (nan, 0) when no group has 2 seeds."""
    nus = np.array([len(g) - 1 for g in groups], dtype=float)
    s2 = np.array([float(np.var(g, ddof=1)) if len(g) > 1 else np.nan for g in groups])
    ok = (nus > 0) & np.isfinite(s2) & (s2 > 0)
    total = float(nus[nus > 0].sum())
    if ok.sum() < 2:  # nothing to moderate against: the pooled variance (of the one group, or none)
        pooled, nu = pooled_seed_variance([g for g in groups if len(g) > 1])
        return [(pooled, float(nu)) if nu > 0 else (float("nan"), 0.0) for _ in nus]
    e = np.log(s2[ok]) - digamma(nus[ok] / 2) + np.log(nus[ok] / 2)
    excess = float(np.var(e, ddof=1)) - float(np.mean(polygamma(1, nus[ok] / 2)))
    if excess > 0:
        d0 = 2 * _trigamma_inverse(excess)
        s0 = float(np.exp(np.mean(e) + digamma(d0 / 2) - np.log(d0 / 2)))
    else:
        d0, s0 = np.inf, pooled_seed_variance([g for g in groups if len(g) > 1])[0]
    out = []
    for n, v in zip(nus, s2):
        if n <= 0:  # one seed: the others' variance (the prior of the moderation) on its df
            out.append((float(s0), float(min(d0, total))))
        elif np.isinf(d0):
            out.append((float(s0), total))
        else:
            v = v if np.isfinite(v) else 0.0
            out.append((float((d0 * s0 + n * v) / (d0 + n)), float(min(d0 + n, total))))
    return out


def _trigamma_inverse(y: float) -> float:
    """x with psi'(x) = y (y > 0), by Newton's method on 1 / psi' (Smyth 2004, appendix)."""
    x = 0.5 + 1.0 / y if y < 1e6 else 1.0 / np.sqrt(y)
    for _ in range(50):
        tri = float(polygamma(1, x))
        step = tri * (1 - tri / y) / float(polygamma(2, x))
        x += step
        if -step / x < 1e-8:
            break
    return float(x)


def exact_size(nu: int, alpha: float, kappa: float, shares: np.ndarray | None = None,
               nodes: int = 256) -> np.ndarray:
    """Exact size of the gate's one-sided t test at each true seed share f = a / (a + b).

    Model: diff ~ N(0, a + b) under the null, the seed part estimated as a_hat = a X / nu
    with X ~ chi^2_nu independent of diff, the problem part b known (P - 1 >= 199 df). The
    test rejects when diff / sqrt(a_hat + b) > t_{1 - alpha}(df_kappa(a_hat, b)), so

        size(f) = E_X [ Phi_bar( t_{1 - alpha}(df_kappa) sqrt(f X / nu + 1 - f) ) ]

    (a + b = 1), by quadrature over ``nodes`` quantiles of chi^2_nu at probabilities spaced
    evenly in logit(u) on [-14, 14] (dense in both tails; about 0.1% accurate at 256 nodes).
    """
    f = np.linspace(0.0, 1.0, 33) if shares is None else np.asarray(shares, dtype=float)
    edges = expit(np.linspace(-14.0, 14.0, nodes + 1))
    w = np.diff(edges) / (edges[-1] - edges[0])
    x = chi2.ppf((edges[1:] + edges[:-1]) / 2, nu) / nu
    a, b = f[:, None] * x[None, :], 1.0 - f[:, None]
    df = size_safe_df(a, nu, b, np.inf, kappa)
    return norm.sf(student_t.ppf(1 - alpha, df) * np.sqrt(a + b)) @ w


_KAPPA: dict[tuple[int, float], float] = {}


def size_safe_inflation(nu: int, alpha: float) -> float:
    """kappa(nu, alpha) >= 1: the smallest seed-part inflation of the Satterthwaite df whose
    :func:`exact_size` is <= alpha at every seed share f in [0, 1] (33 shares; bisection on
    ln kappa, tolerance 1%); ``inf`` (df = nu_s, the seed part's own: exact at f = 1, below
    alpha elsewhere) when no finite kappa <= 1e4 does.
    About 2.4 at nu = 4 and 1.6 at nu = 8 for alpha = 0.0125 (4 allocations, 5% family-wise)."""
    if nu <= 0:
        return 1.0
    key = (int(nu), float(alpha))
    if key not in _KAPPA:
        if len(_KAPPA) > 256:
            _KAPPA.clear()
        _KAPPA[key] = _inflation(*key)
    return _KAPPA[key]


def _inflation(nu: int, alpha: float) -> float:
    """The bisection of :func:`size_safe_inflation` (uncached)."""
    def ok(k: float) -> bool:  # at f = 0 the size is alpha exactly (a normal z): allow float rounding
        return bool(exact_size(nu, alpha, k).max() <= alpha * (1 + 1e-9))

    if ok(1.0):
        return 1.0
    if not ok(1e4):
        return float("inf")
    lo, hi = 0.0, float(np.log(1e4))
    while hi - lo > 0.01:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if ok(float(np.exp(mid))) else (mid, hi)
    return float(np.exp(hi))


def size_safe_df(seed_var, nu_s: float, prob_var, nu_p: float, kappa: float = 1.0):
    """Satterthwaite df with the seed part inflated by ``kappa``:

        df = (kappa a + b)^2 / ((kappa a)^2 / nu_s + b^2 / nu_p)

    (kappa = 1: Welch-Satterthwaite; kappa = inf: nu_s). ``inf`` when both parts are 0."""
    a = np.asarray(seed_var, dtype=float)
    b = np.asarray(prob_var, dtype=float)
    if np.isinf(kappa):
        return np.where(a > 0, float(nu_s), float(nu_p)) + 0.0 * b
    ka = kappa * a
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(ka > 0, ka * ka / max(nu_s, 1e-300), 0.0) + np.where(b > 0, b * b / nu_p, 0.0)
        return np.where(terms > 0, (ka + b) ** 2 / np.where(terms > 0, terms, 1.0), np.inf)


def t_test(diff: float, seed_var: float, nu_s: int, prob_var: float, nu_p: int,
           kappa: float = 1.0) -> tuple[float, float, float]:
    """(t, se, df) of ``diff`` with variance parts seed_var (nu_s df) and prob_var (nu_p df);
    df by :func:`size_safe_df` with inflation ``kappa`` (1: Welch-Satterthwaite)."""
    a = seed_var if nu_s > 0 and np.isfinite(seed_var) else 0.0
    b = prob_var if nu_p > 0 and np.isfinite(prob_var) else 0.0
    se = float(np.sqrt(a + b))
    df = float(size_safe_df(a, nu_s, b, nu_p if nu_p > 0 else np.inf, kappa))
    if not np.isfinite(diff):
        return float("nan"), se, df
    if se <= 0:
        return (float("inf") if diff > 0 else float("-inf") if diff < 0 else 0.0), se, df
    return diff / se, se, df


def _problem_var(sm: StudyMatrix, plus: np.ndarray, minus_pp: np.ndarray | None) -> tuple[float, int]:
    """var_j(delta_j) / P and P - 1 for delta_j = mean over ``plus`` runs' end outcomes - ``minus_pp``."""
    if sm.end_pp is None or minus_pp is None or np.isnan(minus_pp).all():
        return 0.0, 0
    delta = np.nanmean(sm.end_pp[plus], axis=0) - minus_pp
    P = delta.size
    return (float(np.var(delta, ddof=1)) / P, P - 1) if P > 1 else (0.0, 0)


def learning_gate(sm: StudyMatrix, reps: Replicates | None, allocations: list[str], alpha: float = 0.05,
                  level: float = 0.95, df_rule: str = "size-safe") -> pd.DataFrame:
    """One row per allocation (columns :data:`GATE_COLUMNS`); see the module docstring.

    ``df_rule``: ``"size-safe"`` (default, :func:`size_safe_df` with :func:`size_safe_inflation`)
    or ``"welch"`` (plain Welch-Satterthwaite, the earlier gate; kept for comparison).

    ``gain_z`` / ``control_z`` are t statistics, ``threshold_z`` the Bonferroni t threshold
    at ``df`` degrees of freedom; ``gain_lo/gain_hi`` the ``level`` t interval (for display).
    ``reason`` says why a row failed. ``reps`` is not needed (kept for the call signature).
    """
    cells, ctl_cells = _gate_cells(sm.runs, allocations)
    seed_var = _seed_variances(sm, cells, ctl_cells)
    if df_rule not in ("size-safe", "welch"):
        raise ValueError(f"df_rule must be 'size-safe' or 'welch', got {df_rule!r}")
    test = _GateTest(alpha / max(1, len(allocations)), (1 - level) / 2, df_rule)
    rows = [_gate_row(sm, alloc, idx, ctl_cells.get(alloc), seed_var, test) for alloc, idx in cells.items()]
    return pd.DataFrame(rows, columns=GATE_COLUMNS)


def _gate_cells(runs: pd.DataFrame, allocations: list[str]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(per allocation the run indices of its cell at its largest budget, per allocation that
    is no control the random-reward control's runs on its model at that budget)."""
    cells: dict[str, np.ndarray] = {}
    for alloc in allocations:
        mine = runs[runs["allocation"] == alloc]
        if len(mine):
            b = float(mine["budget"].max())
            cells[alloc] = mine.index[mine["budget"] == b].to_numpy()
    ctl_cells = {}
    for alloc, idx in cells.items():
        mine = runs.loc[idx]
        ctl = runs[is_control(runs) & (runs["model"] == mine["model"].iloc[0])
                   & np.isclose(runs["budget"].to_numpy(float), float(mine["budget"].iloc[0]))]
        if len(ctl) and not is_control(mine).iloc[0]:
            ctl_cells[alloc] = ctl.index.to_numpy()
    return cells, ctl_cells


def _seed_variances(sm: StudyMatrix, cells: dict[str, np.ndarray],
                    ctl_cells: dict[str, np.ndarray]) -> dict[str | tuple, tuple[float, float]]:
    """(moderated seed variance, its df) of each cell's gains (:func:`moderated_seed_variances`,
    pooled over the cells with a step-0 evaluation and the controls' end scores), keyed by
    allocation and by a control's run indices."""
    keys: list[str | tuple] = [a for a, i in cells.items() if np.isfinite(sm.start[i]).all()]
    gains = [sm.end[cells[a]] - sm.start[cells[a]] for a in keys]
    seen = set()
    for cidx in ctl_cells.values():
        if tuple(cidx) not in seen:
            seen.add(tuple(cidx))
            keys.append(tuple(cidx))
            gains.append(sm.end[cidx])
    return dict(zip(keys, moderated_seed_variances(gains)))


@dataclass(frozen=True)
class _GateTest:
    """The gate's one-sided t test at the Bonferroni level ``alpha_k`` (alpha / k) and its
    display interval ((1 - level) / 2 in each tail), df by ``df_rule``."""

    alpha_k: float
    q: float
    df_rule: str

    def __call__(self, diff: float, seed_var: float, nu_s: int, prob_var: float,
                 nu_p: int) -> tuple[float, float, float, float]:
        """(t, Bonferroni threshold, half-width of the display interval, df) of ``diff``."""
        kappa = size_safe_inflation(int(np.floor(nu_s)), self.alpha_k) if self.df_rule == "size-safe" else 1.0
        tz, se, df = t_test(diff, seed_var, nu_s, prob_var, nu_p, kappa)
        return tz, float(student_t.ppf(1 - self.alpha_k, df)), float(student_t.ppf(1 - self.q, df)) * se, df


def _gate_row(sm: StudyMatrix, alloc: str, idx: np.ndarray, cidx: np.ndarray | None,
              seed_var: dict[str | tuple, tuple[float, float]], test: _GateTest) -> dict:
    """The gate's row of one allocation: its gain over step 0 tested against the noise, then
    (with a control) its end score against the random-reward control's."""
    mine = sm.runs.loc[idx]
    b = float(mine["budget"].iloc[0])
    m = len(idx)
    start, end = float(np.mean(sm.start[idx])), float(np.mean(sm.end[idx]))
    row = dict(allocation=alloc, budget=b, start=start, end=end, n_seeds=m,
               end_flops=float(np.mean(mine["end_flops"])), control=None, control_diff=np.nan,
               control_lo=np.nan, control_hi=np.nan, control_z=np.nan, threshold_z=np.nan, df=np.nan)
    if not np.isfinite(start):
        row.update(gain=np.nan, gain_lo=np.nan, gain_hi=np.nan, gain_z=np.nan, passed=False,
                   reason="no step-0 evaluation to compare with")
        return row
    start_pp = np.nanmean(sm.start_pp[idx], axis=0) if sm.start_pp is not None else None
    pv, nu_p = _problem_var(sm, idx, start_pp)
    gain = end - start
    s2, nu_s = seed_var.get(alloc, (float("nan"), 0.0))
    nu_s = int(np.floor(nu_s))
    tz, thr, half, df = test(gain, s2 / m, nu_s, pv, nu_p)
    row.update(gain=gain, gain_lo=gain - half, gain_hi=gain + half, gain_z=tz, threshold_z=thr, df=df)
    passed = tz > thr
    reason = "" if passed else f"gain {gain:+.3f} is within the noise (t {tz:.2f} <= {thr:.2f}, {df:.0f} df)"
    if nu_s == 0 and m < 2:
        reason += ("; one seed per cell: seed noise is NOT in the test" if reason else
                   "one seed per cell: seed noise is NOT in the test")
    if cidx is not None:
        diff = end - float(np.mean(sm.end[cidx]))
        ctl_pp = np.nanmean(sm.end_pp[cidx], axis=0) if sm.end_pp is not None else None
        pvc, nu_pc = _problem_var(sm, idx, ctl_pp)
        s2c, nu_c = seed_var.get(tuple(cidx), (s2, nu_s))
        nu_sc = int(np.floor(min(nu_s, nu_c))) if nu_c > 0 else nu_s
        cz, cthr, chalf, _ = test(diff, s2 / m + s2c / len(cidx), nu_sc, pvc, nu_pc)
        row.update(control=f"random@{mine['model'].iloc[0]}", control_diff=diff, control_lo=diff - chalf,
                   control_hi=diff + chalf, control_z=cz)
        if passed and not cz > cthr:
            passed = False
            reason = (f"does not beat the random-reward control beyond the noise "
                      f"({diff:+.3f}, t {cz:.2f} <= {cthr:.2f})")
    row.update(passed=bool(passed), reason=reason)
    return row


def what_to_change(gate: pd.DataFrame) -> str:
    """Advice when no allocation passes the gate."""
    tips = ["larger pilot budgets or more optimizer steps per cell (the gain grows with steps)",
            "a denser reward (e.g. `rule:partial` partial credit instead of 0/1)",
            "more evaluation problems (a paired difference of d needs about 7.8 x disagreement / d^2 problems)"]
    if len(gate) and gate["n_seeds"].min() < 3:
        tips.append("3 or more seeds per cell (2 seeds leave the seed variance with 1 degree of freedom per cell)")
    return "; ".join(tips)
