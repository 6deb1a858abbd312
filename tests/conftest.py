"""Shared fixtures for the whole test suite.

- Every test session gets its own RACE cache (``$RACE_CACHE``) in a temporary directory
  and runs with ``HF_HUB_OFFLINE=1``, so no test writes to the user's cache or touches
  the network.
- ``char_tokenizer``: the character tokenizer.
- ``tiny_model_dir``: a randomly initialised ``tiny-xs`` (seed 0) and its tokenizer saved
  with safetensors to a session directory -- a complete local HF model directory that
  ``race.models.load_policy`` (or ``AutoModelForCausalLM.from_pretrained``) can read.
- ``tiny_policy``: ``(model, tokenizer)`` loaded from it on CPU in fp32 with eager
  attention. Session-scoped and shared: tests must not modify it in place (deepcopy it).
- ``load_script``: ``load_script("benchmarks/x.py")`` loads a script of the repository that
  is not part of the package (a benchmark) as a module, afresh at each call.

Heavy libraries are imported inside the fixtures, so collecting tests stays fast.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="session", autouse=True)
def _race_cache(tmp_path_factory: pytest.TempPathFactory):
    """Point ``$RACE_CACHE`` at a fresh session directory (restored afterwards)."""
    old = os.environ.get("RACE_CACHE")
    path = tmp_path_factory.mktemp("race-cache")
    os.environ["RACE_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("RACE_CACHE", None)
    else:
        os.environ["RACE_CACHE"] = old


@pytest.fixture
def quiet_warnings():
    """Silence library FutureWarnings/UserWarnings for a test (autouse in the measure and
    rewards folders, whose models trigger many)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", UserWarning)
        yield


@pytest.fixture(scope="session")
def char_tokenizer():
    from race.models.tokenizer import build_char_tokenizer

    return build_char_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, char_tokenizer):
    """Directory holding a random-init ``tiny-xs`` (seed 0) + tokenizer, safetensors."""
    from race.models.family import build_tiny_model

    path = tmp_path_factory.mktemp("tiny-xs-random")
    model = build_tiny_model("tiny-xs", seed=0)
    model.save_pretrained(path, safe_serialization=True)
    char_tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_policy(tiny_model_dir):
    """``(model, tokenizer)`` loaded from :func:`tiny_model_dir` (CPU, fp32, eager)."""
    from race.models.loading import load_policy

    return load_policy(tiny_model_dir, device="cpu", dtype="float32", attn_implementation="eager")


@pytest.fixture(scope="session")
def load_script():
    """A loader: ``load_script(path)`` executes the script at ``path`` (relative to the
    repository root) as a new module ``race_script_<stem>`` and returns it."""
    import importlib.util

    def load(path: str):
        file = ROOT / path
        spec = importlib.util.spec_from_file_location(f"race_script_{file.stem}", file)
        assert spec is not None and spec.loader is not None, f"cannot load {file}"
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    return load


@pytest.fixture
def store_opens(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Opens of a study's store from now on: ``"grid"`` inside the grid driver
    (``race.grid.run_grid``, which opens its own), ``"read"`` everywhere else."""
    import race.grid
    from race.grid import Store

    opens = {"read": 0, "grid": 0}
    driving: list[int] = []
    init, run = Store.__init__, race.grid.run_grid

    def counting(self, *a, **k):
        opens["grid" if driving else "read"] += 1
        init(self, *a, **k)

    def driven(*a, **k):
        driving.append(1)
        try:
            return run(*a, **k)
        finally:
            driving.pop()

    monkeypatch.setattr(Store, "__init__", counting)
    monkeypatch.setattr(race.grid, "run_grid", driven)
    return opens


@pytest.fixture
def gang_step_flops(monkeypatch: pytest.MonkeyPatch) -> tuple[dict[int, int], dict[int, dict[int, int]]]:
    """``FlopCounterMode`` over every gang step from now on: ``({step: FLOPs executed},
    {step: {member index: rollout FLOPs the gang executed for it}})``; a member whose step
    does not succeed fails the test."""
    from torch.utils.flop_counter import FlopCounterMode

    from race.engines.gang import engine

    measured: dict[int, int] = {}
    executed: dict[int, dict[int, int]] = {}
    real = engine.gang_step

    def counted(step, works):
        with FlopCounterMode(display=False) as fc:
            out = real(step, works)
        measured[step] = fc.get_total_flops()
        executed[step] = {w.index: w.executed for w in works if w.outcome == "ok"}
        assert all(w.outcome == "ok" for w in works)
        return out

    monkeypatch.setattr(engine, "gang_step", counted)
    return measured, executed
