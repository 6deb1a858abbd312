"""One parser or constructor per thing: a reward spec is parsed once (readers read the typed
columns), a run's step plan has one constructor, one function says which reward model a
target names, and one fixture loads a script by path."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from .scan import SRC, TESTS, modules_of, package_dir, package_of, walk_nodes

# -- s4-23r: a reward spec is parsed once after the store; readers read its typed columns ----------
def _reward_words() -> set[str]:
    """The words of the reward grammar a reader would test a spec string against: every
    kind of the reward-kind table, and ``KIND:`` for the kinds that take an argument."""
    sys.path.insert(0, str(SRC))
    try:
        from race.accounting.reward_kinds import REWARD_KINDS
    finally:
        sys.path.remove(str(SRC))
    return {*REWARD_KINDS, *(k + ":" for k, row in REWARD_KINDS.items() if row.argument != "none")}


REWARD_WORDS = _reward_words()
REWARD_PREFIXES = {w for w in REWARD_WORDS if w.endswith(":")}
#: The grammar's entry points (race.spec.reward): calling (or importing) them parses a spec.
GRAMMAR = {"parse_reward", "parse_learned", "reward_columns"}
#: Where the grammar may be called: its home and the deserialiser of the store's runs table.
GRAMMAR_HOMES = ("race.spec", "race.grid.tables")
#: Other callers, each with why (module -> reason).
GRAMMAR_CALLERS = {
    "race.analysis.tables": "with_reward_columns: the typed columns of a table passed in by hand (never stored), "
                            "derived as the grid derives them",
    "race.rewards.systems": "resolve_reward: a spec resolved once (its row, model and cost) for the builder, "
                            "planning and build on demand (RunConfig.reward, parsed already, passes through)",
}


def _reward_columns() -> set[str]:
    sys.path.insert(0, str(SRC))
    try:
        from race.schema import REWARD_COLUMNS
    finally:
        sys.path.remove(str(SRC))
    return set(REWARD_COLUMNS)


def _is_reward_text(node: ast.AST, typed: set[str]) -> bool:
    """Whether ``node`` is a reward spec string: a name, attribute or ``["key"]`` named like a
    reward (not a typed column of ``race.schema.REWARD_COLUMNS``, not ``.kind``), seen through
    ``str(...)``, ``.astype(...)``, ``.str`` and ``.get(...)``."""
    while True:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "str" and node.args:
            node = node.args[0]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("astype", "get")):
            node = node.func.value
        elif isinstance(node, ast.Attribute) and node.attr == "str":
            node = node.value
        elif isinstance(node, ast.Subscript) and not (isinstance(node.slice, ast.Constant)
                                                      and isinstance(node.slice.value, str)):
            node = node.value
        else:
            break
    name = (node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute)
            else node.slice.value if isinstance(node, ast.Subscript) else "")
    return "reward" in name.lower() and name not in typed


def _is_reward_word(node: ast.AST) -> bool:
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return any(isinstance(e, ast.Constant) and e.value in REWARD_WORDS for e in items)


def reward_string_tests(src: Path) -> list[str]:
    """One message per test of a reward spec STRING against a reward kind or prefix outside
    ``race.spec`` (``reward.startswith("prm")``, ``df["reward"] == "random"``, ``"rule:" in
    reward``), and per call or import of the reward grammar outside its homes
    (:data:`GRAMMAR_HOMES`, :data:`GRAMMAR_CALLERS`): the runs table's typed columns
    (``reward_system``, ``reward_rule``, ``reward_model``, ``reward_learned``,
    ``reward_random``) say it, parsed once where the table is built."""
    typed, bad = _reward_columns(), []
    for mod, rel, node in walk_nodes(src):
        if mod.startswith("race.spec"):
            continue
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                                                 for op in node.ops):
            sides = [node.left, *node.comparators]
            if any(_is_reward_word(a) and _is_reward_text(b, typed) for a in sides for b in sides if a is not b):
                bad.append(f"{rel}:{node.lineno}: {mod} tests a reward spec string against a reward kind: read "
                           "the typed reward columns (race.schema.REWARD_COLUMNS)")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("startswith", "endswith") and node.args and _is_reward_word(node.args[0])
              and _is_reward_text(node.func.value, typed)):
            bad.append(f"{rel}:{node.lineno}: {mod} tests a reward spec string's prefix: read the typed reward "
                       "columns (race.schema.REWARD_COLUMNS)")
        elif (isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) > 1
              and all(isinstance(e, ast.Constant) and e.value in REWARD_PREFIXES for e in node.elts)):
            bad.append(f"{rel}:{node.lineno}: {mod} restates the reward kinds' prefixes: read reward_learned / "
                       "reward_system (race.schema.REWARD_COLUMNS)")
        if mod.startswith(GRAMMAR_HOMES) or mod in GRAMMAR_CALLERS:
            continue
        names = ([a.name for a in node.names] if isinstance(node, ast.ImportFrom) else
                 [node.func.id if isinstance(node.func, ast.Name) else node.func.attr]
                 if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)) else [])
        for name in sorted(set(names) & GRAMMAR):
            bad.append(f"{rel}:{node.lineno}: {mod} {'imports' if isinstance(node, ast.ImportFrom) else 'calls'} "
                       f"{name}: a stored spec is parsed once (race.grid.tables); read the typed reward columns")
    return bad


def test_readers_read_the_typed_reward_columns_never_the_spec_string():
    bad = reward_string_tests(SRC)
    assert not bad, "\n".join(bad)


def test_the_reward_string_scan_catches_one(tmp_path):
    pkg = package_dir(tmp_path, "report")
    (pkg / "sec.py").write_text(
        "def f(p, fin, cfg, r):\n"
        "    a = p['reward'].astype(str).str.startswith('prm')\n"
        "    b = fin[fin['reward'].astype(str) == 'random']\n"
        "    c = str(cfg.reward).startswith(('prm:', 'orm:'))\n"
        "    d = 'rule:' in r.reward\n"
        "    e = p['reward_system'] == 'prm', cfg.reward.kind == 'prm', r.name == 'rule'\n"
        "    from race.spec.reward import parse_reward\n"
        "    return parse_reward(r.reward).weights\n\n\n"
        "LEARNED_PREFIXES = ('prm:', 'orm:', 'judge:')\n")
    found = sorted(int(m.split(": ", 1)[0].rsplit(":", 1)[1]) for m in reward_string_tests(tmp_path))
    assert found == [2, 3, 4, 4, 5, 7, 8, 11], reward_string_tests(tmp_path)  # line 6 reads typed fields


# -- s4-23p: one constructor of a run's step settings ------------------------------------------------
#: Fields of a run config that say how a step runs: a StepPlan or LoRA built from them is a
#: run's plan, and has one home (race.estimate's run_step_plan / run_lora), used by the
#: built-in engine's setup and the dry run alike. (FlopsQuery's names differ: group,
#: iterations, lora_rank; the accounting sees no run config.)
RUN_STEP_FIELDS = {"num_generations", "num_iterations", "lora", "target_modules", "needs_old_logprobs",
                   "optimizer_steps_per_generation", "num_update_generations",
                   "gradient_checkpointing", "micro_batch_size"}
RUN_PLAN_HOMES = {("race.estimate", "run_step_plan"), ("race.estimate", "run_lora")}


def run_plan_builders(src: Path) -> list[str]:
    """One message per ``StepPlan(...)`` or ``LoRA(...)`` call outside ``race.accounting``
    whose arguments read a run config's step fields (:data:`RUN_STEP_FIELDS`), unless it is
    in a function of :data:`RUN_PLAN_HOMES`."""
    bad = []
    for mod, f in modules_of(src).items():
        if package_of(mod) == "accounting":
            continue
        rel = str(f.relative_to(src.parent))
        tree = ast.parse(f.read_text(), str(f))
        owner: dict[ast.AST, str] = {}  # node -> innermost enclosing function (ast.walk: outer ones first)
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                owner.update((sub, fn.name) for sub in ast.walk(fn))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name not in ("StepPlan", "LoRA") or (mod, owner.get(node, "")) in RUN_PLAN_HOMES:
                continue
            args = [*node.args, *(k.value for k in node.keywords)]
            read = sorted({a.attr for x in args for a in ast.walk(x) if isinstance(a, ast.Attribute)} & RUN_STEP_FIELDS)
            if read:
                bad.append(f"{rel}:{node.lineno}: {mod} builds a {name} from a run's {', '.join(read)}: "
                           "use race.estimate.run_step_plan / run_lora")
    return bad


def test_a_runs_step_plan_has_one_constructor():
    bad = run_plan_builders(SRC)
    assert not bad, "\n".join(bad)


def test_the_run_plan_scan_catches_a_second_constructor(tmp_path):
    (tmp_path / "race").mkdir()
    (tmp_path / "race" / "estimate.py").write_text(
        "def run_lora(cfg):\n    return LoRA(cfg.lora.r, tuple(cfg.lora.target_modules))\n\n"
        "def run_step_plan(cfg, shape):\n    return StepPlan(shape, cfg.num_generations, lora=run_lora(cfg))\n")
    pkg = package_dir(tmp_path, "engines")
    (pkg / "loop.py").write_text(
        "def setup(cfg, shape, q):\n"
        "    plan = acc.StepPlan(shape, cfg.num_generations,\n"
        "                        lora=LoRA(cfg.lora.r))\n"
        "    return plan, StepPlan(shape, q.group, num_iterations=q.iterations)\n")
    bad = run_plan_builders(tmp_path)
    assert len(bad) == 2, bad  # the StepPlan (group, and the LoRA inside it) and the LoRA; not the query's
    assert "race/engines/loop.py:2: race.engines.loop builds a StepPlan from a run's lora, num_generations" in bad[0]
    assert "race/engines/loop.py:3: race.engines.loop builds a LoRA from a run's lora" in bad[1]


#: Test files that load a script by path themselves (not through conftest's ``load_script``):
#: report_synth.py loads analysis_synth.py at import, where no fixture can reach.
KNOWN_SCRIPT_LOADERS = {"report/report_synth.py"}


def script_loaders(tests: Path) -> list[str]:
    """One message per test file (but ``conftest.py``) that calls ``spec_from_file_location``."""
    bad = []
    for f in sorted(tests.rglob("*.py")):
        rel = f.relative_to(tests).as_posix()
        if f.name == "conftest.py" or rel in KNOWN_SCRIPT_LOADERS:
            continue
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Attribute) and node.attr == "spec_from_file_location":
                bad.append(f"tests/{rel}:{node.lineno}: loads a script by path: use the load_script fixture "
                           "(tests/conftest.py)")
    return bad


def test_scripts_are_loaded_by_the_one_fixture():
    bad = script_loaders(TESTS)
    assert not bad, "\n".join(bad)


def test_the_script_loader_scan_catches_one(tmp_path):
    (tmp_path / "bench").mkdir()
    (tmp_path / "conftest.py").write_text("import importlib.util\nimportlib.util.spec_from_file_location('a', 'b')\n")
    (tmp_path / "bench" / "test_x.py").write_text("import importlib.util\n\n\ndef mod():\n"
                                                 "    return importlib.util.spec_from_file_location('x', 'x.py')\n")
    bad = script_loaders(tmp_path)
    assert len(bad) == 1 and bad[0].startswith("tests/bench/test_x.py:5:"), bad


# -- s4-23rm
#: The one module that decides which reward model a learned target names
#: (``race.rewards.rm_recipes.learned_target``: a path first, then a recipe of the same kind).
TARGET_RULE = "race.rewards.rm_recipes"


def _is_recipes(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "RM_RECIPES") or (
        isinstance(node, ast.Attribute) and node.attr == "RM_RECIPES")


def recipe_lookups_outside(src: Path, home: str = TARGET_RULE) -> list[str]:
    """One message per ``x in RM_RECIPES`` / ``not in`` / ``RM_RECIPES.get(x)`` outside
    ``home``: asking whether a name is one of RACE's RMs is ``learned_target``'s question."""
    bad = []
    for mod, rel, node in walk_nodes(src):
        if mod == home:
            continue
        if isinstance(node, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn)) for o in node.ops) \
                and any(_is_recipes(c) for c in node.comparators):
            bad.append(f"{rel}:{node.lineno}: {mod} tests membership in RM_RECIPES: ask "
                       "race.rewards.rm_recipes.learned_target")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and _is_recipes(node.func.value):
            bad.append(f"{rel}:{node.lineno}: {mod} looks a name up with RM_RECIPES.get: ask "
                       "race.rewards.rm_recipes.learned_target")
    return bad


def test_one_function_says_which_reward_model_a_target_names():
    assert not (found := recipe_lookups_outside(SRC)), "\n".join(found)


def test_the_recipe_lookup_scan_catches_one(tmp_path):
    pkg = package_dir(tmp_path, "builds")
    (pkg / "demand.py").write_text("from race.rewards import rm_recipes\n"
                                   "from race.rewards.rm_recipes import RM_RECIPES\n\n\ndef f(t):\n"
                                   "    return t in RM_RECIPES, rm_recipes.RM_RECIPES.get(t), "
                                   "t in {}, t not in rm_recipes.RM_RECIPES\n")
    rewards = package_dir(tmp_path, "rewards")
    (rewards / "rm_recipes.py").write_text("RM_RECIPES = {}\n\n\ndef learned_target(k, t):\n"
                                           "    return t in RM_RECIPES\n")
    bad = recipe_lookups_outside(tmp_path)
    assert len(bad) == 3 and all("race/builds/demand.py:6: race.builds.demand" in b for b in bad), bad
    assert sum("RM_RECIPES.get" in b for b in bad) == 1
