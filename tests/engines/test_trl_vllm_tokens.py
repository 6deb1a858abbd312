"""Rollouts that bypass the hooked model (vLLM colocate/server, continuous batching, a
``rollout_func``) are charged from the token ids they return, and that charge is exactly
what the hooks measure when the same tokens are generated through ``model.generate``.

Generation is made deterministic by forcing each row's completion (``prefix_allowed_tokens_fn``
with greedy decoding), so the measured run and the vLLM stand-in produce the same tokens
whatever the weights: rows of different prompt lengths, rows ending at EOS at different
positions, rows truncated at ``max_completion_length``."""

from __future__ import annotations

from race.accounting import PolicyCost
import copy
from collections import defaultdict

import pytest

PROMPTS = ["Q:1+2\nA:", "Q:12+30-4\nA:", "Q:3+4-5+6\nA:", "Q:9-1\nA:"]
T_MAX = 6


def _target(prompt_ids, eos: int) -> list[int]:
    """The completion forced for a prompt: 2..T_MAX tokens, EOS-terminated unless it reaches
    max_completion_length (a deterministic function of the prompt ids)."""
    n = 2 + sum(prompt_ids) % (T_MAX - 1)
    body = [30 + (sum(prompt_ids) + i) % 20 for i in range(n)]
    return body if n >= T_MAX else body[: n - 1] + [eos]


def _generate_row_by_row(lm, prompt_ids, eos):
    """Each row through the hooked model.generate, batch 1 (no padding): what a ragged
    generator executes, measured by the hooks."""
    import torch

    out = []
    for p in prompt_ids:
        want = _target(p, eos)
        n0 = len(p)

        def allowed(batch_id, ids, want=want, n0=n0):
            return [want[min(len(ids) - n0, len(want) - 1)]]

        with torch.no_grad():
            seq = lm.generate(input_ids=torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                              max_new_tokens=T_MAX, do_sample=False, prefix_allowed_tokens_fn=allowed,
                              eos_token_id=eos, pad_token_id=0)
        out.append(seq[0, n0:].tolist())
        assert out[-1] == want
    return out


@pytest.mark.parametrize("conventions", ["race", "torch"])
def test_rollout_blocks_equal_what_the_hooks_measure_row_by_row(tiny_policy, conventions):
    from race.accounting.trl_step import calls_components, calls_tokens_seconds
    from race.engines.trl.hooks import FlopTracker
    from race.engines.trl.rollouts import rollout_blocks
    from race.models.refs import model_shape

    model, tok = copy.deepcopy(tiny_policy[0]), tiny_policy[1]
    shape = model_shape(model)
    prompt_ids = [tok(text=p)["input_ids"] for p in PROMPTS]
    tracker = FlopTracker()
    tracker.attach(model)
    completions = _generate_row_by_row(model, prompt_ids, tok.eos_token_id)
    tracker.detach()
    clens = [len(c) for c in completions]
    assert len(set(clens)) > 1 and max(clens) == T_MAX and len({len(p) for p in prompt_ids}) > 1
    measured = tracker.drain()
    blocks = rollout_blocks(prompt_ids, completions, lora=False)
    got = calls_components(PolicyCost(shape, None, conventions), blocks)
    assert got == calls_components(PolicyCost(shape, None, conventions), measured)
    assert set(got) == {"rollout/prefill", "rollout/decode"} and min(got.values()) > 0
    assert calls_tokens_seconds(blocks)[0] == calls_tokens_seconds(measured)[0] == {
        "rollout/prefill": sum(len(p) for p in prompt_ids), "rollout/decode": sum(c - 1 for c in clens)}
    # the accounting's own rollout rule, no prefix shared: the same numbers
    from race.accounting import rollout_components

    assert got == rollout_components(PolicyCost(shape, None, conventions), [len(p) for p in prompt_ids], clens)


def test_rollout_blocks_refuse_mismatched_rows():
    from race.accounting import AccountingError
    from race.engines.trl.rollouts import RolloutBlock, rollout_blocks

    with pytest.raises(AccountingError, match="2 completions for 1 prompts"):
        rollout_blocks([[1, 2]], [[3], [4]], lora=False)
    with pytest.raises(AccountingError, match="empty prompt"):
        rollout_blocks([[]], [[3]], lora=False)
    with pytest.raises(AccountingError, match="prefill or decode"):
        RolloutBlock("forward", (1,), (1,), False)
    # a row that returned no token still ran its prefill
    b = rollout_blocks([[1, 2, 3]], [[]], lora=False)
    assert b[0].tokens == 3 and b[1].tokens == 0


