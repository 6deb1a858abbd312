"""The report as data: sections made of blocks, rendered to HTML and Markdown alike.

A :class:`Section` is a title, a list of blocks (text, key-value rows, tables, figures,
notes) and ``data`` (the section's numbers, written to ``report.json``). A section that
cannot be shown says why in ``missing`` ("needs >= 3 model sizes", ...) instead of
failing the report. :class:`Context` holds what several sections share (the pilot
tables, targets, regimes, the recommendation), computed once.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import pandas as pd

from race.protocol import Study
from race.schema import FINISHED


@dataclass
class Text:
    text: str
    strong: bool = False


@dataclass
class KeyValues:
    rows: list[tuple[str, str]]


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]
    caption: str = ""


@dataclass
class Figure:
    key: str
    png: bytes
    caption: str


@dataclass
class Note:
    text: str
    level: str = "info"  # info | warn


@dataclass
class Callout:
    """The headline box: a title, lines, and a label (e.g. the confidence) with its tone."""

    title: str
    lines: list[str]
    label: str = ""
    tone: str = "neutral"  # good | caution | bad | neutral


Block = Text | KeyValues | Table | Figure | Note | Callout


@dataclass
class Section:
    key: str
    title: str
    blocks: list[Block] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    missing: str | None = None

    def add(self, *blocks: Block | None) -> "Section":
        self.blocks.extend(b for b in blocks if b is not None)
        return self

    @property
    def figures(self) -> list[Figure]:
        return [b for b in self.blocks if isinstance(b, Figure)]


def finished(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs that finished (complete or diverged) with a FLOP total."""
    return runs[runs["status"].astype(str).isin(FINISHED) & runs["total_flops"].notna()]


def is_prefix(runs: pd.DataFrame) -> pd.Series:
    """Rows that are a prefix of another run (a nested grid's reading of its largest budget's
    run at a smaller budget: ``prefix_of`` names that run). They are observations, not compute:
    their FLOPs and ledger are part of the run they were read from."""
    if "prefix_of" not in runs.columns:
        return pd.Series(False, index=runs.index)
    return runs["prefix_of"].map(lambda v: isinstance(v, str) and bool(v))


def spent(runs: pd.DataFrame) -> pd.DataFrame:
    """The finished runs that executed compute: :func:`finished` without prefixes, so a nested
    study's FLOPs, budgets and ledger are counted once per trajectory."""
    done = finished(runs)
    return done[~is_prefix(done)]


@dataclass
class Context:
    """Shared inputs and cached results of the report's analysis."""

    study: Study
    target_budget: float
    targets: list[str]
    rng: int
    n_boot: int
    n_boot_fit: int
    labels: dict[str, str]
    runs: pd.DataFrame  # pilot runs, every status
    evals: pd.DataFrame  # evaluation rows of the pilot runs
    prepared: pd.DataFrame  # complete pilot runs with allocation keys
    notes: list[str] = field(default_factory=list)
    cache: dict[str, Any] = field(default_factory=dict)
    count_rm_training: bool = False  # the report card counts the reward models' training FLOPs

    @property
    def primary(self) -> str:
        return self.targets[0]

    def cached(self, key: str, fn: Callable[[], Any]) -> Any:
        if key not in self.cache:
            self.cache[key] = fn()
        return self.cache[key]

    @property
    def recommendation(self) -> tuple[Any, list[str]]:
        """(recommendation, its notes) for the primary target at the target budget, computed
        once, on first use, whichever section asks first (``Study.recommendation``); an error is
        kept and raised again to every caller."""
        if "rec" not in self.cache:
            try:
                rec = self.study.recommendation(self.primary, self.target_budget, n_boot=self.n_boot_fit,
                                                rng=self.rng)
                self.cache["rec"] = (rec, list(rec.notes))
            except Exception as e:  # noqa: BLE001 - the recommendation section reports it
                self.cache["rec"] = e
        got = self.cache["rec"]
        if isinstance(got, Exception):
            raise got
        return got

    @property
    def rec(self) -> Any:
        """The recommendation, or None when none could be made (the recommendation section
        says why)."""
        try:
            return self.recommendation[0]
        except Exception:  # noqa: BLE001
            return None

    @property
    def total_flops(self) -> float:
        """Counted FLOPs of every finished run of the study (pilot and validation; a nested
        grid's prefixes are inside the runs they were read from: :func:`spent`)."""
        return float(spent(self.study.runs)["total_flops"].sum())

    def label(self, key: str) -> str:
        return self.labels.get(key, key)


def guarded(key: str, title: str, build: Callable[[], Section]) -> Section:
    """Run a section builder; an unexpected error becomes the section's ``missing`` note
    (with the traceback in ``data``) so one broken section never loses the report."""
    try:
        return build()
    except Exception as e:  # noqa: BLE001 - the report must render; the error is shown, not hidden
        return Section(key, title, missing=f"could not be computed ({type(e).__name__}: {e})",
                       data={"error": traceback.format_exc()})


def figure(key: str, caption: str, make: Callable[[], bytes]) -> Figure | Note:
    """A figure block, or a warning note when drawing it fails."""
    try:
        return Figure(key, make(), caption)
    except Exception as e:  # noqa: BLE001
        return Note(f"figure {key!r} could not be drawn ({type(e).__name__}: {e})", "warn")


__all__ = ["Text", "KeyValues", "Table", "Figure", "Note", "Callout", "Block", "Section", "Context", "guarded",
           "figure"]
