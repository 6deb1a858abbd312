"""Rich tables that stay readable at any width (80-column terminals, CI logs).

Rich's default shrinks a table that does not fit by cutting cells to ``qwen2.5-…``. That
hides exactly what a reader needs (which model, which reward), so every table the CLI
prints goes through :func:`print_table`:

- no cell is ever ellipsized: text wraps at spaces, and a word longer than its column
  folds onto the next line;
- output that is not a terminal (a log file, CI, a pipe) has no real width, so the table
  is printed at its natural width rather than squeezed into Rich's default 80 columns;
- on a terminal too narrow for the table, :func:`column_widths` chooses the widths: text
  wraps at spaces first (an allocation label goes one setting per line), then header
  words fold, and data fold only when that is not enough. An 80-column terminal shows
  every model and reward name of ``race plan`` whole.
"""

from __future__ import annotations

from typing import Any


def _measure(console: Any, renderable: Any) -> tuple[int, int]:
    """(longest word, whole line) width of a cell or header, in terminal cells."""
    from rich.measure import Measurement

    m = Measurement.get(console, console.options.update_width(10**6), renderable)
    return m.minimum, m.maximum


def fmt_seconds(s: float | None) -> str:
    """``1h05m``, ``3m07s`` or ``-``: a wall time as the plans print it."""
    if s is None:
        return "-"
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def natural_width(console: Any, table: Any) -> int:
    """The width the table takes when nothing wraps."""
    return _measure(console, table)[1]


def _shrink(widths: list[int], floors: list[int], excess: int) -> int:
    """Take ``excess`` cells off the widest columns still above their floor, one at a
    time (so the widest shrink first and end up even); returns what could not be taken."""
    while excess > 0:
        above = [i for i, (w, f) in enumerate(zip(widths, floors)) if w > f]
        if not above:
            break
        i = max(above, key=lambda j: widths[j])
        widths[i] -= 1
        excess -= 1
    return excess


def column_widths(console: Any, table: Any, width: int) -> list[int]:
    """Content widths that fit ``table`` into ``width`` terminal cells, giving up in this
    order until it fits: wrap text at spaces (no word is broken); fold header words (the
    data stay whole); fold data words longer than 6 cells (long names), widest column
    first; anything."""
    cols = table.columns
    natural, word, cell_word = [], [], []
    for col in cols:
        cells = [_measure(console, c) for c in col.cells]
        head = _measure(console, col.header)
        natural.append(max([head[1], *(c[1] for c in cells)]))
        word.append(max([head[0], *(c[0] for c in cells)]))
        cell_word.append(max([1, *(c[0] for c in cells)]))
    chrome = natural_width(console, table) - sum(natural)
    widths = list(natural)
    excess = sum(widths) + chrome - width
    for floors in (word, cell_word, [min(cw, 6) for cw in cell_word], [1] * len(cols)):
        excess = _shrink(widths, floors, excess)
    return widths


def print_table(console: Any, table: Any) -> None:
    """Print a Rich table without cutting any cell (see the module docstring)."""
    for col in table.columns:
        col.overflow = "fold"
    natural = natural_width(console, table)
    if natural <= console.width:
        console.print(table)
    elif not console.is_terminal:
        width = console.width
        console.width = natural  # print() alone cannot exceed the console's width
        try:
            console.print(table, crop=False)
        finally:
            console.width = width
    else:
        for col, w in zip(table.columns, column_widths(console, table, console.width)):
            col.width, col.no_wrap = w, False
        console.print(table)