class _FakeVLLM:
    """Stands for TRL's VLLMGeneration: returns token ids (forced completions and a
    log-prob per token) without running the hooked model."""

    def __init__(self, eos: int) -> None:
        self.eos, self.calls, self.rows = eos, 0, []

    def sync_weights(self) -> None:
        pass

    def generate(self, prompts, images, num_generations, profiler=None):
        self.calls += 1
        completions = [_target(p, self.eos) for p in prompts]
        self.rows.extend(zip(prompts, completions))
        return prompts, completions, [[[0.0] for _ in c] for c in completions], None


def _run(model_dir, out, *, vllm: bool):
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from race.engines.trl_callback import add_race_accounting
    from race.models import load_policy

    class RowByRow(GRPOTrainer):  # the measured path: every row through the hooked model.generate
        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, **kw):
            return _generate_row_by_row(self.model, prompt_ids, self.processing_class.eos_token_id), None

    torch.manual_seed(0)
    model, tok = load_policy(str(model_dir), device="cpu", attn_implementation="eager")
    args = GRPOConfig(output_dir=str(out), use_cpu=True, bf16=False, per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=T_MAX, max_steps=2, report_to="none", disable_tqdm=True,
                      save_strategy="no", activation_checkpointing=False, shuffle_dataset=False, seed=0)
    ds = Dataset.from_dict({"prompt": PROMPTS * 4})
    cls = GRPOTrainer if vllm else RowByRow
    trainer = cls(model=model, reward_funcs=lambda completions, **k: [float(len(c) % 3) for c in completions],
                  args=args, train_dataset=ds, processing_class=tok)
    if vllm:  # what GRPOTrainer(use_vllm=True) sets up, with the stand-in generator
        trainer.use_vllm, trainer.vllm_generation, trainer._last_loaded_step = True, _FakeVLLM(tok.eos_token_id), -1
        trainer.vllm_importance_sampling_correction = True
    cb = add_race_accounting(trainer, budget_flops=1e13, output_dir=out / "race", conventions="torch")
    trainer.train()
    led = defaultdict(dict)
    for r in cb.ledger:
        led[r.step][r.key] = (r.flops, r.tokens)
    return trainer, cb, led


def test_vllm_stand_in_charges_exactly_what_the_measured_path_charges(tiny_model_dir, tmp_path):
    t_hook, cb_hook, measured = _run(tiny_model_dir, tmp_path / "hooked", vllm=False)
    t_vllm, cb_vllm, analytic = _run(tiny_model_dir, tmp_path / "vllm", vllm=True)
    assert t_vllm.vllm_generation.calls == 2 and cb_vllm.watch.charged_rows == 16 and cb_hook.watch.charged_rows == 0
    assert sorted(measured) == sorted(analytic) == [1, 2]
    for step in (1, 2):
        m, a = dict(measured[step]), dict(analytic[step])
        # vLLM's importance-sampling correction makes TRL run old-policy log-probs every generation
        assert "old_logprobs/forward" not in m and a.pop("old_logprobs/forward")[0] > 0
        # vLLM prefills each prompt once for its G=4 rows: recorded as executed (uncounted) beside the charge
        executed = a.pop("executed/rollout_prefill")
        assert 4 * executed[0] == a["rollout/prefill"][0] and 4 * executed[1] == a["rollout/prefill"][1], step
        assert a.pop("rollout/weight_sync") == (0, 0)  # seconds only (TRL synced the weights before generating)
        assert a == m, step
        assert m["rollout/prefill"][0] > 0 and m["rollout/decode"][1] > 0
    assert cb_vllm.plan.needs_old_logprobs and not cb_hook.plan.needs_old_logprobs
    assert "16 rows generated outside the hooked model" in cb_vllm.report_card().extra["trl_rollouts"]
    assert "trl_rollouts" not in cb_hook.report_card().extra
    # the step bound (prompts at the longest, completions at max_completion_length) covers the vLLM steps
    per_step = {s: sum(f for k, (f, _) in analytic[s].items() if not k.startswith("recompute/")) for s in (1, 2)}
    assert cb_vllm.step_bound(0, buffered=False) >= max(per_step.values())


