"""What a GRPO rollout executed, as the engines charge it: the FLOP rules of the built-in
engine's decoders (``race.engines.sampling``, the gang's ``GangDecoder``) composed from the
per-pass formulas, so no engine composes a formula itself.

A rollout prefills each prompt once for its group (``n_prompts`` prompts of ``P`` padded
tokens) and decodes ``d - 1`` forwards per row, ``d`` the tokens the row produced while in
the batch (``generate_components(shape, [P] * n_prompts, decoded, share_prompt=True)``).
With merged LoRA weights (``W + s B A`` folded in before decoding) every pass runs the
merged matrices, so no pass carries a LoRA term, and each fold is charged once as
``merge`` = ``2 r in out`` per adapted matrix (:func:`race.accounting.lora.lora_merge_flops`).
"""

from __future__ import annotations

from typing import Sequence

from .conventions import Conventions
from .lora import LoRA, lora_merge_flops
from .passes import generate_components
from .policy import PolicyCost
from .shapes import ModelShape


def executed_rollout(policy: PolicyCost, prompt_len: int, n_prompts: int, decoded: Sequence[int], *,
                     merged: bool = False) -> dict[str, int]:
    """``{"prefill", "decode"}`` FLOPs of one rollout of ``policy`` (module docstring), plus
    ``"merge"`` when ``merged`` and the policy has an adapter (then the passes carry no LoRA
    term); without LoRA ``merged`` changes nothing."""
    shape, lora, conventions = policy.shape, policy.lora, policy.conventions
    merged = merged and lora is not None
    comps = generate_components(shape, [prompt_len] * n_prompts, list(decoded), lora=None if merged else lora,
                                share_prompt=True, conventions=conventions)
    if merged:
        comps["merge"] = lora_merge_flops(shape, lora)
    return comps


def executed_gang_decode(shape: ModelShape, prompt_len: int, prefill_rows: int, decoded: Sequence[int],
                         loras: Sequence[LoRA], conventions: "Conventions | str | None" = None) -> int:
    """FLOPs a gang's merged decode executed: one merge per member's adapters, the prefill of
    ``prefill_rows`` padded prompt slots of ``prompt_len`` tokens (head at one position
    each) and every physical row's ``decoded`` decode steps, with no LoRA term."""
    pre = generate_components(shape, [prompt_len] * prefill_rows, [1] * prefill_rows, conventions=conventions)
    dec = generate_components(shape, [prompt_len] * len(decoded), list(decoded), conventions=conventions)
    return pre["prefill"] + dec["decode"] + sum(lora_merge_flops(shape, lo) for lo in loras)


__all__ = ["executed_gang_decode", "executed_rollout"]
