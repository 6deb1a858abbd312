"""`race base build` through Typer's CliRunner (with a tiny recipe swapped in)."""

from __future__ import annotations

from typer.testing import CliRunner

from race.cli.base import app


def test_build_prints_table_then_reuses(tmp_path, monkeypatch):
    import race.models.base_recipes as ws

    monkeypatch.setattr(ws, "DEFAULT_RECIPE", ws.SFTRecipe(steps=2, batch_size=4, warmup_steps=1,
                                                         n_eval_test=2, n_eval_hard=2))
    runner = CliRunner()
    args = ["build", "--sizes", "tiny-xs", "--cache-dir", str(tmp_path)]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "tiny-xs" in first.output and "92,976" in first.output and "built" in first.output
    second = runner.invoke(app, args)
    assert second.exit_code == 0 and "cached" in second.output


def test_unknown_size_is_rejected(tmp_path):
    result = CliRunner().invoke(app, ["build", "--sizes", "tiny-xs,huge", "--cache-dir", str(tmp_path)])
    assert result.exit_code != 0
    assert "huge" in result.output
