"""The protocol's errors: a study that cannot be read, reported on, raced or validated as asked,
and runs trained elsewhere that cannot be imported as given."""

from __future__ import annotations


class ReportError(ValueError):
    """The study cannot be reported on (no such study, no complete runs, ...); the message
    says why and what to do."""


class ImportRefused(ValueError):
    """Runs trained elsewhere cannot become a study as given (``race import``); the message
    says what is missing or inconsistent and what to add or fix."""


__all__ = ["ImportRefused", "ReportError"]
