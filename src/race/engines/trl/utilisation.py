"""Utilisation arithmetic for the drop-in ledger's logs (and ``benchmarks/gpu_check.py``):
a peak-FLOP/s table per device and dtype, and the model-FLOP utilisation (MFU) formula.

Pure functions, no torch: ``peak_flops("NVIDIA H100 80GB HBM3", "bf16")`` reads the table,
``mfu(flops, seconds, peak)`` divides. The table holds the vendors' DENSE tensor-core peaks
(no 2:4 sparsity), per device, in FLOP/s; a device or dtype not in it gives ``None`` (the
caller then asks for a peak or omits MFU). Override it with your own number where your
clocks, power cap or SKU differ (``add_race_accounting(..., peak_flops=...)``).

Conventions: MFU counts the FLOPs the ledger records for a phase (model FLOPs under the
run's conventions, not hardware FLOPs: ``recompute/*`` is never in the numerator) over the
seconds the ledger records for it, against the peak of every device that ran it (``world``
processes side by side: ``peak = world x per-device peak``).
"""

from __future__ import annotations

#: Dense peak FLOP/s per device and dtype (vendor data sheets; SXM parts unless named).
#: Keys are matched against ``torch.cuda.get_device_name()`` in this order (first match wins).
PEAK_FLOPS: tuple[tuple[tuple[str, ...], dict[str, float]], ...] = (
    (("H100", "PCIE"), {"bf16": 756.5e12, "fp16": 756.5e12, "tf32": 378.0e12, "fp32": 51.2e12}),
    (("H100", "NVL"), {"bf16": 835.5e12, "fp16": 835.5e12, "tf32": 417.5e12, "fp32": 60.0e12}),
    (("H100",), {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12}),
    (("H200",), {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12}),
    (("H800",), {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12}),
    (("B200",), {"bf16": 2250e12, "fp16": 2250e12, "tf32": 1100e12, "fp32": 75e12}),
    (("A100",), {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),
    (("A800",), {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),
    (("L40S",), {"bf16": 362.05e12, "fp16": 362.05e12, "tf32": 183.0e12, "fp32": 91.6e12}),
    (("L40",), {"bf16": 181.0e12, "fp16": 181.0e12, "tf32": 90.5e12, "fp32": 90.5e12}),
    (("L4",), {"bf16": 121e12, "fp16": 121e12, "tf32": 60e12, "fp32": 30.3e12}),
    (("A10",), {"bf16": 125e12, "fp16": 125e12, "tf32": 62.5e12, "fp32": 31.2e12}),
    (("V100",), {"fp16": 125e12, "fp32": 15.7e12}),
    (("MI300X",), {"bf16": 1307.4e12, "fp16": 1307.4e12, "tf32": 653.7e12, "fp32": 163.4e12}),
)

_DTYPES = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "half": "fp16", "tf32": "tf32",
           "fp32": "fp32", "float32": "fp32", "float": "fp32"}


def dtype_name(dtype: object) -> str | None:
    """``"bf16"``, ``"fp16"``, ``"tf32"`` or ``"fp32"`` for a dtype written as text or a
    ``torch.dtype`` (``torch.bfloat16`` -> ``"bf16"``); None when it is none of them."""
    text = str(dtype).lower().removeprefix("torch.")
    return _DTYPES.get(text)


def peak_flops(device_name: str, dtype: str) -> float | None:
    """Dense peak FLOP/s of ONE device ``device_name`` (e.g. ``torch.cuda.get_device_name()``)
    at ``dtype`` (``bf16``, ``fp16``, ``tf32``, ``fp32`` or a torch dtype name), from
    :data:`PEAK_FLOPS`; None when the device or the dtype is not in the table (a CPU
    always)."""
    name = str(device_name).upper().replace("-", " ")
    kind = dtype_name(dtype)
    if kind is None:
        return None
    for parts, peaks in PEAK_FLOPS:
        if all(p in name for p in parts):
            return peaks.get(kind)
    return None


def mfu(flops: float, seconds: float, peak: float) -> float:
    """Model-FLOP utilisation ``MFU = F / (t * P)``: ``F`` model FLOPs executed in ``t``
    seconds, ``P`` the peak FLOP/s of every device that ran them (``world x`` one device's
    peak). 1.0 is the hardware's dense peak; real training sits well below it."""
    if not seconds > 0 or not peak > 0:
        raise ValueError(f"mfu needs seconds > 0 and peak > 0 (got seconds={seconds!r}, peak={peak!r})")
    if flops < 0:
        raise ValueError(f"mfu needs flops >= 0, got {flops!r}")
    return float(flops) / (float(seconds) * float(peak))


def tokens_per_second(tokens: float, seconds: float) -> float:
    """Throughput ``tokens / t`` (tokens the phase processed over its seconds)."""
    if not seconds > 0:
        raise ValueError(f"tokens_per_second needs seconds > 0, got {seconds!r}")
    return float(tokens) / float(seconds)


def gpu_hours(seconds: float, devices: int) -> float:
    """Device-hours ``devices x t / 3600`` of ``t`` seconds run on ``devices`` devices side by side."""
    if devices < 1 or seconds < 0:
        raise ValueError(f"gpu_hours needs devices >= 1 and seconds >= 0 (got {devices!r}, {seconds!r})")
    return devices * float(seconds) / 3600.0


def imbalance(values: list[float] | tuple[float, ...]) -> float:
    """Per-rank imbalance ``max(x) / mean(x)`` (1.0: every rank did the same; 2.0 on two
    ranks: one did all of it). 1.0 for one rank or when all are zero."""
    if not values:
        raise ValueError("imbalance needs at least one rank's value")
    mean = sum(values) / len(values)
    return float(max(values)) / mean if mean > 0 else 1.0


__all__ = ["PEAK_FLOPS", "dtype_name", "gpu_hours", "imbalance", "mfu", "peak_flops", "tokens_per_second"]