@pytest.mark.slow
def test_continuous_batching_is_charged_from_its_tokens_not_as_log_prob_passes(tiny_model_dir, tmp_path):
    """TRL's continuous batching runs the hooked model outside ``generate`` (paged, packed
    forwards): the hooks are paused during it, and the rows are charged from their ids."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from race.accounting import rollout_components
    from race.engines.trl_callback import add_race_accounting
    from race.models import load_policy

    rows: list = []

    class Seen(GRPOTrainer):
        def _generate_single_turn(self, prompt_ids, *a, **kw):
            out = super()._generate_single_turn(prompt_ids, *a, **kw)
            rows.extend(zip(prompt_ids, out[0]))
            return out

    model, tok = load_policy(str(tiny_model_dir), device="cpu")
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, per_device_train_batch_size=8,
                      num_generations=4, max_completion_length=6, max_steps=1, report_to="none", disable_tqdm=True,
                      save_strategy="no", activation_checkpointing=False, use_transformers_continuous_batching=True,
                      # a paged cache sized for 8 short rows: unset, transformers sizes it from free memory (0.9 of it:
                      # about 11 GB on a 24 GiB CPU machine, the suite's whole peak)
                      transformers_continuous_batching_config={"num_blocks": 16, "max_batch_tokens": 512})
    trainer = Seen(model=model, reward_funcs=lambda completions, **k: [0.0] * len(completions), args=args,
                   train_dataset=Dataset.from_dict({"prompt": PROMPTS * 4}), processing_class=tok)
    cb = add_race_accounting(trainer, budget_flops=1e13)
    trainer.train()
    keys = cb.ledger.totals_by_key()
    assert len(rows) == 8 and cb.watch.charged_rows == 8
    assert "old_logprobs/forward" not in keys and "reference/forward" not in keys  # no paged forward misread
    want = rollout_components(PolicyCost(cb.shape), [len(p) for p, _ in rows], [len(c) for _, c in rows])
    assert {k: keys[k] for k in want} == want


def test_rollout_func_is_charged_from_the_ids_it_returns(tiny_model_dir, tmp_path):
    """TRL's public ``rollout_func`` hook (a custom generator, e.g. an agent loop on vLLM)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from race.accounting import rollout_components
    from race.engines.trl_callback import add_race_accounting
    from race.models import load_policy

    model, tok = load_policy(str(tiny_model_dir), device="cpu")
    rows: list = []

    def rollout_func(prompts, trainer):
        p_ids = [tok(text=p)["input_ids"] for p in prompts]
        c_ids = [_target(p, tok.eos_token_id) for p in p_ids]
        rows.extend(zip(p_ids, c_ids))
        return {"prompt_ids": p_ids, "completion_ids": c_ids, "logprobs": [[0.0] * len(c) for c in c_ids]}

    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, per_device_train_batch_size=8,
                      num_generations=4, max_completion_length=T_MAX, max_steps=1, report_to="none",
                      disable_tqdm=True, save_strategy="no", activation_checkpointing=False)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **k: [0.0] * len(completions), args=args,
                          train_dataset=Dataset.from_dict({"prompt": PROMPTS * 4}), processing_class=tok,
                          rollout_func=rollout_func)
    cb = add_race_accounting(trainer, budget_flops=1e13)
    trainer.train()
    assert len(rows) == 8 and cb.watch.charged_rows == 8
    keys = cb.ledger.totals_by_key()
    want = rollout_components(PolicyCost(cb.shape), [len(p) for p, _ in rows], [len(c) for _, c in rows])
    assert {k: keys[k] for k in want} == want and min(want.values()) > 0
    assert trainer.rollout_func is rollout_func  # unwrapped when training ends


def test_vllm_rollouts_of_a_lora_policy_carry_no_adapter_flops(tiny_model_dir, tmp_path):
    """TRL merges the adapter into the weights it sends to vLLM: rollouts run dense weights."""
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from race.accounting import rollout_components
    from race.engines.trl_callback import add_race_accounting
    from race.models import load_policy

    model, tok = load_policy(str(tiny_model_dir), device="cpu")
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, per_device_train_batch_size=8,
                      num_generations=4, max_completion_length=T_MAX, max_steps=1, report_to="none",
                      disable_tqdm=True, save_strategy="no", activation_checkpointing=False)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **k: [0.0] * len(completions), args=args,
                          train_dataset=Dataset.from_dict({"prompt": PROMPTS * 4}), processing_class=tok,
                          peft_config=LoraConfig(r=2, task_type="CAUSAL_LM", target_modules=["q_proj", "v_proj"]))
    trainer.use_vllm, trainer.vllm_generation, trainer._last_loaded_step = True, _FakeVLLM(tok.eos_token_id), -1
    cb = add_race_accounting(trainer, budget_flops=1e13)
    trainer.train()
    assert cb.lora is not None and cb.watch.lora is False
    p_ids = [p for p, _ in trainer.vllm_generation.rows]
    c_lens = [len(c) for _, c in trainer.vllm_generation.rows]
    assert len(p_ids) == 8
    keys = cb.ledger.totals_by_key()
    dense = rollout_components(PolicyCost(cb.shape), [len(p) for p in p_ids], c_lens)
    assert {k: keys[k] for k in dense} == dense
    assert dense != rollout_components(PolicyCost(cb.shape, cb.lora), [len(p) for p in p_ids], c_lens)


