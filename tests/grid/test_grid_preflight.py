"""``race grid plan`` resolves every cell's model, tokenizer chat template, data files and
reward model before anything runs, refuses the cells a worker would fail on with the reason,
and exits non-zero naming each (issue 49). Real files: the packaged tiny warm start's
config, weights and tokenizer, copied into folders that lack one piece each."""

from __future__ import annotations

import json
import shutil
from importlib import metadata
from pathlib import Path

import pytest
from typer.testing import CliRunner

from race.cli.app import app
from race.grid import plan_grid
from race.spec.grid import grid_spec_from_dict
from race.models.preflight import policy_check
from race.models.refs import hub_download_command
from race.spec.grid import DEFAULT_CELL_FN
from tests.grid.conftest import grid, write_grid

ROOT = Path(__file__).resolve().parents[2]
TINY = next((ROOT / "src" / "race" / "data" / "artefacts" / "base").glob("tiny-s-*"))
DATA = ROOT / "configs" / "data" / "arith-qa"
CHAT = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"


def _folder(path: Path, *, tokenizer: bool, chat: bool) -> Path:
    """A model folder from the packaged tiny-s: config and weights, the tokenizer when asked,
    its tokenizer_config carrying a chat template when asked."""
    path.mkdir(parents=True)
    for f in ("config.json", "model.safetensors"):
        shutil.copy(TINY / f, path / f)
    if tokenizer:
        shutil.copy(TINY / "tokenizer.json", path / "tokenizer.json")
        cfg = json.loads((TINY / "tokenizer_config.json").read_text())
        (path / "tokenizer_config.json").write_text(json.dumps({**cfg, **({"chat_template": CHAT} if chat else {})}))
    return path


def _race_grid(**changes):
    """The grid tests' small grid, run by RACE's own cell function (models are checked for it)."""
    g = grid(cell_fn=DEFAULT_CELL_FN, **changes)
    return g


def _plan_cli(tmp_path, g, *extra):
    res = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["grid", "plan", str(write_grid(tmp_path / "g.yaml", g)),
                                                         *extra])
    return res.exit_code, " ".join(res.output.split())


def test_a_misspelled_model_in_an_axis_fails_the_plan_naming_each_bad_cell(tmp_path):
    g = _race_grid(axes={"model": ["tiny-s", "tiny-mm", "tiny-l"], "num_generations": [4, 8]})
    p = plan_grid(grid_spec_from_dict(g))
    bad = [c for c in p.cells if c.cell.config.model == "tiny-mm"]
    assert len(bad) == 4 and all(c.cannot_run for c in bad) and p.cannot_run == bad
    assert all("unknown model 'tiny-mm' (did you mean 'tiny-m'?)" in c.refusal for c in bad)
    assert not any(c.cannot_run for c in p.cells if c.cell.config.model != "tiny-mm")
    code, out = _plan_cli(tmp_path, g)
    assert code == 1 and "4 of 12 cell(s) cannot run" in out
    for c in bad:  # every bad cell by its id, with the closest valid name
        assert f"refused {c.cell.run_id} [model=tiny-mm num_generations={c.cell.config.num_generations} seed=0]: " \
               "unknown model 'tiny-mm' (did you mean 'tiny-m'?)" in out
    code, out = _plan_cli(tmp_path, g, "--allow-refused")
    assert code == 0 and "did you mean 'tiny-m'?" in out  # today's report-only behaviour, on request


def test_a_chat_template_grid_refuses_model_folders_without_a_tokenizer_or_template(tmp_path):
    folders = {"bare": _folder(tmp_path / "bare", tokenizer=False, chat=False),
               "plain": _folder(tmp_path / "plain", tokenizer=True, chat=False),
               "chat": _folder(tmp_path / "chat", tokenizer=True, chat=True)}
    g = _race_grid(axes={"model": [str(f) for f in folders.values()]})
    g["base"] = {**g["base"], "task": {"name": "dataset", "train_path": str(DATA / "train.jsonl"),
                                       "test_path": str(DATA / "test.jsonl"), "chat_template": True}}
    p = plan_grid(grid_spec_from_dict(g))
    why = {Path(c.cell.config.model).name: c.refusal for c in p.cells}
    assert "has no tokenizer files" in why["bare"] and "tokenizer.json" in why["bare"]
    assert "has no chat template" in why["plain"] and "task.chat_template: false" in why["plain"]
    assert why["chat"] is None
    code, out = _plan_cli(tmp_path, g)
    assert code == 1 and "4 of 6 cell(s) cannot run" in out
    for c in p.cannot_run:
        assert f"refused {c.cell.run_id} " in out
    g["base"]["task"]["chat_template"] = False  # plain prompts need a tokenizer, not a template
    why = {Path(c.cell.config.model).name: c.refusal for c in plan_grid(grid_spec_from_dict(g)).cells}
    assert "has no tokenizer files" in why["bare"] and why["plain"] is None and why["chat"] is None


