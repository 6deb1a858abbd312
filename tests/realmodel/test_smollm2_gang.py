"""A gang of SmolLM2-135M-Instruct members (GQA, tied embeddings, chat-template prompts,
LoRA) writes each member's solo run: ``tests/engines/test_gang_engine.py``'s check on
the real checkpoint, in float32 and with a bfloat16 base under float32 adapters.

The members differ in seed, group size and ``beta`` (member 1 runs the reference pass,
the base with its adapter off); 2 steps of 2 prompts, 4 completion tokens, the
random-reward control (rewards independent of the text) and a 2-problem greedy
evaluation keep the file under a minute on one thread.

float32: the gang executes each member's solo ops (test_gang_forward's module docstring),
so what the tiny-model gang test holds holds here: the same rollout tokens, ledgers equal
row for row (seconds aside), metrics equal with the loss statistics to float32 rounding
(``LOSS_KEYS``), and every optimizer step's gradients within 1e-4 of their norm (the
bound test_gang_forward holds the batched pass to).

bfloat16: exact token equality is impossible. A bfloat16 base is never folded (the
adapters run live, solo and in the gang: ``fast_decode.fold_keeps_update``), so step 1's
rollout matches the solo one; but the gang's batched learning passes accumulate in another
order than the solo passes, their bfloat16 activations round differently, so the members'
gradients and adapters differ slightly after step 1 and step 2's sampled tokens can differ,
and from there the members' batches. What does not depend on the tokens is still
compared exactly: the ledger is integer arithmetic on shapes (prompt widths, the kept
groups: random rewards, decoded counts) provided every completion has the same length,
which the test asserts (no training or evaluation completion ends before
``max_completion_length`` in either run: SmolLM2 does not finish an answer in 4 tokens,
where tests/engines/test_precision.py uses a never-EOS model); the rewards,
advantages' groups, kept rows and lr; and, with one pass and one optimizer step a batch
(ratio exactly 1), the surrogate part of the loss (``loss - beta * kl`` = minus the masked
mean advantage). The KL itself, the verifier's verdicts and the evaluation scores depend
on the sampled text and are not compared.
"""

from __future__ import annotations

import math

import pytest

pytestmark = [pytest.mark.realmodel, pytest.mark.slow]
BETA = 0.04
#: metrics keys that depend on the sampled text (bfloat16: not compared, module docstring)
TEXT_KEYS = {"kl", "loss", "verified_mean", "score", "per_problem"}
#: ``loss - beta * kl`` of a bfloat16 member, gang against solo: both are the float32 mean
#: of N <= 24 per-token terms -adv + beta * kl_t (|adv| <= 2/sqrt(3) for G <= 3, unbiased
#: group std; beta * kl_t < 0.05 for kl_t < 1), a float32 sum with error at most
#: (N - 1) 2^-24 sum|x| before dividing by N: at most 2^-24 x 24 x 1.2 = 1.7e-6 apart.
#: The term this leaves out, beta * kl, is 1e-5 to 5e-5 here (dropping it fails the check).
SURROGATE_TOL = 2e-6


@pytest.fixture(scope="module")
def helpers(load_script):
    """``tests/engines/test_gang_engine.py`` (its comparison helpers) and
    ``tests/realmodel/test_smollm2_engines.py`` (its real-model config)."""
    return load_script("tests/engines/test_gang_engine.py"), load_script("tests/realmodel/test_smollm2_engines.py")


def _members(smollm2_dir, cfg, dtype: str):
    over = dict(dtype=dtype, max_steps=2, reward="random", conventions="race")
    return [cfg(smollm2_dir, **over), cfg(smollm2_dir, seed=1, num_generations=3, beta=BETA, **over)]


def _run(members, tmp_path, monkeypatch):
    """The gang, then each member alone; returns per member (gang, solo) of its run.json,
    its rollouts' completion tokens and its optimizer steps' gradients, in order."""
    import torch

    from race.engines import run_engine
    from race.engines.builtin.step_parts import StepStages
    from race.engines.gang import run_gang

    seen: dict[str, dict[str, list]] = {}
    charge, step = StepStages.rollout_charge, StepStages.optimizer_step

    def rollout_charge(self, ro):
        seen.setdefault(self.cfg.run_id(), {"tokens": [], "grads": []})["tokens"].append(ro.completion_ids.clone())
        return charge(self, ro)

    def optimizer_step(self):
        grads = {n: p.grad.clone() for n, p in self.state.model.named_parameters() if p.grad is not None}
        seen.setdefault(self.cfg.run_id(), {"tokens": [], "grads": []})["grads"].append(grads)
        return step(self)

    monkeypatch.setattr(StepStages, "rollout_charge", rollout_charge)
    monkeypatch.setattr(StepStages, "optimizer_step", optimizer_step)
    outs = run_gang([(c, tmp_path / f"g{i}") for i, c in enumerate(members)], tmp_path / "gang")
    gang, seen = seen, {}
    solos = [run_engine(c, tmp_path / f"s{i}") for i, c in enumerate(members)]
    assert torch.get_num_threads() == 1  # the configs' torch_threads: the timings of the module docstring
    return [(outs[i], solos[i], gang[c.run_id()], seen[c.run_id()]) for i, c in enumerate(members)]


