"""Nothing reaches another module's private names: no ``from race.x import _name``, no
``obj._member`` of a member another module defines, not even through ``getattr``."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from .scan import SRC, modules_of, package_dir

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
