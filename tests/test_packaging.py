"""Declared dependencies match what the code imports; the constraints file pins the tested
versions without forcing a torch build on anyone."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "race"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
EXTRAS: dict[str, list[str]] = PYPROJECT["project"]["optional-dependencies"]
CONSTRAINTS = REPO / "constraints" / "cpu.txt"

# distribution name -> the module RACE imports it as
MODULE = {"pyyaml": "yaml", "math-verify": "math_verify"}
# declared but imported by no RACE module, and why
NOT_IMPORTED = {
    "pyarrow": "datasets reads .parquet task files through it (race.tasks.files)",
    "tensorboard": "torch.utils.tensorboard writes through it (log_to: tensorboard)",
    "pytest": "test runner",
    "pytest-timeout": "pytest plugin",
    "gguf": "transformers reads the packaged GGUF through it (race base import)",
    "accelerate": "transformers refuses to load a GGUF without it (race base import); TRL brings it too",
}


def _requirements(group: str) -> list[Requirement]:
    specs = PYPROJECT["project"]["dependencies"] if group == "core" else EXTRAS[group]
    return [Requirement(s) for s in specs]


def _declared() -> dict[str, Requirement]:
    out = {}
    for group in ["core", *EXTRAS]:
        for r in _requirements(group):
            if canonicalize_name(r.name) != "race-rl":
                out[canonicalize_name(r.name)] = r
    return out


def _imported_top_modules() -> set[str]:
    pat = re.compile(r"^\s*(?:from|import)\s+([A-Za-z_][A-Za-z0-9_]*)", re.M)
    found: set[str] = set()
    for f in SRC.rglob("*.py"):
        found |= set(pat.findall(f.read_text()))
    return found


def test_every_declared_dependency_is_imported_or_explained():
    imported = _imported_top_modules()
    unused = []
    for name in _declared():
        module = MODULE.get(name, name.replace("-", "_"))
        if module not in imported and name not in NOT_IMPORTED:
            unused.append(name)
    assert not unused, f"declared in pyproject.toml but never imported by race: {unused}"
    assert "tqdm" not in _declared()
    assert [g for g in EXTRAS if "accelerate" in {canonicalize_name(r.name) for r in _requirements(g)}] == ["gguf"]


def test_log_to_backends_have_an_extra_outside_all():
    from typing import get_args

    from race.spec.run import RunConfig

    backends = set(get_args(get_args(RunConfig.model_fields["log_to"].annotation)[0]))
    assert backends == {"tensorboard", "wandb"}
    assert {canonicalize_name(r.name) for r in _requirements("logging")} == backends
    all_groups = re.search(r"\[(.*)\]", EXTRAS["all"][0]).group(1).split(",")
    assert "logging" not in all_groups
    assert set(all_groups) == set(EXTRAS) - {"all", "logging"}


def test_trl_and_transformers_ranges_are_the_tested_ones():
    d = _declared()
    assert "1.16.0" in d["trl"].specifier and "1.17.0" not in d["trl"].specifier
    assert "1.15.0" not in d["trl"].specifier and "0.23.0" not in d["trl"].specifier
    assert "5.24.0" in d["transformers"].specifier and "4.56.0" not in d["transformers"].specifier


def _pins() -> dict[str, str]:
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([A-Za-z0-9_.+\-]+)", line.strip())
        assert m, f"constraints/cpu.txt: not a name==version pin: {line!r}"
        pins[canonicalize_name(m.group(1))] = m.group(2)
    return pins


def test_constraints_pin_tested_versions_within_the_declared_ranges():
    pins = _pins()
    assert len(pins) > 50
    forced = {n for n in pins if n in {"torch", "triton", "race-rl", "pip", "setuptools"} or n.startswith("nvidia-")}
    assert not forced, f"constraints/cpu.txt must not pin {forced}: GPU users bring their own torch"
    torch_version = re.search(r"^# torch-version: (\d+\.\d+\.\d+)$", CONSTRAINTS.read_text(), re.M).group(1)
    assert torch_version in _declared()["torch"].specifier
    for name, req in _declared().items():
        if name == "torch" or (name in ("tensorboard", "wandb") and name not in pins):
            continue  # torch is installed apart; the logging extra is not in the tested install
        assert name in pins, f"{name} is declared but constraints/cpu.txt does not pin it"
        assert pins[name] in req.specifier, f"{name}=={pins[name]} is outside pyproject's {req}"


def test_setup_script_uses_the_constraints_and_keeps_an_existing_torch():
    sh = (REPO / "scripts" / "setup.sh").read_text()
    assert "constraints/cpu.txt" in sh and 'ARGS=(-c "$CONSTRAINTS")' in sh
    assert "RACE_TORCH_SPEC" in sh and 'if ! $VPY -c "import torch"' in sh
    assert "torch-version" in sh  # constraints skipped when the venv's torch differs


def test_the_demo_grids_base_models_and_reward_models_ship_with_the_current_recipe_hashes(tmp_path):
    """A fresh clone runs the demo without building: every warm start and reward model the
    packaged demo grid uses is in the package under its CURRENT recipe hash (a recipe change
    without re-packaging fails here; `race base build --force` + copying refreshes them).
    Checked in a fresh interpreter: other tests swap the registered recipes for speed."""
    import subprocess
    import sys

    code = f"""
