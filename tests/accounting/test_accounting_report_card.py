"""The compute report card: its data and JSON (race.accounting), its Markdown and LaTeX
renderings and files (race.cards); the split sums to the total."""

from __future__ import annotations

import json

from race.accounting import FlopLedger, ReportCard
from race.cards import card_latex, card_markdown, fmt_flops, write_card


def _card(budget=2e12) -> ReportCard:
    led = FlopLedger(budget=budget)
    for step in range(2):
        led.add(step, "rollout", "prefill", 100_000_000_000, tokens=50, seconds=1.0)
        led.add(step, "rollout", "decode", 300_000_000_000, tokens=200, seconds=3.0)
        led.add(step, "update", "forward", 100_000_000_000)
        led.add(step, "update", "backward", 200_000_000_000)
        led.add(step, "reference", "forward", 50_000_000_000)
        led.add(step, "reward", "forward", 250_000_000_000)
        led.add(step, "recompute", "forward", 80_000_000_000)
    return ReportCard.from_ledger(led, conventions="torch", model="qwen2.5_0.5b", model_params=494_032_768,
                                  lora_rank=16, num_generations=8)


def test_split_sums_to_total():
    card = _card()
    assert card.total_flops == 2 * 1_000_000_000_000
    assert card.split == {"search": 800_000_000_000, "learning": 700_000_000_000, "feedback": 500_000_000_000}
    assert sum(card.split.values()) == card.total_flops
    assert sum(card.shares.values()) == 1.0
    assert card.hardware_flops == {"recompute": 160_000_000_000}
    assert card.steps == 2 and card.tokens == 500


def test_json():
    d = json.loads(_card().to_json())
    assert d["total_flops"] == 2_000_000_000_000
    assert sum(d["split"].values()) == d["total_flops"]
    assert d["shares"] == {"search": 0.4, "learning": 0.35, "feedback": 0.25}
    assert d["phase_flops"]["rollout"] == 800_000_000_000 and "recompute" not in d["phase_flops"]
    assert d["conventions"]["name"] == "torch" and d["conventions"]["attention"] == "full"
    assert "full-square attention" in d["conventions_text"]
    assert d["lora_rank"] == 16 and d["num_generations"] == 8 and d["budget_flops"] == 2e12
    assert d["seconds"] == {"rollout": 8.0, "update": 0.0, "reference": 0.0, "reward": 0.0, "recompute": 0.0}


def test_markdown():
    md = card_markdown(_card())
    assert md.startswith("# Compute report card")
    assert "| Total FLOPs (model, counted) | 2 TFLOP |" in md
    assert "| Budget | 2 TFLOP (100.0% used) |" in md
    assert "| search | 800 GFLOP (40.0%) |" in md
    assert "| learning | 700 GFLOP (35.0%) |" in md
    assert "| feedback | 500 GFLOP (25.0%) |" in md
    assert "| Not counted: recompute | 160 GFLOP |" in md
    assert "| Model | qwen2.5_0.5b (494,032,768 parameters) |" in md
    assert "| LoRA rank | 16 |" in md and "| Group size | 8 |" in md and "| Steps | 2 |" in md
    assert "conventions=torch" in md


def test_latex_escapes_and_keeps_the_conventions_out_of_the_l_column():
    tex = card_latex(_card())
    assert tex.startswith("% RACE compute report card")
    assert "\\begin{tabular}{@{}lp{0.55\\linewidth}@{}}" in tex and tex.rstrip().endswith("\\end{tabular}")
    assert "qwen2.5\\_0.5b" in tex
    assert "40.0\\%" in tex
    assert "search & 800 GFLOP (40.0\\%) \\\\" in tex
    assert "Total FLOPs (model, counted)$^\\dagger$ & 2 TFLOP \\\\" in tex
    rows = [ln for ln in tex.splitlines() if ln.endswith("\\\\") and not ln.startswith("\\multicolumn")]
    assert all(len(ln.split(" & ")[0]) <= 40 for ln in rows)  # the l column holds short labels only
    assert not any("conventions=" in ln for ln in rows)
    note = [ln for ln in tex.splitlines() if ln.startswith("\\multicolumn")]
    assert len(note) == 1 and note[0].startswith("\\multicolumn{2}{@{}p{\\linewidth}@{}}{\\footnotesize $^\\dagger$")
    assert "conventions=torch; matmul=2mnk; full-square attention" in note[0]


