"""The import rules of ``src/race``, checked: one table says which package may import which,
every file is parsed with ``ast`` (imports inside functions count), and a broken rule
fails naming the file and line.

The house, bottom to top (a package may import only packages on lower floors):

    accounting   stdlib only: shapes, per-term FLOPs (TRL's too), GRPO phases, ledger, budget guard
    schema       stdlib only: the layout of a study's tables (race/schema.py)
    cards        stdlib only: the report card rendered (Markdown, LaTeX, its files; race/cards.py)
    records      stdlib only: one run record, built from a run's rows, and the over-optimisation rule
    spec         stdlib, pydantic, PyYAML: run / grid / cell / reward spec / flops query
    tasks        task generators and verifiers
    artefacts    where a cached artefact lives and whether it is built (cache root, recipe
                 hash, directory, info.json, packaged copies, NotBuiltError); finds, never builds
    measure      FlopCounterMode helpers
    models       tokenizer, tiny family, loading, LoRA, model refs -> shapes, the warm starts'
                 recipe and directory (base_recipes): loads a warm start, never trains one
    rewards      reward systems by name, RACE's RM recipes and directories (rm_recipes):
                 loads a reward model, never trains one
    builds       every artefact's training (warm starts, RM data, RM training, calibration and
                 evaluation) and build on demand (builds.demand) for the floors above
    estimate     FLOP estimates before anything runs (race flops, the grid's dry run)
    engines      the built-in loop and the TRL adapter
    grid         the pilot grid: plan, store, runners
    analysis     pure pandas/numpy/scipy (never engines or models)
    protocol     reading a study, its recommendation; the validation stage (runs through grid)
    report       figures and the report: renders only (imports no grid, engine or training module)
    cli          Typer commands (nothing imports cli)

``race/__init__.py`` is the facade: it re-exports the public surface lazily and may reach
any floor but ``cli``.

Artefacts are found low and built high: the builds need models, tasks and the reward
encoding, so they sit above the rewards, and what a loader needs to FIND an artefact
(``race.artefacts`` + the recipes beside what they describe) sits below the models. A
missing artefact makes a loader raise ``NotBuiltError`` naming the command that builds it;
the callers above the builds (the engines' setup, the grid's prebuild, the CLI) build
first. The floors keep every module below ``builds`` from importing it; :data:`NEVER_IMPORTS`
says it again for ``models`` and ``rewards`` by name, and :func:`trainers_outside` fails on
an optimizer built outside ``builds`` (artefacts) and ``engines`` (the runs).
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

FLOORS = ["accounting", "schema", "cards", "records", "spec", "tasks", "artefacts", "measure", "models", "rewards", "builds",
          "estimate", "engines", "grid", "analysis", "protocol", "report", "cli"]
#: Packages that must never reach (directly or through others) the packages listed.
NEVER_REACHES = {"analysis": {"engines", "models"}, "engines": {"grid"}}
#: Packages that may import (directly) only the packages listed: the report renders what the
#: protocol reads; it imports no grid, engine, model, reward or training module.
IMPORTS_ONLY = {"report": {"accounting", "schema", "cards", "analysis", "protocol"}}
#: Modules a package must never import directly (package -> modules): the report launches no
#: run; the per-term FLOP formulas and the pass compositions are composed into rules inside
#: the accounting only (an engine asks race.accounting for a phase's FLOPs, never for a term).
FORMULAS = {"race.accounting.terms", "race.accounting.passes"}
NEVER_IMPORTS = {p: set(FORMULAS) for p in FLOORS if p != "accounting"}
NEVER_IMPORTS["report"] |= {"race.protocol.validate"}
#: The loaders never import the builds (training a warm start or a reward model).
for _loader in ("artefacts", "models", "rewards"):
    NEVER_IMPORTS[_loader] |= {"race.builds"}
#: Packages that may build an optimizer (train): the artefact builds and the GRPO runs.
TRAINERS = {"builds", "engines"}
#: Third-party imports allowed on the ground floors (besides the standard library).
GROUND = {"accounting": set(), "schema": set(), "cards": set(), "records": set(), "spec": {"pydantic", "yaml"}}
ROOT = "race"  # the facade (race/__init__.py)


@dataclass(frozen=True)
class Import:
    module: str  # importing module, e.g. race.grid.plan
    target: str  # imported module, e.g. race.estimate (or a third-party top-level name)
    file: str
    line: int

    def where(self) -> str:
        return f"{self.file}:{self.line}"


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT


def modules_of(src: Path) -> dict[str, Path]:
    out = {}
    for f in sorted((src / "race").rglob("*.py")):
        parts = list(f.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def imports_of(src: Path) -> list[Import]:
    """Every import statement of every module under ``src/race`` (module level, in
    functions, under ``if TYPE_CHECKING``), resolved to the module it loads."""
    mods = modules_of(src)
    out = []
    for mod, f in mods.items():
        rel = str(f.relative_to(src.parent))
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = mod.split(".") if f.name == "__init__.py" else mod.split(".")[:-1]
                    pkg = pkg[: len(pkg) - (node.level - 1)]
                    base = ".".join(pkg + ([node.module] if node.module else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for name in names:
                if name.split(".")[0] == "race":
                    while name not in mods and "." in name:
                        name = name.rpartition(".")[0]
                    if name == mod:
                        continue
                out.append(Import(mod, name, rel, node.lineno))
    return out


def _internal(imports: list[Import]) -> list[Import]:
    return [i for i in imports if i.target.split(".")[0] == "race"]


def rule_violations(imports: list[Import], floors: list[str] = FLOORS,
                    never: dict[str, set[str]] = NEVER_REACHES) -> list[str]:
    """One message per import that breaks the table: an import of a higher (or unknown)
    floor, of ``cli`` from outside it, or a path to a package the importer must never reach."""
    rank = {p: i for i, p in enumerate(floors)}
    bad = []
    for i in _internal(imports):
        a, b = package_of(i.module), package_of(i.target)
        if a == b:
            continue
        if b == "cli":
            bad.append(f"{i.where()}: {i.module} imports {i.target}: nothing imports cli")
        elif a == ROOT:
            continue
        elif b == ROOT:
            bad.append(f"{i.where()}: {i.module} imports the facade {i.target}: import the package itself")
        elif a not in rank or b not in rank:
            bad.append(f"{i.where()}: {i.module} imports {i.target}: package {a if a not in rank else b!r} "
                       "has no floor in tests/test_layers.py FLOORS")
        elif rank[b] > rank[a]:
            bad.append(f"{i.where()}: {i.module} imports {i.target}: {a} (floor {rank[a]}) may not import "
                       f"{b} (floor {rank[b]}, above it)")
    edges = package_edges(imports)
    for pkg, forbidden in never.items():
        seen, stack = set(), [pkg]
        via: dict[str, Import] = {}
        while stack:
            p = stack.pop()
            for q, imp in edges.get(p, {}).items():
                if q not in seen:
                    seen.add(q)
                    via[q] = via.get(p, imp)
                    stack.append(q)
        for q in sorted(seen & forbidden):
            bad.append(f"{via[q].where()}: {pkg} reaches {q} (first step: {via[q].module} imports "
                       f"{via[q].target}): {pkg} must never reach {q}")
    return bad


def room_violations(imports: list[Import], only: dict[str, set[str]] = IMPORTS_ONLY,
                    never: dict[str, set[str]] = NEVER_IMPORTS) -> list[str]:
    """One message per direct import of a package outside the importer's
    :data:`IMPORTS_ONLY` list, or of a module its :data:`NEVER_IMPORTS` names."""
    bad = []
    for i in _internal(imports):
        a, b = package_of(i.module), package_of(i.target)
        if a == b or b == ROOT:
            continue
        if a in only and b not in only[a]:
            bad.append(f"{i.where()}: {i.module} imports {i.target}: {a} may import only "
                       f"{', '.join(sorted(only[a]))}")
        elif any(i.target == m or i.target.startswith(m + ".") for m in never.get(a, ())):
            bad.append(f"{i.where()}: {i.module} imports {i.target}: {a} must not import it")
    return bad


def package_edges(imports: list[Import]) -> dict[str, dict[str, Import]]:
    """package -> {imported package: the first import that makes the arrow}."""
    edges: dict[str, dict[str, Import]] = defaultdict(dict)
    for i in _internal(imports):
        a, b = package_of(i.module), package_of(i.target)
        if a != b and ROOT not in (a, b):
            edges[a].setdefault(b, i)
    return edges


def cycles(edges: dict[str, dict[str, Import]] | dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in list(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def module_edges(imports: list[Import]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for i in _internal(imports):
        edges[i.module].add(i.target)
    return edges


def ground_floor_violations(imports: list[Import], ground: dict[str, set[str]] = GROUND) -> list[str]:
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    bad = []
    for i in imports:
        pkg, top = package_of(i.module), i.target.split(".")[0]
        if pkg in ground and top != "race" and top not in stdlib and top not in ground[pkg]:
            allowed = ", ".join(["the standard library", *sorted(ground[pkg])])
            bad.append(f"{i.where()}: {i.module} imports {i.target}: {pkg} may import only {allowed}")
    return bad


def _describe(cyc: list[list[str]], edges: dict) -> str:
    lines = []
    for comp in cyc:
        arrows = [f"{a} -> {b} ({imp.where()})" for a in comp for b, imp in edges.get(a, {}).items() if b in comp]
        lines.append("cycle " + " <-> ".join(comp) + ": " + "; ".join(arrows))
    return "\n".join(lines)


# -- the tree ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tree() -> list[Import]:
    return imports_of(SRC)


def test_every_package_has_a_floor(tree):
    pkgs = {package_of(m) for m in modules_of(SRC)} - {ROOT}
    assert not pkgs - set(FLOORS), f"packages without a floor in FLOORS: {sorted(pkgs - set(FLOORS))}"


def test_no_upward_arrow(tree):
    bad = rule_violations(tree)
    assert not bad, "import rules broken:\n" + "\n".join(bad)


def test_no_cycle_between_packages(tree):
    edges = package_edges(tree)
    assert not cycles(edges), _describe(cycles(edges), edges)


def test_no_cycle_between_modules(tree):
    edges = module_edges(tree)
    found = cycles(edges)
    assert not found, "module import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_each_room_imports_only_what_its_job_needs(tree):
    bad = room_violations(tree)
    assert not bad, "\n".join(bad)


def test_the_room_check_catches_a_report_that_trains():
    bad = room_violations([_imp("race.report.build", "race.engines.builtin", 3),
                           _imp("race.report.doc", "race.protocol.validate", 4),
                           _imp("race.report.doc", "race.protocol.study", 5), _imp("race.report.fmt", "race.cards", 6)])
    assert len(bad) == 2 and "report.build imports race.engines.builtin: report may import only" in bad[0]
    assert "src/race/report/doc.py:4" in bad[1] and "must not import it" in bad[1]
    bad = room_violations([_imp("race.engines.trl.flops", "race.accounting.terms", 62),
                           _imp("race.engines.trl.flops", "race.accounting.guard", 65)])
    assert bad == ["src/race/engines/trl/flops.py:62: race.engines.trl.flops imports race.accounting.terms: engines "
                   "must not import it"]


def walk_nodes(src: Path):
    """(module, file relative to ``src``'s parent, AST node) for every node of every module."""
    for mod, f in modules_of(src).items():
        rel = str(f.relative_to(src.parent))
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            yield mod, rel, node


def rendering_in(src: Path, package: str = "accounting") -> list[str]:
    """One message per rendering inside ``race.<package>``: a function named like a
    renderer (``to_markdown``, ``to_latex``, ``*_html``, ``latex_*``, ``write``), or a string
    holding Markdown-table, LaTeX-table or HTML markup. The report card's rendering is
    ``race.cards``'s."""
    bad = []
    marks = ("|---|", "\\begin{tabular}", "\\hline", "<table", "<td")
    for mod, rel, node in walk_nodes(src):
        if package_of(mod) != package:
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                node.name in ("to_markdown", "to_latex", "to_html", "write") or "latex" in node.name
                or "markdown" in node.name or node.name.endswith("_html")):
            bad.append(f"{rel}:{node.lineno}: {mod} defines {node.name}: rendering belongs in race.cards")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and any(m in node.value for m in marks):
            bad.append(f"{rel}:{node.lineno}: {mod} holds markup {node.value[:30]!r}: rendering belongs in race.cards")
    return bad


