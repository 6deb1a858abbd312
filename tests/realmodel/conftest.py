"""The real pretrained model (SmolLM2-135M-Instruct, ``race base import smollm2``) for the
tests of this folder.

The root conftest points ``$RACE_CACHE`` at an empty session directory, so the model is
looked up in the cache the user had when pytest started (``$RACE_CACHE`` as it was, else
``~/.cache/race``), read when this file is collected (before any session fixture runs).
Missing, the tests that need it SKIP with the command that imports it, unless
``RACE_REQUIRE_REAL_MODEL=1`` (``scripts/test.sh`` sets it after running the import, as
CI does): then they FAIL, so CI never passes without exercising the real model.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from race.artefacts.cache import cache_root  # noqa: E402  (standard library only)

USER_CACHE = cache_root()  # read now: the root conftest's session fixture replaces $RACE_CACHE later

if any(importlib.util.find_spec(m) is None for m in ("torch", "transformers", "peft")):
    collect_ignore_glob = ["test_*.py"]


def required() -> bool:
    return os.environ.get("RACE_REQUIRE_REAL_MODEL", "") not in ("", "0")


@pytest.fixture(scope="session")
def user_cache():
    """The RACE cache the user had when pytest started (where the import lives)."""
    return USER_CACHE


@pytest.fixture(scope="session")
def smollm2_dir():
    """The imported SmolLM2-135M-Instruct directory (skip, or fail under
    ``RACE_REQUIRE_REAL_MODEL=1``, when it is not imported)."""
    from race.artefacts.cache import NotBuiltError
    from race.models.imported import imported_path

    try:
        return imported_path("smollm2-135m", cache_dir=USER_CACHE)
    except NotBuiltError as err:
        if required():
            pytest.fail(f"RACE_REQUIRE_REAL_MODEL=1 but {err}")
        pytest.skip(str(err))


@pytest.fixture(scope="session")
def smollm2(smollm2_dir):
    """``(model, tokenizer)``: fp32, eager attention, CPU, eval mode. Shared: deepcopy before
    changing it."""
    from race.models.loading import load_policy

    return load_policy(smollm2_dir, device="cpu", dtype="float32", attn_implementation="eager")


@pytest.fixture(autouse=True)
def _quiet(quiet_warnings):
    yield
