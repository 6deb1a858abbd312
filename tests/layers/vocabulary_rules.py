"""One home per vocabulary: the budget's phases and the split's axes, the run statuses, the
per-step seed formula, whether a reference is a path, the reward-spec grammar and a parameter
count are each written once and imported everywhere else."""

from __future__ import annotations

import ast
from pathlib import Path

from .scan import SRC, mentions, package_dir, walk_nodes

# -- one home per vocabulary ---------------------------------------------------------------------
def _is_step_seed(node: ast.AST) -> bool:
    """``seed * k + step`` for any stride ``k`` (a constant or a name: ``1_000_003``,
    ``7_919``, ``1_000_033``, ``STRIDE``), either operand order: a per-step seed made by hand
    instead of by ``race.tasks.step_seed``."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)):
        return False
    return any(isinstance(x, ast.BinOp) and isinstance(x.op, ast.Mult)
               and any(_is_seed(y) for y in (x.left, x.right)) for x in (node.left, node.right))


def _is_seed(node: ast.AST) -> bool:
    """A seed by name (``seed``, ``cfg.seed``, ``base_seed``), not a seed statistic
    (``seed_sd``: a between-seed SD times a draw is no seed formula)."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name.lower() == "seed" or name.lower().endswith("_seed")


_PHASES = ("rollout", "old_logprobs", "reference", "reward", "update")


def _is_phase_list(node: ast.AST) -> bool:
    """A literal list of the budget's phases (all five in order, or the learning ones)."""
    if not isinstance(node, (ast.Tuple, ast.List)):
        return False
    words = tuple(e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str))
    return words[:5] == _PHASES or words == ("update", "old_logprobs", "reference")


def _is_path_check(node: ast.AST) -> bool:
    """``x.startswith((".", "/", ...))``: whether a reference names a file or directory."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "startswith"
            and node.args and isinstance(node.args[0], ast.Tuple)):
        return False
    words = {e.value for e in node.args[0].elts if isinstance(e, ast.Constant)}
    return "/" in words and bool(words & {".", "~", "./"})


def _is_reward_split(node: ast.AST) -> bool:
    """``reward.split(":")`` (or partition, rpartition, rsplit): the reward-spec grammar."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("split", "rsplit", "partition", "rpartition") and bool(node.args)
            and isinstance(node.args[0], ast.Constant) and node.args[0].value == ":"
            and mentions(node.func.value, "reward"))


#: (what, the module that is its one home, a test of an AST node that restates it)
VOCABULARIES = [("the per-step seed formula (race.tasks.step_seed)", "race.tasks.arith", _is_step_seed),
                ("the phase list or the learning split (race.accounting PHASES / SPLIT)", "race.accounting.phases",
                 _is_phase_list),
                ("whether a reference is a path (race.models.refs.looks_like_path)", "race.models.refs",
                 _is_path_check),
                ("the reward-spec grammar (race.spec.reward.parse_reward)", "race.spec.reward", _is_reward_split)]


#: Copies left for a later change (module -> what): none.
KNOWN_VOCABULARY_COPIES: dict[str, set[str]] = {}


def vocabulary_copies(src: Path) -> list[str]:
    bad = []
    for mod, rel, node in walk_nodes(src):
        known = KNOWN_VOCABULARY_COPIES.get(mod, set())
        for what, home, restates in VOCABULARIES:
            if mod != home and restates(node) and not any(what.startswith(k) for k in known):
                bad.append(f"{rel}:{node.lineno}: {mod} restates {what}: import it from {home}")
    return bad


def test_every_vocabulary_has_one_home():
    bad = vocabulary_copies(SRC)
    assert not bad, "\n".join(bad)


def test_the_vocabulary_scan_catches_a_copy(tmp_path):
    pkg = package_dir(tmp_path, "engines")
    (pkg / "loop.py").write_text("def seed_of(cfg, step):\n    return cfg.seed * 1_000_003 + step\n\n\n"
                                 "LEARN = ('update', 'old_logprobs', 'reference')\n\n\n"
                                 "def ok(budget):\n    return budget > 0\n\n\n"
                                 "def local(name, cfg):\n    return name.startswith(('.', '/', '~')), "
                                 "str(cfg.reward).split(':', 1)[0]\n")
    bad = vocabulary_copies(tmp_path)
    text = "\n".join(bad)
    # ``budget > 0`` on a number no type marks as a budget is no copy (race.accounting.guard.is_budget's copies are
    # the budget rules': tests/layers/budget_rules.py)
    assert "loop.py:9:" not in text
    assert len(bad) == 4 and "loop.py:2: race.engines.loop restates the per-step seed formula" in text
    assert "loop.py:5: race.engines.loop restates the phase list" in text
    assert "loop.py:13: race.engines.loop restates whether a reference is a path" in text
    assert "loop.py:13: race.engines.loop restates the reward-spec grammar" in text


