"""Counting what executes: ``torch.utils.flop_counter.FlopCounterMode`` with the blind spots
of torch 2.13 CPU filled in (docs/design.md section 3), and a meter that keeps counts under the
ledger's ``phase/component`` keys.

What torch's counter sees, and what this module adds:

- ``mm``/``addmm``/``bmm``/``baddbmm`` count 2 x MACs; the causal mask is ignored (full
  square attention). That is the ``torch`` convention of ``race.accounting``.
- The CPU fused SDPA kernel ``aten._scaled_dot_product_flash_attention_for_cpu`` and its
  backward count 0 in torch. ``flop_formulas()`` registers formulas for both so an
  ``sdpa`` model measures what an ``eager`` one does: forward QK^T + PV over the full
  square (torch's own SDPA formula); backward dQ, dK, dV and dP (2x forward, what eager
  attention's autograd runs). The fused kernel also recomputes QK^T in its backward and
  computes dQ/dK/dV even where they are not needed; ``sdpa_backward="kernel"`` counts
  that (torch's own formula for the CUDA flash kernels: 2.5x forward).
- In-place ``addmm_`` and ``baddbmm_`` count 0 in torch; they are registered with the
  out-of-place formulas. ``addmm``/``bmm``/``baddbmm`` are registered too, with formulas that
  accept any overload's extra positional arguments (torch's raise on ``out_dtype``, CUDA).

Everything here needs torch; ``race.accounting`` stays standard library only.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Literal, Mapping

import torch
from torch.utils.flop_counter import FlopCounterMode, bmm_flop, mm_flop, sdpa_flop_count

from race.accounting.guard import counted

aten = torch.ops.aten

SdpaBackward = Literal["model", "kernel"]


# -- formulas for the ops torch's counter does not see --------------------------------------
def _addmm_inplace_flop(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """``addmm(self, a, b)`` and ``addmm_``, any overload: the product a @ b, 2*m*k*n (the add
    is elementwise). Also registered for ``addmm``: torch's formula takes no extra positional
    argument, and the ``addmm.dtype`` overload (``out_dtype``) made the counter raise on CUDA."""
    return mm_flop(a_shape, b_shape)


def _bmm_flop(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """``bmm(a, b)``, any overload: 2*b*m*k*n. torch's own formula takes no extra positional
    argument, so an overload with one (``bmm.dtype``'s ``out_dtype``, seen on CUDA with
    torch 2.11) made the counter raise."""
    return bmm_flop(a_shape, b_shape)


def _baddbmm_inplace_flop(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """``baddbmm_(self, a, b)``: the batched product, 2*b*m*k*n."""
    return bmm_flop(a_shape, b_shape)


def _sdpa_cpu_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """Forward of the CPU fused SDPA kernel: QK^T and PV over the full square (the causal
    flag and mask are ignored, as torch's formulas for the other SDPA kernels do).
    GQA key/value heads are broadcast to the query heads."""
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _sdpa_model_backward_count(grad_out_shape, query_shape, key_shape, value_shape) -> int:
    """dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q: four products of the forward's
    size, i.e. 2x forward -- what eager attention's autograd executes when q, k and v all
    need gradients."""
    b, h_q, s_q, d_q = query_shape
    _, h_kv, s_k, _ = key_shape
    d_v = value_shape[-1]
    if tuple(grad_out_shape) != (b, h_q, s_q, d_v):
        raise AssertionError(f"sdpa backward: grad_out {tuple(grad_out_shape)} does not match query/value shapes")
    if h_q % h_kv:
        raise AssertionError(f"sdpa backward: query heads ({h_q}) must be a multiple of key/value heads ({h_kv})")
    n = b * h_q
    return (bmm_flop((n, s_q, d_v), (n, d_v, s_k))      # dP
            + bmm_flop((n, s_k, s_q), (n, s_q, d_v))    # dV
            + bmm_flop((n, s_q, s_k), (n, s_k, d_q))    # dQ
            + bmm_flop((n, d_q, s_q), (n, s_q, s_k)))   # dK


def _sdpa_cpu_backward_model_flop(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None,
                                  **kwargs) -> int:
    return _sdpa_model_backward_count(grad_out_shape, query_shape, key_shape, value_shape)


def _sdpa_cpu_backward_kernel_flop(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None,
                                   **kwargs) -> int:
    """What the fused kernel runs: the four gradient products plus recomputing QK^T."""
    b, h_q, s_q, d_q = query_shape
    s_k = key_shape[2]
    return (_sdpa_model_backward_count(grad_out_shape, query_shape, key_shape, value_shape)
            + bmm_flop((b * h_q, s_q, d_q), (b * h_q, d_q, s_k)))


def flop_formulas(sdpa_backward: SdpaBackward = "model") -> dict[Any, Callable[..., int]]:
    """``custom_mapping`` for ``FlopCounterMode`` that fills torch 2.13's CPU blind spots.

    ``sdpa_backward``: "model" (default) counts the fused CPU attention backward as eager
    attention's autograd does (2x forward), so sdpa and eager models measure alike and
    match ``race.accounting`` under ``conventions="torch"``; "kernel" adds the kernel's
    recompute of QK^T (hardware FLOPs, 2.5x forward)."""
    if sdpa_backward not in ("model", "kernel"):
        raise ValueError(f"sdpa_backward must be 'model' or 'kernel', got {sdpa_backward!r}")
    bwd = _sdpa_cpu_backward_model_flop if sdpa_backward == "model" else _sdpa_cpu_backward_kernel_flop
    return {
        aten.addmm: _addmm_inplace_flop,
        aten.addmm_: _addmm_inplace_flop,
        aten.bmm: _bmm_flop,
        aten.baddbmm: _baddbmm_inplace_flop,
        aten.baddbmm_: _baddbmm_inplace_flop,
        aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu_flop,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: bwd,
    }


class Counter(FlopCounterMode):
    """``FlopCounterMode`` with ``flop_formulas()`` registered, no printed table, and a
    second tally, ``grad_enabled_flops``, of FLOPs run while autograd records a graph.

    During ``backward()`` autograd runs gradient ops with grad mode off, while activation
    checkpointing recomputes the forward under ``torch.enable_grad()`` (both torch's
    reentrant and non-reentrant variants), so inside a backward that tally is exactly the
    recompute. (Not with ``backward(create_graph=True)``, which runs every gradient op with
    grad mode on.)"""

    def __init__(self, sdpa_backward: SdpaBackward = "model",
                 custom_mapping: Mapping[Any, Callable[..., int]] | None = None) -> None:
        if not callable(getattr(FlopCounterMode, "_count_flops", None)):
            raise RuntimeError(f"torch {torch.__version__}: FlopCounterMode has no _count_flops hook, which "
                               "race.measure uses to split recompute from backward; use torch 2.13")
        mapping = flop_formulas(sdpa_backward)
        mapping.update(custom_mapping or {})
        super().__init__(display=False, custom_mapping=mapping)
        self.grad_enabled_flops = 0

    def __enter__(self) -> "Counter":
        self.grad_enabled_flops = 0
        super().__enter__()
        return self

    # FlopCounterMode calls this once per executed op that has a formula (torch 2.13).
    def _count_flops(self, func_packet, out, args, kwargs):  # type: ignore[override]
        if torch.is_grad_enabled() and func_packet in self.flop_registry:
            self.grad_enabled_flops += self.flop_registry[func_packet](*args, **kwargs, out_val=out)
        return super()._count_flops(func_packet, out, args, kwargs)

    @property
    def total(self) -> int:
        return int(self.get_total_flops())

    def module_flops(self, prefix: str) -> int:
        """FLOPs attributed to the module whose tracker name is ``prefix`` (e.g.
        ``"Qwen2ForCausalLM.model.layers.1"``), forward and backward."""
        return int(sum(self.get_flop_counts().get(prefix, {}).values()))


def count_flops(fn: Callable[..., Any], *args: Any, sdpa_backward: SdpaBackward = "model", **kwargs: Any) -> int:
    """FLOPs that ``fn(*args, **kwargs)`` executes, as ``FlopCounterMode`` counts them with
    ``flop_formulas()`` registered."""
    with Counter(sdpa_backward) as c:
        fn(*args, **kwargs)
    return c.total


class FlopMeter:
    """Measured FLOPs (and wall seconds) accumulated under the ledger's ``phase/component``
    keys, the keys of ``PhaseFlops.components``::

        meter = FlopMeter()
        with meter.phase("rollout/decode"):
            ...                          # everything executed here is counted
        meter.add(measure_train_step(model, ids).components)
        meter.components                 # {"rollout/decode": ..., "update/forward": ..., ...}

    ``phase`` blocks may nest; each counts everything executed inside it, so nested keys
    overlap. The meter is also a context manager (``with FlopMeter() as meter:``) that
    only returns itself."""

    def __init__(self, sdpa_backward: SdpaBackward = "model") -> None:
        self.sdpa_backward: SdpaBackward = sdpa_backward
        self.components: dict[str, int] = {}
        self.seconds: dict[str, float] = {}

    def __enter__(self) -> "FlopMeter":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    @staticmethod
    def _check_key(key: str) -> str:
        phase, sep, comp = key.partition("/")
        if not sep or not phase or not comp:
            raise ValueError(f"meter key {key!r} must be 'phase/component', e.g. 'rollout/decode'")
        return key

    @contextmanager
    def phase(self, key: str) -> Iterator[Counter]:
        """Count everything executed in the block under ``key``."""
        self._check_key(key)
        t0 = time.perf_counter()
        with Counter(self.sdpa_backward) as c:
            yield c
        self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - t0
        self.components[key] = self.components.get(key, 0) + c.total

    def add(self, components: Mapping[str, int], seconds: Mapping[str, float] | None = None) -> None:
        """Add counts measured elsewhere (e.g. ``measure_generate(...).components``)."""
        for k, v in components.items():
            self.components[self._check_key(k)] = self.components.get(k, 0) + int(v)
        for k, s in (seconds or {}).items():
            self.seconds[k] = self.seconds.get(k, 0.0) + float(s)

    def phase_totals(self) -> dict[str, int]:
        """FLOPs per phase (the part of each key before '/')."""
        out: dict[str, int] = {}
        for k, v in self.components.items():
            p = k.split("/", 1)[0]
            out[p] = out.get(p, 0) + v
        return out

    @property
    def total(self) -> int:
        """Model FLOPs: what the budget would be charged (``race.accounting.guard.counted``:
        every key but ``recompute/*`` and the other uncounted phases; as ``PhaseFlops.total``)."""
        return counted(self.components)

    @property
    def hardware_total(self) -> int:
        return sum(self.components.values())

    def to_ledger(self, ledger: Any, step: int) -> None:
        """Append the counts to a ``race.accounting.FlopLedger`` as one step's records
        (``recompute`` records are kept uncounted, as the ledger does)."""
        ledger.add_components(step, dict(self.components), seconds=dict(self.seconds))

    def reset(self) -> None:
        self.components.clear()
        self.seconds.clear()


def relative_errors(analytic: Mapping[str, int], measured: Mapping[str, int]) -> dict[str, float]:
    """(analytic - measured) / measured per key of either mapping (0 where both are 0; inf
    where only the measured count is 0)."""
    out: dict[str, float] = {}
    for k in sorted(set(analytic) | set(measured)):
        a, m = analytic.get(k, 0), measured.get(k, 0)
        out[k] = 0.0 if a == m else (float("inf") if m == 0 else (a - m) / m)
    return out


__all__ = ["Counter", "FlopMeter", "count_flops", "flop_formulas", "relative_errors", "SdpaBackward"]
