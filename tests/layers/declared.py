"""What the source declares about a name, read without running it: which class an object is
(its annotation, its constructor call, its class's own declarations) and which values are FLOP
budgets (by their type, ``BudgetField``, or by the guard's validator). The budget rules
(``budget_rules.py``) read a budget this way, never by a variable's spelling."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path
from typing import Iterator

from .scan import call_name, modules_of

#: The type of a FLOP budget (race.spec.run: ``Annotated[float, AfterValidator(check_budget)]``).
BUDGET_TYPE = "BudgetField"
#: The guard's validators: what they return, or were handed, is a budget.
VALIDATORS = {"check_budget", "is_budget"}


# -- a budget by its type ---------------------------------------------------------------------------
def _unwrap(ann: ast.AST | None) -> ast.AST | None:
    """An annotation without ``| None`` / ``Optional[...]`` (a string annotation parsed)."""
    if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
        try:
            ann = ast.parse(ann.value, mode="eval").body
        except SyntaxError:
            return None
    if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
        sides = [s for s in (ann.left, ann.right) if not (isinstance(s, ast.Constant) and s.value is None)]
        return _unwrap(sides[0]) if len(sides) == 1 else None
    if isinstance(ann, ast.Subscript) and isinstance(ann.value, (ast.Name, ast.Attribute)) and \
            (ann.value.id if isinstance(ann.value, ast.Name) else ann.value.attr) == "Optional":
        return _unwrap(ann.slice)
    return ann


def type_name(ann: ast.AST | None) -> str | None:
    """The class an annotation names (``RunConfig``, ``spec.RunConfig``, ``"RunConfig | None"``);
    None for a container, a union of two types or no annotation."""
    ann = _unwrap(ann)
    return ann.id if isinstance(ann, ast.Name) else ann.attr if isinstance(ann, ast.Attribute) else None


def _validated(value: ast.AST | None) -> bool:
    return value is not None and any(isinstance(n, ast.Call) and call_name(n) == "check_budget"
                                     for n in ast.walk(value))


def _own_nodes(fn: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a function (or module) body, not those of the functions inside it (a
    class body's statements are its enclosing scope's; its methods are scopes of their own)."""
    todo = list(ast.iter_child_nodes(fn))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            todo.extend(ast.iter_child_nodes(node))


def _pairs(node: ast.AST) -> list[tuple[ast.AST, ast.AST | None]]:
    """(target, the value it is given) of an assignment, a tuple unpacked item by item
    (``self.cfg, self.ledger = cfg, ledger``)."""
    if isinstance(node, ast.AnnAssign):
        return [(node.target, node.value)]
    if not isinstance(node, ast.Assign):
        return []
    out: list[tuple[ast.AST, ast.AST | None]] = []
    for t in node.targets:
        if isinstance(t, ast.Tuple) and isinstance(node.value, ast.Tuple) and len(t.elts) == len(node.value.elts):
            out += list(zip(t.elts, node.value.elts))
        else:
            out.append((t, node.value))
    return out


