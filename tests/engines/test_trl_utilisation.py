"""The utilisation arithmetic of the TRL drop-in's logs: the peak-FLOP/s table and the MFU
formula (pure functions)."""

from __future__ import annotations

import pytest


def test_peak_table_matches_device_names_and_dtypes():
    from race.engines.trl.utilisation import dtype_name, peak_flops

    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989.4e12
    assert peak_flops("NVIDIA H100 PCIe", "torch.bfloat16") == 756.5e12  # PCIe before the SXM default
    assert peak_flops("NVIDIA H200", "fp32") == 66.9e12
    assert peak_flops("NVIDIA A100-SXM4-80GB", "float16") == 312e12
    assert peak_flops("NVIDIA L40S", "bf16") == 362.05e12 and peak_flops("NVIDIA L4", "bf16") == 121e12
    assert peak_flops("NVIDIA A10G", "tf32") == 62.5e12 and peak_flops("NVIDIA A100 80GB PCIe", "tf32") == 156e12
    assert peak_flops("cpu", "fp32") is None and peak_flops("Tesla V100-SXM2-16GB", "bf16") is None
    assert peak_flops("NVIDIA H100", "int4") is None
    assert dtype_name("torch.float32") == "fp32" and dtype_name("half") == "fp16" and dtype_name("int8") is None


def test_mfu_and_friends_follow_their_formulas():
    from race.engines.trl.utilisation import gpu_hours, imbalance, mfu, tokens_per_second

    assert mfu(3e12, 2.0, 6e12) == pytest.approx(0.25)
    assert mfu(0, 1.0, 1.0) == 0.0
    with pytest.raises(ValueError, match="seconds > 0"):
        mfu(1.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="peak > 0"):
        mfu(1.0, 1.0, 0.0)
    assert tokens_per_second(300, 1.5) == pytest.approx(200.0)
    assert gpu_hours(1800, 4) == pytest.approx(2.0)
    assert imbalance([1, 1]) == 1.0 and imbalance([3, 1]) == pytest.approx(1.5) and imbalance([0, 0]) == 1.0
