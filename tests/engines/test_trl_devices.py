"""The TRL drop-in's hooks at real-run settings: a model that moves after attach (ZeRO-1/2
and FSDP place it at ``accelerate.prepare``), the per-call synchronize switch,
``torch.compile`` and micro-steps counted from callback events."""

from __future__ import annotations

from race.accounting import PolicyCost
import pytest


def _pretend_cpu_is_cuda(monkeypatch) -> list:
    """Stand-in for a GPU: ``cpu`` reads as CUDA to the clock, and every synchronize is logged."""
    import torch

    import race.models.timing as timing

    syncs: list = []
    monkeypatch.setattr(timing, "is_cuda", lambda device: getattr(device, "type", str(device)) == "cpu")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(str(device)))
    return syncs


def _meta_then_cpu():
    """A tiny model built on the ``meta`` device (where the trainer's model sits before it is
    placed), and the function that moves it to the CPU with real weights."""
    import torch

    from race.models.family import build_tiny_model

    real = build_tiny_model("tiny-xs", seed=0)
    with torch.device("meta"):
        lm = build_tiny_model("tiny-xs", seed=0)

    def move():
        lm.to_empty(device="cpu")
        lm.load_state_dict(real.state_dict())
        lm.tie_weights()
        lm.eval()

    return lm, move


def test_hooks_read_the_device_at_the_first_call_not_at_attach(monkeypatch):
    import torch

    from race.engines.trl.hooks import FlopTracker
    from race.engines.trl.rollouts import GenerationWatch

    syncs = _pretend_cpu_is_cuda(monkeypatch)
    lm, move = _meta_then_cpu()
    tracker = FlopTracker()
    tracker.attach(lm)  # on meta: a device read now would never synchronize
    watch = GenerationWatch(tracker, lora=False, bypass=False, device=lambda: next(lm.parameters()).device)
    move()
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        lm(input_ids=ids)
    assert syncs == ["cpu", "cpu"]  # before and after the call, on the device it ran on
    (call,) = tracker.drain()
    assert call.phase == "old_logprobs" and call.seconds > 0
    syncs.clear()
    watch._run(lambda: lm.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0),
               lambda out: [[5, 6, 7, 8]], lambda out: [[1, 2, 3]])
    calls = tracker.drain()
    assert [c.component for c in calls] == ["prefill", "decode", "decode"]
    # the watch (2), generate (2) and each of the 3 calls (2) synchronized the moved model's device
    assert syncs == ["cpu"] * 10


def test_sync_switch_keeps_the_flops_and_drops_the_per_call_synchronizes(monkeypatch):
    import torch

    from race.accounting.trl_step import calls_components
    from race.engines.trl.hooks import FlopTracker
    from race.models.family import build_tiny_model
    from race.models.refs import model_shape

    syncs = _pretend_cpu_is_cuda(monkeypatch)
    lm = build_tiny_model("tiny-xs", seed=0).eval()
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    comps, counts = [], []
    for sync in (True, False):
        tracker = FlopTracker(sync=sync)
        tracker.attach(lm)
        syncs.clear()
        lm.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
        lm(input_ids=ids).logits.sum().backward()
        calls = tracker.drain()
        tracker.detach()
        comps.append(calls_components(PolicyCost(model_shape(lm)), calls))
        counts.append((len(syncs), len(calls), [c.seconds for c in calls]))
    assert comps[0] == comps[1] and comps[0]["update/forward"] > 0 and comps[0]["rollout/decode"] > 0
    (on, n_calls, _), (off, _, seconds) = counts
    assert on == 2 + 2 * n_calls and n_calls == 5  # generate's two, and two per call (prefill, 3 decode, update)
    assert off == 2 and seconds == [0.0] * n_calls  # only the whole generation is timed


def test_compiled_model_keeps_the_ledger_and_breaks_only_at_the_lm_boundary():
    """``torch.compile`` (the eager backend, CPU) over a module that calls the hooked LM, as a
    compiled PEFT model does: the same calls as eager, and dynamo never traces the ledger's
    clock (its only graph breaks are the two disabled hooks at the LM's entry and exit)."""
    import warnings

    import torch
    from torch._dynamo.utils import counters

    from race.accounting.trl_step import calls_components
    from race.engines.trl.hooks import FlopTracker
    from race.models.family import build_tiny_model
    from race.models.refs import model_shape

    lm = build_tiny_model("tiny-xs", seed=0)

    class Outer(torch.nn.Module):
        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def forward(self, input_ids):
            return self.lm(input_ids=input_ids).logits

    outer = Outer(lm)
    tracker = FlopTracker()
    tracker.attach(lm)
    ids = torch.randint(3, 20, (2, 7), generator=torch.Generator().manual_seed(0))

    def run(f):
        with torch.no_grad():
            f(ids)
        f(ids).sum().backward()
        return calls_components(PolicyCost(model_shape(lm)), tracker.drain())

    eager = run(outer)
    torch._dynamo.reset()
    counters.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = run(torch.compile(outer, backend="eager"))
    assert compiled == eager and set(eager) >= {"old_logprobs/forward", "update/forward", "update/backward"}
    reasons = list(counters["graph_break"])
    assert reasons and all("torch.compiler.disable" in r for r in reasons), reasons
    torch._dynamo.reset()


