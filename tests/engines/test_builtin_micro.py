"""The built-in engine's micro-batching (TRL's per_device_train_batch_size x
gradient_accumulation_steps) and gradient checkpointing: same ledger and same update as
one batch; checkpointing's recompute recorded as the analytic convention says and as
FlopCounterMode measures."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from race.spec.run import LOSS_TYPES, run_config_from_dict


def _cfg(model_dir: Path, **over):
    d = dict(model=str(model_dir), budget_flops=5e9, prompts_per_step=4, num_generations=4, max_completion_length=10,
             reward="random", learning_rate=1e-2, seed=5, max_steps=1, num_iterations=2, beta=0.05,
             eval={"n_problems": 2, "n_hard_problems": 0, "n_pass_problems": 0, "targets": ["greedy"]},
             torch_threads=1, conventions="torch")
    d.update(over)
    return run_config_from_dict(d)


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _ledger(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "seconds"} for r in _lines(run / "ledger.jsonl")]


def _adapter(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(run / "adapter" / "adapter_model.safetensors"))


def _measured_run(cfg, out: Path, monkeypatch) -> tuple[dict, dict[int, int], list[tuple[int, int, int]]]:
    """Run ``cfg``; FlopCounterMode's count of each training step, and the (rows, P, T) of
    each update batch."""
    from torch.utils.flop_counter import FlopCounterMode

    from race.engines import builtin, run_engine

    measured: dict[int, int] = {}
    shapes: list[tuple[int, int, int]] = []
    real_step, real_update = builtin.BuiltinEngine._train_step, builtin.BuiltinEngine.update

    def counted(self, step, *a, **k):
        with FlopCounterMode(display=False) as fc:
            charged = real_step(self, step, *a, **k)
        measured[step] = fc.get_total_flops()
        return charged

    def update(self, batch, adv, step):
        shapes.append((batch.prompt_ids.shape[0], batch.prompt_ids.shape[1], batch.completion_ids.shape[1]))
        return real_update(self, batch, adv, step)

    with monkeypatch.context() as m:
        m.setattr(builtin.BuiltinEngine, "_train_step", counted)
        m.setattr(builtin.BuiltinEngine, "update", update)
        out_json = run_engine(cfg, out)
    return out_json, measured, shapes


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_accumulated_micro_batches_give_the_one_batch_gradient(tiny_policy, loss_type):
    """Every loss type: the gradient accumulated over uneven micro-batches (3 + 3 + 2 rows)
    equals the one-batch gradient."""
    from race.engines.grpo_math import grpo_loss
    from race.engines.builtin.micro_batch import accumulate_gradients
    from race.engines.sampling import Rollout
    from race.models import wrap_lora
    from race.spec.run import LoraSettings

    torch.manual_seed(0)
    model = wrap_lora(copy.deepcopy(tiny_policy[0]), LoraSettings(r=4))
    for n, p in model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.05)  # PEFT starts B at 0; make every gradient non-trivial
    B, P, T = 8, 5, 7
    ro = Rollout(prompt_ids=torch.randint(4, 90, (B, P)), prompt_mask=torch.ones(B, P, dtype=torch.long),
                 completion_ids=torch.randint(4, 90, (B, T)), completion_mask=torch.ones(B, T, dtype=torch.long),
                 truncated=torch.zeros(B, dtype=torch.bool), n_prompts=2, group=4)
    ro.prompt_mask[0, :2] = 0  # left padding
    lengths = torch.tensor([7, 3, 5, 1, 6, 2, 7, 4])
    ro.completion_mask = (torch.arange(T)[None] < lengths[:, None]).long()
    mask = ro.completion_mask.clone()
    adv = torch.randn(B)
    with torch.no_grad():
        from race.engines.builtin.micro_batch import logprobs

        base = logprobs(model, ro, B, 1.0)
    old = base + 0.3 * torch.randn_like(base)  # some ratios clip
    ref = base + 0.2 * torch.randn_like(base)
    kw = dict(epsilon=0.2, epsilon_high=0.28, loss_type=loss_type, max_completion_length=T, beta=0.1,
              sapo_temperatures=(1.0, 1.05))
    grads, stats = [], []
    for size in (B, 3):
        model.zero_grad(set_to_none=True)
        stats.append(accumulate_gradients(model, ro, adv, mask, old, ref, size=size, temperature=1.0,
                                          loss_fn=grpo_loss, loss_kwargs=kw, step=1))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad})
    assert any(g.abs().sum() > 0 for g in grads[0].values())
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], rtol=1e-5, atol=1e-7, msg=n)
    assert stats[1].loss == pytest.approx(stats[0].loss, rel=1e-5, abs=1e-7)
    assert stats[1].kl == pytest.approx(stats[0].kl, rel=1e-5)
    assert stats[1].clip_frac == pytest.approx(stats[0].clip_frac, abs=1e-6)
    assert stats[0].clip_frac > 0 or loss_type == "sapo"  # sapo gates softly: nothing clips


def test_micro_batched_run_has_the_one_batch_ledger_and_update(tiny_model_dir, tmp_path, monkeypatch):
    """gradient_accumulation_steps 4 x 4 sequences against one batch of 16: the same
    ledger, equal to the measured FLOPs, and the same LoRA weights after the step (an SGD
    step: linear in the gradient, so equal gradients give equal weights)."""
    _sgd_optimizer(monkeypatch)
    one, m1, s1 = _measured_run(_cfg(tiny_model_dir), tmp_path / "one", monkeypatch)
    micro_cfg = _cfg(tiny_model_dir, per_device_train_batch_size=4, gradient_accumulation_steps=4)
    assert (micro_cfg.prompts_per_step, micro_cfg.micro_batch_size) == (4, 4)
    micro, m4, s4 = _measured_run(micro_cfg, tmp_path / "micro", monkeypatch)
    assert one["steps"] == micro["steps"] == 1 and s1 == s4 and s1[0][0] > 4  # more than one micro-batch ran
    assert _ledger(tmp_path / "one") == _ledger(tmp_path / "micro")
    assert m1 == m4
    ledger = _ledger(tmp_path / "micro")
    assert m4[1] == sum(r["flops"] for r in ledger if r["step"] == 1 and r["counted"])
    a, b = _adapter(tmp_path / "one"), _adapter(tmp_path / "micro")
    assert a.keys() == b.keys()
    start = _adapter_at_init(tiny_model_dir)
    assert any(not torch.equal(a[k], start[k]) for k in a)  # the step moved the adapter
    _same_update(a, b, start)


def _sgd_optimizer(monkeypatch) -> None:
    """The runs step with plain SGD instead of AdamW, so an update is linear in its gradient.

    AdamW's first step moves a weight by about lr * g / (|g| + eps): where a gradient is near
    zero its float rounding (other matmul shapes, other summation order) flips a whole step of
    lr. SGD moves it by lr * (g + weight_decay * w), so equal gradients give equal updates to
    the gradients' own rounding."""
    import torch

    sgd = torch.optim.SGD
    monkeypatch.setattr(torch.optim, "AdamW", lambda params, lr, weight_decay=0.0: sgd(params, lr=lr,
                                                                                       weight_decay=weight_decay))


