"""Errors raised by the accounting core, and the one "did you mean" helper every layer uses
(settings, grid keys, model and device names). Standard library only."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping


class AccountingError(ValueError):
    """Bad input to a FLOP formula; the message names the field and what to change."""


def closest(word: str, choices: Iterable[str], aliases: Mapping[str, str] | None = None) -> str | None:
    """The valid name ``word`` most likely meant, or None: an alias (another library's name
    for the same setting, e.g. ``rank`` -> PEFT's ``r``) when ``word`` is one and its target
    is a choice, else the same name in another case, else :func:`difflib.get_close_matches`'
    best (similarity >= 0.6)."""
    names = [str(c) for c in choices]
    w = str(word)
    if aliases:
        target = aliases.get(w, aliases.get(w.lower()))
        if target in names:
            return target
    folded = {n.lower(): n for n in names}
    if w.lower() in folded and folded[w.lower()] != w:
        return folded[w.lower()]
    best = difflib.get_close_matches(w, names, n=1, cutoff=0.6) or difflib.get_close_matches(
        w.lower(), list(folded), n=1, cutoff=0.6)
    return folded.get(best[0], best[0]) if best else None


def did_you_mean(word: str, choices: Iterable[str], aliases: Mapping[str, str] | None = None) -> str:
    """``" (did you mean 'x'?)"`` for the name :func:`closest` finds, else ``""``: append it
    to the message that names the unknown ``word``."""
    best = closest(word, choices, aliases)
    return f" (did you mean {best!r}?)" if best is not None and best != word else ""


__all__ = ["AccountingError", "closest", "did_you_mean"]
