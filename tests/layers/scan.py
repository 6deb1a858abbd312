"""What the house rules share: the modules of ``src/race``, their imports (resolved to the
module they load, imports inside functions included), every AST node with its file, and a
synthetic tree for a rule's planted violations."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
SRC = TESTS.parent / "src"
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


def import_base(mod: str, f: Path, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` in module ``mod`` (file ``f``) reads from."""
    base = node.module or ""
    if node.level:
        pkg = mod.split(".") if f.name == "__init__.py" else mod.split(".")[:-1]
        pkg = pkg[: len(pkg) - (node.level - 1)]
        base = ".".join(pkg + ([node.module] if node.module else []))
    return base


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
                base = import_base(mod, f, node)
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for name in names:
                if name.split(".")[0] == "race":
                    while name not in mods and "." in name:
                        name = name.rpartition(".")[0]
                    if name == mod:
                        continue
                out.append(Import(mod, name, rel, node.lineno))
    return out


def walk_nodes(src: Path):
    """(module, file relative to ``src``'s parent, AST node) for every node of every module."""
    for mod, f in modules_of(src).items():
        rel = str(f.relative_to(src.parent))
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            yield mod, rel, node


def flagged(src: Path, message) -> list[str]:
    """``file:line: text`` for every AST node of ``src`` for which ``message(module, node)``
    returns a text (the node breaks a rule), in file order."""
    return [f"{rel}:{node.lineno}: {text}" for mod, rel, node in walk_nodes(src)
            if (text := message(mod, node)) is not None]


def call_name(node: ast.AST) -> str:
    """The called name of a call (``f(...)``: f, ``x.f(...)``: f); "" for anything else."""
    f = node.func if isinstance(node, ast.Call) else None
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def mentions(node: ast.AST, word: str) -> bool:
    """Whether a name or attribute inside ``node`` holds ``word`` (case-insensitive)."""
    return any(word in (n.id if isinstance(n, ast.Name) else n.attr).lower()
               for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute)))


def package_dir(root: Path, package: str) -> Path:
    """An empty ``race.<package>`` under ``root`` (a synthetic tree for the scans to read)."""
    pkg = root / "race" / package
    pkg.mkdir(parents=True, exist_ok=True)
    (root / "race" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    return pkg