def _same_update(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> None:
    """Equal SGD updates (``_sgd_optimizer``) up to float32 rounding, tensor by tensor.

    The two runs' gradients are the same sums taken in another order (other micro-batch
    shapes): each gradient entry differs by a few float32 ulps of the largest partial sums,
    so the tolerance is relative to the tensor's largest update (1e-4 of it, far above
    float32's 1.2e-7 accumulated over the few hundred terms of a sum), plus the rounding of
    the weights themselves (4 ulps of the largest weight), which the subtraction exposes."""
    eps = torch.finfo(torch.float32).eps
    for k in a:
        da, db = a[k] - start[k], b[k] - start[k]
        atol = 1e-4 * float(da.abs().max()) + 4 * eps * float(a[k].abs().max())
        torch.testing.assert_close(db, da, rtol=1e-4, atol=atol, msg=k)


def _adapter_at_init(model_dir: Path) -> dict[str, torch.Tensor]:
    """The adapter the runs start from (PEFT's init under the run's seed)."""
    from race.engines.common import load_run_policy
    from race.models import wrap_lora

    cfg = _cfg(model_dir)
    policy = load_run_policy(cfg)
    model = wrap_lora(policy.model, cfg.lora)
    from peft import get_peft_model_state_dict

    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}


def test_gradient_checkpointing_records_the_recompute_it_runs(tiny_model_dir, tmp_path, monkeypatch):
    """With gradient_checkpointing the ledger's recompute/forward is the analytic
    convention (non-reentrant: each layer's last matmul skipped), ledger counted +
    recompute equals the measured FLOPs, and the update equals the plain one."""
    from race.accounting import LoRA, backward_components, recompute_flops, sequence_work
    from race.models import load_policy, model_shape

    # a checkpointed model runs HF's forward (race.engines.kernels.fast_forward falls back); the
    # plain run is made to run it too, so the updates compare the same arithmetic
    monkeypatch.setattr("race.engines.kernels.fast_forward.supports", lambda model: False)
    _sgd_optimizer(monkeypatch)
    plain, _, s0 = _measured_run(_cfg(tiny_model_dir), tmp_path / "plain", monkeypatch)
    ck, measured, s1 = _measured_run(_cfg(tiny_model_dir, gradient_checkpointing=True), tmp_path / "ck", monkeypatch)
    assert s0 == s1 and ck["steps"] == 1
    ledger = _ledger(tmp_path / "ck")
    step = [r for r in ledger if r["step"] == 1]
    rec = {r["component"]: r["flops"] for r in step if r["phase"] == "recompute"}
    assert set(rec) == {"forward"} and not any(r["counted"] for r in step if r["phase"] == "recompute")
    shape = model_shape(load_policy(tiny_model_dir, device="cpu", dtype="float32")[0])
    n, P, T = s1[0]
    work = sequence_work([P + T] * n, [T] * n, "torch")
    lora = LoRA(16, tuple(_cfg(tiny_model_dir).lora.target_modules))
    assert rec["forward"] == 2 * recompute_flops(shape, work, lora=lora, conventions="torch", early_stop=True) > 0
    bwd = {r["component"]: r["flops"] for r in step if r["phase"] == "update"}["backward"]
    assert bwd == 2 * sum(backward_components(shape, work, lora=lora, conventions="torch",
                                              inputs_require_grad=True).values())
    assert measured[1] == sum(r["flops"] for r in step if r["counted"] or r["phase"] == "recompute")
    plain_step = {(r["phase"], r["component"]): r["flops"] for r in _ledger(tmp_path / "plain") if r["step"] == 1}
    ck_step = {(r["phase"], r["component"]): r["flops"] for r in step}
    assert {k: v for k, v in ck_step.items() if k[0] not in ("recompute", "update")} == \
        {k: v for k, v in plain_step.items() if k[0] != "update"}
    assert ck_step[("update", "backward")] > plain_step[("update", "backward")]  # layer 0's input grads run
    _same_update(_adapter(tmp_path / "plain"), _adapter(tmp_path / "ck"), _adapter_at_init(tiny_model_dir))


