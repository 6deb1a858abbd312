"""Utilisation arithmetic for the drop-in ledger's logs (and ``benchmarks/gpu_check.py``):
the peak-FLOP/s table per device and dtype, and the model-FLOP utilisation (MFU) formula.

The table and the formulas live in :mod:`race.accounting.devices` (standard library only),
the one table the TRL logs, the GPU check and the plans (``race plan --device``) read; this
module keeps the names importable from here.
"""

from __future__ import annotations

from race.accounting.devices import PEAK_FLOPS, dtype_name, gpu_hours, imbalance, mfu, peak_flops, tokens_per_second

__all__ = ["PEAK_FLOPS", "dtype_name", "gpu_hours", "imbalance", "mfu", "peak_flops", "tokens_per_second"]
