"""Utilisation values the drop-in ledger adds to TRL's logs, from the ledger alone (the
arithmetic and the device table are in :mod:`race.accounting.devices`).

==================================  ==========================================================
key                                 value
==================================  ==========================================================
``race/tokens_per_s/<phase>``       tokens / seconds of the phase's records (every rank's
                                    tokens over the ranks' side-by-side seconds)
``race/mfu/<phase>``                ``mfu(F, t, world x peak)``: counted FLOPs of the phase
                                    (rollout: ``executed/rollout_prefill`` in place of the
                                    charged prefill when recorded) over its seconds; only
                                    with a peak, and not for rollouts a vLLM server ran
``race/gpu_hours``                  ``world x`` the seconds of every record / 3600
``race/flops_spent``                counted FLOPs + ``overrun`` (what ran, the step the
                                    budget could not take included)
``race/imbalance/{flops,seconds}``  ``max / mean`` over the ranks of their counted FLOPs and
                                    seconds since the (re)start (1.0: balanced)
``race/seconds/weight_sync``        vLLM weight syncs (seconds only, no FLOPs)
==================================  ==========================================================

Phases are those the budget charges (``rollout``, ``old_logprobs``, ``reference``,
``reward``, ``update``) with seconds > 0; ``rollout/weight_sync`` seconds are not
rollout seconds.
"""

from __future__ import annotations

from typing import Any

from race.accounting import FlopLedger
from race.accounting.ledger import UNCOUNTED_PHASES
from race.accounting.devices import gpu_hours, imbalance, mfu, tokens_per_second

#: seconds-only ledger key of vLLM's weight syncs
WEIGHT_SYNC = "rollout/weight_sync"


def phase_totals(ledger: FlopLedger) -> dict[str, tuple[int, int, float]]:
    """Per counted phase: (FLOPs, tokens, seconds), weight syncs left out of the seconds and
    ``executed/rollout_prefill`` in place of the charged prefill where recorded."""
    out: dict[str, list] = {}
    executed = sum(r.flops for r in ledger if r.key == "executed/rollout_prefill")
    charged_prefill = 0
    for r in ledger:
        if not r.counted or r.phase in UNCOUNTED_PHASES:
            continue
        acc = out.setdefault(r.phase, [0, 0, 0.0])
        acc[0] += r.flops
        acc[1] += r.tokens
        if r.key != WEIGHT_SYNC:
            acc[2] += r.seconds
        if r.key == "rollout/prefill":
            charged_prefill += r.flops
    if executed and "rollout" in out:
        out["rollout"][0] += executed - charged_prefill
    return {k: (int(v[0]), int(v[1]), float(v[2])) for k, v in out.items()}


def utilisation_values(ledger: FlopLedger, *, world: int = 1, peak: float | None = None,
                       rank_flops: list[int] | None = None, rank_seconds: list[float] | None = None,
                       remote_rollout: bool = False, prefix: str = "race/") -> dict[str, float]:
    """The keys of the module docstring for ``ledger`` (the global one), ``world`` devices
    side by side, one device's ``peak`` FLOP/s (None: no MFU)."""
    out: dict[str, float] = {}
    for phase, (flops, tokens, seconds) in sorted(phase_totals(ledger).items()):
        if seconds <= 0:
            continue
        out[f"{prefix}tokens_per_s/{phase}"] = tokens_per_second(tokens, seconds)
        if peak is not None and not (phase == "rollout" and remote_rollout):
            out[f"{prefix}mfu/{phase}"] = mfu(flops, seconds, world * peak)
    out[f"{prefix}gpu_hours"] = gpu_hours(sum(r.seconds for r in ledger), world)
    out[f"{prefix}flops_spent"] = ledger.total + sum(r.flops for r in ledger if r.phase == "overrun")
    out[f"{prefix}imbalance/flops"] = imbalance(list(rank_flops or [0]))
    out[f"{prefix}imbalance/seconds"] = imbalance(list(rank_seconds or [0.0]))
    sync = sum(r.seconds for r in ledger if r.key == WEIGHT_SYNC)
    if sync:
        out[f"{prefix}seconds/weight_sync"] = sync
    return out


def device_peak(device: Any, dtype: str | None) -> tuple[float | None, str]:
    """One device's peak FLOP/s from the table for a torch ``device`` and dtype name, and
    the device's name (``cpu`` off CUDA)."""
    from race.accounting.devices import peak_flops

    if getattr(device, "type", str(device)) != "cuda":
        return None, str(getattr(device, "type", device))
    import torch

    name = torch.cuda.get_device_name(device)
    return (peak_flops(name, dtype) if dtype else None), name


__all__ = ["WEIGHT_SYNC", "device_peak", "phase_totals", "utilisation_values"]
