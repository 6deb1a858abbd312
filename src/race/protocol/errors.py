"""The protocol's one error: a study that cannot be read, reported on, raced or validated as asked."""

from __future__ import annotations


class ReportError(ValueError):
    """The study cannot be reported on (no such study, no complete runs, ...); the message
    says why and what to do."""


__all__ = ["ReportError"]
