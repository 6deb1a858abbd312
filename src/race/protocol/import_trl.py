"""A TRL output directory as an imported run (``race import DIR``, docs/import.md).

What is read, all of it JSON (``training_args.bin`` is a pickle and is never opened):

- ``trainer_state.json`` (the directory's own, written by ``trainer.save_state()``, else
  the latest ``checkpoint-N/``'s): ``log_history``. Evaluations are its ``eval_*`` entries
  (``eval_strategy`` on, ``eval_on_start=True`` for step 0); the score is one ``eval_*``
  key (``--score-key``; by default the one ``eval_rewards/<function>/mean``: TRL's mean
  reward of the sampled completions, a ``pass@1``-style target).
- FLOPs: with RACE's callback on (``add_race_accounting``), every log entry carries
  ``race/flops`` (the ledger's counted total) and ``race/flops/<phase>``: an evaluation's
  FLOPs are its entry's ``race/flops`` and the stored ledger is ``ledger.jsonl`` (else the
  per-phase totals of the log entries). Without it, each training log's ``num_tokens``
  (cumulative prompt + completion tokens of every generation) and
  ``completions/mean_length`` give the tokens of the generations since the previous log,
  charged by ``race.protocol.import_charge`` (the run's model shape, its LoRA from the
  checkpoint's ``adapter_config.json``, TRL's settings from the run's fields).
- ``report_card.json`` (the callback's): its conventions and group size, checked against
  the run's fields; ``adapter_config.json``: the LoRA rank, targets and base model.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from race.spec.errors import ConfigError
from race.spec.imported import ChargeSettings, imported_fields

from .errors import ImportRefused
from .import_charge import Shapes, charge_intervals, head_note, lora_of, policy_cost
from .import_rows import ImportedRun, check_trajectory, same_value

#: ``eval_*`` keys that are TRL's or transformers' bookkeeping, never a score.
NOT_SCORES = ("eval_loss", "eval_runtime", "eval_samples_per_second", "eval_steps_per_second", "eval_num_tokens",
              "eval_entropy", "eval_reward_std", "eval_frac_reward_zero_std")
DEFAULT_TARGET = "pass@1"
FLOPS_KEY = "race/flops"


def trainer_state(path: Path) -> tuple[Path, dict[str, Any]]:
    """The run's ``trainer_state.json``: the directory's own, else its latest checkpoint's."""
    own = path / "trainer_state.json"
    if own.is_file():
        found = own
    else:
        ckpts = sorted((int(m.group(1)), p) for p in path.glob("checkpoint-*")
                       if (m := re.fullmatch(r"checkpoint-(\d+)", p.name)) and (p / "trainer_state.json").is_file())
        if not ckpts:
            raise ImportRefused(f"{path}: no trainer_state.json in it or in a checkpoint-N/ directory: is it a TRL "
                                "output directory? (TRL writes one with each checkpoint; trainer.save_state() "
                                "writes it at the end)")
        found = ckpts[-1][1] / "trainer_state.json"
    try:
        return found, json.loads(found.read_text())
    except ValueError as e:
        raise ImportRefused(f"{found}: not valid JSON ({e})") from None


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def score_key(entries: list[dict[str, Any]], asked: str | None, where: str) -> str:
    """The ``eval_*`` key that is the score (module docstring); refused, with the keys the
    log has, when it is absent or when the default is ambiguous."""
    keys = sorted({k for h in entries for k in h if k.startswith("eval_") and k not in NOT_SCORES})
    if asked:
        for k in (asked, f"eval_{asked}"):
            if k in keys:
                return k
        raise ImportRefused(f"{where}: --score-key {asked!r} is not in the evaluation logs; they have: "
                            f"{', '.join(keys) or 'no eval_* keys'}")
    rewards = [k for k in keys if k.startswith("eval_rewards/") and k.endswith("/mean")]
    if len(rewards) == 1:
        return rewards[0]
    what = "several reward functions" if rewards else "no eval_rewards/<function>/mean key"
    raise ImportRefused(f"{where}: {what} in the evaluation logs: choose the score with --score-key (one of: "
                        f"{', '.join(keys)})" if keys else f"{where}: the log history has no evaluations (eval_* keys): train with "
                        "eval_strategy='steps' (or 'epoch'), an eval_dataset and eval_on_start=True")