def test_the_accounting_renders_nothing_and_the_scan_would_see_a_renderer(tmp_path):
    assert not (found := rendering_in(SRC)), "\n".join(found)
    pkg = package_dir(tmp_path, "accounting")
    (pkg / "card.py").write_text("class Card:\n    def to_markdown(self):\n        return '|---|---|'\n")
    bad = rendering_in(tmp_path)
    assert len(bad) == 2 and bad[0].endswith("card.py:2: race.accounting.card defines to_markdown: rendering "
                                             "belongs in race.cards") and "card.py:3" in bad[1]


def trainers_outside(src: Path, trainers: set[str] = TRAINERS) -> list[str]:
    """One message per optimizer built (``torch.optim.X(...)``, ``optim.X(...)``) in a
    package outside :data:`TRAINERS`: a warm start or a reward model is trained in
    ``race.builds`` only; models and rewards load them."""
    bad = []
    for mod, rel, node in walk_nodes(src):
        if package_of(mod) in trainers or not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and (isinstance(f.value, ast.Attribute) and f.value.attr == "optim"
                                             or isinstance(f.value, ast.Name) and f.value.id == "optim"):
            bad.append(f"{rel}:{node.lineno}: {mod} builds an optimizer (optim.{f.attr}): artefacts are trained in "
                       "race.builds only")
    return bad


