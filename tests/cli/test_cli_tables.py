"""Tables at 80 columns: no name is cut to ``qwen2.5-…``, in a log (not a terminal) or on
an 80-column terminal."""

from __future__ import annotations

import re

from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

from race.cli.app import app
from race.cli.tables import column_widths, natural_width, print_table

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
PLAN = ["plan", "--budget", "1e18", "--models", "qwen2.5-0.5b,qwen2.5-1.5b,qwen2.5-7b", "--groups", "4,8",
        "--rewards", "rule,prm:qwen2.5-math-prm-7b"]
NAMES = ["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "prm:qwen2.5-math-prm-7b"]


def _lines(output: str) -> list[str]:
    return ANSI.sub("", output).splitlines()


def test_plan_in_a_log_at_80_columns_shows_every_name_whole():
    r = CliRunner(env={"COLUMNS": "80"}).invoke(app, PLAN)
    assert r.exit_code == 0, r.output
    assert "…" not in r.output
    rows = [ln for ln in _lines(r.output) if ln.startswith("│")]
    for name in NAMES:
        assert any(f" {name} " in ln for ln in rows), name
    # a log is not a terminal: the table keeps its natural width, one line per allocation
    assert len(rows) == 3 * 2 * 2


def test_plan_on_an_80_column_terminal_fits_and_shows_every_name_whole():
    r = CliRunner(env={"COLUMNS": "80", "FORCE_COLOR": "1"}).invoke(app, PLAN)
    assert r.exit_code == 0, r.output
    lines = _lines(r.output)
    assert "…" not in r.output
    assert max(len(ln) for ln in lines) <= 80
    rows = [ln for ln in lines if ln.startswith("│")]
    for name in NAMES:
        assert any(f" {name} " in ln for ln in rows), name


def test_flops_at_80_columns_has_no_ellipsis():
    for env in ({"COLUMNS": "80"}, {"COLUMNS": "80", "FORCE_COLOR": "1"}):
        r = CliRunner(env=env).invoke(app, ["flops", "--model", "qwen2.5-7b-instruct", "--lora-rank", "64",
                                            "--budget", "1e18"])
        assert r.exit_code == 0, r.output
        assert "…" not in r.output and "qwen2.5-7b" in r.output


def _grid_table() -> Table:
    t = Table(title="study demo")
    for col in ("run_id", "allocation", "budget", "seed", "steps", "rollout %", "learning %", "feedback %", "note"):
        t.add_column(col, justify="right" if col in ("budget", "seed", "steps") or "%" in col else "left")
    t.add_row("ef298c398270", "model=tiny-xs num_generations=4 reward=rule", "6e+09", "0", "3", "21", "79", "0", "")
    t.add_row("0a1b2c3d4e5f", "model=tiny-m num_generations=8 reward=prm:prm-xs", "6e+09", "1", "?", "-", "-", "-",
              "refused")
    return t


def test_narrow_terminal_wraps_labels_at_spaces_before_folding_anything():
    con = Console(width=80, force_terminal=True, color_system=None, record=True)
    table = _grid_table()
    assert natural_width(con, table) > 80
    widths = column_widths(con, table, 80)
    assert widths[0] == len("ef298c398270") and widths[1] == len("reward=prm:prm-xs")  # longest word of a label
    assert widths[2] == len("6e+09")  # the data of a short column stay whole
    print_table(con, _grid_table())
    text = con.export_text()
    assert max(len(ln) for ln in text.splitlines()) <= 80
    for word in ("ef298c398270", "model=tiny-xs", "num_generations=4", "reward=rule", "reward=prm:prm-xs", "6e+09",
                 "refused"):
        assert word in text, word


def test_a_log_keeps_the_natural_width_and_restores_the_console():
    con = Console(width=80, force_terminal=False, record=True)
    table = _grid_table()
    natural = natural_width(con, table)
    print_table(con, table)
    assert con.width == 80
    text = con.export_text()
    assert natural > 80 and max(len(ln) for ln in text.splitlines()) == natural
    assert "model=tiny-xs num_generations=4 reward=rule" in text