from importlib import resources
from race.artefacts.cache import PACKAGED, packaged_dir
from race.grid import load_grid_spec
from race.grid.prebuild import grid_builds
from race.models.base_recipes import recipe_hash
from race.rewards.rm_recipes import rm_dir
with resources.as_file(resources.files("race") / "configs" / "demo.yaml") as f:
    spec = load_grid_spec(f)
models, rms = grid_builds(spec.axes.get("model", [spec.base.get("model")]),
                          [cell.config.reward for cell in spec.cells()])
assert models and rms, (models, rms)
for m in models:
    assert packaged_dir("base", f"{{m}}-{{recipe_hash(m)}}") is not None, (m, sorted(PACKAGED.glob("base/*")))
for r in rms:
    name = rm_dir(r, cache_dir={str(tmp_path)!r}).name
    assert packaged_dir("rm", name) is not None, (name, sorted(PACKAGED.glob("rm/*")))
# what the engines call: the packaged copies are reused, never rebuilt
from race.builds.rm_training import build_rm
from race.builds.warmstart import build_base
for m in models:
    assert build_base(m).reused, m
for r in rms:
    assert build_rm(r).reused, r
print("ok", models, rms)
"""
    env = {k: v for k, v in os.environ.items() if k != "RACE_NO_PACKAGED"}
    env["RACE_CACHE"] = str(tmp_path / "cache")  # empty: everything must come from the package
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr[-2000:]


def test_the_packaged_reward_models_install_load_and_score(tmp_path):
    """Every packaged RM (the feedback-strength axis: prm-xs < prm-s < prm-m) ships under
    its CURRENT recipe hash, installs from the package into an empty cache without a build,
    loads through the RM reward and scores: a reference solution's weakest step above a
    one-off arithmetic slip's for the strong PRM; its info.json carries the held-out
    quality and the costs the report needs."""
    import subprocess
    import sys

    code = """
import json
from race.builds.rm_report import packaged_rms
from race.builds.rm_training import build_rm
from race.rewards.learned import build_learned
from race.rewards.systems import resolve_reward
from race.tasks import ArithTask, solution_text
names = packaged_rms()
assert {"prm-xs", "prm-s", "prm-m"} <= set(names), names
problems = ArithTask().problems("test", 20, seed=99)
for name in names:
    info = build_rm(name)
    assert info.reused and info.train_flops > 0, name
    reward = build_learned(resolve_reward(f"prm:{name}:min"), device="cpu")
    refs = [solution_text(p) for p in problems]
    slips = [r.replace("=" + str(p.steps[0][3]) + ";", "=" + str(p.steps[0][3] + 1) + ";", 1)
             for p, r in zip(problems, refs)]
    out = reward.score(problems + problems, refs + slips)
    assert len(out.rewards) == 40 and sum(out.components.values()) > 0, name
    if name == "prm-m":
        better = sum(a > b for a, b in zip(out.rewards[:20], out.rewards[20:]))
        assert better >= 18, (name, better)
        held = info.data["heldout"]
        assert held["step_auc"] >= 0.9 and held["bad_step_recall"] >= 0.8, held
        assert info.data["sampling_flops"] > 0 and info.origin["base_sft_flops"] > 0
print("ok", names)
"""
    env = {k: v for k, v in os.environ.items() if k != "RACE_NO_PACKAGED"}
    env["RACE_CACHE"] = str(tmp_path / "cache")  # empty: everything must come from the package
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr[-2000:]