def test_micro_steps_come_from_callback_events(tiny_model_dir, tmp_path):
    """gradient_accumulation_steps=2: the callback counts TRL's training_step calls from
    on_substep_end/on_step_end, equal to TRL's private counter, and bounds from it."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from race.engines.trl.internals import micro_step
    from race.engines.trl_callback import add_race_accounting
    from race.models import load_policy

    model, tok = load_policy(str(tiny_model_dir), device="cpu", attn_implementation="eager")
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, per_device_train_batch_size=4,
                      gradient_accumulation_steps=2, steps_per_generation=1, num_iterations=2, num_generations=4,
                      max_completion_length=3, max_steps=3, report_to="none", disable_tqdm=True, save_strategy="no",
                      activation_checkpointing=False, seed=0)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **k: [float(len(c)) for c in completions],
                          args=args, train_dataset=Dataset.from_dict({"prompt": ["Q:1+2\nA:"] * 16}),
                          processing_class=tok)
    cb = add_race_accounting(trainer, budget_flops=1e13)
    seen = []
    original = cb.on_step_end

    def spy(args, state, control, **kw):
        original(args, state, control, **kw)
        seen.append((cb.micro_steps, micro_step(trainer)))

    cb.on_step_end = spy
    trainer.train()
    assert seen == [(2, 2), (4, 4), (6, 6)]
    # generation every steps_per_generation x num_iterations = 2 micro-steps: one per optimizer step
    assert len(cb.tracker.generations) == 3
    assert cb.next_step_bound(trainer.state) == cb.step_bound(6, buffered=True)


@pytest.mark.parametrize("impl", ["no_reentrant", "reentrant"])
def test_fsdp_checkpoint_wrapper_is_seen_as_checkpointing(impl):
    """accelerate's FSDP ``activation_checkpointing`` wraps each decoder layer in torch's
    ``CheckpointWrapper`` (no HF ``gradient_checkpointing`` flag): the recompute is recorded,
    and the ledger's update + recompute equal FlopCounterMode's count of the same
    forward+backward (``torch`` conventions)."""
    import functools

    import torch
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    from race.accounting.trl_step import calls_components
    from race.engines.trl.hooks import FlopTracker, _decoder_layers
    from race.measure import Counter
    from race.models.family import build_tiny_model
    from race.models.refs import model_shape

    lm = build_tiny_model("tiny-xs", seed=0)
    lm.config._attn_implementation = "eager"
    kind = CheckpointImpl.NO_REENTRANT if impl == "no_reentrant" else CheckpointImpl.REENTRANT
    layer_type = type(_decoder_layers(lm)[0])
    apply_activation_checkpointing(lm, checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=kind),
                                   check_fn=lambda m: isinstance(m, layer_type))
    assert type(_decoder_layers(lm)[0]).__name__ == "CheckpointWrapper"
    lm.train()
    tracker = FlopTracker()
    tracker.attach(lm)
    ids = torch.randint(3, 20, (2, 9), generator=torch.Generator().manual_seed(0))
    with Counter() as c:
        lm(input_ids=ids, use_cache=False).logits.float().sum().backward()
    (call,) = tracker.drain()
    n_layers = len(_decoder_layers(lm))
    assert call.recompute == ("early_stop" if impl == "no_reentrant" else "full")
    assert call.recompute_layers == n_layers
    comps = calls_components(PolicyCost(model_shape(lm), None, "torch"), [call])
    assert comps["recompute/forward"] > 0
    assert sum(comps.values()) == c.total


def test_torch_compile_run_keeps_the_ledger_and_drops_the_per_call_sync(tiny_model_dir, tmp_path):
    """``torch_compile=True`` (the eager backend on CPU): TRL trains the compiled model, the
    ledger is the eager run's record for record, and the per-call synchronize is off by
    default (``sync_calls=None``); ``sync_calls=True`` turns it back on."""
    import warnings

    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from race.engines.trl_callback import add_race_accounting
    from race.models import load_policy

    def run(compiled: bool, **kw):
        torch.manual_seed(0)
        torch._dynamo.reset()
        model, tok = load_policy(str(tiny_model_dir), device="cpu", attn_implementation="eager")
        args = GRPOConfig(output_dir=str(tmp_path / str(compiled)), use_cpu=True, bf16=False,
                          per_device_train_batch_size=4, num_generations=4, max_completion_length=4, max_steps=2,
                          report_to="none", disable_tqdm=True, save_strategy="no", activation_checkpointing=False,
                          seed=0, **({"torch_compile": True, "torch_compile_backend": "eager"} if compiled else {}))
        trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **k: [float(len(c)) for c in completions],
                              args=args, train_dataset=Dataset.from_dict({"prompt": ["Q:1+2\nA:", "Q:12+30-4\nA:"] * 4}),
                              processing_class=tok)
        cb = add_race_accounting(trainer, budget_flops=1e13, **kw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.train()
        return trainer, cb, {(r.step, r.key): r.flops for r in cb.ledger}

    eager_trainer, eager_cb, eager = run(False)
    trainer, cb, compiled = run(True)
    assert type(trainer.model_wrapped).__name__ == "OptimizedModule" != type(eager_trainer.model_wrapped).__name__
    assert eager_cb.tracker.sync and not cb.tracker.sync
    assert compiled == eager and eager[(1, "update/forward")] > 0
    _, forced, _ = run(True, sync_calls=True)
    assert forced.tracker.sync
    torch._dynamo.reset()
