"""One owner per budget decision: ``race.accounting.guard`` decides every budget stop, says
whether FLOPs fit, how many steps a budget buys and whether a number is a budget; the engines
and the planner ask it.

A budget is recognised by its type or by a call into the guard, never by a variable's
spelling (a ``budget`` that is a list of budgets, a ``len(budgets) // 2`` or a cell's
``c.budget`` read beside another budget decide nothing): a class field annotated
``BudgetField`` (``race.spec.run``: a float validated by ``check_budget``; ``RunConfig.budget_flops``,
``FlopsQuery.budget``), an attribute its class sets from ``check_budget(...)``
(``FlopLedger.budget``), a parameter annotated ``BudgetField``, or a name the function binds
from, or hands to, ``check_budget`` / ``is_budget``; an object's class is read from its
annotation, its constructor call (``x = RunConfig(...)``) or its class's own declarations
(``self.cfg`` of a class whose ``__init__`` takes ``cfg: RunConfig``). ``fits`` is the guard's
when it is imported from ``race.accounting.guard`` or called on a ``BudgetGuard``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from .declared import Types
from .scan import SRC, call_name, import_base, mentions, package_dir

#: The module that decides every budget stop, and the ledger whose primitives it uses.
GUARD = "race.accounting.guard"
BUDGET_PRIMITIVES = {GUARD, "race.accounting.ledger"}
#: Stops that are not budget stops (module -> why), allowed to set ``should_training_stop``.
OTHER_STOPS = {"race.engines.trl.run_callback": "a diverged run (non-finite loss) stops, keeping its last checkpoint"}
#: Orderings of a run's budget that decide nothing about FLOPs (module -> why).
BUDGET_ORDERINGS = {"race.spec.run": "eval.at_budgets: a smaller budget against the run's (two budgets, no FLOPs)",
                    "race.engines.common": "an extension: the shorter run's budget against the run's (two budgets)"}
#: The package that owns every budget decision and every step bound (race.accounting.guard and
#: the formulas it takes: race.accounting.trl_step's bounds call its step_bound).
ACCOUNTING = "race.accounting"
#: The guard's object: ``fits`` called on one is the guard's question.
GUARD_TYPE = "BudgetGuard"


# -- only the guard decides a stop ------------------------------------------------------------------
def _orders_a_budget(node: ast.Compare, budget) -> bool:
    """``x < budget``, ``floor >= cfg.budget_flops``, ``spent + b > self.budget``, ...: an
    ordering (<, <=, >, >=) with a budget on one side and a number that is not a constant on
    the other (``budget > 0`` is :func:`budget_checks`'s)."""
    sides = [node.left, *node.comparators]
    if not any(isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)) for op in node.ops):
        return False
    return any(budget(s) for s in sides) and not any(isinstance(s, ast.Constant) for s in sides)


def stop_deciders(src: Path) -> list[str]:
    """One message per place outside ``race.accounting.guard`` that decides a budget stop
    itself: a ``would_exceed`` call, an ``except BudgetExceededError``, an assignment of
    ``should_training_stop`` (other than a listed non-budget stop), an ordering of a budget
    (by type: module docstring) against a number, or a floor division of a budget (the steps
    a budget buys)."""
    types, bad = Types(src), []
    for mod, f in types.files.items():
        if mod == GUARD:
            continue
        rel = str(f.relative_to(src.parent))
        for node, env, names in types.nodes(mod):
            where = f"{rel}:{getattr(node, 'lineno', 0)}"

            def budget(x: ast.AST) -> bool:
                return types.is_budget(x, env, names)

            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "would_exceed" and mod not in BUDGET_PRIMITIVES):
                bad.append(f"{where}: {mod} calls would_exceed: ask the BudgetGuard (fits / may_start)")
            elif (isinstance(node, ast.ExceptHandler) and node.type is not None
                  and mentions(node.type, "budgetexceeded")):
                bad.append(f"{where}: {mod} catches BudgetExceededError: BudgetGuard.charge records the overrun")
            elif (isinstance(node, (ast.Assign, ast.AugAssign)) and mod not in OTHER_STOPS and any(
                    isinstance(t, ast.Attribute) and t.attr == "should_training_stop"
                    for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))):
                bad.append(f"{where}: {mod} sets should_training_stop: BudgetGuard.stop_after decides a budget stop")
            elif isinstance(node, ast.Compare) and mod not in BUDGET_PRIMITIVES and mod not in BUDGET_ORDERINGS \
                    and _orders_a_budget(node, budget):
                bad.append(f"{where}: {mod} compares spent FLOPs with a budget: use BudgetGuard.fits or "
                           "race.accounting.guard.fits / reaches")
            elif (isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv) and mod not in BUDGET_PRIMITIVES
                  and any(budget(x) for x in ast.walk(node.left))):
                bad.append(f"{where}: {mod} divides a budget into steps: use race.accounting.guard.steps_bought")
    return sorted(bad, key=_file_line)