class Types:
    """What the classes of a source tree declare: which attributes are budgets (a field
    annotated :data:`BUDGET_TYPE`, an attribute set from ``check_budget(...)``) and which hold an
    object of a known class (annotated, constructed, or set from a parameter annotated with it)."""

    def __init__(self, src: Path) -> None:
        self.files = modules_of(src)
        self.trees = {m: ast.parse(f.read_text(), str(f)) for m, f in self.files.items()}
        self.classes = {n.name for t in self.trees.values() for n in ast.walk(t) if isinstance(n, ast.ClassDef)}
        self.budgets: dict[str, set[str]] = defaultdict(set)
        self.attrs: dict[str, dict[str, str]] = defaultdict(dict)
        for tree in self.trees.values():
            for c in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
                self._read_class(c)

    def _read_class(self, c: ast.ClassDef) -> None:
        for item in c.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                self._declare(c.name, item.target.id, item.annotation, item.value, {})
        for fn in (f for f in c.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))):
            params = {a.arg: type_name(a.annotation) for a in (*fn.args.args, *fn.args.kwonlyargs)}
            for n in ast.walk(fn):
                for t, value in _pairs(n):
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        self._declare(c.name, t.attr, getattr(n, "annotation", None), value, params)

    def _declare(self, cls: str, attr: str, ann: ast.AST | None, value: ast.AST | None,
                 params: dict[str, str | None]) -> None:
        if type_name(ann) == BUDGET_TYPE or _validated(value):
            self.budgets[cls].add(attr)
        t = type_name(ann)
        if t is None and isinstance(value, ast.Call) and call_name(value) in self.classes:
            t = call_name(value)
        if t is None and isinstance(value, ast.Name):
            t = params.get(value.id)
        if t in self.classes:
            self.attrs[cls][attr] = t

    def scopes(self, mod: str) -> Iterator[tuple[ast.AST, dict[str, str], set[str]]]:
        """(a function of ``mod``, or the module itself; its names' classes; its names that
        are budgets), nested functions inheriting their enclosing function's."""
        yield self.trees[mod], {}, set()
        yield from self._visit(self.trees[mod], None, {}, set())

    def _visit(self, node: ast.AST, cls: str | None, env: dict[str, str],
               names: set[str]) -> Iterator[tuple[ast.AST, dict[str, str], set[str]]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                yield from self._visit(child, child.name, env, names)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                e, b = self._scope(child, cls, env, names)
                yield child, e, b
                yield from self._visit(child, None, e, b)
            else:
                yield from self._visit(child, cls, env, names)

    def _scope(self, fn: ast.FunctionDef | ast.AsyncFunctionDef, cls: str | None, env: dict[str, str],
               names: set[str]) -> tuple[dict[str, str], set[str]]:
        e, b = dict(env), set(names)
        a = fn.args
        for x in (*a.posonlyargs, *a.args, *a.kwonlyargs):
            t = type_name(x.annotation)
            if t == BUDGET_TYPE:
                b.add(x.arg)
            elif t in self.classes:
                e[x.arg] = t
        if cls and a.args and a.args[0].arg in ("self", "cls"):
            e[a.args[0].arg] = cls
        for n in _own_nodes(fn):
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and type_name(n.annotation):
                t = type_name(n.annotation)
                if t == BUDGET_TYPE:
                    b.add(n.target.id)
                elif t in self.classes:
                    e[n.target.id] = t
            elif isinstance(n, (ast.Assign, ast.AnnAssign)):
                for target, value in _pairs(n):
                    if not isinstance(target, ast.Name) or value is None:
                        continue
                    if _validated(value):
                        b.add(target.id)
                    elif (t := self.type_of(value, e)) is not None:
                        e[target.id] = t
            elif isinstance(n, ast.Call) and call_name(n) in VALIDATORS and n.args and isinstance(n.args[0], ast.Name):
                b.add(n.args[0].id)
        return e, b

    def type_of(self, node: ast.AST, env: dict[str, str]) -> str | None:
        """The class of the object ``node`` evaluates to, where the source says it."""
        if isinstance(node, ast.Name):
            return env.get(node.id)
        if isinstance(node, ast.Attribute):
            owner = self.type_of(node.value, env)
            return self.attrs.get(owner, {}).get(node.attr) if owner else None
        if isinstance(node, ast.Call) and call_name(node) in self.classes and isinstance(node.func, ast.Name):
            return node.func.id
        return None

    def is_budget(self, node: ast.AST, env: dict[str, str], names: set[str]) -> bool:
        """Whether ``node`` is a FLOP budget by its type (module docstring)."""
        if isinstance(node, ast.Name):
            return node.id in names
        if isinstance(node, ast.Attribute):
            owner = self.type_of(node.value, env)
            return bool(owner) and node.attr in self.budgets.get(owner, set())
        return False

    def nodes(self, mod: str) -> Iterator[tuple[ast.AST, dict[str, str], set[str]]]:
        """Every node of ``mod`` with the scope it is read in (its innermost function)."""
        for fn, env, names in self.scopes(mod):
            for node in _own_nodes(fn):
                yield node, env, names