def test_gradient_checkpointing_full_fine_tuning_is_measured_exactly(tiny_model_dir, tmp_path, monkeypatch):
    """Full fine-tuning (lora: null) with checkpointing: ledger counted + recompute ==
    FlopCounterMode, and the counted FLOPs equal the plain run's (the embedding is
    trainable, so layer 0's input gradients run either way) when that runs unshared too."""
    monkeypatch.setattr("race.engines.kernels.fast_forward.supports", lambda model: False)  # the checkpointed run's forward
    plain, m0, _ = _measured_run(_cfg(tiny_model_dir, lora=None, learning_rate=1e-5), tmp_path / "p", monkeypatch)
    ck, m1, _ = _measured_run(_cfg(tiny_model_dir, lora=None, learning_rate=1e-5, gradient_checkpointing=True),
                              tmp_path / "c", monkeypatch)
    step = [r for r in _ledger(tmp_path / "c") if r["step"] == 1]
    recompute = sum(r["flops"] for r in step if r["phase"] == "recompute")
    assert recompute > 0 and m1[1] == sum(r["flops"] for r in step if r["counted"]) + recompute
    assert m1[1] - recompute == m0[1] == sum(r["flops"] for r in _ledger(tmp_path / "p") if r["step"] == 1
                                              and r["counted"])