def test_only_builds_and_engines_train_and_the_scan_would_see_a_trainer(tmp_path):
    assert not (found := trainers_outside(SRC)), "\n".join(found)
    pkg = package_dir(tmp_path, "rewards")
    (pkg / "fit.py").write_text("import torch\nfrom torch import optim\n\n\ndef fit(m):\n"
                                "    a = torch.optim.AdamW(m.parameters())\n    return a, optim.LBFGS([])\n")
    bad = trainers_outside(tmp_path)
    assert len(bad) == 2 and bad[0].endswith("fit.py:6: race.rewards.fit builds an optimizer (optim.AdamW): "
                                             "artefacts are trained in race.builds only") and "fit.py:7" in bad[1]
    assert not trainers_outside(tmp_path, trainers={"rewards"})


def test_the_loaders_never_import_the_builds():
    bad = room_violations([_imp("race.rewards.learned", "race.builds.rm_training", 37),
                           _imp("race.models.loading", "race.builds.warmstart", 26),
                           _imp("race.rewards.learned", "race.artefacts.cache", 5),
                           _imp("race.engines.common", "race.builds.demand", 80)])
    assert bad == ["src/race/rewards/learned.py:37: race.rewards.learned imports race.builds.rm_training: rewards "
                   "must not import it",
                   "src/race/models/loading.py:26: race.models.loading imports race.builds.warmstart: models must "
                   "not import it"]
    floors = rule_violations([_imp("race.rewards.learned", "race.builds.rm_training", 37)])
    assert floors and "rewards (floor 9) may not import builds (floor 10, above it)" in floors[0]


def test_ground_floors_import_only_what_they_may(tree):
    bad = ground_floor_violations(tree)
    assert not bad, "\n".join(bad)


# -- the checks can fail -------------------------------------------------------------------------------
def package_dir(root: Path, package: str) -> Path:
    """An empty ``race.<package>`` under ``root`` (a synthetic tree for the scans to read)."""
    pkg = root / "race" / package
    pkg.mkdir(parents=True)
    (root / "race" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    return pkg


def _imp(a: str, b: str, line: int = 1) -> Import:
    return Import(a, b, f"src/{a.replace('.', '/')}.py", line)


def test_the_rules_catch_a_synthetic_violating_graph():
    graph = [
        _imp("race.grid.plan", "race.cli.flops", 76),  # the old upward arrow
        _imp("race.models.loading", "race.engines.builtin", 9),  # models below engines
        _imp("race.analysis.fits", "race.report.fmt", 3),  # then report -> grid -> models: analysis reaches models
        _imp("race.report.fmt", "race.grid.plan", 4),
        _imp("race.grid.plan", "race.models.refs", 5),
        _imp("race.engines.common", "race.grid.store", 7),  # engines reach grid
        _imp("race.newpkg.x", "race.accounting", 1),  # a package with no floor
        _imp("race.spec.run", "race", 2),  # the facade from inside
    ]
    bad = rule_violations(graph)
    text = "\n".join(bad)
    assert "src/race/grid/plan.py:76: race.grid.plan imports race.cli.flops: nothing imports cli" in text
    assert "src/race/models/loading.py:9" in text and "models (floor 8) may not import engines" in text
    assert "analysis reaches models" in text and "src/race/analysis/fits.py:3" in text
    assert "engines reaches grid" in text
    assert "'newpkg' has no floor" in text
    assert "imports the facade race" in text


def test_the_cycle_check_catches_a_cycle_and_names_its_imports():
    graph = [_imp("race.grid.spec", "race.rewards.x", 10), _imp("race.rewards.x", "race.grid.expand", 20),
             _imp("race.models.a", "race.accounting", 1)]
    edges = package_edges(graph)
    assert cycles(edges) == [["grid", "rewards"]]
    assert "src/race/grid/spec.py:10" in _describe(cycles(edges), edges)
    assert cycles(module_edges([_imp("race.a.x", "race.a.y"), _imp("race.a.y", "race.a.x")])) == [["race.a.x",
                                                                                                     "race.a.y"]]


def test_the_ground_floor_check_catches_third_party_imports():
    bad = ground_floor_violations([_imp("race.accounting.shapes", "numpy", 3), _imp("race.spec.run", "yaml", 4),
                                   _imp("race.spec.run", "torch", 5), _imp("race.accounting.x", "json", 1)])
    assert bad == ["src/race/accounting/shapes.py:3: race.accounting.shapes imports numpy: accounting may import "
                   "only the standard library",
                   "src/race/spec/run.py:5: race.spec.run imports torch: spec may import only the standard library, "
                   "pydantic, yaml"]


def test_imports_inside_functions_count(tmp_path):
    pkg = package_dir(tmp_path, "grid")
    (tmp_path / "race" / "cli").mkdir()
    (tmp_path / "race" / "cli" / "__init__.py").write_text("")
    (tmp_path / "race" / "cli" / "flops.py").write_text("X = 1\n")
    (pkg / "plan.py").write_text("def f():\n    from race.cli.flops import X\n    return X\n")
    bad = rule_violations(imports_of(tmp_path))
    assert len(bad) == 1 and bad[0].endswith("race/grid/plan.py:2: race.grid.plan imports race.cli.flops: nothing "
                                              "imports cli")


# -- one owner per decision ----------------------------------------------------------------------
#: The module that decides every budget stop, and the ledger whose primitives it uses.
GUARD = "race.accounting.guard"
BUDGET_PRIMITIVES = {GUARD, "race.accounting.ledger"}
#: Stops that are not budget stops (module -> why), allowed to set ``should_training_stop``.
OTHER_STOPS = {"race.engines.trl.run_callback": "a diverged run (non-finite loss) stops, keeping its last checkpoint"}


#: Orderings of a run's budget that decide nothing about FLOPs (module -> why).
BUDGET_ORDERINGS = {"race.spec.run": "eval.at_budgets: a smaller budget against the run's (two budgets, no FLOPs)",
                    "race.engines.common": "an extension: the shorter run's budget against the run's (two budgets)",
                    "race.spec.ladder": "a racing cell's reads: the study budgets below its own (two budgets)"}


def _is_run_budget(node: ast.AST) -> bool:
    """A run's FLOP budget by meaning: a name or attribute ``budget`` / ``*budget_flops``
    (``cfg.budget_flops``, ``self.budget``, ``budget``); not a list of budgets or an axis."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name.lower() in ("budget", "budget_flops") or name.lower().endswith("_budget_flops")


def _orders_a_budget(node: ast.Compare) -> bool:
    """``x < budget``, ``floor >= cfg.budget_flops``, ``spent + b > self.budget``, ...: an
    ordering (<, <=, >, >=) with a run's budget on one side and a number that is not a
    constant on the other (``budget > 0`` is :func:`_is_budget_check`'s)."""
    sides = [node.left, *node.comparators]
    if not any(isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)) for op in node.ops):
        return False
    return any(_is_run_budget(s) for s in sides) and not any(isinstance(s, ast.Constant) for s in sides)


