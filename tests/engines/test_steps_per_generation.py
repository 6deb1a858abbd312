"""``steps_per_generation`` (TRL's meaning): a generation batch of ``steps_per_generation``
micro-batches trained in optimizer steps of ``gradient_accumulation_steps`` micro-batches,
so one generation feeds ``steps_per_generation / gradient_accumulation_steps`` optimizer
steps per iteration. The built-in engine's ledger equals FlopCounterMode's count; it is the
one-optimizer-step ledger plus the old-policy pass (the policy moves within the batch);
each optimizer step's gradient is the one-batch gradient of its own rows; the config
refuses what the engines cannot run, saying what to change."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from race.spec import ConfigError
from race.spec.run import LOSS_TYPES, run_config_from_dict


def _cfg(model_dir: Path, **over):
    d = dict(model=str(model_dir), budget_flops=5e9, prompts_per_step=4, num_generations=4, max_completion_length=10,
             reward="random", learning_rate=1e-2, seed=5, max_steps=1, beta=0.05, drop_zero_variance_groups=False,
             eval={"n_problems": 2, "n_hard_problems": 0, "n_pass_problems": 0, "targets": ["greedy"]},
             torch_threads=1, conventions="torch")
    d.update(over)
    return run_config_from_dict(d)


def _ledger(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(x).items() if k != "seconds"}
            for x in (run / "ledger.jsonl").read_text().splitlines()]


def test_config_derives_and_refuses_with_what_to_change(tmp_path):
    base = dict(budget_flops=1e12, num_generations=4)
    c = run_config_from_dict({**base, "per_device_train_batch_size": 4, "steps_per_generation": 4})
    assert (c.prompts_per_step, c.micro_batch_size, c.accumulation_steps, c.generation_steps) == (4, 4, 1, 4)
    assert c.optimizer_steps_per_generation == 4 and c.needs_old_logprobs
    c = run_config_from_dict({**base, "prompts_per_step": 4, "gradient_accumulation_steps": 2, "steps_per_generation": 4})
    assert (c.micro_batch_size, c.optimizer_steps_per_generation) == (4, 2)
    c = run_config_from_dict({**base, "prompts_per_step": 4, "gradient_accumulation_steps": 4})
    assert c.generation_steps == 4 and c.optimizer_steps_per_generation == 1 and not c.needs_old_logprobs
    # unset, the id is the id runs had before the setting existed
    plain = run_config_from_dict({**base, "prompts_per_step": 4})
    assert plain.run_id() == run_config_from_dict({**base, "prompts_per_step": 4, "steps_per_generation": None}).run_id()
    assert plain.run_id() != run_config_from_dict({**base, "prompts_per_step": 4, "steps_per_generation": 2}).run_id()
    with pytest.raises(ConfigError, match="steps_per_generation=4 is not a multiple of gradient_accumulation_steps=3"):
        run_config_from_dict({**base, "prompts_per_step": 3, "gradient_accumulation_steps": 3, "steps_per_generation": 4})
    with pytest.raises(ConfigError, match="steps_per_generation=3 does not divide .* 16 sequences"):
        run_config_from_dict({**base, "prompts_per_step": 4, "steps_per_generation": 3})
    with pytest.raises(ConfigError, match=r"4 x 2 = 8 sequences per step, but .* = 16.*set steps_per_generation: 4"):
        run_config_from_dict({**base, "prompts_per_step": 4, "per_device_train_batch_size": 4, "steps_per_generation": 2})


def _run(cfg, out: Path, monkeypatch) -> tuple[dict, dict[int, int], list[int]]:
    """Run ``cfg`` with plain SGD; FlopCounterMode's count of each training step and the
    number of optimizer steps taken in each."""
    from torch.utils.flop_counter import FlopCounterMode

    from race.engines import builtin, run_engine

    measured: dict[int, int] = {}
    opt_steps: list[int] = []

    class CountingSGD(torch.optim.SGD):
        def step(self, *a, **k):  # type: ignore[override]
            opt_steps[-1] += 1
            return super().step(*a, **k)

    real = builtin.BuiltinEngine._train_step

    def counted(self, step, *a, **k):
        opt_steps.append(0)
        with FlopCounterMode(display=False) as fc:
            charged = real(self, step, *a, **k)
        measured[step] = fc.get_total_flops()
        return charged

    with monkeypatch.context() as m:
        m.setattr(torch.optim, "AdamW", lambda params, lr, weight_decay=0.0: CountingSGD(params, lr=lr,
                                                                                          weight_decay=weight_decay))
        m.setattr(builtin.BuiltinEngine, "_train_step", counted)
        result = run_engine(cfg, out)
    return result, measured, opt_steps


@pytest.mark.parametrize("mu", [1, 2])
def test_builtin_ledger_equals_measured_and_adds_only_the_old_policy_pass(tiny_model_dir, tmp_path, monkeypatch, mu):
    """16 sequences in micro-batches of 4: ``steps_per_generation: 4`` takes 4 optimizer
    steps per pass (x num_iterations), ``gradient_accumulation_steps: 4`` one. Same
    rollout, reference and update FLOPs; the first adds the old-policy forward (which
    ``num_iterations: 2`` runs anyway); each ledger equals what FlopCounterMode counts."""
    k4, m4, s4 = _run(_cfg(tiny_model_dir, per_device_train_batch_size=4, steps_per_generation=4, num_iterations=mu),
                      tmp_path / "spg", monkeypatch)
    k1, m1, s1 = _run(_cfg(tiny_model_dir, per_device_train_batch_size=4, gradient_accumulation_steps=4,
                           num_iterations=mu), tmp_path / "ga", monkeypatch)
    assert k4["steps"] == k1["steps"] == 1
    assert s4 == [4 * mu] and s1 == [mu]
    led4, led1 = _ledger(tmp_path / "spg"), _ledger(tmp_path / "ga")
    for led, m in ((led4, m4), (led1, m1)):
        assert m[1] == sum(r["flops"] for r in led if r["step"] == 1 and r["counted"])
    step4 = {(r["phase"], r["component"]): r for r in led4 if r["step"] == 1 and r["counted"]}
    step1 = {(r["phase"], r["component"]): r for r in led1 if r["step"] == 1 and r["counted"]}
    old = step4.pop(("old_logprobs", "forward"))
    assert old["flops"] > 0 and old["flops"] == step4[("update", "forward")]["flops"] // mu
    if mu == 1:
        assert ("old_logprobs", "forward") not in step1
    else:
        assert step1.pop(("old_logprobs", "forward")) == old
    assert step4 == step1
    assert k4["phase_flops"]["update"] == k1["phase_flops"]["update"] > 0


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_each_optimizer_step_takes_the_one_batch_gradient_of_its_rows(tiny_policy, loss_type):
    """Rows 0-5 of 8 as one optimizer step of two micro-batches of 3 (``optimizer_steps(8,
    3, 2)``): its gradient is the one-batch gradient of those six rows alone (their loss
    normalised by their own sequences or tokens), for every loss type."""
    from race.engines.builtin.micro_batch import accumulate_gradients, logprobs, optimizer_steps, rows
    from race.engines.grpo_math import grpo_loss
    from race.engines.sampling import Rollout
    from race.models import wrap_lora
    from race.spec.run import LoraSettings

    torch.manual_seed(1)
    model = wrap_lora(copy.deepcopy(tiny_policy[0]), LoraSettings(r=4))
    for n, p in model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.05)
    B, P, T = 8, 5, 7
    ro = Rollout(prompt_ids=torch.randint(4, 90, (B, P)), prompt_mask=torch.ones(B, P, dtype=torch.long),
                 completion_ids=torch.randint(4, 90, (B, T)), completion_mask=torch.ones(B, T, dtype=torch.long),
                 truncated=torch.zeros(B, dtype=torch.bool), n_prompts=2, group=4)
    lengths = torch.tensor([7, 3, 5, 1, 6, 2, 7, 4])
    ro.completion_mask = (torch.arange(T)[None] < lengths[:, None]).long()
    mask, adv = ro.completion_mask.clone(), torch.randn(B)
    with torch.no_grad():
        base = logprobs(model, ro, B, 1.0)
    old, ref = base + 0.3 * torch.randn_like(base), base + 0.2 * torch.randn_like(base)
    kw = dict(epsilon=0.2, epsilon_high=0.28, loss_type=loss_type, max_completion_length=T, beta=0.1,
              sapo_temperatures=(1.0, 1.05))
    steps = optimizer_steps(B, 3, 2)
    assert steps == [[slice(0, 3), slice(3, 6)], [slice(6, 8)]]
    grads = []
    for sub, a, m, o, r, slices in ((ro, adv, mask, old, ref, steps[0]),
                                    (rows(ro, slice(0, 6)), adv[:6], mask[:6], old[:6], ref[:6], None)):
        model.zero_grad(set_to_none=True)
        accumulate_gradients(model, sub, a, m, o, r, size=3 if slices else 6, temperature=1.0, loss_fn=grpo_loss,
                             loss_kwargs=kw, step=1, slices=slices)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad})
    assert any(g.abs().sum() > 0 for g in grads[0].values())
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], rtol=1e-5, atol=1e-7, msg=n)


def test_trl_engine_runs_trls_steps_per_generation(tiny_model_dir, tmp_path):
    """``engine: trl`` passes ``steps_per_generation`` to ``GRPOConfig``: 16 sequences in
    micro-batches of 8, two optimizer steps per generation; ``max_steps: 2`` generations are
    four TRL steps, the rollout and the old-policy pass on the first of each pair."""
    from race.engines.trl.config import grpo_args
    from race.engines.trl import TrlEngine

    cfg = _cfg(tiny_model_dir, engine="trl", per_device_train_batch_size=8, steps_per_generation=2, max_steps=2,
               beta=0.0, budget_flops=1e12)
    args = grpo_args(cfg, tmp_path / "args", use_cpu=True, max_steps=4)
    assert (args.steps_per_generation, args.gradient_accumulation_steps, args.generation_batch_size) == (2, 1, 16)
    out = TrlEngine(cfg, tmp_path / "run").run()
    assert out["steps"] == 4 and out["stop_reason"] == "max_steps"
    led = _ledger(tmp_path / "run")
    by = {s: {r["phase"] for r in led if r["step"] == s and r["counted"] and r["flops"] > 0} for s in (1, 2, 3, 4)}
    assert [("rollout" in by[s], "old_logprobs" in by[s], "update" in by[s]) for s in (1, 2, 3, 4)] == [
        (True, True, True), (False, False, True), (True, True, True), (False, False, True)]
