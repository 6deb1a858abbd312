"""The evaluator: every target in one decode loop per batch, scores per target as if each
ran alone (greedy rows), and evaluation FLOPs equal to what FlopCounterMode measures."""

from __future__ import annotations

from race.accounting import LoRA, ModelShape
from race.spec.run import EvalSettings, LoraSettings
from race.tasks import ArithTask


def _evaluator(tok, model, settings, batch_size=256):
    from race.engines.common import _verify_fn
    from race.engines.evaluation import Evaluator

    shape = ModelShape.from_hf_config(model.get_base_model().config.to_dict())
    return Evaluator(ArithTask(), settings, tokenizer=tok, max_new_tokens=24, temperature=1.0, shape=shape,
                     lora=LoRA(4), conventions="torch", device="cpu", verify=_verify_fn(), batch_size=batch_size)


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

