"""Who may train in one gang, the per-member budget decision, and the wall-seconds split.

A gang's members share one frozen base and one decode loop, so they must agree on what
the shared passes run: the base model and how it loads (``model``, ``device``, ``dtype``,
``attn_implementation``, torch threads), the task, and the padded lengths
(``max_prompt_length``, ``max_completion_length``). Each member trains a LoRA adapter
without dropout (dropout masks would be drawn from one global stream shared by the
members) and without gradient checkpointing (the gang runs the functional forward).
Everything else (seed, group size, prompts per step, reward, learning rate and schedule,
loss, ``beta``, ``num_iterations``, micro-batches, LoRA rank and targets, budget) is the
member's own. Full fine-tuning cells and cells that cannot share a base run alone.
"""

from __future__ import annotations

import json
from typing import Any

from race.spec.run import RunConfig

#: Settings every member of a gang must share (module docstring).
SHARED = ("model", "device", "dtype", "attn_implementation", "torch_threads", "max_prompt_length",
          "max_completion_length")


def gang_key(cfg: RunConfig) -> str | None:
    """The key of the gangs ``cfg`` may join (members of a gang have equal keys), or None
    when it must run alone (full fine-tuning, LoRA dropout, gradient checkpointing, the TRL
    engine, metrics sinks)."""
    if (cfg.lora is None or cfg.lora.lora_dropout or cfg.gradient_checkpointing or cfg.engine != "builtin"
            or cfg.log_to):
        return None
    d = cfg.model_dump(mode="json")
    return json.dumps({**{k: d[k] for k in SHARED}, "task": d["task"]}, sort_keys=True)


def gang_refusal(cfgs: list[RunConfig]) -> str | None:
    """Why ``cfgs`` cannot train as one gang (a message that says what to change), or None."""
    if not cfgs:
        return "a gang needs at least one member"
    for c in cfgs:
        if gang_key(c) is None:
            return (f"run {c.name!r} cannot join a gang: it needs LoRA (lora set), lora_dropout 0, no "
                    "gradient_checkpointing, the builtin engine and no log_to sinks; run it alone (gang: false)")
    keys = {gang_key(c) for c in cfgs}
    if len(keys) > 1:
        a, b = cfgs[0].model_dump(mode="json"), next(c for c in cfgs if gang_key(c) != gang_key(cfgs[0]))
        bd = b.model_dump(mode="json")
        diff = [k for k in (*SHARED, "task") if a[k] != bd[k]]
        return (f"runs {cfgs[0].name!r} and {b.name!r} differ in {diff}: a gang's members share the base model, "
                "task and maximum lengths; put them in different gangs")
    ids = [c.run_id() for c in cfgs]
    if len(set(ids)) != len(ids):
        return "a gang holds the same run twice: give each member its own seed or settings"
    return None


def split_seconds(seconds: float, weights: list[float]) -> list[float]:
    """A shared stage's ``seconds`` split among its members in proportion to ``weights``
    (the FLOPs the stage charges each); equal shares when every weight is 0."""
    total = float(sum(weights))
    if total <= 0:
        return [seconds / len(weights)] * len(weights) if weights else []
    return [seconds * w / total for w in weights]


__all__ = ["SHARED", "gang_key", "gang_refusal", "split_seconds"]
