"""Errors raised by the accounting core."""


class AccountingError(ValueError):
    """Bad input to a FLOP formula; the message names the field and what to change."""
