"""The one device table (race.accounting.devices): the plans' --device names, the TRL logs'
torch-name matching, and the "did you mean" helper every layer uses."""

from __future__ import annotations

import subprocess
import sys

import pytest

from race.accounting import AccountingError
from race.accounting.devices import DEVICES, PEAK_FLOPS, PLAN_DEVICES, peak_flops, plan_device
from race.accounting.errors import closest, did_you_mean


def test_the_plans_devices_are_rows_of_the_table_the_logs_match():
    assert PLAN_DEVICES == ("h100", "h200", "a100", "l40s", "cpu")
    for key, torch_name in (("h100", "NVIDIA H100 80GB HBM3"), ("h200", "NVIDIA H200"),
                            ("a100", "NVIDIA A100-SXM4-80GB"), ("l40s", "NVIDIA L40S")):
        d = plan_device(key)
        for dtype in ("bf16", "fp16", "tf32", "fp32"):
            assert d.peak(dtype) == peak_flops(torch_name, dtype) is not None  # one table, two readers
        assert d.gpu and not d.effective and "data sheet" in d.source
    assert plan_device("H100").peak("torch.bfloat16") == 989.4e12  # any case; a torch dtype name
    assert plan_device("a100").peak("fp32") == 19.5e12 and plan_device("l40s").peak("bf16") == 362.05e12


def test_the_cpu_row_is_the_old_planning_constant_and_no_torch_device_matches_it():
    cpu = plan_device("cpu")
    assert cpu.effective and not cpu.gpu and cpu.match == ()
    assert {cpu.peak(t) for t in ("bf16", "fp32")} == {5e10}
    assert "demo grid" in cpu.source and "not a peak" in cpu.source
    assert peak_flops("cpu", "fp32") is None  # the TRL logs never report an MFU against it
    assert len(PEAK_FLOPS) == len(DEVICES) - 1


def test_an_unknown_device_is_refused_with_the_tables_names():
    with pytest.raises(AccountingError) as e:
        plan_device("h10")
    msg = str(e.value)
    assert "unknown device 'h10'" in msg and "did you mean 'h100'?" in msg
    assert all(k in msg for k in PLAN_DEVICES)
    with pytest.raises(AccountingError, match="the device table has h100, h200, a100, l40s, cpu"):
        plan_device("tpu-v5")  # never guessed: no closest name either
    with pytest.raises(AccountingError, match="unknown device 'b200'"):
        plan_device("b200")  # in the table for the logs, not a plan device


def test_did_you_mean_takes_aliases_then_case_then_spelling():
    assert closest("rank", ["r", "lora_alpha"], {"rank": "r"}) == "r"  # PEFT's name for the rank
    assert closest("rank", ["r", "lora_alpha"]) is None  # too far apart for difflib
    assert closest("Learning_Rate", ["learning_rate"]) == "learning_rate"
    assert closest("tiny-mm", ["tiny-xs", "tiny-s", "tiny-m", "tiny-l"]) == "tiny-m"
    assert did_you_mean("learning_rat", ["learning_rate", "beta"]) == " (did you mean 'learning_rate'?)"
    assert did_you_mean("zzz", ["learning_rate"]) == "" and did_you_mean("beta", ["beta"]) == ""
    assert closest("rank", ["lora_alpha"], {"rank": "r"}) is None  # an alias whose target is not a choice


def test_the_device_table_is_stdlib_only():
    probe = ("import sys; before = set(sys.modules); import race.accounting.devices; "
             "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
             "print(sorted(new - set(sys.stdlib_module_names) - {'race'}))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