def test_a_tiny_model_has_no_chat_template_and_a_preset_is_not_weights():
    assert "the tiny family's tokenizer (tiny-s) has no chat template" in policy_check("tiny-s", chat_template=True).problem
    assert policy_check("tiny-s").problem is None  # built on demand
    problem = policy_check("qwen2.5-0.5b").problem
    assert "FLOP preset" in problem and "'Qwen/Qwen2.5-0.5B'" in problem
    assert "'Qwen/Qwen2.5-0.5B'" in policy_check("Qwen2.5-0.5B").problem  # any case
    assert "unknown model 'tiny_s' (did you mean 'tiny-s'?)" in policy_check("tiny_s").problem


def test_a_local_folder_is_never_diagnosed_as_a_hub_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    (tmp_path / "models").mkdir()
    _folder(tmp_path / "models" / "Qwen2.5-0.5B-Instruct", tokenizer=True, chat=True)
    for ref in ("models/Qwen2.5-0.5B-Instruc", "./models/Qwen2.5-0.5B-Instruc"):
        problem = policy_check(ref).problem
        assert problem.startswith(f"model folder {ref!r} not found (relative to {tmp_path})"), problem
        assert "did you mean 'Qwen2.5-0.5B-Instruct'?" in problem
        assert "hub" not in problem and "download" not in problem
    assert policy_check("models/Qwen2.5-0.5B-Instruct", chat_template=True).problem is None


def test_a_hub_model_not_yet_downloaded_is_priced_from_its_preset_and_noted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    g = _race_grid(axes={"model": ["Qwen/Qwen2.5-0.5B-Instruct"]}, budgets=[1e15, 1e16])
    p = plan_grid(grid_spec_from_dict(g))
    assert not p.refused and all(c.prediction and c.prediction["steps"] >= 1 for c in p.cells)
    fetch = hub_download_command("Qwen/Qwen2.5-0.5B-Instruct")
    assert sum(1 for n in p.notes if f"`{fetch}` fetches it now" in n) == 1  # once for the grid, not per cell
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    p = plan_grid(grid_spec_from_dict(g))
    assert len(p.cannot_run) == len(p.cells) and all("HF_HUB_OFFLINE is set" in c.refusal and fetch in c.refusal
                                                     for c in p.cells)


def test_hub_hints_name_the_command_the_installed_library_ships():
    scripts = {e.name for e in metadata.distribution("huggingface_hub").entry_points if e.group == "console_scripts"}
    cmd = hub_download_command("Qwen/Qwen2.5-0.5B", "config.json")
    assert cmd.endswith("download Qwen/Qwen2.5-0.5B config.json")
    assert cmd.split(" download")[0] in scripts  # hf (huggingface_hub >= 0.34) or huggingface-cli (older)
    if "huggingface-cli" not in scripts:
        assert "huggingface-cli" not in cmd


@pytest.mark.parametrize("reward, needle", [
    ("prm:./no-such-rm", "reward-model folder './no-such-rm' not found"),
    ("prm:Qwen/Qwen2.5-Math-PRM-7B", "unknown reward model 'Qwen/Qwen2.5-Math-PRM-7B'"),
    ("prm:prm-sx", "did you mean 'prm-s'?"),
    ("judge:tiny-mm", "unknown model 'tiny-mm' (did you mean 'tiny-m'?)"),
])
def test_reward_models_are_resolved_at_plan_time(tmp_path, monkeypatch, reward, needle):
    monkeypatch.chdir(tmp_path)
    p = plan_grid(grid_spec_from_dict(_race_grid(axes={"reward": ["rule", reward]})))
    rule = [c for c in p.cells if str(c.cell.config.reward) == "rule"]
    other = [c for c in p.cells if c not in rule]
    assert all(not c.cannot_run for c in rule)
    assert other and all(c.cannot_run and needle in c.refusal for c in other), [c.refusal for c in other]


def test_a_race_reward_model_recipe_is_built_on_demand_and_not_refused():
    p = plan_grid(grid_spec_from_dict(_race_grid(axes={"reward": ["prm:prm-xs"]})))
    assert not p.cannot_run


def test_a_custom_cell_function_reads_its_own_model_names():
    p = plan_grid(grid_spec_from_dict(grid(axes={"model": ["fail-xs", "tiny-xs"]})))  # the fake engine's switch, not a model
    assert not p.cannot_run


def test_every_reason_of_a_cell_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    g = _race_grid(axes={"model": ["tiny-mm"]})
    g["base"] = {**g["base"], "task": {"name": "jsonl", "path": "missing.jsonl"}}
    why = plan_grid(grid_spec_from_dict(g)).cells[0].refusal
    assert "task.path 'missing.jsonl': file not found" in why and "; and unknown model 'tiny-mm'" in why


def test_race_grid_run_runs_the_others_and_exits_1_on_cells_that_cannot_run(tmp_path, monkeypatch):
    """A data file that is not there is refused for any cell function; the fake engine runs the rest."""
    monkeypatch.chdir(tmp_path)
    g = grid(axes={"task": [{"name": "arith"}, {"name": "jsonl", "path": "missing.jsonl"}]}, seeds=[0])
    f = write_grid(tmp_path / "g.yaml", g)
    res = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["grid", "run", str(f), "--study-dir", str(tmp_path / "s"),
                                                         "--quiet"])
    out = " ".join(res.output.split())
    assert res.exit_code == 1, out
    assert "2/2 cells complete" in out and "2 cell(s) could not run" in out and "missing.jsonl" in out