def _mentions(node: ast.AST, word: str) -> bool:
    return any(word in (n.id if isinstance(n, ast.Name) else n.attr).lower()
               for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute)))


def stop_deciders(src: Path) -> list[str]:
    """One message per place outside ``race.accounting.guard`` that decides a budget stop
    itself: a ``would_exceed`` call, an ``except BudgetExceededError``, an assignment of
    ``should_training_stop`` (other than a listed non-budget stop), a comparison of
    spent + a bound (or ``.total``) with a budget, or a floor division of a budget (the
    steps a budget buys)."""
    bad = []
    for mod, f in modules_of(src).items():
        if mod == GUARD:
            continue
        rel = str(f.relative_to(src.parent))
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            where = f"{rel}:{getattr(node, 'lineno', 0)}"
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "would_exceed" and mod not in BUDGET_PRIMITIVES):
                bad.append(f"{where}: {mod} calls would_exceed: ask the BudgetGuard (fits / may_start)")
            elif (isinstance(node, ast.ExceptHandler) and node.type is not None
                  and _mentions(node.type, "budgetexceeded")):
                bad.append(f"{where}: {mod} catches BudgetExceededError: BudgetGuard.charge records the overrun")
            elif (isinstance(node, (ast.Assign, ast.AugAssign)) and mod not in OTHER_STOPS and any(
                    isinstance(t, ast.Attribute) and t.attr == "should_training_stop"
                    for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))):
                bad.append(f"{where}: {mod} sets should_training_stop: BudgetGuard.stop_after decides a budget stop")
            elif isinstance(node, ast.Compare) and mod not in BUDGET_PRIMITIVES and mod not in BUDGET_ORDERINGS \
                    and _orders_a_budget(node):
                bad.append(f"{where}: {mod} compares spent FLOPs with a budget: use BudgetGuard.fits or "
                           "race.accounting.guard.fits / reaches")
            elif (isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv) and _mentions(node.left, "budget")
                  and mod not in BUDGET_PRIMITIVES):
                bad.append(f"{where}: {mod} divides a budget into steps: use race.accounting.guard.steps_bought")
    return bad


def test_only_the_guard_decides_a_stop():
    bad = stop_deciders(SRC)
    assert not bad, "budget decisions outside race.accounting.guard:\n" + "\n".join(bad)


def test_the_stop_scan_catches_each_way_of_deciding_a_stop(tmp_path):
    pkg = package_dir(tmp_path, "engines")
    (pkg / "loop.py").write_text(
        "def run(ledger, bound, control, budget, step):\n"
        "    if ledger.would_exceed(bound):\n"
        "        control.should_training_stop = True\n"
        "    try:\n"
        "        ledger.add(1)\n"
        "    except BudgetExceededError:\n"
        "        pass\n"
        "    if ledger.total + bound > budget:\n"
        "        return budget // step\n")
    bad = "\n".join(stop_deciders(tmp_path))
    for line, what in ((2, "would_exceed"), (3, "should_training_stop"), (6, "BudgetExceededError"),
                       (8, "compares spent"), (9, "divides a budget")):
        assert f"race/engines/loop.py:{line}: race.engines.loop" in bad and what in bad, (line, what, bad)


#: Private names imported across modules, allowed (module -> names): none.
KNOWN_PRIVATE_IMPORTS: dict[str, set[str]] = {}


def private_imports(src: Path) -> list[str]:
    """One message per ``from race.x import _name`` (a single-underscore name of another
    module) not in :data:`KNOWN_PRIVATE_IMPORTS`."""
    mods = modules_of(src)
    bad = []
    for mod, f in mods.items():
        rel = str(f.relative_to(src.parent))
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = node.module or ""
            if node.level:
                pkg = mod.split(".") if f.name == "__init__.py" else mod.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([node.module] if node.module else []))
            if base.split(".")[0] != "race":
                continue
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__") and \
                        a.name not in KNOWN_PRIVATE_IMPORTS.get(mod, set()):
                    bad.append(f"{rel}:{node.lineno}: {mod} imports {base}.{a.name}: make it public or keep it "
                               "in its module")
    return bad


def test_no_cross_module_private_imports():
    bad = private_imports(SRC)
    assert not bad, "private names imported across modules:\n" + "\n".join(bad)


