"""The base model's dtype (``dtype: bfloat16 | float16 | float32``) with LoRA adapters and
their optimizer state in float32, through the built-in engine (fast decoder and fast
forward), the gang and the TRL engine; on CPU.

FLOPs do not depend on the dtype, but the rollout's path does: a float32 rollout merges
LoRA into the weights where that costs fewer FLOPs, a bfloat16/float16 one never does (the
merge would round a small update away; the rollout runs the adapters live, as the
learning passes do, and the ledger charges that). So a bfloat16 run's ledger is, row for
row (seconds aside), the ledger of the float32 run made to decode without merging
(:func:`_no_merge`). For the ledgers to be comparable both runs must generate completions
of the same lengths, which sampling in two precisions does not promise; so these runs use
a random tiny model that can never emit EOS (every completion runs to
``max_completion_length``) and the random-reward control (rewards independent of the
text): whatever tokens the two precisions sample, every matmul has the same shape.

Then: the rollout samples the policy the learning passes train, on a bfloat16 base, solo
and in the gang (the section at the end)."""

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


def _no_merge(monkeypatch) -> None:
    """Make float32 rollouts decode as half-precision ones do: no LoRA merge (the rule's
    dtype test says no to every dtype), the solo rollout, evaluation and the gang alike."""
    from race.engines.kernels import fast_decode

    monkeypatch.setattr(fast_decode, "_holds_fold", lambda dtype: False)


def _merges(run: Path) -> bool:
    return any(r["component"] == "merge" for r in _ledger(run))


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
def test_a_bfloat16_base_gives_the_unmerged_float32_ledger(never_eos_dir, tmp_path, engine, monkeypatch):
    """Same config and seed in bfloat16 and in float32 decoding without a merge: the same
    ledger row for row (the bfloat16 run charges no merge: its rollouts and evaluations run
    the adapters live; the TRL engine's evaluations are RACE's), both runs complete at the
    budget, and the bfloat16 run's adapter is saved in float32 (PEFT's
    autocast_adapter_dtype; AdamW's state follows its parameters' dtype)."""
    from race.engines import run_engine

    extra = {"drop_zero_variance_groups": False} if engine == "trl" else {}
    b16 = run_engine(_cfg(never_eos_dir, engine=engine, dtype="bfloat16", **extra), tmp_path / "bfloat16")
    _no_merge(monkeypatch)
    f32 = run_engine(_cfg(never_eos_dir, engine=engine, dtype="float32", **extra), tmp_path / "float32")
    assert all(o["status"] == "complete" and o["stop_reason"] == "budget" for o in (b16, f32))
    assert b16["steps"] == f32["steps"] >= 2
    assert _ledger(tmp_path / "bfloat16") == _ledger(tmp_path / "float32")
    assert not _merges(tmp_path / "bfloat16")
    assert _adapter_dtypes(tmp_path / "bfloat16") == {"torch.float32"}


def test_a_gang_on_a_bfloat16_base_gives_its_members_unmerged_float32_ledgers(never_eos_dir, tmp_path, monkeypatch):
    """The gang's batched multi-LoRA forward mixes a bf16 base with fp32 adapters as PEFT
    does (it refused before: 'expected m1 and m2 to have the same dtype'). On the bf16 base
    the gang's rollout runs the members' adapters live (no merged, stacked decode), each
    member's rows its solo rollout: what it executed is what its ledger charges."""
    from race.engines.gang import run_gang

    def members(dt):
        return [_cfg(never_eos_dir, dtype=dt), _cfg(never_eos_dir, dtype=dt, seed=4, num_generations=2,
                                                       budget_flops=2e9)]

    outs = {}
    for dt in ("bfloat16", "float32"):
        if dt == "float32":
            _no_merge(monkeypatch)
        outs[dt] = run_gang([(c, tmp_path / f"{dt}-{i}") for i, c in enumerate(members(dt))], tmp_path / f"gang-{dt}")
        assert [o["status"] for o in outs[dt]] == ["complete", "complete"]
    for i, out in enumerate(outs["bfloat16"]):
        rows = _ledger(tmp_path / f"bfloat16-{i}")
        assert rows == _ledger(tmp_path / f"float32-{i}")
        assert not _merges(tmp_path / f"bfloat16-{i}")
        assert out["gang"]["rollout_flops_executed"] == sum(r["flops"] for r in rows if r["phase"] == "rollout") > 0
        assert _adapter_dtypes(tmp_path / f"bfloat16-{i}") == {"torch.float32"}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_full_fine_tuning_in_half_precision_is_refused(dtype):
    """Without an adapter the trained weights and AdamW's state would be the base's half
    dtype (updates below its resolution lost): the config says what to change."""
    with pytest.raises(ConfigError, match=f"dtype={dtype} with lora: null"):
        run_config_from_dict(dict(model="tiny-s", budget_flops=1e9, lora=None, dtype=dtype))
    run_config_from_dict(dict(model="tiny-s", budget_flops=1e9, lora=None, dtype="float32"))