def test_latex_escape_every_special_character():
    from race.cards import latex_escape

    assert latex_escape("a_b|c%d&e#f$g{h}i^j~k\\l<m>") == (
        "a\\_b\\textbar{}c\\%d\\&e\\#f\\$g\\{h\\}i\\^{}j\\~{}k\\textbackslash{}l\\textless{}m\\textgreater{}")


def test_full_finetune_and_write(tmp_path):
    card = ReportCard(total_flops=10, phase_flops={"update": 10}, model="m")
    assert "| LoRA rank | full fine-tuning |" in card_markdown(card)
    write_card(card, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "report_card.json").read_text())["split"]["learning"] == 10
    assert (tmp_path / "out" / "report_card.md").read_text() == card_markdown(card)
    assert (tmp_path / "out" / "report_card.tex").read_text() == card_latex(card)


def test_fmt_flops():
    assert fmt_flops(1.23e15) == "1.23 PFLOP"
    assert fmt_flops(4.56e18) == "4.56 EFLOP"
    assert fmt_flops(999) == "999 FLOP"
    assert fmt_flops(2.5e6) == "2.5 MFLOP"


def _rm_card(count: bool) -> ReportCard:
    card = _card()
    card.rm_training_flops = {"prm-m": 400_000_000_000, "prm-s": 100_000_000_000}
    card.count_rm_training = count
    return card


def test_rm_training_is_a_separate_line_not_counted_by_default():
    card = _rm_card(False)
    assert card.rm_training_total == 500_000_000_000
    assert card.counted_flops == card.total_flops == 2_000_000_000_000
    assert card.shares == {"search": 0.4, "learning": 0.35, "feedback": 0.25}
    md = card_markdown(card)
    assert "| Total FLOPs (model, counted) | 2 TFLOP |" in md
    assert "| Budget | 2 TFLOP (100.0% used) |" in md
    assert ("| RM training (not counted) | 500 GFLOP (prm-m 400 GFLOP, prm-s 100 GFLOP; separate: not in the "
            "total, the split or the budget) |") in md
    d = json.loads(card.to_json())
    assert d["rm_training_flops"] == {"prm-m": 400_000_000_000, "prm-s": 100_000_000_000}
    assert d["count_rm_training"] is False and d["rm_training_total"] == 500_000_000_000
    assert d["counted_flops"] == d["total_flops"] == 2_000_000_000_000 and "rm_training" not in d["shares"]
    tex = card_latex(card)
    assert "RM training (not counted) & 500 GFLOP (prm-m 400 GFLOP" in tex


def test_rm_training_counted_when_asked():
    card = _rm_card(True)
    assert card.total_flops == 2_000_000_000_000  # the runs' own total is unchanged
    assert card.counted_flops == 2_500_000_000_000
    # shares of the counted total: 800/2500, 700/2500, 500/2500 and the RM training 500/2500
    assert card.shares == {"search": 0.32, "learning": 0.28, "feedback": 0.2, "rm_training": 0.2}
    assert abs(sum(card.shares.values()) - 1.0) < 1e-12
    md = card_markdown(card)
    assert "| Total FLOPs (model, counted) | 2.5 TFLOP (runs 2 TFLOP + RM training 500 GFLOP) |" in md
    assert "| Budget | 2 TFLOP (125.0% used) |" in md
    assert "| search | 800 GFLOP (32.0%) |" in md
    assert "| RM training (counted) | 500 GFLOP (20.0%; prm-m 400 GFLOP, prm-s 100 GFLOP; counted as asked" in md
    d = json.loads(card.to_json())
    assert d["count_rm_training"] is True and d["counted_flops"] == 2_500_000_000_000
    assert d["shares"]["rm_training"] == 0.2
    rows = [ln for ln in card_latex(card).splitlines() if ln.endswith("\\\\") and not ln.startswith("\\multicolumn")]
    assert all(len(ln.split(" & ")[0]) <= 40 for ln in rows)


def test_no_rm_line_without_reward_models():
    md = card_markdown(_card())
    assert "RM training" not in md
    assert json.loads(_card().to_json())["rm_training_total"] == 0