def _grad_close(a: dict, b: dict) -> bool:
    """Gradients within 1e-4 of their norm (test_gang_forward's bound), parameter by parameter."""
    return a.keys() == b.keys() and len(a) > 0 and all(
        float((a[n] - b[n]).norm()) <= 1e-4 * float(b[n].norm()) + 1e-7 for n in a)


def test_a_float32_gang_writes_its_members_solo_runs(smollm2_dir, helpers, tmp_path, monkeypatch):
    """Per member: the solo run's rollout tokens, ledger row for row, metrics (loss
    statistics to float32 rounding), gradients (to 1e-4 of their norm) and run.json (the
    gang's composition added)."""
    import torch

    gt, eng = helpers
    members = _members(smollm2_dir, eng._cfg, "float32")
    for i, (out, solo, g, s) in enumerate(_run(members, tmp_path, monkeypatch)):
        gdir, sdir = tmp_path / f"g{i}", tmp_path / f"s{i}"
        assert len(g["tokens"]) == len(s["tokens"]) == 2, i
        assert all(torch.equal(a, b) for a, b in zip(g["tokens"], s["tokens"])), i
        assert gt._strip(gt._lines(gdir / "ledger.jsonl")) == gt._strip(gt._lines(sdir / "ledger.jsonl")), i
        gm, sm = gt._lines(gdir / "metrics.jsonl"), gt._lines(sdir / "metrics.jsonl")
        assert len(gm) == len(sm) and all(gt._close(a, b) for a, b in zip(gm, sm)), i
        assert len(g["grads"]) == len(s["grads"]) >= 1 and all(map(_grad_close, g["grads"], s["grads"])), i
        assert out.keys() - solo.keys() == {"gang"} and out["gang"]["index"] == i
        for k in ("steps", "total_flops", "phase_flops", "status", "stop_reason", "run_id", "initial", "final"):
            assert out[k] == solo[k], (i, k)
    train = [r for r in gt._lines(tmp_path / "g1" / "metrics.jsonl") if r["kind"] == "train"]
    assert train[-1]["kl"] > 0  # member 1's reference pass ran on a trained adapter


def test_a_bfloat16_gang_writes_its_members_solo_ledgers(smollm2_dir, helpers, tmp_path, monkeypatch):
    """A bfloat16 base under float32 adapters: per member, the solo run's ledger row for
    row and every metric that does not depend on the sampled text (module docstring), the
    base shared in bfloat16 and the adapters, their gradients and the saved adapter in
    float32."""
    import torch
    from safetensors import safe_open

    from race.engines.gang import GangEngine

    gt, eng = helpers
    members = _members(smollm2_dir, eng._cfg, "bfloat16")
    bases = []
    real_run = GangEngine.run

    def run(self):  # the members' models as the gang trained them
        out = real_run(self)
        bases.extend(e.model for e in self.engs)
        return out

    monkeypatch.setattr(GangEngine, "run", run)
    runs = _run(members, tmp_path, monkeypatch)
    frozen = [{n: p for n, p in m.named_parameters() if not p.requires_grad} for m in bases]
    assert {p.dtype for p in frozen[0].values()} == {torch.bfloat16}
    assert all(frozen[1][n] is p for n, p in frozen[0].items())  # one base in memory (share_base)
    assert {p.dtype for m in bases for p in m.parameters() if p.requires_grad} == {torch.float32}
    for i, (out, solo, g, s) in enumerate(runs):
        gdir, sdir = tmp_path / f"g{i}", tmp_path / f"s{i}"
        gm, sm = gt._lines(gdir / "metrics.jsonl"), gt._lines(sdir / "metrics.jsonl")
        gl, sl = gt._strip(gt._lines(gdir / "ledger.jsonl")), gt._strip(gt._lines(sdir / "ledger.jsonl"))
        # the precondition of comparing ledgers across different tokens: every completion at full length
        assert all(r["trunc_rate"] == 1.0 and r["completion_len"] == 4 for r in gm + sm if r["kind"] == "train"), i
        assert all(r["tokens"] == 2 * 4 for r in gl + sl if r["phase"] == "eval"), i  # 2 problems, greedy
        assert gl == sl, i
        assert len(gm) == len(sm), i
        for a, b in zip(gm, sm):
            assert a.keys() == b.keys() and {k: v for k, v in a.items() if k not in TEXT_KEYS} == \
                {k: v for k, v in b.items() if k not in TEXT_KEYS}, (i, a, b)
            if "loss" in a:  # ratio 1: loss = beta * kl - the masked mean advantage (SURROGATE_TOL)
                beta = BETA if i == 1 else 0.0
                assert a["clip_frac"] == b["clip_frac"] == 0.0 and (beta or a["kl"] == b["kl"] == 0.0)
                assert math.isclose(a["loss"] - beta * a["kl"], b["loss"] - beta * b["kl"], abs_tol=SURROGATE_TOL), \
                    (i, a, b)
                if beta and a["step"] > 1:  # the reference pass ran, on a trained adapter
                    assert a["kl"] > 0 and b["kl"] > 0, (i, a, b)
        assert all(v.dtype == torch.float32 for grads in g["grads"] for v in grads.values())
        assert len(g["grads"]) == len(s["grads"]) >= 1, i
        with safe_open(str(gdir / "adapter" / "adapter_model.safetensors"), "pt") as f:
            assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float32}
        for k in ("steps", "total_flops", "phase_flops", "status", "stop_reason", "run_id"):
            assert out[k] == solo[k], (i, k)
