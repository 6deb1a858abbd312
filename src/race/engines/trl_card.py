"""The compute report card of a TRL run, rebuilt from the ledgers the drop-in wrote
(``race card OUTPUT_DIR``), e.g. after a crash left no ``report_card.*``.

What ``RaceFlopCallback`` leaves in its output directory (``race.engines.trl.distributed``):

- ``ledger.jsonl``: the run's ledger (one process: everything; several: the global ledger,
  written by the main process after the ranks exchanged each step);
- ``ledger.rank<r>.jsonl``: with several processes, what rank ``r``'s hooks saw;
- ``report_card.{json,md,tex}`` when training ended normally.

Rank files, when present, are merged as the callback merges a step (FLOPs and tokens summed
per key, seconds the largest rank's: the ranks run side by side), over the steps every rank
recorded: a step missing from a rank (it died first) is left out and named. Without rank
files, ``ledger.jsonl`` is the ledger. Files are read, never modified (a torn last line, an
interrupted write, is skipped and named).

The card's other entries come, in this order, from the arguments, from an earlier
``report_card.json`` in the directory (a resumed run's), and from the newest TRL
``checkpoint-*``'s ``config.json`` (model size) or ``adapter_config.json`` (LoRA rank, base
model). The budget and group size are not in the ledgers: pass them when no earlier card has
them. The card says it was rebuilt (``extra.rebuilt_from``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from race.accounting import AccountingError, FlopLedger, ModelShape, ReportCard
from race.accounting.conventions import Conventions
from race.accounting.ledger import LedgerRecord, read_jsonl_records

RANK_FILE = re.compile(r"^ledger\.rank(\d+)\.jsonl$")


def _read(path: Path, notes: list[str]) -> list[LedgerRecord]:
    objs, torn = read_jsonl_records(path)
    if torn is not None:
        notes.append(f"{path.name}: skipped a torn last line at byte {torn} (an interrupted write)")
    return [LedgerRecord.from_dict(o) for o in objs]


def merge_rank_records(ranks: dict[int, list[LedgerRecord]], notes: list[str] | None = None) -> list[LedgerRecord]:
    """One ledger from per-rank records: per ``(step, phase, component, counted)`` FLOPs and
    tokens summed, seconds the largest rank's; only steps that every rank recorded."""
    notes = notes if notes is not None else []
    steps = [{r.step for r in recs} for recs in ranks.values()]
    common = set.intersection(*steps) if steps else set()
    partial = sorted(set.union(*steps) - common) if steps else []
    if partial:
        notes.append(f"steps {partial} are missing from some rank files (a rank stopped first): left out")
    merged: dict[tuple[int, str, str, bool], list[float]] = {}
    for recs in ranks.values():
        for r in recs:
            if r.step not in common:
                continue
            acc = merged.setdefault((r.step, r.phase, r.component, r.counted), [0, 0, 0.0])
            acc[0] += r.flops
            acc[1] += r.tokens
            acc[2] = max(acc[2], r.seconds)
    return [LedgerRecord(step, phase, comp, int(f), int(t), s, counted)
            for (step, phase, comp, counted), (f, t, s) in sorted(merged.items(), key=lambda kv: kv[0][:3])]


def _checkpoint_meta(directory: Path) -> dict[str, Any]:
    """Model size and LoRA rank from the newest ``checkpoint-<step>`` (JSON files only)."""
    ckpts = sorted((p for p in directory.glob("checkpoint-*") if p.is_dir() and p.name[11:].isdigit()),
                   key=lambda p: int(p.name[11:]))
    for ck in reversed(ckpts):
        meta: dict[str, Any] = {}
        adapter = ck / "adapter_config.json"
        if adapter.exists():
            cfg = json.loads(adapter.read_text())
            meta["lora_rank"] = cfg.get("r")
            base = cfg.get("base_model_name_or_path")
            if base:
                meta["model"] = str(base)
                if (Path(base) / "config.json").exists():
                    meta["model_params"] = ModelShape.from_hf_config(Path(base) / "config.json").num_params()
        if (ck / "config.json").exists():
            shape = ModelShape.from_hf_config(ck / "config.json")
            meta.setdefault("model_params", shape.num_params())
            name = json.loads((ck / "config.json").read_text()).get("_name_or_path")
            if name:
                meta.setdefault("model", str(name))
        if meta:
            meta["from_checkpoint"] = ck.name
            return meta
    return {}


