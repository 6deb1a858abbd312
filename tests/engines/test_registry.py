"""Engines are chosen by name through the Engine protocol, not by if/else."""

from __future__ import annotations

import pytest

import race.engines as E
from race.spec import RunConfig


def test_unknown_engine_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown engine 'nope'.*builtin, trl"):
        E.engine_for("nope")


def test_run_engine_builds_the_registered_engine_and_runs_it(monkeypatch, tmp_path):
    seen = {}

    class Fake:
        name = "builtin"

        def __init__(self, cfg, run_dir, progress):
            seen.update(cfg=cfg, run_dir=run_dir)

        def run(self):
            return {"status": "complete"}

    monkeypatch.setitem(E.ENGINES, "builtin", Fake)
    cfg = RunConfig(budget_flops=1e9)
    assert E.run_engine(cfg, tmp_path) == {"status": "complete"}
    assert seen == {"cfg": cfg, "run_dir": tmp_path}


def test_the_registry_resolves_the_builtin_engines_lazily():
    from race.engines.builtin import BuiltinEngine
    from race.engines.trl import TrlEngine

    assert E.engine_for("builtin") is BuiltinEngine and E.engine_for("trl") is TrlEngine
