"""The confidence labels are one type (race.analysis.decision.Label): no bare label string in src.

AST-based: every string constant in ``src/race`` whose whole value is a label's text (a dict
key, a comparison, a return value) must be the Label member itself; longer texts that mention
a label build it from the member (f"...'{Label.STABLE}'..."), which this test does not flag
because the constant parts are not the label alone."""

import ast
from pathlib import Path

import pytest

from race.analysis import NO_LEARNING, Label, recommend

SRC = Path(__file__).resolve().parents[2] / "src" / "race"
HOME = SRC / "analysis" / "decision.py"


def bare_labels(root: Path) -> list[str]:
    texts = {lab.value for lab in Label}
    bad = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        home = path.resolve() == HOME.resolve()
        for node in ast.walk(tree):
            if home and isinstance(node, ast.ClassDef) and node.name == "Label":
                for sub in ast.walk(node):
                    sub.label_home = True  # the members' own definitions
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in texts
                    and not getattr(node, "label_home", False)):
                bad.append(f"{path.relative_to(root.parent)}:{node.lineno}: bare label {node.value!r}")
    return bad


def test_no_bare_label_string_in_src():
    bad = bare_labels(SRC)
    assert not bad, "use race.analysis.decision.Label:\n" + "\n".join(bad)


def test_the_scan_catches_a_bare_label(tmp_path):
    pkg = tmp_path / "race"
    pkg.mkdir()
    (pkg / "m.py").write_text('TONES = {"stable regime": "good"}\n\n\ndef f(c):\n    return c == "unstable"\n'
                              'OK = f"the label {1} is not alone: \'unstable\' in a sentence"\n')
    bad = bare_labels(pkg)
    assert len(bad) == 2 and "m.py:1" in bad[0] and "m.py:5" in bad[1]


def test_label_is_its_text_and_has_a_tone():
    assert NO_LEARNING is Label.NO_LEARNING
    assert f"{Label.STABLE}" == str(Label.STABLE) == "stable regime" == Label.STABLE
    assert [lab.tone for lab in Label] == ["good", "caution", "bad", "bad"]


def test_recommendation_confidence_is_a_label(crossing_study):
    runs, evals = crossing_study
    rec = recommend(evals, runs, "greedy", 4e16)
    assert isinstance(rec.confidence, Label)
    assert rec.to_dict()["confidence"] == rec.confidence.value