def test_vllm_server_records_executed_prefill_location_and_weight_sync_apart(tiny_model_dir, tmp_path, monkeypatch):
    """Server mode (stand-in): the counted rollout/prefill charges every row (the budget's
    bound), executed/rollout_prefill (uncounted) each prompt once for its G rows; the
    weight sync's seconds are kept apart from the rollout's; the card says where rollouts
    ran, and no rollout MFU is logged for the training ranks. A controlled clock: only the
    stand-in's sync (5 s) and generation (2 s) advance it."""
    import types

    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    import race.models.timing as timing
    from race.engines.trl_callback import add_race_accounting
    from race.models import load_policy

    clock = [0.0]
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    class Server(_FakeVLLM):
        syncs = 0

        def sync_weights(self):
            self.syncs += 1
            clock[0] += 5.0

        def generate(self, *a, **kw):
            clock[0] += 2.0
            return super().generate(*a, **kw)

    torch.manual_seed(0)
    model, tok = load_policy(str(tiny_model_dir), device="cpu", attn_implementation="eager")
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, per_device_train_batch_size=8,
                      num_generations=4, max_completion_length=T_MAX, max_steps=2, report_to="none",
                      disable_tqdm=True, save_strategy="no", activation_checkpointing=False, shuffle_dataset=False,
                      seed=0, logging_steps=1)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **k: [float(len(c) % 3) for c in completions],
                          args=args, train_dataset=Dataset.from_dict({"prompt": PROMPTS * 4}), processing_class=tok)
    trainer.use_vllm, trainer.vllm_generation, trainer._last_loaded_step = True, Server(tok.eos_token_id), -1
    trainer.vllm_mode, trainer.vllm_importance_sampling_correction = "server", False
    cb = add_race_accounting(trainer, budget_flops=1e13, peak_flops=1e12)
    trainer.train()
    assert trainer.vllm_generation.syncs == 2 and cb.rollout_location == "vllm_server"
    for step in (1, 2):
        rec = {r.key: r for r in cb.ledger if r.step == step}
        charged, executed = rec["rollout/prefill"], rec["executed/rollout_prefill"]
        assert charged.counted and not executed.counted
        assert charged.flops == 4 * executed.flops > 0 and charged.tokens == 4 * executed.tokens  # G=4 rows a prompt
        assert rec["rollout/weight_sync"].seconds == 5.0 and rec["rollout/weight_sync"].flops == 0
        assert rec["rollout/decode"].seconds == 2.0  # the generation alone
    assert cb.ledger.total == sum(r.flops for r in cb.ledger if r.counted)
    assert cb.report_card().extra["rollout_location"] == "vllm_server"
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert logs[-1]["race/seconds/weight_sync"] == 10.0
    assert logs[-1]["race/tokens_per_s/rollout"] == pytest.approx(
        sum(r.tokens for r in cb.ledger if r.phase == "rollout") / 4.0)  # 2 s of generation per step
    assert not any("race/mfu/rollout" in h for h in logs)  # the server's GPUs ran the rollouts


def test_prompt_runs_take_each_prompt_once_per_group():
    from race.engines.trl.rollouts import prompt_runs

    a, b = [1, 2], [3]
    assert prompt_runs([a, a, a, a, b, b, b, b], 4) == [0, 4]
    assert prompt_runs([a] * 8, 4) == [0, 4]  # two groups of the same prompt: two prefills
    assert prompt_runs([a, a, b], 4) == [0, 2]  # a rank holding part of a group
    assert prompt_runs([a, a], 1) == [0, 1]  # the tool loop: every row its own history
