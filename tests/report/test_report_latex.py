"""study_table.tex: FLOPs per allocation and budget with their split, for a paper to
\\input; names escaped, numbers that add up, conventions in the note."""

from __future__ import annotations

import re
import shutil
import subprocess

import pandas as pd
import pytest

from race.accounting import Conventions
from race.analysis import prepare_runs
from race.report.latex import conventions_text, study_table, study_table_latex, study_table_rows, tex_sci

UNESCAPED_AMP = re.compile(r"(?<!\\)&")


def _body_rows(tex: str) -> list[list[str]]:
    """Cells of the table's data rows (header, total and note excluded)."""
    lines = tex.splitlines()
    first = lines.index("\\hline", lines.index("\\hline") + 1) + 1  # after the header rule
    rows = []
    for ln in lines[first:]:
        if ln == "\\hline":
            break
        rows.append([c.strip() for c in UNESCAPED_AMP.split(ln.removesuffix("\\\\").strip())])
    return rows


def _pct(cell: str) -> float:
    return float(cell.removesuffix("\\%"))


def _sci(cell: str) -> float:
    m = re.fullmatch(r"\$([0-9.]+)(?:\\times10\^\{(-?\d+)\})?\$", cell)
    assert m, cell
    return float(m.group(1)) * 10 ** int(m.group(2) or 0)


def test_rows_add_up_to_the_study_total(full_tables):
    runs = prepare_runs(full_tables["runs"])
    rows = study_table_rows(runs)
    assert rows["runs"].sum() == len(runs)
    assert rows["total"].sum() == pytest.approx(runs["total_flops"].sum(), rel=1e-12)
    split = rows[["search", "learning", "feedback", "other"]].sum(axis=1)
    assert (split - rows["total"]).abs().max() <= 1e-6 * rows["total"].max()
    assert len(rows) == runs.groupby(["allocation", "budget"]).ngroups
    assert list(rows["budget"]) == sorted(rows["budget"])  # budget-major order

    tex = study_table(runs)
    body = _body_rows(tex)
    assert len(body) == len(rows)
    for cells, r in zip(body, rows.itertuples()):
        assert len(cells) == 7
        assert _sci(cells[3]) == pytest.approx(r.total, rel=5e-3)
        assert sum(_pct(c) for c in cells[4:]) == pytest.approx(100, abs=0.15)
    total_line = next(ln for ln in tex.splitlines() if ln.startswith("Study total"))
    cells = [c.strip() for c in UNESCAPED_AMP.split(total_line.removesuffix("\\\\"))]
    assert cells[2] == str(len(runs))
    assert _sci(cells[3]) == pytest.approx(runs["total_flops"].sum(), rel=5e-3)
    assert sum(_pct(c) for c in cells[4:]) == pytest.approx(100, abs=0.15)


def _tiny_runs(allocations, conventions=None):
    rows = []
    for i, a in enumerate(allocations):
        for b in (1e12, 1e13):
            for seed in (0, 1):
                rows.append(dict(allocation=a, budget=b, total_flops=0.9 * b, rollout_flops=0.6 * b,
                                 learning_flops=0.2 * b, feedback_flops=0.1 * b, seed=seed))
    df = pd.DataFrame(rows)
    if conventions is not None:
        df["conventions"] = conventions
    return df


def test_allocation_names_are_escaped():
    names = ["tiny_s|G=4|rule", "50% & more|G=8", "plain"]
    tex = study_table(_tiny_runs(names))
    assert "tiny\\_s\\textbar{}G=4\\textbar{}rule" in tex
    assert "50\\% \\& more\\textbar{}G=8" in tex
    for cells in _body_rows(tex):
        assert len(cells) == 7  # no stray & splits a name into two cells
        assert not re.search(r"(?<!\\)[%_|]", cells[0]), cells[0]
    # every data, header and total row has the same number of columns
    for ln in tex.splitlines():
        if ln.endswith("\\\\") and not ln.startswith("\\multicolumn"):
            assert len(UNESCAPED_AMP.findall(ln)) == 6, ln
    if shutil.which("pdflatex"):  # a compile check where TeX is installed (not required)
        import tempfile
        from pathlib import Path

        with tempfile.TemporaryDirectory() as d:
            Path(d, "t.tex").write_text("\\documentclass{article}\\begin{document}\\begin{table}\n" + tex
                                        + "\\end{table}\\end{document}\n")
            r = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "t.tex"], cwd=d,
                               capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stdout[-2000:]


def test_a_split_that_does_not_add_up_gets_an_other_column():
    runs = _tiny_runs(["a"])
    runs.loc[0, "total_flops"] += 0.05e12  # FLOPs the split does not attribute
    tex = study_table(runs)
    assert "& Search & Learning & Feedback & Other \\\\" in tex and "other: not attributed" in tex
    for cells in _body_rows(tex):
        assert len(cells) == 8 and sum(_pct(c) for c in cells[4:]) == pytest.approx(100, abs=0.15)


def test_conventions_in_the_note():
    tex = study_table(_tiny_runs(["a"], conventions="verl"))
    note = tex.splitlines()[-2]
    assert note.startswith("\\multicolumn{7}{@{}p{\\linewidth}@{}}{\\footnotesize $^\\dagger$")
    assert "Conventions: conventions=verl; matmul=2mnk; half-square attention (n*c + n\\^{}2/2 pairs)" in note
    assert "mixed (race, torch)" in conventions_text(_tiny_runs(["a"], conventions=["race", "torch"] * 2))
    assert conventions_text(_tiny_runs(["a"])).startswith("not recorded in the runs table")
    assert Conventions().describe() in conventions_text(_tiny_runs(["a"]))


def test_tex_numbers():
    assert tex_sci(1.95e14) == "$1.95\\times10^{14}$"
    assert tex_sci(2e9) == "$2\\times10^{9}$"
    assert tex_sci(3.0) == "$3$" and tex_sci(0) == "0"
    assert tex_sci(1.2345e-3) == "$1.23\\times10^{-3}$"


def test_build_report_writes_the_table_next_to_report_md(full_report, full_tables):
    path = full_report.markdown.parent / "study_table.tex"
    assert path.exists()
    tex = path.read_text()
    assert tex.startswith("% RACE study table") and "Study total" in tex
    assert len(_body_rows(tex)) == prepare_runs(full_tables["runs"]).groupby(["allocation", "budget"]).ngroups
    assert study_table_latex  # the renderer is public for custom row sets
