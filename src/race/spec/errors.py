"""Errors of the spec layer, the one pydantic error formatter and the one YAML loader.

Every user-facing file (run file, grid file, ``race flops -c`` settings) loads through
:func:`load_yaml_mapping` (``yaml.safe_load``; a syntax error becomes a one-line error
naming the file) and validates through a pydantic model whose errors
:func:`format_errors` turns into "field: what to change" lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError


class ConfigError(ValueError):
    """A configuration value is wrong; the message says which field and what to change."""


class GridSpecError(ValueError):
    """A grid file is wrong; the message says which field and what to change."""


_BOUNDS = {"greater_than": (">", "gt"), "greater_than_equal": (">=", "ge"), "less_than": ("<", "lt"),
           "less_than_equal": ("<=", "le")}


def format_errors(err: ValidationError, title: str,
                  unknown: Callable[[tuple[Any, ...]], str] | None = None,
                  label: Callable[[str], str] | None = None) -> str:
    """``title`` then one ``  - field: message`` line per pydantic error (``  - field must
    be > 0`` for a bound). ``unknown(loc)`` words the message for a field that does not
    exist (default: check the spelling); ``label(field)`` names a field (e.g. its flag)."""
    lines = [title]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        name = label(loc) if label else loc
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] in _BOUNDS and (e.get("ctx") or {}).get(_BOUNDS[e["type"]][1]) is not None:
            op, key = _BOUNDS[e["type"]]
            lines.append(f"  - {name} must be {op} {e['ctx'][key]:g}" if isinstance(e["ctx"][key], float)
                         else f"  - {name} must be {op} {e['ctx'][key]}")
            continue
        if e["type"] == "extra_forbidden":
            msg = unknown(tuple(e["loc"])) if unknown else "unknown field (check the spelling; see configs/ for examples)"
        elif e["type"] == "missing":
            msg = "required field is missing"
        lines.append(f"  - {msg}" if msg.startswith(f"{loc}.") else f"  - {name}: {msg}")
    return "\n".join(lines)


def load_yaml_mapping(path: str | Path, error: type[ValueError] = ConfigError, what: str = "config file"
                      ) -> dict[str, Any]:
    """The mapping at the top of YAML file ``path`` (``yaml.safe_load``; an empty file is
    ``{}``). A missing file, a YAML syntax error or a top level that is not a mapping
    raise ``error`` with a one-line message naming the file."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise error(f"{what} not found: {p}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" (line {where.line + 1}, column {where.column + 1})" if where is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise error(f"{p}: not valid YAML{at}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise error(f"{p}: the top level must be a mapping of settings, got {type(data).__name__}")
    return data


def parse_scalar(raw: str) -> Any:
    """A ``--set key=value`` value read as a YAML scalar or list (``16``, ``true``,
    ``[a, b]``, ``null``); text that does not parse stays text."""
    import yaml

    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw
