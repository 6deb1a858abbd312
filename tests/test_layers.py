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

The rules beyond imports (one owner per budget decision, private names, one home per
vocabulary, one parser per thing, the engines' lifecycle) live in ``tests/layers/``, one file
per family, and are collected here.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from layers.scan import ROOT, SRC, Import, imports_of, modules_of, package_dir, package_of, walk_nodes

# the other rules, one file per family (tests/layers/): collected here, so this file runs every rule
from layers.budget_rules import *  # noqa: E402,F401,F403
from layers.engine_rules import *  # noqa: E402,F401,F403
from layers.home_rules import *  # noqa: E402,F401,F403
from layers.private_rules import *  # noqa: E402,F401,F403
from layers.vocabulary_rules import *  # noqa: E402,F401,F403

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
