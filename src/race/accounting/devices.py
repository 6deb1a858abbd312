"""The device table: dense peak FLOP/s by dtype, and the utilisation arithmetic over it.

One table serves three readers: the TRL drop-in's MFU logs (``race.engines.trl``, matched
against ``torch.cuda.get_device_name()``), ``benchmarks/gpu_check.py``, and the plans
(``race plan --device``, ``race grid plan --device``: wall time and GPU-hours), which name a
device by its short key (``h100``, ``h200``, ``a100``, ``l40s``, ``cpu``).

Every GPU row holds the vendor's DENSE tensor-core peak (no 2:4 sparsity: the data sheets'
"with sparsity" figures halved), per device, in FLOP/s, and says where it comes from. Your
clocks, power cap or SKU may differ: give your own number where they do
(``add_race_accounting(..., peak_flops=...)``; ``--mfu`` for a plan).

The ``cpu`` row is not a hardware peak: it is the rate one RACE grid worker (one thread)
reached on the tiny models of the demo grid on a 2-core CPU, the plan's CPU constant since
the first grids (docs/design.md section 4). It has no torch device name to match, so the
TRL logs never report an MFU against it.

Conventions: MFU counts the FLOPs the ledger records for a phase (model FLOPs under the
run's conventions, not hardware FLOPs: ``recompute/*`` is never in the numerator) over the
seconds the ledger records for it, against the peak of every device that ran it (``world``
processes side by side: ``peak = world x per-device peak``). Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from race.accounting.errors import AccountingError, did_you_mean

DTYPES = ("bf16", "fp16", "tf32", "fp32")


def _peaks(bf16: float, tf32: float, fp32: float) -> dict[str, float]:
    return {"bf16": bf16, "fp16": bf16, "tf32": tf32, "fp32": fp32}


@dataclass(frozen=True)
class Device:
    """One row of the table: ``match`` (substrings of a torch device name, all present),
    ``peaks`` (dtype -> dense FLOP/s of ONE device), ``source``; ``key``: its name on the
    plans' ``--device`` (None: matched by torch name only); ``effective``: the number is a
    measured rate, not a hardware peak (the ``cpu`` row)."""

    title: str
    match: tuple[str, ...]
    peaks: dict[str, float]
    source: str
    key: str | None = None
    effective: bool = False
    gpu: bool = field(default=True)

    def peak(self, dtype: object) -> float | None:
        """Dense FLOP/s of one device at ``dtype`` (a name or a torch dtype), None when
        the table has no figure for it."""
        kind = dtype_name(dtype)
        return None if kind is None else self.peaks.get(kind)


_NV = "NVIDIA data sheet, dense (the 'with sparsity' figure halved)"
#: The table, in match order (first match wins: a PCIe or NVL part before its SXM default).
DEVICES: tuple[Device, ...] = (
    Device("NVIDIA H100 PCIe", ("H100", "PCIE"), _peaks(756.5e12, 378.0e12, 51.2e12), f"{_NV}: H100 PCIe"),
    Device("NVIDIA H100 NVL", ("H100", "NVL"), _peaks(835.5e12, 417.5e12, 60.0e12), f"{_NV}: H100 NVL"),
    Device("NVIDIA H100 SXM", ("H100",), _peaks(989.4e12, 494.7e12, 66.9e12),
           f"{_NV}: H100 SXM5, BF16 1,979 / TF32 989 TFLOPS with sparsity, FP32 66.9", key="h100"),
    Device("NVIDIA H200 SXM", ("H200",), _peaks(989.4e12, 494.7e12, 66.9e12),
           f"{_NV}: H200 SXM (the H100's compute, more and faster memory)", key="h200"),
    Device("NVIDIA H800", ("H800",), _peaks(989.4e12, 494.7e12, 66.9e12), f"{_NV}: H800 SXM"),
    Device("NVIDIA B200", ("B200",), _peaks(2250e12, 1100e12, 75e12), f"{_NV}: B200"),
    Device("NVIDIA A100", ("A100",), _peaks(312e12, 156e12, 19.5e12),
           "NVIDIA A100 data sheet: BF16 312 / TF32 156 TFLOPS dense, FP32 19.5 (SXM and PCIe alike)", key="a100"),
    Device("NVIDIA A800", ("A800",), _peaks(312e12, 156e12, 19.5e12), "NVIDIA A800 data sheet (the A100's compute)"),
    Device("NVIDIA L40S", ("L40S",), _peaks(362.05e12, 183.0e12, 91.6e12),
           f"{_NV}: L40S, BF16 733 / TF32 366 TFLOPS with sparsity, FP32 91.6", key="l40s"),
    Device("NVIDIA L40", ("L40",), _peaks(181.0e12, 90.5e12, 90.5e12), f"{_NV}: L40"),
    Device("NVIDIA L4", ("L4",), _peaks(121e12, 60e12, 30.3e12), f"{_NV}: L4"),
    Device("NVIDIA A10", ("A10",), _peaks(125e12, 62.5e12, 31.2e12), f"{_NV}: A10 / A10G"),
    Device("NVIDIA V100", ("V100",), {"fp16": 125e12, "fp32": 15.7e12}, "NVIDIA V100 data sheet (no bf16)"),
    Device("AMD MI300X", ("MI300X",), _peaks(1307.4e12, 653.7e12, 163.4e12), "AMD Instinct MI300X data sheet, dense"),
    Device("CPU (one grid worker)", (), {k: 5e10 for k in DTYPES},
           "not a peak: the rate one grid worker (one thread) reached on the tiny models of the demo grid, 2-core CPU "
           "(docs/design.md section 4); RACE's CPU planning constant", key="cpu", effective=True, gpu=False),
)

#: The plans' device names (``--device``), in the table's order.
PLAN_DEVICES: tuple[str, ...] = tuple(d.key for d in DEVICES if d.key)

#: Dense peak FLOP/s per device and dtype as ``(name parts, {dtype: FLOP/s})``, matched against
#: ``torch.cuda.get_device_name()`` in this order (first match wins). Derived from :data:`DEVICES`.
PEAK_FLOPS: tuple[tuple[tuple[str, ...], dict[str, float]], ...] = tuple((d.match, d.peaks) for d in DEVICES if d.match)

_DTYPES = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "half": "fp16", "tf32": "tf32",
           "fp32": "fp32", "float32": "fp32", "float": "fp32"}


def plan_device(key: str) -> Device:
    """The table's row for a plan's ``--device`` name (``h100``, ``h200``, ``a100``, ``l40s``,
    ``cpu``; any case). ``AccountingError`` for any other name lists the table's names (a
    device is never guessed)."""
    k = str(key).strip().lower()
    for d in DEVICES:
        if d.key == k:
            return d
    raise AccountingError(f"unknown device {key!r}{did_you_mean(k, PLAN_DEVICES)}: the device table has "
                          f"{', '.join(PLAN_DEVICES)} (race.accounting.devices)")


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


def gpu_hours(seconds: float, devices: float) -> float:
    """Device-hours ``devices x t / 3600`` of ``t`` seconds run on ``devices`` devices side by
    side (a fraction: cells sharing one device)."""
    if not devices > 0 or seconds < 0:
        raise ValueError(f"gpu_hours needs devices > 0 and seconds >= 0 (got {devices!r}, {seconds!r})")
    return devices * float(seconds) / 3600.0


def imbalance(values: list[float] | tuple[float, ...]) -> float:
    """Per-rank imbalance ``max(x) / mean(x)`` (1.0: every rank did the same; 2.0 on two
    ranks: one did all of it). 1.0 for one rank or when all are zero."""
    if not values:
        raise ValueError("imbalance needs at least one rank's value")
    mean = sum(values) / len(values)
    return float(max(values)) / mean if mean > 0 else 1.0


__all__ = ["DEVICES", "DTYPES", "Device", "PEAK_FLOPS", "PLAN_DEVICES", "dtype_name", "gpu_hours", "imbalance", "mfu",
           "peak_flops", "plan_device", "tokens_per_second"]
