"""``race rm build`` through Typer's CliRunner (fast recipes from conftest)."""

from __future__ import annotations

from typer.testing import CliRunner

from race.cli.app import app


def test_build_prints_the_accuracy_table_and_reuses(tmp_path):
    runner = CliRunner(env={"COLUMNS": "220"})  # rich reads the width from COLUMNS
    args = ["rm", "build", "--names", "prm-xs,orm-xs", "--cache-dir", str(tmp_path), "--threads", "1"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    for word in ("prm-xs", "orm-xs", "step acc", "outcome acc", "train FLOPs", "built"):
        assert word in res.output
    assert len(list((tmp_path / "rm").iterdir())) == 2
    again = runner.invoke(app, ["rm", "build", "--names", "prm-xs", "--cache-dir", str(tmp_path)])
    assert again.exit_code == 0 and "cached" in again.output


def test_unknown_name_lists_the_known_ones():
    res = CliRunner().invoke(app, ["rm", "build", "--names", "prm-xl"])
    assert res.exit_code != 0
    assert "prm-xs" in res.output and "orm-s" in res.output


def test_eval_prints_the_held_out_quality_table(tmp_path):
    from race.builds import rm_training as training

    training.build_rm("prm-s", cache_dir=tmp_path)  # the fast likelihood recipe (conftest)
    res = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["rm", "eval", "--names", "prm-s", "--cache-dir",
                                                          str(tmp_path), "--threads", "1"])
    assert res.exit_code == 0, res.output
    for word in ("prm-s", "step AUC", "bad-step recall", "threshold", "FLOPs/token", "base SFT FLOPs", "held-out"):
        assert word in res.output, word
