"""A reward model passed to TRL as a module in ``reward_funcs`` (a ``*ForSequenceClassification``
``PreTrainedModel``, as TRL allows) is charged from its shape, and that charge equals what
FlopCounterMode measures around TRL's reward computation (``conventions="torch"``)."""

from __future__ import annotations

from collections import defaultdict

import pytest


def _tiny_reward_model():
    import torch
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    from race.models.family import tiny_config_kwargs

    cfg = Qwen2Config(**{**tiny_config_kwargs("tiny-xs"), "num_labels": 1, "pad_token_id": 0})
    cfg._attn_implementation = "eager"
    torch.manual_seed(1)
    return Qwen2ForSequenceClassification(cfg).eval()


def test_reward_model_module_is_charged_what_it_executes(tiny_model_dir, tmp_path):
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from race.accounting import RewardSystem, reward_model_flops
    from race.engines.trl.reward_models import reward_model_shape
    from race.engines.trl_callback import add_race_accounting
    from race.measure import Counter
    from race.models import load_policy

    measured: dict = defaultdict(int)
    shapes: list = []

    class Measured(GRPOTrainer):
        def _calculate_rewards(self, *args, **kwargs):
            rm = self.reward_funcs[0]
            h = rm.register_forward_pre_hook(lambda m, a, kw: shapes.append(tuple(kw["input_ids"].shape)),
                                             with_kwargs=True)
            try:
                with Counter() as c:
                    out = super()._calculate_rewards(*args, **kwargs)
            finally:
                h.remove()
            measured[self.state.global_step + 1] += c.total
            return out

    torch.manual_seed(0)
    model, tok = load_policy(str(tiny_model_dir), device="cpu", attn_implementation="eager")
    rm = _tiny_reward_model()
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, per_device_train_batch_size=4,
                      num_generations=4, max_completion_length=5, max_steps=2, report_to="none", disable_tqdm=True,
                      save_strategy="no", activation_checkpointing=False, seed=0)
    ds = Dataset.from_dict({"prompt": ["Q:1+2\nA:", "Q:12+30-4\nA:"] * 4})
    trainer = Measured(model=model, reward_funcs=[rm], reward_processing_classes=[tok], args=args,
                       train_dataset=ds, processing_class=tok)
    cb = add_race_accounting(trainer, budget_flops=1e13, conventions="torch")
    trainer.train()
    led: dict = defaultdict(lambda: defaultdict(int))
    for r in cb.ledger:
        led[r.step][r.key] += r.flops
    assert sorted(measured) == [1, 2] and len(shapes) == 2
    for step, (B, n) in zip((1, 2), shapes):
        got = led[step]["reward/forward"] + led[step]["reward/head"]
        assert got == measured[step] > 0, step
        # the analytic formula over the padded rows, head (h -> 1) at every position
        want = reward_model_flops(RewardSystem("orm", reward_model_shape(rm)), [n] * B, head_positions="all",
                                  conventions="torch")
        assert {"reward/forward": led[step]["reward/forward"], "reward/head": led[step]["reward/head"]} == want
        assert want["reward/head"] == 2 * B * n * rm.config.hidden_size * 1
    # the step bound includes the reward model (at least the longest row it has scored)
    assert cb.reward_models.bound(4, 1) >= max(led[s]["reward/forward"] + led[s]["reward/head"] for s in (1, 2))
    assert sum(v for k, v in cb.ledger.totals_by_key().items() if k.startswith("reward/")) == sum(measured.values())


def test_reward_module_without_a_scoring_head_is_refused_with_what_to_do():
    import torch

    from race.accounting import AccountingError
    from race.engines.trl.reward_models import reward_model_shape

    with pytest.raises(AccountingError, match=r"no score/classifier Linear head.*RaceFlopCallback.charge"):
        reward_model_shape(torch.nn.Linear(2, 2))


class DeepSpeedEngine:  # the attributes of deepspeed.runtime.engine.DeepSpeedEngine the ledger meets
    """Stand-in for what TRL's ``prepare_deepspeed`` returns for a reward model (DeepSpeed is
    not installed here): an ``nn.Module`` whose ``.module`` is the model, whose ``.config`` is
    DeepSpeed's dict, which forwards other attributes (``score``) to the model, and whose
    forward calls the model."""

    def __new__(cls, module):
        import torch

        class _Engine(torch.nn.Module):
            def __init__(self, module):
                super().__init__()
                self.module = module
                self.config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}

            def __getattr__(self, name):  # DeepSpeedEngine forwards unknown attributes to its module
                try:
                    return super().__getattr__(name)
                except AttributeError:
                    return getattr(super().__getattr__("module"), name)

            def forward(self, *args, **kwargs):
                return self.module(*args, **kwargs)

        _Engine.__name__ = _Engine.__qualname__ = "DeepSpeedEngine"
        return _Engine(module)


def test_deepspeed_wrapped_reward_model_is_unwrapped_and_charged(tiny_model_dir, tmp_path):
    """TRL wraps a reward model with ``prepare_deepspeed`` under DeepSpeed: the ledger reads the
    shape of ``engine.module`` (``engine.config`` is a dict) and charges the same FLOPs."""
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from race.accounting import RewardSystem, reward_model_flops
    from race.engines.trl.reward_models import reward_model_shape
    from race.engines.trl_callback import add_race_accounting
    from race.models import load_policy

    torch.manual_seed(0)
    model, tok = load_policy(str(tiny_model_dir), device="cpu", attn_implementation="eager")
    rm = _tiny_reward_model()
    shapes: list = []
    rm.register_forward_pre_hook(lambda m, a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, per_device_train_batch_size=4,
                      num_generations=4, max_completion_length=4, max_steps=1, report_to="none", disable_tqdm=True,
                      save_strategy="no", activation_checkpointing=False, seed=0)
    trainer = GRPOTrainer(model=model, reward_funcs=[rm], reward_processing_classes=[tok], args=args,
                          train_dataset=Dataset.from_dict({"prompt": ["Q:1+2\nA:"] * 4}), processing_class=tok)
    engine = DeepSpeedEngine(rm)
    assert isinstance(engine.config, dict) and type(engine).__name__ == "DeepSpeedEngine"
    trainer.reward_funcs[0] = engine  # what GRPOTrainer.__init__ does under DeepSpeed
    assert reward_model_shape(engine) == reward_model_shape(rm)
    cb = add_race_accounting(trainer, budget_flops=1e13, conventions="torch")
    trainer.train()
    ((B, n),) = shapes
    want = reward_model_flops(RewardSystem("orm", reward_model_shape(rm)), [n] * B, head_positions="all",
                              conventions="torch")
    got = {k: v for k, v in cb.ledger.totals_by_key().items() if k.startswith("reward/")}
    assert got == want and want["reward/forward"] > 0
