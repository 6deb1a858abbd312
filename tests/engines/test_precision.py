"""The base model's dtype (``dtype: bfloat16 | float16 | float32``) with LoRA adapters and
their optimizer state in float32, through the built-in engine (fast decoder and fast
forward), the gang and the TRL engine; on CPU.

FLOPs do not depend on the dtype: a bfloat16 run's ledger is the float32 run's, row for
row (seconds aside). For the ledgers to be comparable both runs must generate completions
of the same lengths, which sampling in two precisions does not promise; so these runs use
a random tiny model that can never emit EOS (every completion runs to
``max_completion_length``) and the random-reward control (rewards independent of the
text): whatever tokens the two precisions sample, every matmul has the same shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from race.spec import ConfigError, run_config_from_dict

EOS_MARGIN = 3.0  # the embedding coordinate that pushes EOS down (see never_eos_dir)


@pytest.fixture(scope="module")
def never_eos_dir(tmp_path_factory, char_tokenizer):
    """A random tiny-xs (tied embeddings) whose EOS logit is about -2 x 3 x sqrt(hidden)
    below every other token's: embedding coordinate 0 is +3 for every token and -3 for EOS.
    The residual stream carries the input token's +3 (the layers' random outputs are of
    order 0.02), so after the final RMSNorm coordinate 0 is about +sqrt(hidden) = 6.9 and
    the tied head gives EOS about -21 and the rest about +21: p(EOS) < 1e-17 per token."""
    import torch

    from race.models.family import build_tiny_model

    model = build_tiny_model("tiny-xs", seed=0)
    emb = model.get_input_embeddings().weight
    with torch.no_grad():
        emb[:, 0] = EOS_MARGIN
        emb[char_tokenizer.eos_token_id, 0] = -EOS_MARGIN
    path = tmp_path_factory.mktemp("never-eos")
    model.save_pretrained(path, safe_serialization=True)
    char_tokenizer.save_pretrained(path)
    return path


def _cfg(model_dir: Path, **over):
    d = dict(model=str(model_dir), budget_flops=3e9, prompts_per_step=4, num_generations=4, device="cpu",
             max_completion_length=8, reward="random", learning_rate=1e-3, seed=3, checkpoint_every=2,
             lora={"r": 4, "lora_alpha": 8}, torch_threads=1,
             eval={"n_problems": 8, "n_hard_problems": 4, "n_pass_problems": 4, "pass_k": 2, "num_points": 2})
    d.update(over)
    return run_config_from_dict(d)


def _ledger(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(x).items() if not k.startswith("seconds")}
            for x in (run / "ledger.jsonl").read_text().splitlines()]


def _adapter_dtypes(run: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(run / "adapter" / "adapter_model.safetensors"), "pt") as f:
        return {str(f.get_tensor(k).dtype) for k in f.keys()}


def test_the_never_eos_model_runs_every_completion_to_full_length(never_eos_dir, tmp_path):
    from race.engines import run_engine

    run_engine(_cfg(never_eos_dir, max_steps=2), tmp_path / "r")
    train = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
             if json.loads(x)["kind"] == "train"]
    assert train and all(r["trunc_rate"] == 1.0 and r["completion_len"] == 8 for r in train)


@pytest.mark.parametrize("engine", ["builtin", "trl"])
def test_a_bfloat16_base_gives_the_float32_ledger(never_eos_dir, tmp_path, engine):
    """Same config and seed in float32 and bfloat16: the same ledger row for row, both runs
    complete at the budget, and the bfloat16 run's adapter is saved in float32 (PEFT's
    autocast_adapter_dtype; AdamW's state follows its parameters' dtype)."""
    from race.engines import run_engine

    extra = {"drop_zero_variance_groups": False} if engine == "trl" else {}
    outs = {dt: run_engine(_cfg(never_eos_dir, engine=engine, dtype=dt, **extra), tmp_path / dt)
            for dt in ("float32", "bfloat16")}
    assert all(o["status"] == "complete" and o["stop_reason"] == "budget" for o in outs.values())
    assert outs["bfloat16"]["steps"] == outs["float32"]["steps"] >= 2
    assert _ledger(tmp_path / "bfloat16") == _ledger(tmp_path / "float32")
    assert _adapter_dtypes(tmp_path / "bfloat16") == {"torch.float32"}


def test_a_gang_on_a_bfloat16_base_gives_its_members_float32_ledgers(never_eos_dir, tmp_path):
    """The gang's batched multi-LoRA forward mixes a bf16 base with fp32 adapters as PEFT
    does (it refused before: 'expected m1 and m2 to have the same dtype')."""
    from race.engines.gang import run_gang

    def members(dt):
        return [_cfg(never_eos_dir, dtype=dt), _cfg(never_eos_dir, dtype=dt, seed=4, num_generations=2,
                                                       budget_flops=2e9)]

    for dt in ("float32", "bfloat16"):
        outs = run_gang([(c, tmp_path / f"{dt}-{i}") for i, c in enumerate(members(dt))], tmp_path / f"gang-{dt}")
        assert [o["status"] for o in outs] == ["complete", "complete"]
    for i in range(2):
        assert _ledger(tmp_path / f"bfloat16-{i}") == _ledger(tmp_path / f"float32-{i}")
        assert _adapter_dtypes(tmp_path / f"bfloat16-{i}") == {"torch.float32"}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_full_fine_tuning_in_half_precision_is_refused(dtype):
    """Without an adapter the trained weights and AdamW's state would be the base's half
    dtype (updates below its resolution lost): the config says what to change."""
    with pytest.raises(ConfigError, match=f"dtype={dtype} with lora: null"):
        run_config_from_dict(dict(model="tiny-s", budget_flops=1e9, lora=None, dtype=dtype))
    run_config_from_dict(dict(model="tiny-s", budget_flops=1e9, lora=None, dtype="float32"))