def test_the_private_import_scan_catches_one(tmp_path):
    pkg = package_dir(tmp_path, "report")
    (pkg / "kit.py").write_text("def _grid():\n    return 1\n")
    (pkg / "figs.py").write_text("from .kit import _grid\nfrom .kit import _grid as ok\n")
    found = [m.split(": ", 1)[0] for m in private_imports(tmp_path)]
    assert len(found) == 2 and all(w.endswith(f"race/report/figs.py:{i}") for w, i in zip(found, (1, 2))), found


def _private_members(tree: ast.AST) -> set[str]:
    """Single-underscore names a module defines on its classes and objects: methods
    (``def _x``), attributes it assigns on itself (``self._x = ...``, ``cls._x = ...``) and
    class-body attributes (``_x: T = PrivateAttr(...)``). Writing ``other._x = ...`` does not
    make a module the owner of ``_x``: that is a reach like any other."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            names.add(node.attr)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                targets = [item.target] if isinstance(item, ast.AnnAssign) else \
                    item.targets if isinstance(item, ast.Assign) else []
                names.update(t.id for t in targets if isinstance(t, ast.Name))
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _private_owners(src: Path) -> tuple[dict[str, Path], dict[str, ast.AST], dict[str, set[str]], dict[str, set[str]]]:
    """(modules, their parsed trees, each module's own private members, member -> the
    modules defining it): what the private-reach scans compare."""
    mods = modules_of(src)
    trees = {mod: ast.parse(f.read_text(), str(f)) for mod, f in mods.items()}
    own = {mod: _private_members(t) for mod, t in trees.items()}
    everywhere: dict[str, set[str]] = defaultdict(set)
    for mod, names in own.items():
        for n in names:
            everywhere[n].add(mod)
    return mods, trees, own, everywhere


def private_reaches(src: Path) -> list[str]:
    """One message per ``obj._name`` (obj not ``self``/``cls``) where ``_name`` is a private
    member defined by ANOTHER module of ``race`` and not by this one: reaching into another
    room's object. Third-party privates (``torch._C``, TRL's ``_generate_single_turn``) are
    names no race module defines, so they are not counted here."""
    mods, trees, own, everywhere = _private_owners(src)
    bad = []
    for mod, tree in trees.items():
        rel = str(mods[mod].relative_to(src.parent))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if node.attr in own[mod] or not everywhere.get(node.attr):
                continue
            bad.append(f"{rel}:{node.lineno}: {mod} reaches {node.attr} of an object of "
                       f"{', '.join(sorted(everywhere[node.attr]))}: make it public or ask its owner")
    return bad


def test_no_module_reaches_into_another_modules_objects():
    bad = private_reaches(SRC)
    assert not bad, "private members reached across modules:\n" + "\n".join(bad)


def test_the_private_reach_scan_catches_one(tmp_path):
    pkg = package_dir(tmp_path, "engines")
    (pkg / "engine.py").write_text("class E:\n    def _finish(self):\n        self._done = 1\n")
    (pkg / "gang.py").write_text("def leave(e):\n    e._finish()\n    return e._done, e._other\n\n\n"
                                 "def copy(e):\n    e._done = 2\n")
    found = sorted(m.split(": ", 1)[0] for m in private_reaches(tmp_path))
    assert len(found) == 3 and all(w.endswith(f"race/engines/gang.py:{i}") for w, i in zip(found, (2, 3, 7))), found


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


def _is_budget_check(node: ast.AST) -> bool:
    """``budget > 0`` (or ``<= 0``, ...): whether a number is a budget."""
    if not isinstance(node, ast.Compare):
        return False
    sides = [node.left, *node.comparators]
    return any(_mentions(x, "budget") for x in sides) and any(isinstance(x, ast.Constant) and x.value == 0
                                                              for x in sides)


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
            and _mentions(node.func.value, "reward"))


#: (what, the module that is its one home, a test of an AST node that restates it)
VOCABULARIES = [("whether a number is a budget (race.accounting.guard.is_budget)", GUARD, _is_budget_check),
                ("the per-step seed formula (race.tasks.step_seed)", "race.tasks.arith", _is_step_seed),
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
    assert "loop.py:9: race.engines.loop restates whether a number is a budget" in text
    assert len(bad) == 5 and "loop.py:2: race.engines.loop restates the per-step seed formula" in text
    assert "loop.py:5: race.engines.loop restates the phase list" in text
    assert "loop.py:13: race.engines.loop restates whether a reference is a path" in text
    assert "loop.py:13: race.engines.loop restates the reward-spec grammar" in text


# -- the engines' lifecycle: state declared, nothing set from outside -------------------------------
def _assigned_attributes(node: ast.AST) -> list[ast.Attribute]:
    """The attribute targets ``node`` assigns (plain, augmented, annotated; inside tuples)."""
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    else:
        return []
    out = []
    while targets:
        t = targets.pop()
        if isinstance(t, (ast.Tuple, ast.List)):
            targets.extend(t.elts)
        elif isinstance(t, ast.Starred):
            targets.append(t.value)
        elif isinstance(t, ast.Attribute):
            out.append(t)
    return out


def _on_self(t: ast.Attribute) -> bool:
    return isinstance(t.value, ast.Name) and t.value.id == "self"


#: Assignments to an attribute named like an engine's that are not on an engine, allowed
#: ((module, target) -> what it is): the scan goes by name, not type.
ENGINE_NAMESAKES = {("race.engines.gang.step", "w.executed"): "Work.executed: a gang step's record, not GangEngine's"}


def lifecycle_violations(src: Path) -> list[str]:
    """One message per way an engine's state escapes its declared lifecycle. An engine is a
    class named ``*Engine`` in ``race.engines``; its ``__init__`` declares every attribute
    it has (``self.x = ...`` or ``self.x: T``). (1) Another method of the class assigns
    ``self.<attr>`` that ``__init__`` does not declare (what ``setup()`` builds is returned as
    a state object, not set piece by piece). (2) Any module of ``race`` assigns an attribute
    named like an engine's declared one on anything but ``self`` (``member.ledger = ...``):
    an engine's attributes are set by its own methods only."""
    bad: list[str] = []
    declared_anywhere: dict[str, set[str]] = defaultdict(set)
    for mod, rel, node in walk_nodes(src):
        if not (mod.startswith("race.engines") and isinstance(node, ast.ClassDef) and node.name.endswith("Engine")):
            continue
        methods = [f for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        declared = {t.attr for f in methods if f.name == "__init__" for n in ast.walk(f)
                    for t in _assigned_attributes(n) if _on_self(t)}
        for a in declared:
            declared_anywhere[a].add(node.name)
        for f in methods:
            if f.name == "__init__":
                continue
            for n in ast.walk(f):
                for t in _assigned_attributes(n):
                    if _on_self(t) and t.attr not in declared:
                        bad.append(f"{rel}:{n.lineno}: {node.name}.{f.name} sets self.{t.attr}, which "
                                   f"{node.name}.__init__ does not declare: declare it there, or return it "
                                   "from setup() in the run's state")
    for mod, rel, node in walk_nodes(src):
        for t in _assigned_attributes(node):
            if not _on_self(t) and t.attr in declared_anywhere and (mod, ast.unparse(t)) not in ENGINE_NAMESAKES:
                bad.append(f"{rel}:{node.lineno}: {mod} sets {ast.unparse(t)}, an attribute of "
                           f"{'/'.join(sorted(declared_anywhere[t.attr]))}, from outside: call the engine's own "
                           "method instead")
    return bad


def test_engines_declare_their_state_and_nothing_sets_it_from_outside():
    bad = lifecycle_violations(SRC)
    assert not bad, "\n".join(bad)
    engines = {node.name for mod, _, node in walk_nodes(SRC)
               if mod.startswith("race.engines") and isinstance(node, ast.ClassDef) and node.name.endswith("Engine")}
    assert engines >= {"BuiltinEngine", "GangEngine", "TrlEngine"}  # the scan saw every engine (and the Protocol)


def test_the_lifecycle_scan_catches_state_set_late_and_from_outside(tmp_path):
    """The pattern this rule replaced: a setup method that sets the models on ``self``, a
    run that opens its ledger late, and a gang that sets a member's ledger."""
    pkg = package_dir(tmp_path, "engines")
    (pkg / "loop.py").write_text(
        "class LoopEngine:\n"
        "    def __init__(self, cfg):\n"
        "        self.cfg = cfg\n"
        "        self.ledger: object\n"
        "        self.steps = 0\n\n"
        "    def _setup(self):\n"
        "        self.model, self.tok = load(self.cfg)\n\n"
        "    def run(self):\n"
        "        self.ledger = open_ledger()\n"
        "        self.steps += 1\n"
        "        self.total: int = 3\n\n\n"
        "class Helper:\n"
        "    def go(self):\n"
        "        self.anything = 1\n")
    (pkg / "gang.py").write_text("def restore(members):\n    for e in members:\n        e.ledger = None\n"
                                 "        e.cfg.seed, x = 1, 2\n")
    bad = lifecycle_violations(tmp_path)
    text = "\n".join(bad)
    assert len(bad) == 4, text  # model, tok, total, e.ledger
    assert "race/engines/loop.py:8: LoopEngine._setup sets self.model, which LoopEngine.__init__ does not" in text
    assert "race/engines/loop.py:8: LoopEngine._setup sets self.tok" in text
    assert "race/engines/loop.py:13: LoopEngine.run sets self.total" in text
    assert "race/engines/gang.py:3: race.engines.gang sets e.ledger, an attribute of LoopEngine, from outside" in text
    assert "race/engines/gang.py:4: race.engines.gang sets e.cfg.seed" not in text  # .seed is no engine attribute
    assert "race/engines/gang.py:4: race.engines.gang sets e.cfg, an attribute of LoopEngine" not in text


# -- s4-23s: only the guard decides a stop or bounds a step ------------------------------------------
#: The package that owns every budget decision and every step bound (race.accounting.guard and
#: the formulas it takes: race.accounting.trl_step's bounds call its step_bound).
ACCOUNTING = "race.accounting"


def _call_name(node: ast.AST) -> str:
    f = node.func if isinstance(node, ast.Call) else None
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def budget_asks(src: Path) -> list[str]:
    """One message per place outside ``race.accounting`` that decides against a budget or
    assembles a step's bound itself: a call of ``fits`` (``guard.fits(...)`` or the free
    function: whatever its result decides, a refusal, a stop, a prefix's budget, is the
    guard's: ``check_first_step``, ``may_start``, ``stops_before``), or a sum with a bound
    (a call of ``reward_bound``, ``bound`` or ``*_bound``) as an operand (``step_bound`` /
    ``plan_step_bound`` add the policy's and the reward's)."""
    bad = []
    for mod, rel, node in walk_nodes(src):
        if mod == ACCOUNTING or mod.startswith(ACCOUNTING + "."):
            continue
        where = f"{rel}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Call) and _call_name(node) == "fits":
            bad.append(f"{where}: {mod} calls fits: the guard decides (check_first_step, may_start, stops_before)")
        elif isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.Add):
            sides = [node.left, node.right] if isinstance(node, ast.BinOp) else [node.target, node.value]
            names = [_call_name(s) for s in sides]
            if any(n == "bound" or n.endswith("_bound") for n in names):
                bad.append(f"{where}: {mod} adds a bound to a bound: race.accounting.guard.step_bound assembles a "
                           "step's bound")
    return bad


