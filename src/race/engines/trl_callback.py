"""Kept for users: ``from race.engines.trl_callback import add_race_accounting`` is the path
README.md and docs/trl.md document. The code lives in :mod:`race.engines.trl.callback`."""

from race.engines.trl.callback import RaceFlopCallback, add_race_accounting

__all__ = ["RaceFlopCallback", "add_race_accounting"]
