"""Small formatting helpers shared by the report's sections, figures and renderers."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from race.analysis.tables import jsonable
from race.cards import fmt_flops

__all__ = ["fmt_flops", "text_or", "fmt_score", "fmt_pct", "fmt_prob", "fmt_num", "fmt_interval", "short_labels",
           "jsonable", "is_num"]


def is_num(x: Any) -> bool:
    """A finite real number (not None, NaN, inf or pandas NA)."""
    try:
        return x is not None and x is not pd.NA and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def text_or(x: Any, default: str = "-") -> str:
    """``str(x)``, or ``default`` for None / NaN / empty."""
    if x is None or x is pd.NA or (isinstance(x, float) and math.isnan(x)) or str(x) == "":
        return default
    return str(x)


def fmt_score(x: Any, digits: int = 3) -> str:
    return f"{float(x):.{digits}f}" if is_num(x) else "n/a"


def fmt_pct(x: Any, digits: int = 1) -> str:
    return f"{100 * float(x):.{digits}f}%" if is_num(x) else "n/a"


def fmt_prob(x: Any) -> str:
    return f"{float(x):.2f}" if is_num(x) else "n/a"


def fmt_num(x: Any) -> str:
    if not is_num(x):
        return "n/a"
    v = float(x)
    return f"{int(v):,}" if v.is_integer() and abs(v) < 1e15 else f"{v:.3g}"


def fmt_interval(lo: Any, hi: Any, digits: int = 3) -> str:
    if not (is_num(lo) and is_num(hi)):
        return "n/a"
    return f"[{float(lo):.{digits}f}, {float(hi):.{digits}f}]"


def short_labels(keys: Iterable[str]) -> dict[str, str]:
    """Shorter names for allocation keys: only the ``|``-separated parts that differ.

    ``["m|G=4|P=16|rule", "m|G=8|P=16|rule"]`` -> ``{..: "G=4", ..: "G=8"}``. Keys whose
    part counts differ are left whole.
    """
    keys = list(dict.fromkeys(str(k) for k in keys))
    parts = [k.split("|") for k in keys]
    if not keys or len({len(p) for p in parts}) != 1:
        return {k: k for k in keys}
    vary = [i for i in range(len(parts[0])) if len({p[i] for p in parts}) > 1]
    if not vary:  # one allocation (or all equal): keep the model and the reward
        vary = [0, len(parts[0]) - 1] if len(parts[0]) > 1 else [0]
    return {k: " ".join(p[i] for i in vary) for k, p in zip(keys, parts)}