def test_only_the_guard_asks_whether_flops_fit_and_assembles_a_step_bound():
    bad = budget_asks(SRC)
    assert not bad, "budget decisions or step bounds outside race.accounting:\n" + "\n".join(bad)


def test_the_budget_ask_scan_catches_a_fits_decision_and_a_hand_made_bound(tmp_path):
    """The patterns this rule replaced: the TRL callback's own "smaller than one step"
    refusal on ``guard.fits``, the prefix stop on ``fits``, and an engine's bound summed by
    hand; the guard's own calls (in race.accounting) are not flagged."""
    pkg = package_dir(tmp_path, "engines")
    (pkg / "loop.py").write_text(
        "def begin(self, bound, ledger, b, plan, reward):\n"
        "    if not self.guard.fits(bound):\n"
        "        raise ValueError('smaller than one step')\n"
        "    done = fits(ledger.total, bound, b)\n"
        "    total = plan.bound(4, 10, 12) + reward_bound(reward, 16, 10, 12)\n"
        "    total += trl_batch_bound(plan)\n"
        "    return total + 1, self.guard.may_start(bound)\n")
    acc = package_dir(tmp_path, "accounting")
    (acc / "guard.py").write_text("def stops_before(budget, spent, bound):\n    return not fits(spent, bound, budget)\n"
                                  "def step_bound(p, r, n, P, T):\n    return int(p) + r(n, P, T)\n")
    bad = budget_asks(tmp_path)
    text = "\n".join(bad)
    assert len(bad) == 4, text
    for line, what in ((2, "calls fits"), (4, "calls fits"), (5, "adds a bound"), (6, "adds a bound")):
        assert f"race/engines/loop.py:{line}: race.engines.loop {what}" in text, (line, what, text)


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


