"""Errors of the spec layer, the one pydantic error formatter and the one YAML loader.

Every user-facing file (run file, grid file, ``race flops -c`` settings) loads through
:func:`load_yaml_mapping` (``yaml.safe_load``; a syntax error becomes a one-line error
naming the file) and validates through a pydantic model whose errors
:func:`format_errors` turns into "field: what to change" lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ValidationError

from race.accounting.errors import closest


class ConfigError(ValueError):
    """A configuration value is wrong; the message says which field and what to change."""


class GridSpecError(ValueError):
    """A grid file is wrong; the message says which field and what to change."""


#: Other names for run settings (another library's, or a common spelling) -> the name a RACE
#: run file uses (TRL's for GRPO settings, PEFT's for LoRA): the first "did you mean" guess.
SETTING_ALIASES = {
    "rank": "r", "lora_rank": "r", "lora_r": "r", "alpha": "lora_alpha", "dropout": "lora_dropout",
    "targets": "target_modules", "lr": "learning_rate", "group": "num_generations", "group_size": "num_generations",
    "g": "num_generations", "kl": "beta", "kl_coef": "beta", "budget": "budget_flops", "flops": "budget_flops",
    "max_new_tokens": "max_completion_length", "completion_len": "max_completion_length",
    "prompt_len": "max_prompt_length", "prompts": "prompts_per_step", "batch_size": "per_device_train_batch_size",
    "iterations": "num_iterations", "grad_accum": "gradient_accumulation_steps", "torch_dtype": "dtype",
    "budgets_flops": "budgets", "seed": "seeds", "rung": "rungs", "worker": "workers",
}

_BOUNDS = {"greater_than": (">", "gt"), "greater_than_equal": (">=", "ge"), "less_than": ("<", "lt"),
           "less_than_equal": ("<=", "le")}


def format_errors(err: ValidationError, title: str,
                  unknown: Callable[[tuple[Any, ...]], str] | None = None,
                  label: Callable[[str], str] | None = None, model: type[BaseModel] | None = None) -> str:
    """``title`` then one ``  - field: message`` line per pydantic error (``  - field must
    be > 0`` for a bound). ``unknown(loc)`` words the message for a field that does not
    exist (default: :func:`unknown_setting` over ``model`` when given, naming the closest
    valid name, else check the spelling); ``label(field)`` names a field (e.g. its flag)."""
    if unknown is None and model is not None:
        def unknown(loc: tuple[Any, ...]) -> str:
            return unknown_setting(model, loc)
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


def submodel(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field's annotation holds (``LoraSettings | None`` ->
    ``LoraSettings``), or None for a plain value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def fields_at(model: type[BaseModel], path: tuple[Any, ...]) -> list[str] | None:
    """The field names of the section at ``path`` (field names from the top of ``model``),
    or None when ``path`` does not lead to a section."""
    for part in path:
        field = model.model_fields.get(str(part))
        sub = submodel(field.annotation) if field is not None else None
        if sub is None:
            return None
        model = sub
    return list(model.model_fields)


def unknown_setting(model: type[BaseModel], loc: tuple[Any, ...], what: str = "field") -> str:
    """The message for a setting ``loc`` that ``model`` does not have: the closest valid name
    (:data:`SETTING_ALIASES` first, then the spelling; written as its dotted path), else
    the section's names when they are few."""
    fields = fields_at(model, tuple(loc[:-1]))
    if fields is None:
        return f"unknown {what} (check the spelling; see configs/ for examples)"
    best = closest(str(loc[-1]), fields, SETTING_ALIASES)
    if best is not None:
        return f"unknown {what} (did you mean {'.'.join([*(str(p) for p in loc[:-1]), best])!r}?)"
    if len(fields) <= 12:
        return f"unknown {what}; choose from {', '.join(sorted(fields))}"
    return f"unknown {what} (check the spelling; see configs/ for examples)"


def blame_flags(err: ValidationError, flags: dict[str, str], title: str, flags_title: str
                ) -> tuple[str, Callable[[str], str]]:
    """``(title, label)`` for :func:`format_errors` when some settings came from flags
    (``flags``: dotted setting -> the flag that set it, e.g. ``--set lora.rank=8``): an error
    at or under a flag's setting is labelled with the flag, and when every error is a flag's
    the title is ``flags_title`` (it does not blame the file)."""
    def flag_of(loc: str) -> str | None:
        return next((f for k, f in flags.items() if loc == k or loc.startswith(k + ".")), None)

    def label(loc: str) -> str:
        flag = flag_of(loc)
        return f"{flag}: {loc}" if flag else loc

    locs = [".".join(str(p) for p in e["loc"]) for e in err.errors()]
    return (flags_title if flags and all(flag_of(loc) for loc in locs) else title), label


def some_keys(keys: Any, most: int = 4) -> str:
    """``a, b, c, d, ...``: the first ``most`` of ``keys`` (sorted), to name a file's kind."""
    names = sorted(str(k) for k in keys)
    return ", ".join(names[:most]) + (", ..." if len(names) > most else "")


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