# -- the rollout samples the trained policy on a half-precision base ----------------------
# A LoRA update folded into bfloat16 weights is rounded to them: one Adam step at lr 1e-4
# moves B by ~1e-4, and the fold's deltas are below half a unit in the last place of most
# weights, so the folded policy is nearly the base while the learning passes run the
# adapter live in float32. The rollout must run the training forward's ops instead: its
# logits are then the training logits up to the rounding of activations alone.
#
# Tolerance, from the rounding of activations: ``act`` = the difference between the training
# logits of the bf16 model and of the same weights in float32 (the effect of rounding every
# activation to bf16), its mean over the logits compared and its largest. A rollout running
# the training forward's ops can differ from it only where a matmul over other rows sums in
# another order and flips an activation's bf16 rounding (on this CPU it never does: the
# logits are equal), rare enough to keep the mean difference under a quarter of act's mean,
# and every difference within act's largest. A fold perturbs every weight by the rounding
# of its delta and so every activation by about its own rounding: before the fix, the mean
# difference was 0.8-1.2x act's mean, solo and in the gang (the largest 0.9-1.2x act's).

STEP_B = 1e-4  # |B| after one Adam step at lr 1e-4 from PEFT's B = 0 (Adam's first step is ~lr * sign(grad))
PROMPTS = [["Q:12+5-3\nA:", "Q:1+2\nA:"], ["Q:40-13+2-7\nA:"], ["Q:3+3\nA:", "Q:9-1+4\nA:", "Q:7+7\nA:"]]


def _stepped_pair(seed: int):
    """(bf16 policy, fp32 twin): tiny-s loaded in bfloat16 and wrapped in a LoRA adapter
    (PEFT keeps it float32), its B one Adam step from zero (+-STEP_B, signs drawn from
    ``seed``); the twin holds the same (bf16-exact) base weights and adapter in float32."""
    import copy

    import torch

    from race.models import build_tiny_model, wrap_lora
    from race.spec.run import LoraSettings

    torch.manual_seed(seed)  # PEFT draws lora_A from the global RNG
    m = wrap_lora(build_tiny_model("tiny-s", seed=1).to(torch.bfloat16), LoraSettings(r=4, lora_alpha=8)).eval()
    g = torch.Generator().manual_seed(100 + seed)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "lora_B" in n:
                p.copy_(STEP_B * (torch.randint(0, 2, p.shape, generator=g) * 2 - 1))
    assert {p.dtype for p in m.parameters() if p.requires_grad} == {torch.float32}
    twin = copy.deepcopy(m)
    twin.get_base_model().to(torch.float32)
    return m, twin


def _training_logits(model, ro):
    """The built-in engine's learning-pass logits of ``ro`` (``shared_prompt_logits``, as
    float32): (rows, T, V), position t predicting completion token t."""
    import torch

    from race.engines.kernels.fast_forward import shared_prompt_logits

    g = ro.group
    seg = torch.arange(ro.n_prompts).repeat_interleave(g)
    with torch.no_grad():
        return shared_prompt_logits(model, ro.prompt_ids[::g], ro.prompt_mask[::g], ro.completion_ids,
                                    ro.completion_mask, seg).float()


def _check_against_training(seen: dict, models: list, twins: list, ros: list) -> None:
    """The logits the rollout sampled from (``seen[k][t]``: member k's (rows, V) at step t)
    against its training logits, over every completion position: the mean difference
    within a quarter of act's mean, the largest within act's largest (above)."""
    import torch

    errs, acts = [], []
    for k, (m, twin, ro) in enumerate(zip(models, twins, ros)):
        train, ref = _training_logits(m, ro), _training_logits(twin, ro)
        live = ro.completion_mask.bool()
        assert sorted(seen[k]) == list(range(ro.completion_len)), (k, sorted(seen[k]))
        rolled = torch.stack([seen[k][t] for t in range(ro.completion_len)], 1).float()
        errs.append((rolled - train)[live].abs())
        acts.append((train - ref)[live].abs())
    err, act = torch.cat(errs), torch.cat(acts)
    assert not err.isnan().any()  # every live position was sampled from recorded logits
    assert act.max() > 0  # bf16 rounding of the activations is visible
    assert err.mean() <= act.mean() / 4 and err.max() <= act.max(), (
        float(err.mean()), float(act.mean()), float(err.max()), float(act.max()))


