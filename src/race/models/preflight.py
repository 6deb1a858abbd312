"""Will a run be able to load this model? Answered before anything runs, without torch.

:func:`policy_check` reads a model reference the way :func:`race.models.loading.resolve_source`
will (a tiny-family name, an imported model, a local folder, a hub name) and says what
would stop the load: a misspelled name (with the closest valid one), a folder that is not
there or lacks ``config.json``, safetensors weights or tokenizer files, a tokenizer without
a chat template when ``task.chat_template`` asks for one, a Qwen2.5 FLOP preset named where
weights are needed, a model that ``race base import`` has not imported. A hub name that is
not in the local cache is not refused (the run downloads it) unless ``HF_HUB_OFFLINE`` is
set; the check then says so in a note, naming the download command the installed
``huggingface_hub`` ships (:func:`race.models.refs.hub_download_command`).

A reference is a folder when it is written as a path (``./x``, ``/x``, ``~/x``, ``x.json``), when
it exists, or when its first part is a folder here (``models/Qwen2.5-0.5B`` with a ``models/``
folder): a folder is never diagnosed as a hub name.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from race.accounting.errors import did_you_mean
from race.accounting.shapes import preset_shape
from race.models.family import TINY_FAMILY, is_tiny_name
from race.models.imported import IMPORTED, imported_path, is_imported_name
from race.models.refs import cached_hub_config, hub_cache_dir, hub_download_command, looks_like_hub_name, \
    looks_like_path, preset_hub_id

#: Files one of which a tokenizer needs (fast tokenizer, SentencePiece, BPE or WordPiece vocabulary).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


@dataclass
class Check:
    """What a reference resolves to: ``problem`` (why a run would fail, or None) and
    ``notes`` (what the plan should say although the run can go ahead)."""

    problem: str | None = None
    notes: list[str] = field(default_factory=list)


def folder_problem(path: Path, *, chat_template: bool, what: str = "model") -> str | None:
    """Why a run cannot load a model from folder ``path``, or None: ``config.json``,
    safetensors weights and tokenizer files are needed, and a chat template when asked."""
    if not path.is_dir():
        return f"{what} folder {str(path)!r} is not a directory"
    missing = [name for name, ok in (
        ("config.json", (path / "config.json").is_file()),
        ("model.safetensors (or its index)", (path / "model.safetensors").is_file()
         or (path / "model.safetensors.index.json").is_file()),
        ("tokenizer files (" + ", ".join(TOKENIZER_FILES) + ")", any((path / f).is_file() for f in TOKENIZER_FILES)),
    ) if not ok]
    if missing:
        return (f"{what} folder {str(path)!r} has no {'; no '.join(missing)}: a run loads config, safetensors weights "
                "and tokenizer from it (save them with save_pretrained(..., safe_serialization=True) and "
                "tokenizer.save_pretrained)")
    if chat_template and not has_chat_template(path):
        return (f"task.chat_template: true, but the tokenizer in {str(path)!r} has no chat template "
                "(tokenizer_config.json chat_template, chat_template.jinja or chat_template.json): use a model whose "
                "tokenizer has one (an -Instruct model), or set task.chat_template: false and write the format into "
                "task.prompt_template")
    return None


def has_chat_template(path: Path) -> bool:
    """Whether the tokenizer saved in folder ``path`` has a chat template."""
    if (path / "chat_template.jinja").is_file() or (path / "chat_template.json").is_file():
        return True
    cfg = path / "tokenizer_config.json"
    try:
        return bool(cfg.is_file() and json.loads(cfg.read_text()).get("chat_template"))
    except (OSError, ValueError):
        return False


def _missing_folder(ref: str) -> str:
    p = Path(ref).expanduser()
    where = "" if p.is_absolute() else f" (relative to {Path.cwd()})"
    hint = ""
    if p.parent.is_dir() and str(p.parent) not in ("", "."):
        hint = did_you_mean(p.name, [c.name for c in p.parent.iterdir() if c.is_dir()])
    return (f"model folder {ref!r} not found{where}{hint}: fix the path in the grid or run file, or run from the "
            "folder it is relative to")


def is_folder_ref(ref: str) -> bool:
    """A reference that names a folder (module docstring): a path, an existing file or
    folder, or ``a/b`` whose ``a`` is a folder here."""
    return looks_like_path(ref) or ("/" in ref and Path(ref.split("/", 1)[0]).expanduser().is_dir())


def known_model_names() -> list[str]:
    """The model names a run loads by name: the tiny family, the imported models and the
    hub names of the Qwen2.5 presets (the "did you mean" candidates)."""
    from race.accounting import preset_names

    hub = [preset_hub_id(p) for p in preset_names()]
    return [*TINY_FAMILY, *IMPORTED, *(h for h in hub if h)]


def policy_check(ref: str, *, chat_template: bool = False) -> Check:
    """Whether a run can load policy (or judge) ``ref`` (module docstring)."""
    ref = str(ref)
    if is_tiny_name(ref):
        if chat_template:
            return Check(f"task.chat_template: true, but the tiny family's tokenizer ({ref}) has no chat template: "
                         "set task.chat_template: false (the tiny models read plain prompts) or use a model whose "
                         "tokenizer has one")
        return Check()
    if is_folder_ref(ref):
        p = Path(ref).expanduser()
        return Check(folder_problem(p, chat_template=chat_template) if p.exists() else _missing_folder(ref))
    if is_imported_name(ref):
        try:
            path = imported_path(ref)
        except FileNotFoundError as e:  # NotBuiltError: names `race base import`
            return Check(str(e))
        return Check(folder_problem(path, chat_template=chat_template, what=f"imported model {ref!r}:"))
    if looks_like_hub_name(ref):
        return _hub_check(ref, chat_template)
    try:
        preset_shape(ref)
    except ValueError:
        pass
    else:
        hub = preset_hub_id(ref)
        return Check(f"model {ref!r} is a FLOP preset (race flops, race plan), not weights a run can load: name the "
                     f"hub model {hub!r} or a local folder")
    return Check(f"unknown model {ref!r}{did_you_mean(ref, known_model_names())}: a run loads a tiny-family name "
                 f"({', '.join(TINY_FAMILY)}), an imported model ({', '.join(IMPORTED)}), a local folder or a hub "
                 "name (org/name)")


def _hub_check(ref: str, chat_template: bool) -> Check:
    """A hub name: its cached snapshot's files, or a note (a refusal offline) when it is not cached."""
    cfg = cached_hub_config(ref)
    fetch = hub_download_command(ref)
    if cfg is not None:
        problem = folder_problem(cfg.parent, chat_template=chat_template, what=f"hub model {ref!r}: cached")
        return Check(problem and f"{problem}; `{fetch}` fetches the rest")
    where = f"not a folder here ({Path.cwd()}) and not in the local Hugging Face cache ({hub_cache_dir()})"
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() not in ("0", "", "false", "no"):
        return Check(f"model {ref!r}: {where}, and HF_HUB_OFFLINE is set: fetch it with `{fetch}`, or pass a local "
                     "folder")
    return Check(notes=[f"model {ref!r}: {where}; the first cell that needs it downloads it (`{fetch}` fetches it "
                        "now; its tokenizer" + (" and chat template" if chat_template else "") + " are checked once "
                        "it is cached). If it is a local folder, write ./" + ref + " or run from the folder it is "
                        "relative to"])


__all__ = ["Check", "TOKENIZER_FILES", "folder_problem", "has_chat_template", "is_folder_ref", "known_model_names",
           "policy_check"]