def test_the_stop_scan_catches_a_floor_that_reaches_the_budget(tmp_path):
    """The variant issue 37 names (the TRL engine's dataset had it): a batch floor compared
    with the run's budget without a sum or a ``.total``; a budget checked against 0 or two
    budgets' lists are not this rule's."""
    pkg = package_dir(tmp_path, "engines")
    (pkg / "data.py").write_text("def build(cfg, floor, budgets, self):\n"
                                 "    if floor >= cfg.budget_flops:\n"
                                 "        return cfg.budget_flops < self.bound\n"
                                 "    return len(budgets) >= 2 or cfg.budget_flops > 0\n")
    bad = stop_deciders(tmp_path)
    assert len(bad) == 2, bad
    assert "data.py:2: race.engines.data compares spent FLOPs with a budget" in bad[0]
    assert "data.py:3: race.engines.data compares spent FLOPs with a budget" in bad[1]


def private_string_reaches(src: Path) -> list[str]:
    """One message per ``getattr`` / ``hasattr`` / ``setattr`` / ``delattr`` whose name is a
    string constant naming a private member defined by ANOTHER module of ``race`` (and not
    by this one): :func:`private_reaches` through a string."""
    mods, trees, own, everywhere = _private_owners(src)
    bad = []
    for mod, tree in trees.items():
        rel = str(mods[mod].relative_to(src.parent))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr", "setattr", "delattr") and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
                continue
            name = node.args[1].value
            if not name.startswith("_") or name.startswith("__") or name in own[mod] or not everywhere.get(name):
                continue
            bad.append(f"{rel}:{node.lineno}: {mod} reaches {name} of an object of "
                       f"{', '.join(sorted(everywhere[name]))} through {node.func.id}: make it public")
    return bad


def test_no_module_reaches_a_private_member_through_a_string():
    bad = private_string_reaches(SRC)
    assert not bad, "private members reached through getattr & co:\n" + "\n".join(bad)


def test_the_private_string_scan_catches_one(tmp_path):
    pkg = package_dir(tmp_path, "engines")
    (pkg / "reward.py").write_text("class R:\n    def score(self):\n        self._calls = 1\n")
    (pkg / "run.py").write_text("def meta(r):\n    return getattr(r, '_calls', 0), hasattr(r, 'calls'), "
                                "getattr(r, '_nobody', 0)\n\n\ndef reset(r):\n    setattr(r, '_calls', 0)\n")
    found = sorted(m.split(": ", 1)[0] for m in private_string_reaches(tmp_path))
    assert len(found) == 2 and all(w.endswith(f"race/engines/run.py:{i}") for w, i in zip(found, (2, 6))), found


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
    bad = script_loaders(Path(__file__).resolve().parent)
    assert not bad, "\n".join(bad)


def test_the_script_loader_scan_catches_one(tmp_path):
    (tmp_path / "bench").mkdir()
    (tmp_path / "conftest.py").write_text("import importlib.util\nimportlib.util.spec_from_file_location('a', 'b')\n")
    (tmp_path / "bench" / "test_x.py").write_text("import importlib.util\n\n\ndef mod():\n"
                                                 "    return importlib.util.spec_from_file_location('x', 'x.py')\n")
    bad = script_loaders(tmp_path)
    assert len(bad) == 1 and bad[0].startswith("tests/bench/test_x.py:5:"), bad


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


# -- one cost context: no function takes shape, lora and conventions loose ----------------------------
#: Where the three are taken apart: the per-pass formulas over the model's matrices.
PER_MATRIX_FORMULAS = {"race.accounting.passes"}
LOOSE_COST = {"shape", "lora", "conventions"}


def flagged(src: Path, message) -> list[str]:
    """``file:line: text`` for every AST node of ``src`` for which ``message(module, node)``
    returns a text (the node breaks a rule), in file order."""
    return [f"{rel}:{node.lineno}: {text}" for mod, rel, node in walk_nodes(src)
            if (text := message(mod, node)) is not None]


def _loose_cost(mod: str, node: ast.AST) -> str | None:
    if mod in PER_MATRIX_FORMULAS or not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    a = node.args
    if LOOSE_COST <= {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)}:
        return (f"{mod}.{node.name} takes shape, lora and conventions loose: take a PolicyCost "
                "(race.accounting.policy) or a StepPlan")
    return None


def loose_cost_contexts(src: Path) -> list[str]:
    """One message per function outside :data:`PER_MATRIX_FORMULAS` whose parameters
    include ``shape``, ``lora`` and ``conventions`` (in any position or kind): those travel
    together as a ``race.accounting.PolicyCost`` (or the ``StepPlan`` holding one)."""
    return flagged(src, _loose_cost)


def test_no_function_takes_the_cost_context_loose():
    assert not (bad := loose_cost_contexts(SRC)), "\n".join(bad)


def test_the_cost_context_scan_catches_loose_parameters_in_any_kind(tmp_path):
    pkg = package_dir(tmp_path, "accounting")
    (pkg / "passes.py").write_text("def forward_components(shape, work, *, lora=None, conventions=None):\n"
                                   "    return {}\n")
    (pkg / "trl_step.py").write_text(
        "def bound(plan, shape, *, lora, conventions):\n    return 0\n\n\n"
        "class Meter:\n    def __init__(self, shape, lora, conventions='race'):\n        pass\n\n\n"
        "def ok(plan, policy, *, conventions=None):\n    return 0\n")
    bad = loose_cost_contexts(tmp_path)
    assert len(bad) == 2, bad  # the formula module is allowed; a function with two of the three is not flagged
    assert "trl_step.py:1: race.accounting.trl_step.bound takes shape, lora and conventions loose" in bad[0]
    assert "trl_step.py:6: race.accounting.trl_step.__init__ takes" in bad[1]