def test_a_half_precision_base_is_never_merged(char_tokenizer):
    """The merge rule: float32 merges where it pays; bfloat16/float16 never (the default
    decodes with live adapters, an explicit merge is refused); the rollout's charge follows
    (no ``merge``, the LoRA term in prefill and decode)."""
    import torch

    from race.accounting import LoRA, ModelShape, PolicyCost
    from race.engines.kernels.fast_decode import FastDecoder, fold_keeps_update
    from race.engines.sampling import encode_prompts, rollout_flops, sample
    from race.models import build_tiny_model, wrap_lora
    from race.spec.run import LoraSettings

    ids, mask = encode_prompts(char_tokenizer, PROMPTS[0], "cpu")
    kw = dict(group=4, max_new_tokens=16, eos_id=char_tokenizer.eos_token_id, pad_id=char_tokenizer.pad_token_id,
              greedy=True)
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        m = wrap_lora(build_tiny_model("tiny-xs", seed=1).to(dt), LoraSettings(r=4, lora_alpha=8))
        dec = FastDecoder(m)
        assert dec.merge_pays(10 ** 6)  # merging would pay at any of these lengths
        half = dt != torch.float32
        assert fold_keeps_update(m) == dec.merge_keeps_update() == dec.should_merge(10 ** 6) == (not half)
        ro = sample(m, ids, mask, **kw)
        assert ro.merged == (not half)
        charge = rollout_flops(PolicyCost(ModelShape.from_hf_config(m.get_base_model().config.to_dict()), LoRA(4)), ro)
        assert ("merge" in charge) == (not half)
        if half:
            with pytest.raises(ValueError, match="rounds the adapters' update away"):
                dec.merge_lora()
            with pytest.raises(ValueError, match="rounds the adapters' update away"):
                sample(m, ids, mask, merge_lora=True, **kw)
    assert fold_keeps_update(build_tiny_model("tiny-xs", seed=1).to(torch.bfloat16))  # no adapter: nothing to fold


def test_the_rollout_samples_the_trained_policy_on_a_bfloat16_base(char_tokenizer, monkeypatch):
    """Solo: the logits the rollout samples from, at every step, are the learning passes'
    logits within the rounding of activations (above); FlopCounterMode counts what the
    ledger charges."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from race.accounting import LoRA, ModelShape, PolicyCost
    from race.engines.kernels.fast_decode import FastDecoder
    from race.engines.sampling import encode_prompts, rollout_flops, sample

    m, twin = _stepped_pair(0)
    ids, mask = encode_prompts(char_tokenizer, PROMPTS[2], "cpu")
    G = 2
    seen: dict[int, torch.Tensor] = {}
    forward = FastDecoder._forward

    def record(self, *a):
        out = forward(self, *a)
        seen[len(seen)] = out.repeat_interleave(G, 0) if not seen else out  # the prefill: one row per prompt
        return out

    monkeypatch.setattr(FastDecoder, "_forward", record)
    with FlopCounterMode(display=False) as fc:  # drop_finished off: every step's rows are every row
        ro = sample(m, ids, mask, group=G, max_new_tokens=6, eos_id=char_tokenizer.eos_token_id,
                    pad_id=char_tokenizer.pad_token_id, generator=torch.Generator().manual_seed(3),
                    drop_finished=False)
    _check_against_training({0: seen}, [m], [twin], [ro])
    assert not ro.merged
    shape = ModelShape.from_hf_config(m.get_base_model().config.to_dict())
    assert fc.get_total_flops() == sum(rollout_flops(PolicyCost(shape, LoRA(4), "torch"), ro).values())


def test_the_gang_rollout_samples_each_members_trained_policy_on_a_bfloat16_base(char_tokenizer, monkeypatch):
    """The gang's rollout (``gang_rollout``, as ``gang_step`` runs it) of three members over
    one bf16 base: the logits each member's rows sample from, at every step, are its
    learning passes' logits within the rounding of activations; it executes
    (FlopCounterMode) what the members are charged, their unmerged solo rollouts."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from race.accounting import LoRA, ModelShape, PolicyCost
    from race.engines.gang.sample import SampleJob, _Member
    from race.engines.gang.step import gang_rollout
    from race.engines.sampling import encode_prompts, rollout_flops

    pairs = [_stepped_pair(i) for i in range(3)]
    models, twins = [p[0] for p in pairs], [p[1] for p in pairs]
    jobs = []
    for i, prompts in enumerate(PROMPTS):
        ids, mask = encode_prompts(char_tokenizer, prompts, "cpu")
        jobs.append(SampleJob(i, ids, mask, 2, 1.0, torch.Generator().manual_seed(5 + i),
                              char_tokenizer.eos_token_id, char_tokenizer.pad_token_id))
    seen: dict[int, dict[int, torch.Tensor]] = {i: {} for i in range(3)}
    choose = _Member.choose

    def record(self, logits):  # the member's rows in its batch order: scatter them back to its rows
        full = torch.full((self.B, logits.shape[-1]), float("nan"))
        full[slice(None) if self.live is None else self.live] = logits.float()
        seen[self.job.member][self.t] = full
        return choose(self, logits)

    monkeypatch.setattr(_Member, "choose", record)
    with FlopCounterMode(display=False) as fc:
        ros, fast = gang_rollout(models, jobs, 6)
    assert fast is None and not any(ro.merged for ro in ros)
    _check_against_training(seen, models, twins, ros)
    shape = ModelShape.from_hf_config(models[0].get_base_model().config.to_dict())
    assert fc.get_total_flops() == sum(sum(rollout_flops(PolicyCost(shape, LoRA(4), "torch"), ro).values())
                                       for ro in ros)