def load_run_ledger(directory: str | Path, *, budget_flops: float | None = None) -> tuple[FlopLedger, dict[str, Any]]:
    """The run's ledger from ``directory`` (rank files merged, else ``ledger.jsonl``) and
    what was read: ``{"files": [...], "ranks": n, "notes": [...]}``."""
    d = Path(directory)
    if not d.is_dir():
        raise AccountingError(f"{d}: not a directory; pass the output_dir the RACE callback wrote its ledger to")
    notes: list[str] = []
    ranks = {int(m.group(1)): p for p in d.iterdir() if (m := RANK_FILE.match(p.name))}
    main = d / "ledger.jsonl"
    if ranks:
        records = merge_rank_records({r: _read(p, notes) for r, p in sorted(ranks.items())}, notes)
        files = [ranks[r].name for r in sorted(ranks)]
        if main.exists():
            glob_total = sum(r.flops for r in _read(main, notes) if r.counted)
            merged_total = sum(r.flops for r in records if r.counted)
            if glob_total != merged_total:
                notes.append(f"ledger.jsonl counts {glob_total} FLOPs, the merged rank files {merged_total} (steps "
                             "the main process recorded but a rank did not, or the reverse): the card uses the merge")
    elif main.exists():
        records, files = _read(main, notes), [main.name]
    else:
        raise AccountingError(f"{d}: no RACE ledger here (ledger.jsonl or ledger.rank<r>.jsonl); pass the directory "
                              "the callback wrote to: the trainer's args.output_dir, or add_race_accounting's "
                              "output_dir")
    if not records:
        raise AccountingError(f"{d}: {', '.join(files)} hold no records (the run stopped before its first step)")
    ledger = FlopLedger(budget=budget_flops)
    ledger.extend(records, enforce_budget=False)
    return ledger, {"files": files, "ranks": len(ranks) or 1, "notes": notes}


def rebuild_report_card(directory: str | Path, *, conventions: str | None = None, budget_flops: float | None = None,
                        model: str | None = None, model_params: int | None = None, lora_rank: int | None = None,
                        num_generations: int | None = None) -> ReportCard:
    """The report card of the TRL run whose ledgers are in ``directory`` (module docstring)."""
    from race.accounting.trl_step import TRL_CONVENTIONS_NOTE

    d = Path(directory)
    earlier: dict[str, Any] = {}
    if (d / "report_card.json").exists():
        earlier = json.loads((d / "report_card.json").read_text())
    ck = _checkpoint_meta(d)
    budget = budget_flops if budget_flops is not None else earlier.get("budget_flops")
    ledger, info = load_run_ledger(d, budget_flops=budget)
    conv: Any = conventions or "race"
    if conventions is None and earlier.get("conventions"):
        try:
            conv = Conventions(**earlier["conventions"])  # the run's own, custom ones included
        except (TypeError, AccountingError):
            conv = earlier["conventions"].get("name", "race")
    extra = {k: v for k, v in (earlier.get("extra") or {}).items() if k != "rebuilt_from"}
    extra.update({"engine": "trl", "rebuilt_from": info["files"]})
    if info["ranks"] > 1:
        extra["processes"] = info["ranks"]
    if info["notes"]:
        extra["rebuild_notes"] = info["notes"]
    if ck.get("from_checkpoint"):
        extra["model_from"] = ck["from_checkpoint"]

    def pick(value: Any, key: str, default: Any) -> Any:
        if value is not None:
            return value
        if earlier.get(key) not in (None, "", 0):
            return earlier[key]
        return ck.get(key, default)

    card = ReportCard.from_ledger(ledger, conventions=conv, model=pick(model, "model", ""),
                                  model_params=int(pick(model_params, "model_params", 0) or 0),
                                  lora_rank=pick(lora_rank, "lora_rank", None),
                                  num_generations=int(pick(num_generations, "num_generations", 0) or 0), extra=extra)
    if TRL_CONVENTIONS_NOTE not in card.conventions_text:
        card.conventions_text = f"{card.conventions_text}; {TRL_CONVENTIONS_NOTE}"
    return card


__all__ = ["load_run_ledger", "merge_rank_records", "rebuild_report_card"]