def _defaults(path: Path, values: dict[str, Any], shapes: Shapes) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run's fields completed from the directory (LoRA rank, base model, group size) and
    its adapter config; a field that contradicts the directory is refused."""
    ckpts = sorted(path.glob("checkpoint-*/adapter_config.json"), key=lambda p: p.stat().st_mtime)
    adapter = _json(path / "adapter_config.json") or (_json(ckpts[-1]) if ckpts else {})
    out = dict(values)
    out.setdefault("engine", "trl")
    if adapter.get("r") is not None and "lora.r" not in out and "lora_r" not in out:
        out["lora.r"] = adapter["r"]
    if "model" not in out:
        model = shapes.default or adapter.get("base_model_name_or_path")
        if model:
            out["model"] = model
    card = _json(path / "report_card.json")
    g = card.get("num_generations")
    if g and "num_generations" in out and not same_value(out["num_generations"], g):
        raise ImportRefused(f"{path}: num_generations={out['num_generations']} but the run's report card says {g}")
    if g:
        out.setdefault("num_generations", g)
    return out, adapter


def trl_run(path: Path, values: dict[str, Any], *, name: str | None, shapes: Shapes, score: str | None, target: str,
            eval_problems: int | None, conventions: str, compact_head: bool) -> ImportedRun:
    """One TRL output directory as an :class:`ImportedRun` (module docstring)."""
    state_path, state = trainer_state(path)
    where = str(path)
    name = name or path.resolve().name
    values, adapter = _defaults(path, values, shapes)
    try:
        fields = imported_fields(values, f"run {name} ({where})")
    except ConfigError as e:
        raise ImportRefused(f"{e}\n(a TRL directory's allocation comes from --set NAME=VALUE, or a manifest's "
                            "columns: docs/import.md)") from None
    shape = shapes.shape(fields.model, f"run {name} ({where})")
    lora = lora_of(fields, adapter)
    hist = [h for h in state.get("log_history", []) if isinstance(h, dict) and "step" in h]
    entries = [h for h in hist if any(k.startswith("eval_") for k in h)]
    key = score_key(entries, score, where)
    if eval_problems is None:
        raise ImportRefused(f"{where}: TRL does not log the size of the evaluation set: pass --eval-problems N "
                            "(len(eval_dataset), the problems each score is the mean over)")
    callback = any(FLOPS_KEY in h for h in hist)
    if callback:
        ledger, at, total, conv, notes = _from_callback(path, hist)
    else:
        policy = policy_cost((shape, lora), conventions, f"run {name} ({where})")
        ledger, at, total, conv, notes = _from_tokens(path, hist, state, fields, policy, compact_head, where, name)
    evals = []
    for h in entries:
        if key not in h:
            continue
        step = int(h["step"])
        flops = float(h[FLOPS_KEY]) if FLOPS_KEY in h else at(step, h)
        value = float(h[key])
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise ImportRefused(f"{where}: {key} = {value:g} at step {step} is outside [0, 1]: choose a score in "
                                "[0, 1] with --score-key (a reward outside it is not a share of problems solved)")
        evals.append({"step": step, "flops": flops, "target": target, "score": value, "n": int(eval_problems),
                      "per_problem": None})
    if not any(e["step"] == 0 for e in evals):
        raise ImportRefused(f"{where}: no evaluation at step 0 (the base model): train with eval_on_start=True so the "
                            "learning curve has its start")
    check_trajectory(name, evals, where)
    train = [{"step": int(h["step"]), "flops": float(h[FLOPS_KEY]) if FLOPS_KEY in h else at(int(h["step"]), None),
              "reward_mean": float(h["reward"])} for h in hist if "loss" in h and h.get("reward") is not None]
    return ImportedRun(name=name, fields=fields, shape=shape, evals=evals, ledger=ledger, total_flops=total,
                       steps=int(state.get("global_step") or max(e["step"] for e in evals)),
                       source=f"{state_path} (trl)", flops_from="ledger" if callback else "tokens", conventions=conv,
                       lora=lora, train=train, notes=notes)


def _from_callback(path: Path, hist: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], Any, float, str, list[str]]:
    """FLOPs as RACE's callback counted them: ``ledger.jsonl`` (else the logged per-phase
    totals), its conventions from ``report_card.json``."""
    from race.accounting.guard import is_counted
    from race.accounting.ledger import read_jsonl_records

    ledger: list[dict[str, Any]] = []
    if (path / "ledger.jsonl").is_file():
        records, _ = read_jsonl_records(path / "ledger.jsonl")
        ledger = [{"step": int(r["step"]), "phase": r["phase"], "component": r.get("component", ""),
                   "flops": int(r["flops"]), "tokens": r.get("tokens"), "seconds": r.get("seconds"),
                   "counted": bool(r.get("counted", is_counted(r["phase"])))} for r in records if "flops" in r]
    else:  # the per-phase totals of each log entry, as differences
        last: dict[str, float] = {}
        for h in hist:
            for k, v in h.items():
                if k.startswith(FLOPS_KEY + "/") and float(v) > last.get(k, 0.0):
                    phase = k.split("/")[-1]
                    ledger.append({"step": int(h["step"]), "phase": phase, "component": "",
                                   "flops": int(v - last.get(k, 0)), "tokens": None, "seconds": None,
                                   "counted": is_counted(phase)})
                    last[k] = float(v)
    logged = [(int(h["step"]), float(h[FLOPS_KEY])) for h in hist if FLOPS_KEY in h]
    total = float(sum(r["flops"] for r in ledger if r["counted"])) if ledger else max(f for _, f in logged)

    def at(step: int, entry: Any) -> float:
        return max((f for s, f in logged if s <= step), default=0.0)

    conv = (_json(path / "report_card.json").get("conventions") or {}).get("name") or "race (assumed: not recorded)"
    return ledger, at, total, conv, []


def _from_tokens(path: Path, hist: list[dict[str, Any]], state: dict[str, Any], fields: Any, policy: Any,
                 compact_head: bool, where: str, name: str) -> tuple[list[dict[str, Any]], Any, float, str, list[str]]:
    """FLOPs charged from the logged tokens (module docstring)."""
    s = ChargeSettings.of(fields)
    gas = s.gradient_accumulation_steps
    every = (s.steps_per_generation or gas) * fields.num_iterations  # micro-steps between generations (TRL's)
    per_gen = fields.prompts_per_step * fields.num_generations
    logs = sorted((h for h in hist if "num_tokens" in h and "completions/mean_length" in h and "loss" in h),
                  key=lambda h: h["step"])
    intervals, cum = [], {0: 0}
    prev_step, prev_tokens = 0, 0
    for h in logs:
        step, tokens = int(h["step"]), int(round(float(h["num_tokens"])))
        gens = sum(1 for m in range(prev_step * gas, step * gas) if m % every == 0)
        seqs = gens * per_gen
        completion = float(h["completions/mean_length"]) * seqs
        if gens == 0 or abs(completion - round(completion)) > 1e-6 * max(1.0, completion):
            raise ImportRefused(f"{where}: the log at step {step} does not fit {gens} generation(s) of "
                                f"prompts_per_step x num_generations = {per_gen} sequences (mean completion length "
                                f"{h['completions/mean_length']}): check those fields and "
                                "gradient_accumulation_steps / steps_per_generation / num_iterations")
        intervals.append((step, seqs, tokens - prev_tokens - int(round(completion)), int(round(completion))))
        cum[step] = tokens
        prev_step, prev_tokens = step, tokens
    ledger = charge_intervals(fields, policy, intervals, compact_head=compact_head, where=f"run {name} ({where})")
    flops_at = {0: 0.0, **{st: float(sum(r["flops"] for r in ledger if r["counted"] and r["step"] <= st))
                           for st, *_ in intervals}}

    def at(step: int, entry: dict[str, Any] | None) -> float:
        logged = max(st for st in flops_at if st <= step)
        seen = None if entry is None or "eval_num_tokens" not in entry else int(round(float(entry["eval_num_tokens"])))
        if seen is not None and seen != cum[logged]:
            raise ImportRefused(f"{where}: the evaluation at step {step} follows generations whose lengths were not "
                                f"logged (last log with tokens: step {logged}): log at every evaluation step "
                                "(logging_steps dividing eval_steps)")
        return flops_at[logged]

    notes = [head_note(compact_head)]
    seen = int(state.get("num_input_tokens_seen") or 0)
    if seen > prev_tokens:
        notes.append(f"{path.name}: {seen - prev_tokens} tokens after its last log are not charged (their completion "
                     "lengths were not logged)")
    return ledger, at, flops_at[max(flops_at)], policy.conv.name, notes


def read_manifest(path: Path, fmt: str) -> list[tuple[Path, str | None, dict[str, Any]]]:
    """``(directory, run name, fields)`` per row of a manifest of TRL output directories (a
    CSV or JSONL with a ``path`` column, relative to the manifest's folder)."""
    from .import_rows import read_rows

    out = []
    for where, row in read_rows(path, fmt):
        if "path" not in row:
            raise ImportRefused(f"{where}: a TRL manifest row needs a path column (the run's output directory)")
        d = Path(str(row.pop("path"))).expanduser()
        d = d if d.is_absolute() else path.parent / d
        if not d.is_dir():
            raise ImportRefused(f"{where}: {d} is not a directory")
        name = row.pop("run", None)
        out.append((d, None if name is None else str(name), row))
    return out


__all__ = ["DEFAULT_TARGET", "NOT_SCORES", "read_manifest", "score_key", "trainer_state", "trl_run"]