def _file_line(message: str) -> tuple[str, int]:
    where = message.split(": ", 1)[0]
    return where.rsplit(":", 1)[0], int(where.rsplit(":", 1)[1])


def test_only_the_guard_decides_a_stop():
    bad = stop_deciders(SRC)
    assert not bad, "budget decisions outside race.accounting.guard:\n" + "\n".join(bad)


def test_the_stop_scan_catches_each_way_of_deciding_a_stop(tmp_path):
    pkg = package_dir(tmp_path, "engines")
    (pkg / "loop.py").write_text(
        "def run(ledger, bound, control, budget: BudgetField, step):\n"
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


def _run_config(tmp_path: Path) -> None:
    """A ``race.spec.run`` whose RunConfig declares its budget by type, as the real one does."""
    spec = package_dir(tmp_path, "spec")
    (spec / "run.py").write_text("class RunConfig:\n    budget_flops: BudgetField\n    seed: int = 0\n")


def test_the_stop_scan_catches_a_floor_that_reaches_the_budget(tmp_path):
    """The variant issue 37 names (the TRL engine's dataset had it): a batch floor compared
    with the run's budget without a sum or a ``.total``; a budget checked against 0 or two
    budgets' lists are not this rule's."""
    _run_config(tmp_path)
    pkg = package_dir(tmp_path, "engines")
    (pkg / "data.py").write_text("def build(cfg: RunConfig, floor, budgets, self):\n"
                                 "    if floor >= cfg.budget_flops:\n"
                                 "        return cfg.budget_flops < self.bound\n"
                                 "    return len(budgets) >= 2 or cfg.budget_flops > 0\n")
    bad = stop_deciders(tmp_path)
    assert len(bad) == 2, bad
    assert "data.py:2: race.engines.data compares spent FLOPs with a budget" in bad[0]
    assert "data.py:3: race.engines.data compares spent FLOPs with a budget" in bad[1]


def test_the_stop_scan_reads_a_budget_by_its_type_not_its_name(tmp_path):
    """A budget the scan sees through its class (an engine's ``self.cfg``, a local taken from
    it, a ledger's validated ``budget``) or through the guard's validator, whatever it is
    called; names that only look like a budget (a list's length, a cell's ``budget`` beside
    another budget, a parameter called ``budget`` with no type) decide nothing."""
    _run_config(tmp_path)
    acc = package_dir(tmp_path, "accounting")
    (acc / "ledger.py").write_text("class FlopLedger:\n    def __init__(self, budget):\n"
                                   "        self.budget = check_budget(budget)\n")
    pkg = package_dir(tmp_path, "engines")
    (pkg / "loop.py").write_text(
        "class Loop:\n"
        "    def __init__(self, cfg: RunConfig, ledger: FlopLedger):\n"
        "        self.cfg, self.ledger = cfg, ledger\n"
        "        self.conf = cfg\n\n"
        "    def steps(self, step_flops, cap_in):\n"
        "        cfg = self.conf\n"
        "        cap = check_budget(cap_in)\n"
        "        return cfg.budget_flops // step_flops, self.ledger.total > self.ledger.budget, cap <= step_flops\n\n\n"
        "def plan(budgets, c, prev, budget):\n"
        "    return len(budgets) // 2, c.budget <= prev.budget * 2, budget > prev\n")
    bad = stop_deciders(tmp_path)
    assert [m.split(": ", 1)[0].rsplit(":", 1)[1] for m in bad] == ["9", "9", "9"], bad
    assert sum("divides a budget" in m for m in bad) == 1 and sum("compares spent" in m for m in bad) == 2


# -- whether a number is a budget -------------------------------------------------------------------
def budget_checks(src: Path) -> list[str]:
    """One message per comparison of a budget (by type: module docstring) with 0 outside
    ``race.accounting.guard``: whether a number is a budget is ``race.accounting.guard.is_budget``'s
    (``check_budget`` refuses one that is not)."""
    types, bad = Types(src), []
    for mod, f in types.files.items():
        if mod == GUARD:
            continue
        rel = str(f.relative_to(src.parent))
        for node, env, names in types.nodes(mod):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            if any(types.is_budget(x, env, names) for x in sides) and \
                    any(isinstance(x, ast.Constant) and x.value == 0 for x in sides):
                bad.append(f"{rel}:{node.lineno}: {mod} restates whether a number is a budget "
                           f"(race.accounting.guard.is_budget): import it from {GUARD}")
    return sorted(bad, key=_file_line)


def test_whether_a_number_is_a_budget_has_one_home():
    bad = budget_checks(SRC)
    assert not bad, "\n".join(bad)


def test_the_budget_check_scan_catches_a_typed_budget_checked_against_zero(tmp_path):
    _run_config(tmp_path)
    pkg = package_dir(tmp_path, "engines")
    (pkg / "loop.py").write_text("def ok(budget: BudgetField, n, cfg: RunConfig):\n"
                                 "    return budget > 0, n > 0, cfg.budget_flops <= 0, cfg.seed == 0\n\n\n"
                                 "def cap(x, budget):\n    c = check_budget(x)\n    return c <= 0, budget > 0\n")
    bad = budget_checks(tmp_path)
    assert len(bad) == 3, bad
    assert all("restates whether a number is a budget" in b for b in bad)
    assert [b.split(": ", 1)[0].rsplit(":", 1)[1] for b in bad] == ["2", "2", "7"]


# -- only the guard asks whether FLOPs fit and assembles a step's bound -----------------------------
def _imported(mod: str, f: Path, tree: ast.AST) -> dict[str, str]:
    """Local name -> what it is bound to by the module's imports (``from race.accounting.guard
    import fits``: fits -> race.accounting.guard.fits; ``from race.accounting import guard as g``:
    g -> race.accounting.guard)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = import_base(mod, f, node)
            out.update((a.asname or a.name, f"{base}.{a.name}") for a in node.names)
        elif isinstance(node, ast.Import):
            out.update((a.asname, a.name) if a.asname else (a.name.split(".")[0], a.name.split(".")[0])
                       for a in node.names)
    return out


def _asks_the_guard(node: ast.Call, imported: dict[str, str], types: Types, env: dict[str, str]) -> bool:
    """Whether ``node`` calls the guard's ``fits``: the function imported from
    ``race.accounting.guard`` (by any local name, or through the module), or
    ``BudgetGuard.fits`` on an object the source types as one."""
    f = node.func
    if isinstance(f, ast.Name):
        return imported.get(f.id) == f"{GUARD}.fits"
    if not (isinstance(f, ast.Attribute) and f.attr == "fits"):
        return False
    if isinstance(f.value, ast.Name) and imported.get(f.value.id) == GUARD:
        return True
    return types.type_of(f.value, env) == GUARD_TYPE


def budget_asks(src: Path) -> list[str]:
    """One message per place outside ``race.accounting`` that decides against a budget or
    assembles a step's bound itself: a call of the guard's ``fits`` (the free function or
    ``BudgetGuard.fits``, by import and type: whatever its result decides, a refusal, a stop,
    a prefix's budget, is the guard's: ``check_first_step``, ``may_start``, ``stops_before``),
    or a sum with a bound (a call of ``reward_bound``, ``bound`` or ``*_bound``) as an
    operand (``step_bound`` / ``plan_step_bound`` add the policy's and the reward's)."""
    types, bad = Types(src), []
    for mod, f in types.files.items():
        if mod == ACCOUNTING or mod.startswith(ACCOUNTING + "."):
            continue
        rel = str(f.relative_to(src.parent))
        imported = _imported(mod, f, types.trees[mod])
        for node, env, _ in types.nodes(mod):
            where = f"{rel}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Call) and _asks_the_guard(node, imported, types, env):
                bad.append(f"{where}: {mod} calls fits: the guard decides (check_first_step, may_start, stops_before)")
            elif isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.Add):
                sides = [node.left, node.right] if isinstance(node, ast.BinOp) else [node.target, node.value]
                names = [call_name(s) for s in sides]
                if any(n == "bound" or n.endswith("_bound") for n in names):
                    bad.append(f"{where}: {mod} adds a bound to a bound: race.accounting.guard.step_bound assembles "
                               "a step's bound")
    return sorted(bad, key=_file_line)


def test_only_the_guard_asks_whether_flops_fit_and_assembles_a_step_bound():
    bad = budget_asks(SRC)
    assert not bad, "budget decisions or step bounds outside race.accounting:\n" + "\n".join(bad)


def test_the_budget_ask_scan_catches_a_fits_decision_and_a_hand_made_bound(tmp_path):
    """The patterns this rule replaced: the TRL callback's own "smaller than one step"
    refusal on ``guard.fits``, the prefix stop on ``fits``, and an engine's bound summed by
    hand; the guard's own calls (in race.accounting) are not flagged, nor is a ``fits`` that
    is not the guard's (a racing schedule's ``fits()``: whether its cost fits a cap)."""
    pkg = package_dir(tmp_path, "engines")
    (pkg / "loop.py").write_text(
        "from race.accounting.guard import BudgetGuard, fits\n"
        "from race.accounting import guard as g\n\n\n"
        "class Loop:\n"
        "    def __init__(self, ledger):\n"
        "        self.guard = BudgetGuard(ledger)\n\n"
        "    def begin(self, bound, ledger, b, plan, reward, schedule):\n"
        "        if not self.guard.fits(bound):\n"
        "            raise ValueError('smaller than one step')\n"
        "        done = fits(ledger.total, bound, b), g.fits(0, bound, b)\n"
        "        total = plan.bound(4, 10, 12) + reward_bound(reward, 16, 10, 12)\n"
        "        total += trl_batch_bound(plan)\n"
        "        return total + 1, self.guard.may_start(bound), schedule.fits()\n")
    acc = package_dir(tmp_path, "accounting")
    (acc / "guard.py").write_text("def stops_before(budget, spent, bound):\n    return not fits(spent, bound, budget)\n"
                                  "def step_bound(p, r, n, P, T):\n    return int(p) + r(n, P, T)\n\n\n"
                                  "class BudgetGuard:\n    def fits(self, flops):\n        return fits(0, flops, None)\n")
    bad = budget_asks(tmp_path)
    text = "\n".join(bad)
    assert len(bad) == 5, text
    for line, what in ((10, "calls fits"), (12, "calls fits"), (13, "adds a bound"), (14, "adds a bound")):
        assert f"race/engines/loop.py:{line}: race.engines.loop {what}" in text, (line, what, text)
    assert sum("loop.py:12:" in m for m in bad) == 2 and "loop.py:15:" not in text
