"""Plotting primitives shared by the report figures: a Figure on its own Agg canvas, PNG
bytes, colours, panel grids, and log-FLOP axes whose tick labels never collide.

matplotlib is imported inside the functions (no pyplot state, no display needed).
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

DPI = 100
AXIS_COLORS = {"size": "#4e79a7", "search": "#f28e2b", "learning": "#59a14f", "feedback": "#b07aa1",
               "other": "#76b7b2", "mixed": "#9c755f", "tie": "#d9d9d9", "none": "#ffffff"}
PHASE_COLORS = {"rollout": "#4e79a7", "wasted": "#a0cbe8", "learning": "#59a14f", "feedback": "#b07aa1",
                "other": "#bab0ac"}


def new_figure(width: float, height: float) -> Any:
    """A Figure on its own Agg canvas (no pyplot, no global backend switch)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def to_png(fig: Any) -> bytes:
    """PNG bytes of a matplotlib Figure."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", facecolor="white")
    return buf.getvalue()


def colors(n: int) -> list[Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(max(n, 1))]


def panel_grid(n: int, max_cols: int = 3) -> tuple[int, int]:
    cols = min(n, max_cols)
    return (n + cols - 1) // cols, cols


def _compact(x: float, unit: str = "") -> str:
    """1e15 -> '1 P' + unit, 3e6 -> '3 M' (tick labels: plain text, no mathtext)."""
    for suffix, scale in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:g} {suffix}{unit}"
    return f"{x:g} {unit}".rstrip()


#: Ticks per decade tried on a log axis, densest first (then every k-th decade).
LOG_TICK_SUBS = ((1.0, 2.0, 5.0), (1.0, 3.0), (1.0,))


def _spaced_log_locator(formatter: Any, gap_px: float = 8.0) -> Any:
    """A matplotlib Locator for a log axis: major ticks at 1-2-5, 1-3 or 1 per decade, or
    every k-th decade, the densest choice whose labels (measured with the axis's own font
    at draw time, after layout) keep ``gap_px`` between neighbours. A fixed choice collides
    on short spans ("5 GFLOP10 GFLOP20 GFLOP" over one decade in a narrow panel)."""
    from matplotlib.ticker import Locator

    class SpacedLogLocator(Locator):
        def __call__(self) -> Any:
            vmin, vmax = self.axis.get_view_interval()
            return self.tick_values(vmin, vmax)

        def tick_values(self, vmin: float, vmax: float) -> Any:
            return np.asarray(_spaced_log_ticks(self.axis, formatter, vmin, vmax, gap_px))

    return SpacedLogLocator()


def _decade_ticks(lo: float, hi: float, subs: tuple[float, ...], every: int = 1) -> list[float]:
    e0, e1 = int(np.floor(np.log10(lo))) - 1, int(np.ceil(np.log10(hi))) + 1
    out = [m * 10.0 ** e for e in range(e0, e1 + 1) if e % every == 0 for m in subs]
    return [t for t in out if lo * (1 - 1e-9) <= t <= hi * (1 + 1e-9)]


def _labels_fit(axis: Any, formatter: Any, ticks: list[float], lo: float, hi: float, gap_px: float) -> bool:
    """Do the labels of ``ticks`` keep ``gap_px`` between neighbours on this axis?"""
    if len(ticks) < 2 or axis is None or axis.axes is None:
        return True
    fig = axis.axes.figure
    renderer = fig.canvas.get_renderer()
    box = axis.axes.get_window_extent(renderer)
    horizontal = axis.axis_name == "x"
    length = box.width if horizontal else box.height
    major = axis.get_major_ticks(1)  # with a count, no locator call (no recursion)
    if major:
        font = major[0].label1.get_fontproperties()
    else:  # pragma: no cover - an axis always has a tick to copy from
        from matplotlib.font_manager import FontProperties

        font = FontProperties()
    span = np.log10(hi) - np.log10(lo)
    pos = [(np.log10(t) - np.log10(lo)) / span * length for t in ticks]
    sizes = []
    for t in ticks:
        w, h, _ = renderer.get_text_width_height_descent(formatter(t, None), font, ismath=False)
        sizes.append(w if horizontal else h)
    return all(pos[i + 1] - pos[i] >= (sizes[i] + sizes[i + 1]) / 2 + gap_px for i in range(len(ticks) - 1))


def _spaced_log_ticks(axis: Any, formatter: Any, vmin: float, vmax: float, gap_px: float) -> list[float]:
    lo, hi = sorted((float(vmin), float(vmax)))
    if not (lo > 0 and np.isfinite(hi)) or hi <= lo:
        return [hi] if hi > 0 else []
    choices = [_decade_ticks(lo, hi, subs) for subs in LOG_TICK_SUBS]
    choices += [_decade_ticks(lo, hi, (1.0,), every=k) for k in range(2, 13)]
    for ticks in choices:
        if len(ticks) >= 2 and _labels_fit(axis, formatter, ticks, lo, hi, gap_px):
            return ticks
    # no two labels fit (a narrow panel): one label, a power of ten when there is one
    single = next((c for c in choices[2:] if c), None) or choices[0]
    return single[len(single) // 2:len(single) // 2 + 1]


def log_axis(ax: Any, axis: str = "x", unit: str = "", limits: tuple[float, float] | None = None) -> None:
    """Log scale with plain-text major labels (1 PFLOP, 10 PFLOP, ...) spaced so they never
    touch (:func:`_spaced_log_locator`) and no minor ticks; ``limits`` fixes the axis range."""
    from matplotlib.ticker import FuncFormatter, NullLocator

    getattr(ax, f"set_{axis}scale")("log")
    a = ax.xaxis if axis == "x" else ax.yaxis
    if limits is not None:
        (ax.set_xlim if axis == "x" else ax.set_ylim)(*limits)
    formatter = FuncFormatter(lambda v, _pos: _compact(v, unit))
    a.set_major_locator(_spaced_log_locator(formatter))
    a.set_major_formatter(formatter)
    a.set_minor_locator(NullLocator())


def legend(ax: Any, **kw: Any) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, fontsize=8, frameon=False, **kw)
