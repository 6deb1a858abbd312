"""Wall-clock readings that mean something on GPUs.

CUDA kernels run asynchronously: ``time.perf_counter()`` right after a forward pass reads
the time the kernels were *queued*, and the next phase that waits on them is charged
their run time. :func:`device_clock` synchronizes the device first when it is CUDA, so a
phase's seconds (the ledger's ``seconds``) are the time its work took. On the CPU it is
``perf_counter`` and nothing else. Both engines and the TRL hooks read every per-phase
time through it.
"""

from __future__ import annotations

import time
from typing import Any


def is_cuda(device: Any) -> bool:
    """Whether ``device`` (a ``torch.device``, ``"cuda:1"``, ``"cpu"``, ``None``) is CUDA."""
    if device is None:
        return False
    kind = getattr(device, "type", None)
    if kind is None:
        kind = str(device).split(":", 1)[0]
    return kind == "cuda"


def device_clock(device: Any = None) -> float:
    """``time.perf_counter()`` after the work queued on ``device`` has finished
    (``torch.cuda.synchronize(device)`` when it is CUDA; nothing else otherwise)."""
    if is_cuda(device):
        import torch

        torch.cuda.synchronize(device)
    return time.perf_counter()


__all__ = ["device_clock", "is_cuda"]