# -- composers drive engines through their lifecycle, not their insides ------------------------------
#: The package that composes engines: every module of the gang (its run loop, its batched step
#: and the step's parts) drives its members through ``race.engines.EngineLifecycle`` and
#: ``race.engines.StepMember`` only.
COMPOSER = "race.engines.gang"
#: What an engine holds that its protocols do not declare (its state, books, run-directory
#: writer, evaluation schedule, progress callback): a composer reads none of these, whole or in
#: part (``test_engine_insides_are_what_the_protocols_leave_out`` derives the set).
ENGINE_INSIDES = {"state", "books", "out", "schedule", "progress"}


def _engine_reach(mod: str, node: ast.AST) -> str | None:
    if not (mod == COMPOSER or mod.startswith(COMPOSER + ".")) or not isinstance(node, ast.Attribute):
        return None
    if node.attr in ENGINE_INSIDES:
        return (f"{mod} reaches {ast.unparse(node)}: use the engine's lifecycle and step stages "
                "(race.engines.EngineLifecycle, race.engines.StepMember)")
    if isinstance(node.value, ast.Attribute) and node.value.attr == "cfg":
        return (f"{mod} reads {ast.unparse(node)}, a member's setting: ask the member's step stages "
                "(race.engines.StepMember) or read the gang's own configs")
    return None


def engine_reaches(src: Path) -> list[str]:
    """One message per ``x.<inside>`` in a composer (whole or in a chain), ``<inside>`` one
    of an engine's :data:`ENGINE_INSIDES`, and per ``x.cfg.<setting>`` (a member's settings
    read past its interface): a composer asks the engine through ``race.engines.EngineLifecycle``
    and ``race.engines.StepMember`` instead."""
    return flagged(src, _engine_reach)


def test_the_gang_drives_its_members_through_the_lifecycle():
    assert not (bad := engine_reaches(SRC)), "\n".join(bad)
    gang = {mod for mod in modules_of(SRC) if mod.startswith(COMPOSER + ".")}
    assert {"race.engines.gang.engine", "race.engines.gang.step", "race.engines.gang.checkpoint"} <= gang


def test_the_engine_reach_scan_catches_a_chain(tmp_path):
    """A chain in the run loop and in any other gang module, a member's state handed out
    whole and a member's setting read through its config are caught; the step stages, a
    local named like an inside and an engine reading its own state are not."""
    pkg = package_dir(tmp_path, "engines")
    (pkg / "gang").mkdir()
    (pkg / "gang" / "__init__.py").write_text("")
    (pkg / "gang" / "engine.py").write_text("def step(e, bound):\n"
                                            "    return e.books.guard.may_start(bound), e.may_step(0, bound)\n")
    (pkg / "gang" / "step.py").write_text("def roll(w, step, save, state):\n"
                                          "    m = w.eng.state.model\n"
                                          "    t = w.member.cfg.temperature\n"
                                          "    save(w.member.state)\n"
                                          "    a = w.member.start_rollout(step)\n"
                                          "    return m, t, a.group, w.member.model, state['step']\n")
    (pkg / "builtin.py").write_text("class BuiltinEngine:\n    def rollout(self):\n        return self.state.model, "
                                    "self.cfg.temperature\n")
    bad = engine_reaches(tmp_path)
    text = "\n".join(bad)
    assert len(bad) == 4, text
    assert "gang/engine.py:2: race.engines.gang.engine reaches e.books:" in text
    assert "gang/step.py:2: race.engines.gang.step reaches w.eng.state:" in text
    assert "gang/step.py:3: race.engines.gang.step reads w.member.cfg.temperature, a member's setting" in text
    assert "gang/step.py:4: race.engines.gang.step reaches w.member.state:" in text


def test_engine_insides_are_what_the_protocols_leave_out():
    """:data:`ENGINE_INSIDES` is what ``BuiltinEngine.__init__`` declares (public) less what
    ``EngineLifecycle`` and ``StepMember`` declare: a new attribute of the engine is an inside
    until a protocol declares it."""
    declared: set[str] = set()
    for node in ast.walk(ast.parse((SRC / "race" / "engines" / "__init__.py").read_text())):
        if isinstance(node, ast.ClassDef) and node.name in ("EngineLifecycle", "StepMember"):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    declared.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    declared.add(item.target.id)
    assert {"cfg", "run_dir", "model", "start_rollout", "charge", "write_checkpoint"} <= declared
    engine = ast.parse((SRC / "race" / "engines" / "builtin" / "engine.py").read_text())
    init = next(f for c in engine.body if isinstance(c, ast.ClassDef) and c.name == "BuiltinEngine"
                for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    held = {t.attr for n in ast.walk(init) for t in _assigned_attributes(n) if _on_self(t)}
    assert ENGINE_INSIDES == {a for a in held - declared if not a.startswith("_")}


def test_the_builtin_engine_implements_the_lifecycle():
    """Every stage ``race.engines.EngineLifecycle`` and ``race.engines.StepMember`` declare
    is a member of BuiltinEngine, with the declared parameters (a property where declared one)."""
    import inspect

    sys.path.insert(0, str(SRC))
    from race.engines import EngineLifecycle
    from race.engines.builtin import BuiltinEngine

    from race.engines import StepMember

    stages = {(P, n) for P in (EngineLifecycle, StepMember) for n in vars(P) if not n.startswith("_")}
    stages -= {(EngineLifecycle, "cfg"), (EngineLifecycle, "run_dir")}
    names = {n for _, n in stages}
    assert {"prepare", "begin", "resume_from", "may_step", "save_meta", "checkpoint", "finish"} <= names
    assert {"start_rollout", "score", "may_continue", "update_plan", "start_update", "optimizer_step",
            "charge"} <= names
    for P, n in stages:
        want, got = getattr(P, n), getattr(BuiltinEngine, n, None)
        assert got is not None, f"BuiltinEngine lacks {n}"
        assert isinstance(want, property) == isinstance(got, property), n
        if callable(want) and not isinstance(want, property):
            assert list(inspect.signature(got).parameters) == list(inspect.signature(want).parameters), n
