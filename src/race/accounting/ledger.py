"""The FLOP ledger: append-only records of what each step spent, by phase.

Records persist as JSON Lines. Each append writes whole lines and flushes them to disk
(fsync), so a crash can tear at most the last line; ``load`` detects a torn last line and
drops it (with a warning and a truncation of the file, so later appends stay clean). A
malformed line anywhere else is corruption and raises: it is never silently mixed in.

``counted`` records are charged to the budget; ``recompute`` (hardware FLOPs), ``eval``,
``warmstart``, ``overrun`` and ``executed`` records are kept apart and never charged.
``executed`` holds what a generator really executed where the counted record charges more
(vLLM prefills each prompt once for its G samples; ``rollout/prefill`` charges every row,
the budget's bound): ``executed/rollout_prefill`` beside the counted ``rollout/prefill``. ``overrun`` holds
what a step executed that the budget could not take (its bound was low): the run stops
there (a clean ``budget`` stop), the ledger's counted total stays within the budget, and
the FLOPs are still on record (:meth:`FlopLedger.record_overrun`).
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Iterator

from .errors import AccountingError
from .phases import PHASES
from .guard import UNCOUNTED_PHASES, BudgetExceededError, check_budget, fits, is_counted

KNOWN_PHASES = (*PHASES, *UNCOUNTED_PHASES)  # every phase a ledger records


class LedgerCorruptError(AccountingError):
    """A ledger file has a malformed line that is not a torn final write."""


@dataclass(frozen=True)
class LedgerRecord:
    step: int
    phase: str
    component: str
    flops: int
    tokens: int = 0
    seconds: float = 0.0
    counted: bool = True

    def __post_init__(self) -> None:
        if self.phase not in KNOWN_PHASES:
            raise AccountingError(f"unknown ledger phase {self.phase!r}; use one of {', '.join(KNOWN_PHASES)}")
        if not isinstance(self.flops, int) or self.flops < 0:
            raise AccountingError(f"ledger flops must be a non-negative integer, got {self.flops!r}")
        if self.counted and self.phase in UNCOUNTED_PHASES:
            raise AccountingError(f"phase {self.phase!r} is never charged to the budget: record it with counted=False")

    @property
    def key(self) -> str:
        return f"{self.phase}/{self.component}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict) -> "LedgerRecord":
        return cls(step=int(d["step"]), phase=d["phase"], component=d.get("component", ""), flops=int(d["flops"]),
                   tokens=int(d.get("tokens", 0)), seconds=float(d.get("seconds", 0.0)),
                   counted=bool(d.get("counted", True)))


def read_jsonl_records(path: Path) -> tuple[list[dict], int | None]:
    """Parse a JSON Lines file; return (objects, byte offset of a torn last line or None).
    A bad line that is not the last one raises ``LedgerCorruptError``."""
    data = path.read_bytes()
    objs: list[dict] = []
    offset = 0
    lines = data.split(b"\n")
    for i, raw in enumerate(lines):
        is_last = i == len(lines) - 1
        if is_last and raw == b"":
            break
        try:
            obj = json.loads(raw.decode("utf-8"))
            if not isinstance(obj, dict):
                raise ValueError("not an object")
            if is_last:  # complete JSON but no newline: the write was torn before "\n"
                raise ValueError("no trailing newline")
        except (ValueError, UnicodeDecodeError) as e:
            if is_last:
                return objs, offset
            raise LedgerCorruptError(f"{path}: line {i + 1} is malformed ({e}) and is not the last line; "
                                     "the file is corrupt (restore it or start a new run)") from None
        objs.append(obj)
        offset += len(raw) + 1
    return objs, None


class FlopLedger:
    """Append-only FLOP records with per-phase totals and a budget.

    >>> led = FlopLedger(budget=1e6)
    >>> led.add(0, "rollout", "decode", 400_000, tokens=100)
    >>> led.remaining
    600000.0
    """

    def __init__(self, path: str | Path | None = None, budget: float | None = None) -> None:
        self.budget = check_budget(budget) if budget is not None else None
        self.path = Path(path) if path is not None else None
        self._records: list[LedgerRecord] = []
        if self.path is not None and self.path.exists():
            self._records = self._load_file(self.path)

    # -- persistence ----------------------------------------------------------------
    @staticmethod
    def _load_file(path: Path) -> list[LedgerRecord]:
        objs, torn = read_jsonl_records(path)
        if torn is not None:
            warnings.warn(f"{path}: dropped a torn last line (an interrupted write) at byte {torn}", stacklevel=3)
            with path.open("r+b") as f:
                f.truncate(torn)
        return [LedgerRecord.from_dict(o) for o in objs]

    @classmethod
    def load(cls, path: str | Path, budget: float | None = None) -> "FlopLedger":
        p = Path(path)
        if not p.exists():
            raise AccountingError(f"no ledger at {p}")
        return cls(p, budget=budget)

    def _persist(self, records: list[LedgerRecord]) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        blob = "".join(r.to_json() + "\n" for r in records)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())

    # -- recording ------------------------------------------------------------------
    def extend(self, records: Iterable[LedgerRecord], *, enforce_budget: bool = True) -> None:
        """Append records atomically (all written in one flush). Refuses, before writing
        anything, records that would take the counted total past the budget."""
        recs = list(records)
        add = sum(r.flops for r in recs if r.counted)
        if enforce_budget and not fits(self.total, add, self.budget):
            raise BudgetExceededError(
                f"charging {add:.4g} FLOPs would exceed the budget ({self.total:.4g} spent of {self.budget:.4g})"
            )
        self._persist(recs)
        self._records.extend(recs)

    def add(self, step: int, phase: str, component: str, flops: int, *, tokens: int = 0, seconds: float = 0.0,
            counted: bool | None = None) -> None:
        if counted is None:
            counted = is_counted(phase)
        self.extend([LedgerRecord(step, phase, component, int(flops), tokens, seconds, counted)])

    def add_components(self, step: int, components: dict[str, int], *, tokens: dict[str, int] | None = None,
                       seconds: dict[str, float] | None = None) -> None:
        """Append one record per ``phase/component`` key (e.g. ``PhaseFlops.components``)."""
        recs = []
        for key, flops in components.items():
            phase, _, comp = key.partition("/")
            recs.append(LedgerRecord(step, phase, comp, int(flops), (tokens or {}).get(key, 0),
                                     (seconds or {}).get(key, 0.0), is_counted(phase)))
        self.extend(recs)

    def record_overrun(self, step: int, components: dict[str, int], *, tokens: dict[str, int] | None = None,
                       seconds: dict[str, float] | None = None) -> int:
        """Record FLOPs that step ``step`` executed but the budget cannot take, uncounted:
        ``phase/component`` becomes ``overrun/phase_component`` (recompute included: all
        of it is hardware work). Returns the FLOPs recorded."""
        recs = [LedgerRecord(step, "overrun", key.replace("/", "_"), int(flops), (tokens or {}).get(key, 0),
                             (seconds or {}).get(key, 0.0), False)
                for key, flops in components.items()]
        self.extend(recs)
        return sum(r.flops for r in recs)

    # -- queries --------------------------------------------------------------------
    def __iter__(self) -> Iterator[LedgerRecord]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)

    @property
    def records(self) -> list[LedgerRecord]:
        return list(self._records)

    @property
    def total(self) -> int:
        """Counted FLOPs (what the budget is charged)."""
        return sum(r.flops for r in self._records if r.counted)

    @property
    def remaining(self) -> float:
        if self.budget is None:
            return float("inf")
        return self.budget - self.total

    def totals_by_phase(self, *, counted_only: bool = False) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self._records:
            if counted_only and not r.counted:
                continue
            out[r.phase] = out.get(r.phase, 0) + r.flops
        return out

    def totals_by_key(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self._records:
            out[r.key] = out.get(r.key, 0) + r.flops
        return out

    def seconds_by_phase(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for r in self._records:
            out[r.phase] = out.get(r.phase, 0.0) + r.seconds
        return out

    def tokens_by_phase(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self._records:
            out[r.phase] = out.get(r.phase, 0) + r.tokens
        return out

    def steps(self) -> int:
        """Number of distinct training steps with counted records."""
        return len({r.step for r in self._records if r.counted})

    def truncate_after(self, step: int) -> None:
        """Drop records of steps after ``step`` and rewrite the file (used on resume from a
        checkpoint taken at ``step``, so nothing is double-counted)."""
        keep = [r for r in self._records if r.step <= step]
        if self.path is not None:
            tmp = self.path.with_suffix(self.path.suffix + ".tmp")
            tmp.write_text("".join(r.to_json() + "\n" for r in keep), encoding="utf-8")
            os.replace(tmp, self.path)
        self._records = keep
