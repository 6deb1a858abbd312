"""Over-optimisation of a learned reward: the proxy reward climbs while verified accuracy
falls (Gao et al., "Scaling laws for reward model overoptimization"). A pure function over
a run's metric rows, so the engine can put its verdict into ``run.json``.

    overoptimisation(train_rows, eval_rows)
      -> {"flag": bool, "proxy_slope": float, "verified_slope": float, "reason": str, ...}

Train rows (``kind == "train"``) carry ``reward_mean`` (the proxy the policy optimises) and
``verified_mean`` (0/1 final-answer correctness of the same samples) per step; eval rows
(``kind == "eval"``) carry greedy ``score`` per ``target`` at a ``step``. Slopes are
least-squares fits against the run's progress ``x`` (step / last step, so a slope is the
change over the whole run) over the SECOND HALF of the run (the early climb is the
policy learning the format, not over-optimisation). The flag needs both a proxy slope of
at least ``min_slope`` and a verified slope of at most ``-min_slope`` (noise-sized
wobbles, docs/design.md section 4, stay unflagged), and at least ``min_points`` points.
The verified signal is the greedy evaluation of ``eval_target`` when the second half has
``min_points`` evaluations; otherwise the train rows' ``verified_mean``.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ``ys`` on ``xs`` (0 with fewer than 2 distinct x)."""
    n = len(xs)
    if n < 2 or n != len(ys):
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if f == f and abs(f) != float("inf") else None


def _series(rows: Iterable[Mapping[str, Any]], key: str, **match: Any) -> list[tuple[float, float]]:
    out = []
    for r in rows:
        if any(r.get(k) != v for k, v in match.items()):
            continue
        s, y = _num(r.get("step")), _num(r.get(key))
        if s is not None and y is not None:
            out.append((s, y))
    return sorted(out)


def _second_half(points: list[tuple[float, float]], last: float) -> tuple[list[float], list[float]]:
    half = [(s / last, y) for s, y in points if s >= last / 2] if last > 0 else []
    return [x for x, _ in half], [y for _, y in half]


def overoptimisation(train_rows: Sequence[Mapping[str, Any]], eval_rows: Sequence[Mapping[str, Any]] = (), *,
                     min_slope: float = 0.05, min_points: int = 3, eval_target: str = "greedy") -> dict[str, Any]:
    """Flag a run whose proxy reward rises while verified accuracy falls (module docstring).

    Returns ``flag``, ``proxy_slope``, ``verified_slope`` (change per whole run, over the
    second half), ``verified_source`` (``"eval:<target>"`` or ``"train"``), ``points`` and
    a one-line ``reason``."""
    train = [r for r in train_rows if r.get("kind", "train") == "train"]
    proxy = _series(train, "reward_mean")
    evals = _series([r for r in eval_rows if r.get("kind", "eval") == "eval"], "score", target=eval_target)
    steps = [s for s, _ in proxy] + [s for s, _ in evals]
    last = max(steps) if steps else 0.0
    px, py = _second_half(proxy, last)
    ex, ey = _second_half(evals, last)
    if len(ex) >= min_points:
        vx, vy, source = ex, ey, f"eval:{eval_target}"
    else:
        vx, vy = _second_half(_series(train, "verified_mean"), last)
        source = "train"
    out: dict[str, Any] = dict(flag=False, proxy_slope=round(slope(px, py), 6), verified_slope=round(slope(vx, vy), 6),
                               verified_source=source, points={"proxy": len(px), "verified": len(vx)},
                               min_slope=min_slope)
    if len(px) < min_points or len(vx) < min_points:
        out["reason"] = (f"too few points in the second half of the run (proxy {len(px)}, verified {len(vx)}; "
                         f"need {min_points}): no verdict")
        return out
    up, down = out["proxy_slope"] >= min_slope, out["verified_slope"] <= -min_slope
    out["flag"] = up and down
    if out["flag"]:
        out["reason"] = (f"over-optimisation: proxy reward rose {out['proxy_slope']:+.3f} while verified accuracy "
                         f"({source}) fell {out['verified_slope']:+.3f} over the second half of the run")
    elif up:
        out["reason"] = f"proxy reward rose {out['proxy_slope']:+.3f}; verified accuracy did not fall by {min_slope}"
    elif down:
        out["reason"] = (f"verified accuracy fell {out['verified_slope']:+.3f} but the proxy reward did not rise "
                         f"by {min_slope}")
    else:
        out["reason"] = f"no trend beyond {min_slope} in the proxy or verified accuracy over the second half"
    return out
