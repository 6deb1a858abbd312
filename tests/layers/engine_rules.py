"""The engines' lifecycle: an engine declares its state in ``__init__`` and nothing sets it
from outside; the gang drives its members through the declared interface only; the cost
context (shape, LoRA, conventions) travels as one value."""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

from .scan import SRC, flagged, imports_of, modules_of, package_dir, walk_nodes

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
#: ((module, target) -> what it is): inside the modules that can hold an engine
#: (:func:`engine_holders`) the scan goes by the attribute's name, not the object's type.
ENGINE_NAMESAKES = {("race.engines.gang.step", "w.executed"): "Work.executed: a gang step's record, not GangEngine's"}


#: The package whose objects are engines (and whose importers are the only other modules that can hold one).
ENGINES = "race.engines"


def engine_holders(src: Path) -> set[str]:
    """The modules that can hold an engine: those of ``race.engines`` and those that import
    from it (the floors keep every other module from reaching one: an object there with an
    attribute named like an engine's is not an engine, e.g. a racing design's ``schedule``)."""
    return {m for m in modules_of(src) if m == ENGINES or m.startswith(ENGINES + ".")} | {
        i.module for i in imports_of(src) if i.target == ENGINES or i.target.startswith(ENGINES + ".")}


def lifecycle_violations(src: Path) -> list[str]:
    """One message per way an engine's state escapes its declared lifecycle. An engine is a
    class named ``*Engine`` in ``race.engines``; its ``__init__`` declares every attribute
    it has (``self.x = ...`` or ``self.x: T``). (1) Another method of the class assigns
    ``self.<attr>`` that ``__init__`` does not declare (what ``setup()`` builds is returned as
    a state object, not set piece by piece). (2) A module that can hold an engine
    (:func:`engine_holders`) assigns an attribute named like an engine's declared one on
    anything but ``self`` (``member.ledger = ...``): an engine's attributes are set by its own
    methods only."""
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
    holders = engine_holders(src)
    for mod, rel, node in walk_nodes(src):
        if mod not in holders:
            continue
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


def test_the_lifecycle_scan_reads_namesakes_only_where_an_engine_can_be(tmp_path):
    """An attribute named like an engine's, set from a module that cannot hold an engine (it
    imports nothing of race.engines: a design's ``out.ledger``), is no engine's; set from a
    module that imports an engine, it is."""
    pkg = package_dir(tmp_path, "engines")
    (pkg / "loop.py").write_text("class LoopEngine:\n    def __init__(self, cfg):\n        self.ledger = cfg\n")
    (package_dir(tmp_path, "analysis") / "design.py").write_text("def f(out):\n    out.ledger = 1\n")
    (package_dir(tmp_path, "grid") / "run.py").write_text("from race.engines import loop\n\n\ndef g(e):\n"
                                                          "    e.ledger = 2\n")
    bad = lifecycle_violations(tmp_path)
    assert len(bad) == 1 and bad[0].endswith("race/grid/run.py:5: race.grid.run sets e.ledger, an attribute of "
                                             "LoopEngine, from outside: call the engine's own method instead"), bad


# -- one cost context: no function takes shape, lora and conventions loose ----------------------------
#: Where the three are taken apart: the per-pass formulas over the model's matrices.
PER_MATRIX_FORMULAS = {"race.accounting.passes"}
LOOSE_COST = {"shape", "lora", "conventions"}


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
