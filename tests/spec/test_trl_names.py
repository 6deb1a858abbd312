"""TRL 1.16's names and values in run files: scale_rewards, all-linear, loss types, and
per_device_train_batch_size / gradient_accumulation_steps with TRL's meaning."""

from __future__ import annotations

import pytest

from race.spec import ConfigError
from race.spec.run import LORA_TARGETS, LOSS_TYPES, run_config_from_dict


def cfg(**over):
    return run_config_from_dict({"budget_flops": 1e12, **over})


@pytest.mark.parametrize("given,want", [(True, "group"), (False, "none"), ("group", "group"), ("batch", "batch"),
                                        ("none", "none")])
def test_scale_rewards_takes_trls_values_and_bools(given, want):
    assert cfg(scale_rewards=given).scale_rewards == want


def test_scale_rewards_and_loss_type_say_what_to_write():
    with pytest.raises(ConfigError, match="scale_rewards"):
        cfg(scale_rewards="per-prompt")
    for refused in ("luspo", "vespo"):
        with pytest.raises(ConfigError, match=f"loss_type='{refused}'.*not supported.*" + ", ".join(LOSS_TYPES)):
            cfg(loss_type=refused)
    for ok in LOSS_TYPES:
        assert cfg(loss_type=ok).loss_type == ok
    with pytest.raises(ConfigError, match="loss_type"):
        cfg(loss_type="ppo")


def test_all_linear_is_every_matrix_peft_adapts(tiny_policy):
    """PEFT's all-linear on a RACE model adapts exactly the seven matrices it resolves to."""
    import copy

    from peft import LoraConfig, get_peft_model

    for form in ("all-linear", ["all-linear"]):
        assert cfg(lora={"target_modules": form}).lora.target_modules == list(LORA_TARGETS)
    with pytest.raises(ConfigError, match="all-linear"):
        cfg(lora={"target_modules": "q_proj"})
    model, _ = tiny_policy
    peft = get_peft_model(copy.deepcopy(model), LoraConfig(r=2, target_modules="all-linear"))
    adapted = {n.rsplit(".", 1)[-1] for n, m in peft.named_modules() if hasattr(m, "lora_A")}
    assert adapted == set(LORA_TARGETS)


def test_batch_sizes_have_trls_meaning():
    # given without prompts_per_step, they set it: one generation of B x ga sequences per step
    c = cfg(engine="trl", per_device_train_batch_size=8, gradient_accumulation_steps=4, num_generations=8)
    assert (c.prompts_per_step, c.micro_batch_size, c.accumulation_steps) == (4, 8, 4)
    c = cfg(engine="trl", prompts_per_step=4, num_generations=8, gradient_accumulation_steps=2)
    assert (c.micro_batch_size, c.accumulation_steps) == (16, 2)
    c = cfg(prompts_per_step=4, num_generations=8)
    assert (c.micro_batch_size, c.accumulation_steps) == (32, 1)
    # the built-in engine takes them too (it micro-batches the log-prob passes and the update)
    assert cfg(prompts_per_step=4, num_generations=8, per_device_train_batch_size=32,
               gradient_accumulation_steps=1).micro_batch_size == 32
    c = cfg(prompts_per_step=4, num_generations=8, gradient_accumulation_steps=2)
    assert (c.engine, c.micro_batch_size, c.accumulation_steps) == ("builtin", 16, 2)
    c = cfg(per_device_train_batch_size=8, gradient_accumulation_steps=4, num_generations=8)
    assert (c.engine, c.prompts_per_step, c.micro_batch_size, c.accumulation_steps) == ("builtin", 4, 8, 4)
    with pytest.raises(ConfigError, match="= 32 sequences per step, but prompts_per_step x num_generations = 128.*"
                                          "gradient_accumulation_steps: 4"):
        cfg(engine="trl", prompts_per_step=16, num_generations=8, per_device_train_batch_size=32)
    with pytest.raises(ConfigError, match="not a multiple of num_generations=8"):
        cfg(engine="trl", per_device_train_batch_size=6, num_generations=8)
    with pytest.raises(ConfigError, match="does not divide"):
        cfg(engine="trl", prompts_per_step=3, num_generations=2, gradient_accumulation_steps=4)


def test_run_ids_of_runs_that_do_not_use_the_new_settings_hold():
    """Ids issued before these settings existed (computed on the previous release)."""
    assert cfg().run_id() == "08251ecb8f02"
    assert cfg(engine="trl", scale_rewards=False, loss_type="grpo", lora={"r": 4}).run_id() == "da3c6f8ae60d"
    assert cfg(scale_rewards="none").run_id() == cfg(scale_rewards=False).run_id() != cfg().run_id()
    assert cfg(scale_rewards="batch").run_id() != cfg().run_id()
    assert cfg(log_to=["wandb"], wandb_project="p").run_id() == cfg().run_id()  # logging only
    assert cfg(loss_type="sapo").run_id() != cfg(loss_type="sapo", sapo_temperature_neg=2.0).run_id()
    assert cfg(engine="trl", gradient_accumulation_steps=2).run_id() != cfg(engine="trl").run_id()


def test_the_trl_run_file_of_docs_trl_md_loads():
    import re
    from pathlib import Path

    import yaml

    text = (Path(__file__).resolve().parents[2] / "docs" / "trl.md").read_text()
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "gradient_accumulation_steps" in b)
    c = cfg(**yaml.safe_load(block))
    assert (c.prompts_per_step, c.micro_batch_size, c.accumulation_steps) == (8, 16, 4)
    assert c.scale_rewards == "batch" and c.lora.target_modules == list(LORA_TARGETS)
    assert c.log_to == ["wandb"] and c.wandb_project == "my-grpo"
