"""Local question/answer data read with Hugging Face ``datasets`` (nothing downloaded).

A source is one of:

- a ``.jsonl``/``.json``/``.parquet`` file (``load_dataset("json"|"parquet", ...)``);
- a directory written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``
  (``load_from_disk``; of a ``DatasetDict`` the split named like the role -- ``train``,
  ``test`` -- or its only split);
- a directory of ``.parquet`` or ``.jsonl``/``.json`` files (searched recursively, read in
  name order as one dataset; the two formats are not mixed).

``datasets`` is imported only when data is read.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def _is_saved_dataset(p: Path) -> bool:
    return (p / "dataset_dict.json").is_file() or ((p / "state.json").is_file() and
                                                   (p / "dataset_info.json").is_file())


def _from_disk(p: Path, role: str) -> Any:
    from datasets import DatasetDict, load_from_disk

    ds = load_from_disk(str(p))
    if isinstance(ds, DatasetDict):
        splits = list(ds.keys())
        if role in ds:
            return ds[role]
        if len(splits) == 1:
            return ds[splits[0]]
        raise ValueError(f"{p} is a DatasetDict with splits {splits} and none is named {role!r}: point the task at "
                         f"one split's data, or save the {role} split under that name")
    return ds


def _data_files(p: Path) -> tuple[str, list[str]]:
    files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in FORMATS
                   and not f.name.startswith("."))
    kinds = {FORMATS[f.suffix.lower()] for f in files}
    if not files:
        raise ValueError(f"{p}: no .parquet, .jsonl or .json files in this directory (and it is not a "
                         "save_to_disk directory); point the task at a data file or a directory holding some")
    if len(kinds) > 1:
        raise ValueError(f"{p} holds both parquet and json files: point the task at one file or a directory of "
                         "one format")
    return kinds.pop(), [str(f) for f in files]


def load_table(path: str | os.PathLike[str], *, fmt: str | None = None, role: str = "train") -> Any:
    """The ``datasets.Dataset`` at ``path`` (module docstring). ``fmt`` (``json`` or
    ``parquet``) overrides a file's suffix. Raises ``FileNotFoundError`` for a missing path
    and ``ValueError`` saying what to change for anything unreadable."""
    from datasets import load_dataset

    p = Path(path).expanduser()
    if p.is_dir():
        if _is_saved_dataset(p):
            return _from_disk(p, role)
        kind, files = _data_files(p)
        return load_dataset(kind, data_files=files, split="train")
    if not p.is_file():
        raise FileNotFoundError(f"problem file not found: {p}")
    fmt = fmt or FORMATS.get(p.suffix.lower())
    if fmt not in ("json", "parquet"):
        raise ValueError(f"cannot tell the format of {p}: use a .jsonl or .parquet file, or pass fmt='json'|'parquet' "
                         "(task.name: jsonl or parquet)")
    return load_dataset(fmt, data_files=str(p), split="train")


def resolve_columns(found: list[str], columns: dict[str, str] | None, source: Any) -> dict[str, str]:
    """Problem field -> dataset column (``question``/``answer`` unless ``columns`` maps
    them); ``ValueError`` naming the missing column and the columns found."""
    mapping = {"question": "question", "answer": "answer", **(columns or {})}
    for role, col in mapping.items():
        if col not in found:
            how = (f"task.columns.{role} is {col!r}" if columns and role in columns else
                   f"set task.columns: {{{role}: COLUMN}} to name the column holding the {role}")
            raise ValueError(f"{source}: no column {col!r} for the {role} (columns found: {found}); {how}")
    return mapping


__all__ = ["FORMATS", "load_table", "resolve_columns"]
