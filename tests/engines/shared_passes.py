"""The solo engine's prefix-shared learning passes, as the fast-forward and gang tests run
them: one definition for both."""

from __future__ import annotations

import torch


def shared_pass(m, ro, size: int):
    """The prefix-shared passes in micro-batches of ``size`` rows: log-probs (no grad) and
    the gradients of the masked log-prob sum accumulated over the micro-batches."""
    from race.engines.builtin.micro_batch import _logprobs_of, logprobs, micro_slices, rows

    m.zero_grad(set_to_none=True)
    for sl in micro_slices(ro.prompt_ids.shape[0], size):
        r = rows(ro, sl)
        (_logprobs_of(m, r, 0.7, True, sl.start) * r.completion_mask).sum().backward()
    with torch.no_grad():
        lp = logprobs(m, ro, size, 0.7, share=True)
    return lp, {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