# -- s4-23v: one home per vocabulary (phase sets in any order, split names, statuses, sampling seed,
# -- run columns, private members named by a string) -----------------------------------------------
def _literal_words(node: ast.AST) -> list[str]:
    """The string constants of a list/tuple/set literal (or of a dict literal's keys)."""
    elts = node.keys if isinstance(node, ast.Dict) else node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) \
        else []
    return [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def _is_phase_set(node: ast.AST) -> bool:
    """A list/tuple/set literal holding three or more of the budget's phases, in any order,
    as its items or as the first items of its pairs (``(("update", col), ...)``); those
    :func:`_is_phase_list` already names are left to it."""
    if isinstance(node, ast.Dict) or _is_phase_list(node):
        return False
    firsts = [e.elts[0] for e in getattr(node, "elts", []) if isinstance(e, ast.Tuple) and e.elts]
    words = set(_literal_words(node)) | {e.value for e in firsts if isinstance(e, ast.Constant)}
    return len(words & set(_PHASES)) >= 3


def _is_split_names(node: ast.AST) -> bool:
    """A list/tuple/set literal naming the split's three axes (dicts keyed by axis to give
    labels or colours are presentation and not counted)."""
    return not isinstance(node, ast.Dict) and {"search", "learning", "feedback"} <= set(_literal_words(node))


VOCABULARIES.extend([
    ("a set of the budget's phases (race.accounting PHASES / SPLIT)", "race.accounting.phases", _is_phase_set),
    ("the split's axis names (race.accounting SPLIT / SPLIT_COLUMNS)", "race.accounting.phases", _is_split_names)])


def test_the_vocabulary_scan_catches_phases_in_any_order_and_the_split_names(tmp_path):
    pkg = package_dir(tmp_path, "report")
    (pkg / "parts.py").write_text("A = {'reward', 'rollout', 'update'}\n"
                                  "B = [('rollout', 'x'), ('update', 'y')]\n"
                                  "E = (('reward', 'x'), ('update', 'y'), ('reference', 'z'))\n"
                                  "C = {'search': 1, 'learning': 2, 'feedback': 3}\n"
                                  "D = ['learning', 'search', 'feedback']\n")
    bad = vocabulary_copies(tmp_path)
    text = "\n".join(bad)
    assert len(bad) == 3, text
    assert "parts.py:1: race.report.parts restates a set of the budget's phases" in text
    assert "parts.py:3: race.report.parts restates a set of the budget's phases" in text
    assert "parts.py:5: race.report.parts restates the split's axis names" in text


def _is_status_set(node: ast.AST) -> bool:
    """A list/tuple/set literal naming the finished statuses (``"complete"`` and ``"diverged"``)."""
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and {"complete", "diverged"} <= set(_literal_words(node))


VOCABULARIES.append(("the run statuses (race.schema STATUSES / FINISHED)", "race.schema", _is_status_set))


def test_the_vocabulary_scan_catches_a_status_set(tmp_path):
    pkg = package_dir(tmp_path, "analysis")
    (pkg / "done.py").write_text("def done(runs):\n    return runs[runs.status.isin(['diverged', 'complete'])]\n\n\n"
                                 "def ok(s):\n    return s == 'complete'\n")
    bad = vocabulary_copies(tmp_path)
    assert len(bad) == 1 and "done.py:2: race.analysis.done restates the run statuses" in bad[0], bad


def test_the_vocabulary_scan_catches_a_sampling_seed(tmp_path):
    pkg = package_dir(tmp_path, "engines")
    (pkg / "roll.py").write_text("def gen(torch, cfg, step):\n"
                                 "    return torch.Generator().manual_seed(cfg.seed * 7_919 + step)\n")
    bad = vocabulary_copies(tmp_path)
    assert len(bad) == 1 and "roll.py:2: race.engines.roll restates the per-step seed formula" in bad[0], bad


def test_the_seed_scan_catches_an_unnamed_stride_in_either_order(tmp_path):
    """The variant issue 37 names (``builtin/engine.py`` had it): a torch seed made by hand
    with a stride no rule knew, and the same with the step first and a named stride."""
    pkg = package_dir(tmp_path, "engines")
    (pkg / "step.py").write_text("def train(torch, cfg, step):\n"
                                 "    torch.manual_seed(cfg.seed * 1_000_033 + step)\n"
                                 "    return step + STRIDE * cfg.seed, EVAL_SEED + 1\n")
    bad = vocabulary_copies(tmp_path)
    assert len(bad) == 2, bad  # EVAL_SEED + 1 is a fixed seed, not a per-step one
    assert all("restates the per-step seed formula (race.tasks.step_seed)" in b for b in bad)
    assert "step.py:2:" in bad[0] and "step.py:3:" in bad[1]


def _is_param_count(node: ast.AST) -> bool:
    """``sum(p.numel() for p in m.parameters())``: a module's parameter count."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "sum" and node.args
            and isinstance(node.args[0], ast.GeneratorExp) and isinstance(node.args[0].elt, ast.Call)
            and isinstance(node.args[0].elt.func, ast.Attribute) and node.args[0].elt.func.attr == "numel"
            and any(isinstance(g.iter, ast.Call) and isinstance(g.iter.func, ast.Attribute)
                    and g.iter.func.attr == "parameters" for g in node.args[0].generators))


VOCABULARIES.append(("a parameter count (race.models.family.count_params)", "race.models.family", _is_param_count))


def test_the_vocabulary_scan_catches_a_parameter_count(tmp_path):
    pkg = package_dir(tmp_path, "builds")
    (pkg / "rm.py").write_text("def n(model, ids):\n    return sum(p.numel() for p in model.parameters() if p.requires_grad), "
                               "sum(x.numel() for x in ids)\n")
    bad = vocabulary_copies(tmp_path)
    assert len(bad) == 1 and "rm.py:2: race.builds.rm restates a parameter count" in bad[0], bad
