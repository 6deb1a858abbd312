"""The evaluator: every target in one decode loop per batch, scores per target as if each
ran alone (greedy rows), and evaluation FLOPs equal to what FlopCounterMode measures."""

from __future__ import annotations

from race.accounting import PolicyCost, LoRA, ModelShape
from race.spec.run import EvalSettings, LoraSettings
from race.tasks import ArithTask


def _evaluator(tok, model, settings, batch_size=256):
    from race.engines.common import _verify_fn
    from race.engines.evaluation import Evaluator

    shape = ModelShape.from_hf_config(model.get_base_model().config.to_dict())
    return Evaluator(ArithTask(), settings, tokenizer=tok, max_new_tokens=24, temperature=1.0,
                     policy=PolicyCost(shape, LoRA(4), "torch"), device="cpu", verify=_verify_fn(), batch_size=batch_size)


def _policy():
    from race.models import build_tiny_model, wrap_lora

    return wrap_lora(build_tiny_model("tiny-xs", seed=0), LoraSettings(r=4, lora_alpha=8))


def test_one_loop_scores_match_each_target_alone_and_flops_are_measured(char_tokenizer):
    from torch.utils.flop_counter import FlopCounterMode

    model = _policy()
    both = EvalSettings(n_problems=12, n_pass_problems=5, pass_k=3, n_hard_problems=6)
    ev = _evaluator(char_tokenizer, model, both)
    with FlopCounterMode(display=False) as fc:
        res = ev.evaluate(model)
    assert res.flops == fc.get_total_flops() > 0
    rows = {r["target"]: r for r in res.rows}
    assert [r["target"] for r in res.rows] == ["greedy", "pass@k", "hard"]
    assert (rows["greedy"]["n"], rows["pass@k"]["n"], rows["hard"]["n"]) == (12, 5, 6)
    assert 0 <= rows["pass@k"]["pass1"] <= rows["pass@k"]["score"] <= 1
    alone = _evaluator(char_tokenizer, model, EvalSettings(n_problems=12, targets=["greedy"])).evaluate(model)
    assert alone.rows[0]["per_problem"] == rows["greedy"]["per_problem"]
    again = _evaluator(char_tokenizer, model, both).evaluate(model)
    assert again.rows == res.rows and again.flops == res.flops  # deterministic
    # batches smaller than the row count: several loops, the same greedy answers
    small = _evaluator(char_tokenizer, model, both, batch_size=7).evaluate(model)
    assert [r["per_problem"] for r in small.rows if r["target"] != "pass@k"] == \
        [rows["greedy"]["per_problem"], rows["hard"]["per_problem"]]
    assert model.training  # evaluation restores the mode



def test_pass_at_1_is_the_mean_accuracy_of_the_pass_at_k_samples(char_tokenizer):
    from race.engines.evaluation import Evaluator

    model = _policy()
    k = 4
    settings = EvalSettings(n_pass_problems=9, pass_k=k, targets=["pass@k", "pass@1"])
    shape = ModelShape.from_hf_config(model.get_base_model().config.to_dict())
    # an untrained model solves nothing: a verifier that accepts completions holding a "1"
    # gives the samples of one problem different outcomes
    ev = Evaluator(ArithTask(), settings, tokenizer=char_tokenizer, max_new_tokens=16, temperature=1.0,
                   policy=PolicyCost(shape, LoRA(4), "torch"), device="cpu", verify=lambda p, text: "1" in text)
    rows = {r["target"]: r for r in ev.evaluate(model).rows}
    assert list(rows) == ["pass@k", "pass@1"]
    per1 = rows["pass@1"]["per_problem"]
    assert len(per1) == 9 and all(abs(v * k - round(v * k)) < 1e-9 for v in per1)
    assert any(0 < v < 1 for v in per1)  # the test can tell a fraction from a 0/1 score
    assert rows["pass@1"]["score"] == sum(per1) / 9 == rows["pass@k"]["pass1"]
    assert rows["pass@k"]["per_problem"] == [1 if v > 0 else 0 for v in per1]
    only1 = Evaluator(ArithTask(), EvalSettings(n_pass_problems=9, pass_k=k, targets=["pass@1"]),
                      tokenizer=char_tokenizer, max_new_tokens=16, temperature=1.0,
                      policy=PolicyCost(shape, LoRA(4), "torch"), device="cpu", verify=lambda p, text: "1" in text)
    assert [r["target"] for r in only1.evaluate(model).rows] == ["pass@1"]
